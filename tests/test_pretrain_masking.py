"""Dynamic masking statistics: rate, 80/10/10 vs mask-only, specials never masked, whole words."""

from __future__ import annotations

import pytest
import torch

from training.pretrain.masking import IGNORE, MaskSpec, mask_tokens, word_starts_token

VOCAB = 1000
SPECIALS = torch.tensor([0, 1, 2, 3, 4])
MASK = 4


def _spec(word_start=None) -> MaskSpec:
    return MaskSpec(MASK, SPECIALS, 5, VOCAB, word_start)


def _batch(seed=0, shape=(64, 256)) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, VOCAB, shape, generator=g)
    ids[:, ::50] = 2  # document boundaries <s> ... </s> as in packed windows
    ids[:, 1::50] = 3
    return ids


@pytest.mark.parametrize("rate", [0.15, 0.30])
def test_mask_rate_and_specials(rate):
    ids = _batch()
    inputs, labels = mask_tokens(ids, _spec(), rate, generator=torch.Generator().manual_seed(1))
    selected = labels != IGNORE
    special = torch.isin(ids, SPECIALS)
    assert not (selected & special).any()  # special tokens are never selected
    assert torch.equal(inputs[special], ids[special])  # ... nor changed
    assert torch.equal(labels[selected], ids[selected])
    observed = selected.sum().item() / (~special).sum().item()
    assert abs(observed - rate) < 0.01


def test_80_10_10_split():
    ids = _batch()
    inputs, labels = mask_tokens(
        ids, _spec(), 0.3, "80-10-10", generator=torch.Generator().manual_seed(2)
    )
    sel = labels != IGNORE
    n = sel.sum().item()
    masked = (inputs[sel] == MASK).sum().item() / n
    kept = (inputs[sel] == ids[sel]).sum().item() / n
    other = 1 - masked - kept
    assert abs(masked - 0.8) < 0.015 and abs(kept - 0.1) < 0.015 and abs(other - 0.1) < 0.015
    # random replacements are ordinary tokens, never specials
    replaced = sel & (inputs != MASK) & (inputs != ids)
    assert not torch.isin(inputs[replaced], SPECIALS).any()
    assert torch.equal(inputs[~sel], ids[~sel])  # unselected positions untouched


def test_mask_only():
    ids = _batch()
    inputs, labels = mask_tokens(
        ids, _spec(), 0.3, "mask-only", generator=torch.Generator().manual_seed(3)
    )
    sel = labels != IGNORE
    assert (inputs[sel] == MASK).all() and torch.equal(inputs[~sel], ids[~sel])


def test_fresh_masks_each_seed_and_reproducible():
    ids = _batch()
    a = mask_tokens(ids, _spec(), 0.3, generator=torch.Generator().manual_seed(5))[1]
    b = mask_tokens(ids, _spec(), 0.3, generator=torch.Generator().manual_seed(5))[1]
    c = mask_tokens(ids, _spec(), 0.3, generator=torch.Generator().manual_seed(6))[1]
    assert torch.equal(a, b) and not torch.equal(a, c)


def test_whole_word_masks_words_together():
    word_start = torch.zeros(VOCAB, dtype=torch.bool)
    word_start[::3] = True  # every third id starts a word
    word_start[SPECIALS] = True
    ids = _batch(shape=(32, 256))
    inputs, labels = mask_tokens(
        ids, _spec(word_start), 0.3, whole_word=True, generator=torch.Generator().manual_seed(4)
    )
    sel = (labels != IGNORE).tolist()
    starts = word_start[ids].tolist()
    special = torch.isin(ids, SPECIALS).tolist()
    words = 0
    for row_sel, row_start, row_special in zip(sel, starts, special, strict=True):
        group: list[bool] = []
        for s, st, sp in zip(row_sel, row_start, row_special, strict=True):
            if st and group:
                assert len(set(group)) == 1  # a word is masked entirely or not at all
                words += 1
                group = []
            if not sp:
                group.append(s)
    assert words > 1000
    rate = (labels != IGNORE).float().mean().item()
    assert 0.2 < rate < 0.4


def test_word_start_tokens():
    assert word_starts_token("Ġthe") and word_starts_token("Ċ") and word_starts_token("(")
    assert not word_starts_token("ing") and not word_starts_token("2")
