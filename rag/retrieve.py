"""Retrieval: dense (encoder + vector index), BM25, and hybrid by reciprocal rank fusion (or a
convex fusion of normalised scores, :mod:`rag.fusion`), with an optional cross-encoder rerank stage.

Two faces over the same engine (:class:`SearchEngine`):

- :class:`Retriever` opens an index written by ``rag.ingest`` and returns :class:`Hit` objects
  with their chunks (what ``rag.search``, the answer pipeline and the UI use);
- :class:`CorpusRetriever` indexes ``ids``/``texts`` in memory and returns (id, score) lists
  (what the retrieval and QA evals use), so evals measure the code the system runs.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from indexes import VectorIndex, open_index
from rag.bm25 import BM25Index
from rag.defaults import MODES
from rag.encoding import Encoder
from rag.fusion import check_fusion, fuse
from rag.manifest import current_generation, open_generation, read_chunks
from rag.paths import display_source
from rag.rerank import CrossEncoderReranker, Reranker, check_cross_encoder  # noqa: F401 (re-export)
from rag.types import Chunk, Hit

RRF_K = 60


def rrf(rankings: Sequence[Sequence[str]], k: int = RRF_K) -> list[tuple[str, float]]:
    """Reciprocal rank fusion (Cormack et al. 2009): score(d) = sum over rankings of
    1 / (k + rank), rank starting at 1. Returns (id, score) best first; ties keep first-seen
    order, so the result is deterministic."""
    scores: dict[str, float] = {}
    for ranking in rankings:
        for rank, doc in enumerate(ranking, start=1):
            scores[doc] = scores.get(doc, 0.0) + 1.0 / (k + rank)
    return sorted(scores.items(), key=lambda kv: -kv[1])


@dataclass(frozen=True)
class FusedHit(Hit):
    """A hit with its component scores (None where that retriever did not return it), so the
    answer pipeline can judge relevance of a fused list by the dense or BM25 score."""

    dense_score: float | None = None
    bm25_score: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {**super().to_dict(), "dense_score": self.dense_score, "bm25_score": self.bm25_score}


@dataclass
class Scored:
    """One result of the engine: id, final score, stage, and the component scores."""

    id: str
    score: float
    mode: str
    dense: float | None = None
    bm25: float | None = None


class SearchEngine:
    """Dense / BM25 / hybrid search plus rerank over an encoder, a vector index and a BM25 index.

    ``depth``: candidates each retriever contributes to fusion (and to the rerank stage).
    ``fusion``/``alpha``/``norm``: how ``hybrid`` fuses the two lists (:func:`rag.fusion.fuse`;
    the default, ``rrf`` with ``alpha`` 0.5, is plain reciprocal rank fusion).
    ``rerank_depth``: how many of the best candidates the reranker re-scores (default ``depth``);
    the rest follow in first-stage order. A cross-encoder costs one forward pass per candidate,
    so this depth sets the query latency.
    ``keep``: optional filter on ids (a Chroma collection may hold ids of an interrupted ingest
    that the manifest does not name; those are never returned).
    """

    def __init__(
        self,
        encoder: Callable[[], Encoder] | Encoder | None,
        vectors: VectorIndex | None,
        bm25: BM25Index | None,
        text_of: Callable[[str], str],
        reranker: Reranker | None = None,
        depth: int = 100,
        keep: Callable[[str], bool] | None = None,
        fusion: str = "rrf",
        alpha: float = 0.5,
        norm: str = "minmax",
        rerank_depth: int | None = None,
    ):
        check_fusion(fusion, alpha, norm)
        if rerank_depth is not None and rerank_depth <= 0:
            raise ValueError(f"rerank depth must be positive, not {rerank_depth}")
        self._encoder = encoder
        self.vectors, self.bm25, self.text_of = vectors, bm25, text_of
        self.reranker, self.depth, self.keep = reranker, depth, keep
        self.fusion, self.alpha, self.norm = fusion, alpha, norm
        self.rerank_depth = rerank_depth or depth
        self.timings = {
            "query_encode_s": 0.0,
            "dense_search_s": 0.0,
            "bm25_s": 0.0,
            "rerank_s": 0.0,
            "queries": 0,
        }

    @property
    def encoder(self) -> Encoder:
        if callable(self._encoder) and not isinstance(self._encoder, Encoder):
            self._encoder = self._encoder()  # loaded on first dense query
        if self._encoder is None:
            raise ValueError("dense and hybrid search need an encoder (this retriever has none)")
        return self._encoder

    def _dense(self, queries: list[str], n: int) -> list[list[tuple[str, float]]]:
        if self.vectors is None:
            raise ValueError("dense and hybrid search need a vector index")
        t0 = time.perf_counter()
        qv = self.encoder.encode(queries, kind="query")
        t1 = time.perf_counter()
        extra = 2 if self.keep is not None else 1
        res = self.vectors.search(qv, n * extra)
        self.timings["query_encode_s"] += t1 - t0
        self.timings["dense_search_s"] += time.perf_counter() - t1
        if self.keep is not None:
            res = [[(i, s) for i, s in row if self.keep(i)][:n] for row in res]
        return res

    def _bm25(self, queries: list[str], n: int) -> list[list[tuple[str, float]]]:
        if self.bm25 is None:
            raise ValueError("bm25 and hybrid search need a BM25 index")
        t0 = time.perf_counter()
        res = self.bm25.search_many(queries, n)
        self.timings["bm25_s"] += time.perf_counter() - t0
        return res

    def search_many(
        self,
        queries: list[str],
        k: int = 10,
        mode: str = "hybrid",
        fusion: str | None = None,
        alpha: float | None = None,
        rerank: bool = True,
    ) -> list[list[Scored]]:
        """Top-``k`` results per query, best first. ``fusion``/``alpha`` override the engine's
        for this call (hybrid only); ``rerank=False`` skips the rerank stage, so one engine
        serves both sides of a with/without-reranker comparison."""
        if mode not in MODES:
            raise ValueError(f"--mode must be one of {', '.join(MODES)}, not {mode!r}")
        fusion = fusion or self.fusion
        alpha = self.alpha if alpha is None else alpha
        check_fusion(fusion, alpha, self.norm)
        reranking = rerank and self.reranker is not None
        queries = list(queries)
        self.timings["queries"] += len(queries)
        if not queries or k <= 0:
            return [[] for _ in queries]
        n = max(k, self.depth) if mode == "hybrid" else k
        if reranking:
            n = max(n, self.rerank_depth)
        dense = self._dense(queries, n) if mode in ("dense", "hybrid") else None
        sparse = self._bm25(queries, n) if mode in ("bm25", "hybrid") else None
        out = []
        for qi, query in enumerate(queries):
            d = dict(dense[qi]) if dense else {}
            b = dict(sparse[qi]) if sparse else {}
            if mode == "hybrid":
                fused = fuse(dense[qi], sparse[qi], fusion, alpha, self.norm, RRF_K)
            else:
                fused = dense[qi] if mode == "dense" else sparse[qi]
            row = [Scored(i, s, mode, d.get(i), b.get(i)) for i, s in fused]
            out.append(self._rerank(query, row)[:k] if reranking else row[:k])
        return out

    def _rerank(self, query: str, row: list[Scored]) -> list[Scored]:
        """The top ``rerank_depth`` of ``row`` by reranker score; the rest keep their order
        below them, with scores under the lowest reranked one (evaluators sort by score)."""
        t0 = time.perf_counter()
        head, tail = row[: self.rerank_depth], row[self.rerank_depth :]
        scores = self.reranker.score(query, [self.text_of(r.id) for r in head])
        ranked = sorted(zip(scores, range(len(head))), key=lambda x: (-x[0], x[1]))
        self.timings["rerank_s"] += time.perf_counter() - t0
        out = [
            Scored(head[i].id, float(s), "rerank", head[i].dense, head[i].bm25) for s, i in ranked
        ]
        floor = min((float(s) for s in scores), default=0.0)
        out += [Scored(r.id, floor - j, r.mode, r.dense, r.bm25) for j, r in enumerate(tail, 1)]
        return out


class CorpusRetriever:
    """In-memory retrieval over ``ids``/``texts`` with the same engine as :class:`Retriever`.

    ``encoder``: a SentenceTransformer, an alias/folder, an :class:`Encoder`, or None (BM25 only).
    ``timings`` records corpus encoding and index building; ``engine.timings`` the searches.
    ``fusion``/``alpha``/``norm``/``rerank_depth``: as :class:`SearchEngine`.
    """

    def __init__(
        self,
        ids: list[str],
        texts: list[str],
        encoder: Any = None,
        mode: str = "hybrid",
        backend: str = "faiss",
        reranker: Reranker | None = None,
        device: str = "auto",
        depth: int = 100,
        progress: bool = False,
        fusion: str = "rrf",
        alpha: float = 0.5,
        norm: str = "minmax",
        rerank_depth: int | None = None,
    ):
        if mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}, not {mode!r}")
        if len(ids) != len(texts) or len(set(ids)) != len(ids):
            raise ValueError("ids and texts must have the same length and ids must be unique")
        self.ids, self.mode = list(ids), mode
        self._text = dict(zip(ids, texts))
        self.timings: dict[str, float] = {}
        enc = Encoder.wrap(encoder, device=device) if encoder is not None else None
        vectors = bm25 = None
        self._tmp = None
        if mode in ("dense", "hybrid"):
            if enc is None:
                raise ValueError(f"mode {mode!r} needs an encoder")
            t0 = time.perf_counter()
            vecs = enc.encode(list(texts), kind="document", progress=progress)
            t1 = time.perf_counter()
            path = None
            if backend == "chroma":
                self._tmp = tempfile.TemporaryDirectory(prefix="rag-chroma-")
                path = Path(self._tmp.name)
            vectors = open_index(backend, path, enc.dim)
            vectors.add(self.ids, vecs)
            self.timings.update(corpus_encode_s=t1 - t0, index_build_s=time.perf_counter() - t1)
        if mode in ("bm25", "hybrid"):
            t0 = time.perf_counter()
            bm25 = BM25Index(self.ids, list(texts))
            self.timings["bm25_build_s"] = time.perf_counter() - t0
        self.engine = SearchEngine(
            enc,
            vectors,
            bm25,
            self._text.__getitem__,
            reranker,
            depth,
            fusion=fusion,
            alpha=alpha,
            norm=norm,
            rerank_depth=rerank_depth,
        )

    @property
    def encoder(self) -> Encoder | None:
        return self.engine._encoder if isinstance(self.engine._encoder, Encoder) else None

    def search_many(
        self, queries: list[str], k: int = 10, mode: str | None = None, **options: Any
    ) -> list[list[tuple[str, float]]]:
        """(id, score) lists, best first, one per query; ``options`` (``fusion``, ``alpha``,
        ``rerank``) as :meth:`SearchEngine.search_many`."""
        rows = self.engine.search_many(queries, k, mode or self.mode, **options)
        return [[(r.id, r.score) for r in row] for row in rows]

    def search(
        self, query: str, k: int = 10, mode: str | None = None, **options: Any
    ) -> list[tuple[str, float]]:
        return self.search_many([query], k, mode, **options)[0]


class Retriever:
    """Search an index written by ``rag.ingest``; returns :class:`Hit` objects with chunks.

    Re-reads the index when an ingest publishes a new generation, so a long-lived retriever (the
    UI) sees uploads without a restart. ``fusion``/``alpha``/``norm``/``rerank_depth``: as
    :class:`SearchEngine` (defaults: plain RRF, every candidate reranked).
    """

    def __init__(
        self,
        index: str | Path,
        encoder: Any = None,
        device: str = "auto",
        reranker: Reranker | None = None,
        depth: int = 100,
        fusion: str = "rrf",
        alpha: float = 0.5,
        norm: str = "minmax",
        rerank_depth: int | None = None,
        encoder_backend: str = "torch",
    ):
        check_fusion(fusion, alpha, norm)
        self.index, self.device, self.reranker, self.depth = index, device, reranker, depth
        self.encoder_backend = encoder_backend  # query encoder: torch | onnx (rag.encoding)
        self.options = {
            "fusion": fusion,
            "alpha": alpha,
            "norm": norm,
            "rerank_depth": rerank_depth,
        }
        self._given = encoder
        self._encoder: Encoder | None = None
        self._load()
        if encoder is not None:  # an explicit encoder is checked now, not at the first query
            self._get_encoder()

    @classmethod
    def open(
        cls,
        index: str | Path,
        encoder: Any = None,
        device: str = "auto",
        reranker: Reranker | str | Path | None = None,
        max_length: int | None = None,
        **kw: Any,
    ) -> Retriever:
        """Open ``index``: a name under ``$RAG_HOME/indexes``, or an index folder given as a
        :class:`~pathlib.Path` (``--index-dir``); a string that is not a plain name raises
        :class:`rag.paths.IndexNameError`. ``encoder`` None uses the index's own encoder; any
        other must have the same weights fingerprint, else :class:`EncoderMismatchError` names
        both. ``reranker`` may be a Reranker or a cross-encoder folder, alias or artefact name
        (``max_length``: its tokens per query + passage pair)."""
        if isinstance(reranker, (str, Path)):
            reranker = CrossEncoderReranker(reranker, device=device, max_length=max_length)
        return cls(index, encoder=encoder, device=device, reranker=reranker, **kw)

    def _load(self) -> None:
        self.root, self.gen, self.manifest = open_generation(self.index)
        self.chunks: dict[str, Chunk] = read_chunks(self.gen)
        self._paths: dict[str, str] = {}  # source -> display path, for this generation's roots
        m = self.manifest
        if m.backend == "faiss":
            vectors = open_index("faiss", self.gen / "vectors", m.encoder["dim"])
        else:
            vectors = open_index(
                "chroma",
                self.root / "chroma",
                m.encoder["dim"],
                chroma_url=m.chroma_url,
                collection=m.collection,
            )
        bm25 = BM25Index.load(self.gen / "bm25")
        keep = self.chunks.__contains__ if m.backend != "faiss" else None
        self.engine = SearchEngine(
            self._get_encoder,
            vectors,
            bm25,
            lambda i: self.chunks[i].text,
            self.reranker,
            self.depth,
            keep,
            **self.options,
        )

    def _get_encoder(self) -> Encoder:
        if self._encoder is None:
            rec = self.manifest.encoder
            if self._given is not None:
                enc = (
                    Encoder.load(self._given, device=self.device, backend=self.encoder_backend)
                    if isinstance(self._given, (str, Path))
                    else Encoder.wrap(self._given, device=self.device)
                )
            else:
                name = rec["name"]
                try:
                    enc = Encoder.load(name, device=self.device, backend=self.encoder_backend)
                except Exception:  # the alias/folder moved: fall back to the recorded path
                    if not rec.get("path"):
                        raise
                    enc = Encoder.load(
                        rec["path"], device=self.device, backend=self.encoder_backend
                    )
                    enc.name = name
            enc.check_matches(rec, str(self.index))
            self._encoder = enc
        return self._encoder

    @property
    def encoder(self) -> Encoder:
        return self._get_encoder()

    def refresh(self) -> bool:
        """Reload if an ingest published a new generation since; True when it did."""
        if current_generation(self.root) == self.gen:
            return False
        self._load()
        return True

    def search(self, query: str, k: int = 10, mode: str = "hybrid", **options: Any) -> list[Hit]:
        """Top-``k`` hits for ``query``, best first (``mode``: dense, bm25 or hybrid;
        ``options``: ``fusion``, ``alpha``, ``rerank`` as :meth:`SearchEngine.search_many`)."""
        return self.search_many([query], k, mode, **options)[0]

    def search_many(
        self, queries: list[str], k: int = 10, mode: str = "hybrid", **options: Any
    ) -> list[list[Hit]]:
        self.refresh()
        rows = self.engine.search_many(queries, k, mode, **options)
        return [
            [
                FusedHit(
                    self._shown(self.chunks[r.id]),
                    r.score,
                    rank=rank,
                    mode=r.mode,
                    dense_score=r.dense,
                    bm25_score=r.bm25,
                )
                for rank, r in enumerate((r for r in row if r.id in self.chunks), start=1)
            ]
            for row in rows
        ]

    def _shown(self, chunk: Chunk) -> Chunk:
        """``chunk`` with its display path: relative to the folder it was ingested from (the
        manifest's roots), so results and citations never show the machine's absolute path."""
        path = self._paths.get(chunk.source)
        if path is None:
            path = self._paths[chunk.source] = display_source(chunk.source, self.manifest.roots)
        return replace(chunk, path=path)

    def __len__(self) -> int:
        return len(self.chunks)
