"""Decoder speed options: int8 decode layers, ``torch.compile`` and a static KV cache.

Why: one stream of SmolLM2-135M decoded below the 25 tokens/s on 2 CPU cores that issue 12
item 3 asks for (docs/benchmarks.md, *Decode variants*). A decode step of a small model is many
small matrix-vector products plus Python
and dispatch overhead around them; these three options attack different parts of that and are
measured side by side (speed and greedy agreement) by ``benchmarks.decode_variants``. All are off
by default until the measurement says which to keep.

- ``int8=True`` (what ``decoder_precision = "int8"`` turns on, :mod:`rag.models.precision`): every
  ``nn.Linear`` (the LM head included) gains an int8 copy of its weights that serves the
  one-token calls of decode steps, through torch's dynamic int8 kernel; prefill and scoring keep
  the float weights (``auto``: bf16 where it runs fast), and each sequence of a batch is its own
  call, so the prefix cache and batching stay exact (:mod:`rag.generate.int8_linear` says why not
  ``quantize_dynamic`` on the whole model). CPU only.
- ``compile=True``: with the dynamic cache, the model's ``forward`` is replaced by
  ``torch.compile(forward, dynamic=True)``, so every caller (``generate``, the prefix cache, the
  batched decoder, citation scoring) runs compiled graphs: one per kind of call (prefill, decode
  step, batched step, ...), shapes symbolic, so no recompile per prompt length. With the static cache it is
  ``generate``'s own compiled decode step (transformers' design: prefill eager, decode compiled
  against fixed cache shapes), which transformers only enables on CPU when asked
  (``CompileConfig._compile_all_devices``). Not with int8: dynamo cannot trace the quantised
  layers' packed weights (an opaque ``ScriptObject``), so every layer breaks the graph and the
  recompile limit is hit; that combination is refused.
- ``cache="static"``: a ``StaticCache`` allocated once per answer (prompt + ``max_new_tokens``,
  rounded up to :data:`STATIC_CACHE_STEP` so that few distinct shapes reach the compiler), with
  the cached system prefix copied in (the same keys and values, so outputs stay exact). Not with
  batching: the batched decoder merges requests into one growing, left-padded ``DynamicCache``.

Every refusal names the flags (``--decoder-precision``, ``--decoder-compile``,
``--cache-implementation``, ``--device``, ``--no-batching``) so a bad combination
stops at start-up with one line instead of failing inside decoding.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

CACHE_IMPLEMENTATIONS = ("dynamic", "static")  # cache_implementation values
STATIC_CACHE_STEP = 256  # static cache capacity is a multiple of this (few shapes to compile)
RECOMPILE_LIMIT = 24  # compiled graphs per function before dynamo falls back to eager


class DecodeSpeedError(ValueError):
    """An unknown value or an unsupported combination of decoder speed options."""


@dataclass(frozen=True)
class DecodeSpeed:
    """The decoder speed options of one :class:`rag.generate.generator.Generator` (module docstring)."""

    int8: bool = False  # int8 decode layers: decoder_precision int8 (rag.models.precision)
    compile: bool = False  # torch.compile the forward (dynamic cache) or the decode step (static)
    cache: str = "dynamic"  # dynamic | static KV cache

    def __post_init__(self) -> None:
        if self.cache not in CACHE_IMPLEMENTATIONS:
            raise DecodeSpeedError(
                f"--cache-implementation must be one of {', '.join(CACHE_IMPLEMENTATIONS)}, "
                f"not {self.cache!r}"
            )
        if self.int8 and self.compile:
            raise DecodeSpeedError(
                "--decoder-compile does not combine with --decoder-precision int8: torch.compile "
                "cannot trace the int8 layers (a graph break at every linear layer), so choose one"
            )

    def with_precision(self, precision: str) -> DecodeSpeed:
        """These options for a decoder of ``precision`` (:mod:`rag.models.precision`): ``int8`` adds
        the int8 decode layers; the float precisions change nothing here."""
        return replace(self, int8=True) if precision == "int8" else self

    @property
    def label(self) -> str:
        """Short name for tables: ``eager`` when nothing is on, else e.g. ``int8+static``."""
        parts = [p for p, on in (("int8", self.int8), ("compile", self.compile)) if on]
        parts += ["static"] if self.cache == "static" else []
        return "+".join(parts) or "eager"

    def check(self, *, device: str = "cpu", batching: bool = False) -> None:
        """Refuse the combinations with the rest of the setup that cannot work (one line each)."""
        if self.int8 and device == "cuda":
            raise DecodeSpeedError(
                "--decoder-precision int8 runs on CPU only (torch's dynamic int8 kernels): "
                "drop it or use --device cpu"
            )
        if self.cache == "static" and batching:
            raise DecodeSpeedError(
                "--cache-implementation static does not combine with batching (the batched "
                "decoder merges requests into one growing DynamicCache): add --no-batching "
                "(batching = false in rag.toml's [generate]) or use --cache-implementation dynamic"
            )

    # ---- model ----------------------------------------------------------------------------------

    def prepare(self, model: Any) -> Any:
        """``model`` (on its device, in eval mode) with the options applied: int8 layers swapped
        in, or its forward compiled (dynamic cache only; the static cache compiles in
        :meth:`generate_kwargs`). Idempotent for unchanged options; returns the model to use."""
        if self.int8:
            from rag.generate.int8_linear import add_int8_decode_layers

            try:
                model = add_int8_decode_layers(model)
            except ImportError as e:  # torch.ao removed in a later torch (torchao replaces it)
                raise DecodeSpeedError(f"--decoder-precision int8: {e}") from e
        if self.compile and self.cache == "dynamic" and not hasattr(model, "_rag_compiled"):
            import torch

            # One graph per kind of call (prefix cache, prefill, decode step, batched admit and
            # step, scoring: their keyword sets and 1-vs-many sizes differ), more than dynamo's
            # default limit of 8 per function, past which it silently runs the rest eagerly.
            limit = torch._dynamo.config.recompile_limit
            torch._dynamo.config.recompile_limit = max(limit, RECOMPILE_LIMIT)
            model.forward = torch.compile(model.forward, dynamic=True, mode="default")
            model._rag_compiled = True
        return model

    def generate_kwargs(self, model: Any, cache: Any, total_tokens: int) -> dict[str, Any]:
        """The ``model.generate`` options for an answer of at most ``total_tokens`` (prompt +
        new) that starts from ``cache`` (a prefix ``DynamicCache``, or None): nothing for the
        dynamic cache; for the static one a fresh ``StaticCache`` holding ``cache``'s keys and
        values, and with ``compile`` the config that compiles generate's decode step on CPU too."""
        if self.cache != "static":
            return {} if cache is None else {"cache": cache}
        kw: dict[str, Any] = {"cache": static_cache(model, cache, total_tokens)}
        if self.compile:
            kw["compile_config"] = compile_config()
        return kw


def static_capacity(total_tokens: int) -> int:
    """Static cache length for an answer of ``total_tokens``: the next multiple of the step."""
    return max(1, math.ceil(total_tokens / STATIC_CACHE_STEP)) * STATIC_CACHE_STEP


def static_cache(model: Any, prefix: Any, total_tokens: int) -> Any:
    """A ``StaticCache`` of :func:`static_capacity` slots holding ``prefix``'s keys and values
    (a ``DynamicCache`` of the prompt's first tokens, or None for an empty cache)."""
    from transformers import StaticCache

    cache = StaticCache(config=model.config, max_cache_len=static_capacity(total_tokens))
    if prefix is not None and prefix.get_seq_length() > 0:
        if len(prefix.layers) != len(cache.layers):
            raise DecodeSpeedError("--cache-implementation static: prefix cache layers differ")
        for mine, theirs in zip(cache.layers, prefix.layers):
            mine.update(theirs.keys, theirs.values)  # appends at position 0 of an empty layer
    return cache


def compile_config() -> Any:
    """``generate``'s compile settings: inductor, no CUDA graphs (CPU), and forced on for CPU,
    which transformers skips unless told (``_compile_all_devices``)."""
    from transformers import CompileConfig

    cfg = CompileConfig(fullgraph=False, dynamic=None, mode="default")
    cfg._compile_all_devices = True
    return cfg
