"""The UI's Documents panel, handler by handler (ui.handlers.ChatApp over a real index built with
the tiny encoder; no model is loaded): the table escapes every path, removal takes a
confirmation first and removes only what was chosen, and a failure is one line with the index
unchanged. The panel in a real browser: test_ui_browser.py."""

from __future__ import annotations

import pytest
from ingest_support import write_docs
from test_ingest import index_state

from rag.ingest import ingest, list_documents
from ui.config import AppConfig
from ui.handlers import ChatApp

HOSTILE = "<img src=x onerror=alert(1)>.md"  # a legal file name on Linux
DOCS = {
    "files.md": "# Files\n\nTo read a file line by line, loop over the file object.\n",
    "notes.txt": "Zebras and giraffes live in the savanna.\n",
    HOSTILE: "# Hostile\n\nA document whose name is markup.\n",
}


@pytest.fixture
def panel(tmp_path, tiny_mlm_dir):
    name = f"ui-{tmp_path.name}"
    ingest([write_docs(tmp_path / "docs", DOCS)], index=name, encoder=str(tiny_mlm_dir))
    return ChatApp(AppConfig.of(index=name), lambda cfg: None), name


def test_table_lists_every_document_escaped(panel):
    app, name = panel
    table, picker = app.documents(name)
    assert "<img" not in table and "&lt;img src=x onerror=alert(1)&gt;.md" in table
    assert table.count("<tr>") == 1 + len(DOCS) and "files.md" in table and "txt" in table
    assert picker["choices"] == sorted(DOCS) and picker["value"] == []
    missing, picker = app.documents("not-there")
    assert "does not exist yet" in missing and picker["choices"] == []
    bad, _ = app.documents("../etc")
    assert "not allowed" in bad


def test_removal_needs_confirmation_and_removes_only_the_choice(panel):
    app, name = panel
    before = index_state(name)
    row, text, report = app.confirm_removal(name, [])
    assert row["visible"] is False and "Choose the documents" in report
    assert index_state(name) == before
    row, text, report = app.confirm_removal(name, [HOSTILE, "notes.txt"])
    assert row["visible"] is True and "Remove 2 document(s)" in text
    assert "<img" not in text and "&lt;img" in text
    assert index_state(name) == before  # asking changes nothing

    report, table, picker, row = app.remove(name, [HOSTILE, "notes.txt"])
    assert row["visible"] is False
    assert "Removed 2 document(s)" in report and "<img" not in report
    assert [d.path for d in list_documents(name).documents] == ["files.md"]
    assert picker["choices"] == ["files.md"] and "notes.txt" not in table


def test_failed_removal_is_one_line_and_changes_nothing(panel):
    app, name = panel
    before = index_state(name)
    report, table, picker, row = app.remove(name, ["files.md", "gone.md"])
    assert report.startswith("<p><b>Error:</b>") and "gone.md" in report
    assert report.count("<p>") == 1 and row["visible"] is False
    assert index_state(name) == before and picker["choices"] == sorted(DOCS)
    report, *_ = app.remove(name, [])
    assert "no document chosen" in report and index_state(name) == before


def test_filter_box_reaches_the_pipeline(panel, monkeypatch):
    """The Settings' filter box: clauses split on spaces or ';' and passed to the pipeline's
    stream; an empty box passes none (the app's own filter applies)."""
    from rag.types import Answer

    app, name = panel
    seen = []

    class Pipe:
        def stream(self, question, **kw):
            seen.append(kw)
            yield Answer(text="none", citations=[], raw_text="none")

    monkeypatch.setattr(app, "_pipeline", lambda *a, **k: Pipe())
    settings = [name, "(index default)", "smollm2", "(none)", "hybrid", 3, 0.0, 32, None, None]
    list(app.chat("q", [], *settings, "path=library/* ;type=md"))
    assert seen[-1]["where"] == ["path=library/*", "type=md"]
    list(app.chat("q", [], *settings, "  "))
    assert "where" not in seen[-1]
