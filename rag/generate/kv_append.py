"""A KV cache layer that appends a decode step's keys and values in place.

transformers' ``DynamicLayer.update`` grows the cache with ``torch.cat``, so every decode step
copies the whole cache of every layer to add one column. For one stream that is a small part of
a step, but the batched decoder's cache is [rows, heads, width, head_dim] for up to 16 rows of
~700-token prompts, and there the copies were about half of a step; with this layer the greedy
logits are bit-identical (``benchmarks/batch_cache.py``'s measurements: docs/benchmarks.md,
*The batch KV cache: appending in place*).

:class:`AppendLayer` keeps ``keys``/``values`` as views [B, H, n, D] of buffers with spare
columns [B, H, n + spare, D]; ``update`` writes the new columns into the spare ones and returns
longer views, copying only when the spare columns run out (every ``spare`` steps) or when the
layer's tensors were replaced from outside (the batched decoder concatenates ``layer.keys`` when
rows join; the next ``update`` then starts a new buffer from them). Rows leaving stay in place:
``batch_select_indices`` gathers the buffers whole, and trimming leading columns by a slice
leaves a view the next ``update`` still appends to. Attention reads the views as it read the
concatenated tensors (same values, strided only across the sequence dimension), so outputs are
exact.

Why not a library: transformers' ``StaticCache`` preallocates to a fixed ``max_cache_len`` per
batch and assumes a fixed batch, while the batched decoder's rows join, leave and are re-padded
between steps; ``DynamicLayer`` is the layer it already uses, and this subclass changes only how
it grows.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers.cache_utils import DynamicLayer

SPARE_COLUMNS = 64
"""Columns a new buffer holds beyond those in use: one copy per 64 decode steps instead of one
per step (16 rows x 30 layers x 3 heads x 64 x 64 x 4 bytes x 2 = 47 MB for SmolLM2 in fp32)."""


class AppendLayer(DynamicLayer):
    """A ``DynamicLayer`` whose ``update`` writes into spare columns instead of concatenating."""

    spare: int = SPARE_COLUMNS
    _key_buf: torch.Tensor | None = None
    _value_buf: torch.Tensor | None = None

    @classmethod
    def adopt(cls, layer: DynamicLayer) -> AppendLayer:
        """This layer type holding ``layer``'s state (its tensors, not a copy of them)."""
        new = cls()
        new.__dict__.update(layer.__dict__)
        new._key_buf = new._value_buf = None
        return new

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Append ``key_states``/``value_states`` [B, H, m, D]; return all keys and values
        [B, H, n + m, D] (views of this layer's buffers)."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        n = self.get_seq_length()
        m = key_states.shape[-2]
        c = self._column()
        if c is None or c + n + m > self._key_buf.shape[2]:  # type: ignore[union-attr]
            self._key_buf = self._grow(self.keys, key_states, n, m)
            self._value_buf = self._grow(self.values, value_states, n, m)
            c = 0
        assert self._key_buf is not None and self._value_buf is not None
        self._key_buf[:, :, c + n : c + n + m] = key_states
        self._value_buf[:, :, c + n : c + n + m] = value_states
        self.keys = self._key_buf[:, :, c : c + n + m]  # [B, H, n + m, D], a view
        self.values = self._value_buf[:, :, c : c + n + m]
        return self.keys, self.values

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        """Keep rows ``indices``: one gather of the buffers, spare columns included, so the
        next step still appends in place (rows leaving the batched decoder)."""
        c = self._column()
        if c is None or self.get_seq_length() == 0:
            super().batch_select_indices(indices)
            return
        n = self.keys.shape[2]
        self._key_buf = self._key_buf[indices]  # type: ignore[index]
        self._value_buf = self._value_buf[indices]  # type: ignore[index]
        self.keys = self._key_buf[:, :, c : c + n]
        self.values = self._value_buf[:, :, c : c + n]

    def _column(self) -> int | None:
        """The buffer column where ``keys``/``values`` start when both are still column-range
        views of this layer's buffers (a slice such as the batched decoder's trim of shared
        leading pads keeps them so), else None: they were replaced from outside."""
        c = _view_column(self.keys, self._key_buf)
        return c if c is not None and _view_column(self.values, self._value_buf) == c else None

    def _grow(self, old: torch.Tensor, new: torch.Tensor, n: int, m: int) -> torch.Tensor:
        """A buffer [B, H, n + m + spare, D] holding ``old``'s n columns (the new ones are written
        by the caller)."""
        b, h, _, d = new.shape
        buf = new.new_empty(b, h, n + m + self.spare, d)
        if n:
            buf[:, :, :n] = old
        return buf


def _view_column(t: torch.Tensor, buf: torch.Tensor | None) -> int | None:
    """``c`` when ``t`` is ``buf[:, :, c : c + n]`` for some n, else None."""
    if (
        buf is None
        or t.dim() != 4
        or t.untyped_storage().data_ptr() != buf.untyped_storage().data_ptr()
    ):
        return None
    if t.shape[:2] != buf.shape[:2] or t.shape[3] != buf.shape[3] or t.stride() != buf.stride():
        return None
    offset, step = t.storage_offset() - buf.storage_offset(), buf.stride(2)
    if offset < 0 or offset % step or offset // step + t.shape[2] > buf.shape[2]:
        return None
    return offset // step


def appending(cache: Any) -> Any:
    """``cache`` with each plain ``DynamicLayer`` replaced by an :class:`AppendLayer` holding
    the same tensors (in place; other layer types are left as they are). Returns ``cache``."""
    cache.layers = [
        AppendLayer.adopt(layer) if type(layer) is DynamicLayer else layer for layer in cache.layers
    ]
    return cache
