"""The documents routes of :mod:`rag.serve`: ``GET /v1/documents`` lists an index's documents,
``DELETE /v1/documents/{path}`` removes one (or every one under a folder) and publishes the
index without it, through the library's one implementation (:mod:`rag.ingest.manage`).

The index is chosen as for chat: the query parameter ``model`` (``rag:<index>``, default
``rag``, the server's ``--index``). Like every ``/v1`` route they need the server's API key when
it has one (:class:`rag.serve.http.Guard`). Paths are relative to the ingested folder; the
absolute path on the server is never sent, nor taken (docs/security.md). Every path is checked
by the one check the CLI, MCP and the UI share (:func:`rag.ingest.manage.check_document_path`)
before the index is opened: an absolute path (``/x``, ``%5Ctmp%5Cx``), the whole index (``%5C``,
``.``) or ``..`` is the same 404 as a path naming no document, so nothing about the server's
folders can be told from the answer. A path is resolved as ``rag.docs`` resolves it
(:func:`rag.ingest.manage.resolve_documents`: a name one document had while another folder held
one of the same relative path still names it; one several had is a 404 naming them). A path
naming no document is a 404 and nothing changes; a
removal that would leave the index without documents is a 400 (never done over HTTP: the
server's operator empties an index with ``rag.docs remove --all``); a removal while an ingest
holds the index is a 409 (retry).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import anyio
from fastapi import FastAPI

from rag.ingest.manage import (
    AmbiguousDocumentError,
    DocumentNotFoundError,
    DocumentPathError,
    WouldEmptyIndexError,
    check_document_path,
    list_documents,
    remove_documents,
)
from rag.serve.api import MODEL_PREFIX, ApiError
from rag.storage.manifest import IndexNotFoundError


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
        try:
            check_document_path(path)  # absolute, backslash-absolute, the whole index, '..'
        except DocumentPathError:
            raise unknown from None
        try:
            report = await anyio.to_thread.run_sync(remove_documents, index, [path])
        except IndexNotFoundError:
            raise not_ingested(index) from None
        except AmbiguousDocumentError as e:  # an earlier name of several: say which they are
            raise ApiError(
                404,
                f"{MODEL_PREFIX}{index} has no document {path!r}; it was the name of more than "
                f"one: {', '.join(repr(c) for c in e.candidates)}; nothing was removed",
                param="path",
                code="document_not_found",
            ) from None
        except (DocumentNotFoundError, DocumentPathError):
            raise unknown from None
        except WouldEmptyIndexError:
            raise ApiError(
                400,
                f"removing {path!r} would remove every document of {MODEL_PREFIX}{index}; "
                "nothing was removed (an index is not emptied over HTTP)",
                param="path",
                code="would_empty_index",
            ) from None
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
