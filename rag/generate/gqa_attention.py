"""Grouped-query attention over a cache without copying it: multi-token forwards on CPU.

SmolLM2 and Qwen2.5 share each key/value head among several query heads (SmolLM2-135M: 9 query
heads, 3 key/value heads). transformers' ``sdpa`` attention (5.25) hands torch's
``scaled_dot_product_attention`` the grouping itself (``enable_gqa``) only when there is no
attention mask; a one-token decode step packs the query heads instead. Every other forward, a
prompt's prefill after a cached prefix and the teacher-forced citation scores among them, first
copies each layer's keys and values once per query head of a group (``repeat_kv``). Over a
cache of a thousand tokens that copy is most of the forward; without it the logits are
bit-identical (the times: docs/answering.md, *Grouped-query attention on CPU*).

:func:`use_gqa_attention` registers ``sdpa_gqa`` with transformers' ``AttentionInterface`` (and
its mask, the ``sdpa`` one, with ``AttentionMaskInterface``) and switches a model to it. It
passes ``enable_gqa=True`` with the mask for forwards of more than one token, and leaves
everything else to transformers' own ``sdpa`` function. That covers one-token decode steps, models
without grouping, position biases, and a causal forward without a mask over a longer cache,
whose alignment ``sdpa`` handles. Why not set ``TRANSFORMERS_SDPA_FORCE_GQA=1``: it is global to
the process, and on CUDA a mask with ``enable_gqa`` can fall back to the slow math kernel; this
is per model.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

NAME = "sdpa_gqa"


def sdpa_gqa_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' attention signature: query [B, Hq, q, D], key/value [B, Hkv, kv, D]
    -> ([B, q, Hq, D], None)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    q_len, kv_len = query.shape[2], key.shape[2]
    grouped = getattr(module, "num_key_value_groups", 1) > 1
    plain = (
        q_len == 1
        or not grouped
        or kwargs.get("position_bias") is not None
        or kwargs.get("softcap") is not None
        or (attention_mask is None and q_len != kv_len)
    )
    if plain:
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
            is_causal=is_causal, **kwargs,
        )  # fmt: skip
    causal = getattr(module, "is_causal", True) if is_causal is None else is_causal
    out = F.scaled_dot_product_attention(
        query, key, value, attn_mask=attention_mask, dropout_p=dropout, scale=scaling,
        is_causal=bool(causal and attention_mask is None), enable_gqa=True,
    )  # fmt: skip  # [B, Hq, q, D]
    return out.transpose(1, 2).contiguous(), None


def register() -> None:
    """Make ``sdpa_gqa`` known to transformers (idempotent)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(NAME, sdpa_gqa_attention)
    AttentionMaskInterface.register(NAME, sdpa_mask)


def use_gqa_attention(model: Any) -> bool:
    """Switch ``model`` (a causal LM using ``sdpa``) to ``sdpa_gqa`` when its attention groups
    query heads; returns whether it did. Models on another implementation are left alone."""
    config = model.config
    heads = getattr(config, "num_attention_heads", None)
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    if getattr(config, "_attn_implementation", None) != "sdpa" or not heads or kv_heads >= heads:
        return False
    register()
    model.set_attn_implementation(NAME)
    return config._attn_implementation == NAME
