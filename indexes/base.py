"""The one vector-index interface every backend implements (FAISS, Chroma).

Vectors are L2-normalised float32 rows; scores are inner products (cosine), best first. Ids are
the chunk ids chosen by ingest, so every backend is addressed by the same strings.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Collection, Iterable
from pathlib import Path
from typing import Any, ClassVar

import numpy as np


class VectorIndexError(RuntimeError):
    """A vector index that cannot be opened or used; the message names the path or URL."""


class VectorIndex(ABC):
    """add / delete by id / search / count / commit. ``add`` with an existing id replaces it
    (upsert), ``delete`` ignores unknown ids, so re-running an interrupted ingest is harmless.

    An index also owns its storage within an ingest generation (``rag.storage.manifest``): where the
    vectors of a generation live (:meth:`open_for_generation`, :meth:`load_generation`), how one
    run's changes are written without disturbing the live generation (:meth:`stage_changes`),
    and what is cleaned once a generation is published (:meth:`reconcile`). The defaults here
    describe a backend with one store per generation; a backend whose one store serves every
    generation (``shared_store``) overrides them.
    """

    dim: int
    #: One store for every generation (Chroma), rather than a copy inside each (FAISS). Such a
    #: store may hold ids a crashed run added that no published manifest names, so searches
    #: must filter hits by the generation's chunks.
    shared_store: ClassVar[bool] = False

    # ------------------------------------------------------------------ generations

    @classmethod
    @abstractmethod
    def open_for_generation(
        cls, root: Path, live: Path | None, staging: Path, dim: int, **options: Any
    ) -> VectorIndex:
        """The index the generation being built in ``staging`` will hold, starting from the
        ``live`` generation's (None: a new index). ``root`` is the index folder. Options a
        backend does not use are ignored, so a caller passes one set for every backend."""

    @classmethod
    @abstractmethod
    def load_generation(cls, root: Path, gen: Path, dim: int, **options: Any) -> VectorIndex:
        """The index of the published generation ``gen``, for search (same ``options`` rule)."""

    @classmethod
    @abstractmethod
    def scratch(cls, dim: int) -> VectorIndex:
        """An empty index whose storage, if any, goes with the object (in-memory evals)."""

    def missing(self, ids: Iterable[str]) -> set[str]:
        """Which of ``ids`` (the live manifest's chunks) the store lacks and must be re-embedded.
        A generation's own store is complete by construction: none."""
        return set()

    def stage_changes(
        self,
        dropped: Iterable[str],
        ids: list[str],
        vectors: np.ndarray,
        metadatas: list[dict] | None = None,
    ) -> None:
        """Write one run's changes (``dropped`` ids go, ``ids`` are upserted) so the staged
        generation holds them, leaving the live generation loadable until publication. Here
        the store is the staged generation's own copy: change it and commit."""
        self.delete(sorted(dropped))
        self.add(ids, vectors, metadatas)
        self.commit()

    def reconcile(self, keep_ids: Iterable[str]) -> None:  # noqa: B027
        """Called after each run, once its generation is live: drop what the store holds
        beyond ``keep_ids``, the ids of every generation a reader may still search (the live
        one and the one before it, ``rag.storage.manifest``). A generation's own store holds nothing
        else."""
        return None

    @abstractmethod
    def add(self, ids: list[str], vectors: np.ndarray, metadatas: list[dict] | None = None) -> None:
        """Insert or replace ``ids`` with ``vectors`` (float32, shape (n, dim))."""

    @abstractmethod
    def delete(self, ids: list[str]) -> None:
        """Remove ``ids``; unknown ids are ignored."""

    @abstractmethod
    def search(
        self, queries: np.ndarray, k: int, ids: Collection[str] | None = None
    ) -> list[list[tuple[str, float]]]:
        """For each query row, up to ``k`` (id, inner product) pairs, best first. ``ids``: search
        only these (a filter pushed into the search, so ``k`` hits come from them whenever they
        hold ``k``); unknown ids are ignored, an empty collection finds nothing."""

    @abstractmethod
    def count(self) -> int:
        """Number of vectors stored."""

    @abstractmethod
    def ids(self) -> list[str]:
        """Every stored id (order unspecified)."""

    @abstractmethod
    def vectors(self, ids: list[str]) -> np.ndarray:
        """The stored vectors of ``ids``, shape (len(ids), dim), in the order given; KeyError
        naming the first unknown id."""

    @abstractmethod
    def commit(self) -> None:
        """Make every change so far durable in one atomic step."""

    def close(self) -> None:  # noqa: B027
        """Release files, clients and memory; the default does nothing."""
        return None

    def location(self) -> str:
        """Where the vectors live (a file, a collection), for messages that must name it."""
        return type(self).__name__

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
