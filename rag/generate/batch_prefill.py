"""Batched prefill: which requests admitted together share a prefill forward, that padded
forward, and the layout of its cache as the decode batch keeps it (:mod:`rag.generate.batching`
runs them).

Requests admitted together are prefilled together, one forward per group (which ones share a
forward: :func:`plan_prefill`): each row's cache (the prefix cache the generator handed it, or
nothing) is left-padded to the longest, and each row's *suffix* (the prompt ids its cache does not
hold) is left-padded to the longest suffix. So the pads sit in the middle, between a row's cached
prefix and its suffix; the 2D mask hides them, ``position_ids`` give the suffix tokens their real
positions (after the row's own prefix), and causality keeps the leading pads out of every real
token's view. Left padding of the suffix (rather than right) puts every row's last real token in
the last column, so ``logits_to_keep=1`` gives each row its next-token logits; right padding would
need the logits of every position (or the model's hidden states) to find them. Pads that see no
real column at all (a row without a cache, shorter than the longest suffix) are fully masked rows,
which torch's SDPA returns as zeros and eager attention as a finite average; their outputs are
never read. After the forward each row's columns are moved right-aligned (:func:`right_align`: one
gather per layer; pad columns zeroed), which is the decode batch's own layout, and the
admission's groups join the batch by one copy (:func:`merge_caches`). Why not keep the middle
padding while decoding: with every row right-aligned, a step's mask and positions follow from the
row lengths alone, and rows leaving trim the padding all rows share with a slice.

Why a plan: the token budget bounds a prefill forward's activations (rows x longest suffix), and
which requests share a forward is a cost estimate. On CPU prefill is compute-bound, a pad token
costs as much as a real one, and batching saves only each forward's fixed cost (reading every
weight once: :data:`CPU_FORWARD_COST_TOKENS`), so requests of like lengths share a forward and
very different ones do not; on an accelerator all that fit the budget share one.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from transformers import DynamicCache

from rag.generate.batch_request import BatchRequest

# A prefilled group ready to join the batch: its requests, their right-aligned cache
# [k, H, width, D] and that width (BatchedDecoder._prefill -> BatchedDecoder._merge).
Part = tuple[list[BatchRequest], Any, int]

# Padded prompt tokens (rows x longest suffix) one batched prefill forward may compute; requests
# beyond it go to another forward of the same admission. Bounds the prefill's activations
# (SmolLM2: 576 wide, so a few hundred MB in float32 at this size); a single longer prompt is
# still prefilled, alone.
DEFAULT_MAX_PREFILL_TOKENS = 4096
# A forward's fixed cost on CPU in prompt tokens' worth: every forward streams all the weights
# from memory whatever its size, so a row joining a forward saves this many tokens of time and
# each pad token costs one (the SmolLM2 fp32 prefill measurement behind it: docs/benchmarks.md,
# *Chat UI load*). On an accelerator the fixed cost (kernel launches) dwarfs a token's; there
# the whole budget is used: every request that fits shares the forward.
CPU_FORWARD_COST_TOKENS = 32


def plan_prefill(lengths: Sequence[int], budget: int, forward_cost: int) -> list[int]:
    """Split requests of suffix ``lengths`` (sorted ascending) into consecutive groups, one
    prefill forward each, minimising the estimated time ``forward_cost`` + rows x longest per
    forward, with rows x longest <= ``budget`` unless a group is one request. Returns the group
    sizes. Sorted lengths make consecutive groups optimal (a group's cost is set by its
    longest), so a dynamic programme over the split points finds the best plan."""
    n = len(lengths)
    best: list[tuple[int, int]] = [(0, 0)] + [(0, 0)] * n  # (cost, forwards) of the first j
    first = [0] * (n + 1)  # where the last group of the best plan for the first j starts
    for j in range(1, n + 1):
        longest, options = lengths[j - 1], []
        for i in range(j - 1, -1, -1):  # the last group is i..j-1
            rows = j - i
            if rows > 1 and rows * longest > budget:
                break  # more rows only grow it
            cost, forwards = best[i]
            options.append((cost + forward_cost + rows * longest, forwards + 1, i))
        cost, forwards, first[j] = min(options)  # ties: fewer forwards, then longer last group
        best[j] = (cost, forwards)
    sizes = []
    j = n
    while j:
        sizes.append(j - first[j])
        j = first[j]
    return sizes[::-1]


def pad_left(t: torch.Tensor, n: int) -> torch.Tensor:
    """``t`` [B, H, S, D] with ``n`` zero columns in front: [B, H, n + S, D]."""
    return F.pad(t, (0, 0, n, 0)) if n else t


def prefill_forward(
    model: Any, device: str, group: Sequence[BatchRequest], keep_logits: bool
) -> tuple[Any, torch.Tensor]:
    """Prefill ``group`` in one forward: each row's cache (its prefix, or nothing) left-padded
    to the longest, each row's suffix left-padded to the longest suffix, so the pads sit
    before the cache and between cache and suffix (the mask hides them). Returns the cache
    [k, H, width + longest, D] and each row's next-token logits [k, V] (float32)."""
    k = len(group)
    starts = torch.tensor([r.start for r in group])  # [k] cached ids per row
    lens = torch.tensor([r.prompt_len - r.start for r in group])  # [k] suffix ids per row
    width, longest = int(starts.max()), int(lens.max())
    if k == 1:  # alone: the request's own cache, no padding
        req = group[0]
        cache = req.cache if req.cache is not None else DynamicCache(config=model.config)
    else:
        cache = stack_caches(model, group, width)
    ids = torch.zeros(k, longest, dtype=torch.long)  # pad id 0: any valid id, masked
    for b, req in enumerate(group):
        ids[b, longest - int(lens[b]) :] = req.input_ids[0, req.start :].cpu()
    cols = torch.arange(width + longest)
    mask = ((cols >= width - starts[:, None]) & (cols < width)) | (
        cols >= width + longest - lens[:, None]
    )  # [k, width + longest]: the row's cached columns and its suffix
    # suffix tokens at their real positions (after the row's prefix); pads at 0..
    pos = (torch.arange(longest) - (longest - lens)[:, None] + starts[:, None]).clamp(min=0)
    kw: dict[str, Any] = {
        "input_ids": ids.to(device),
        "attention_mask": mask.long().to(device),
        "position_ids": pos.to(device),
        "cache": cache,
        "use_cache": True,
    }
    if keep_logits:
        kw["logits_to_keep"] = 1
    out = model(**kw)
    cache = out["cache"] if "cache" in out else out["past_key_values"]
    return cache, out["logits"][:, -1, :].float()


def stack_caches(model: Any, group: Sequence[BatchRequest], width: int) -> Any:
    """A new cache holding each request's cache as a row, left-padded to ``width`` columns
    (zeros for a request without one). The requests' own caches are not changed."""
    stacked = DynamicCache(config=model.config)
    if width == 0:
        return stacked
    first = next(r.cache for r in group if r.start)
    for i, layer in enumerate(stacked.layers):
        keys, values = [], []
        for req in group:
            if req.start:
                theirs = req.cache.layers[i]  # [1, H, start, D]
                keys.append(pad_left(theirs.keys, width - req.start))
                values.append(pad_left(theirs.values, width - req.start))
            else:
                k, v = first.layers[i].keys, first.layers[i].values
                keys.append(k.new_zeros(1, k.shape[1], width, k.shape[3]))
                values.append(v.new_zeros(1, v.shape[1], width, v.shape[3]))
        layer.update(torch.cat(keys), torch.cat(values))
    return stacked


def right_align(
    group: Sequence[BatchRequest], cache: Any, keep: Sequence[int], device: str
) -> tuple[Any, int]:
    """Rows ``keep`` of a prefilled ``cache`` in the batch's layout: each row's prompt in its
    last columns, zero padding before it (the middle pads moved to the front). Returns the
    cache and its width (the longest prompt kept)."""
    # the forward's columns: the longest cache (width) + the longest suffix, of all the group
    width = max(r.start for r in group)
    total = width + max(r.prompt_len - r.start for r in group)
    if len(keep) < len(group):
        cache.batch_select_indices(torch.tensor(list(keep), device=device))
    rows = [group[b] for b in keep]
    starts = torch.tensor([r.start for r in rows])[:, None]  # [k, 1]
    lens = torch.tensor([r.prompt_len - r.start for r in rows])[:, None]
    prompts = starts + lens  # [k, 1] prompt lengths
    new = int(prompts.max())
    t = torch.arange(new)[None, :]  # target column
    pad = new - prompts  # [k, 1] leading pads in the target
    src = torch.where(
        t < pad + starts,
        width - starts + (t - pad),  # the row's cached prefix
        total - lens + (t - pad - starts),  # the row's suffix
    )  # [k, new] source column of each target column
    real = t >= pad
    if torch.equal(src[real], (t + total - new).expand_as(src)[real]):
        trim = total - new  # right-aligned already (no caches, or one suffix length)
        for layer in cache.layers if trim else ():
            layer.keys = layer.keys[:, :, trim:, :]
            layer.values = layer.values[:, :, trim:, :]
    else:
        src = torch.where(real, src, 0)[:, None, :, None].to(device)  # [k, 1, new, 1]
        for layer in cache.layers:
            layer.keys = layer.keys.gather(
                2, src.expand(-1, layer.keys.shape[1], -1, layer.keys.shape[3])
            )
            layer.values = layer.values.gather(
                2, src.expand(-1, layer.values.shape[1], -1, layer.values.shape[3])
            )
    if not bool(real.all()):  # the pads' keys and values (of pad ids) as zeros, as in a merge
        hide = (~real)[:, None, :, None].to(device)
        for layer in cache.layers:
            layer.keys = layer.keys.masked_fill(hide, 0)
            layer.values = layer.values.masked_fill(hide, 0)
    return cache, new


def merge_caches(sources: Sequence[tuple[Any, int]], target: Any) -> int:
    """Write the rows of ``sources`` (right-aligned caches [k, H, width, D] and their widths, in
    order) into ``target``'s layers as one batch, every side left-padded with zeros to the
    widest; returns that width. One copy per layer for all of them, not one concatenation per
    source: the batch's cache would be copied again for every group that joined
    (docs/benchmarks.md, *Chat UI load*: the merges of a burst of 16 distinct questions)."""
    new = max(width for _, width in sources)
    total = sum(int(cache.layers[0].keys.shape[0]) for cache, _ in sources)
    for i, layer in enumerate(target.layers):
        for name in ("keys", "values"):
            first = getattr(sources[0][0].layers[i], name)  # [B, H, width, D]
            out = first.new_zeros(total, first.shape[1], new, first.shape[3])
            at = 0
            for cache, width in sources:
                t = getattr(cache.layers[i], name)
                out[at : at + t.shape[0], :, new - width :] = t  # right-aligned
                at += t.shape[0]
            setattr(layer, name, out)
    return new
