"""Likelihood scores from the decoder: which marker it would write, how sure it is to refuse.

Two questions the pipeline asks the decoder without sampling from it:

- :func:`score_continuations`: log p(continuation | prompt, answer) for several short
  continuations at once (citation completion asks for `` [1]``, `` [2]``, ...);
- :func:`refusal_logprob`: log p(:data:`rag.answer.prompt.REFUSAL` | prompt), the refusal gate's
  number (:mod:`rag.answer.refusal`). It also returns the prompt's KV cache, so the answer decoded
  next only pays for one token of prefill.

``model.generate(output_scores=True)`` scores only the path it decodes; these are teacher-forced
forward passes over given text, which no library call does on top of our prefix cache.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import torch

from rag.answer.prompt import REFUSAL
from rag.generate.batch_request import takes_logits_to_keep

T = TypeVar("T")


def exclusive(generator: Any, fn: Callable[[], T]) -> T:
    """``fn()`` with the model to itself, in inference mode: on the batched decoder's worker
    between two steps when the generator batches (:meth:`BatchedDecoder.call`: it runs at the
    next step, where waiting for the decode lock could take many, and the answer it scores is
    then still in the prompt cache), else under the generator's decode lock."""
    batcher = getattr(generator, "batcher", None)
    if batcher is not None:
        return batcher.call(fn)
    with generator._decode_lock, torch.inference_mode():
        return fn()


def _start(generator: Any, ids: list[int], prefix_len: int) -> tuple[Any, int]:
    """A KV cache to extend and the first id it lacks: the start a prefill gets
    (``Generator._start_cache``: the stored prompt sharing the most ids with ``ids``, so citation
    scoring right after an answer finds that prompt and answer there; else the system prefix),
    or an empty cache when the caches are off."""
    cache = generator._start_cache(ids, prefix_len) if generator.prefix_cache else None
    if cache is None:
        from transformers import DynamicCache

        cache = DynamicCache(config=generator.model.config)
    return cache, int(cache.get_seq_length())


def last_logits_only(model: Any) -> dict[str, Any]:
    """``{"logits_to_keep": 1}`` where the model takes it: a prompt's forward then projects only
    its last position onto the vocabulary (SmolLM2: 49,152 x 576 per position, a fifth of its
    forward), the only logits these scores read."""
    return {"logits_to_keep": 1} if takes_logits_to_keep(model) else {}


def _cache_of(out: Any) -> Any:
    return out["cache"] if "cache" in out else out["past_key_values"]


def continuation_tree(
    conts: Sequence[Sequence[int]],
) -> tuple[list[int], list[int], list[list[int]]]:
    """The continuations' token ids as a prefix tree, for scoring them all in one forward.

    Returns ``(tokens, parents, reads)``: the tree's inner nodes (each id some continuation goes
    on after: every id but a continuation's last, shared prefixes once), each node's parent
    (-1 for a continuation's first id), and per continuation, for each of its ids, the node
    whose logits predict it (-1: the last position before the tree). Citation markers
    `` [1]`` ... `` [5]`` (SmolLM2: `` [``, a digit, ``]``) give 6 nodes: `` [`` and five digits.
    """
    index: dict[tuple[int, ...], int] = {}
    tokens: list[int] = []
    parents: list[int] = []
    reads: list[list[int]] = []
    for c in conts:
        row = [-1]
        for k in range(1, len(c)):
            path = tuple(c[:k])
            if path not in index:
                index[path] = len(tokens)
                tokens.append(c[k - 1])
                parents.append(index[path[:-1]] if k > 1 else -1)
            row.append(index[path])
        reads.append(row)
    return tokens, parents, reads


def tree_mask(
    cached: int, run: int, parents: Sequence[int], dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """The additive attention mask [1, 1, run + n, cached + run + n] and positions [1, run + n]
    of a forward of ``run`` ids after ``cached`` ones, then the ``n`` tree nodes of
    ``parents``: the run is causal; a node sees the cache, the run, its ancestors and itself
    (never a sibling's branch), at position ``cached + run + its depth``. Additive (0 or the
    dtype's minimum) so eager attention reads it as sdpa does."""
    n = len(parents)
    width = cached + run + n
    allowed = torch.zeros(run + n, width, dtype=torch.bool)
    rows = torch.arange(run)
    allowed[:run] = torch.arange(width)[None, :] <= cached + rows[:, None]  # causal run
    allowed[run:, : cached + run] = True
    depth = [0] * n
    for j, p in enumerate(parents):
        depth[j] = 0 if p < 0 else depth[p] + 1
        allowed[run + j, cached + run + j] = True
        if p >= 0:  # the parent's own row already lists its ancestors
            allowed[run + j, cached + run : cached + run + n] |= allowed[
                run + p, cached + run : cached + run + n
            ]
    mask = torch.zeros(run + n, width, dtype=dtype).masked_fill(~allowed, torch.finfo(dtype).min)
    pos = torch.cat([cached + rows, cached + run + torch.tensor(depth, dtype=torch.long)])
    return mask[None, None], pos[None]


def score_continuations(
    generator: Any, messages: Sequence[dict[str, str]], answer: str, continuations: Sequence[str]
) -> list[float]:
    """Log-probability of each continuation after the prompt and the assistant's ``answer``.

    One forward pass from the longest prefix the caches hold (:func:`_start`: after an answer,
    its prompt and answer from the prompt cache, so only the answer's last id runs; else the
    system prefix) runs the ids not cached and, after them, every continuation at once as a
    prefix tree (:func:`continuation_tree`): each node attends to the prompt, the answer and
    its own branch only (:func:`tree_mask`, the tree attention of speculative decoding), so
    each continuation's ids see exactly what they would alone, and the markers' shared `` [``
    runs once. Only the last run position and the nodes are projected onto the vocabulary.
    Several times faster than the repeat-the-cache pass below, with the same likeliest marker
    (docs/answering.md, citation completion: the times and the agreement). Models whose cache has
    sliding-window layers (ModernBERT-decoder: a custom mask would reach past their window)
    still use that pass: the prompt and answer first, their cache repeated once per
    continuation, then all continuations right-padded in one batched pass (a causal model
    never attends to later tokens, so the padding changes no score).
    """
    if not continuations:
        return []
    ids, prefix_len = generator.prompt_ids(messages)
    enc = generator.tokenizer
    ids = ids + list(enc(answer, add_special_tokens=False)["input_ids"])
    conts = [list(enc(c, add_special_tokens=False)["input_ids"]) for c in continuations]
    if any(not c for c in conts):
        raise ValueError("every continuation must encode to at least one token")
    model = generator.model
    tree = full_attention(model)

    def run() -> list[float]:
        cache, start = _start(generator, ids, prefix_len)
        if tree:
            return _score_tree(generator, ids, conts, cache, start)
        return _score_repeated(generator, ids, conts, cache, start)

    return exclusive(generator, run)


def full_attention(model: Any) -> bool:
    """Whether every layer of ``model``'s cache is full attention (a custom mask is then
    exact): :meth:`rag.generate.batching.BatchedDecoder.supports`."""
    from rag.generate.batching import BatchedDecoder

    return BatchedDecoder.supports(model)


def _score_tree(
    generator: Any, ids: list[int], conts: list[list[int]], cache: Any, start: int
) -> list[float]:
    """:func:`score_continuations` in one forward: the uncached ids, then the continuations'
    prefix tree."""
    model, device = generator.model, generator.device
    tokens, parents, reads = continuation_tree(conts)
    run = len(ids) - start  # >= 1: the caches never hold the last id
    mask, pos = tree_mask(start, run, parents, model.dtype)
    keep = len(tokens) + 1  # the run's last position, then one per node
    extra = {"logits_to_keep": keep} if takes_logits_to_keep(model) else {}
    out = model(
        input_ids=torch.tensor([ids[start:] + tokens], device=device),
        attention_mask=mask.to(device),
        position_ids=pos.to(device),
        cache=cache,
        use_cache=True,
        **extra,
    )
    logp = torch.log_softmax(out["logits"][0, -keep:].float(), dim=-1)  # [1 + nodes, V]
    return [
        float(sum(logp[r + 1, t] for r, t in zip(row, c, strict=True)))
        for row, c in zip(reads, conts, strict=True)
    ]


def _score_repeated(
    generator: Any, ids: list[int], conts: list[list[int]], cache: Any, start: int
) -> list[float]:
    """:func:`score_continuations` for caches a custom mask cannot serve: the uncached ids,
    then their cache repeated per continuation and all continuations right-padded at once."""
    model, device, enc = generator.model, generator.device, generator.tokenizer
    out = model(
        input_ids=torch.tensor([ids[start:]], device=device),
        cache=cache,
        use_cache=True,
        **last_logits_only(model),
    )
    first = torch.log_softmax(out["logits"][0, -1].float(), dim=-1)
    cache = _cache_of(out)
    scores = [float(first[c[0]]) for c in conts]
    width = max(len(c) for c in conts) - 1
    if width:
        cache.batch_repeat_interleave(len(conts))
        pad = enc.pad_token_id if enc.pad_token_id is not None else conts[0][0]
        rows = [c[:-1] + [pad] * (width - len(c) + 1) for c in conts]
        logits = model(input_ids=torch.tensor(rows, device=device), cache=cache, use_cache=True)[
            "logits"
        ]
        logp = torch.log_softmax(logits.float(), dim=-1)
        for b, c in enumerate(conts):
            scores[b] += sum(float(logp[b, j, t]) for j, t in enumerate(c[1:]))
    return scores


def refusal_ids(tokenizer: Any) -> list[int]:
    """The refusal sentence as the assistant's reply starts with it (no leading space)."""
    return list(tokenizer(REFUSAL, add_special_tokens=False)["input_ids"])


def refusal_logprob(generator: Any, messages: Sequence[dict[str, str]]) -> tuple[float, Any]:
    """log p(REFUSAL | prompt), and the KV cache of the prompt's ids but the last.

    The prompt but its last id goes through the model into a cache ``generate`` can start from
    (it needs one uncached id); a copy of it then takes the last id and the refusal's ids but
    the last, whose logits score the refusal. (Copying rather than cropping: caches with
    sliding-window layers, as in ModernBERT, cannot be cropped.)
    """
    ids, prefix_len = generator.prompt_ids(messages)
    ref = refusal_ids(generator.tokenizer)
    model, device = generator.model, generator.device

    def run() -> tuple[float, Any]:
        cache, start = _start(generator, ids[:-1], prefix_len)
        if start < len(ids) - 1:
            out = model(
                input_ids=torch.tensor([ids[start:-1]], device=device),
                cache=cache,
                use_cache=True,
                **last_logits_only(model),  # its logits are not read
            )
            cache = _cache_of(out)
        scratch = copy.deepcopy(cache)
        seq = ids[-1:] + ref[:-1]
        logits = model(input_ids=torch.tensor([seq], device=device), cache=scratch, use_cache=True)[
            "logits"
        ]
        # logits[0, j] predicts ref[j]: the prompt's last id predicts the refusal's first
        logp = torch.log_softmax(logits[0].float(), dim=-1)  # [len(ref), V]
        total = float(sum(logp[j, t] for j, t in enumerate(ref)))
        return total, cache

    return exclusive(generator, run)
