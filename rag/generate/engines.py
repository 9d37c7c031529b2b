"""Which inference engine runs a decoder: the choice, made without importing either engine.

``RAGConfig.engine`` is ``auto | torch | openvino``. ``auto`` takes OpenVINO GenAI
(:mod:`rag.generate.ov_engine`) wherever it can run the decoder, torch
(:mod:`rag.generate.generator`) elsewhere; :func:`engine_reason` says, in one line, why OpenVINO
cannot (not installed, a GPU device, a model folder rather than a GGUF file, a LoRA adapter).
Kept apart from the engines so the config and every CLI can validate the setting for free.
"""

from __future__ import annotations

from pathlib import Path

ENGINES = ("auto", "torch", "openvino")  # RAGConfig.engine


class EngineUnavailable(ValueError):
    """``--engine openvino`` cannot serve this decoder here (message says why): the command as
    given cannot run (exit 2)."""


def openvino_available() -> bool:
    """Whether ``openvino_genai`` imports (``make install`` installs it, pinned)."""
    import importlib.util

    return importlib.util.find_spec("openvino_genai") is not None


def engine_gguf(name: str | Path) -> Path | None:
    """The engine folder (:mod:`rag.models.gguf`) for a decoder the engine can read: the pinned GGUF
    aliases, ``smollm2`` (its package's GGUF) and a local ``*.gguf`` file; None for anything
    else (a model folder: a from-scratch decoder, a converted safetensors copy)."""
    from rag.models.gguf import GGUF_PACKAGES, gguf_file_engine_path, package_engine_path

    name = str(name)
    if name in GGUF_PACKAGES:
        return package_engine_path(GGUF_PACKAGES[name])
    if name == "smollm2":
        from rag.models import smollm2_gguf_path

        return gguf_file_engine_path(smollm2_gguf_path(), alias="smollm2")
    path = Path(name).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        return gguf_file_engine_path(path)
    return None


def engine_reason(decoder: str | Path, adapter: str | Path | None, device: str) -> str | None:
    """Why the OpenVINO engine cannot run this decoder (None: it can), in one line."""
    from rag.models.gguf import GGUF_PACKAGES

    name = str(decoder)
    gguf = name in GGUF_PACKAGES or name == "smollm2" or name.endswith(".gguf")
    if not openvino_available():
        return "openvino-genai is not installed (make install)"
    if device == "cuda":
        return "the OpenVINO engine runs on the CPU here; --device cuda uses torch"
    if not gguf:
        return f"{name} is a model folder, not a GGUF file the engine reads"
    if adapter is not None:
        return f"the LoRA adapter {Path(str(adapter)).name} runs on the torch engine"
    return None


def choose_engine(engine: str, decoder: str | Path, adapter: str | Path | None, device: str) -> str:
    """``torch`` or ``openvino`` for a config's ``engine`` setting: ``auto`` takes OpenVINO
    wherever it can run the decoder (:func:`engine_reason`), torch elsewhere; an explicit
    ``openvino`` it cannot serve raises :class:`EngineUnavailable` with the reason."""
    if engine == "torch":
        return "torch"
    reason = engine_reason(decoder, adapter, device)
    if engine == "openvino" and reason:
        raise EngineUnavailable(f"--engine openvino: {reason}")
    return "torch" if reason else "openvino"
