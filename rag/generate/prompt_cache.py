"""The prompt cache: keys and values of recent prompts, reused by their longest shared token prefix.

Why: on a CPU a grounded prompt's prefill is most of an answer's work. A ~1,000-token prompt
(five passages and a question) is prefilled before the first new token, and that is
compute-bound, so batching cannot share it (docs/benchmarks.md, *Chat UI load*). The
system-prefix cache (:meth:`rag.generate.generator.Generator._prefix_cache_for`) saves only the
fixed system turn. But every prompt is laid out system turn, then the numbered passages, then
the question (:func:`rag.answer.prompt.user_message`). So a request whose top passages another request
already read shares all their tokens with that prompt: a repeated or regenerated question, two
users asking about the same page, a retry after a closed stream. Only the tokens after the first
difference need a forward.

What it does: after a prefill, the generator stores the prompt's per-layer keys and values,
cloned out of the decode cache and keyed by the prompt's token ids. Before a prefill it looks up
the stored prompt with the longest common token prefix and starts from a copy of its first
``m`` positions. ``m`` is at most the prompt's length minus one, because the last prompt token
must still run to give the next-token logits. This is exact: a position's key and value depend
only on the ids and positions before it, and the ids are the same. It is the idea of vLLM's
automatic prefix caching and llama.cpp's prompt cache. Those libraries work on paged blocks in
their own engines. Ours is a handful of whole prompts in transformers' ``DynamicCache`` layout,
which both decode paths here use (``model.generate`` and
:class:`rag.generate.batching.BatchedDecoder`). That is why no library served.

Bounds: at most ``max_bytes`` of keys and values are held. The least recently used prompts are
evicted first. A stored prompt that is a prefix of a new one is replaced by the new one. A
prompt alone larger than the budget is not stored. Only caches whose layers are all plain
full-attention ``DynamicLayer`` are supported, because a sliding-window layer cannot be cut at
an arbitrary position; :meth:`PromptCache.supports` checks this.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

# Keys, values: one (keys, values) pair per layer, each [1, heads, tokens, head_dim].
LayerKV = tuple[torch.Tensor, torch.Tensor]


@dataclass
class PromptCacheStats:
    """What the cache saved: prompt tokens looked up, and those served from the cache."""

    lookups: int = 0  # prompts looked up
    hits: int = 0  # lookups that reused more than the system prefix
    prompt_tokens: int = 0  # tokens of the prompts looked up
    reused_tokens: int = 0  # of those, tokens whose keys and values came from the cache

    @property
    def reused_share(self) -> float:
        """Share of looked-up prompt tokens that needed no prefill."""
        return self.reused_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


def common_prefix(a: torch.Tensor, b: torch.Tensor) -> int:
    """Length of the longest common prefix of two 1-D id tensors."""
    n = min(len(a), len(b))
    diff = (a[:n] != b[:n]).nonzero()
    return int(diff[0]) if len(diff) else n


class PromptCache:
    """Keys and values of recent prompts (module docstring), thread-safe.

    ``max_bytes`` bounds what is held (0 holds nothing). :meth:`lookup` returns a private copy,
    so a request may extend it while the stored entry stays as it was."""

    def __init__(self, model_config: Any, max_bytes: int) -> None:
        if max_bytes < 0:
            raise ValueError(f"prompt cache size must be >= 0 bytes, got {max_bytes}")
        self.config = model_config
        self.max_bytes = max_bytes
        self.bytes = 0
        self.stats = PromptCacheStats()
        self._entries: OrderedDict[tuple[int, ...], tuple[torch.Tensor, list[LayerKV], int]] = (
            OrderedDict()
        )
        self._lock = threading.Lock()

    @staticmethod
    def supports(model: Any) -> bool:
        """Whether every layer of ``model``'s cache is a plain full-attention ``DynamicLayer``:
        the batched decoder's own requirement, so one check serves both."""
        from rag.generate.batching import BatchedDecoder

        return BatchedDecoder.supports(model)

    def __len__(self) -> int:
        return len(self._entries)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self.bytes = 0

    # ---- lookup ---------------------------------------------------------------------------------

    def lookup(self, ids: Sequence[int], at_least: int = 0) -> tuple[Any, int]:
        """A private ``DynamicCache`` of the first ``m`` positions of the stored prompt sharing
        the longest prefix with ``ids``, and ``m`` (at most ``len(ids) - 1``). It returns
        (None, 0) when no stored prompt shares more than ``at_least`` ids, the system prefix the
        caller can serve otherwise. Counts the lookup in :attr:`stats`."""
        query = torch.tensor(list(ids), dtype=torch.long)
        with self._lock:
            best, layers, key = 0, None, None
            for k, (stored, kv, _) in self._entries.items():
                m = common_prefix(stored, query)
                if m > best:
                    best, layers, key = m, kv, k
            m = min(best, len(ids) - 1)
            self.stats.lookups += 1
            self.stats.prompt_tokens += len(ids)
            if layers is None or m <= at_least:
                return None, 0
            self._entries.move_to_end(key)
            self.stats.hits += 1
            self.stats.reused_tokens += m
            copies = [(k[:, :, :m].clone(), v[:, :, :m].clone()) for k, v in layers]
        return self._dynamic_cache(copies), m

    def _dynamic_cache(self, layers: Sequence[LayerKV]) -> Any:
        from transformers import DynamicCache

        cache = DynamicCache(config=self.config)
        for layer, (k, v) in zip(cache.layers, layers, strict=True):
            layer.update(k, v)
        return cache

    # ---- store ----------------------------------------------------------------------------------

    def store(self, ids: Sequence[int], layers: Sequence[LayerKV]) -> bool:
        """Keep the keys and values ``layers`` of prompt ``ids``. Each pair is
        [1, heads, >= len(ids), head_dim], and only the first ``len(ids)`` positions are kept,
        cloned. It returns whether the prompt was stored. A prompt that a stored one already
        holds whole is not stored again (that one is marked recently used); stored prompts that
        are a prefix of ``ids`` are dropped for it."""
        n = len(ids)
        if self.max_bytes == 0 or n == 0:
            return False
        size = sum(k[:, :, :n].numel() * k.element_size() * 2 for k, _ in layers)
        if size > self.max_bytes:
            return False
        key = tuple(int(i) for i in ids)
        query = torch.tensor(key, dtype=torch.long)
        with self._lock:
            for k, (stored, _, _) in list(self._entries.items()):
                m = common_prefix(stored, query)
                if m == n:  # ids are a prefix of (or equal to) a stored prompt
                    self._entries.move_to_end(k)
                    return False
                if m == len(stored):  # a stored prompt is a prefix of ids: superseded
                    self._drop(k)
        kept = [(k[:, :, :n].clone(), v[:, :, :n].clone()) for k, v in layers]
        with self._lock:
            if key in self._entries:  # another thread stored it meanwhile
                return False
            while self._entries and self.bytes + size > self.max_bytes:
                self._drop(next(iter(self._entries)))
            self._entries[key] = (query, kept, size)
            self.bytes += size
        return True

    def _drop(self, key: tuple[int, ...]) -> None:
        _, _, size = self._entries.pop(key)
        self.bytes -= size
