"""evals.retrieval end to end on a small BEIR folder through rag's CorpusRetriever."""

from __future__ import annotations

import json

import pytest

from evals.retrieval import RetrievalEvalConfig, evaluate, evaluate_modes, load_eval_dataset, main
from rag.evaluation.datasets import DatasetError

DOCS = {
    "d1": ("Python lists", "A list is a mutable sequence; append adds an item at the end."),
    "d2": ("Git branches", "A branch is a movable pointer to a commit; git switch changes branch."),
    "d3": (
        "PostgreSQL indexes",
        "A B-tree index speeds up equality and range queries on a column.",
    ),
    "d4": (
        "Python dictionaries",
        "A dict maps hashable keys to values; lookups are constant time.",
    ),
    "q2": ("Self", "How do I change to another git branch? This document shares the query id."),
}
QUERIES = {
    "q1": "how to append an item to a python list",
    "q2": "how do I change to another git branch",
    "q3": "which index speeds up range queries",
    "q4": "map keys to values in python",
}
QRELS = {"q1": "d1", "q2": "d2", "q3": "d3", "q4": "d4"}


def write_mini_beir(folder):
    """DOCS / QUERIES / QRELS as a BEIR folder (corpus.jsonl, queries.jsonl, qrels/test.tsv)."""
    (folder / "qrels").mkdir(parents=True)
    (folder / "corpus.jsonl").write_text(
        "\n".join(json.dumps({"_id": i, "title": t, "text": x}) for i, (t, x) in DOCS.items())
    )
    (folder / "queries.jsonl").write_text(
        "\n".join(json.dumps({"_id": q, "text": t}) for q, t in QUERIES.items())
    )
    (folder / "qrels" / "test.tsv").write_text(
        "query-id\tcorpus-id\tscore\n" + "\n".join(f"{q}\t{d}\t1" for q, d in QRELS.items())
    )
    return folder


@pytest.fixture
def beir(tmp_path):
    return write_mini_beir(tmp_path / "mini")


def test_bm25_finds_every_answer_and_ignores_self_hits(beir):
    out = evaluate(RetrievalEvalConfig(dataset=str(beir), retriever="bm25"))
    # q2's own id is a document that matches it word for word: excluded as BEIR does.
    assert out["metrics"]["ndcg@10"] == 1.0 and out["metrics"]["mrr@10"] == 1.0
    assert out["n_queries"] == 4 and out["n_docs"] == 5
    assert out["config"]["retriever"] == "bm25" and "corpus_encode_s" in out and "search_s" in out


def test_query_splits_partition_the_queries(beir):
    dev = load_eval_dataset(str(beir), "test", "dev")
    train = load_eval_dataset(str(beir), "test", "train")
    assert not set(dev.queries) & set(train.queries)
    assert set(dev.queries) | set(train.queries) == set(QUERIES)
    with pytest.raises(DatasetError, match="--queries"):
        load_eval_dataset(str(beir), "test", "some")


def test_cli_writes_json_and_fails_clearly(beir, tmp_path, capsys):
    out = tmp_path / "r.json"
    assert main(["--dataset", str(beir), "--retriever", "bm25", "--out", str(out)]) == 0
    assert json.loads(out.read_text())["metrics"]["recall@10"] == 1.0
    assert main(["--dataset", str(tmp_path / "nope"), "--retriever", "bm25"]) == 2
    assert "nope: not a directory" in capsys.readouterr().err


def test_dense_and_hybrid_with_a_tiny_encoder(beir, tmp_path):
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Normalize, Pooling, Transformer
    from transformers import BertConfig, BertModel, BertTokenizerFast

    vocab = tmp_path / "vocab.txt"
    words = sorted(
        {
            w.strip("?;.,").lower()
            for t in list(QUERIES.values()) + [x for _, x in DOCS.values()]
            for w in t.split()
        }
    )
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *words]))
    folder = tmp_path / "enc"
    BertTokenizerFast(vocab_file=str(vocab)).save_pretrained(folder)
    BertModel(
        BertConfig(
            vocab_size=len(words) + 5,
            hidden_size=32,
            num_hidden_layers=1,
            num_attention_heads=2,
            intermediate_size=64,
        )
    ).save_pretrained(folder)
    tr = Transformer(str(folder), max_seq_length=32)
    st = SentenceTransformer(modules=[tr, Pooling(32, "mean"), Normalize()], device="cpu")
    cfg = RetrievalEvalConfig(dataset=str(beir), device="cpu")
    shared = evaluate_modes(cfg, ["bm25", "dense", "hybrid"], encoder=st)  # one index build
    for mode, out in zip(["bm25", "dense", "hybrid"], shared):
        alone = evaluate(
            RetrievalEvalConfig(dataset=str(beir), retriever=mode, device="cpu"), encoder=st
        )
        assert out["metrics"] == alone["metrics"] and out["config"]["retriever"] == mode
        assert out["metrics"]["recall@100"] == 1.0  # 4 real documents: every one is retrieved


def test_dev_queries_split_by_whether_a_train_query_shares_their_target(beir):
    from evals.retrieval import by_target, queries_with_train_targets

    dev = load_eval_dataset(str(beir), "test", "dev")
    train = load_eval_dataset(str(beir), "test", "train")
    cfg = RetrievalEvalConfig(dataset=str(beir), queries="dev")
    assert queries_with_train_targets(cfg, dev) == set()  # every query has its own document
    # a dev query whose document a train query also cites counts as seen
    (t,) = list(train.queries)[:1]
    (d,) = list(dev.queries)[:1]
    shared = dev.subset([d])
    shared.qrels[d] = {**shared.qrels[d], **train.qrels[t]}
    assert queries_with_train_targets(cfg, shared) == {d}
    assert queries_with_train_targets(RetrievalEvalConfig(dataset=str(beir)), dev) is None

    got = by_target({"a": 1.0, "b": 0.5, "c": 0.0}, {"a", "b"})
    assert got == {"seen": {"ndcg@10": 0.75, "n": 2}, "unseen": {"ndcg@10": 0.0, "n": 1}}
    assert by_target({"a": 1.0}, None) is None
    out = evaluate(RetrievalEvalConfig(dataset=str(beir), retriever="bm25", queries="dev"))
    assert out["ndcg@10_by_target"]["unseen"]["n"] == out["n_queries"]
    assert set(out["per_query_ndcg@10"]) == set(dev.queries)
