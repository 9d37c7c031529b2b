"""Ingest documents into a named index: load, chunk, embed, store; incremental and atomic.

The package, in the order a run uses it (each module imports only those before it):

- :mod:`rag.ingest.config`: :class:`IngestConfig`, its checks, the chunking a run applies, and
  :class:`IngestReport`;
- :mod:`rag.ingest.plan`: which files are new, changed, unchanged or removed, and their chunks;
- :mod:`rag.ingest.ray_engine`: ``--engine ray`` (chunking and embedding on a Ray cluster);
- :mod:`rag.ingest.apply`: embed, write the next generation, publish it (:func:`ingest`);
- :mod:`rag.ingest.manage`: an index's documents, listed and removed (a removal publishes its
  generation through ``apply``'s writer: :func:`list_documents`, :func:`remove_documents`);
- :mod:`rag.ingest.cli`: ``python -m rag.ingest`` (:func:`main`).

Which vector store a generation uses, and how, is :mod:`indexes`' business: nothing here names
a backend.
"""

from __future__ import annotations

from rag.ingest.apply import CRASH_ENV, ingest, ingest_config
from rag.ingest.cli import build_parser, main
from rag.ingest.config import IngestConfig, IngestReport, NoDocumentReadError
from rag.ingest.manage import (
    DocumentInfo,
    DocumentNotFoundError,
    IndexDocuments,
    RemovalReport,
    list_documents,
    remove_documents,
)

__all__ = [
    "CRASH_ENV",
    "DocumentInfo",
    "DocumentNotFoundError",
    "IndexDocuments",
    "IngestConfig",
    "IngestReport",
    "NoDocumentReadError",
    "RemovalReport",
    "build_parser",
    "ingest",
    "ingest_config",
    "list_documents",
    "main",
    "remove_documents",
]
