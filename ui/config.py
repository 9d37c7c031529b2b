"""The chat app's settings (:class:`AppConfig`) and its command line.

Why ``AppConfig`` holds a :class:`rag.RAGConfig` instead of its own copies of the answer
settings: the app answers through the same pipeline as ``rag.ask``, so the index, the device and
the retrieval, answer and generation sections are RAGConfig's, with RAGConfig's validation (a bad
``--k`` is refused at start-up, not at the first question). The UI only changes two defaults
(:data:`UI_DEFAULTS`).

Its flags are built by the project's one builder: :func:`rag.add_config_args` gives a flag for
every setting of every section (the same names, help and value sets as rag.ask), except those in
:data:`EXCLUDED`, each with the reason the app cannot take it; the app's own fields get theirs
from :mod:`rag.cli.flags`. The UI reads no ``rag.toml`` (it never has): :func:`app_config` builds
the RAGConfig from the flags given over :data:`UI_DEFAULTS` with :func:`rag.build_config`, not
with ``rag.config.config_from_args``, which would read ``./rag.toml`` when one is present.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field, fields
from typing import Any

from rag import RAGConfig, add_config_args, build_config
from rag.cli import OneLineParser
from rag.cli.flags import add_dataclass_args
from ui.uploads import DEFAULT_MAX_UPLOAD_BYTES

PROG = "python -m ui.app"
# Where the app's starting values differ from rag.ask's: the index `make demo` builds, and
# shorter answers for a chat (the slider goes up to 512).
UI_DEFAULTS: dict[str, Any] = {"index": "docs", "max_new_tokens": 128}
# Settings with no start-up flag here, setting -> why. None: every setting of every section is
# a flag (the settings panel starts from the answer settings; the rest hold for the process).
EXCLUDED: dict[str, str] = {}
# --help text where the app's meaning differs from rag.ask's
FLAG_HELP = {
    "index": "index name under $RAG_HOME/indexes shown first",
    "adapter": "LoRA adapter: auto (<decoder>-span-lora, the reader-first adapter, when "
    "`make models` trained it; else none), none (the base model alone) or a folder/name",
    "k": "passages per question",
    "rerank": "cross-encoder reranking the retrieved candidates: auto = minilm-rerank when "
    "`make models` trained it (else off); none = off; or a folder/artefact name",
    "max_new_tokens": "answer length limit in tokens",
}


def default_rag() -> RAGConfig:
    return build_config(UI_DEFAULTS)


@dataclass
class AppConfig:
    """How the app is served, and the RAGConfig its answers start from."""

    rag: RAGConfig = field(default_factory=default_rag)  # answer settings (flags: all but EXCLUDED)
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
        """An AppConfig from flat settings, as the flags name them: the app's own fields stay
        here, every other name is a RAGConfig setting (``k``, ``decoder``: routed to its section
        by :func:`rag.build_config`, over :data:`UI_DEFAULTS`; an unknown one is an error)."""
        own = own_fields()
        rag = {k: v for k, v in settings.items() if k not in own}
        return cls(
            rag=build_config({**UI_DEFAULTS, **rag}),
            **{k: settings[k] for k in own & set(settings)},
        )


def own_fields() -> set[str]:
    """The app's own settings (not RAGConfig's)."""
    return {f.name for f in fields(AppConfig) if f.name != "rag"}


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog=PROG, description="Gradio chat UI over an index (see docs/ui.md).")
    add_config_args(parser, EXCLUDED, defaults=UI_DEFAULTS, help=FLAG_HELP)
    add_dataclass_args(parser, AppConfig, exclude=("rag",))
    return parser


def app_config(args: argparse.Namespace) -> AppConfig:
    """The AppConfig parsed flags ask for; a bad value raises :class:`rag.ConfigError`.
    The settings flags are layered (a flag not given is not in ``args``): those given go over
    :data:`UI_DEFAULTS`, no rag.toml in between (module docstring)."""
    own = own_fields()
    given = {k: v for k, v in vars(args).items() if k not in own}
    return AppConfig(
        rag=build_config({**UI_DEFAULTS, **given}), **{k: getattr(args, k) for k in own}
    )


def parse_args(argv: list[str] | None = None) -> AppConfig:
    """The AppConfig the command line asks for (a bad flag exits 2 with one line, rag.cli)."""
    return app_config(build_parser().parse_args(argv))
