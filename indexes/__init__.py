"""Vector index backends behind one interface (:class:`indexes.base.VectorIndex`).

``open_index("faiss" | "chroma", path, dim, ...)`` is the only constructor callers need.
"""

from __future__ import annotations

from pathlib import Path

from indexes.base import VectorIndex, VectorIndexError

BACKENDS = ("faiss", "chroma")
DEFAULT_COLLECTION = "rag"

__all__ = ["BACKENDS", "VectorIndex", "VectorIndexError", "open_index"]


def open_index(
    backend: str,
    path: str | Path | None,
    dim: int,
    *,
    chroma_url: str | None = None,
    collection: str = DEFAULT_COLLECTION,
    **opts,
) -> VectorIndex:
    """Open (or create) an index. ``opts`` go to the backend (FAISS: ``kind``, ``gpu``, ...)."""
    if backend == "faiss":
        from indexes.faiss_index import FaissIndex

        return FaissIndex(path, dim, **opts)
    if backend == "chroma":
        from indexes.chroma_index import ChromaIndex

        return ChromaIndex(path, dim, chroma_url=chroma_url, collection=collection, **opts)
    raise VectorIndexError(
        f"unknown index backend {backend!r} (choose from: {', '.join(BACKENDS)})"
    )
