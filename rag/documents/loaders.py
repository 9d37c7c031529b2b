"""Document loading: one module for ingestion, pretraining corpora and pair mining.

Every supported file becomes a :class:`Document`: clean text plus the headings found in it, each
with its character offset, so that chunking can split on headings and keep a heading path.

Formats: .md/.markdown, .txt, .rst (and Sphinx ``*.rst.txt`` sources), .html/.htm (text only,
scripts, styles and navigation dropped, headings kept as ``#`` lines), .pdf (pypdf, then
:mod:`rag.documents.pdf`: page furniture, hyphens, outline headings, pages), .docx (python-docx,
optional extra). Anything that cannot be loaded raises :class:`DocumentError` naming the path
and the reason; :func:`load_documents` collects those instead of stopping. Every file is loaded
within :class:`Limits` (:mod:`rag.documents.limits`).

Why hand-written: the PDF and Word parsers are libraries (pypdf, python-docx); what is ours is
the heading extraction for md/rst/html, the limits and the uniform error reporting that ingest
needs, and the HTML text extraction (:mod:`rag.documents.html`).
"""

from __future__ import annotations

import re
import unicodedata
from bisect import bisect_right
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rag.documents.html import _html_text, asks_noindex, markdown_row
from rag.documents.limits import (
    DEFAULT_MAX_BYTES,
    Deadline,
    DocumentError,
    Limits,
    _too_long,
    check_zip,
    failure_reason,
)
from rag.documents.pdf import pdf_text, read_pdf
from rag.documents.walk import (
    HTML_SUFFIXES,
    MARKDOWN_SUFFIXES,
    SUPPORTED_SUFFIXES,
    TEXT_SUFFIXES,
    _suffix_of,
    iter_files,
)


@dataclass(frozen=True)
class Heading:
    """A heading at character ``offset`` of the document text; ``level`` 1 is the top."""

    offset: int
    level: int
    title: str


@dataclass
class Document:
    """Clean text of one file plus its headings (in order of offset)."""

    path: str
    text: str
    headings: list[Heading] = field(default_factory=list)
    # where each page starts in ``text`` (a PDF's, in page order; an empty page starts where the
    # next one does); empty for a document without pages
    pages: list[int] = field(default_factory=list)
    # (headings list, its length, prefix maxima of the offsets, the heading path after each
    # heading): built once by heading_path_at, rebuilt when the headings change
    _paths: Any = field(default=None, init=False, repr=False, compare=False)

    def _heading_index(self) -> tuple[list[int], list[tuple[str, ...]]]:
        """The heading path in force after each heading, computed in one pass over the
        headings (a stack of open levels), with the running maximum of their offsets."""
        cached = self._paths
        if cached is not None and cached[0] is self.headings and cached[1] == len(self.headings):
            return cached[2], cached[3]
        ends: list[int] = []
        paths: list[tuple[str, ...]] = []
        stack: list[Heading] = []
        top = -1
        for h in self.headings:
            while stack and stack[-1].level >= h.level:
                stack.pop()
            stack.append(h)
            top = max(top, h.offset)
            ends.append(top)
            paths.append(tuple(s.title for s in stack))
        self._paths = (self.headings, len(self.headings), ends, paths)
        return ends, paths

    def page_at(self, offset: int) -> int:
        """The page (1-based, as a PDF viewer counts) that character ``offset`` is on; 0 for a
        document without pages."""
        return bisect_right(self.pages, offset) if self.pages else 0

    def heading_path_at(self, offset: int) -> tuple[str, ...]:
        """The chain of headings (top level first) that governs character ``offset``: the
        path after the last of the leading headings that start at or before it, found by
        bisection, so chunking a file of 200,000 headings costs one pass over them, not one
        per chunk (a scan per chunk took 356 s)."""
        ends, paths = self._heading_index()
        i = bisect_right(ends, offset)
        return paths[i - 1] if i else ()


# ---------------------------------------------------------------------------- text cleaning

_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")


def clean_text(text: str) -> str:
    """NFC-normalise, unify newlines, drop control characters and trailing spaces, and collapse
    runs of blank lines; meaning-bearing layout (indentation, single newlines) is kept."""
    text = unicodedata.normalize("NFC", text).replace("\r\n", "\n").replace("\r", "\n")
    text = _CONTROL.sub("", text)
    text = "\n".join(line.rstrip() for line in text.split("\n"))
    text = re.sub(r"\n{3,}", "\n\n", text)
    return text.strip()


# ---------------------------------------------------------------------------- markdown comments

# a fence (``` or ~~~, indented up to three spaces) opening or closing a Markdown code block
_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
# what decides whether "<!--" starts a comment: a backtick run (an inline code span opens or
# closes), the comment's start and end, and a line end (a span left open ends there)
_COMMENT_TOKEN = re.compile(r"`+|<!--|-->|\n")


def drop_html_comments(text: str) -> str:
    """Markdown ``text`` without its HTML comments (``<!-- … -->``), which a reader of the
    rendered page never sees: a document's markers ("<!-- table:start -->"), notes and
    licence headers had been indexed as sentences and quoted as answers' evidence. A comment in
    a fenced code block or an inline code span is the page's content and stays; an unclosed
    ``<!--`` stays as written. One pass over the text (no regex backtracking on what a document
    holds). Not a Markdown parser (markdown-it-py): it would turn the page into a token tree to
    drop one kind of node, and the loader keeps the source text as written, its offsets and
    headings, not a rendering of it. Nor :func:`rag.answer.markup.split_code`, which splits an
    answer into code and prose the same way: loading is below answering (ingest never imports
    ``rag.answer``), and it rewrites a code span holding only citation markers, which in a
    document is the document's own text."""
    if "<!--" not in text:
        return text
    out: list[str] = []
    prose: list[str] = []
    fence: str | None = None
    for line in text.split("\n"):
        m = _FENCE.match(line)
        if fence is None and m is None:
            prose.append(line)
            continue
        if fence is None:  # a code block opens: what came before is prose
            if prose:
                out.append(_drop_prose_comments("\n".join(prose)))
            prose, fence = [], m.group(1)
        elif m and _closes(line.strip(), fence):
            fence = None
        out.append(line)
    if prose:
        out.append(_drop_prose_comments("\n".join(prose)))
    return "\n".join(out)


def _closes(line: str, fence: str) -> bool:
    """Whether a stripped ``line`` closes the code block ``fence`` opened: a run of its
    character alone, at least as long."""
    return line == fence[0] * len(line) and len(line) >= len(fence)


def _drop_prose_comments(prose: str) -> str:
    """:func:`drop_html_comments` on text outside code blocks: inline code spans kept."""
    keep: list[str] = []
    at = 0  # the text up to here is decided
    code = 0  # the length of the backtick run that opened the code span we are in (0: none)
    start = -1  # where the open comment began (-1: none)
    for m in _COMMENT_TOKEN.finditer(prose):
        token = m.group()
        if start >= 0:
            if token == "-->":
                keep.append(prose[at:start])
                at, start = m.end(), -1
        elif token == "\n":
            code = 0
        elif token[0] == "`":
            code = 0 if code == len(token) else (code or len(token))
        elif token == "<!--" and not code:
            start = m.start()
    keep.append(prose[at:])
    return "".join(keep)


# ---------------------------------------------------------------------------- headings

_ATX = re.compile(r"^(#{1,6})\s+(.+?)\s*#*\s*$")
_RST_UNDERLINE = re.compile(r"^([=\-~^\"'`#*+<>:._])\1{2,}\s*$")


_SETEXT = re.compile(r"^(=+|-+)\s*$")
_NOT_SETEXT_TITLE = re.compile(r"^\s*(?:[-*+>|#]|\d+[.)]\s|```|~~~)|^\s{4}")


def markdown_headings(text: str, setext: bool = True) -> list[Heading]:
    """ATX (``# Title``) headings, and with ``setext`` setext ones (a line over ``===``: level
    1, or over ``---``: level 2, of three or more; the title alone after a blank line and
    holding a word, so that YAML front matter's closing ``---`` and a list or table above a rule
    are no titles), skipping fenced code blocks."""
    out, offset, fenced = [], 0, False
    lines = text.split("\n")
    for i, line in enumerate(lines):
        if line.lstrip().startswith(("```", "~~~")):
            fenced = not fenced
        elif not fenced and (m := _ATX.match(line)):
            out.append(Heading(offset, len(m.group(1)), m.group(2).strip()))
        elif (
            setext
            and not fenced
            and i >= 1
            and len(line.strip()) >= 3
            and (m := _SETEXT.match(line))
            and re.search(r"\w", lines[i - 1])
            and not _NOT_SETEXT_TITLE.match(lines[i - 1])
            and (i == 1 or not lines[i - 2].strip())
        ):
            title = lines[i - 1].strip()
            out.append(
                Heading(offset - len(lines[i - 1]) - 1, 1 if m.group(1)[0] == "=" else 2, title)
            )
        offset += len(line) + 1
    return out


def rst_headings(text: str) -> list[Heading]:
    """reStructuredText section titles: a line underlined (optionally overlined) by a repeated
    punctuation character at least as long as the title. Levels follow the order in which
    adornment styles first appear, as docutils assigns them."""
    lines = text.split("\n")
    offsets, pos = [], 0
    for line in lines:
        offsets.append(pos)
        pos += len(line) + 1
    styles: list[tuple[str, bool]] = []
    out: list[Heading] = []
    for i in range(1, len(lines)):
        under, title = lines[i], lines[i - 1].strip()
        m = _RST_UNDERLINE.match(under)
        if (
            not m
            or not title
            or _RST_UNDERLINE.match(lines[i - 1])
            or len(under.rstrip()) < len(title)
        ):
            continue
        overlined = i >= 2 and lines[i - 2].strip() == under.strip()
        style = (m.group(1), overlined)
        if style not in styles:
            styles.append(style)
        out.append(Heading(offsets[i - 1], styles.index(style) + 1, title))
    return out


_ASCIIDOC_TITLE = re.compile(r"^(={1,6})\s+(\S.*?)\s*$")
_BLOCK_ATTRIBUTE = re.compile(r"^\[[^\]]*\]$")
_ANCHOR = re.compile(r"\[\[[^\]]*\]\]")  # AsciiDoc's [[id]] beside a title


def text_headings(text: str) -> list[Heading]:
    """Headings of a plain ``.txt`` file. AsciiDoc's one-line titles (``== Title``) when the
    file has any; else titles underlined as in reST, setext Markdown and AsciiDoc's two-line
    titles (``NAME`` over ``----``: Git's manual pages); else Markdown ``#`` lines. Lines inside
    a delimited block are code, not titles: AsciiDoc fences code with a line of ``----`` (or
    ``....``, ``====``) that, unlike an underline, has no text directly above it, and a line of
    code above the closing fence ("}", "$ git revert HEAD") would read as an underlined title.
    An underlined title must also follow a blank line and hold a word. Without this a manual
    page's chunks had no heading path, and ``# a shell comment`` in its examples became one."""
    lines = text.split("\n")
    starts: dict[int, int] = {}  # a line's offset -> its index
    fenced: set[int] = set()
    fence = None
    one_line = []
    offset = 0
    for i, line in enumerate(lines):
        starts[offset] = i
        stripped = line.strip()
        if fence is not None:
            fenced.add(i)
            if stripped == fence:
                fence = None
        elif (
            _RST_UNDERLINE.match(line)
            and len(stripped) >= 4
            and (i == 0 or not lines[i - 1].strip() or _BLOCK_ATTRIBUTE.match(lines[i - 1].strip()))
        ):
            fence = stripped
            fenced.add(i)
        elif m := _ASCIIDOC_TITLE.match(line):
            one_line.append(Heading(offset, len(m.group(1)), _ANCHOR.sub("", m.group(2)).strip()))
        offset += len(line) + 1
    if one_line:
        return one_line
    styles: list[str] = []
    out = []
    for h in rst_headings(text):
        i = starts[h.offset]
        if i in fenced or not re.search(r"\w", h.title) or (i and lines[i - 1].strip()):
            continue
        style = lines[i + 1].strip()[0]
        if style not in styles:
            styles.append(style)
        title = _ANCHOR.sub("", h.title).strip() or h.title
        out.append(Heading(h.offset, styles.index(style) + 1, title))
    return out or markdown_headings(text, setext=False)  # its underlines were weighed above


# ---------------------------------------------------------------------------- format loaders


def _decode(path: Path, data: bytes) -> str:
    if b"\x00" in data[:8192]:
        raise DocumentError(path, "binary file (contains NUL bytes)")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise DocumentError(
            path,
            f"not valid UTF-8 (byte 0x{data[e.start]:02x} at offset {e.start}); re-save it as UTF-8",
        ) from None


def _load_html(
    path: Path, data: bytes, deadline: Deadline, skip_noindex: bool
) -> tuple[str, list[Heading]]:
    page = _decode(path, data)
    if skip_noindex and asks_noindex(page):
        raise DocumentError(path, NOINDEX)
    text = clean_text(_html_text(page, deadline))
    return text, markdown_headings(text)


def _load_pdf(
    path: Path, limits: Limits, deadline: Deadline
) -> tuple[str, list[Heading], list[int]]:
    """A PDF's pages read within ``limits``, cleaned, with running lines, line-end hyphens and
    dot leaders mended, the outline's headings and where each page starts
    (:mod:`rag.documents.pdf`)."""
    pages, entries = read_pdf(path, limits, deadline)
    text, headings, starts = pdf_text([clean_text(page) for page in pages], entries)
    deadline.check()
    return text, [Heading(*h) for h in headings], starts


def _docx_table(table: Any) -> str:
    """A Word table as Markdown rows ("| port | 7860 |", a ``|---|`` rule under the first), so
    each row stays one piece of evidence with its cells side by side (rag.answer.evidence
    reads a Markdown table's rows as units). A cell merged across columns is written once; a
    ``|`` inside a cell is escaped. A table python-docx cannot lay out gives its words in order."""
    try:
        lines = []
        for i, row in enumerate(table.rows):
            cells: list[str] = []
            seen: list[Any] = []  # a merged cell is the same element in each column it spans
            for cell in row.cells:
                if any(cell._tc is tc for tc in seen):
                    continue
                seen.append(cell._tc)
                cells.append(" ".join(cell.text.split()).replace("|", "\\|"))
            if any(cells):
                lines.append(markdown_row(cells))
                if i == 0 and len(table.rows) > 1:
                    lines.append("|" + "---|" * len(cells))
        return "\n".join(lines)
    except Exception:  # noqa: BLE001 - a malformed grid still has its words
        return " ".join(t.text or "" for t in table._tbl.iter() if t.tag.endswith("}t"))


def _load_docx(path: Path, limits: Limits, deadline: Deadline) -> tuple[str, list[Heading]]:
    """A Word document's paragraphs and tables in document order (tables as Markdown rows,
    :func:`_docx_table`; before 2026-12-07 tables were left out, and a manual's settings and
    specifications are often tables), its heading styles as headings."""
    try:
        import docx
    except ImportError:
        raise DocumentError(
            path, "reading .docx needs the 'docx' extra (pip install python-docx)"
        ) from None
    check_zip(path, limits.max_bytes)
    deadline.check()
    try:
        document = docx.Document(str(path))
    except Exception as e:  # python-docx raises several unrelated types for corrupt files
        raise DocumentError(path, f"unreadable .docx ({e})") from None
    parts, headings, offset = [], [], 0
    for block in document.iter_inner_content():
        deadline.check()
        if not hasattr(block, "rows"):  # a paragraph
            text = block.text.strip()
            style = (block.style.name or "").lower() if block.style is not None else ""
            if text and style.startswith("heading") and style[-1:].isdigit():
                headings.append(Heading(offset, int(style[-1]), text))
        else:
            text = _docx_table(block).strip()
        if not text:
            continue
        parts.append(text)
        offset += len(text) + 2
        if offset > limits.max_text_chars:
            _too_long(path, limits)
    return "\n\n".join(parts), headings


# A file read without error that holds no text once cleaned: a blank file, an HTML page that is
# navigation only (mdBook's toc.html). Not a failure: rag.ingest passes it over as skipped.
NO_TEXT = "no text (empty after cleaning)"
# An HTML page whose head asks not to be indexed (rag.documents.html.asks_noindex), passed over
# like NO_TEXT unless --no-skip-noindex.
NOINDEX = (
    'the page asks not to be indexed (<meta name="robots" content="noindex">; '
    "--no-skip-noindex reads it)"
)
PASSED_OVER = (NO_TEXT, NOINDEX)  # reasons rag.ingest reports as skipped, not failed
# a PDF whose pages hold no characters is, nearly always, scanned pages: say what would help
SCANNED_PDF = "no text on its pages (scanned images? make it searchable first, e.g. with ocrmypdf)"


def load_document(
    path: str | Path,
    max_bytes: int = DEFAULT_MAX_BYTES,
    limits: Limits | None = None,
    deadline: Deadline | None = None,
) -> Document:
    """Load one file into a :class:`Document` within ``limits`` (default: :class:`Limits` with
    ``max_bytes``); raise :class:`DocumentError` saying why not, whatever went wrong (a
    parser's own exception becomes its :func:`failure_reason`). ``deadline``: the file's time
    bound when the caller goes on to chunk it within the same bound (default: a new one of
    ``limits.max_seconds``)."""
    path = Path(path)
    limits = limits or Limits(max_bytes=max_bytes)
    deadline = deadline or Deadline(path, limits.max_seconds)
    try:
        size = path.stat().st_size
        if path.is_dir():
            raise DocumentError(path, "is a directory")
        if size > limits.max_bytes:
            raise DocumentError(path, f"too large ({size:,} bytes > limit {limits.max_bytes:,})")
        suffix = _suffix_of(path)
        if size == 0 and suffix not in HTML_SUFFIXES + TEXT_SUFFIXES:
            raise DocumentError(path, "empty file")  # a PDF or .docx of no bytes is broken
        pages: list[int] = []
        if suffix == ".pdf":
            text, headings, pages = _load_pdf(path, limits, deadline)
        elif suffix == ".docx":
            text, headings = _load_docx(path, limits, deadline)
        else:
            data = path.read_bytes()
            if suffix in HTML_SUFFIXES:
                text, headings = _load_html(path, data, deadline, limits.skip_noindex)
            elif suffix in TEXT_SUFFIXES:
                text = _decode(path, data)
                if suffix in MARKDOWN_SUFFIXES:
                    text = drop_html_comments(text)
                text = clean_text(text)
                headings = (
                    rst_headings(text)
                    if suffix == ".rst"
                    else text_headings(text)
                    if suffix == ".txt"
                    else markdown_headings(text)
                )
            else:
                raise DocumentError(path, f"unsupported file type '{suffix or path.name}'")
    except DocumentError:
        raise
    except OSError as e:
        reason = e.strerror or str(e)
        if e.errno == 40:
            reason = "symbolic link loop"
        raise DocumentError(path, reason) from None
    except Exception as e:  # noqa: BLE001 - a parser's surprise is this file's failure only
        raise DocumentError(path, failure_reason(e)) from None
    if not text.strip() and pages:  # pages, no characters: images of pages, a scan
        raise DocumentError(path, SCANNED_PDF)
    if not text.strip():
        raise DocumentError(path, NO_TEXT)
    if len(text) > limits.max_text_chars:
        _too_long(path, limits)
    deadline.check()
    return Document(path=str(path), text=text, headings=headings, pages=pages)


def load_documents(
    paths: Iterable[str | Path],
    suffixes: tuple[str, ...] = SUPPORTED_SUFFIXES,
    max_bytes: int = DEFAULT_MAX_BYTES,
    follow_links: bool = False,
) -> tuple[list[Document], list[DocumentError]]:
    """Load every supported file under ``paths``; failures are collected, never raised."""
    docs: list[Document] = []
    errors: list[DocumentError] = []
    for item in iter_files(paths, suffixes, follow_links=follow_links):
        if isinstance(item, DocumentError):
            errors.append(item)
            continue
        try:
            docs.append(load_document(item, max_bytes=max_bytes))
        except DocumentError as e:
            errors.append(e)
    return docs, errors
