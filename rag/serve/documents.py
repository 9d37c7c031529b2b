"""The documents routes of :mod:`rag.serve`: ``GET /v1/documents`` lists an index's documents,
``DELETE /v1/documents/{path}`` removes one (or every one under a folder) and publishes the
index without it, through the library's one implementation (:mod:`rag.ingest.manage`).

The index is chosen as for chat: the query parameter ``model`` (``rag:<index>``, default
``rag``, the server's ``--index``). Like every ``/v1`` route they need the server's API key when
it has one (:class:`rag.serve.http.Guard`). Paths are relative to the ingested folder; the
absolute path on the server is never sent, nor taken (docs/security.md). A path naming no document is a
404 and nothing changes; a removal while an ingest holds the index is a 409 (retry).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import anyio
from fastapi import FastAPI

from rag.ingest.manage import DocumentNotFoundError, list_documents, remove_documents
from rag.manifest import IndexNotFoundError
from rag.serve.api import MODEL_PREFIX, ApiError


def not_ingested(index: str) -> ApiError:
    """The 404 for an index with no published generation (listed, then emptied meanwhile)."""
    return ApiError(
        404,
        f"index {index!r} has no published generation yet (ingest documents into it first)",
        param="model",
        code="index_not_found",
    )


def add_document_routes(app: FastAPI, index_for: Callable[[str], str]) -> None:
    """Add the two routes to ``app``; ``index_for(model)`` maps a model name to an index name
    (an :class:`ApiError` 404 for an unknown one)."""

    @app.get("/v1/documents")
    async def documents(model: str = "rag") -> dict[str, Any]:
        index = index_for(model)
        try:
            docs = await anyio.to_thread.run_sync(list_documents, index)
        except IndexNotFoundError:
            raise not_ingested(index) from None
        return {
            "object": "list",
            "model": MODEL_PREFIX + index,
            "generation": docs.generation,
            "data": [d.to_dict() for d in docs.documents],
        }

    @app.delete("/v1/documents/{path:path}")
    async def delete_document(path: str, model: str = "rag") -> dict[str, Any]:
        index = index_for(model)
        unknown = ApiError(
            404,
            f"{MODEL_PREFIX}{index} has no document {path!r} (nor any under it); nothing "
            "was removed (GET /v1/documents lists them)",
            param="path",
            code="document_not_found",
        )
        if path.startswith("/"):  # the manifest's absolute keys are the server's own business
            raise unknown
        try:
            report = await anyio.to_thread.run_sync(remove_documents, index, [path])
        except IndexNotFoundError:
            raise not_ingested(index) from None
        except DocumentNotFoundError:
            raise unknown from None
        except RuntimeError as e:  # the index's lock: an ingest or removal is running
            raise ApiError(409, str(e).split(": ", 1)[-1], code="index_busy") from None
        return {
            "object": "documents.deletion",
            "model": MODEL_PREFIX + index,
            "deleted": [d.to_dict() for d in report.removed],
            "chunks_removed": report.chunks_removed,
            "chunks": report.chunks,
            "generation": report.generation,
        }
