"""The objectives between MLM and CLM: AntLM-style alternation and prefix-LM, on one backbone.

Both train ModernBERT's *encoder* layout (``ModernBertForMaskedLM``) and change only what each
step lets a position see and what it must predict:

- **antlm** (after AntLM, Yu et al. 2024): CLM and MLM steps alternate on the same weights. A
  CLM step gives the encoder a causal attention mask and next-token labels; an MLM step is the
  ordinary bidirectional masked step. The switch happens every ``block`` steps, counted back from
  the last step, so the run always ends on an MLM block (the retriever's and reader's objective).
- **prefixlm** (UniLM / T5's prefix LM): per sequence a split point ``L`` is drawn; positions
  ``< L`` (the prefix) attend to the whole prefix, positions ``>= L`` to the prefix and their
  own past, and the loss covers the suffix tokens only.

Why hand-written masks: ModernBERT takes a per-layer-type mask mapping (``full_attention`` /
``sliding_attention``) but has no prefix-LM mode and no causal mode in the encoder class, and the
decoder class has no bidirectional mode. :func:`attention_masks` builds the mapping so that
``L = T`` is exactly the encoder's own mask and ``L = 0`` exactly the decoder's
(``ModernBertDecoderForCausalLM``), sliding windows included: the CLM steps therefore train the
very network the exported decoder runs (training.pretrain.export saves both layouts), which the
tests check logit for logit.
"""

from __future__ import annotations

import torch

from training.pretrain.masking import IGNORE


def antlm_kind(step: int, max_steps: int, block: int) -> str:
    """``mlm`` or ``clm`` for 0-based ``step`` of a ``max_steps`` run alternating every
    ``block`` steps; blocks are counted from the end, so the last block is always MLM."""
    if block < 1:
        raise ValueError(f"block must be >= 1, got {block}")
    from_end = (max_steps - 1 - step) // block
    return "mlm" if from_end % 2 == 0 else "clm"


def sample_prefix_lengths(
    batch: int, seq_len: int, generator: torch.Generator | None = None, device: str = "cpu"
) -> torch.Tensor:
    """One split point per sequence, uniform over ``1 .. seq_len - 1``: at least one prefix
    token to read and one suffix token to predict."""
    return torch.randint(1, seq_len, (batch,), generator=generator, device=device)


def next_token_labels(ids: torch.Tensor, first_target: torch.Tensor | int) -> torch.Tensor:
    """Labels for a causal loss computed *without* the model's own shift: position ``i`` is
    labelled with ``ids[i + 1]`` when that token is a target (index ``>= first_target`` of its
    row), IGNORE elsewhere; the last position predicts nothing. ``first_target = 1`` is the full
    CLM loss, ``first_target = L`` the prefix-LM loss (the suffix tokens only)."""
    B, T = ids.shape
    labels = torch.full_like(ids, IGNORE)
    labels[:, :-1] = ids[:, 1:]
    target_pos = torch.arange(1, T + 1, device=ids.device).expand(B, T)  # index of ids[i + 1]
    first = torch.as_tensor(first_target, device=ids.device).reshape(-1, 1)
    return labels.masked_fill(target_pos < first, IGNORE)


def attention_masks(
    prefix_len: torch.Tensor | int,
    seq_len: int,
    half_window: int,
    device: str | torch.device = "cpu",
    additive_dtype: torch.dtype | None = None,
) -> dict[str, torch.Tensor]:
    """ModernBERT's per-layer-type mask mapping for a prefix of ``prefix_len`` tokens (an int
    or one per sequence): shape ``(B or 1, 1, T, T)``, True = may attend (or 0 / -inf when
    ``additive_dtype`` is given, for eager attention).

    Full-attention layers: a prefix query sees every prefix key; a suffix query every key up
    to itself. Sliding layers add the window each model class uses there: the encoder's
    bidirectional ``|q - k| <= half_window`` for prefix queries, the decoder's causal
    ``q - k < half_window`` for suffix queries (``half_window`` = ``local_attention // 2``)."""
    q = torch.arange(seq_len, device=device).view(1, 1, seq_len, 1)
    k = torch.arange(seq_len, device=device).view(1, 1, 1, seq_len)
    L = torch.as_tensor(prefix_len, device=device).reshape(-1, 1, 1, 1)
    prefix_query = q < L
    full = torch.where(prefix_query, k < L, k <= q)
    band = torch.where(prefix_query, (q - k).abs() <= half_window, (q - k) < half_window)
    masks = {"full_attention": full, "sliding_attention": full & band}
    if additive_dtype is None:
        return masks
    low = torch.finfo(additive_dtype).min
    return {
        name: torch.zeros(m.shape, dtype=additive_dtype, device=device).masked_fill(~m, low)
        for name, m in masks.items()
    }
