"""Decoding rules: the loop guard and its trim, stop strings, and exact caching for Qwen2.

Models are tiny and random (tests/generate_support.py); a *scripted* one has its logits forced so
that greedy decoding writes a given phrase over and over, which makes loops and stop strings
deterministic without a trained model. Nothing is downloaded.
"""

from __future__ import annotations

import random

import pytest
import torch
from generate_support import build_model, build_tokenizer, messages, model_config

from rag.generate.generator import DEFAULT_STOP, Generator
from rag.generate.stopping import (
    DEFAULT_STOP_STRINGS,
    DecodingRules,
    LoopGuard,
    is_looping,
    loop_cut,
    settled_length,
    trim_repetition,
)
from rag.generate.streaming import cut_at_stop, stream_tokens


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer()


def scripted_generator(tok, script: list[int], prompt_len: int, rules=None) -> Generator:
    """A tiny Qwen2 whose greedy choice is fixed: after a prompt of ``prompt_len`` tokens, its
    i-th new token is ``script[i % len(script)]``, so it writes ``script`` in a loop."""
    from transformers import Qwen2ForCausalLM

    class Scripted(Qwen2ForCausalLM):
        def forward(self, input_ids=None, attention_mask=None, cache=None, **kwargs):
            past = cache.get_seq_length() if cache is not None else 0
            n = attention_mask.shape[1] if attention_mask is not None else past + input_ids.shape[1]
            out = super().forward(
                input_ids=input_ids, attention_mask=attention_mask, cache=cache, **kwargs
            )
            logits = torch.full_like(out.logits, -1e4)
            logits[:, -1, script[(n - prompt_len) % len(script)]] = 0.0
            out.logits = logits
            return out

    torch.manual_seed(0)
    return Generator(Scripted(model_config("qwen2", tok)).eval(), tok, "cpu", rules=rules)


def scripted(tok, text: str, eos: bool = False) -> tuple[Generator, list[dict[str, str]]]:
    """A generator scripted to write ``text`` (then eos, when ``eos``) and the chat it answers."""
    script = tok(text, add_special_tokens=False)["input_ids"] + ([tok.eos_token_id] * eos)
    msgs = messages()
    prompt_len = len(Generator(None, tok).prompt_ids(msgs)[0])
    return scripted_generator(tok, script, prompt_len), msgs


# ---- the loop guard on a model ---------------------------------------------------------------


def test_looping_model_is_stopped_and_shows_the_phrase_once(tok):
    phrase = " Use a for loop."
    gen, msgs = scripted(tok, phrase)
    ids, prefix = gen.prompt_ids(msgs)
    n = len(tok(phrase, add_special_tokens=False)["input_ids"])
    new = gen.generate_ids(ids, prefix, max_new_tokens=60)
    assert len(new) == n * DecodingRules().copies_needed(n) < 60  # stopped at the 3rd copy
    answer = gen.generate(msgs, max_new_tokens=60)
    assert answer == phrase.strip()
    assert "".join(gen.stream(msgs, max_new_tokens=60)) == answer

    plain = Generator(gen.model, tok, "cpu", rules=DecodingRules.off())
    assert plain.generate(msgs, max_new_tokens=60).count("for loop.") > 3  # what it prevents


def test_legitimate_repeats_from_a_model_are_not_cut(tok):
    """Names and markers copied several times, a word said three times: decoded to the end."""
    text = " Paris, Paris and Paris again [1][1][1]. The the the file [1]"
    gen, msgs = scripted(tok, text, eos=True)
    assert gen.generate(msgs, max_new_tokens=150) == text.strip()
    assert "".join(gen.stream(msgs, max_new_tokens=150)) == text.strip()


def test_stop_string_ends_generation_and_is_not_returned(tok):
    phrase = " Use open() [1]\nQuestion: why"
    gen, msgs = scripted(tok, phrase)
    ids, prefix = gen.prompt_ids(msgs)
    n_script = len(tok(phrase, add_special_tokens=False)["input_ids"])
    assert len(gen.generate_ids(ids, prefix, max_new_tokens=50, stop=DEFAULT_STOP)) < n_script
    assert gen.generate(msgs, max_new_tokens=50) == "Use open() [1]"
    assert "".join(gen.stream(msgs, max_new_tokens=50)) == "Use open() [1]"
    # The rule adds the stop; without rules only the caller's stops apply.
    plain = Generator(gen.model, tok, "cpu", rules=DecodingRules.off())
    assert "\nQuestion: why" in plain.generate(msgs, max_new_tokens=n_script)


# ---- the loop guard as pure functions ----------------------------------------------------------


def test_trim_repetition_keeps_one_copy():
    head, block = ["the", "answer", "is"], ["it", "is", "Paris", "[1]", "."]
    words = head + block * 4
    assert is_looping(words, DecodingRules())
    assert trim_repetition(words) == head + block
    assert loop_cut(words, DecodingRules()) == len(head + block)
    assert trim_repetition(["!"] * 20) == ["!"]
    assert trim_repetition(words, DecodingRules.off()) == words


@pytest.mark.parametrize(
    "text",
    [
        "Paris is the capital of France [1] . Paris has the Louvre [1] [2] . Paris",
        "read the file line by line by line , then close the file",
        "very very very good",
        "x = [ 0 , 0 , 0 , 0 , 0 ]",  # 5 copies of a 2-token block: 10 tokens < 16
        "it is closed . it is closed .",  # said twice: emphasis, not a loop
    ],
)
def test_legitimate_repeats_are_not_a_loop(text):
    words = text.split()
    assert not is_looping(words, DecodingRules())
    assert trim_repetition(words) == words
    assert settled_length(words) <= len(words)


def test_loop_guard_reads_only_generated_tokens_per_sequence():
    rules = DecodingRules()
    prompt = [7] * 40  # the prompt itself "loops": that must not stop anything
    legit = [1, 2, 3, 1, 4, 5, 1, 6, 2, 3, 5, 5, 8, 9, 1, 2, 3, 7, 8, 4]
    loop = [1, 2, 3, 4, 5] * 4
    guard = LoopGuard(len(prompt), rules)
    done = guard(torch.tensor([prompt + legit, prompt + loop]), None)
    assert done.dtype == torch.bool and done.tolist() == [False, True]
    assert guard(torch.tensor([prompt + loop[:-1]]), None).tolist() == [False]
    assert LoopGuard(0, rules)(torch.tensor([prompt]), None).tolist() == [True]


def _generate_like(rng: random.Random, rules: DecodingRules, n: int) -> list[int]:
    """Random ids over 3 symbols (many repeats), ending where the loop guard would stop."""
    ids: list[int] = []
    while len(ids) < n and not is_looping(ids, rules):
        ids.append(rng.choice([0, 1, 2]) if rng.random() < 0.7 or len(ids) < 4 else ids[-3])
    return ids


def test_stream_sends_only_text_that_no_trim_removes():
    """Every delta stays in the final answer: the stream joins to the trimmed text, for random
    token streams, many of which end in a loop."""
    rules = DecodingRules(loop_min_tokens=6, loop_max_period=5)
    vocab = [" ab", " cd", ".\n"]
    decode = lambda ids: "".join(vocab[i] for i in ids)  # noqa: E731
    rng, loops = random.Random(0), 0
    for _ in range(300):
        ids = _generate_like(rng, rules, 60)
        loops += is_looping(ids, rules)
        final = cut_at_stop(decode(trim_repetition(ids, rules)), None)[0].strip()
        chunks = iter([[i] for i in ids])
        assert "".join(stream_tokens(chunks, decode, None, 0.0, None, rules)) == final
        for m in range(len(ids) + 1):
            assert settled_length(ids[:m], rules) <= len(trim_repetition(ids, rules))
    assert loops > 100


# ---- rules -----------------------------------------------------------------------------------


def test_rules_merge_stops_and_set_generate_options(tok):
    rules = DecodingRules()
    assert rules.stops(DEFAULT_STOP)[: len(DEFAULT_STOP)] == DEFAULT_STOP
    assert set(rules.stops(["\n\nUser:"])) == {"\n\nUser:", *DEFAULT_STOP_STRINGS}
    assert len(rules.stops(DEFAULT_STOP)) == len(set(rules.stops(DEFAULT_STOP)))
    assert DecodingRules.off().stops(None) == ()
    assert [rules.copies_needed(p) for p in (1, 2, 4, 6, 32)] == [16, 8, 4, 3, 3]
    kw = DecodingRules(repetition_penalty=1.2, no_repeat_ngram_size=3).generate_kwargs(
        10, None, tok
    )
    assert kw["repetition_penalty"] == 1.2 and kw["no_repeat_ngram_size"] == 3
    assert "\nQuestion:" in kw["stop_strings"] and kw["tokenizer"] is tok
    assert [type(c) for c in kw["stopping_criteria"]] == [LoopGuard]
    off = DecodingRules.off().generate_kwargs(10, None, tok)
    assert "stop_strings" not in off and len(off["stopping_criteria"]) == 0
    with pytest.raises(ValueError):
        DecodingRules(loop_max_repeats=1)
    with pytest.raises(ValueError):
        DecodingRules(loop_min_period=8, loop_max_period=4)


# ---- Qwen2: exact caching --------------------------------------------------------------------


@pytest.fixture(scope="module")
def qwen2(tok) -> Generator:
    return Generator(build_model("qwen2", tok), tok, "cpu")


def test_qwen2_cached_equals_uncached_greedy(qwen2):
    ids, prefix = qwen2.prompt_ids(messages())
    with_cache = qwen2.generate_ids(ids, prefix, max_new_tokens=16, use_cache=True)
    without = qwen2.generate_ids(ids, prefix, max_new_tokens=16, use_cache=False)
    assert with_cache == without and len(with_cache) > 0


def test_qwen2_prefix_cache_equals_no_prefix_cache(qwen2):
    qwen2.clear_prefix_cache()
    msgs = messages("what closes the file?")
    plain = qwen2.generate(msgs, max_new_tokens=16, use_prefix_cache=False)
    stats: dict[str, float] = {}
    cached = qwen2.generate(msgs, max_new_tokens=16, use_prefix_cache=True, stats=stats)
    assert cached == plain
    assert 0 < stats["cached_prefix_tokens"] < stats["prompt_tokens"]
    assert "".join(qwen2.stream(msgs, max_new_tokens=16)) == plain
