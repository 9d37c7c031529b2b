"""Local retrieval-augmented generation: the package's public face.

::

    from rag import RAGPipeline, load_config

    pipeline = RAGPipeline(load_config())  # defaults <- ./rag.toml
    answer = pipeline.answer("how do I sort a list?")

Every name below is imported on first use (PEP 562), so ``import rag`` (and ``import rag.cli``,
which every command line starts with) loads neither torch nor a model: the pipeline
(:class:`RAGPipeline`, its :class:`RAGConfig` with the sections :class:`RetrievalSettings`,
:class:`AnswerSettings`, :class:`GenerationSettings`, and :func:`load_config`), what it returns
(:class:`Answer`, :class:`Citation`, :class:`Hit`, :class:`Chunk`), retrieval alone
(:class:`Retriever`, :class:`RetrievalSettings`), building an index (:func:`ingest_config` with an
:class:`IngestConfig`; the keyword form is :func:`rag.ingest.ingest`, whose name the
``rag.ingest`` package already takes here), an index's documents (:func:`list_documents`,
:func:`remove_documents`) and model names (:func:`resolve_model`).

A front end (the chat UI imports nothing else of rag but :mod:`rag.cli`) also finds here: a
config from flat setting names and its flags (:func:`build_config`, :func:`add_config_args`,
:class:`ConfigError`, :data:`MODES`), the model checks (:func:`check_models`,
:func:`resolve_models`, :func:`list_models`), a conversation's config (:func:`conversational`),
pipelines kept per config (:class:`Pipelines`) sharing their decoders
(:func:`decoder_sharing_factory`) and the serving process's set-up
(:func:`prepare_serving_process`), index names (:func:`list_indexes`, :func:`check_index_name`,
:class:`IndexNameError`, :func:`rag_home`), the file types ingest reads (:data:`SUPPORTED_SUFFIXES`,
:data:`HTML_SUFFIXES`, :data:`TEXT_SUFFIXES`), and the answer's markup: citation markers
(:data:`CITATION`, :data:`CITATION_RUN`, :func:`split_short_answer`, :func:`quotes_block`,
:class:`AnswerSpan`, a PDF passage's :func:`page_label`) and text
made inert (:func:`inert`, :func:`split_code`, :func:`close_fence`, :data:`FENCE_START`).

The library by room: ``rag.answer``, ``rag.cli``, ``rag.documents``, ``rag.evaluation``,
``rag.generate``, ``rag.ingest``, ``rag.models``, ``rag.retrieval``, ``rag.serve``,
``rag.storage`` (docs/architecture.md).
"""

from __future__ import annotations

import importlib
import os
from typing import TYPE_CHECKING, Any

# JAX, if any library imports it in this process, must not take 75% of a GPU's memory at its
# first op (its default): torch trains and decodes on that GPU (rag.retrieval.bm25, issue 44).
# A user who wants JAX's preallocation sets the variable to "true".
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

if TYPE_CHECKING:
    from rag.answer.markup import FENCE_START, close_fence, inert, split_code
    from rag.answer.prompt import CITATION, CITATION_RUN, quotes_block, split_short_answer
    from rag.answer.settings import AnswerSettings
    from rag.config import (
        ConfigError,
        RAGConfig,
        add_config_args,
        build_config,
        check_models,
        load_config,
        resolve_models,
    )
    from rag.defaults import MODES
    from rag.documents.walk import HTML_SUFFIXES, SUPPORTED_SUFFIXES, TEXT_SUFFIXES
    from rag.generate.load import prepare_serving_process
    from rag.generate.settings import GenerationSettings
    from rag.ingest.apply import ingest_config
    from rag.ingest.config import IngestConfig, IngestReport
    from rag.ingest.manage import list_documents, remove_documents
    from rag.models.registry import list_models, resolve_model
    from rag.pipeline import RAGPipeline, conversational
    from rag.retrieval.retriever import Retriever
    from rag.retrieval.settings import RetrievalSettings
    from rag.serve.state import Pipelines, decoder_sharing_factory
    from rag.storage.paths import IndexNameError, check_index_name, list_indexes, rag_home
    from rag.types import Answer, AnswerSpan, Chunk, Citation, Hit, page_label

# public name -> the module that defines it
_SOURCES = {
    "RAGPipeline": "rag.pipeline",
    "RAGConfig": "rag.config",
    "load_config": "rag.config",
    "Answer": "rag.types",
    "Chunk": "rag.types",
    "Citation": "rag.types",
    "Hit": "rag.types",
    "Retriever": "rag.retrieval.retriever",
    "RetrievalSettings": "rag.retrieval.settings",
    "AnswerSettings": "rag.answer.settings",
    "GenerationSettings": "rag.generate.settings",
    "IngestConfig": "rag.ingest.config",
    "IngestReport": "rag.ingest.config",
    "ingest_config": "rag.ingest.apply",
    "list_documents": "rag.ingest.manage",
    "remove_documents": "rag.ingest.manage",
    "resolve_model": "rag.models.registry",
    "build_config": "rag.config",
    "add_config_args": "rag.config",
    "check_models": "rag.config",
    "resolve_models": "rag.config",
    "ConfigError": "rag.config",
    "conversational": "rag.pipeline",
    "AnswerSpan": "rag.types",
    "MODES": "rag.defaults",
    "list_indexes": "rag.storage.paths",
    "check_index_name": "rag.storage.paths",
    "IndexNameError": "rag.storage.paths",
    "rag_home": "rag.storage.paths",
    "list_models": "rag.models.registry",
    "prepare_serving_process": "rag.generate.load",
    "Pipelines": "rag.serve.state",
    "decoder_sharing_factory": "rag.serve.state",
    "FENCE_START": "rag.answer.markup",
    "close_fence": "rag.answer.markup",
    "inert": "rag.answer.markup",
    "split_code": "rag.answer.markup",
    "CITATION": "rag.answer.prompt",
    "CITATION_RUN": "rag.answer.prompt",
    "split_short_answer": "rag.answer.prompt",
    "quotes_block": "rag.answer.prompt",
    "page_label": "rag.types",
    "HTML_SUFFIXES": "rag.documents.walk",
    "SUPPORTED_SUFFIXES": "rag.documents.walk",
    "TEXT_SUFFIXES": "rag.documents.walk",
}

__all__ = [
    "Answer",
    "AnswerSettings",
    "AnswerSpan",
    "CITATION",
    "CITATION_RUN",
    "Chunk",
    "Citation",
    "ConfigError",
    "FENCE_START",
    "GenerationSettings",
    "HTML_SUFFIXES",
    "Hit",
    "IndexNameError",
    "IngestConfig",
    "IngestReport",
    "MODES",
    "Pipelines",
    "RAGConfig",
    "RAGPipeline",
    "RetrievalSettings",
    "Retriever",
    "SUPPORTED_SUFFIXES",
    "TEXT_SUFFIXES",
    "add_config_args",
    "build_config",
    "check_index_name",
    "check_models",
    "close_fence",
    "decoder_sharing_factory",
    "conversational",
    "inert",
    "ingest_config",
    "list_documents",
    "list_indexes",
    "list_models",
    "load_config",
    "page_label",
    "prepare_serving_process",
    "quotes_block",
    "rag_home",
    "remove_documents",
    "resolve_model",
    "resolve_models",
    "split_code",
    "split_short_answer",
]


def __getattr__(name: str) -> Any:
    """A public name, imported from its module on first use; anything else is not here (so
    ``from rag import ask`` still finds the submodule)."""
    module = _SOURCES.get(name)
    if module is None:
        raise AttributeError(f"module 'rag' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
