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

import logging
import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from rag.config import RAGConfig
from rag.models import list_models as available_models
from rag.paths import IndexNameError
from rag.paths import check_index_name as check_name

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


def list_models() -> dict[str, list[str]]:
    """Choices for the model dropdowns: :func:`rag.models.list_models` (baselines and artefacts
    by kind), each list led by its "the index's own" / "none" / "off" choice."""
    models = available_models()
    models["encoders"].insert(0, INDEX_DEFAULT_ENCODER)
    models["adapters"].insert(0, NO_ADAPTER)
    models["rerankers"].insert(0, NO_RERANKER)
    return models


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
