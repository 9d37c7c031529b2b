"""Continuation scores in one forward (rag.generate.scoring): the prefix tree, its mask, and the
invariant that matters: each continuation's score equals one uncached forward over prompt +
answer + that continuation alone.

Tiny random decoders in float32 with weights 10x the usual init, so a node that saw a sibling's
branch, or sat at a wrong position, would change the scores.
"""

from __future__ import annotations

import pytest
import torch
from generate_support import build_model, build_tokenizer, messages, uncached_scores
from test_batching import forwards

from rag.generate import scoring
from rag.generate.generator import Generator
from rag.generate.scoring import continuation_tree, full_attention, tree_mask


def test_the_tree_shares_prefixes_and_says_which_logits_read_each_id():
    conts = [[9, 1, 7], [9, 2, 7], [9, 1, 7, 3], [5], [9, 1, 7]]
    tokens, parents, reads = continuation_tree(conts)
    # inner nodes only: " [" once, then each branch; no continuation's last id
    assert tokens == [9, 1, 2, 7]
    assert parents == [-1, 0, 0, 1]
    assert reads == [[-1, 0, 1], [-1, 0, 2], [-1, 0, 1, 3], [-1], [-1, 0, 1]]


def test_a_node_sees_the_cache_the_run_and_its_own_branch_only():
    mask, pos = tree_mask(cached=3, run=2, parents=[-1, 0, 0, 1], dtype=torch.float32)
    seen = mask[0, 0] == 0  # [2 + 4 query rows, 3 + 2 + 4 columns]
    assert seen.shape == (6, 9)
    assert seen[0].tolist() == [True] * 4 + [False] * 5  # the run is causal
    assert seen[1].tolist() == [True] * 5 + [False] * 4
    node_cols = seen[2:, 5:].tolist()  # node j (rows) sees node i (columns)?
    assert node_cols == [
        [True, False, False, False],
        [True, True, False, False],
        [True, False, True, False],  # a sibling's branch (node 1) stays hidden
        [True, True, False, True],
    ]
    assert seen[2:, :5].all()  # every node sees the cache and the run
    assert pos.tolist() == [[3, 4, 5, 6, 6, 7]]  # siblings share a position: their depth


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_tree_scores_equal_each_continuation_alone(arch, attention):
    """Markers sharing " [", a longer one extending a shorter, a repeat, and one with another
    first id: one forward for all, each score the uncached one (sdpa reads the additive mask
    as eager does)."""
    tok = build_tokenizer()
    model = build_model(arch, tok, init=0.2)
    model.set_attn_implementation(attention)
    gen = Generator(model, tok, "cpu", prompt_cache_mb=64)
    msgs, answer = messages(), "Use open() in a loop."
    conts = [" [1]", " [2]", " [12]", " [1] [2]", " [1]", " see"]
    want = uncached_scores(gen, msgs, answer, conts)
    assert len(set(want)) == 5  # the five distinct continuations score apart
    for prefix_cache in (True, False):
        gen.prefix_cache = prefix_cache
        gen.score_continuations(msgs, answer, conts)  # the system prefix's own forward first
        with forwards(model) as shapes:
            got = gen.score_continuations(msgs, answer, conts)
        assert got == pytest.approx(want, abs=1e-4)
        assert len(shapes) == 1 and shapes[0][0] == 1  # one forward, one row


def test_models_with_sliding_window_layers_score_by_repeating_the_cache():
    """ModernBERT-decoder's local layers would see past their window through a custom mask: its
    scores come from the repeated-cache pass, and equal the uncached ones too."""
    tok = build_tokenizer()
    model = build_model("modernbert", tok, init=0.2)
    assert not full_attention(model)
    gen = Generator(model, tok, "cpu", prefix_cache=False)
    msgs, answer = messages(), "Use open()."
    conts = [" [1]", " [2]", " [12]"]
    with forwards(model) as shapes:
        got = gen.score_continuations(msgs, answer, conts)
    assert len(shapes) == 2 and shapes[1][0] == len(conts)  # prompt, then one row each
    assert got == pytest.approx(uncached_scores(gen, msgs, answer, conts), abs=1e-4)


def test_the_tree_and_the_repeated_pass_agree_on_a_full_attention_model(monkeypatch):
    tok = build_tokenizer()
    gen = Generator(build_model("qwen2", tok, init=0.2), tok, "cpu")
    msgs, answer, conts = messages(), "Close it.", [" [1]", " [2]", " [3]"]
    tree = gen.score_continuations(msgs, answer, conts)
    monkeypatch.setattr(scoring, "full_attention", lambda model: False)
    assert gen.score_continuations(msgs, answer, conts) == pytest.approx(tree, abs=1e-4)
