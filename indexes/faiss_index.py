"""FAISS backend: exact inner product by default, HNSW for large sets, GPU when available.

Storage is one ``faiss.npz`` file per index folder holding the ids, the vectors, the metadata
and (for HNSW) the serialised graph. ``commit`` writes it aside and ``os.replace``s it, so the
file on disk is always either the old or the new index, never half of one.

Why not ``IndexIDMap2`` alone: FAISS ids are int64 and HNSW cannot delete, so we keep the string
ids and vectors ourselves and (re)build the FAISS structure lazily after a change. Rebuilding a
flat index is a memory copy; an HNSW rebuild happens only when the set changed since the last
search or commit.
"""

from __future__ import annotations

import io
import json
import os
import shutil
from pathlib import Path
from typing import Any

import faiss
import numpy as np

from indexes.base import VectorIndex, VectorIndexError

FILE = "faiss.npz"
GENERATION_DIR = "vectors"  # gen-NNNNNN/vectors/faiss.npz: each generation holds its own copy
HNSW_AUTO_THRESHOLD = 200_000  # flat search of 200k x 384 takes ~40 ms per query on 2 cores


def gpu_available() -> bool:
    """True when this faiss build has GPU support and sees a GPU (faiss-gpu installed)."""
    return hasattr(faiss, "StandardGpuResources") and faiss.get_num_gpus() > 0


class FaissIndex(VectorIndex):
    """Vectors in memory, persisted under ``path`` (or nowhere when ``path`` is None).

    ``kind``: ``flat`` (exact), ``hnsw`` (approximate, for large sets) or ``auto`` (hnsw from
    ``hnsw_threshold`` vectors). ``gpu``: ``auto`` uses faiss-gpu for flat search when present.
    """

    def __init__(
        self,
        path: str | Path | None,
        dim: int,
        kind: str = "auto",
        hnsw_threshold: int = HNSW_AUTO_THRESHOLD,
        hnsw_m: int = 32,
        ef_search: int = 128,
        gpu: str = "auto",
    ):
        if kind not in ("auto", "flat", "hnsw"):
            raise ValueError(f"faiss index kind must be auto, flat or hnsw, not {kind!r}")
        self.path = Path(path) if path is not None else None
        self.dim, self.kind = int(dim), kind
        self.hnsw_threshold, self.hnsw_m, self.ef_search = hnsw_threshold, hnsw_m, ef_search
        self.use_gpu = gpu_available() if gpu == "auto" else gpu == "yes"
        self._ids: list[str] = []
        self._pos: dict[str, int] = {}
        self._vecs = np.zeros((0, self.dim), dtype=np.float32)
        self._meta: dict[str, dict] = {}
        self._index = None  # the FAISS structure; None when stale
        if self.path is not None and (self.path / FILE).exists():
            self._load()

    # ------------------------------------------------------------------ generations

    @classmethod
    def open_for_generation(
        cls, root: Path, live: Path | None, staging: Path, dim: int, **options: Any
    ) -> FaissIndex:
        """A copy of the live generation's vectors inside the staged one: the live file is never
        written, so a crash at any moment leaves it whole. Uses ``kind``."""
        if live is not None and (live / GENERATION_DIR).is_dir():
            shutil.copytree(live / GENERATION_DIR, staging / GENERATION_DIR)
        return cls(staging / GENERATION_DIR, dim, kind=options.get("kind", "auto"))

    @classmethod
    def load_generation(cls, root: Path, gen: Path, dim: int, **options: Any) -> FaissIndex:
        return cls(gen / GENERATION_DIR, dim)

    @classmethod
    def scratch(cls, dim: int) -> FaissIndex:
        """In memory only (``path`` None): nothing to remove."""
        return cls(None, dim)

    # ------------------------------------------------------------------ persistence

    def _load(self) -> None:
        file = self.path / FILE
        try:
            with np.load(file, allow_pickle=False) as z:
                ids = [str(x) for x in z["ids"]]
                vecs = np.ascontiguousarray(z["vectors"], dtype=np.float32)
                meta = json.loads(str(z["meta"]))
                graph = z["graph"] if "graph" in z.files else None
        except (OSError, ValueError, KeyError) as e:
            raise VectorIndexError(f"{file}: unreadable FAISS index ({e})") from None
        if vecs.shape[1] != self.dim:
            raise VectorIndexError(f"{file}: stores {vecs.shape[1]}-d vectors, expected {self.dim}")
        self._ids, self._vecs, self._meta = ids, vecs, meta
        self._pos = {i: n for n, i in enumerate(ids)}
        if graph is not None and graph.size:
            self._index = faiss.deserialize_index(graph)
            self._index.hnsw.efSearch = self.ef_search

    def commit(self) -> None:
        if self.path is None:
            return
        self.path.mkdir(parents=True, exist_ok=True)
        index = self._faiss()
        graph = np.zeros(0, dtype=np.uint8)
        if isinstance(index, faiss.IndexHNSWFlat):
            graph = faiss.serialize_index(index)
        buf = io.BytesIO()
        np.savez(
            buf,
            ids=np.array(self._ids, dtype=str),
            vectors=self._vecs,
            meta=np.array(json.dumps(self._meta)),
            graph=graph,
        )
        tmp = self.path / f".{FILE}.tmp-{os.getpid()}"
        with open(tmp, "wb") as f:
            f.write(buf.getbuffer())
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path / FILE)

    # ------------------------------------------------------------------ mutation

    def add(self, ids: list[str], vectors: np.ndarray, metadatas: list[dict] | None = None) -> None:
        vectors = self._check(ids, vectors)
        if not ids:
            return
        existing = [i for i in ids if i in self._pos]
        if existing:
            self.delete(existing)
        start = len(self._ids)
        self._ids.extend(ids)
        self._pos.update({i: start + n for n, i in enumerate(ids)})
        self._vecs = np.concatenate([self._vecs, vectors]) if start else vectors.copy()
        for i, m in zip(ids, metadatas or [None] * len(ids)):
            if m:
                self._meta[i] = dict(m)
        self._index = None

    def delete(self, ids: list[str]) -> None:
        drop = {self._pos[i] for i in ids if i in self._pos}
        if not drop:
            return
        mask = np.ones(len(self._ids), dtype=bool)
        mask[list(drop)] = False
        keep = np.flatnonzero(mask)
        self._ids = [self._ids[n] for n in keep]
        self._vecs = np.ascontiguousarray(self._vecs[keep]) if len(keep) else self._vecs[:0]
        self._pos = {i: n for n, i in enumerate(self._ids)}
        for i in ids:
            self._meta.pop(i, None)
        self._index = None

    # ------------------------------------------------------------------ queries

    def _faiss(self):
        """The FAISS structure for the current vectors, built on first use after a change."""
        if self._index is not None:
            return self._index
        n = len(self._ids)
        use_hnsw = self.kind == "hnsw" or (self.kind == "auto" and n >= self.hnsw_threshold)
        if use_hnsw:
            index = faiss.IndexHNSWFlat(self.dim, self.hnsw_m, faiss.METRIC_INNER_PRODUCT)
            index.hnsw.efConstruction = 200
            index.hnsw.efSearch = self.ef_search
        else:
            index = faiss.IndexFlatIP(self.dim)
            if self.use_gpu:
                index = faiss.index_cpu_to_gpu(faiss.StandardGpuResources(), 0, index)
        if n:
            index.add(self._vecs)
        self._index = index
        return index

    def search(self, queries: np.ndarray, k: int) -> list[list[tuple[str, float]]]:
        queries = self._queries(queries)
        if not self._ids or k <= 0:
            return [[] for _ in range(len(queries))]
        scores, rows = self._faiss().search(queries, min(k, len(self._ids)))
        return [
            [(self._ids[r], float(s)) for r, s in zip(row, srow) if r >= 0]
            for row, srow in zip(rows, scores)
        ]

    def count(self) -> int:
        return len(self._ids)

    def ids(self) -> list[str]:
        return list(self._ids)

    def vectors(self, ids: list[str]) -> np.ndarray:
        """The stored vectors of ``ids`` (KeyError for an unknown id)."""
        return self._vecs[[self._pos[i] for i in ids]]

    def metadata(self, id_: str) -> dict:
        return dict(self._meta.get(id_, {}))

    def close(self) -> None:
        self._index = None
