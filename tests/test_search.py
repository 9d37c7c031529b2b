"""``python -m rag.search``: JSON output, modes, exit codes."""

from __future__ import annotations

import json

import pytest
from ingest_support import write_docs

from rag.config import RAGConfig
from rag.ingest import ingest
from rag.pipeline import RAGPipeline
from rag.retrieval.retriever import Retriever
from rag.search import main


def test_search_cli_json_and_text(tmp_path, tiny_mlm_dir, capsys):
    ingest([write_docs(tmp_path / "docs")], index="cli", encoder=str(tiny_mlm_dir), progress=False)
    assert (
        main(["read a file line by line", "--index", "cli", "--k", "2", "--mode", "bm25", "--json"])
        == 0
    )
    out = json.loads(capsys.readouterr().out)
    assert out["mode"] == "bm25" and len(out["hits"]) == 2
    top = out["hits"][0]
    assert top["source"].endswith("files.md") and top["heading_path"] == ["Files", "Reading"]
    assert top["path"] == "files.md"  # relative to the ingested folder, not the machine's path
    assert top["rank"] == 1 and "line by line" in top["text"]
    assert main(["zebra", "--index", "cli", "--k", "1"]) == 0
    text = capsys.readouterr().out
    assert "notes.txt" in text and "[" in text and str(tmp_path) not in text


def test_search_cli_errors(capsys):
    assert main(["q", "--index", "missing-index"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("rag.search: error:") and "missing-index" in err and "\n" not in err
    assert main(["q", "--k", "0"]) == 2


@pytest.mark.parametrize("query", ["", "   ", "???", "... !", "—"])
def test_a_query_without_a_word_is_refused(query, tmp_path, tiny_mlm_dir, capsys):
    """Nothing to search for: one line and exit 2 (it used to print arbitrary passages, all
    scored 0.50, exit 0); the library's search and the pipeline's question refuse it too."""
    name = f"words-{tmp_path.name}"
    ingest([write_docs(tmp_path / "docs")], index=name, encoder=str(tiny_mlm_dir), progress=False)
    capsys.readouterr()
    assert main([query, "--index", name]) == 2
    cap = capsys.readouterr()
    assert cap.out == "" and cap.err.count("\n") == 1
    assert cap.err.startswith("rag.search: error: the query has no word to search for")
    with pytest.raises(ValueError, match="no word"):
        Retriever.from_settings(name).search(query)
    with pytest.raises(ValueError, match="the question has no word"):
        RAGPipeline(RAGConfig.of(index=name), retriever=object()).prepare(query)
    assert main(["zebra ???", "--index", name, "--k", "1"]) == 0  # one word is enough
