"""The search engine under both retrievers of :mod:`rag.retrieval.retriever`: dense (encoder +
vector index), BM25, and hybrid by a convex fusion of normalised scores or reciprocal rank fusion
(:mod:`rag.retrieval.fusion`), with an optional rerank stage over the best candidates (the
reranker's score interpolated with the first stage's by ``rerank_weight``,
:func:`rag.retrieval.fusion.interpolate`), all as its
:class:`~rag.retrieval.settings.RetrievalSettings` say.

It knows ids and scores only; :class:`rag.retrieval.retriever.Retriever` maps them to chunks of
an ingested index and :class:`rag.retrieval.retriever.CorpusRetriever` to an in-memory corpus, so
the evals measure the code the system searches with. Each stage's time is added to ``timings``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass

from indexes import VectorIndex
from rag.answer.answerability import COVERAGE_STOPWORDS, coverage
from rag.defaults import MODES
from rag.retrieval.bm25 import BM25Index, terms
from rag.retrieval.duplicates import distinct
from rag.retrieval.encoder import Encoder
from rag.retrieval.fusion import fuse, rerank_head
from rag.retrieval.rerank import Reranker
from rag.retrieval.settings import DEFAULTS, RetrievalSettings
from rag.retrieval.spelling import Corrected, Speller, decoder_words, tokenizer_words


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

    ``settings`` (:class:`~rag.retrieval.settings.RetrievalSettings`, default: the product's)
    give the search: ``depth`` candidates each retriever contributes to fusion (and to the rerank
    stage); ``fusion``/``alpha``/``norm``, how ``hybrid`` fuses the two lists
    (:func:`rag.retrieval.fusion.fuse`); ``rerank_depth``, how many of the best candidates the
    reranker re-scores (the rest follow in first-stage order; a cross-encoder costs one forward
    pass per candidate, so this depth sets the query latency); ``rerank_weight``, the reranker's
    share of the reranked head's score, ``weight * norm(rerank) + (1 - weight) * norm(first
    stage)`` (1 = the reranker's order and raw scores; 0 = the first-stage order: a weak
    reranker, ours trained on little data, is interpolated rather than trusted outright;
    ``evals.retrieval --rerank-weight default`` chooses the weight); ``k`` and ``mode``, a
    search's defaults. The settings that name and load the reranker are
    :func:`rag.retrieval.rerank.load_reranker`'s; this engine takes the loaded ``reranker``.
    ``keep``: optional filter on ids (a Chroma collection may hold ids of an interrupted ingest
    that the manifest does not name; those are never returned). A search's document filter is
    its ``allowed`` ids (:meth:`search_many`), searched inside each stage, not after.
    """

    def __init__(
        self,
        encoder: Callable[[], Encoder] | Encoder | None,
        vectors: VectorIndex | None,
        bm25: BM25Index | None,
        text_of: Callable[[str], str],
        reranker: Reranker | None = None,
        settings: RetrievalSettings = DEFAULTS,
        keep: Callable[[str], bool] | None = None,
    ):
        self._encoder = encoder
        self.vectors, self.bm25, self.text_of = vectors, bm25, text_of
        self.reranker, self.settings, self.keep = reranker, settings, keep
        self._speller: Speller | None = None  # built at the first correction
        self._speller_decoder = False  # whether it knows the default decoder's words
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

    def coverage(self, query: str, texts: Sequence[str]) -> float | None:
        """The answerability signal :func:`rag.answer.answerability.coverage` of ``query`` over
        ``texts``, weighted by this corpus's BM25 IDF; None without a BM25 index."""
        if self.bm25 is None:
            return None
        # The long stop-word list: BM25's short one keeps "how", "what", "do", and in a small
        # corpus that never says "how" they would carry most of the query's IDF weight.
        words = terms([query], COVERAGE_STOPWORDS)[0]
        return coverage(words, terms(list(texts)), self.bm25.idf(set(words)))

    def correct_typos(self, query: str) -> Corrected:
        """``query`` with its typos corrected against this corpus's BM25 terms, the encoder's and
        the default decoder's whole words being no typos (:mod:`rag.retrieval.spelling`);
        unchanged without a BM25 index."""
        if self.bm25 is None:
            return Corrected(query)
        decoder = decoder_words()  # empty until the decoder's engine folder is built: then re-read
        if self._speller is None or (decoder and not self._speller_decoder):
            tokenizer = getattr(self.encoder, "tokenizer", None) if self._encoder else None
            known = tokenizer_words(tokenizer) | decoder
            self._speller = Speller(self.bm25.doc_freq, known, COVERAGE_STOPWORDS)
            self._speller_decoder = bool(decoder)
        return self._speller.correct(query)

    def _dense(
        self, queries: list[str], n: int, allowed: frozenset[str] | None = None
    ) -> list[list[tuple[str, float]]]:
        if self.vectors is None:
            raise ValueError("dense and hybrid search need a vector index")
        t0 = time.perf_counter()
        qv = self.encoder.encode(queries, kind="query")
        t1 = time.perf_counter()
        if allowed is not None:  # the filter inside the vector search: n hits from it
            res = self.vectors.search(qv, n, ids=allowed)
        else:
            extra = 2 if self.keep is not None else 1
            res = self.vectors.search(qv, n * extra)
            if self.keep is not None:
                res = [[(i, s) for i, s in row if self.keep(i)][:n] for row in res]
        self.timings["query_encode_s"] += t1 - t0
        self.timings["dense_search_s"] += time.perf_counter() - t1
        return res

    def _bm25(
        self, queries: list[str], n: int, allowed: frozenset[str] | None = None
    ) -> list[list[tuple[str, float]]]:
        if self.bm25 is None:
            raise ValueError("bm25 and hybrid search need a BM25 index")
        t0 = time.perf_counter()
        res = self.bm25.search_many(queries, n, allowed=allowed)
        self.timings["bm25_s"] += time.perf_counter() - t0
        return res

    def search_many(
        self,
        queries: list[str],
        k: int | None = None,
        mode: str | None = None,
        *,
        settings: RetrievalSettings | None = None,
        rerank: bool = True,
        allowed: Collection[str] | None = None,
    ) -> list[list[Scored]]:
        """Top-``k`` results per query, best first (``k``, ``mode``: the settings' when None).
        ``settings``: this call's settings, whole, in place of the engine's (fusion, alpha,
        norm, depth, rerank depth and weight: a comparison of settings over one loaded engine,
        evals.retrieval); ``rerank=False`` skips the rerank stage, so one engine serves both
        sides of a with/without-reranker comparison. ``allowed``: the only ids results may have
        (a document filter, :mod:`rag.retrieval.filters`), pushed into every stage: the vector
        index and BM25 search only those, so the reranker sees only their candidates and ``k``
        results come back whenever they hold ``k`` (no post-filter)."""
        s = settings or self.settings
        queries = list(queries)
        reranking = rerank and self.reranker is not None
        k = s.k if k is None else k
        rows = self.first_stage(queries, k, mode, settings=s, reranking=reranking, allowed=allowed)
        if reranking:
            rows = [
                self.apply_rerank(row, self.rerank_scores(q, row, s), s) if row else row
                for q, row in zip(queries, rows)
            ]
        return [row[:k] for row in rows]

    def first_stage(
        self,
        queries: list[str],
        k: int | None = None,
        mode: str | None = None,
        *,
        settings: RetrievalSettings | None = None,
        reranking: bool = False,
        allowed: Collection[str] | None = None,
    ) -> list[list[Scored]]:
        """The candidates :meth:`search_many` ranks before its rerank stage (at least ``k``,
        and ``rerank_depth`` when ``reranking``), best first, from ``allowed`` ids only when
        given; ``settings`` as for :meth:`search_many`. Public so that tuning ``rerank_weight``
        (evals.retrieval) reranks exactly what a search would, once."""
        s = settings or self.settings
        k = s.k if k is None else k
        mode = mode or s.mode
        if mode not in MODES:
            raise ValueError(f"--mode must be one of {', '.join(MODES)}, not {mode!r}")
        queries = list(queries)
        self.timings["queries"] += len(queries)
        only = None
        if allowed is not None and self.keep is None:
            only = allowed if isinstance(allowed, frozenset) else frozenset(allowed)
        elif allowed is not None:
            only = frozenset(i for i in allowed if self.keep(i))
        if not queries or k <= 0 or only is not None and not only:
            return [[] for _ in queries]
        n = max(k, s.depth) if mode == "hybrid" else k
        if reranking:
            n = max(n, s.rerank_depth)
        if s.dedup is not None:  # room for the near-copies left out below
            n = max(n, 2 * k)
        dense = self._dense(queries, n, only) if mode in ("dense", "hybrid") else None
        sparse = self._bm25(queries, n, only) if mode in ("bm25", "hybrid") else None
        out = []
        for qi in range(len(queries)):
            d = dict(dense[qi]) if dense else {}
            b = dict(sparse[qi]) if sparse else {}
            if mode == "hybrid":
                fused = fuse(dense[qi], sparse[qi], s.fusion, s.alpha, s.norm)
            else:
                fused = dense[qi] if mode == "dense" else sparse[qi]
            row = [Scored(i, score, mode, d.get(i), b.get(i)) for i, score in fused]
            if s.dedup is not None:
                need = max(k, s.rerank_depth) if reranking else k
                row = distinct(row, lambda r: self.text_of(r.id), s.dedup, need)
            out.append(row)
        return out

    def rerank_scores(
        self, query: str, row: Sequence[Scored], settings: RetrievalSettings | None = None
    ) -> list[float]:
        """The reranker's raw scores of the top ``rerank_depth`` of ``row`` (timed)."""
        if self.reranker is None:
            raise ValueError("this search engine has no reranker")
        t0 = time.perf_counter()
        head = row[: (settings or self.settings).rerank_depth]
        scores = [float(s) for s in self.reranker.score(query, [self.text_of(r.id) for r in head])]
        self.timings["rerank_s"] += time.perf_counter() - t0
        return scores

    def apply_rerank(
        self,
        row: Sequence[Scored],
        scores: Sequence[float],
        settings: RetrievalSettings | None = None,
    ) -> list[Scored]:
        """``row`` with its head (one entry per score) re-ordered by the reranker's ``scores``
        interpolated with the first stage's by ``rerank_weight`` (``settings``', default: the
        engine's;
        :func:`rag.retrieval.fusion.rerank_head`); the rest keep their order below them, with scores under
        the lowest reranked one (evaluators sort by score). Head entries become mode ``rerank``
        and keep their component scores."""
        s = settings or self.settings
        by_id = {r.id: r for r in row}
        ranked = rerank_head([(r.id, r.score) for r in row], scores, s.rerank_weight, s.norm)
        out = []
        for j, (doc, score) in enumerate(ranked):
            r = by_id[doc]
            out.append(Scored(doc, score, "rerank" if j < len(scores) else r.mode, r.dense, r.bm25))
        return out
