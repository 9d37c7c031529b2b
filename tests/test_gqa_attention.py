"""``sdpa_gqa`` (rag.generate.gqa_attention): the same logits as transformers' ``sdpa``.

Tiny random Llama and Qwen2 with grouped key/value heads (4 query heads, 2 key/value heads),
float32, weights 10x the usual init so a wrong head grouping or mask would change the logits.
"""

from __future__ import annotations

import copy

import pytest
import torch
from generate_support import build_model, build_tokenizer, messages
from transformers import DynamicCache

from rag.generate.generator import Generator
from rag.generate.gqa_attention import NAME, use_gqa_attention


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer()


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def pair(request, tok):
    plain = build_model(request.param, tok, init=0.2)
    grouped = copy.deepcopy(plain)
    assert use_gqa_attention(grouped) and grouped.config._attn_implementation == NAME
    assert plain.config._attn_implementation == "sdpa"
    return plain, grouped


def forward(model, ids, cache=None, mask=None):
    with torch.inference_mode():
        out = model(input_ids=ids, attention_mask=mask, cache=cache, use_cache=True)
    return out.logits, out.past_key_values


def test_prompt_alone_equals_sdpa(pair):
    plain, grouped = pair
    ids = torch.randint(5, 200, (1, 37), generator=torch.Generator().manual_seed(0))
    assert torch.allclose(forward(plain, ids)[0], forward(grouped, ids)[0], atol=1e-5)


def test_rows_after_a_padded_cache_equal_sdpa(pair):
    """The batched prefill's case: several rows of new tokens after a cache, left padding
    masked out by a 2D mask."""
    plain, grouped = pair
    gen = torch.Generator().manual_seed(1)
    prefix = torch.randint(5, 200, (3, 20), generator=gen)
    new = torch.randint(5, 200, (3, 6), generator=gen)
    mask = torch.ones(3, 26, dtype=torch.long)
    mask[1, :4] = 0
    mask[2, :9] = 0
    for model in pair:
        assert model.config.num_key_value_heads < model.config.num_attention_heads
    got = []
    for model in (plain, grouped):
        _, cache = forward(model, prefix, DynamicCache(config=model.config), mask[:, :20])
        got.append(forward(model, new, cache, mask)[0])
    assert torch.allclose(got[0], got[1], atol=1e-5)
    assert not torch.allclose(got[0][1], got[0][2], atol=1e-3)  # the rows do differ


def test_scores_and_batched_answers_equal_sdpa(pair, tok):
    plain, grouped = pair
    msgs = messages()
    a, b = Generator(plain, tok, "cpu"), Generator(grouped, tok, "cpu", batching=True)
    try:
        conts = [" [1]", " [2]", " [3]"]
        want = a.score_continuations(msgs, "Use open().", conts)
        assert b.score_continuations(msgs, "Use open().", conts) == pytest.approx(want, abs=1e-5)
        assert b.generate(msgs, max_new_tokens=12) == a.generate(msgs, max_new_tokens=12)
    finally:
        b.batcher.close()


def test_models_without_grouped_heads_are_left_alone(tok):
    model = build_model("llama", tok)
    model.config.num_key_value_heads = model.config.num_attention_heads
    assert not use_gqa_attention(model)
    assert model.config._attn_implementation == "sdpa"
