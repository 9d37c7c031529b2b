"""RAG configuration: one dataclass shared by ``rag.ask``, the pipeline and the UI.

Values come from three layers, later ones winning: the dataclass defaults, a ``rag.toml`` in the
working directory (or ``--config PATH``), then CLI flags. The TOML file holds the same field names
as the dataclass (snake_case or kebab-case), either at the top level or under a ``[rag]`` table::

    index = "pydocs"
    decoder = "smollm2"
    k = 5
    mode = "hybrid"

An unknown key is an error that names the key and the file, so a typo never silently falls back
to a default.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import tomllib

from rag.encoding import ENCODER_BACKENDS
from rag.models import DEFAULT_ADAPTER, DEFAULT_DECODER
from rag.prompt import PROFILES

MODES = ("dense", "bm25", "hybrid")
DTYPES = ("auto", "float32", "bfloat16")
BACKENDS = ("faiss", "chroma")
DEFAULT_CONFIG_FILE = "rag.toml"


class ConfigError(ValueError):
    """A bad config file, key or value; the message names the file/flag and the value."""


@dataclass
class RAGConfig:
    """Everything needed to answer a question from an index."""

    index: str = "default"  # index name under $RAG_HOME/indexes (or a folder path)
    encoder: str | None = (
        None  # query encoder alias/folder; None = the one the index was built with
    )
    decoder: str = DEFAULT_DECODER  # causal LM alias or folder that writes the answer
    # peft LoRA adapter for the decoder: none = the base model alone (the measured default: the
    # current LoRA recipe over-refuses on documentation questions, docs/answering.md); auto =
    # <decoder>-lora under $RAG_HOME/models when `make models` trained it; or a folder/name
    adapter: str | None = DEFAULT_ADAPTER
    backend: str = "faiss"  # vector store used by ingest: faiss | chroma
    chroma_url: str | None = (
        None  # Chroma server URL (HttpClient); None = embedded PersistentClient
    )
    k: int = 5  # passages retrieved and given to the decoder
    rerank: str | None = None  # cross-encoder folder/artefact (minilm-rerank); None = no rerank
    rerank_depth: int = 30  # candidates the reranker re-scores (one forward pass each: latency)
    rerank_max_length: int = 256  # tokens per query+passage pair given to the reranker
    fusion: str = "rrf"  # hybrid fusion: rrf | convex (rag.fusion)
    alpha: float = 0.5  # dense weight in hybrid fusion (rrf with 0.5 = plain RRF)
    mode: str = "hybrid"  # retrieval mode: dense | bm25 | hybrid
    chunk_tokens: int = 256  # ingest: target chunk size in encoder tokens
    overlap: int = 32  # ingest: tokens shared by consecutive chunks
    temperature: float = 0.0  # 0 = greedy decoding (deterministic); > 0 samples
    top_p: float = 1.0  # nucleus sampling mass when temperature > 0
    max_new_tokens: int = 256  # answer length limit in decoder tokens
    max_context_tokens: int | None = 2048  # prompt+answer cap below the decoder's max positions
    min_score: float | None = None  # relevance threshold on hit scores; None = per-mode default
    prefix_cache: bool = True  # reuse the KV cache of the fixed system prompt across questions
    batching: bool = False  # decode concurrent requests together (rag.batching); off until measured
    max_batch: int = 8  # rows per decode step when batching is on
    # check each cited sentence against the passage it names; re-attribute or flag (rag.verify)
    verify_citations: bool = True
    # when the answer cites nothing (and is no refusal), append the passage marker [i] the decoder
    # itself scores likeliest after its answer; Answer.citations_completed records it
    complete_citations: bool = True
    # refusal gate (rag.refusal): refuse only when p(refusal | prompt) >= this, else decode the
    # answer with the refusal barred; None = the decoder's greedy choice stands
    refusal_threshold: float | None = None
    device: str = "auto"  # auto | cpu | cuda
    # query encoder runtime: torch | onnx (ONNX Runtime on CPU, same embeddings; rag.encoding)
    encoder_backend: str = "torch"
    # decoder weights: auto = bfloat16 on CUDA or a CPU with bf16 units (AMX), else float32
    dtype: str = "auto"
    # prompt format (rag.prompt.PROFILES): auto = the decoder's measured best (rag.models)
    profile: str = "auto"
    # Hook (not from TOML/CLI): turns (question, history) into a standalone retrieval query.
    rewrite_query: Callable[[str, list[tuple[str, str]]], str] | None = field(
        default=None, repr=False, compare=False
    )

    def __post_init__(self) -> None:
        validate(self)

    def to_dict(self) -> dict[str, Any]:
        """Plain values for ``run.json`` / ``--json`` (the rewrite hook is shown by name)."""
        d = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "rewrite_query"}
        hook = self.rewrite_query
        d["rewrite_query"] = getattr(hook, "__qualname__", repr(hook)) if hook else None
        return d


def validate(cfg: RAGConfig) -> None:
    """Reject values that would only fail later, deep inside retrieval or decoding."""
    if cfg.mode not in MODES:
        raise ConfigError(f"mode must be one of {', '.join(MODES)}, not {cfg.mode!r}")
    if cfg.backend not in BACKENDS:
        raise ConfigError(f"backend must be one of {', '.join(BACKENDS)}, not {cfg.backend!r}")
    if cfg.device not in ("auto", "cpu", "cuda"):
        raise ConfigError(f"device must be auto, cpu or cuda, not {cfg.device!r}")
    if cfg.encoder_backend not in ENCODER_BACKENDS:
        raise ConfigError(
            f"encoder_backend must be one of {', '.join(ENCODER_BACKENDS)}, "
            f"not {cfg.encoder_backend!r}"
        )
    for name in ("k", "max_new_tokens", "chunk_tokens"):
        if int(getattr(cfg, name)) < 1:
            raise ConfigError(f"{name} must be >= 1, not {getattr(cfg, name)!r}")
    if cfg.overlap < 0 or cfg.overlap >= cfg.chunk_tokens:
        raise ConfigError(
            f"overlap must be in [0, chunk_tokens={cfg.chunk_tokens}), not {cfg.overlap}"
        )
    if cfg.max_batch < 1:
        raise ConfigError(f"max_batch must be at least 1, not {cfg.max_batch}")
    if cfg.fusion not in ("rrf", "convex"):
        raise ConfigError(f"fusion must be rrf or convex, not {cfg.fusion!r}")
    if not 0 <= cfg.alpha <= 1:
        raise ConfigError(f"alpha must be in [0, 1], not {cfg.alpha}")
    if cfg.dtype not in DTYPES:
        raise ConfigError(f"dtype must be one of {', '.join(DTYPES)}, not {cfg.dtype!r}")
    if cfg.profile not in ("auto", *PROFILES):
        raise ConfigError(f"profile must be auto, {', '.join(PROFILES)}, not {cfg.profile!r}")
    t = cfg.refusal_threshold
    if t is not None and not 0 < t <= 1:
        raise ConfigError(f"refusal_threshold must be in (0, 1] or none, not {t}")
    if cfg.temperature < 0:
        raise ConfigError(f"temperature must be >= 0, not {cfg.temperature}")
    if not 0 < cfg.top_p <= 1:
        raise ConfigError(f"top_p must be in (0, 1], not {cfg.top_p}")


def _field_types() -> dict[str, str]:
    return {f.name: str(f.type) for f in fields(RAGConfig) if f.name != "rewrite_query"}


def _coerce(name: str, value: Any, source: str) -> Any:
    """Check a TOML value against the field's annotated type (TOML has no null: use "none")."""
    typ = _field_types()[name]
    if isinstance(value, str) and value.lower() == "none" and "None" in typ:
        return None
    ok = {
        "int": lambda v: isinstance(v, int) and not isinstance(v, bool),
        "float": lambda v: isinstance(v, int | float) and not isinstance(v, bool),
        "str": lambda v: isinstance(v, str),
        "bool": lambda v: isinstance(v, bool),
    }
    base = typ.replace(" | None", "")
    if not ok[base](value):
        raise ConfigError(f"{source}: {name} must be {base}, not {value!r}")
    return float(value) if base == "float" else value


def read_toml(path: str | Path) -> dict[str, Any]:
    """Field values from a TOML file (top level or ``[rag]``); unknown keys are an error."""
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise ConfigError(f"cannot read config file {path}: {e.strerror or e}") from e
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path}: invalid TOML: {e}") from e
    if isinstance(data.get("rag"), dict):
        extra = sorted(k for k in data if k != "rag")
        if extra:
            raise ConfigError(f"{path}: unknown key {extra[0]!r} beside the [rag] table")
        data = data["rag"]
    known = _field_types()
    out: dict[str, Any] = {}
    for key, value in data.items():
        name = key.replace("-", "_")
        if name not in known:
            raise ConfigError(f"{path}: unknown key {key!r} (known: {', '.join(sorted(known))})")
        out[name] = _coerce(name, value, str(path))
    return out


def load_config(
    path: str | Path | None = None, overrides: dict[str, Any] | None = None
) -> RAGConfig:
    """Defaults ← ``path`` (or ``./rag.toml`` when present) ← ``overrides`` (None values skipped).

    An explicit ``path`` that does not exist is an error; a missing ``./rag.toml`` is not.
    """
    values: dict[str, Any] = {}
    if path is not None:
        if not Path(path).is_file():
            raise ConfigError(f"--config {path}: no such file")
        values.update(read_toml(path))
    elif Path(DEFAULT_CONFIG_FILE).is_file():
        values.update(read_toml(DEFAULT_CONFIG_FILE))
    known = set(_field_types()) | {"rewrite_query"}
    for key, value in (overrides or {}).items():
        name = key.replace("-", "_")
        if name not in known:
            raise ConfigError(f"unknown config override {key!r}")
        if value is not None:
            values[name] = value
    return RAGConfig(**values)


def add_config_args(parser: argparse.ArgumentParser, names: Sequence[str] | None = None) -> None:
    """Add ``--kebab-case`` flags for config fields (default None = "not given", so the TOML
    value or the dataclass default stays in force)."""
    help_text = {
        "index": "index name or folder",
        "encoder": "query encoder alias/folder (default: the index's own)",
        "decoder": f"decoder alias or folder (default {DEFAULT_DECODER})",
        "adapter": "LoRA adapter: auto (<decoder>-lora when trained) | none | folder/name",
        "backend": "faiss | chroma",
        "chroma_url": "Chroma server URL",
        "mode": "dense | bm25 | hybrid",
        "device": "auto | cpu | cuda",
        "encoder_backend": "query encoder runtime: torch | onnx (CPU)",
        "dtype": "decoder weights: auto (bfloat16 on CUDA or a CPU with bf16 units) | float32 | bfloat16",
        "profile": "prompt profile: auto (the decoder's measured best) | plain | fewshot",
        "refusal_threshold": "refuse only when p(refusal) >= this (0-1], else answer; unset = "
        "the decoder's own choice (rag.refusal)",
    }
    for name, typ in _field_types().items():
        if names is not None and name not in names:
            continue
        flag = "--" + name.replace("_", "-")
        if typ == "bool":
            parser.add_argument(
                flag, dest=name, default=None, action=argparse.BooleanOptionalAction
            )
            continue
        conv = {"int": int, "float": float}.get(typ.replace(" | None", ""), str)
        parser.add_argument(flag, dest=name, type=conv, default=None, help=help_text.get(name))


def config_from_args(args: argparse.Namespace, config_path: str | Path | None = None) -> RAGConfig:
    """RAGConfig from parsed flags over the TOML file (see :func:`load_config`)."""
    overrides = {n: getattr(args, n) for n in _field_types() if hasattr(args, n)}
    return load_config(config_path, overrides)


def with_overrides(cfg: RAGConfig, **kwargs: Any) -> RAGConfig:
    """A copy of ``cfg`` with the non-None ``kwargs`` applied (validated)."""
    return replace(cfg, **{k: v for k, v in kwargs.items() if v is not None})
