"""The relevance gate: drop retrieved hits too weak to ground an answer (rag.pipeline, step 3).

A module of its own so the pipeline keeps to the answer path; the pipeline calls
:func:`relevant_hits`.
"""

from __future__ import annotations

from collections.abc import Sequence

from rag.types import Hit

# Relevance thresholds on Hit.score when RAGConfig.min_score is None. Dense scores are cosine
# similarities (unrelated text scores ~0.0-0.15 with MiniLM); a BM25 score is > 0 as soon as
# one query term matches; hybrid (RRF) scores carry no absolute relevance, so a hybrid list
# passes when any of its hits passes the dense or BM25 rule (see `hybrid_is_relevant`).
DEFAULT_MIN_SCORE = {"dense": 0.2, "bm25": 1e-6, "hybrid": 0.0}


def relevant_hits(hits: Sequence[Hit], mode: str, min_score: float | None = None) -> list[Hit]:
    """The hits that pass the relevance threshold for ``mode`` (in their original order)."""
    # Reranked hits carry cross-encoder logits, not cosine/BM25 scores: judge them like a fused
    # list, by the dense/BM25 component scores they keep.
    if min_score is None and (mode == "hybrid" or any(h.mode == "rerank" for h in hits)):
        return list(hits) if hybrid_is_relevant(hits) else []
    threshold = DEFAULT_MIN_SCORE.get(mode, 0.0) if min_score is None else min_score
    return [h for h in hits if h.score >= threshold]


def hybrid_is_relevant(hits: Sequence[Hit]) -> bool:
    """A fused list is relevant when any hit carries a passing dense or BM25 component score.

    Retrievers may attach the component scores of a fused hit as ``dense_score`` /
    ``bm25_score`` attributes; without them any non-empty list counts as relevant.
    """
    if not hits:
        return False
    parts = [(getattr(h, "dense_score", None), getattr(h, "bm25_score", None)) for h in hits]
    if all(d is None and b is None for d, b in parts):
        return True
    return any(
        (d is not None and d >= DEFAULT_MIN_SCORE["dense"])
        or (b is not None and b >= DEFAULT_MIN_SCORE["bm25"])
        for d, b in parts
    )
