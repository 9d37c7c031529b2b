"""Sources as the user knows them: relative to the ingested folder in search results, answers
and the UI, while the manifest keeps absolute keys (incremental re-ingest is unchanged)."""

from __future__ import annotations

import json
import os

from ingest_support import write_docs

from rag.docs import main as docs_main
from rag.ingest import ingest
from rag.ingest import main as ingest_main
from rag.retrieval.retriever import Retriever
from rag.search import main as search_main
from rag.storage.manifest import open_generation
from rag.storage.paths import display_source, earlier_display_name
from rag.types import Answer, Chunk, Citation, Hit
from ui.render import sources_html, uncited_html


def test_display_source_rules():
    roots = ["/data/python-docs", "/data/python-docs/library/io.rst.txt", "/home/u/notes.md"]
    assert display_source("/data/python-docs/library/io.rst.txt", roots) == "library/io.rst.txt"
    assert display_source("/home/u/notes.md", roots) == "notes.md"  # a file given on its own
    assert display_source("/elsewhere/x.md", roots) == "x.md"  # no root: the name, not the path
    assert display_source("/data/python-docs-2/a.md", roots) == "a.md"  # a prefix is no parent
    assert display_source("/a/b.md", ["/"]) == "a/b.md"


def test_earlier_display_names():
    """Issue 47, case 16: the names display_names gave a document beside a same-named one of
    another recorded root, and no other tail of its path."""
    roots = ["/d/dupA", "/d/dupB", "/x/docs", "/y/docs", "/s/one/same.md"]
    assert earlier_display_name("dupB/same.md", "/d/dupB/same.md", roots)
    assert earlier_display_name("dupB/sub/same.md", "/d/dupB/sub/same.md", roots)
    assert earlier_display_name("x/docs/same.md", "/x/docs/same.md", roots)
    two = ["/x/docs", "/y/docs"]
    assert earlier_display_name("x/docs/same.md", "/x/docs/same.md", two)
    assert not earlier_display_name("docs/same.md", "/x/docs/same.md", two)  # never its name
    assert not earlier_display_name(
        "d/dupB/same.md", "/d/dupB/same.md", roots
    )  # deeper than needed
    assert not earlier_display_name("same.md", "/d/dupB/same.md", roots)
    assert not earlier_display_name("dupA/same.md", "/d/dupB/same.md", roots)
    assert earlier_display_name("one/same.md", "/s/one/same.md", roots)  # a file given alone
    assert not earlier_display_name("docs/a.md", "/x/docs/a.md", ["/x/docs"])  # one root: none


def test_hits_answers_and_ui_show_relative_paths(tmp_path, tiny_mlm_dir, capsys):
    docs = write_docs(tmp_path / "python-docs")
    (docs / "library").mkdir()
    (docs / "library" / "io.rst.txt").write_text(
        "io\n==\n\nThe io module reads a file line by line with readline.\n", encoding="utf-8"
    )
    single = write_docs(tmp_path / "loose", {"memo.md": "# Memo\n\nPangolins roll up.\n"})
    ingest([docs, single / "memo.md"], "paths", str(tiny_mlm_dir), progress=False)
    _, _, manifest = open_generation("paths")
    assert all(os.path.isabs(k) for k in manifest.sources)  # internal keys stay absolute
    assert str(docs) in manifest.roots

    r = Retriever.from_settings("paths")
    io_hit = r.search("io module readline", k=1, mode="bm25")[0]
    assert io_hit.chunk.path == "library/io.rst.txt" and os.path.isabs(io_hit.chunk.source)
    memo = r.search("pangolins", k=1, mode="bm25")[0]
    assert memo.chunk.path == "memo.md"
    d = io_hit.to_dict()
    assert d["path"] == "library/io.rst.txt" and d["source"] == io_hit.chunk.source

    assert (
        search_main(["readline io module", "--index", "paths", "--mode", "bm25", "--k", "1"]) == 0
    )
    text = capsys.readouterr().out
    assert "library/io.rst.txt" in text and str(tmp_path) not in text
    args = ["io", "--index", "paths", "--mode", "bm25", "--json"]
    assert search_main(args) == 0
    assert all(not os.path.isabs(h["path"]) for h in json.loads(capsys.readouterr().out)["hits"])

    # An answer built the way rag.pipeline builds it (chunk fields, no path) gets the passage's.
    c = io_hit.chunk
    answer = Answer(
        text="Use readline.",
        raw_text="Use readline [1].",
        citations=[Citation(1, c.source, c.heading_path, c.text, io_hit.score, c.id)],
        passages=[io_hit, memo],
    )
    cited = answer.to_dict()["citations"][0]
    assert cited["path"] == "library/io.rst.txt" and cited["source"] == c.source
    panel = sources_html(answer, "q") + uncited_html(answer)
    assert "library/io.rst.txt" in panel and "memo.md" in panel and str(tmp_path) not in panel


def test_chunk_store_keeps_its_shape():
    """``path`` is derived when a hit is made, never written to chunks.jsonl."""
    chunk = Chunk("id", "text", "/abs/a.md")
    assert "path" not in chunk.to_dict()
    assert Hit(chunk, 1.0).to_dict()["path"] == "/abs/a.md"  # no roots known: as stored


def test_control_characters_in_file_names_cannot_forge_lines(tmp_path, tiny_mlm_dir, capsys):
    """A file literally named with a newline (and an ESC sequence) reads as one escaped name on
    one line in ingest's report, rag.search, rag.docs list and rag.ask's sources; JSON keeps
    the real name."""
    from rag.ask import format_sources

    forged = "a\nfailed: forged.md"
    docs = write_docs(tmp_path / "docs", {forged: "# Forged\n\nPangolins roll into a ball.\n"})
    (docs / "b\x1b[2J\nskipped: x.png").write_bytes(b"\x89PNG\r\n")
    argv = [str(docs), "--index", "ctl", "--encoder", str(tiny_mlm_dir), "--no-progress"]
    assert ingest_main(argv) == 0
    err = capsys.readouterr().err
    assert "\x1b" not in err
    reported = [line for line in err.splitlines() if line.startswith(("failed:", "skipped:"))]
    assert len(reported) == 1 and reported[0].startswith("skipped: ")
    assert "b\\x1b[2J\\nskipped: x.png: unsupported file type '.png'" in reported[0]

    assert search_main(["pangolins", "--index", "ctl", "--mode", "bm25", "--k", "1"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2 and "a\\nfailed: forged.md  (Forged)" in lines[0]
    assert search_main(["pangolins", "--index", "ctl", "--k", "1", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["hits"][0]["path"] == forged

    assert docs_main(["list", "--index", "ctl"]) == 0
    rows = capsys.readouterr().out.splitlines()
    assert len(rows) == 2 and rows[1].startswith("a\\nfailed: forged.md  ")

    hit = Retriever.from_settings("ctl").search("pangolins", k=1, mode="bm25")[0]
    c = hit.chunk
    answer = Answer(
        "Roll.", [Citation(1, c.source, c.heading_path, c.text, 1.0, c.id)], passages=[hit]
    )
    assert format_sources(answer).splitlines()[0].startswith("[1] a\\nfailed: forged.md")
