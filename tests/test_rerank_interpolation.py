"""Rerank interpolation: ``rerank_weight * norm(rerank) + (1 - rerank_weight) * norm(first)``.

Hand-made lists pin the documented order at weights 0, 1 and in between (ties included); the
engine, both retrievers, RAGConfig and evals.retrieval thread the weight through, refuse one
outside [0, 1] naming the value, and choosing it on tuning queries picks the nDCG maximiser from
one cached reranker pass. Fake rerankers only: nothing here loads a model but the tiny encoder.
"""

from __future__ import annotations

import json
import math

import pytest

from rag.config import ConfigError, RAGConfig, load_config
from rag.retrieval.engine import SearchEngine
from rag.retrieval.fusion import choose_rerank_weight, interpolate, rerank_head
from rag.retrieval.retriever import CorpusRetriever
from rag.retrieval.settings import RetrievalSettings

FIRST = [("a", 10.0), ("b", 9.0), ("c", 0.0)]  # min-max: a 1, b 0.9, c 0
RERANK = [0.0, 5.0, 10.0]  # min-max: a 0, b 0.5, c 1


def ids(ranked):
    return [d for d, _ in ranked]


# ---------------------------------------------------------------------------- the pure function


def test_weight_one_is_the_reranker_order_with_its_raw_scores():
    assert interpolate(FIRST, RERANK, 1.0) == [("c", 10.0), ("b", 5.0), ("a", 0.0)]
    # equal reranker scores keep the first-stage order (as the rerank stage always did)
    assert ids(interpolate(FIRST, [1.0, 1.0, 0.0], 1.0)) == ["a", "b", "c"]
    assert ids(interpolate(FIRST, [0.0, 1.0, 1.0], 1.0)) == ["b", "c", "a"]


def test_weight_zero_is_the_first_stage_order_with_its_scores():
    assert interpolate(FIRST, RERANK, 0.0) == FIRST
    tied = [("a", 1.0), ("b", 1.0), ("c", 1.0)]
    assert interpolate(tied, [0.0, 1.0, 2.0], 0.0) == tied  # ties keep first-stage order


def test_weight_between_mixes_normalised_scores_and_breaks_ties_by_the_heavier_side():
    # 0.5: a 0.5, b 0.45 + 0.25 = 0.7, c 0.5; a and c tie -> the reranker's order (c first)
    got = interpolate(FIRST, RERANK, 0.5)
    assert ids(got) == ["b", "c", "a"]
    assert [s for _, s in got] == pytest.approx([0.7, 0.5, 0.5])
    # 0.4: a 0.6, b 0.54 + 0.2 = 0.74, c 0.4
    got = interpolate(FIRST, RERANK, 0.4)
    assert ids(got) == ["b", "a", "c"] and got[0][1] == pytest.approx(0.74)
    # below 0.5 a tie goes to the first stage: p (1, 0.25) and q (0.5, 1) both score 0.7 at 0.4
    tie = interpolate([("p", 1.0), ("q", 0.5), ("z", 0.0)], [0.25, 1.0, 0.0], 0.4)
    assert tie == [("p", 0.7), ("q", 0.7), ("z", 0.0)]
    assert ids(interpolate([("a", 1.0), ("b", 0.0)], [0.0, 1.0], 0.5)) == ["b", "a"]
    # z-score keeps the endpoints exact too
    for w, want in ((0.0, ["a", "b", "c"]), (1.0, ["c", "b", "a"])):
        assert ids(interpolate(FIRST, RERANK, w, norm="zscore")) == want


def test_rerank_head_keeps_the_tail_below_in_first_stage_order():
    first = [*FIRST, ("d", -1.0), ("e", -2.0)]
    got = rerank_head(first, RERANK, 1.0)
    assert ids(got) == ["c", "b", "a", "d", "e"]
    assert [s for _, s in got[3:]] == [-1.0, -2.0]  # floor 0.0 (a's logit) - 1, - 2
    assert rerank_head([], [], 0.3) == []


@pytest.mark.parametrize("weight", [1.5, -0.1, math.nan])
def test_a_weight_outside_zero_one_is_refused_naming_it(weight):
    with pytest.raises(ValueError, match=rf"rerank-weight must be in \[0, 1\], not {weight}"):
        interpolate(FIRST, RERANK, weight)


def test_mismatched_or_duplicate_inputs_are_refused():
    with pytest.raises(ValueError, match="3 first-stage results but 2 rerank scores"):
        interpolate(FIRST, [1.0, 2.0], 0.5)
    with pytest.raises(ValueError, match="unique"):
        interpolate([("a", 1.0), ("a", 0.5)], [1.0, 2.0], 0.5)


# ---------------------------------------------------------------------------- choosing the weight


def test_choose_rerank_weight_picks_the_ndcg_maximiser():
    """q2 needs weight > 0.23 (d beats c: 0.7 (1 - w) + w > 1 - w), q3 needs weight < 0.35
    (f beats g: 1 - w > 0.45 (1 - w) + w): only 0.3 on the grid gets both right."""
    first = {
        "q2": [("c", 1.0), ("d", 0.7), ("e", 0.0)],
        "q3": [("f", 1.0), ("g", 0.45), ("z", 0.0)],
    }
    scores = {"q2": [0.0, 1.0, 0.5], "q3": [0.0, 1.0, 0.5]}
    qrels = {"q2": {"d": 1}, "q3": {"f": 1}}
    weight, by_weight = choose_rerank_weight(first, scores, qrels)
    assert weight == 0.3 and by_weight[0.3] == 1.0
    assert all(v < 1.0 for w, v in by_weight.items() if w != 0.3) and len(by_weight) == 11
    # a flat curve goes to the middle (choose_weight's tie rule)
    flat, _ = choose_rerank_weight({"q": [("x", 1.0)]}, {"q": [0.0]}, {"q": {"x": 1}})
    assert flat == 0.5
    with pytest.raises(ValueError, match="grid"):
        choose_rerank_weight(first, scores, qrels, grid=[])


# ---------------------------------------------------------------------------- engine and retrievers

CORPUS = {
    "d1": "reading a file line by line with a for loop over the file object",
    "d2": "exceptions are handled with try and except clauses",
    "d4": "the with statement closes a file automatically",
    "d6": "a file object is closed by the with statement or by close",
    "d7": "file",
}


class ByLength:
    """Fake reranker: shorter passages score higher (unlike BM25 here)."""

    def __init__(self) -> None:
        self.calls = 0

    def score(self, query: str, texts: list[str]) -> list[float]:
        self.calls += 1
        return [-float(len(t)) for t in texts]


def _by_length(first_ids):
    return sorted(first_ids, key=lambda d: (len(CORPUS[d]), first_ids.index(d)))


def test_corpus_retriever_weight_zero_is_first_stage_one_is_reranker():
    ids_, texts = list(CORPUS), list(CORPUS.values())
    q = "file with statement"
    plain = CorpusRetriever(ids_, texts, None, RetrievalSettings(mode="bm25")).search(q, k=5)
    assert len(plain) >= 3 and _by_length(ids(plain)) != ids(plain)  # the reranker disagrees
    zero = CorpusRetriever(
        ids_, texts, None, RetrievalSettings(mode="bm25", rerank_weight=0.0), reranker=ByLength()
    )
    assert zero.search(q, k=5) == plain  # ids and scores: the first stage untouched
    default = CorpusRetriever(
        ids_, texts, None, RetrievalSettings(mode="bm25"), reranker=ByLength()
    )
    assert (
        default.engine.settings.rerank_weight == RAGConfig().retrieval.rerank_weight == 0.5
    )  # the product's
    one = CorpusRetriever(
        ids_, texts, None, RetrievalSettings(mode="bm25", rerank_weight=1.0), reranker=ByLength()
    )
    assert ids(one.search(q, k=5)) == _by_length(ids(plain))

    def weight(r, w):  # a per-call override: the settings, whole, with another weight
        return r.engine.settings.replace(rerank_weight=w)

    assert ids(one.search(q, k=5, settings=weight(one, 0.0))) == ids(plain)
    assert ids(zero.search(q, k=5, settings=weight(zero, 1.0))) == _by_length(ids(plain))
    half = zero.search(q, k=5, settings=weight(zero, 0.5))
    assert sorted(ids(half)) == sorted(ids(plain))
    scores = [s for _, s in half]
    assert scores == sorted(scores, reverse=True) and all(0 <= s <= 1 for s in scores)
    with pytest.raises(ValueError, match="not 1.5"):
        weight(one, 1.5)
    with pytest.raises(ValueError, match="not -1"):
        CorpusRetriever(ids_, texts, None, RetrievalSettings(mode="bm25", rerank_weight=-1))


def test_engine_head_and_tail_with_a_partial_rerank_depth():
    ids_, texts = list(CORPUS), list(CORPUS.values())
    plain = ids(
        CorpusRetriever(ids_, texts, None, RetrievalSettings(mode="bm25")).search(
            "file with statement", k=5
        )
    )
    r = CorpusRetriever(
        ids_,
        texts,
        None,
        RetrievalSettings(mode="bm25", rerank_depth=2, rerank_weight=1.0),
        reranker=ByLength(),
    )
    rows = r.engine.search_many(["file with statement"], k=5, mode="bm25")[0]
    assert [x.id for x in rows] == _by_length(plain[:2]) + plain[2:]
    assert [x.mode for x in rows] == ["rerank"] * 2 + ["bm25"] * (len(plain) - 2)
    assert rows[0].bm25 is not None  # component scores kept
    with pytest.raises(ValueError, match="not 2"):
        SearchEngine(None, None, None, str, None, RetrievalSettings(rerank_weight=2))


def test_index_retriever_takes_the_weight(tmp_path, tiny_mlm_dir):
    from ingest_support import write_docs

    from rag.ingest import ingest
    from rag.retrieval.retriever import Retriever

    write_docs(tmp_path / "docs", {f"{k}.txt": v for k, v in CORPUS.items()})
    ingest([tmp_path / "docs"], index="rw", encoder=str(tiny_mlm_dir), progress=False)
    q = "file with statement"
    plain = [h.chunk.id for h in Retriever.from_settings("rw").search(q, k=5, mode="bm25")]
    r = Retriever("rw", RetrievalSettings(rerank_weight=0.0), reranker=ByLength())
    assert r.engine.settings.rerank_weight == 0.0
    assert [h.chunk.id for h in r.search(q, k=5, mode="bm25")] == plain
    length = {h.chunk.id: len(h.chunk.text) for h in r.search(q, k=5, mode="bm25")}
    weight_one = r.settings.replace(rerank_weight=1.0)
    top = [h.chunk.id for h in r.search(q, k=5, mode="bm25", settings=weight_one)]
    assert top == sorted(plain, key=lambda d: (length[d], plain.index(d)))
    with pytest.raises(ValueError, match="not 1.1"):
        Retriever.from_settings("rw", RetrievalSettings(rerank_weight=1.1))


# ---------------------------------------------------------------------------- config


def test_config_field_is_validated_naming_the_value(tmp_path):
    assert RAGConfig().retrieval.rerank_weight == 0.5  # the measured default (docs/retrieval.md)
    path = tmp_path / "rag.toml"
    path.write_text("rerank-weight = 0\n")
    cfg = load_config(path)
    assert cfg.retrieval.rerank_weight == 0.0 and isinstance(cfg.retrieval.rerank_weight, float)
    with pytest.raises(ConfigError, match=r"--rerank-weight must be in \[0, 1\], not 1.5"):
        RAGConfig.of(rerank_weight=1.5)
    path.write_text("rerank_weight = -0.5\n")
    with pytest.raises(ConfigError, match="not -0.5"):
        load_config(path)


# ---------------------------------------------------------------------------- evals.retrieval


def test_evals_rows_per_weight_and_default_tuned_from_one_pass(tmp_path, monkeypatch):
    """An adversarial fake reranker (the relevant passage last): weight 0 reproduces BM25,
    weight 1 loses, ``default`` chosen on the (here: same) queries never loses; tuning calls
    the reranker once per tuning query, not once per grid weight."""
    from test_evals_retrieval import DOCS, QRELS, QUERIES, write_mini_beir

    import rag.retrieval.rerank
    from evals.retrieval import main

    relevant = {QUERIES[q]: f"{DOCS[d][0]} {DOCS[d][1]}" for q, d in QRELS.items()}
    calls = []

    class Adversary:
        def score(self, query, texts):
            calls.append(query)
            return [-1.0 if t == relevant[query] else float(i) for i, t in enumerate(texts)]

    def load(settings):  # the eval's settings name the reranker ("fake": no model to load)
        assert settings.rerank == "fake" and settings.mode == "bm25"
        return Adversary()

    monkeypatch.setattr(rag.retrieval.rerank, "load_reranker", load)
    folder = write_mini_beir(tmp_path / "mini")
    out = tmp_path / "rows.json"
    argv = ["--dataset", str(folder), "--retriever", "bm25", "--rerank", "fake"]
    argv += ["--rerank-weight", "0", "1", "default", "--tune-queries", "all", "--out", str(out)]
    assert main(argv) == 0
    rows = json.loads(out.read_text())
    names = [r["row"] for r in rows]
    assert names[:3] == ["bm25", "bm25+rerank(w=0)", "bm25+rerank(w=1)"]
    assert names[3].startswith("bm25+rerank(w=") and names[3].endswith(" tuned)")
    bm25, zero, one, tuned = (r["metrics"]["ndcg@10"] for r in rows)
    assert zero == bm25 and one < bm25 and tuned == bm25
    tuning = rows[3]["rerank_tuning"]
    assert tuning["rerank_weight"] == rows[3]["config"]["rerank_weight"] < 1.0
    assert len(tuning["ndcg@10_by_weight"]) == 11 and tuning["tuned_on_reported_queries"] is True
    assert rows[1]["rerank_tuning"] is None and rows[1]["config"]["rerank_weight"] == 0.0
    assert rows[0]["config"]["rerank_weight"] is None
    n = len(QUERIES)
    assert len(calls) == 3 * n + n  # three reported rows, plus ONE tuning pass (not eleven)
    assert main([*argv[:6], "--rerank-weight", "1.2"]) == 2
    assert main([*argv[:6], "--rerank-weight", "best"]) == 2
