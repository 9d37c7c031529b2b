"""The chat app's settings (:class:`AppConfig`) and its command line, one flag per field."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, fields

from rag.models import DEFAULT_ADAPTER, DEFAULT_DECODER
from ui.uploads import DEFAULT_MAX_UPLOAD_BYTES


@dataclass
class AppConfig:
    """How the app is served and its starting settings (each field is a ``--kebab-case`` flag)."""

    index: str = "docs"  # index name under $RAG_HOME/indexes shown first
    host: str = "127.0.0.1"  # bind address; loopback unless told otherwise
    port: int = 7860  # TCP port (0 = any free port)
    encoder: str | None = None  # query encoder; None = the one the index was built with
    decoder: str = DEFAULT_DECODER  # answer decoder alias or artefact name
    # LoRA adapter: none (measured default), auto = <decoder>-lora when trained, or an artefact
    adapter: str | None = DEFAULT_ADAPTER
    mode: str = "hybrid"  # retrieval mode: dense | bm25 | hybrid
    k: int = 5  # passages retrieved per question
    temperature: float = 0.0  # 0 = greedy
    max_new_tokens: int = 128  # answer length limit
    device: str = "auto"  # auto | cpu | cuda
    max_upload_mb: float = DEFAULT_MAX_UPLOAD_BYTES / 2**20  # per-file upload limit (MiB)
    concurrency: int = 4  # chat requests processed at once (decoding itself is serialised)
    queue_size: int = 64  # requests waiting beyond that; more are refused with a message
    preload: bool = True  # load the starting pipeline before serving (fail fast)

    @property
    def max_upload_bytes(self) -> int:
        return int(self.max_upload_mb * 2**20)


HELP = {
    "index": "index name under $RAG_HOME/indexes (default docs)",
    "host": "bind address (default 127.0.0.1: loopback only)",
    "port": "TCP port (default 7860)",
    "encoder": "query encoder alias/folder (default: the index's own)",
    "decoder": f"decoder alias/folder (default {DEFAULT_DECODER})",
    "adapter": "LoRA adapter: auto (<decoder>-lora when trained) | none | folder/name",
    "mode": "retrieval mode: dense | bm25 | hybrid",
    "k": "passages per question",
    "temperature": "0 = greedy decoding",
    "max_new_tokens": "answer length limit in tokens",
    "device": "auto | cpu | cuda",
    "max_upload_mb": "per-file upload limit in MiB",
    "concurrency": "chat requests processed at once",
    "queue_size": "requests allowed to wait in the queue",
    "preload": "load the models before serving (fail fast)",
}


def parse_args(argv: list[str] | None = None) -> AppConfig:
    parser = argparse.ArgumentParser(
        prog="python -m ui.app", description="Gradio chat UI over an index (see docs/ui.md)."
    )
    defaults = AppConfig()
    for f in fields(AppConfig):
        flag = "--" + f.name.replace("_", "-")
        default = getattr(defaults, f.name)
        if isinstance(default, bool):
            parser.add_argument(
                flag,
                dest=f.name,
                default=default,
                action=argparse.BooleanOptionalAction,
                help=HELP.get(f.name),
            )
        else:
            conv = {int: int, float: float}.get(type(default), str)
            parser.add_argument(
                flag, dest=f.name, type=conv, default=default, help=HELP.get(f.name)
            )
    return AppConfig(**vars(parser.parse_args(argv)))
