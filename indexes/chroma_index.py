"""Chroma backend: embedded (``PersistentClient``) by default, a server (``HttpClient``) when a
URL is given. Chroma persists every write itself, so ``commit`` has nothing to do; ingest keeps
its own manifest as the source of truth and reconciles the collection with it on every run.

We always hand Chroma our vectors (``embedding_function=None``): Chroma's default embedding
function would download a model, and the index must use the encoder the manifest records.
"""

from __future__ import annotations

import tempfile
from collections.abc import Collection, Iterable
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import numpy as np

from indexes.base import VectorIndex, VectorIndexError

DEFAULT_COLLECTION = "rag"
STORE_DIR = "chroma"  # INDEX/chroma/: the embedded store every generation shares


def _settings():
    from chromadb.config import Settings

    return Settings(anonymized_telemetry=False, allow_reset=False)


def make_client(path: str | Path | None, chroma_url: str | None):
    """An HttpClient for ``chroma_url`` (``http://host:port``), else a PersistentClient at ``path``."""
    import chromadb

    if chroma_url:
        url = urlparse(chroma_url if "://" in chroma_url else f"http://{chroma_url}")
        if not url.hostname:
            raise VectorIndexError(
                f"--chroma-url {chroma_url!r} is not a URL like http://127.0.0.1:8000"
            )
        try:
            client = chromadb.HttpClient(
                host=url.hostname,
                port=url.port or 8000,
                ssl=url.scheme == "https",
                settings=_settings(),
            )
            client.heartbeat()
        except Exception as e:  # chromadb raises several transport error types
            raise VectorIndexError(
                f"cannot reach the Chroma server at {chroma_url} ({e})"
            ) from None
        return client
    if path is None:
        raise VectorIndexError("an embedded Chroma index needs a folder path")
    Path(path).mkdir(parents=True, exist_ok=True)
    return chromadb.PersistentClient(path=str(path), settings=_settings())


def _clean_meta(m: dict | None) -> dict | None:
    """Chroma accepts only str/int/float/bool values and no empty dicts."""
    if not m:
        return None
    out = {}
    for key, value in m.items():
        if isinstance(value, (str, int, float, bool)):
            out[key] = value
        elif isinstance(value, (list, tuple)):
            out[key] = " > ".join(map(str, value))
        elif value is not None:
            out[key] = str(value)
    return out or None


class ChromaIndex(VectorIndex):
    """One Chroma collection with inner-product space; scores are ``1 - distance``.

    Every generation of an ingested index shares the collection (``shared_store``): a run
    upserts its new chunks before publishing and deletes only afterwards (:meth:`reconcile`)
    what neither the live generation nor the one before it names, so the live generation always
    finds its ids, and so does a reader (another replica) still searching the previous one.
    """

    shared_store = True
    _tmp: tempfile.TemporaryDirectory | None = None  # scratch(): removed with the object

    def __init__(
        self,
        path: str | Path | None,
        dim: int,
        chroma_url: str | None = None,
        collection: str = DEFAULT_COLLECTION,
    ):
        self.dim, self.path, self.chroma_url = int(dim), path, chroma_url
        self._client = make_client(path, chroma_url)
        self._col = self._client.get_or_create_collection(
            name=collection,
            embedding_function=None,
            configuration={"hnsw": {"space": "ip", "ef_search": 200, "ef_construction": 200}},
        )
        self._max_batch = max(1, int(self._client.get_max_batch_size()))

    # ------------------------------------------------------------------ generations

    @classmethod
    def _of_index(cls, root: Path, dim: int, options: dict[str, Any]) -> ChromaIndex:
        return cls(
            root / STORE_DIR,
            dim,
            chroma_url=options.get("chroma_url"),
            collection=options.get("collection", DEFAULT_COLLECTION),
        )

    @classmethod
    def open_for_generation(
        cls, root: Path, live: Path | None, staging: Path, dim: int, **options: Any
    ) -> ChromaIndex:
        """The index's shared collection (embedded under ``root`` or on ``chroma_url``)."""
        return cls._of_index(root, dim, options)

    @classmethod
    def load_generation(cls, root: Path, gen: Path, dim: int, **options: Any) -> ChromaIndex:
        return cls._of_index(root, dim, options)

    @classmethod
    def scratch(cls, dim: int) -> ChromaIndex:
        """An embedded collection in a temporary folder removed when the object goes."""
        tmp = tempfile.TemporaryDirectory(prefix="rag-chroma-")
        index = cls(Path(tmp.name), dim)
        index._tmp = tmp
        return index

    def missing(self, ids: Iterable[str]) -> set[str]:
        """Chunk ids the manifest names but the collection lacks (a crash or a lost server)."""
        return set(ids) - set(self.ids())

    def stage_changes(
        self,
        dropped: Iterable[str],
        ids: list[str],
        vectors: np.ndarray,
        metadatas: list[dict] | None = None,
    ) -> None:
        """Upsert only (harmless if repeated): deleting ``dropped`` now would take chunks from
        the generation still live; :meth:`reconcile` deletes them once no kept generation
        names them."""
        self.add(ids, vectors, metadatas)

    def reconcile(self, keep_ids: Iterable[str]) -> None:
        """Delete the ids no kept generation names: chunks dropped two publications ago, ids
        only a crashed run added."""
        self.delete(sorted(set(self.ids()) - set(keep_ids)))

    # ------------------------------------------------------------------ vectors

    def add(self, ids: list[str], vectors: np.ndarray, metadatas: list[dict] | None = None) -> None:
        vectors = self._check(ids, vectors)
        metas = [_clean_meta(m) for m in (metadatas or [None] * len(ids))]
        for s in range(0, len(ids), self._max_batch):
            e = s + self._max_batch
            batch_meta = metas[s:e]
            self._col.upsert(
                ids=ids[s:e],
                embeddings=vectors[s:e],
                metadatas=batch_meta if any(m is not None for m in batch_meta) else None,
            )

    def delete(self, ids: list[str]) -> None:
        for s in range(0, len(ids), self._max_batch):
            if ids[s : s + self._max_batch]:
                self._col.delete(ids=ids[s : s + self._max_batch])

    def search(
        self, queries: np.ndarray, k: int, ids: Collection[str] | None = None
    ) -> list[list[tuple[str, float]]]:
        """Top ``k`` by inner product; ``ids`` goes to Chroma's own pre-filter (the query's
        ``ids``, applied with its ``where`` before the nearest-neighbour search)."""
        queries = self._queries(queries)
        wanted = None if ids is None else sorted(set(ids))
        n = self.count() if wanted is None else len(wanted)
        if n == 0 or k <= 0:
            return [[] for _ in range(len(queries))]
        try:
            res = self._col.query(
                query_embeddings=queries, n_results=min(k, n), ids=wanted, include=["distances"]
            )
        except Exception:  # noqa: BLE001 - Chroma refuses an id filter naming an unknown id
            if wanted is None:
                raise
            wanted = self._known(wanted)
            if not wanted:
                return [[] for _ in range(len(queries))]
            res = self._col.query(
                query_embeddings=queries,
                n_results=min(k, len(wanted)),
                ids=wanted,
                include=["distances"],
            )
        return [
            [(i, 1.0 - float(d)) for i, d in zip(row_ids, row_d)]
            for row_ids, row_d in zip(res["ids"], res["distances"])
        ]

    def _known(self, ids: list[str]) -> list[str]:
        """Which of ``ids`` the collection holds (a manifest may name ids a lost server or a
        crash took away), fetched in pages of the client's batch size."""
        found: set[str] = set()
        for start in range(0, len(ids), self._max_batch):
            found.update(self._col.get(ids=ids[start : start + self._max_batch], include=[])["ids"])
        return [i for i in ids if i in found]

    def count(self) -> int:
        return int(self._col.count())

    def ids(self) -> list[str]:
        out, offset, page = [], 0, max(self._max_batch, 1000)
        while True:
            got = self._col.get(include=[], limit=page, offset=offset)["ids"]
            out.extend(got)
            if len(got) < page:
                return out
            offset += page

    def vectors(self, ids: list[str]) -> np.ndarray:
        """The stored vectors of ``ids`` in the order given (Chroma returns its own order),
        fetched in pages of the client's batch size."""
        found: dict[str, np.ndarray] = {}
        for start in range(0, len(ids), self._max_batch):
            got = self._col.get(ids=ids[start : start + self._max_batch], include=["embeddings"])
            found.update(zip(got["ids"], np.asarray(got["embeddings"], dtype=np.float32)))
        missing = [i for i in ids if i not in found]
        if missing:
            raise KeyError(f"{missing[0]!r} is not in this Chroma collection")
        return np.stack([found[i] for i in ids]) if ids else np.zeros((0, self.dim), np.float32)

    def commit(self) -> None:
        """Chroma has already persisted every write."""

    def close(self) -> None:
        self._col = None
        self._client = None
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None
