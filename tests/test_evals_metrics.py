"""Metric functions against values computed by hand."""

from __future__ import annotations

import math

import pytest

from rag.evaluation.metrics import (
    citation_accuracy,
    exact_match,
    exclude_self_hits,
    f1_score,
    normalize_answer,
    per_query_retrieval,
    refusal_rate,
    retrieval_metrics,
    squad_scores,
)

QRELS = {"q1": {"d1": 1, "d3": 1}, "q2": {"d2": 1}}
# q1: relevant docs at ranks 2 and 3; q2 is absent from the run (must count as 0, not vanish).
RUN = {"q1": {"d2": 3.0, "d1": 2.0, "d3": 1.0}}


def test_retrieval_metrics_hand_computed():
    m = retrieval_metrics(QRELS, RUN)
    dcg = 1 / math.log2(3) + 1 / math.log2(4)
    idcg = 1 + 1 / math.log2(3)
    assert m["ndcg@10"] == pytest.approx(dcg / idcg / 2, abs=1e-4)
    assert m["mrr@10"] == pytest.approx(0.5 / 2)
    assert m["recall@10"] == pytest.approx(1.0 / 2)
    assert m["recall@100"] == pytest.approx(1.0 / 2)
    assert m["map@100"] == pytest.approx((1 / 2 + 2 / 3) / 2 / 2, abs=1e-4)


def test_perfect_run_scores_one():
    run = {"q1": {"d1": 2.0, "d3": 1.0}, "q2": {"d2": 5.0, "d1": 1.0}}
    m = retrieval_metrics(QRELS, run)
    assert all(v == pytest.approx(1.0) for v in m.values())


def test_mrr_is_cut_at_ten_but_recall_at_100_is_not():
    # The only relevant doc sits at rank 11.
    run = {"q": {f"n{i:02d}": 100.0 - i for i in range(10)} | {"rel": 1.0}}
    pq = per_query_retrieval({"q": {"rel": 1}}, run)
    assert pq["mrr@10"]["q"] == 0.0
    assert pq["recall@10"]["q"] == 0.0
    assert pq["recall@100"]["q"] == 1.0
    assert pq["map@100"]["q"] == pytest.approx(1 / 11, abs=1e-4)


def test_graded_relevance_ndcg():
    # Grade 2 at rank 2, grade 1 at rank 1: DCG = 1 + 2/log2(3); ideal = 2 + 1/log2(3).
    pq = per_query_retrieval({"q": {"a": 1, "b": 2}}, {"q": {"a": 2.0, "b": 1.0}})
    expect = (1 + 2 / math.log2(3)) / (2 + 1 / math.log2(3))
    assert pq["ndcg@10"]["q"] == pytest.approx(expect, abs=1e-4)


def test_unknown_metric_is_an_error():
    with pytest.raises(ValueError, match="unknown metric"):
        retrieval_metrics(QRELS, RUN, ["p@5"])


def test_exclude_self_hits():
    assert exclude_self_hits({"q1": {"q1": 9.0, "d1": 1.0}}) == {"q1": {"d1": 1.0}}


def test_normalize_answer_official_rules():
    assert normalize_answer("The  Denver Broncos!") == "denver broncos"
    assert normalize_answer("an apple, a pear") == "apple pear"
    assert normalize_answer("Theory") == "theory"  # 'the' only as a word


def test_exact_match_and_f1_take_the_best_gold():
    gold = ["Denver Broncos", "the Broncos"]
    assert exact_match("broncos.", gold) == 1.0
    assert exact_match("Denver", gold) == 0.0
    # "Denver" vs "denver broncos": P=1, R=1/2 -> F1 = 2/3.
    assert f1_score("Denver", gold) == pytest.approx(2 / 3)
    # "the Denver team" -> ["denver", "team"] vs ["denver", "broncos"]: P=R=1/2 -> 1/2.
    assert f1_score("the Denver team", gold) == pytest.approx(0.5)
    assert f1_score("nothing here", gold) == 0.0


def test_squad_scores_mean_and_length_check():
    s = squad_scores(["Denver Broncos", "Paris"], [["Denver Broncos"], ["London"]])
    assert s == {"em": 0.5, "f1": 0.5}
    with pytest.raises(ValueError):
        squad_scores(["a"], [])


def test_citation_accuracy_and_refusal_rate():
    # correct; cites a wrong passage too; cites nothing; correct among several gold.
    cited = [[2], [2, 3], [], [1]]
    gold = [2, 2, 2, [1, 3]]
    assert citation_accuracy(cited, gold) == pytest.approx(2 / 4)
    assert refusal_rate([True, False, False, False]) == 0.25
    assert refusal_rate([]) == 0.0
