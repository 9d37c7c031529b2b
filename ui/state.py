"""Process-wide model state for the UI: pipelines are built once and shared by every session.

A pipeline (retriever + encoder + decoder) costs seconds and hundreds of MB to load, so the app
keeps the most recently used ones (:data:`PIPELINES_KEPT`) in the server's cache,
:class:`rag.Pipelines`, keyed by the whole config a pipeline is built from: the settings panel's
models (index, encoder, decoder, adapter, reranker, rerank depth) over the app's own config. The
per-request settings (mode, k, temperature, max new tokens, filter) are passed to each call and
never change the config, so they share one pipeline; pipelines whose models differ only in the
index or retrieval share their decoders (:func:`rag.decoder_sharing_factory`: with the 1.5B that
copies factoids' short answers, a set of decoders is about 6 GB). After an upload the pipeline needs no
reload: its Retriever re-reads the index when ingest publishes a new generation.

Also here: the listings behind the settings dropdowns, and the name check that keeps the index
setting a *name* under ``$RAG_HOME/indexes`` (never a path typed by a user).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rag import IndexNameError, RAGConfig
from rag import check_index_name as check_name
from rag import list_models as available_models

INDEX_DEFAULT_ENCODER = (
    "(index default)"  # encoder choice meaning "the one the index was built with"
)
NO_ADAPTER = "(none)"
NO_RERANKER = "(off)"  # reranker choice meaning "no rerank stage"
# Pipelines kept loaded (and decoder sets: a pipeline with another decoder, picked in the settings
# panel per request, loads its own)
PIPELINES_KEPT = 2

PipelineFactory = Callable[[RAGConfig], Any]


class SettingError(ValueError):
    """A setting value the app refuses; the message is shown to the user as is."""


def check_index_name(name: str) -> str:
    """``name`` when it is a plain index name, else SettingError: the one rule of
    :func:`rag.check_index_name`, shown to the user without the CLI's --index-dir hint."""
    try:
        return check_name((name or "").strip(), hint="no paths")
    except IndexNameError as e:
        raise SettingError(str(e)) from None


def list_models() -> dict[str, list[str]]:
    """Choices for the model dropdowns: :func:`rag.list_models` (baselines and artefacts by
    kind), each list led by its "the index's own" / "none" / "off" choice."""
    models = available_models()
    models["encoders"].insert(0, INDEX_DEFAULT_ENCODER)
    models["adapters"].insert(0, NO_ADAPTER)
    models["rerankers"].insert(0, NO_RERANKER)
    return models


def check_choice(value: str, choices: list[str], what: str) -> str:
    if value not in choices:
        raise SettingError(f"unknown {what} {value!r} (have: {', '.join(choices)})")
    return value
