"""The rows of the retrieval table and the fusion weight behind each hybrid row.

Split from :mod:`evals.retrieval` (which runs them): which rows one command produces (each mode,
hybrid once per fusion, each optionally reranked) and how a fusion's dense weight ``alpha`` is
fixed or chosen on queries other than the reported ones (:func:`rag.fusion.choose_weight`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rag.datasets import RetrievalDataset
from rag.defaults import MODES
from rag.fusion import FUSIONS
from rag.metrics import exclude_self_hits, retrieval_metrics


@dataclass(frozen=True)
class Row:
    """One row of the table: a mode, its fusion (hybrid only), with or without the reranker."""

    mode: str
    fusion: str | None = None
    rerank: bool = False

    @property
    def base(self) -> str:
        """``bm25``, ``dense``, ``hybrid`` (plain RRF's name, as before) or ``hybrid-convex``."""
        return self.mode if self.fusion in (None, "rrf") else f"{self.mode}-{self.fusion}"

    @property
    def label(self) -> str:
        return self.base + ("+rerank" if self.rerank else "")


def table_rows(cfg: Any, modes: list[str], fusions: list[str]) -> list[Row]:
    """Each mode (hybrid once per fusion), then each of them again reranked when ``cfg.rerank``
    is given and the row is in ``cfg.rerank_on`` (None: every row)."""
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
        rows += [Row(r.mode, r.fusion, True) for r in rows if not on or r.base in on]
    return rows


def choose_alphas(
    cfg: Any,
    fusions: list[str],
    retriever: Any,
    ds: RetrievalDataset,
    load_tune: Callable[[], RetrievalDataset],
) -> dict[str, dict]:
    """The dense weight per fusion: fixed (``--alpha 0.3``), plain RRF's 0.5 (``default`` for
    rrf), or chosen by :func:`rag.fusion.choose_weight` on ``cfg.tune_queries`` (``auto``, and
    ``default`` for convex), scored with the same pytrec_eval nDCG@10 as the table.
    ``load_tune`` gives the tuning queries; it is called only when a weight is chosen."""
    from rag.fusion import choose_weight

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


def _ndcg(qrels: dict, run: dict) -> float:
    """nDCG@10 as the table computes it (pytrec_eval, self-hits removed)."""
    run = exclude_self_hits({q: dict(r) for q, r in run.items()})
    return retrieval_metrics(qrels, run, ["ndcg@10"])["ndcg@10"]


def parse_alpha(text: str) -> str:
    """``auto``, ``default`` or a number in [0, 1] (kept as text in the config)."""
    if text in ("auto", "default"):
        return text
    try:
        value = float(text)
    except ValueError:
        raise ValueError(
            f"--alpha must be a number in [0, 1], auto or default, not {text!r}"
        ) from None
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"--alpha must be in [0, 1], not {value}")
    return str(value)
