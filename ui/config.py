"""The chat app's settings (:class:`AppConfig`) and its command line.

Why ``AppConfig`` holds a :class:`rag.config.RAGConfig` instead of its own copies of the answer
settings: the app answers through the same pipeline as ``rag.ask``, so the index, models, mode,
k, temperature, answer length and device are RAGConfig's fields with RAGConfig's validation
(a bad ``--k`` is refused at start-up, not at the first question). The UI only changes two
defaults (:data:`UI_DEFAULTS`). Its flags are built by the project's one builder
(:mod:`rag.dataclass_cli`) from both dataclasses, so names, help and value sets match rag.ask.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field, fields
from typing import Any

from rag.cli import OneLineParser
from rag.config import RAGConfig
from rag.dataclass_cli import add_dataclass_args, config_from_args
from ui.uploads import DEFAULT_MAX_UPLOAD_BYTES

PROG = "python -m ui.app"
# The RAGConfig settings the app exposes as flags (and as starting values of its settings panel).
RAG_FLAGS = (
    "index", "encoder", "decoder", "adapter", "mode", "k", "rerank", "rerank_depth",
    "rerank_weight", "rerank_precision", "temperature", "max_new_tokens", "device", "reader",
    "compose",
    "evidence_tokens",
    "evidence_passages",
    "engine",
)  # fmt: skip
# Where the app's starting values differ from rag.ask's: the index `make demo` builds, and
# shorter answers for a chat (the slider goes up to 512).
UI_DEFAULTS: dict[str, Any] = {"index": "docs", "max_new_tokens": 128}


def default_rag() -> RAGConfig:
    return RAGConfig(**UI_DEFAULTS)


@dataclass
class AppConfig:
    """How the app is served, and the RAGConfig its answers start from."""

    rag: RAGConfig = field(default_factory=default_rag)  # answer settings (RAG_FLAGS are flags)
    host: str = "127.0.0.1"  # bind address; loopback unless told otherwise
    port: int = 7860  # TCP port (0 = any free port)
    max_upload_mb: float = DEFAULT_MAX_UPLOAD_BYTES / 2**20  # per-file upload limit in MiB
    concurrency: int = (
        16  # chat requests in flight at once (the batched decoder steps them together)
    )
    queue_size: int = 64  # requests waiting beyond that; more are refused with a message
    preload: bool = True  # load the starting pipeline before serving (fail fast)

    @property
    def max_upload_bytes(self) -> int:
        return int(self.max_upload_mb * 2**20)

    @classmethod
    def of(cls, **settings: Any) -> AppConfig:
        """An AppConfig from flat settings, as the flags name them: RAGConfig fields go to
        ``rag`` (over :data:`UI_DEFAULTS`), the rest are the app's own."""
        rag_names = {f.name for f in fields(RAGConfig)}
        rag = {k: v for k, v in settings.items() if k in rag_names}
        own = {k: v for k, v in settings.items() if k not in rag_names}
        return cls(rag=RAGConfig(**{**UI_DEFAULTS, **rag}), **own)


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog=PROG, description="Gradio chat UI over an index (see docs/ui.md).")
    add_dataclass_args(
        parser,
        RAGConfig,
        only=RAG_FLAGS,
        defaults=UI_DEFAULTS,
        help={
            "index": "index name under $RAG_HOME/indexes shown first",
            "encoder": "query encoder alias/folder; none = the one the index was built with",
            "adapter": "LoRA adapter: auto (<decoder>-span-lora, the reader-first adapter, when "
            "`make models` trained it; else none), none (the base model alone) or a folder/name",
            "k": "passages per question",
            "rerank": "cross-encoder reranking the retrieved candidates: auto = minilm-rerank "
            "when `make models` trained it (else off); none = off; or a folder/artefact name",
            "max_new_tokens": "answer length limit in tokens",
        },
    )
    add_dataclass_args(parser, AppConfig, exclude=("rag",))
    return parser


def app_config(args: argparse.Namespace) -> AppConfig:
    """The AppConfig parsed flags ask for; a bad value raises :class:`rag.config.ConfigError`."""
    rag = config_from_args(RAGConfig, args, UI_DEFAULTS)
    own = {f.name: getattr(args, f.name) for f in fields(AppConfig) if f.name != "rag"}
    return AppConfig(rag=rag, **own)


def parse_args(argv: list[str] | None = None) -> AppConfig:
    """The AppConfig the command line asks for (a bad flag exits 2 with one line, rag.cli)."""
    return app_config(build_parser().parse_args(argv))
