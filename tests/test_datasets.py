"""Dataset readers: clear errors on bad input, deterministic and disjoint splits."""

from __future__ import annotations

import json

import pytest

from rag.evaluation.datasets import (
    SQUAD_DEV_ARTICLES,
    DatasetError,
    load_beir,
    load_dataset,
    load_squad,
    scifact_split,
    squad_split,
)


def _beir(tmp_path, qrels_rows=("q1\td1\t1", "q2\td2\t1"), corpus_extra=""):
    folder = tmp_path / "beir"
    (folder / "qrels").mkdir(parents=True)
    corpus = [
        {"_id": "d1", "title": "T1", "text": "alpha"},
        {"_id": "d2", "title": "", "text": "beta"},
    ]
    (folder / "corpus.jsonl").write_text(
        "\n".join(json.dumps(r) for r in corpus) + "\n" + corpus_extra
    )
    queries = [
        {"_id": "q1", "text": "what alpha"},
        {"_id": "q2", "text": "what beta"},
        {"_id": "q3", "text": "x"},
    ]
    (folder / "queries.jsonl").write_text("\n".join(json.dumps(r) for r in queries))
    (folder / "qrels" / "test.tsv").write_text(
        "query-id\tcorpus-id\tscore\n" + "\n".join(qrels_rows)
    )
    return folder


def test_load_beir_reads_ids_as_strings_and_keeps_judged_queries(tmp_path):
    ds = load_beir(_beir(tmp_path))
    assert set(ds.queries) == {"q1", "q2"}  # q3 has no qrels
    assert ds.qrels == {"q1": {"d1": 1}, "q2": {"d2": 1}}
    assert ds.doc_text("d1") == "T1 alpha" and ds.doc_text("d2") == "beta"


def test_beir_missing_folder_file_and_split(tmp_path):
    with pytest.raises(DatasetError, match="not a directory"):
        load_beir(tmp_path / "nope")
    folder = _beir(tmp_path)
    with pytest.raises(DatasetError, match=r"dev\.tsv: missing \(splits present: test\)"):
        load_beir(folder, split="dev")
    (folder / "queries.jsonl").unlink()
    with pytest.raises(DatasetError, match=r"queries\.jsonl: missing"):
        load_beir(folder)


def test_beir_bad_json_line_names_file_and_line(tmp_path):
    folder = _beir(tmp_path, corpus_extra="{not json\n")
    with pytest.raises(DatasetError, match=r"corpus\.jsonl:3: bad JSON line"):
        load_beir(folder)


@pytest.mark.parametrize(
    ("row", "what"),
    [("q9\td1\t1", "unknown query id 'q9'"), ("q1\td9\t1", "unknown corpus id 'd9'")],
)
def test_beir_qrels_naming_unknown_ids(tmp_path, row, what):
    with pytest.raises(DatasetError, match=rf"test\.tsv:3: {what}"):
        load_beir(_beir(tmp_path, qrels_rows=("q1\td1\t1", row)))


def test_scifact_split_is_deterministic_disjoint_and_20_percent(tmp_path):
    ds = load_beir(_beir(tmp_path))
    ds.queries = {f"q{i}": "x" for i in range(50)}
    train, dev = scifact_split(ds)
    assert (train, dev) == scifact_split(ds)
    assert not set(train) & set(dev)
    assert set(train) | set(dev) == set(ds.queries)
    assert len(dev) == 10
    assert scifact_split(ds, seed=1)[1] != dev


def _squad(tmp_path, titles=("A", "B", "C")):
    data = {
        "data": [
            {
                "title": t,
                "paragraphs": [
                    {
                        "context": f"{t} context {i}",
                        "qas": [{"id": f"{t}{i}", "question": "q?", "answers": [{"text": "ans"}]}],
                    }
                    for i in range(2)
                ],
            }
            for t in titles
        ]
    }
    path = tmp_path / "squad.json"
    path.write_text(json.dumps(data))
    return path


def test_load_squad_limits_queries_not_corpus(tmp_path):
    path = _squad(tmp_path)
    ds = load_squad(path, articles=["B"])
    assert len(ds.corpus) == 6
    assert set(ds.queries) == {"B0", "B1"}
    assert ds.qrels["B1"] == {"B/1": 1} and ds.answers["B1"] == ["ans"]
    with pytest.raises(DatasetError, match="unknown article"):
        load_squad(path, articles=["Z"])
    assert load_dataset(f"squad:{path}").queries.keys() == load_squad(path).queries.keys()


def test_squad_errors(tmp_path):
    with pytest.raises(DatasetError, match="missing"):
        load_squad(tmp_path / "none.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    with pytest.raises(DatasetError, match="bad JSON"):
        load_squad(bad)
    bad.write_text("[]")
    with pytest.raises(DatasetError, match="not SQuAD"):
        load_squad(bad)


def test_squad_split_fallback_is_fixed_and_disjoint(tmp_path):
    train, dev = squad_split(_squad(tmp_path, titles=tuple("ABCDEFGHIJK")))
    assert dev == ["A", "F", "K"]
    assert not set(train) & set(dev) and len(train) + len(dev) == 11


@pytest.mark.data
def test_shared_splits(shared_data):
    ds = load_beir(shared_data / "scifact", split="train")
    train, dev = scifact_split(ds)
    assert len(dev) == round(len(ds.queries) * 0.2) and not set(train) & set(dev)
    tr, dv = squad_split(shared_data / "squad" / "squad-v1.1-dev-part.json")
    assert sorted(dv) == sorted(SQUAD_DEV_ARTICLES) and not set(tr) & set(dv)
