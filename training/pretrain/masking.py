"""Dynamic masking for the MLM objective (fresh masks for every batch).

Hand-written rather than transformers' DataCollatorForLanguageModeling because we need: masks
drawn from an explicit ``torch.Generator`` (so a resumed run draws exactly the masks an
uninterrupted one would), whole-word masking on byte-level BPE (the collator's whole-word
variant expects WordPiece ``##`` pieces), and a mask-only strategy beside 80-10-10.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

IGNORE = -100  # label value the loss ignores


@dataclass
class MaskSpec:
    """What the masker needs to know about the tokenizer."""

    mask_id: int  # id written at masked positions
    special_ids: torch.Tensor  # ids that are never masked (pad, unk, bos, eos, mask)
    random_low: int  # random replacements are drawn from [random_low, random_high)
    random_high: int
    word_start: torch.Tensor | None = None  # bool per vocab id: token begins a new word


def make_spec(tokenizer) -> MaskSpec:
    """A MaskSpec from a tokenizer from training.tokenizer (special tokens come first)."""
    specials = sorted({i for i in tokenizer.all_special_ids if i is not None})
    vocab = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
    starts = [word_starts_token(t) for t in vocab]
    for i in specials:
        starts[i] = True
    return MaskSpec(
        mask_id=tokenizer.mask_token_id,
        special_ids=torch.tensor(specials, dtype=torch.long),
        random_low=max(specials) + 1,
        random_high=len(tokenizer),
        word_start=torch.tensor(starts, dtype=torch.bool),
    )


def word_starts_token(token: str) -> bool:
    """In byte-level BPE a word starts at a token carrying a leading space (``Ġ``), newline
    (``Ċ``) or tab (``ĉ``); a token starting with punctuation also starts a new unit."""
    if not token:
        return True
    c = token[0]
    return c in "ĠĊĉ" or not c.isalnum()


def mask_tokens(
    input_ids: torch.Tensor,
    spec: MaskSpec,
    rate: float,
    strategy: str = "80-10-10",
    whole_word: bool = False,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Return ``(inputs, labels)``: about ``rate`` of the non-special tokens are selected;
    labels hold the original id there and IGNORE elsewhere. Selected inputs become ``<mask>``
    (mask-only) or ``<mask>`` / a random token / unchanged with probability 0.8 / 0.1 / 0.1."""
    device = input_ids.device
    special = torch.isin(input_ids, spec.special_ids.to(device))
    if whole_word:
        if spec.word_start is None:
            raise ValueError("whole-word masking needs MaskSpec.word_start")
        starts = spec.word_start.to(device)[input_ids]
        word_id = torch.cumsum(starts.long(), dim=1)  # 0 before the first start in a row
        draw = torch.rand(
            input_ids.shape[0], input_ids.shape[1] + 1, generator=generator, device=device
        )
        selected = torch.gather(draw, 1, word_id) < rate
    else:
        selected = torch.rand(input_ids.shape, generator=generator, device=device) < rate
    selected &= ~special
    labels = torch.where(selected, input_ids, torch.full_like(input_ids, IGNORE))
    inputs = input_ids.clone()
    if strategy == "mask-only":
        inputs[selected] = spec.mask_id
        return inputs, labels
    if strategy != "80-10-10":
        raise ValueError(f"mask strategy must be 80-10-10 or mask-only, not {strategy!r}")
    u = torch.rand(input_ids.shape, generator=generator, device=device)
    to_mask = selected & (u < 0.8)
    to_random = selected & (u >= 0.8) & (u < 0.9)
    random_ids = torch.randint(
        spec.random_low, spec.random_high, input_ids.shape, generator=generator, device=device
    )
    inputs = torch.where(to_mask, torch.full_like(inputs, spec.mask_id), inputs)
    inputs = torch.where(to_random, random_ids, inputs)
    return inputs, labels
