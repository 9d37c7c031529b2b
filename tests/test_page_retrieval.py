"""evals.page_retrieval: the answering page's rank per mode over a real (tiny) index."""

from __future__ import annotations

import json

import pytest
from ingest_support import write_docs

from evals.page_retrieval import load_page_questions, main
from rag.ingest import ingest


def write_rows(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return str(path)


def test_ranks_hit_and_mrr_per_mode(tmp_path, tiny_mlm_dir):
    ingest(
        [str(write_docs(tmp_path / "docs"))],
        index="pages",
        encoder=str(tiny_mlm_dir),
        progress=False,
    )
    questions = write_rows(
        tmp_path / "q.jsonl",
        [
            {
                "id": "a",
                "question": "zebra stripes savanna",
                "pages": ["notes.txt"],
                "split": "dev",
            },
            {"id": "b", "question": "zebra stripes", "pages": ["missing.md"], "split": "dev"},
            {"id": "c", "question": "out of the manual", "pages": [], "split": "dev"},
            {"id": "d", "question": "try except finally", "pages": ["errors.rst"]},  # test split
        ],
    )
    out = tmp_path / "r.json"
    assert (
        main(["--index", "pages", "--questions", questions, "--modes", "bm25", "--out", str(out)])
        == 0
    )
    result = json.loads(out.read_text())
    assert result["n_questions"] == 2  # no pages: skipped; the test row is not dev
    assert result["ranks"] == {"a": {"bm25": 1}, "b": {"bm25": None}}
    assert result["metrics"]["bm25"] == {"hit@10": 0.5, "mrr@10": 0.5}


def test_bad_rows_and_modes_are_one_line_errors(tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "x", "question": "q"}\n', encoding="utf-8")
    with pytest.raises(ValueError, match=r"bad.jsonl:1: not a question row with pages"):
        load_page_questions([str(bad)], "dev")
    good = write_rows(tmp_path / "g.jsonl", [{"id": "a", "question": "q", "pages": ["p.md"]}])
    with pytest.raises(ValueError, match="no question with pages in split 'dev'"):
        load_page_questions([good], "dev")
    assert (
        main(["--index", "nowhere", "--questions", good, "--split", "test", "--modes", "fuzzy"])
        == 2
    )
    assert "--modes" in capsys.readouterr().err
