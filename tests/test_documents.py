"""Document loading: formats, headings, and the per-file errors ingest reports."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from rag.documents import (
    Document,
    DocumentError,
    clean_text,
    load_document,
    load_documents,
    markdown_headings,
    rst_headings,
)
from rag.documents.loaders import text_headings


def write(path: Path, data: str | bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(data, bytes):
        path.write_bytes(data)
    else:
        path.write_text(data, encoding="utf-8")
    return path


def test_markdown_headings_and_heading_path(tmp_path):
    text = "# Guide\n\nintro\n\n## Install\n\npip install\n\n```\n# not a heading\n```\n\n## Use\n\nrun it\n"
    doc = load_document(write(tmp_path / "a.md", text))
    assert [(h.level, h.title) for h in doc.headings] == [(1, "Guide"), (2, "Install"), (2, "Use")]
    assert doc.heading_path_at(doc.text.index("pip install")) == ("Guide", "Install")
    assert doc.heading_path_at(doc.text.index("run it")) == ("Guide", "Use")
    assert doc.heading_path_at(0) == ("Guide",)


def test_markdown_setext_headings_but_not_front_matter_lists_or_code():
    text = (
        "---\ntitle: notes\n---\n\nGuide\n=====\n\nintro\n\nInstall\n-------\n\npip install\n\n"
        "- a list item\n---\n\n```\ncode\n---\n```\n\n| a | b |\n|---|---|\n\n## Use\n"
    )
    heads = markdown_headings(text)
    assert [(h.level, h.title) for h in heads] == [(1, "Guide"), (2, "Install"), (2, "Use")]
    assert text[heads[1].offset :].startswith("Install\n---")


def test_rst_headings_levels_follow_first_appearance():
    text = "=====\nTitle\n=====\n\nIntro.\n\nSection\n-------\n\nBody.\n\nSub\n~~~\n\nMore.\n\nOther\n-----\n"
    heads = rst_headings(text)
    assert [(h.level, h.title) for h in heads] == [
        (1, "Title"),
        (2, "Section"),
        (3, "Sub"),
        (2, "Other"),
    ]


MAN_PAGE = """git-push(1)
===========

NAME
----
git-push - Update remote refs along with associated objects

OPTIONS[[OPTIONS]]
------------------
-d, --delete::
	All listed refs are deleted from the remote repository.

EXAMPLES
--------
------------
$ git revert HEAD
------------

# not a heading: a shell comment
"""


def test_text_headings_of_an_asciidoc_manual_page(tmp_path):
    doc = load_document(write(tmp_path / "git-push.txt", MAN_PAGE))
    assert [(h.level, h.title) for h in doc.headings] == [
        (1, "git-push(1)"),
        (2, "NAME"),
        (2, "OPTIONS"),  # its [[anchor]] dropped
        (2, "EXAMPLES"),  # the fenced "$ git revert HEAD" above a fence is code, not a title
    ]
    assert doc.heading_path_at(doc.text.index("All listed")) == ("git-push(1)", "OPTIONS")


def test_text_headings_prefer_asciidoc_one_line_titles_then_markdown():
    manual = (
        "= Git User Manual\n\n== Introduction\n\n----\n$ git log\n\nHEAD is now at 427abfa\n----\n"
    )
    assert [(h.level, h.title) for h in text_headings(manual)] == [
        (1, "Git User Manual"),
        (2, "Introduction"),
    ]
    assert [h.title for h in text_headings("# Notes\n\nplain text\n")] == ["Notes"]
    assert text_headings("a line\nof text\n\n}\n---\n") == []  # no word, no blank before
    fenced = "----\n$ git reset --hard\n\nHEAD is now at 427abfa\n----\n"
    assert text_headings(fenced) == []  # a blank line inside the fence: still code


def test_sphinx_rst_txt_is_read_as_rst(tmp_path):
    doc = load_document(write(tmp_path / "io.rst.txt", "Files\n=====\n\nUse open().\n"))
    assert doc.headings[0].title == "Files"


def test_html_drops_scripts_and_keeps_headings(tmp_path):
    html = (
        "<html><head><style>p{color:red}</style><script>var x=1;</script></head>"
        "<body><h1>Title</h1><p>First para.</p><h2>Part</h2><p>Second <b>bold</b>.</p></body></html>"
    )
    doc = load_document(write(tmp_path / "p.html", html))
    assert "var x" not in doc.text and "color" not in doc.text
    assert "Second bold." in doc.text
    assert [h.title for h in doc.headings] == ["Title", "Part"]
    assert doc.heading_path_at(doc.text.index("Second")) == ("Title", "Part")


def test_pdf_text_is_extracted(tmp_path):
    pypdf = pytest.importorskip("pypdf")
    from pypdf.generic import DecodedStreamObject, DictionaryObject, NameObject

    writer = pypdf.PdfWriter()
    page = writer.add_blank_page(width=300, height=200)
    font = DictionaryObject(
        {
            NameObject("/Type"): NameObject("/Font"),
            NameObject("/Subtype"): NameObject("/Type1"),
            NameObject("/BaseFont"): NameObject("/Helvetica"),
        }
    )
    page[NameObject("/Resources")] = DictionaryObject(
        {NameObject("/Font"): DictionaryObject({NameObject("/F1"): writer._add_object(font)})}
    )
    stream = DecodedStreamObject()
    stream.set_data(b"BT /F1 12 Tf 20 100 Td (Hello from a PDF) Tj ET")
    page[NameObject("/Contents")] = writer._add_object(stream)
    path = tmp_path / "x.pdf"
    with path.open("wb") as f:
        writer.write(f)
    assert "Hello from a PDF" in load_document(path).text


def test_docx_tables_are_read_in_place_as_markdown_rows(tmp_path):
    """A Word manual's settings table is content: its rows come in document order, one
    Markdown row each (the evidence reader's table units), a merged cell once."""
    docx = pytest.importorskip("docx")
    d = docx.Document()
    d.add_heading("Settings", level=1)
    d.add_paragraph("The server reads these settings.")
    table = d.add_table(rows=4, cols=2)
    for r, (a, b) in enumerate([("Setting", "Default"), ("port", "7860"), ("host", "a|b")]):
        table.cell(r, 0).text, table.cell(r, 1).text = a, b
    table.cell(3, 0).text = "Both columns"
    table.cell(3, 0).merge(table.cell(3, 1))
    d.add_paragraph("Restart after a change.")
    d.save(tmp_path / "s.docx")
    doc = load_document(tmp_path / "s.docx")
    assert doc.text == (
        "Settings\n\nThe server reads these settings.\n\n"
        "| Setting | Default |\n|---|---|\n| port | 7860 |\n| host | a\\|b |\n| Both columns |"
        "\n\nRestart after a change."
    )
    assert doc.heading_path_at(doc.text.index("| port")) == ("Settings",)


def test_docx_headings(tmp_path):
    docx = pytest.importorskip("docx")
    d = docx.Document()
    d.add_heading("Manual", level=1)
    d.add_paragraph("Read this first.")
    d.add_heading("Setup", level=2)
    d.add_paragraph("Install the package.")
    d.save(tmp_path / "m.docx")
    doc = load_document(tmp_path / "m.docx")
    assert doc.heading_path_at(doc.text.index("Install")) == ("Manual", "Setup")


@pytest.mark.parametrize(
    ("name", "data", "reason"),
    [
        ("bin.txt", b"\x00\x01\x02binary", "binary"),
        ("empty.md", b"", "no text"),  # skipped by rag.ingest, not failed
        ("blank.md", b"   \n\n  ", "no text"),
        ("latin.txt", "caf\u00e9".encode("latin-1"), "UTF-8"),
        ("zero.pdf", b"", "empty"),
        ("broken.pdf", b"%PDF-1.4 not really", "PDF"),
    ],
)
def test_bad_files_raise_with_path_and_reason(tmp_path, name, data, reason):
    path = write(tmp_path / name, data)
    with pytest.raises(DocumentError) as err:
        load_document(path)
    assert err.value.path == str(path)
    assert reason.lower() in err.value.reason.lower()


def test_oversized_file_is_refused(tmp_path):
    path = write(tmp_path / "big.txt", "x" * 2000)
    with pytest.raises(DocumentError, match="too large"):
        load_document(path, max_bytes=1000)


def test_load_documents_collects_failures_and_keeps_going(tmp_path):
    write(tmp_path / "good.md", "# A\n\nfine text")
    write(tmp_path / "sub" / "good2.txt", "more fine text")
    write(tmp_path / "bad.txt", b"\x00\x00")
    write(tmp_path / "ignored.bin", b"\x00")
    os.symlink(tmp_path / "loop", tmp_path / "loop.md")  # dangling link
    loop = tmp_path / "self.md"
    os.symlink(loop, loop)  # a link to itself: ELOOP
    docs, errors = load_documents([tmp_path])
    assert sorted(Path(d.path).name for d in docs) == ["good.md", "good2.txt"]
    reasons = {Path(e.path).name: e.reason for e in errors}
    assert set(reasons) == {"bad.txt", "loop.md", "self.md"}
    assert "loop" in reasons["self.md"]


def test_missing_path_is_an_error_not_a_crash(tmp_path):
    docs, errors = load_documents([tmp_path / "nope"])
    assert docs == [] and "no such file" in errors[0].reason


def test_clean_text_normalises_layout():
    assert clean_text("a\r\nb  \n\n\n\nc\x07") == "a\nb\n\nc"
    assert clean_text("e\u0301") == "\u00e9"  # NFC


def test_markdown_setext_is_not_needed_but_atx_trailing_hashes_are_stripped():
    assert markdown_headings("## Title ##")[0].title == "Title"


def test_document_without_headings_has_empty_path():
    assert Document(path="x", text="abc").heading_path_at(1) == ()


def test_markdown_html_comments_are_not_indexed_but_code_keeps_them(tmp_path):
    """A reader of the rendered page never sees a comment: it was indexed, then quoted as an
    answer's evidence ("<!-- ui-load:start -->"). Code shows it, so code keeps it."""
    text = (
        "# Setup\n\n<!-- table:start -->\nRun it. <!-- TODO: more --> Then wait.\n"
        "<!-- a note\nover two lines -->\n\n## Code\n\n```html\n<!-- kept in a block -->\n```\n"
        "Write `<!-- inline -->` to hide a line. An unclosed <!-- stays"
    )
    doc = load_document(write(tmp_path / "a.md", text))
    assert "table:start" not in doc.text and "TODO" not in doc.text and "a note" not in doc.text
    assert "Run it.  Then wait." in doc.text
    assert "<!-- kept in a block -->" in doc.text and "`<!-- inline -->`" in doc.text
    assert doc.text.endswith("An unclosed <!-- stays")
    assert [h.title for h in doc.headings] == ["Setup", "Code"]
    assert doc.heading_path_at(doc.text.index("kept")) == ("Setup", "Code")
    # plain text and reST have no such comments: read as written
    assert "<!-- x -->" in load_document(write(tmp_path / "b.txt", "a <!-- x --> b")).text
    # a tilde fence closes only on tildes, at least as many
    fenced = "~~~~\n<!-- in -->\n```\n<!-- still in -->\n~~~~\n<!-- out -->\nafter"
    assert load_document(write(tmp_path / "c.md", fenced)).text == (
        "~~~~\n<!-- in -->\n```\n<!-- still in -->\n~~~~\n\nafter"
    )


def test_many_unclosed_comments_and_backticks_load_in_linear_time(tmp_path):
    """What a document holds never drives a regex into backtracking: 200,000 unclosed comment
    openers and lone backticks load like any text of that size."""
    doc = load_document(write(tmp_path / "a.md", "<!-- ` " * 200_000 + "end"))
    assert doc.text.endswith("end") and doc.text.count("<!--") == 200_000


def test_html_navigation_is_left_out_but_content_links_and_code_stay(tmp_path):
    """Menus, sidebars and contents lists name every page and answer nothing: a block of three
    links or more that is mostly link text, or a run of three link-only blocks, is left out.
    A paragraph citing links, a list whose items say what they link to, and code (an enum
    written with <a name> anchors, a <pre> of linked types) stay."""
    html = (
        "<html><head><title>Types (libffi manual)</title></head><body>"
        '<div class="header"><p>Next: <a href="m.html">Multiple ABIs</a>, Previous: '
        '<a href="s.html">Simple Example</a>, Up: <a href="u.html">Using libffi</a> '
        '&nbsp; [<a href="i.html">Index</a>]</p></div>'
        '<ul class="sidebar"><li><a href="a.html">Assertion testing</a></li>'
        '<li><a href="b.html">Buffer</a></li><li><a href="c.html">Child processes</a></li>'
        '<li><a href="d.html">DNS</a></li></ul>'
        "<h1>2.3 Types</h1>"
        '<p>Use <a href="t.html">ffi_type</a> to describe a struct to libffi.</p>'
        '<ul><li><a href="p.html">Primitive Types</a>: the built-in scalar types.</li>'
        '<li><a href="s.html">Structures</a>: how to lay out a struct.</li>'
        '<li><a href="z.html">Size and Alignment</a>: what libffi computes for you.</li></ul>'
        '<pre>Enum ffi_status {\n  <a name="FFI_OK">FFI_OK</a> = 0\n'
        '  <a name="FFI_BAD_ABI">FFI_BAD_ABI</a> = 2\n}</pre>'
        '<pre><a href="#T">ffi_type</a> *<a href="#E">elements</a></pre>'
        "<p>See also:</p><p><a href='x.html'>Closures</a></p></body></html>"
    )
    doc = load_document(write(tmp_path / "types.html", html))
    text = doc.text
    for nav in ("Multiple ABIs", "Using libffi", "[Index]", "Assertion testing", "Buffer", "DNS"):
        assert nav not in text, nav
    for kept in (
        "Types (libffi manual)",
        "Use ffi_type to describe a struct to libffi.",
        "Primitive Types: the built-in scalar types.",
        "Size and Alignment: what libffi computes for you.",
        "FFI_BAD_ABI = 2",
        "ffi_type *elements",
        "Closures",
    ):
        assert kept in text, kept
    assert [h.title for h in doc.headings] == ["2.3 Types"]


def test_html_table_cells_and_definitions_are_not_glued_together(tmp_path):
    """Cells written without white space between their tags ("<td>port</td><td>7860</td>")
    read as a Markdown row, not "port7860"; a layout table's empty cells and rows are left
    out; a term and its definition are two lines; a pipe in a cell or in code is kept."""
    html = (
        "<h1>Settings</h1><table>\n <tr>\n  <th>Setting</th><th>Default</th></tr>\n"
        " <tr><td>\n   port\n  </td><td>7860</td></tr><tr><td>mode</td><td>a|b</td></tr>"
        "<tr><td></td><td> </td></tr><tr><td></td><td>Spacer</td><td></td></tr></table>"
        "<dl><dt>--port</dt><dd>the port to listen on</dd></dl>"
        "<pre>make test || echo failed</pre>"
    )
    doc = load_document(write(tmp_path / "t.html", html))
    assert doc.text == (
        "# Settings\n\n| Setting | Default |\n| port | 7860 |\n| mode | a\\|b |\n| Spacer |"
        "\n\n--port\nthe port to listen on\n\n```\nmake test || echo failed\n```"
    )


@pytest.mark.parametrize(
    ("head", "asks"),
    [
        ('<meta name="robots" content="noindex">', True),
        ("<META CONTENT='NOINDEX, nofollow' NAME='Robots'>", True),
        ("<meta name=robots content=none>", True),
        ('<meta name="googlebot" content="noindex">', True),
        ('<meta name="robots" content="index, follow">', False),
        ('<meta name="description" content="noindex pages, explained">', False),
        ('<meta charset="UTF-8">', False),
        ("<meta " * 2000, False),  # unclosed tags, read in one pass
        ("<meta " * 2000 + '<meta name="robots" content="noindex">', True),
    ],
)
def test_a_page_asks_not_to_be_indexed_only_in_its_robots_meta(head, asks):
    from rag.documents.html import asks_noindex

    page = f"<html><head>{head}<title>t</title></head><body><p>Text.</p></body></html>"
    assert asks_noindex(page) is asks
    # a meta tag in the body (an example in the text) is no instruction about the page
    shown = '<html><head></head><body><pre><meta name="robots" content="noindex"></pre></body>'
    assert not asks_noindex(shown)


def test_html_pre_is_a_code_fence_and_its_comments_are_no_headings(tmp_path):
    """A <pre> element is a Markdown code fence in the text (its lines as written, its
    blank lines inside), so a comment line in it ("# Use the vendored sources") is no
    heading; code holding backticks gets a tilde fence; each <pre> is a fence of its own;
    code in a table row is not fenced (the row is one line)."""
    html = (
        "<h1>Vendoring</h1><p>Put this in the config:</p>"
        '<pre><code class="language-toml"># Use the vendored sources\n[source.crates-io]\n'
        'replace-with = "vendored"\n\n# the folder\n[source.vendored]</code></pre>'
        "<p>Then build.</p><pre>echo ```</pre><pre>second</pre>"
        "<table><tr><td><pre>in a cell</pre></td><td>x</td></tr></table>"
    )
    doc = load_document(write(tmp_path / "v.html", html))
    assert [h.title for h in doc.headings] == ["Vendoring"]
    assert (
        "Put this in the config:\n\n```\n# Use the vendored sources\n[source.crates-io]\n"
        'replace-with = "vendored"\n\n# the folder\n[source.vendored]\n```\n\nThen build.'
    ) in doc.text
    assert "~~~\necho ```\n~~~" in doc.text and "```\nsecond\n```" in doc.text
    assert "in a cell" in doc.text and "```\nin a cell" not in doc.text  # a row is no fence


@pytest.mark.parametrize(
    ("source", "pages"),
    [
        ("b/_sources/guide/intro.rst.txt", ["b/guide/intro.html", "b/guide/intro/index.html"]),
        ("b/_sources/index.md.txt", ["b/index.html", "b/index/index.html"]),  # MyST
        ("b/_sources/nb.ipynb.txt", ["b/nb.html", "b/nb/index.html"]),  # a notebook page
        ("api/fs.md", ["api/fs.html", "api/fs.htm"]),  # Node's API docs
        ("notes.txt", ["notes.html", "notes.htm"]),
        ("page.html", []),
        ("report.pdf", []),
    ],
)
def test_where_the_page_rendered_from_a_source_would_be(source, pages):
    from rag.documents.walk import rendered_pages

    assert rendered_pages(Path(source)) == [Path(p) for p in pages]
