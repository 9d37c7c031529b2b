"""The one vector-index interface every backend implements (FAISS, Chroma).

Vectors are L2-normalised float32 rows; scores are inner products (cosine), best first. Ids are
the chunk ids chosen by ingest, so every backend is addressed by the same strings.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import numpy as np


class VectorIndexError(RuntimeError):
    """A vector index that cannot be opened or used; the message names the path or URL."""


class VectorIndex(ABC):
    """add / delete by id / search / count / commit. ``add`` with an existing id replaces it
    (upsert), ``delete`` ignores unknown ids, so re-running an interrupted ingest is harmless."""

    dim: int

    @abstractmethod
    def add(self, ids: list[str], vectors: np.ndarray, metadatas: list[dict] | None = None) -> None:
        """Insert or replace ``ids`` with ``vectors`` (float32, shape (n, dim))."""

    @abstractmethod
    def delete(self, ids: list[str]) -> None:
        """Remove ``ids``; unknown ids are ignored."""

    @abstractmethod
    def search(self, queries: np.ndarray, k: int) -> list[list[tuple[str, float]]]:
        """For each query row, up to ``k`` (id, inner product) pairs, best first."""

    @abstractmethod
    def count(self) -> int:
        """Number of vectors stored."""

    @abstractmethod
    def ids(self) -> list[str]:
        """Every stored id (order unspecified)."""

    @abstractmethod
    def commit(self) -> None:
        """Make every change so far durable in one atomic step."""

    def close(self) -> None:  # noqa: B027
        """Release files, clients and memory; the default does nothing."""
        return None

    def __enter__(self) -> VectorIndex:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _check(self, ids: list[str], vectors: np.ndarray) -> np.ndarray:
        """Validate an ``add`` call and return the vectors as contiguous float32."""
        vectors = np.ascontiguousarray(vectors, dtype=np.float32)
        if vectors.ndim != 2 or vectors.shape[1] != self.dim:
            raise ValueError(f"vectors must have shape (n, {self.dim}), got {vectors.shape}")
        if len(ids) != len(vectors):
            raise ValueError(f"{len(ids)} ids but {len(vectors)} vectors")
        if len(set(ids)) != len(ids):
            raise ValueError("duplicate ids in one add() call")
        return vectors

    def _queries(self, queries: np.ndarray) -> np.ndarray:
        queries = np.ascontiguousarray(queries, dtype=np.float32)
        if queries.ndim == 1:
            queries = queries[None, :]
        if queries.shape[1] != self.dim:
            raise ValueError(f"queries must have {self.dim} columns, got {queries.shape[1]}")
        return queries
