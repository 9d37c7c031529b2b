"""Process-wide model state for the UI: pipelines are built once and shared by every session.

A pipeline (retriever + encoder + decoder) costs seconds and hundreds of MB to load, so the app
keeps the most recently used ones in a small LRU keyed by (index, encoder, decoder, adapter,
reranker, rerank depth): the reranker is loaded with the retriever. Sessions only differ in
per-request settings (mode, k, temperature, max new tokens), which are passed to each call.
After an upload the pipeline needs no reload: its Retriever re-reads the index when ingest
publishes a new generation.

Also here: the listings behind the settings dropdowns, and the name check that keeps the index
setting a *name* under ``$RAG_HOME/indexes`` (never a path typed by a user).
"""

from __future__ import annotations

import json
import logging
import threading
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rag.config import RAGConfig
from rag.models import DECODER_ALIASES, ENCODER_ALIASES, list_artifacts
from rag.paths import IndexNameError, indexes_dir, models_dir
from rag.paths import check_index_name as check_name
from rag.retrieval.rerank import is_cross_encoder

log = logging.getLogger("ui")

INDEX_DEFAULT_ENCODER = (
    "(index default)"  # encoder choice meaning "the one the index was built with"
)
NO_ADAPTER = "(none)"
NO_RERANKER = "(off)"  # reranker choice meaning "no rerank stage"

PipelineFactory = Callable[[RAGConfig], Any]


class SettingError(ValueError):
    """A setting value the app refuses; the message is shown to the user as is."""


def check_index_name(name: str) -> str:
    """``name`` when it is a plain index name, else SettingError: the one rule of
    :func:`rag.paths.check_index_name`, shown to the user without the CLI's --index-dir hint."""
    try:
        return check_name((name or "").strip(), hint="no paths")
    except IndexNameError as e:
        raise SettingError(str(e)) from None


def list_indexes() -> list[str]:
    """Index folders under ``$RAG_HOME/indexes``."""
    root = indexes_dir()
    if not root.is_dir():
        return []
    return sorted(p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))


def _is_decoder(folder: Path) -> bool:
    try:
        cfg = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError):
        return False
    return any("CausalLM" in a for a in cfg.get("architectures") or [])


def list_models() -> dict[str, list[str]]:
    """Choices for the model dropdowns: baselines plus artefacts under ``$RAG_HOME/models``,
    split into encoders, decoders (a CausalLM architecture), LoRA adapters and rerankers
    (cross-encoders: as an encoder one would embed at random, so they are only rerankers)."""
    enc, dec, ada = [INDEX_DEFAULT_ENCODER, *ENCODER_ALIASES], [*DECODER_ALIASES], [NO_ADAPTER]
    rer = [NO_RERANKER]
    for name in list_artifacts():
        folder = models_dir() / name
        if (folder / "adapter_config.json").exists():
            ada.append(name)
        elif _is_decoder(folder):
            dec.append(name)
        elif is_cross_encoder(folder):
            rer.append(name)
        elif name not in DECODER_ALIASES:
            enc.append(name)
    return {"encoders": enc, "decoders": dec, "adapters": ada, "rerankers": rer}


def check_choice(value: str, choices: list[str], what: str) -> str:
    if value not in choices:
        raise SettingError(f"unknown {what} {value!r} (have: {', '.join(choices)})")
    return value


class PipelineCache:
    """LRU of built pipelines; :meth:`get` builds under a lock so one load serves all sessions."""

    def __init__(self, base: RAGConfig, factory: PipelineFactory, size: int = 2):
        self.base = base
        self.factory = factory
        self.size = size
        self._items: OrderedDict[tuple, Any] = OrderedDict()
        self._lock = threading.Lock()

    def config_for(
        self,
        index: str,
        encoder: str | None,
        decoder: str,
        adapter: str | None,
        rerank: str | None,
        rerank_depth: int,
    ) -> RAGConfig:
        """The base config with this pipeline's models (the arguments of :meth:`get`, resolved).
        ``rerank`` is a resolved name or None (off), never ``auto``."""
        from dataclasses import replace

        return replace(
            self.base,
            index=index,
            encoder=encoder,
            decoder=decoder,
            adapter=adapter,
            rerank=rerank,
            rerank_depth=rerank_depth,
        )

    def get(
        self,
        index: str,
        encoder: str | None,
        decoder: str,
        adapter: str | None,
        rerank: str | None = None,
        rerank_depth: int | None = None,
    ) -> Any:
        """The pipeline for these models, built on first use. ``rerank`` None = no reranker;
        ``rerank_depth`` None = the base config's."""
        depth = self.base.rerank_depth if rerank_depth is None else int(rerank_depth)
        key = (index, encoder, decoder, adapter, rerank, depth)
        with self._lock:
            if key in self._items:
                self._items.move_to_end(key)
                return self._items[key]
            log.info(
                "loading pipeline index=%s encoder=%s decoder=%s adapter=%s reranker=%s "
                "rerank_depth=%s",
                *key,
            )
            pipe = self.factory(self.config_for(*key))
            self._items[key] = pipe
            while len(self._items) > self.size:
                self._items.popitem(last=False)
            return pipe

    def __len__(self) -> int:
        return len(self._items)
