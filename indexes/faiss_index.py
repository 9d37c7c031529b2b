"""FAISS backend: exact inner product by default, HNSW or IVF for large sets, GPU when present.

Kinds (``kind``) and the choice by size:

- ``flat``: ``IndexFlatIP``, exact. The choice below ~200k vectors, where a flat search is still
  fast (docs/retrieval.md), and building it is a memory copy.
- ``hnsw``: ``IndexHNSWFlat`` (M = 32, efSearch = 128), approximate, CPU only. The CPU choice
  for large sets: no training, high recall, fast queries; but building is slow, it cannot
  delete (we rebuild after a change) and it holds a graph beside the vectors.
- ``ivf``: ``IndexIVFFlat`` (inner product), approximate. ``nlist`` = about 4 * sqrt(n) lists,
  at most n // 39 (k-means wants >= 39 training points per list) and at least 1; trained on
  the vectors themselves (a seeded sample of at most 256 * nlist); ``nprobe`` lists searched per
  query (default 16, at most nlist; nprobe = nlist is exact). The GPU choice for large sets:
  faiss-gpu has IVF but no HNSW, and IVF builds fast. On CPU it builds faster than HNSW but
  its recall at equal speed is usually lower, so ``auto`` keeps HNSW there.
- ``auto`` (default for a new index): flat below ``hnsw_threshold`` (200k) vectors; from it
  HNSW on CPU, IVF on a GPU.

GPU (``gpu``: ``auto`` when faiss-gpu sees a GPU, ``yes`` required, ``no``): flat and IVF indexes
are built and searched on GPU 0 (``faiss.index_cpu_to_gpu``; the IVF k-means runs there too),
with one ``StandardGpuResources`` per index object. HNSW stays on the CPU: faiss has no GPU
HNSW (newer builds have CAGRA, a GPU graph index, which this backend does not use). faiss-gpu
searches at most k = 2048 per query (nprobe is capped there too). Not verified on a GPU in this
project (none was lent): the GPU tests skip without one.

Storage is one ``faiss.npz`` file per index folder holding the ids, the vectors, the metadata,
the options (``kind``, ``nprobe``: a reopened index keeps them unless given others) and (for
HNSW) the serialised graph. The IVF structure is not stored: it is re-trained from the stored
vectors on the first search after opening or a change, as the flat one is rebuilt: k-means over
at most 256 * nlist sampled vectors, a cost that first search pays (not measured at scale here;
storing the trained index like the HNSW graph would move it to ingest). ``commit`` writes
the file aside and ``os.replace``s it, so the file on disk is always either the old or the new
index, never half of one.

A search restricted to some ids (a document filter, ``search(..., ids=...)``) is exact inner
products over just those vectors up to 20,000 of them (and always on a GPU), else the structure
above searched with a ``faiss.IDSelectorBatch`` of their rows in its ``SearchParameters``.

Why not ``IndexIDMap2`` alone: FAISS ids are int64 and HNSW cannot delete, so we keep the string
ids and vectors ourselves and (re)build the FAISS structure lazily after a change. Rebuilding a
flat index is a memory copy; an HNSW or IVF rebuild happens only when the set changed since the
last search (or, for HNSW, commit).
"""

from __future__ import annotations

import io
import json
import math
import os
import shutil
from collections.abc import Collection
from pathlib import Path
from typing import Any

import faiss
import numpy as np

from indexes.base import VectorIndex, VectorIndexError

FILE = "faiss.npz"
GENERATION_DIR = "vectors"  # gen-NNNNNN/vectors/faiss.npz: each generation holds its own copy
# rag.ingest.config.FAISS_KINDS repeats these, so that checking settings does not import faiss
KINDS = ("auto", "flat", "hnsw", "ivf")
GPU_CHOICES = ("auto", "yes", "no")
HNSW_AUTO_THRESHOLD = 200_000  # flat search stays fast below this many vectors (docs/retrieval.md)
DEFAULT_NPROBE = 16
GPU_MAX_K = 2048  # faiss-gpu's largest k and nprobe per query
IVF_MIN_POINTS_PER_LIST = 39  # faiss's k-means warns below this many training points per list
IVF_MAX_POINTS_PER_LIST = 256  # and samples down to this many itself; we sample, seeded, first
IVF_SEED = 0
# a filtered search over at most this many vectors is exact inner products over just those
# (cheap at this size), more go through the index with a selector
EXACT_SUBSET_MAX = 20_000
GPU_EXTRA_HINT = "install the `gpu` extra: pip install -e '.[gpu]' (faiss-gpu-cu12)"


def gpu_available() -> bool:
    """True when this faiss build has GPU support and sees a GPU (faiss-gpu installed)."""
    return hasattr(faiss, "StandardGpuResources") and faiss.get_num_gpus() > 0


def ivf_nlist(n: int) -> int:
    """IVF lists for ``n`` vectors: about 4 * sqrt(n), at most n // 39 so that k-means has 39
    training points per list, at least 1."""
    return max(1, min(round(4 * math.sqrt(n)), n // IVF_MIN_POINTS_PER_LIST))


def ivf_training_sample(vectors: np.ndarray, nlist: int, seed: int = IVF_SEED) -> np.ndarray:
    """At most 256 * ``nlist`` rows of ``vectors``, the same ones for the same input (seeded)."""
    cap = IVF_MAX_POINTS_PER_LIST * nlist
    if len(vectors) <= cap:
        return vectors
    rows = np.sort(np.random.default_rng(seed).choice(len(vectors), cap, replace=False))
    return np.ascontiguousarray(vectors[rows])


class FaissIndex(VectorIndex):
    """Vectors in memory, persisted under ``path`` (or nowhere when ``path`` is None).

    ``kind``: ``auto``, ``flat``, ``hnsw`` or ``ivf`` (module docstring); None = the kind stored
    with the index, else ``auto``. ``nprobe``: IVF lists searched per query; None = the stored
    value, else 16. ``hnsw_threshold``: the size from which ``auto`` leaves flat search.
    ``gpu``: ``auto`` (faiss-gpu when it sees a GPU), ``yes`` (required: VectorIndexError
    without one) or ``no``. ``exact_subset_max``: a search restricted to at most this many ids
    is exact over just their vectors, a larger one uses an id selector (:meth:`_search_rows`).
    """

    def __init__(
        self,
        path: str | Path | None,
        dim: int,
        kind: str | None = None,
        hnsw_threshold: int = HNSW_AUTO_THRESHOLD,
        hnsw_m: int = 32,
        ef_search: int = 128,
        gpu: str = "auto",
        nprobe: int | None = None,
        exact_subset_max: int = EXACT_SUBSET_MAX,
    ):
        if kind is not None and kind not in KINDS:
            raise ValueError(f"faiss index kind must be one of {', '.join(KINDS)}, not {kind!r}")
        if nprobe is not None and nprobe < 1:
            raise ValueError(f"faiss nprobe must be at least 1, not {nprobe}")
        if gpu not in GPU_CHOICES:
            raise ValueError(f"faiss gpu must be one of {', '.join(GPU_CHOICES)}, not {gpu!r}")
        if gpu == "yes" and not gpu_available():
            raise VectorIndexError(
                "faiss gpu='yes' needs faiss-gpu and a visible GPU "
                f"(faiss {faiss.__version__} here sees none): {GPU_EXTRA_HINT}, or pass gpu='auto'"
            )
        self.path = Path(path) if path is not None else None
        self.dim = int(dim)
        self.kind, self.nprobe = kind, nprobe  # None until _load fills in the stored values
        self.hnsw_threshold, self.hnsw_m, self.ef_search = hnsw_threshold, hnsw_m, ef_search
        self.exact_subset_max = exact_subset_max  # filtered searches up to this many: exact
        self.use_gpu = gpu_available() if gpu == "auto" else gpu == "yes"
        self._gpu_res = None  # one StandardGpuResources per index object, made on first GPU use
        self._ids: list[str] = []
        self._pos: dict[str, int] = {}
        self._vecs = np.zeros((0, self.dim), dtype=np.float32)
        self._meta: dict[str, dict] = {}
        self._index = None  # the FAISS structure; None when stale
        if self.path is not None and (self.path / FILE).exists():
            self._load()
        self.kind = self.kind or "auto"

    # ------------------------------------------------------------------ generations

    @classmethod
    def open_for_generation(
        cls, root: Path, live: Path | None, staging: Path, dim: int, **options: Any
    ) -> FaissIndex:
        """A copy of the live generation's vectors inside the staged one: the live file is never
        written, so a crash at any moment leaves it whole. Uses ``kind`` and ``nprobe`` (None:
        the live generation's)."""
        if live is not None and (live / GENERATION_DIR).is_dir():
            shutil.copytree(live / GENERATION_DIR, staging / GENERATION_DIR)
        return cls(
            staging / GENERATION_DIR, dim, kind=options.get("kind"), nprobe=options.get("nprobe")
        )

    @classmethod
    def load_generation(cls, root: Path, gen: Path, dim: int, **options: Any) -> FaissIndex:
        """Searches with the kind and nprobe the generation was written with. Every published
        generation holds its file (ingest commits even an empty store), so a missing one is an
        error, not an empty index."""
        if not (gen / GENERATION_DIR / FILE).is_file():
            raise VectorIndexError(f"{gen / GENERATION_DIR / FILE}: missing")
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
                stored = json.loads(str(z["options"])) if "options" in z.files else {}
        except (OSError, ValueError, KeyError) as e:
            raise VectorIndexError(f"{file}: unreadable FAISS index ({e})") from None
        if vecs.shape[1] != self.dim:
            raise VectorIndexError(f"{file}: stores {vecs.shape[1]}-d vectors, expected {self.dim}")
        self._ids, self._vecs, self._meta = ids, vecs, meta
        self._pos = {i: n for n, i in enumerate(ids)}
        if "kind" not in stored and graph is not None and graph.size:
            stored["kind"] = "hnsw"  # written before options were stored: its writer chose HNSW
        self.kind = self.kind or stored.get("kind")
        self.nprobe = self.nprobe or stored.get("nprobe")
        # the stored graph only serves when this opening still picks HNSW (a kind given now
        # may say otherwise)
        if graph is not None and graph.size and self._choice(len(ids)) == "hnsw":
            self._index = faiss.deserialize_index(graph)
            self._index.hnsw.efSearch = self.ef_search

    def commit(self) -> None:
        if self.path is None:
            return
        self.path.mkdir(parents=True, exist_ok=True)
        graph = np.zeros(0, dtype=np.uint8)
        if self._choice(len(self._ids)) == "hnsw":  # the one structure worth storing: slow build
            graph = faiss.serialize_index(self._faiss())
        buf = io.BytesIO()
        np.savez(
            buf,
            ids=np.array(self._ids, dtype=str),
            vectors=self._vecs,
            meta=np.array(json.dumps(self._meta)),
            options=np.array(json.dumps({"kind": self.kind, "nprobe": self.nprobe})),
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

    def _choice(self, n: int) -> str:
        """The structure ``kind`` means for ``n`` vectors: flat, hnsw or ivf."""
        kind = self.kind or "auto"
        if kind != "auto":
            return kind
        if n < self.hnsw_threshold:
            return "flat"
        return "ivf" if self.use_gpu else "hnsw"  # faiss-gpu has no HNSW

    def _to_gpu(self, index):
        """``index`` copied to GPU 0, sharing this object's one StandardGpuResources (each
        holds scratch memory and CUDA streams: one per rebuild would pile them up)."""
        if self._gpu_res is None:
            self._gpu_res = faiss.StandardGpuResources()
        return faiss.index_cpu_to_gpu(self._gpu_res, 0, index)

    def _build_ivf(self, n: int):
        """An IVF index over the current vectors, trained on them (on the GPU when used)."""
        nlist = ivf_nlist(n)
        quantizer = faiss.IndexFlatIP(self.dim)
        index = faiss.IndexIVFFlat(quantizer, self.dim, nlist, faiss.METRIC_INNER_PRODUCT)
        # (faiss's Python wrapper keeps ``quantizer`` alive as long as ``index``)
        if self.use_gpu:
            index = self._to_gpu(index)  # untrained: the k-means below runs on the GPU
        index.train(ivf_training_sample(self._vecs, nlist))
        # more than nlist is exact already; faiss-gpu refuses more than GPU_MAX_K
        cap = min(nlist, GPU_MAX_K) if self.use_gpu else nlist
        index.nprobe = min(self.nprobe or DEFAULT_NPROBE, cap)
        return index

    def _faiss(self):
        """The FAISS structure for the current vectors, built on first use after a change."""
        if self._index is not None:
            return self._index
        n = len(self._ids)
        choice = self._choice(n)
        if choice == "hnsw":  # CPU even with a GPU: faiss has no GPU HNSW
            index = faiss.IndexHNSWFlat(self.dim, self.hnsw_m, faiss.METRIC_INNER_PRODUCT)
            index.hnsw.efConstruction = 200
            index.hnsw.efSearch = self.ef_search
        elif choice == "ivf" and n:  # k-means needs points; an empty index is searched as flat
            index = self._build_ivf(n)
        else:
            index = faiss.IndexFlatIP(self.dim)
            if self.use_gpu:
                index = self._to_gpu(index)
        if n:
            index.add(self._vecs)
        self._index = index
        return index

    def search(
        self, queries: np.ndarray, k: int, ids: Collection[str] | None = None
    ) -> list[list[tuple[str, float]]]:
        """Top ``k`` by inner product; ``ids`` restricts the search to those ids (see
        :meth:`_search_rows`)."""
        queries = self._queries(queries)
        rows = None
        if ids is not None:
            rows = np.array(sorted({self._pos[i] for i in ids if i in self._pos}), dtype=np.int64)
        n = len(self._ids) if rows is None else len(rows)
        if not n or k <= 0:
            return [[] for _ in range(len(queries))]
        k = min(k, n)
        if rows is None:
            scores, found = self._faiss().search(queries, k)
        else:
            scores, found = self._search_rows(queries, k, rows)
        return [
            [(self._ids[r], float(s)) for r, s in zip(row, srow) if r >= 0]
            for row, srow in zip(found, scores)
        ]

    def _search_rows(
        self, queries: np.ndarray, k: int, rows: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """(scores, rows) of the best ``k`` among ``rows``. Up to :data:`EXACT_SUBSET_MAX` rows
        (and always on a GPU, where faiss takes no id selector) by exact inner products over
        just those vectors: cheaper than any index pass over all of them, and exact. A larger
        set goes through the FAISS structure with an ``IDSelectorBatch`` in its search
        parameters (exact for flat; HNSW and IVF as approximate as their unfiltered search)."""
        if len(rows) <= self.exact_subset_max or self.use_gpu:
            scores = queries @ self._vecs[rows].T
            top = np.argsort(-scores, axis=1, kind="stable")[:, :k]
            return np.take_along_axis(scores, top, axis=1), rows[top]
        index = self._faiss()
        sel = faiss.IDSelectorBatch(rows)
        choice = self._choice(len(self._ids))
        if choice == "hnsw":
            params = faiss.SearchParametersHNSW(sel=sel, efSearch=max(self.ef_search, k))
        elif choice == "ivf":
            params = faiss.SearchParametersIVF(sel=sel, nprobe=index.nprobe)
        else:
            params = faiss.SearchParameters(sel=sel)
        return index.search(queries, k, params=params)

    def count(self) -> int:
        return len(self._ids)

    def ids(self) -> list[str]:
        return list(self._ids)

    def vectors(self, ids: list[str]) -> np.ndarray:
        """The stored vectors of ``ids`` (KeyError for an unknown id)."""
        if not ids:
            return np.zeros((0, self.dim), dtype=np.float32)
        return self._vecs[[self._pos[i] for i in ids]]

    def location(self) -> str:
        """The ``faiss.npz`` file (``in memory`` for a scratch index)."""
        return str(self.path / FILE) if self.path is not None else "in memory"

    def metadata(self, id_: str) -> dict:
        return dict(self._meta.get(id_, {}))

    def close(self) -> None:
        self._index = None
        self._gpu_res = None  # after the index that used it
