"""Fusing ranked lists: weighted reciprocal rank fusion and normalised-score convex fusion.

Pure functions over ranked lists ``[(doc_id, score), ...]`` (best first), so the hybrid mode of
:mod:`rag.retrieval.retriever` and the evaluation suite fuse with the same code, and tests can check the
order on hand-made lists.

Why two fusions: RRF (Cormack et al. 2009) uses ranks only, so it needs no calibration and is
the default (``hybrid``); a convex combination of *normalised scores* (Bruch et al. 2023, "An
Analysis of Fusion Functions for Hybrid Retrieval") keeps how far apart the scores are, which can
beat RRF once its weight is tuned on held-out queries (:func:`choose_weight`).

Conventions, for both fusions of a dense and a BM25 list: ``alpha`` is the weight of the first
(dense) list and ``1 - alpha`` that of the second (BM25). For RRF the weights are ``2 * alpha``
and ``2 * (1 - alpha)``, so ``alpha = 0.5`` is plain RRF, score for score.

The rerank stage fuses the same way (:func:`interpolate`): a cross-encoder trained on little data
is weak, and interpolating its normalised score with the first stage's (``rerank_weight``) lets
a weight chosen on held-out queries (:func:`choose_rerank_weight`) fall back towards the first
stage instead of replacing it, so the reranked list need not be worse than the one it reorders.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Mapping, Sequence

Ranked = Sequence[tuple[str, float]]
FUSIONS = ("rrf", "convex")
NORMS = ("minmax", "zscore")
RRF_K = 60
DEFAULT_GRID = tuple(i / 10 for i in range(11))


def normalize(ranked: Ranked, method: str = "minmax") -> dict[str, float]:
    """Scores of one list on a common scale: ``minmax`` maps them to [0, 1] (a list whose scores
    are all equal maps to 1.0: they are all its best), ``zscore`` to mean 0 and unit standard
    deviation (all equal: 0.0). Cosine similarities and BM25 scores live on different scales;
    adding them raw would let BM25 dominate."""
    if method not in NORMS:
        raise ValueError(f"norm must be one of {', '.join(NORMS)}, not {method!r}")
    scores = {d: float(s) for d, s in ranked}
    if not scores:
        return {}
    values = list(scores.values())
    if method == "minmax":
        lo, hi = min(values), max(values)
        if hi == lo:
            return dict.fromkeys(scores, 1.0)
        return {d: (s - lo) / (hi - lo) for d, s in scores.items()}
    mean, sd = statistics.fmean(values), statistics.pstdev(values)
    if sd == 0:
        return dict.fromkeys(scores, 0.0)
    return {d: (s - mean) / sd for d, s in scores.items()}


def _check_weights(lists: Sequence[Ranked], weights: Sequence[float]) -> None:
    if len(lists) != len(weights):
        raise ValueError(f"{len(lists)} ranked lists but {len(weights)} weights")
    if any(w < 0 or math.isnan(w) for w in weights):
        raise ValueError(f"fusion weights must be non-negative numbers, not {list(weights)}")


def weighted_rrf(
    lists: Sequence[Ranked], weights: Sequence[float] | None = None, k: int = RRF_K
) -> list[tuple[str, float]]:
    """score(d) = sum over lists of weight / (k + rank), rank from 1; scores are ignored. Ties
    keep first-seen order (as :func:`rag.retrieval.engine.rrf`), so weights of 1 reproduce it exactly."""
    weights = [1.0] * len(lists) if weights is None else list(weights)
    _check_weights(lists, weights)
    fused: dict[str, float] = {}
    for ranked, w in zip(lists, weights):
        for rank, (doc, _) in enumerate(ranked, start=1):
            fused[doc] = fused.get(doc, 0.0) + w / (k + rank)
    return sorted(fused.items(), key=lambda kv: -kv[1])


def convex(
    lists: Sequence[Ranked], weights: Sequence[float], norm: str = "minmax"
) -> list[tuple[str, float]]:
    """score(d) = sum over lists of weight * normalised score. A document missing from a list
    gets that list's lowest normalised value (0 under min-max): a retriever that did not return
    it in its top-n ranks it at best last. Ties go to the order of the most-weighted list, then
    the next, so a weight of 1 on one list (0 on the others) returns exactly that list's order,
    followed by the documents only the others found."""
    _check_weights(lists, weights)
    normed = [normalize(r, norm) for r in lists]
    floor = [min(n.values(), default=0.0) if norm == "zscore" else 0.0 for n in normed]
    docs: dict[str, None] = {}
    for r in lists:
        docs.update((d, None) for d, _ in r)
    fused = {d: sum(w * n.get(d, f) for w, n, f in zip(weights, normed, floor) if w) for d in docs}
    ranks = [{d: i for i, (d, _) in enumerate(r)} for r in lists]
    priority = sorted(range(len(lists)), key=lambda i: -weights[i])
    inf = float("inf")
    return sorted(
        fused.items(), key=lambda kv: (-kv[1], *(ranks[i].get(kv[0], inf) for i in priority))
    )


def fuse(
    dense: Ranked,
    sparse: Ranked,
    fusion: str = "rrf",
    alpha: float = 0.5,
    norm: str = "minmax",
    k: int = RRF_K,
) -> list[tuple[str, float]]:
    """The hybrid mode's fusion of a dense and a BM25 list (``alpha``: weight of dense)."""
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha must be in [0, 1], not {alpha}")
    if fusion == "rrf":
        return weighted_rrf([dense, sparse], [2 * alpha, 2 * (1 - alpha)], k)
    if fusion == "convex":
        return convex([dense, sparse], [alpha, 1 - alpha], norm)
    raise ValueError(f"fusion must be one of {', '.join(FUSIONS)}, not {fusion!r}")


def check_rerank_weight(weight: float) -> None:
    """Reject a rerank weight outside [0, 1] (NaN too), naming the value: outside that range
    the interpolation would reward a low reranker or first-stage score."""
    if not 0.0 <= weight <= 1.0:
        raise ValueError(f"--rerank-weight must be in [0, 1], not {weight}")


def interpolate(
    first: Ranked, rerank_scores: Sequence[float], weight: float, norm: str = "minmax"
) -> list[tuple[str, float]]:
    """The reranked head: ``weight * norm(rerank) + (1 - weight) * norm(first)`` per document,
    best first. ``first`` is the head of the first-stage list (best first, unique ids) and
    ``rerank_scores[i]`` the reranker's score of ``first[i]``; ``norm`` as :func:`normalize`.

    Ties, deterministic: the reranker's order (its score, then first-stage rank) when
    ``weight >= 0.5``, else the first-stage rank first (:func:`convex`'s rule). So weight 1 is
    exactly the reranker's order (equal reranker scores keep first-stage order, as the stage
    always did) and weight 0 exactly the first-stage order. At those two ends the scores are the
    chosen side's own (raw reranker logits at 1, as before interpolation existed; first-stage
    scores at 0); in between they are the interpolated normalised scores."""
    check_rerank_weight(weight)
    head = [(d, float(s)) for d, s in first]
    if len(rerank_scores) != len(head):
        raise ValueError(f"{len(head)} first-stage results but {len(rerank_scores)} rerank scores")
    if len({d for d, _ in head}) != len(head):
        raise ValueError("interpolate needs unique ids in the first-stage list")
    order = sorted(range(len(head)), key=lambda i: (-rerank_scores[i], i))
    reranked = [(head[i][0], float(rerank_scores[i])) for i in order]
    fused = convex([reranked, head], [weight, 1.0 - weight], norm)
    if weight in (0.0, 1.0):
        own = dict(reranked if weight == 1.0 else head)
        fused = [(d, own[d]) for d, _ in fused]
    return fused


def rerank_head(
    first: Ranked, rerank_scores: Sequence[float], weight: float, norm: str = "minmax"
) -> list[tuple[str, float]]:
    """The whole list after the rerank stage: its first ``len(rerank_scores)`` entries by
    :func:`interpolate`, then the rest in first-stage order with scores below the lowest of the
    head (``floor - 1``, ``floor - 2``, ...), since evaluators sort by score."""
    first = list(first)
    m = len(rerank_scores)
    head = interpolate(first[:m], rerank_scores, weight, norm)
    floor = min((s for _, s in head), default=0.0)
    return head + [(d, floor - j) for j, (d, _) in enumerate(first[m:], start=1)]


def _best_weight(scores: Mapping[float, float]) -> float:
    """The grid value with the best metric; ties go nearest 0.5 (the least one-sided), then to
    the smaller value, so a flat curve never picks an extreme by accident."""
    best = max(scores.values())
    return min((w for w, s in scores.items() if s == best), key=lambda w: (abs(w - 0.5), w))


def ndcg_at_k(
    qrels: Mapping[str, Mapping[str, int]], run: Mapping[str, Ranked], k: int = 10
) -> float:
    """Mean nDCG@k over the judged queries (gain = grade, discount log2(rank + 1), as trec_eval's
    ndcg_cut); a judged query missing from ``run`` scores 0. Here so that choosing a weight
    needs nothing beyond this module; the reported numbers come from :mod:`rag.evaluation.metrics`."""
    judged = [q for q, docs in qrels.items() if any(g > 0 for g in docs.values())]
    if not judged:
        return 0.0
    total = 0.0
    for q in judged:
        grades = qrels[q]
        dcg = sum(
            grades.get(d, 0) / math.log2(i + 2) for i, (d, _) in enumerate(list(run.get(q, []))[:k])
        )
        ideal = sorted((g for g in grades.values() if g > 0), reverse=True)[:k]
        total += dcg / sum(g / math.log2(i + 2) for i, g in enumerate(ideal))
    return total / len(judged)


def choose_weight(
    dense_runs: Mapping[str, Ranked],
    sparse_runs: Mapping[str, Ranked],
    qrels: Mapping[str, Mapping[str, int]],
    fusion: str = "convex",
    norm: str = "minmax",
    grid: Sequence[float] = DEFAULT_GRID,
    metric: Callable[[Mapping[str, Mapping[str, int]], dict[str, Ranked]], float] | None = None,
) -> tuple[float, dict[float, float]]:
    """Pick ``alpha`` for :func:`fuse` on held-out queries: the grid value with the best
    ``metric`` (default nDCG@10) over ``qrels``' queries. Returns (alpha, {alpha: metric}).
    Ties go to the value nearest 0.5 (the least one-sided), then the smaller one. Choose on a
    split other than the one reported, or the reported number is tuned on its own test."""
    if not grid:
        raise ValueError("choose_weight needs a non-empty grid of weights")
    metric = metric or ndcg_at_k
    qids = [q for q in qrels if q in dense_runs or q in sparse_runs]
    scores = {}
    for alpha in grid:
        run = {
            q: fuse(dense_runs.get(q, []), sparse_runs.get(q, []), fusion, alpha, norm)
            for q in qids
        }
        scores[float(alpha)] = metric({q: qrels[q] for q in qids}, run)
    return _best_weight(scores), scores


def choose_rerank_weight(
    first_runs: Mapping[str, Ranked],
    rerank_scores: Mapping[str, Sequence[float]],
    qrels: Mapping[str, Mapping[str, int]],
    norm: str = "minmax",
    grid: Sequence[float] = DEFAULT_GRID,
    metric: Callable[[Mapping[str, Mapping[str, int]], dict[str, Ranked]], float] | None = None,
) -> tuple[float, dict[float, float]]:
    """Pick ``rerank_weight`` on held-out queries, as :func:`choose_weight` picks ``alpha``:
    ``first_runs[q]`` is a query's first-stage list and ``rerank_scores[q]`` the reranker's
    scores of its head (the first ``len`` entries), computed once by the caller; every grid
    weight re-sorts those cached scores (:func:`rerank_head`), so tuning costs one reranker
    pass, not one per weight. Returns (weight, {weight: metric}); ties as :func:`choose_weight`."""
    if not grid:
        raise ValueError("choose_rerank_weight needs a non-empty grid of weights")
    metric = metric or ndcg_at_k
    qids = [q for q in qrels if q in first_runs]
    scores = {}
    for weight in grid:
        run = {q: rerank_head(first_runs[q], rerank_scores[q], weight, norm) for q in qids}
        scores[float(weight)] = metric({q: qrels[q] for q in qids}, run)
    return _best_weight(scores), scores


def check_fusion(fusion: str, alpha: float, norm: str) -> None:
    """Reject unknown fusion settings early, with the flag's name in the message."""
    if fusion not in FUSIONS:
        raise ValueError(f"--fusion must be one of {', '.join(FUSIONS)}, not {fusion!r}")
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"--alpha must be in [0, 1], not {alpha}")
    if norm not in NORMS:
        raise ValueError(f"--norm must be one of {', '.join(NORMS)}, not {norm!r}")
