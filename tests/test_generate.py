"""Generator: KV cache, prefix cache, streaming, stop strings and the context budget.

Uses tiny random decoders (2 layers x 64, tests/generate_support.py) built in a second, one Llama
(smollm2's architecture) and one ModernBertDecoder (our from-scratch CLM's), with a tiny
byte-level BPE tokenizer that has a ChatML chat template.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from generate_support import build_model, build_tokenizer, messages, uncached_scores

from rag.answer.prompt import build_messages
from rag.generate.generator import Generator
from rag.generate.streaming import cut_at_stop, stream_text

ARCHS = ("llama", "modernbert")


@pytest.fixture(scope="session")
def tiny_decoder_dirs(tmp_path_factory) -> dict[str, Path]:
    """Saved folders ``{arch: dir}`` that :meth:`Generator.load` can open like any model."""
    tokenizer = build_tokenizer()
    out = {}
    for arch in ARCHS:
        path = tmp_path_factory.mktemp(f"tiny-{arch}")
        build_model(arch, tokenizer).save_pretrained(path)
        tokenizer.save_pretrained(path)
        out[arch] = path
    return out


@pytest.fixture(scope="session", params=ARCHS)
def tiny_generator(request, tiny_decoder_dirs) -> Generator:
    return Generator.load(tiny_decoder_dirs[request.param], device="cpu", precision="fp32")


def test_prefix_cache_output_equals_uncached(tiny_generator):
    gen = tiny_generator
    gen.clear_prefix_cache()
    msgs = messages()
    plain = gen.generate(msgs, max_new_tokens=24, use_prefix_cache=False)
    stats: dict[str, float] = {}
    cached = gen.generate(msgs, max_new_tokens=24, use_prefix_cache=True, stats=stats)
    again = gen.generate(msgs, max_new_tokens=24, use_prefix_cache=True)
    assert cached == plain == again
    assert stats["cached_prefix_tokens"] > 0
    assert stats["prompt_tokens"] > stats["cached_prefix_tokens"]
    # The stored prefix cache is never extended by a request (each gets a deep copy).
    ((key, stored),) = gen._prefixes.items()
    assert stored.get_seq_length() == len(key) == stats["cached_prefix_tokens"]


def test_prefix_cache_reused_across_questions(tiny_generator):
    gen = tiny_generator
    gen.clear_prefix_cache()
    for q in ("what closes the file?", "how do I read lines?"):
        assert gen.generate(messages(q), max_new_tokens=8) == gen.generate(
            messages(q), max_new_tokens=8, use_prefix_cache=False
        )
    assert len(gen._prefixes) == 1  # same system prompt → one cached prefix


def test_kv_cache_off_gives_same_greedy_tokens(tiny_generator):
    ids, prefix = tiny_generator.prompt_ids(messages())
    with_cache = tiny_generator.generate_ids(ids, prefix, max_new_tokens=12, use_cache=True)
    without = tiny_generator.generate_ids(ids, prefix, max_new_tokens=12, use_cache=False)
    assert with_cache == without


def test_prompt_ids_split_at_system_turn(tiny_generator):
    tok = tiny_generator.tokenizer
    msgs = messages()
    ids, prefix = tiny_generator.prompt_ids(msgs)
    system_only = tok.apply_chat_template(msgs[:1], tokenize=False)
    assert tok.decode(ids[:prefix]) == system_only
    assert tok.decode(ids) == tok.apply_chat_template(
        msgs, tokenize=False, add_generation_prompt=True
    )


def test_stream_joins_to_generate(tiny_generator):
    msgs = messages("what does the with statement do?")
    stats: dict[str, float] = {}
    parts = list(tiny_generator.stream(msgs, max_new_tokens=20, stats=stats))
    assert "".join(parts) == tiny_generator.generate(msgs, max_new_tokens=20)
    assert stats["ttft_s"] <= stats["total_s"]


def test_token_counts_and_finish_reason_stream_or_not(tiny_generator):
    """Both paths report the decoded tokens and why decoding ended; "length" only when it ran
    to max_new_tokens and no eos, stop string or loop ended it there."""
    gen, msgs = tiny_generator, messages()
    alone: dict[str, float] = {}
    streamed: dict[str, float] = {}
    gen.generate(msgs, max_new_tokens=5, stats=alone)
    list(gen.stream(msgs, max_new_tokens=5, stats=streamed))
    for stats in (alone, streamed):
        assert (stats["new_tokens"], stats["finish_reason"]) == (5, "length")
        assert stats["prompt_tokens"] == len(gen.prompt_ids(msgs)[0])
    tok = gen.tokenizer
    words = list(
        dict.fromkeys(tok("Use open and a for loop", add_special_tokens=False)["input_ids"])
    )
    stop = tok(" read\nQuestion:", add_special_tokens=False)["input_ids"]
    assert gen.finish_reason(words[:4], 4) == "length"
    assert gen.finish_reason(words[:3], 4) == "stop"  # ended before the limit
    assert gen.finish_reason([*words[:3], tok.eos_token_id], 4) == "stop"
    assert gen.finish_reason(stop, len(stop)) == "stop"  # a stop string on the last token
    assert gen.finish_reason(words[:1] * 16, 16) == "stop"  # the loop guard's


def test_stream_closed_early_releases_the_model(tiny_generator):
    it = tiny_generator.stream(messages(), max_new_tokens=200)
    next(it)
    it.close()  # cancels decoding and joins the worker thread
    assert not tiny_generator._decode_lock.locked()
    assert isinstance(tiny_generator.generate(messages(), max_new_tokens=2), str)


def test_sampling_is_seeded_and_valid(tiny_generator):
    torch.manual_seed(1)
    a = tiny_generator.generate(messages(), max_new_tokens=10, temperature=0.8, top_p=0.9)
    torch.manual_seed(1)
    b = tiny_generator.generate(messages(), max_new_tokens=10, temperature=0.8, top_p=0.9)
    assert a == b


def test_stream_text_removes_stop_split_across_pieces():
    pieces = iter(["  Den", "ver [2]", "<|im", "_end|> tail"])
    assert "".join(stream_text(pieces, ["<|im_end|>"], 0.0, None)) == "Denver [2]"
    assert cut_at_stop("a STOP b stop", ["stop", "STOP"]) == ("a ", True)
    assert cut_at_stop("abc", None) == ("abc", False)


def test_stream_text_never_sends_text_it_later_removes():
    pieces = ["Answer", " is", " 4.", "\n\n", "User:", " more"]
    sent = list(stream_text(iter(pieces), ["\n\nUser:"], 0.0, None))
    assert "".join(sent) == "Answer is 4."


def test_fit_passages_respects_budget_and_rank_order(tiny_decoder_dirs):
    gen = Generator.load(tiny_decoder_dirs["llama"], device="cpu", max_context_tokens=400)
    passages = [f"passage {i} " + "read the file line by line " * 12 for i in range(8)]
    kept = gen.fit_passages("how to read?", passages, max_new_tokens=64)
    assert 0 < len(kept) < len(passages)
    # best-ranked first, all but the last untouched
    for got, want in zip(kept[:-1], passages, strict=False):
        assert got == " ".join(want.split())
    assert kept[-1].startswith("passage ")
    prompt = gen.prompt_ids(build_messages("how to read?", kept))[0]
    assert len(prompt) <= 400 - 64
    assert gen.fit_passages("how to read?", passages[:1], max_new_tokens=64) == [
        " ".join(passages[0].split())
    ]


def test_fit_passages_trims_one_long_passage(tiny_decoder_dirs):
    gen = Generator.load(tiny_decoder_dirs["llama"], device="cpu", max_context_tokens=300)
    kept = gen.fit_passages("q?", ["word " * 2000], max_new_tokens=32)
    assert len(kept) == 1 and kept[0].endswith("…")
    assert len(gen.prompt_ids(build_messages("q?", kept))[0]) <= 300 - 32


def test_question_over_budget_is_a_clear_error(tiny_decoder_dirs):
    gen = Generator.load(tiny_decoder_dirs["llama"], device="cpu", max_context_tokens=100)
    with pytest.raises(ValueError, match="budget"):
        gen.fit_passages("why " * 200, ["p"], max_new_tokens=32)


def test_tokenizer_without_chat_template_gets_fallback():
    tok = build_tokenizer(chat_template=False)
    gen = Generator(build_model("llama", tok), tok, "cpu")
    ids, prefix = gen.prompt_ids(messages())
    assert prefix > 0
    assert "<|im_start|>assistant" in tok.decode(ids)


def test_works_with_project_tiny_clm(request):
    """The from-scratch decoder fixture from training (when that fixture exists)."""
    try:
        path = request.getfixturevalue("tiny_clm_dir")
    except pytest.FixtureLookupError:
        pytest.skip("tests/conftest.py has no tiny_clm_dir fixture yet")
    gen = Generator.load(path, device="cpu", precision="fp32")
    msgs = messages()
    assert gen.prompt_ids(msgs)[1] > 0  # its chat template allows the prefix cache
    assert gen.generate(msgs, max_new_tokens=8) == gen.generate(
        msgs, max_new_tokens=8, use_prefix_cache=False
    )


def test_lora_adapter_loads_and_prefix_cache_stays_exact(tiny_decoder_dirs, tmp_path):
    from peft import LoraConfig, get_peft_model

    tok = build_tokenizer()
    model = get_peft_model(
        build_model("llama", tok), LoraConfig(r=4, target_modules=["q_proj", "v_proj"])
    )
    for name, p in model.named_parameters():
        if "lora_B" in name:  # B starts at zero; make the adapter change the output
            torch.nn.init.normal_(p, std=0.5)
    model.save_pretrained(tmp_path / "adapter")
    gen = Generator.load(
        tiny_decoder_dirs["llama"], adapter=tmp_path / "adapter", device="cpu", precision="fp32"
    )
    base = Generator.load(tiny_decoder_dirs["llama"], device="cpu", precision="fp32")
    msgs = messages()
    with_lora = gen.generate(msgs, max_new_tokens=12)
    assert with_lora == gen.generate(msgs, max_new_tokens=12, use_prefix_cache=False)
    assert gen.prompt_ids(msgs)[1] > 0
    assert with_lora != base.generate(msgs, max_new_tokens=12)
    # The adapter is merged at load time; the merged model computes what peft's unmerged one does.
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    unmerged = PeftModel.from_pretrained(
        AutoModelForCausalLM.from_pretrained(tiny_decoder_dirs["llama"]), tmp_path / "adapter"
    ).eval()
    ids = torch.tensor([gen.prompt_ids(msgs)[0]])
    with torch.inference_mode():
        torch.testing.assert_close(gen.model(ids).logits, unmerged(ids).logits, atol=1e-4, rtol=0)


def test_score_continuations_equals_full_forward(tiny_generator):
    """The cached, batched scores equal one uncached forward pass per continuation (both
    architectures, continuations of different lengths so padding is exercised)."""
    gen = tiny_generator
    msgs, answer = messages(), "Use open() in a loop."
    conts = [" [1]", " [2]", " [12]"]
    expected = uncached_scores(gen, msgs, answer, conts)
    for prefix_cache in (True, False):
        gen.prefix_cache = prefix_cache
        got = gen.score_continuations(msgs, answer, conts)
        assert got == pytest.approx(expected, abs=1e-4)
    gen.prefix_cache = True
    assert all(s < 0 for s in expected)
