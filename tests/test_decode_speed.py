"""Decoder speed options (rag.generate.speed): what each keeps exact, and what is refused.

Tiny random Llama (smollm2's architecture) and Qwen2 (Qwen2.5's) decoders in float32, with
weights 10x the usual init so that a wrong cache column or position changes the greedy tokens
(tests/generate_support.py). The static cache and ``torch.compile`` must give the baseline's
greedy token ids, with and without the prefix cache, streamed or not, and with the refusal
gate's prompt cache. int8 changes the decode steps' weights, so it must give a finished,
non-empty answer and keep its own invariants: prefix cache on = off, batched = alone. The
compile tests pay inductor's compile time (about 90 s in all on 2 busy cores with an empty
inductor cache, 15 s with a warm one).
"""

from __future__ import annotations

import copy
import threading
import time
from typing import Any

import pytest
import torch
from generate_support import build_model, build_tokenizer, messages

from rag.answer.prompt import build_messages
from rag.config import ConfigError, RAGConfig, add_config_args, config_from_args, read_toml
from rag.generate.chat import DecodeOptions
from rag.generate.generator import Generator
from rag.generate.speed import STATIC_CACHE_STEP, DecodeSpeed, DecodeSpeedError, static_capacity

ARCHS = ("llama", "qwen2")
QUESTIONS = ("how do I read a file?", "what closes the file?", "why")
NEW = 20


@pytest.fixture(scope="module")
def tok() -> Any:
    return build_tokenizer()


@pytest.fixture(scope="module", params=ARCHS)
def base(request, tok) -> Generator:
    """The baseline: eager, dynamic cache, float32."""
    return Generator(build_model(request.param, tok, init=0.2), tok, "cpu")


def variant(base: Generator, speed: DecodeSpeed, **kw: Any) -> Generator:
    """A generator over a private copy of ``base``'s model with ``speed`` applied."""
    model = speed.prepare(copy.deepcopy(base.model))
    return Generator(model, base.tokenizer, "cpu", speed=speed, **kw)


def prompts(gen: Generator) -> list[tuple[list[int], int]]:
    """(ids, prefix_len) of prompts of different lengths, one longer than a static cache step."""
    out = []
    for i, q in enumerate(QUESTIONS):
        ids, prefix = gen.prompt_ids(build_messages(q, ["Use open() and iterate."] * (i + 1)))
        out.append((ids, prefix))
    long = build_messages("and then?", ["The with statement closes the file. " * 20])
    out.append(gen.prompt_ids(long))
    assert len(out[-1][0]) + NEW > STATIC_CACHE_STEP  # a second capacity, a second shape
    return out


def greedy(gen: Generator, prefix_cache: bool) -> list[list[int]]:
    return [
        gen.generate_ids(ids, p, max_new_tokens=NEW, use_prefix_cache=prefix_cache)
        for ids, p in prompts(gen)
    ]


def assert_same_as_base(gen: Generator, base: Generator) -> None:
    """Greedy ids with and without the prefix cache, generate and stream, and from the refusal
    gate's prompt cache, all equal to the baseline's."""
    expected = greedy(base, prefix_cache=False)
    assert greedy(gen, prefix_cache=True) == expected
    assert greedy(gen, prefix_cache=False) == expected
    msgs = messages("what does the with statement do?")
    assert "".join(gen.stream(msgs, max_new_tokens=NEW)) == base.generate(msgs, max_new_tokens=NEW)
    _, mine = gen.refusal_logprob(msgs)
    _, theirs = base.refusal_logprob(msgs)
    ours = gen.generate(msgs, max_new_tokens=NEW, prompt_cache=mine)
    assert ours == base.generate(msgs, max_new_tokens=NEW, prompt_cache=theirs)


# ---- exact options ----------------------------------------------------------------------------


def test_static_cache_gives_baseline_greedy_ids(base):
    gen = variant(base, DecodeSpeed(cache="static"))
    assert_same_as_base(gen, base)
    ids, p = prompts(gen)[0]
    stats: dict[str, float] = {}
    gen.generate_ids(ids, p, max_new_tokens=4, stats=stats)
    assert stats["cached_prefix_tokens"] == p  # the prefix went into the static cache
    kw = gen._generate_kwargs(ids, p, DecodeOptions(max_new_tokens=4, use_prefix_cache=True))
    assert type(kw["cache"]).__name__ == "StaticCache"
    assert kw["cache"].layers[0].max_cache_len == static_capacity(len(ids) + 4)


@pytest.mark.slow  # torch.compile of the tiny decoder: ~40 s on a 2-core AVX2 CPU
def test_compile_gives_baseline_greedy_ids(base):
    gen = variant(base, DecodeSpeed(compile=True))
    assert getattr(gen.model, "_rag_compiled", False)
    assert_same_as_base(gen, base)


@pytest.mark.slow  # torch.compile (an opt-in of the torch engine): 10-40 s on AVX2
def test_compile_with_static_cache_gives_baseline_greedy_ids(base):
    gen = variant(base, DecodeSpeed(compile=True, cache="static"))
    assert not hasattr(gen.model, "_rag_compiled")  # generate compiles the decode step itself
    assert greedy(gen, prefix_cache=True) == greedy(base, prefix_cache=False)
    assert hasattr(gen.model, "_compiled_call")


def together(gen: Generator, reqs: list[tuple[list[int], int]]) -> list[list[int]]:
    """Greedy ids of ``reqs`` decoded in one batch: the worker waits on the decode lock, held
    here, until every request is queued."""
    out: list[Any] = [None] * len(reqs)

    def work(i: int) -> None:
        out[i] = gen.generate_ids(*reqs[i], max_new_tokens=NEW)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(reqs))]
    with gen._decode_lock:
        for t in threads:
            t.start()
        while gen.batcher.requests < len(reqs):
            time.sleep(0.002)
    for t in threads:
        t.join(timeout=300)
    assert gen.batcher.max_rows >= 2
    return out


@pytest.mark.slow  # torch.compile (an opt-in of the torch engine): 10-40 s on AVX2
def test_compile_keeps_batched_decoding_exact(base):
    gen = variant(base, DecodeSpeed(compile=True), batching=True, max_batch=4)
    try:
        assert together(gen, prompts(gen)) == greedy(base, prefix_cache=False)
    finally:
        gen.batcher.close()


# ---- int8 -------------------------------------------------------------------------------------


def test_int8_answers_and_caches_agree(base):
    gen = variant(base, DecodeSpeed(int8=True))
    assert not [m for m in gen.model.modules() if type(m) is torch.nn.Linear]  # all swapped
    msgs = messages()
    stats: dict[str, float] = {}
    text = gen.generate(msgs, max_new_tokens=NEW, stats=stats)
    assert text.strip() and 0 < stats["new_tokens"] <= NEW
    assert "".join(gen.stream(msgs, max_new_tokens=NEW)) == text
    cached = greedy(gen, prefix_cache=True)
    assert cached == greedy(gen, prefix_cache=False)  # the prompt is prefilled in float
    assert cached != greedy(base, prefix_cache=False)  # the decode steps did run int8


def test_int8_keeps_batched_decoding_exact(base):
    gen = variant(base, DecodeSpeed(int8=True), batching=True, max_batch=4)
    try:
        alone = variant(base, DecodeSpeed(int8=True))
        assert together(gen, prompts(gen)) == greedy(alone, prefix_cache=True)
    finally:
        gen.batcher.close()


@pytest.mark.parametrize(
    ("precision", "speed"),
    [("int8", None), ("auto", DecodeSpeed(int8=True)), ("bf16", DecodeSpeed(int8=True))],
)
def test_int8_loads_with_the_float_weights(tmp_path, tok, precision, speed):
    """precision int8 = int8 decode layers over the auto float weights; int8 decode layers over
    bf16 weights keep the prefill in bf16."""
    build_model("llama", tok).save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    gen = Generator.load(tmp_path, device="cpu", precision=precision, speed=speed)
    assert gen.speed.int8
    if precision == "bf16":
        assert next(gen.model.parameters()).dtype == torch.bfloat16  # prefill stays bf16
    assert gen.generate(messages(), max_new_tokens=4)


# ---- refused combinations ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("settings", "flag"),
    [
        ({"cache_implementation": "static"}, "--no-batching"),
        ({"decoder_precision": "int8", "device": "cuda"}, "--device cpu"),
        ({"decoder_precision": "int8", "decoder_compile": True}, "--decoder-compile"),
        ({"decoder_precision": "int4"}, "decoder.precision"),
        ({"cache_implementation": "paged"}, "cache.implementation"),
    ],
)
def test_bad_combinations_are_refused_naming_the_flag(settings, flag):
    with pytest.raises(ConfigError, match=flag):
        RAGConfig.of(**settings)


def test_good_combinations_are_accepted(tmp_path):
    RAGConfig.of(cache_implementation="static", batching=False, decoder_compile=True)
    RAGConfig.of(decoder_precision="int8", cache_implementation="static", batching=False)
    RAGConfig.of(decoder_precision="int8")  # int8 with batching: fine
    assert RAGConfig.of(decoder_precision="int8").generate.speed.int8
    assert not RAGConfig.of(decoder_precision="bf16").generate.speed.int8
    toml = tmp_path / "rag.toml"
    toml.write_text('cache_implementation = "static"\nbatching = false\ndecoder_compile = true\n')
    assert RAGConfig.of(**read_toml(toml)).generate.cache_implementation == "static"


def test_cli_flags_come_from_the_config():
    import argparse

    parser = argparse.ArgumentParser()
    add_config_args(parser)
    args = parser.parse_args(["--cache-implementation", "static", "--decoder-compile"])
    with pytest.raises(ConfigError, match="--no-batching"):
        config_from_args(args)
    args = parser.parse_args(["--cache-implementation", "static", "--no-batching"])
    assert config_from_args(args).generate.speed.label == "static"
    with pytest.raises(SystemExit):
        parser.parse_args(["--decoder-precision", "int4"])


def test_generator_refuses_static_cache_with_batching(base):
    with pytest.raises(DecodeSpeedError, match="--no-batching"):
        Generator(
            base.model, base.tokenizer, "cpu", batching=True, speed=DecodeSpeed(cache="static")
        )


def test_labels_and_capacity():
    assert DecodeSpeed().label == "eager"
    assert DecodeSpeed(int8=True, cache="static").label == "int8+static"
    assert DecodeSpeed(compile=True, cache="static").label == "compile+static"
    assert static_capacity(1) == STATIC_CACHE_STEP
    assert static_capacity(STATIC_CACHE_STEP + 1) == 2 * STATIC_CACHE_STEP
