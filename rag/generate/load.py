"""Loading a decoder: :func:`load_decoder` builds either engine from the generation settings;
:func:`load_generator` (from :mod:`rag.generate.torch_load`) is the torch engine's (model,
tokenizer) with an optional LoRA adapter folded in; and the process-wide settings a server makes
at start-up (:func:`prepare_serving_process`).

Here, not in :mod:`rag.models`, because it needs :mod:`rag.generate`: ``rag.generate`` imports
``rag.models`` (names, resolution, devices, profiles), never the reverse.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from rag.generate.torch_load import load_generator
from rag.models import pick_device

__all__ = ["ensure_loaded", "load_decoder", "load_generator", "prepare_serving_process"]

if TYPE_CHECKING:
    from rag.generate.settings import GenerationSettings


def prepare_serving_process() -> bool:
    """Process-wide settings for a server (``rag.serve``, ``ui.app``) at start-up: glibc keeps
    freed memory for the batched decoder's buffers to reuse
    (:func:`rag.generate.allocator.keep_freed_memory`). Returns whether they took."""
    from rag.generate.allocator import keep_freed_memory

    return keep_freed_memory()


def ensure_loaded(model: Any) -> Any:
    """``model`` with what it loads lazily loaded now: its ``ensure_loaded()`` where it has one
    (an OpenVINO engine loaded with ``lazy``, a server's shared stand-in), else ``model`` as it
    is (a torch decoder, None). A front end's preload calls it, so a bad model fails there."""
    ensure = getattr(model, "ensure_loaded", None)
    return ensure() if ensure is not None else model


def load_decoder(
    settings: GenerationSettings,
    device: str = "auto",
    adapter: str | Path | None = None,
    *,
    short_replies: bool = False,
    lazy: bool = False,
) -> Any:
    """The decoder ``settings`` ask for, with ``adapter`` (``auto`` / ``none`` / a folder, as
    :attr:`GenerationSettings.adapter`; the pipeline loads its k-passage fallback without one),
    on the engine ``settings.engine`` resolves to on ``device``
    (:func:`rag.generate.engines.choose_engine`: OpenVINO GenAI where it can run the decoder, a
    :class:`rag.generate.generator.Generator` on torch elsewhere). The settings are passed whole:
    every decoding option is theirs. ``short_replies``: the decoder's replies are a few tokens
    (the factoid copier), which the OpenVINO engine's ``auto`` precision weighs
    (:func:`rag.generate.ov_engine.inference_precision`). ``lazy``: an OpenVINO engine is built
    at its first request or ``ensure_loaded`` (the tokenizer is loaded now); torch loads now."""
    from rag.generate.engines import choose_engine
    from rag.generate.generator import Generator
    from rag.generate.ov_engine import OpenVINOGenerator
    from rag.models import resolve_adapter

    s = settings
    # what both engines take from the settings
    common = {
        "device": device,
        "profile": s.profile,
        "prompt_cache_mb": s.prompt_cache_budget_mb,
        "max_context_tokens": s.max_context_tokens,
        "batching": s.batching,
        "max_batch": s.max_batch,
        "max_prefill_tokens": s.max_prefill_tokens,
    }
    resolved = resolve_adapter(s.decoder, adapter)
    if choose_engine(s.engine, s.decoder, resolved, pick_device(device)) == "openvino":
        return OpenVINOGenerator.load(
            s.decoder,
            prompt_lookup=s.prompt_lookup,
            precision=s.decoder_precision,
            short_replies=short_replies,
            lazy=lazy,
            **common,
        )
    return Generator.load(
        s.decoder,
        adapter=adapter,
        prefix_cache=s.prefix_cache,
        precision=s.decoder_precision,
        speed=s.speed,
        **common,
    )
