"""Fusion as pure functions (documented orders on hand-made lists, alpha = 1/0 = one input,
weight choice) and its wiring into the hybrid mode, as the retrieval settings say."""

from __future__ import annotations

import math
import random

import pytest

from rag.retrieval.fusion import (
    choose_weight,
    convex,
    fuse,
    ndcg_at_k,
    normalize,
    weighted_rrf,
)
from rag.retrieval.settings import RetrievalSettings

DENSE = [("a", 0.9), ("b", 0.5), ("c", 0.1)]
BM25 = [("c", 10.0), ("d", 8.0), ("a", 2.0)]


def ids(ranked) -> list[str]:
    return [d for d, _ in ranked]


def test_normalize():
    assert normalize(DENSE) == pytest.approx({"a": 1.0, "b": 0.5, "c": 0.0})
    assert normalize(BM25) == pytest.approx({"c": 1.0, "d": 0.75, "a": 0.0})
    assert normalize([("x", 3.0), ("y", 3.0)]) == {"x": 1.0, "y": 1.0}  # all equally best
    z = normalize(DENSE, "zscore")
    assert sum(z.values()) == pytest.approx(0.0)
    assert sum(v * v for v in z.values()) / 3 == pytest.approx(1.0)
    assert normalize([], "zscore") == {}
    with pytest.raises(ValueError, match="norm"):
        normalize(DENSE, "rank")


def test_convex_documented_order():
    # a = .5*1 + .5*0 = .5 ; b = .5*.5 + 0 (missing from BM25) = .25 ; c = 0 + .5 = .5 ;
    # d = 0 (missing from dense) + .5*.75 = .375. a and c tie: equal weights, so the first
    # list's order decides (a before c).
    fused = convex([DENSE, BM25], [0.5, 0.5])
    assert ids(fused) == ["a", "c", "d", "b"]
    assert dict(fused) == pytest.approx({"a": 0.5, "b": 0.25, "c": 0.5, "d": 0.375})


@pytest.mark.parametrize("norm", ["minmax", "zscore"])
def test_convex_with_alpha_one_or_zero_is_its_single_input(norm):
    only_dense = fuse(DENSE, BM25, "convex", alpha=1.0, norm=norm)
    assert ids(only_dense)[:3] == ids(DENSE) and ids(only_dense)[3:] == ["d"]
    only_bm25 = fuse(DENSE, BM25, "convex", alpha=0.0, norm=norm)
    assert ids(only_bm25)[:3] == ids(BM25) and ids(only_bm25)[3:] == ["b"]
    # also on random lists with many ties and partial overlap
    rng = random.Random(0)
    for _ in range(50):
        a = [(f"d{i}", float(rng.randint(0, 3))) for i in rng.sample(range(12), 6)]
        b = [(f"d{i}", float(rng.randint(0, 3))) for i in rng.sample(range(12), 6)]
        a.sort(key=lambda x: -x[1])
        b.sort(key=lambda x: -x[1])
        assert ids(fuse(a, b, "convex", 1.0, norm))[: len(a)] == ids(a)
        assert ids(fuse(a, b, "convex", 0.0, norm))[: len(b)] == ids(b)


def rrf(rankings: list[list[str]], k: int = 60) -> list[tuple[str, float]]:
    """Plain reciprocal rank fusion (Cormack et al. 2009), written out as the reference:
    score(d) = sum of 1 / (k + rank), rank from 1, ties in first-seen order."""
    scores: dict[str, float] = {}
    for ranking in rankings:
        for rank, doc in enumerate(ranking, start=1):
            scores[doc] = scores.get(doc, 0.0) + 1.0 / (k + rank)
    return sorted(scores.items(), key=lambda kv: -kv[1])


def test_weighted_rrf_and_plain_rrf():
    fused = weighted_rrf([DENSE, BM25])
    assert fused == rrf([ids(DENSE), ids(BM25)])  # weights of 1 = plain RRF, score for score
    assert fuse(DENSE, BM25, "rrf", 0.5) == fused  # alpha 0.5 = plain RRF
    # documented order: a (1/61 + 1/63) and c (1/63 + 1/61) tie, as do b and d (1/62 each);
    # ties keep first-seen order (the dense list is read first): a, c, then b, d.
    assert ids(fused) == ["a", "c", "b", "d"]
    assert dict(fused)["d"] == pytest.approx(1 / 62)
    heavy = weighted_rrf([DENSE, BM25], [3.0, 1.0])
    assert dict(heavy)["b"] == pytest.approx(3 / 62) and ids(heavy)[0] == "a"
    assert ids(fuse(DENSE, BM25, "rrf", 1.0))[:3] == ids(DENSE)
    assert ids(fuse(DENSE, BM25, "rrf", 0.0))[:3] == ids(BM25)
    with pytest.raises(ValueError, match="weights"):
        weighted_rrf([DENSE, BM25], [1.0])
    with pytest.raises(ValueError, match="alpha"):
        fuse(DENSE, BM25, "rrf", 1.5)
    with pytest.raises(ValueError, match="fusion"):
        fuse(DENSE, BM25, "max")


def test_ndcg_matches_pytrec_eval():
    from rag.evaluation.metrics import retrieval_metrics

    qrels = {"q1": {"a": 2, "d": 1}, "q2": {"x": 1}, "q3": {"b": 1}}
    run = {"q1": [("c", 3.0), ("a", 2.0), ("b", 1.0), ("d", 0.5)], "q2": [("y", 1.0)]}
    expected = retrieval_metrics(qrels, {q: dict(r) for q, r in run.items()})["ndcg@10"]
    assert ndcg_at_k(qrels, run) == pytest.approx(expected)
    assert ndcg_at_k({"q": {"a": 1}}, {"q": [("a", 1.0)]}) == 1.0
    assert ndcg_at_k({"q": {"a": 1}}, {"q": [("b", 1.0), ("a", 0.5)]}) == pytest.approx(
        1 / math.log2(3)
    )


def test_choose_weight_picks_the_better_side():
    dense = {"q": [("x", 0.9), ("y", 0.8)]}
    bm25 = {"q": [("y", 5.0), ("x", 1.0)]}
    # x relevant: every alpha >= 0.5 puts x first (0.5 by the tie rule); ties go nearest 0.5
    alpha, scores = choose_weight(dense, bm25, {"q": {"x": 1}})
    assert alpha == 0.5 and scores[1.0] == scores[0.5] == 1.0 and scores[0.0] < 1.0
    # y relevant: only alpha < 0.5 puts y first; the nearest to 0.5 of those is 0.4
    alpha, scores = choose_weight(dense, bm25, {"q": {"y": 1}})
    assert alpha == 0.4 and scores[0.0] == 1.0 and scores[0.5] < 1.0
    alpha, _ = choose_weight(dense, bm25, {"q": {"y": 1}}, fusion="rrf", grid=[0.2, 0.8])
    assert alpha == 0.2
    with pytest.raises(ValueError, match="grid"):
        choose_weight(dense, bm25, {"q": {"y": 1}}, grid=[])


# ---------------------------------------------------------------------------- engine wiring

CORPUS = {
    "d1": "reading a file line by line with a for loop over the file object",
    "d2": "exceptions are handled with try and except clauses",
    "d3": "zebras have black and white stripes",
    "d4": "the with statement closes a file automatically",
    "d5": "lists, tuples and dictionaries are built-in containers",
    "d6": "a file object is closed by the with statement or by close",
}


@pytest.fixture(scope="module")
def hybrid(tmp_path_factory):
    from training_support import tiny_sentence_transformer

    from rag.retrieval.retriever import CorpusRetriever

    st = tiny_sentence_transformer(tmp_path_factory.mktemp("fusion_enc"))
    return CorpusRetriever(
        list(CORPUS), list(CORPUS.values()), st, RetrievalSettings(mode="hybrid", device="cpu")
    )


def test_hybrid_fuses_as_the_settings_say(hybrid):
    """The default settings fuse by convex fusion at alpha 0.5 (the product's, RAGConfig's);
    ``fusion="rrf"`` at the same alpha is plain RRF, score for score."""
    queries = ["file with statement close", "zebras stripes", "try except"]
    S = hybrid.engine.settings
    dense = hybrid.search_many(queries, 100, "dense")
    sparse = hybrid.search_many(queries, 100, "bm25")
    assert hybrid.engine.settings.fusion == "convex" and hybrid.engine.settings.alpha == 0.5
    for row, d, b in zip(hybrid.search_many(queries, 5, "hybrid"), dense, sparse):
        assert row == fuse(d, b, "convex", 0.5)[:5]
    for row, d, b in zip(
        hybrid.search_many(queries, 5, "hybrid", settings=S.replace(fusion="rrf")), dense, sparse
    ):
        assert row == rrf([ids(d), ids(b)])[:5]


def test_hybrid_fusion_options(hybrid):
    """Per-call settings, passed whole, change the fusion; bad ones are refused by name."""
    q = ["file with statement close"]
    S = hybrid.engine.settings
    dense = hybrid.search_many(q, 6, "dense")[0]
    sparse = hybrid.search_many(q, 6, "bm25")[0]
    assert ids(hybrid.search_many(q, 6, "hybrid", settings=S.replace(alpha=1.0))[0]) == ids(dense)
    only_bm25 = hybrid.search_many(q, 6, "hybrid", settings=S.replace(alpha=0.0))[0]
    assert ids(only_bm25)[: len(sparse)] == ids(sparse)
    convex_row = hybrid.search_many(q, 6, "hybrid", settings=S.replace(alpha=0.5))[0]
    assert convex_row == fuse(dense, sparse, "convex", 0.5)[:6]
    with pytest.raises(ValueError, match="--fusion"):
        S.replace(fusion="max")
    with pytest.raises(ValueError, match="--alpha"):
        S.replace(alpha=2.0)
