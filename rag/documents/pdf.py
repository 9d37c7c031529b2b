"""PDF loading: a page's text as a reader sees it, and the sections the PDF's outline names.

pypdf extracts the characters of each page in drawing order, which for a manual means its
running header ("Chapter 4: Function reference 10") and footer (a page number) on every page,
words broken at line ends by the typesetter ("manip-" / "ulation"), and contents pages whose
dot leaders fill a chunk with ". . . . ." tokens. Indexed as extracted, those were quoted under
answers as the manual's sentences ("… the order to perform the checks 14"), and with no headings
every citation named the file alone. What this module adds to pypdf's text, page by page:

- running headers and footers dropped (:func:`drop_running_lines`): a line among the first or
  last two of a page whose shape (digits as ``#``) recurs at that edge of three pages or more;
- words rejoined across line-end hyphens (:func:`join_hyphenated`), the document's own words
  deciding between "configuration" and "command-line";
- dot leaders shortened to " … ";
- headings from the outline (bookmarks, :func:`outline_headings`): each entry's title at the
  line of its page that shows it, else at the page's start, its depth as the level; a PDF
  without an outline has no headings, as before.

Why hand-written: pypdf gives characters and the outline; PyMuPDF and pdfplumber (what
LlamaIndex and unstructured use for this) are not dependencies here and would read the same
characters; the clean-up above is a few linear passes over the extracted text.
"""

from __future__ import annotations

import itertools
import logging
import re
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from rag.documents.limits import (
    PDF_CHECK_EVERY,
    Deadline,
    DocumentError,
    Limits,
    _too_long,
    failure_reason,
)

# a Heading is built by the caller's class; this module returns (offset, level, title) triples
HeadingTriple = tuple[int, int, str]

RUNNING_EDGE = 2  # lines at the top and at the bottom of a page that may be a running line
RUNNING_MIN_PAGES = 3  # pages a line's shape must recur on, at the same edge, to be dropped
NAVIGATION_MIN_LINES = 5  # dot-leader lines a contents or index page has at least
HEADING_SCAN_LINES = 400  # lines of its page searched for an outline entry's title
MAX_OUTLINE_ENTRIES = 10_000  # an outline is read up to this many entries (a hostile one is not)

_DIGITS = re.compile(r"\d+")
_SPACE = re.compile(r"\s+")
# a word broken at a line end: letters, a hyphen, the line break, letters (lower case after);
# \b first, so a long run of letters is tried from its start only (linear, not quadratic)
_HYPHEN_BREAK = re.compile(r"\b([^\W\d_]+)-\n([a-z][^\W\d_]*)")
# an identifier broken after an underscore ("ASN1_" / "PRINT_NAME"): a letter or digit, one
# underscore, the break, a letter ("__NOGLOBS__" / "50:text" is a line end)
_UNDERSCORE_BREAK = re.compile(r"([^\W_]_)\n([^\W\d_])")
_WORD = re.compile(r"[^\W\d_]+(?:-[^\W\d_]+)*")
_LEADER = re.compile(r"(?: ?\.){4,} ?")  # a contents page's dot leaders, ". . . . ." or "....."
_LEADER_ENTRY = re.compile(r"(?: ?\.){4,} ?[\divxlcIVXLC]+$")  # "… . . . . 5" ends a contents line
_KEY = re.compile(r"[\W_]+")
# a number that starts or ends a line, as a page number is printed ("6", "- 6 -", "… 6")
_EDGE_NUMBER = re.compile(r"^\W*(\d{1,5})\b|\b(\d{1,5})\W*$")


def _shape(line: str) -> str:
    """What a running line keeps from page to page: its words, its numbers as ``#``."""
    return _DIGITS.sub("#", _SPACE.sub(" ", line.strip()).casefold())


def _edges(lines: list[str]) -> Iterator[tuple[str, int]]:
    """(edge, index) of the first and last :data:`RUNNING_EDGE` non-empty lines of a page."""
    filled = [i for i, line in enumerate(lines) if line.strip()]
    for i in filled[:RUNNING_EDGE]:
        yield "top", i
    for i in filled[-RUNNING_EDGE:]:
        if i not in filled[:RUNNING_EDGE]:
            yield "bottom", i


def _page_number(line: str) -> int | None:
    """The number a line starts or ends with ("Chapter 3: Utilities 6", "6 Utilities", "- 6 -"),
    if any: what a running header or footer prints as the page's number."""
    m = _EDGE_NUMBER.search(line)
    return int(m.group(1) or m.group(2)) if m else None


def drop_running_lines(pages: list[str], titles: dict[int, list[str]] | None = None) -> list[str]:
    """``pages`` without their running headers and footers. A line among the first or last
    :data:`RUNNING_EDGE` non-empty lines of a page is one when

    - its :func:`_shape` recurs at the same edge of at least :data:`RUNNING_MIN_PAGES` pages
      and holds a letter or a digit (a lone ``}`` at the top of three pages of code is content),
      except on the first page, where the running header's words are the document's title, or
    - it starts or ends with the page's printed number: the number minus the page's index is
      the same for at least :data:`RUNNING_MIN_PAGES` such lines of the document (a chapter's
      header names the chapter, so in a two-page chapter its shape recurs twice only).

    A line that shows one of the page's ``titles`` (the :func:`_key` of the outline entries of
    that page index) is a heading, never a running line: "1 Introduction" at the top of
    printed page 1 starts with the page's number. A document of fewer pages is returned as it
    is."""
    if len(pages) < RUNNING_MIN_PAGES:
        return pages
    split = [page.split("\n") for page in pages]
    # each page's edge lines, read once: (edge, line index, shape, printed number)
    marks = [
        [(edge, i, _shape(lines[i]), _page_number(lines[i])) for edge, i in _edges(lines)]
        for lines in split
    ]
    counts: Counter[tuple[str, str]] = Counter()
    offsets: Counter[int] = Counter()
    for index, edges in enumerate(marks):
        counts.update({(edge, shape) for edge, _, shape, _ in edges})
        offsets.update({n - index for *_, n in edges if n is not None})
    running = {
        key
        for key, n in counts.items()
        if n >= RUNNING_MIN_PAGES and any(ch.isalnum() for ch in key[1])
    }
    offset, n = offsets.most_common(1)[0] if offsets else (None, 0)
    if n < RUNNING_MIN_PAGES:
        offset = None
    if not running and offset is None:
        return pages
    out = []
    for index, (lines, edges) in enumerate(zip(split, marks)):
        keys = (titles or {}).get(index, [])
        drop = {
            i
            for edge, i, shape, number in edges
            if (
                (index and (edge, shape) in running)
                or (offset is not None and number == index + offset)
            )
            and not any(_shows(_key(lines[i]), key) for key in keys)
        }
        out.append("\n".join(line for i, line in enumerate(lines) if i not in drop))
    return out


def join_hyphenated(text: str, vocabulary: set[str]) -> str:
    """``text`` with words broken at line ends put back together: "manip-\\nulation" becomes
    "manipulation" (a typesetter's hyphen), "command-\\nline" becomes "command-line" (a
    compound's own hyphen), decided by ``vocabulary`` (the document's words, lower case): the
    joined word if the document has it, else the hyphenated one if it has that, else the
    hyphenated one if both halves are words of it, else the joined word (the halves of a
    typesetter's break, "manip" and "ulation", are not words). An identifier broken after an
    underscore is joined as it is."""

    def mend(m: re.Match[str]) -> str:
        left, right = m.group(1), m.group(2)
        joined, hyphened = (left + right).lower(), f"{left}-{right}".lower()
        if joined in vocabulary:
            return left + right
        if hyphened in vocabulary or (left.lower() in vocabulary and right.lower() in vocabulary):
            return f"{left}-{right}"
        return left + right

    return _UNDERSCORE_BREAK.sub(r"\1\2", _HYPHEN_BREAK.sub(mend, text))


def _vocabulary(pages: list[str]) -> set[str]:
    """Every word of the pages (lower case, a hyphenated compound both whole and split), the
    words that end or start a line at a hyphen break left out: they are the halves in doubt."""
    words: set[str] = set()
    for page in pages:
        for m in _WORD.finditer(_HYPHEN_BREAK.sub(" ", page)):
            word = m.group().lower()
            words.add(word)
            words.update(word.split("-"))
    return words


def _outline_entries(reader: Any, deadline: Deadline) -> list[tuple[int, Any]]:
    """(depth, destination) of the outline's entries in order, at most
    :data:`MAX_OUTLINE_ENTRIES`, walked with a stack (pypdf nests a parent's children as a list
    after it). pypdf builds that nesting by recursion: an outline nested deeper than Python's
    recursion limit raises there, and :func:`read_pdf` then gives no headings."""
    entries: list[tuple[int, Any]] = []
    stack: list[tuple[int, Iterator[Any]]] = [(0, iter(reader.outline))]
    while stack and len(entries) < MAX_OUTLINE_ENTRIES:
        depth, items = stack[-1]
        item = next(items, None)
        if item is None:
            stack.pop()
        elif isinstance(item, list):
            stack.append((depth + 1, iter(item)))
        else:
            entries.append((depth, item))
            if len(entries) % PDF_CHECK_EVERY == 0:
                deadline.check()
    return entries


def _key(text: str) -> str:
    """A title's or line's letters and digits, case-folded: what a heading and the line that
    shows it have in common ("2.2. The source XML files", "2.2 The source XML files")."""
    return _KEY.sub("", text).casefold()


def _shows(line_key: str, key: str) -> bool:
    """Whether a line shows a title (both as :func:`_key`): the line holds the title's letters
    and digits with at most a numbering's worth more ("22naming" for "naming")."""
    return key in line_key and len(line_key) <= len(key) + 12


def outline_headings(
    entries: list[tuple[int, str, int]], pages: list[str], starts: list[int]
) -> list[HeadingTriple]:
    """Headings from outline ``entries`` (depth, title, page index): each at the start of the
    line of its page that shows its title (the line's letters and digits contain the title's,
    with at most a numbering's worth more: "2.2 Naming" for "Naming"), searched from the last
    heading found on that page on, at most :data:`HEADING_SCAN_LINES` lines (so a hostile
    outline of many entries on one huge page costs a bounded scan each), else at the page's
    start. ``pages`` are the pages' final texts, ``starts`` their offsets in the document; an
    entry of a page left empty (a contents or index page, a blank one) names no text and is
    skipped."""
    found: list[HeadingTriple] = []
    lines: dict[int, list[tuple[int, str]]] = {}  # a page's lines: (offset, letters and digits)
    cursor: dict[int, int] = {}  # the line after the last heading found on a page
    for depth, title, page in entries:
        if not 0 <= page < len(pages) or not pages[page] or not (key := _key(title)):
            continue
        if page not in lines:
            offsets = itertools.accumulate(
                (len(line) + 1 for line in pages[page].split("\n")), initial=0
            )
            lines[page] = [(at, _key(line)) for at, line in zip(offsets, pages[page].split("\n"))]
        at, first = 0, cursor.get(page, 0)
        for i in range(first, min(first + HEADING_SCAN_LINES, len(lines[page]))):
            offset, line_key = lines[page][i]
            if _shows(line_key, key):
                at, cursor[page] = offset, i + 1
                break
        found.append((starts[page] + at, depth + 1, " ".join(title.split())))
    found.sort(key=lambda h: h[0])  # stable: entries of one offset keep the outline's order
    return found


def read_pdf(
    path: Path, limits: Limits, deadline: Deadline
) -> tuple[list[str], list[tuple[int, str, int]]]:
    """Each page's text as pypdf extracts it, and the outline's entries as (depth, title, page
    index), within ``limits``: at most ``max_pages`` pages, each page's decompressed content at
    most ``max_bytes`` (so no page's extraction parses more than that), and the deadline
    checked every :data:`PDF_CHECK_EVERY` operators inside a page's extraction (a one-page PDF
    of 900,000 ``Tj`` operators took 471 s in one call). Whatever pypdf raises
    (``LimitReachedError`` for a page tree deeper than 100 or a stream that decompresses beyond
    its cap, ``RecursionError``, ...) is this file's failure; an outline pypdf cannot read only
    costs the headings."""
    # pypdf logs its repairs of damaged files ("Ignoring wrong pointing object ...") as
    # warnings; without a handler Python prints them on stderr between ingest's own one-line
    # failure reports. A file it cannot read still raises and is reported once, by us.
    logging.getLogger("pypdf").setLevel(logging.ERROR)
    from pypdf import PdfReader
    from pypdf.errors import FileNotDecryptedError

    ops = itertools.count(1)

    def every_operator(*_: Any) -> None:  # pypdf's visitor, called before each operator
        if next(ops) % PDF_CHECK_EVERY == 0:
            deadline.check()

    try:
        reader = PdfReader(str(path))
        if (n := len(reader.pages)) > limits.max_pages:
            raise DocumentError(
                path, f"too many pages ({n:,} > limit {limits.max_pages:,}; --max-pages)"
            )
        pages, chars = [], 0
        for number, page in enumerate(reader.pages, start=1):
            deadline.check()
            contents = page.get_contents()
            size = len(contents.get_data()) if contents is not None else 0
            if size > limits.max_bytes:
                raise DocumentError(
                    path,
                    f"page {number} content expands to {size:,} bytes "
                    f"(> limit {limits.max_bytes:,}; --max-bytes)",
                )
            pages.append(page.extract_text(visitor_operand_before=every_operator) or "")
            chars += len(pages[-1])
            if chars > limits.max_text_chars:
                _too_long(path, limits)
    except DocumentError:
        raise
    except Exception as e:  # noqa: BLE001 - pypdf raises many types on hostile files
        if isinstance(e, FileNotDecryptedError):  # a user password, not only an owner's
            raise DocumentError(
                path, "password-protected PDF: save a copy without the password"
            ) from None
        raise DocumentError(path, f"unreadable PDF ({failure_reason(e)})") from None
    entries: list[tuple[int, str, int]] = []
    try:
        for depth, item in _outline_entries(reader, deadline):
            page = reader.get_destination_page_number(item)
            if isinstance(page, int) and page >= 0:
                entries.append((depth, str(item.title or ""), page))
    except DocumentError:
        raise
    except Exception:  # noqa: BLE001 - a broken outline costs the headings, not the text
        entries = []
    return pages, entries


def is_navigation(page: str) -> bool:
    """A contents or index page: at least :data:`NAVIGATION_MIN_LINES` of its lines, and half
    of those longer than an index's letter ("A", "B", …), end in a dot leader and a page
    number ("asn1Coding program . . . . . 5"). Such a page names every topic and answers none: indexed, it was retrieved
    first for "Which ASN.1 types does libtasn1 not handle?" and quoted as the answer."""
    lines = [line for line in page.split("\n") if len(line.strip()) > 2]
    entries = sum(1 for line in lines if _LEADER_ENTRY.search(line[-80:]))
    return entries >= NAVIGATION_MIN_LINES and entries * 2 >= len(lines)


def _tidy(page: str) -> str:
    """A page after this module's edits, laid out as ``clean_text`` leaves text: no trailing
    spaces, no run of blank lines, no blank lines at either end. Not ``clean_text`` itself:
    the page went through it already (NFC, control characters), and ``rag.documents.loaders``
    imports this module, not the other way round."""
    return re.sub(r"\n{3,}", "\n\n", re.sub(r"[ \t]+\n", "\n", page)).strip()


def pdf_text(
    pages: list[str], entries: list[tuple[int, str, int]]
) -> tuple[str, list[HeadingTriple], list[int]]:
    """The document text of ``pages`` (each already through ``clean_text``) and its headings
    as (offset, level, title) from the outline ``entries`` of :func:`read_pdf`: running lines
    dropped, contents and index pages left out, hyphenated words joined, dot leaders shortened
    (the module docstring), the non-empty pages separated by a blank line; and where each page
    starts in that text (a page left empty starts where the next one does)."""
    titles: dict[int, list[str]] = {}
    for _, title, page in entries:
        titles.setdefault(page, []).append(_key(title))
    pages = drop_running_lines(pages, titles)
    vocabulary = _vocabulary(pages)  # an index page's words count ("command-line tool")
    pages = ["" if is_navigation(p) else p for p in pages]
    pages = [_tidy(_LEADER.sub(" … ", join_hyphenated(p, vocabulary))) for p in pages]
    starts, offset, kept = [], 0, []
    for page in pages:
        starts.append(offset)
        if page:
            kept.append(page)
            offset += len(page) + 2  # the blank line between two pages
    text = "\n\n".join(kept)
    headings = [
        (min(at, len(text)), level, title)
        for at, level, title in outline_headings(entries, pages, starts)
    ]
    return text, headings, starts
