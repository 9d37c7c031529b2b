"""A PDF's text as a reader sees it (rag.documents.pdf): running headers and footers, line-end
hyphens, contents and index pages, and the outline's headings, on PDFs written here."""

from __future__ import annotations

import pytest

from rag.documents import load_document
from rag.documents.pdf import (
    drop_running_lines,
    is_navigation,
    join_hyphenated,
    outline_headings,
)

pypdf = pytest.importorskip("pypdf")


def write_pdf(path, pages: list[list[str]], outline: list[tuple[str, int, int]] = ()):
    """A PDF of ``pages`` (each a list of lines, one text line each) with ``outline`` entries
    (title, page index, depth: a depth-1 entry goes under the last depth-0 one)."""
    from pypdf.generic import DecodedStreamObject, DictionaryObject, NameObject

    writer = pypdf.PdfWriter()
    font = writer._add_object(
        DictionaryObject(
            {
                NameObject("/Type"): NameObject("/Font"),
                NameObject("/Subtype"): NameObject("/Type1"),
                NameObject("/BaseFont"): NameObject("/Helvetica"),
            }
        )
    )
    for lines in pages:
        page = writer.add_blank_page(width=612, height=792)
        page[NameObject("/Resources")] = DictionaryObject(
            {NameObject("/Font"): DictionaryObject({NameObject("/F1"): font})}
        )
        shown = b" T* ".join(
            b"(%s) Tj" % line.replace("\\", "\\\\").replace("(", "\\(").replace(")", "\\)").encode()
            for line in lines
        )
        stream = DecodedStreamObject()
        stream.set_data(b"BT /F1 10 Tf 14 TL 72 760 Td " + shown + b" ET")
        page[NameObject("/Contents")] = writer._add_object(stream)
    parent = None
    for title, index, depth in outline:
        item = writer.add_outline_item(title, index, parent=parent if depth else None)
        if depth == 0:
            parent = item
    with path.open("wb") as f:
        writer.write(f)
    return path


MANUAL = [
    ["Frobnicator Manual", "A tool that frobnicates widgets.", "1"],
    [
        "Frobnicator Manual",
        "1 Installing",
        "Run the installer as root. The configu-",
        "ration lives in /etc/frob.conf and the command-",
        "line tool reads it.",
        "2",
    ],
    [
        "Frobnicator Manual",
        "1.1 Upgrading",
        "Stop the daemon before you upgrade it.",
        "2 Running",
        "Start it with frob --start.",
        "3",
    ],
    [
        "Frobnicator Manual",
        "Index",
        "A",
        "daemon . . . . . . . . . . 3",
        "installer . . . . . . . . 2",
        "command-line tool . . . . 2",
        "upgrade . . . . . . . . . 3",
        "widgets . . . . . . . . . 1",
        "4",
    ],
]
OUTLINE = [("1 Installing", 1, 0), ("Upgrading", 2, 1), ("2 Running", 2, 0), ("Index", 3, 0)]


def test_a_manual_reads_as_its_reader_sees_it(tmp_path):
    doc = load_document(write_pdf(tmp_path / "frob.pdf", MANUAL, OUTLINE))
    text = doc.text
    # the running header stays once, as the title on the first page; page numbers go
    assert text.count("Frobnicator Manual") == 1 and text.startswith("Frobnicator Manual")
    assert not any(line.strip().isdigit() for line in text.split("\n"))
    # a typesetter's hyphen is joined; a compound's hyphen stays (the document has "command")
    assert "configuration lives" in text and "command-line tool reads" in text
    # the index page names every topic and answers none: left out, its heading too
    assert "daemon . ." not in text and "widgets …" not in text
    assert [(h.title, h.level) for h in doc.headings] == [
        ("1 Installing", 1),
        ("Upgrading", 2),
        ("2 Running", 1),
    ]
    # each heading sits at the line showing it, so sections split where the page says
    for h in doc.headings:
        assert text[h.offset :].split("\n", 1)[0].endswith(h.title.split(" ", 1)[-1])
    assert doc.heading_path_at(text.index("Stop the daemon")) == ("1 Installing", "Upgrading")
    assert doc.heading_path_at(text.index("Start it")) == ("2 Running",)
    assert doc.heading_path_at(text.index("Run the installer")) == ("1 Installing",)
    # pages as a PDF viewer counts them: the index page, left out, still counts
    assert [doc.page_at(text.index(w)) for w in ("A tool", "Run the", "Stop the", "Start it")] == [
        1,
        2,
        3,
        3,
    ]
    assert doc.page_at(len(text)) == 3


def test_a_pdf_chunk_knows_its_page_and_answers_show_it(tmp_path, tiny_tokenizer_dir):
    from transformers import AutoTokenizer

    from rag.answer.prompt import quote_source
    from rag.documents.chunking import chunk_document
    from rag.types import Chunk

    doc = load_document(write_pdf(tmp_path / "frob.pdf", MANUAL, OUTLINE))
    tokenizer = AutoTokenizer.from_pretrained(tiny_tokenizer_dir)
    chunks = chunk_document(doc, tokenizer, chunk_tokens=12, overlap=0)
    assert {c.page for c in chunks} == {1, 2, 3}
    for c in chunks:
        assert c.page == doc.page_at(c.start) and Chunk.from_dict(c.to_dict()) == c
    assert "page" not in Chunk("i", "t", "s").to_dict()  # the store's old shape without pages
    assert quote_source(("1 Installing", "Upgrading"), "frob.pdf", 3) == (
        "1 Installing › Upgrading, p. 3"
    )
    assert quote_source((), "notes.md") == "notes.md"


def test_a_pdf_without_an_outline_loads_as_text_without_headings(tmp_path):
    doc = load_document(write_pdf(tmp_path / "plain.pdf", MANUAL[:3]))
    assert doc.headings == []
    assert "Stop the daemon before you upgrade it." in doc.text


def test_running_lines_need_three_pages_and_a_letter_or_digit():
    two = ["Header\n}\nReal content here.\n7", "Header\n}\nReal content here.\n8"]
    assert drop_running_lines(two) == two  # too few pages to tell
    three = ["\n".join(["}", f"the {w} page of prose", "Guide"]) for w in ("one", "two", "last")]
    kept = drop_running_lines(three)
    assert all(p.startswith("}\n") for p in kept)  # a lone brace is content
    # the first page keeps the running line's words: there they are the document's title
    assert "Guide" in kept[0] and not any("Guide" in p for p in kept[1:])


def test_a_chapter_header_of_two_pages_goes_by_its_page_number():
    pages = [
        "Title page",
        "Chapter 1: Start 2\nOne.",
        "Chapter 1: Start 3\nTwo.",
        "Chapter 2: Next 4\nThree.",
        "Chapter 2: Next 5\nFour.\nThe answer is 42",
    ]
    assert drop_running_lines(pages) == [
        "Title page",
        "One.",
        "Two.",
        "Three.",
        "Four.\nThe answer is 42",
    ]


def test_hyphens_at_line_ends_follow_the_documents_words():
    vocabulary = {"command", "line", "configuration", "well", "known"}
    assert join_hyphenated("the configu-\nration", vocabulary) == "the configuration"
    assert join_hyphenated("a command-\nline tool", vocabulary) == "a command-line tool"
    assert join_hyphenated("manip-\nulation", vocabulary) == "manipulation"
    assert join_hyphenated("well-\nknown", vocabulary) == "well-known"
    assert join_hyphenated("ASN1_\nPRINT_NAME", set()) == "ASN1_PRINT_NAME"
    assert join_hyphenated("__NOGLOBS__\n50:text/x-diff", set()) == "__NOGLOBS__\n50:text/x-diff"
    assert join_hyphenated("a list -\nitem", vocabulary) == "a list -\nitem"  # not a word break


def test_navigation_pages_are_told_from_pages_with_a_few_leaders():
    contents = "Contents\n" + "\n".join(f"{i} Section {i} . . . . . . {i * 3}" for i in range(1, 9))
    assert is_navigation(contents)
    prose = "\n".join(["A paragraph of prose that explains things."] * 8 + ["See . . . . 4"])
    assert not is_navigation(prose)


def test_outline_entries_of_missing_or_empty_pages_are_skipped():
    pages = ["1 Intro\nWords.", "", "2.2 Naming\nMore words."]
    starts = [0, 16, 16]
    found = outline_headings(
        [(0, "Intro", 0), (0, "Blank", 1), (0, "Naming", 2), (0, "Gone", 7)], pages, starts
    )
    assert found == [(0, 1, "Intro"), (16, 1, "Naming")]


def test_hostile_pages_clean_up_in_linear_time():
    """What a page holds never drives a regex into backtracking or a scan per outline entry:
    a million letters before a line-end hyphen, a line of 200,000 dots, and 10,000 outline
    entries on one page of 100,000 lines clean up like any text of that size."""
    from rag.documents.pdf import pdf_text

    letters = "a" * 1_000_000 + "-\nb"
    dots = ". " * 200_000 + "x"
    many = "\n".join(f"line {i}" for i in range(100_000))
    entries = [(0, f"Missing {i}", 2) for i in range(10_000)]
    text, headings, _ = pdf_text([letters, dots, many], entries)
    assert "a" * 1_000_000 + "b" in text and text.count("…") == 1
    assert len(headings) == 10_000 and {h[0] for h in headings} == {text.index("line 0")}


def test_a_chapter_title_that_starts_with_its_page_number_stays():
    pages = ["Cover", "Preface text.\n2", "3 Running\nStart it.\n3", "More.\n4", "End.\n5"]
    assert drop_running_lines(pages)[2] == "Start it."  # without the outline it looks running
    assert drop_running_lines(pages, {2: ["running"]})[2] == "3 Running\nStart it."


def test_a_cyclic_outline_costs_nothing_and_a_deep_one_only_the_headings(tmp_path):
    """An outline whose entry is its own next and first child loads at once (pypdf stops the
    cycle); one nested past the recursion limit loses its headings, not the file's text."""
    from test_ingest_hostile import FONT, flate, page, pdf

    def outlined(items: list[bytes]) -> bytes:
        return pdf(
            [
                b"<< /Type /Catalog /Pages 2 0 R /Outlines 5 0 R >>",
                b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
                page(2, 4, 6),
                flate(b"BT /F1 12 Tf 72 712 Td (Hello outline) Tj ET"),
                b"<< /Type /Outlines /First 7 0 R /Last 7 0 R /Count 1 >>",
                FONT,
                *items,
            ]
        )

    loop = b"<< /Title (Loop) /Parent 5 0 R /Next 7 0 R /First 7 0 R /Dest [3 0 R /Fit] >>"
    path = tmp_path / "loop.pdf"
    path.write_bytes(outlined([loop]))
    doc = load_document(path)
    assert doc.text == "Hello outline" and [h.title for h in doc.headings] == ["Loop"]
    depth = 5_000  # each entry the first child of the one before
    deep = [
        b"<< /Title (L%d) /Parent %d 0 R /First %d 0 R /Dest [3 0 R /Fit] >>"
        % (i, 5 if i == 0 else 6 + i, 8 + i)
        if i < depth - 1
        else b"<< /Title (L%d) /Parent %d 0 R /Dest [3 0 R /Fit] >>" % (i, 6 + i)
        for i in range(depth)
    ]
    path = tmp_path / "deep.pdf"
    path.write_bytes(outlined(deep))
    doc = load_document(path)
    assert doc.text == "Hello outline" and doc.headings == []  # pypdf ran out of recursion


def test_a_pdf_locked_by_its_owner_reads_and_one_with_a_password_says_so(tmp_path):
    """A manual that only restricts printing or copying (an owner password, an empty user
    password) is read as any other; one that needs a password to open is a one-line failure
    that says so, not pypdf's exception name."""
    from rag.documents.limits import DocumentError

    plain = write_pdf(tmp_path / "plain.pdf", MANUAL[:3])
    for name, user in (("owner.pdf", ""), ("locked.pdf", "secret")):
        writer = pypdf.PdfWriter(clone_from=str(plain))
        writer.encrypt(user_password=user, owner_password="owner", algorithm="AES-128")
        writer.write(str(tmp_path / name))
    assert "Stop the daemon before you upgrade it." in load_document(tmp_path / "owner.pdf").text
    with pytest.raises(DocumentError, match=r"locked\.pdf.*password-protected PDF"):
        load_document(tmp_path / "locked.pdf")
