"""The rows of the retrieval table and the weights behind them.

Split from :mod:`evals.retrieval` (which runs them): which rows one command produces (each mode,
hybrid once per fusion, each optionally reranked once per rerank weight), how a fusion's dense
weight ``alpha`` is fixed or chosen on queries other than the reported ones
(:func:`rag.retrieval.fusion.choose_weight`), and how the reranker's interpolation weight is
(:func:`rag.retrieval.fusion.choose_rerank_weight`, from one cached reranker pass).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rag.defaults import MODES
from rag.evaluation.datasets import RetrievalDataset
from rag.evaluation.metrics import exclude_self_hits, retrieval_metrics
from rag.retrieval.fusion import FUSIONS


@dataclass(frozen=True)
class Row:
    """One row of the table: a mode, its fusion (hybrid only), with or without the reranker, and
    the reranker's interpolation weight: a number as text, or ``default`` (chosen on the tuning
    queries)."""

    mode: str
    fusion: str | None = None
    rerank: bool = False
    weight: str | None = None

    @property
    def base(self) -> str:
        """``bm25``, ``dense``, ``hybrid`` (plain RRF's name, as before) or ``hybrid-convex``."""
        return self.mode if self.fusion in (None, "rrf") else f"{self.mode}-{self.fusion}"

    @property
    def label(self) -> str:
        return self.name()

    def name(self, chosen: float | None = None) -> str:
        """The row's name in the table; a reranked row carries its weight, so rows of several
        weights stay apart: ``hybrid+rerank(w=1)``, or ``hybrid+rerank(w=0.7 tuned)`` once a
        ``default`` weight is ``chosen``."""
        if not self.rerank:
            return self.base
        if self.weight == "default":
            shown = "default" if chosen is None else f"{chosen:g} tuned"
        else:
            shown = f"{float(self.weight or 1.0):g}"
        return f"{self.base}+rerank(w={shown})"


def table_rows(
    cfg: Any, modes: list[str], fusions: list[str], weights: list[str] | None = None
) -> list[Row]:
    """Each mode (hybrid once per fusion), then each of them again reranked, once per rerank
    weight in ``weights`` (default ``[cfg.rerank_weight]``), when ``cfg.rerank`` is given and
    the row is in ``cfg.rerank_on`` (None: every row)."""
    if bad := [m for m in modes if m not in MODES]:
        raise ValueError(f"--retriever must be bm25, dense or hybrid, not {bad[0]!r}")
    if bad := [f for f in fusions if f not in FUSIONS]:
        raise ValueError(f"--fusion must be rrf or convex, not {bad[0]!r}")
    rows = [
        Row(m, f if m == "hybrid" else None)
        for m in modes
        for f in (fusions if m == "hybrid" else [None])
    ]
    if cfg.rerank:
        on = cfg.rerank_on
        if on and (bad := [x for x in on if x not in {r.base for r in rows}]):
            raise ValueError(
                f"--rerank-on {bad[0]!r} names no row (have {', '.join(r.base for r in rows)})"
            )
        weights = list(dict.fromkeys(map(parse_rerank_weight, weights or [cfg.rerank_weight])))
        rows += [
            Row(r.mode, r.fusion, True, w) for r in rows if not on or r.base in on for w in weights
        ]
    return rows


def choose_alphas(
    cfg: Any,
    fusions: list[str],
    retriever: Any,
    ds: RetrievalDataset,
    load_tune: Callable[[], RetrievalDataset],
) -> dict[str, dict]:
    """The dense weight per fusion: fixed (``--alpha 0.3``), plain RRF's 0.5 (``default`` for
    rrf), or chosen by :func:`rag.retrieval.fusion.choose_weight` on ``cfg.tune_queries`` (``auto``, and
    ``default`` for convex), scored with the same pytrec_eval nDCG@10 as the table.
    ``load_tune`` gives the tuning queries; it is called only when a weight is chosen."""
    from rag.retrieval.fusion import choose_weight

    out: dict[str, dict] = {}
    tune = None
    for fusion in fusions:
        if cfg.alpha not in ("auto", "default"):
            out[fusion] = {"alpha": float(cfg.alpha)}
            continue
        if cfg.alpha == "default" and fusion == "rrf":
            out[fusion] = {"alpha": 0.5}
            continue
        if tune is None:
            tune = load_tune()
            n = max(cfg.k, 100)
            qids = list(tune.queries)
            texts = [tune.queries[q] for q in qids]
            dense = dict(zip(qids, retriever.search_many(texts, n, "dense", rerank=False)))
            sparse = dict(zip(qids, retriever.search_many(texts, n, "bm25", rerank=False)))
        alpha, scores = choose_weight(dense, sparse, tune.qrels, fusion, cfg.norm, metric=_ndcg)
        out[fusion] = {
            "alpha": alpha,
            "chosen_on": f"{tune.name} ({len(tune.queries)} queries)",
            "tuned_on_reported_queries": bool(set(tune.queries) & set(ds.queries)),
            "ndcg@10_by_alpha": {str(a): round(v, 4) for a, v in scores.items()},
        }
    return out


def choose_rerank_weights(
    cfg: Any,
    rows: list[Row],
    alphas: dict[str, dict],
    retriever: Any,
    ds: RetrievalDataset,
    load_tune: Callable[[], RetrievalDataset],
) -> dict[tuple[str, str | None], dict]:
    """The rerank weight of each reranked first stage ``(mode, fusion)`` whose weight is
    ``default``, chosen by :func:`rag.retrieval.fusion.choose_rerank_weight` on the tuning queries as
    :func:`choose_alphas` chooses ``alpha`` (same queries, grid 0..1, pytrec_eval nDCG@10, ties
    to the middle), over the same first stage the reported row reranks (its alpha, depth, norm).

    Cost: the reranker scores each (query, passage) pair once, in a cache shared by every first
    stage tuned here (hybrid and hybrid-convex heads mostly overlap); all eleven weights re-sort
    those cached scores. ``load_tune`` is called only when a weight is chosen."""
    from rag.retrieval.fusion import choose_rerank_weight

    wanted = list(
        dict.fromkeys((r.mode, r.fusion) for r in rows if r.rerank and r.weight == "default")
    )
    if not wanted:
        return {}
    tune = load_tune()
    qids = list(tune.queries)
    texts = [tune.queries[q] for q in qids]
    engine = retriever.engine
    cache: dict[tuple[str, str], float] = {}
    out: dict[tuple[str, str | None], dict] = {}
    for mode, fusion in wanted:
        t0, scored = time.perf_counter(), len(cache)
        settings = engine.settings
        if fusion:
            settings = settings.replace(fusion=fusion, alpha=alphas[fusion]["alpha"])
        firsts = engine.first_stage(texts, cfg.k, mode, settings=settings, reranking=True)
        scores = {q: _cached_scores(engine, cache, t, r) for q, t, r in zip(qids, texts, firsts)}
        runs = {q: [(r.id, r.score) for r in row] for q, row in zip(qids, firsts)}
        weight, by_weight = choose_rerank_weight(
            runs, scores, tune.qrels, engine.settings.norm, metric=_ndcg
        )
        out[(mode, fusion)] = {
            "rerank_weight": weight,
            "chosen_on": f"{tune.name} ({len(tune.queries)} queries)",
            "tuned_on_reported_queries": bool(set(tune.queries) & set(ds.queries)),
            "ndcg@10_by_weight": {str(w): round(v, 4) for w, v in by_weight.items()},
            "pairs_reranked": len(cache) - scored,
            "seconds": round(time.perf_counter() - t0, 2),
        }
    return out


def _cached_scores(
    engine: Any, cache: dict[tuple[str, str], float], query: str, row: list
) -> list[float]:
    """The reranker's scores of ``row``'s head, scoring only pairs not yet in ``cache``."""
    head = row[: engine.settings.rerank_depth]
    missing = [r for r in head if (query, r.id) not in cache]
    if missing:
        cache.update(zip([(query, r.id) for r in missing], engine.rerank_scores(query, missing)))
    return [cache[(query, r.id)] for r in head]


def _ndcg(qrels: dict, run: dict) -> float:
    """nDCG@10 as the table computes it (pytrec_eval, self-hits removed)."""
    run = exclude_self_hits({q: dict(r) for q, r in run.items()})
    return retrieval_metrics(qrels, run, ["ndcg@10"])["ndcg@10"]


def parse_alpha(text: str) -> str:
    """``auto``, ``default`` or a number in [0, 1] (kept as text in the config)."""
    return _parse_weight("--alpha", text, ("auto", "default"))


def parse_rerank_weight(text: str) -> str:
    """``default`` or a number in [0, 1] (kept as text in the config, as ``--alpha``)."""
    return _parse_weight("--rerank-weight", text, ("default",))


def _parse_weight(flag: str, text: str, words: tuple[str, ...]) -> str:
    """One of ``words`` as given, or a number in [0, 1] as its float text; errors name ``flag``."""
    if text in words:
        return text
    try:
        value = float(text)
    except ValueError:
        raise ValueError(
            f"{flag} must be a number in [0, 1] or {' or '.join(words)}, not {text!r}"
        ) from None
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"{flag} must be in [0, 1], not {value}")
    return str(value)
