"""The text of an HTML document, read by a small scanner of our own.

:func:`_html_events` is linear in the text whatever the markup: building BeautifulSoup's tree
costs time quadratic in the nesting depth (``'<div>' * 100000`` ran past 300 s), and the standard
library's ``html.parser`` backtracks on malformed tags (``'<a ' * 4000``: 3 s, growing faster
than the square) in one call no deadline can interrupt. Only text, tag names, where tags end
and whether a link has an ``href`` matter here, so the scanner keeps a counter of dropped
elements, the current heading and the text's blocks with their link text, not a tree
(:func:`_html_text`; the page's navigation is told by its links, :func:`_navigation`); the
file's :class:`~rag.documents.limits.Deadline` is checked every :data:`HTML_CHECK_EVERY` tags.
"""

from __future__ import annotations

import html
import re
from collections.abc import Iterator
from dataclasses import dataclass, field

from rag.documents.limits import Deadline

_HTML_DROPPED = frozenset({"script", "style", "noscript", "template", "svg"})
_HREF = re.compile(r"\bhref\s*=", re.IGNORECASE)  # a link's attribute (an anchor has none)
_HTML_RAW = ("script", "style")  # raw text: no tag inside counts until the element's end tag
_HTML_BREAK_AFTER = frozenset(
    {"p", "div", "li", "pre", "tr", "br", "section", "article", "dt", "dd", "blockquote", "table"}
)
_HTML_CELLS = frozenset({"td", "th"})  # a table's cells: "| a | b |", one row a line
_SPACES = re.compile(r"\s+")
_CELL_BORDER = re.compile(r"[ \t]*(?<!\\)\|[ \t]*")  # a cell border, not a cell's own "\|"
_HTML_HEADINGS = {f"h{n}": n for n in range(1, 7)}
_HTML_TAG = re.compile(r"<(/?)([a-zA-Z][a-zA-Z0-9:_-]*)")
_HTML_RAW_END = {t: re.compile(rf"</{t}[\s/>]", re.IGNORECASE) for t in _HTML_RAW}
HTML_CHECK_EVERY = 4096  # tags between two deadline checks
NAV_MIN_LINKS = 3  # links in a menu block, or link-only blocks in a run, that make navigation
NAV_LINK_SHARE = 0.6  # share of a block's text in links at which a block of NAV_MIN_LINKS is one
NAV_LINK_ONLY = 0.9  # share at which a block is all link, a sidebar's or contents list's item


class _Next:
    """Where the next occurrence of each character is, found once and reused until the scan
    passes it: the searches of a whole scan together cost one pass over the text, whatever
    the markup (an unclosed tag or quote is searched for once, not once per ``<``)."""

    def __init__(self, text: str):
        self.text, self.at = text, {}

    def __call__(self, char: str, start: int) -> int:
        pos = self.at.get(char)
        if pos is None or (pos != -1 and pos < start):
            pos = self.at[char] = self.text.find(char, start)
        return pos


def _tag_end(text: str, start: int, find: _Next) -> int:
    """Index of the ``>`` that ends the tag whose attributes begin at ``start`` (quoted values
    may hold ``>``), or -1 when the tag never ends."""
    pos = start
    while True:
        gt = find(">", pos)
        quotes = [q for q in (find('"', pos), find("'", pos)) if q != -1 and (gt == -1 or q < gt)]
        if not quotes:
            return gt
        q = min(quotes)
        close = find(text[q], q + 1)
        if close == -1:  # an unclosed quote: the tag ends at the first '>' (as browsers recover)
            return gt
        pos = close + 1


def _html_events(text: str, deadline: Deadline) -> Iterator[tuple[str, str, str]]:
    """(kind, value, attributes) events of an HTML text: ``data`` (entities unescaped),
    ``start`` and ``end`` (lower-case tag names, with the tag's attribute text as written, a
    self-closing tag's ending in ``/``); comments, declarations and processing
    instructions are skipped, as are the contents of ``<script>`` and ``<style>``. Linear in
    the text by construction (module docstring: why not html.parser or BeautifulSoup)."""
    find, pos, n, count = _Next(text), 0, len(text), 0
    while pos < n:
        lt = find("<", pos)
        if lt == -1:
            yield "data", html.unescape(text[pos:]), ""
            return
        if lt > pos:
            yield "data", html.unescape(text[pos:lt]), ""
        count += 1
        if count % HTML_CHECK_EVERY == 0:
            deadline.check()
        if text.startswith("<!--", lt):
            end = text.find("-->", lt + 4)
            pos = n if end == -1 else end + 3
            continue
        m = _HTML_TAG.match(text, lt)
        if m is None:
            if text.startswith(("<!", "<?"), lt):  # <!DOCTYPE ...>, <?xml ...?>
                gt = find(">", lt)
                pos = n if gt == -1 else gt + 1
            else:  # a '<' that opens no tag is text
                yield "data", "<", ""
                pos = lt + 1
            continue
        gt = _tag_end(text, m.end(), find)
        if gt == -1:  # a tag that never ends: the rest is not text
            return
        tag, closing = m.group(2).lower(), bool(m.group(1))
        yield ("end" if closing else "start"), tag, text[m.end() : gt]
        pos = gt + 1
        if not closing and tag in _HTML_RAW and text[gt - 1] != "/":
            end = _HTML_RAW_END[tag].search(text, pos)
            pos = n if end is None else end.start()


def _visible(text: str) -> int:
    """Characters of ``text`` other than white space."""
    return len("".join(text.split()))


@dataclass
class _Block:
    """Text between two block boundaries, with what of it is link text (the reader's
    navigation: menus, sidebars, contents lists, "Next / Up / Home")."""

    parts: list[str] = field(default_factory=list)
    link_chars: int = 0  # non-space characters inside <a> elements
    links: int = 0  # <a> elements opened in it
    heading: bool = False
    code: bool = False  # holds text of a <pre> element
    pre: int = 0  # which <pre> element (counted from 1) outside a table row; 0: none
    row: bool = False  # starts a table row ("| a | b |")

    @property
    def chars(self) -> int:
        return sum(_visible(p) for p in self.parts)


def markdown_row(cells: list[str]) -> str:
    """A table row as Markdown, "| a | b |": how every loader writes a table (HTML here, Word in
    rag.documents.loaders), so the evidence reader takes each row as one unit
    (rag.answer.evidence). The cells come with their own ``|`` escaped."""
    return "| " + " | ".join(cells) + " |"


def _row(parts: list[str]) -> str:
    """A table row's text, its empty cells left out ("| | FFI: | | Introduction |" → "| FFI: |
    Introduction |", a layout table's spacers) and nothing at all for a row of empty cells; a
    row whose cells hold blocks of their own keeps its later lines as they are."""
    first, sep, rest = "".join(parts).partition("\n")
    cells = [c for c in _CELL_BORDER.split(first) if c.strip()]
    return (markdown_row(cells) + sep if cells else "") + rest


def _navigation(blocks: list[_Block]) -> set[int]:
    """Indices of the blocks that are navigation, told by their links as readers of a page tell
    it (link density, as boilerplate removers such as jusText and trafilatura measure it):

    - a block of :data:`NAV_MIN_LINKS` links or more whose text is mostly
      (:data:`NAV_LINK_SHARE`) link text: a menu line ("Next: Types, Previous: Simple Example,
      Up: Using libffi [Index]"), a contents list written without list items;
    - a run of :data:`NAV_MIN_LINKS` blocks or more that are each nearly all
      (:data:`NAV_LINK_ONLY`) link text: a sidebar or a contents list, one link per item.
      Blocks without text do not break a run; a heading, a block of prose or of code does.

    Code (a ``<pre>`` element) is never navigation, whatever it links. A paragraph that cites
    a few links, or a list whose items describe what they link to, stays."""
    dropped: set[int] = set()
    run: list[int] = []

    def close_run() -> None:
        if len(run) >= NAV_MIN_LINKS:
            dropped.update(run)
        run.clear()

    for i, block in enumerate(blocks):
        chars = block.chars
        if block.heading or block.code:
            close_run()
            continue
        if not chars:
            continue
        share = block.link_chars / chars
        if block.links >= NAV_MIN_LINKS and share >= NAV_LINK_SHARE:
            dropped.add(i)
        if block.links and share >= NAV_LINK_ONLY:
            run.append(i)
        else:
            close_run()
    close_run()
    return dropped


# A tag's name and content attributes, quoted or not.
_ATTRIBUTE = re.compile(
    r"""\b(name|content)\s*=\s*(?:"([^"]*)"|'([^']*)'|([^\s>]+))""", re.IGNORECASE
)
HEAD_CHARS = 65536  # where a page's head is looked for (a head past it is not a head)
NOINDEX_WORDS = frozenset({"noindex", "none"})  # robots directives that keep a page out


def asks_noindex(text: str) -> bool:
    """Whether an HTML page's head says ``<meta name="robots" content="noindex">`` (or
    ``none``): its author's word that the page repeats or leads to others and answers
    nothing by itself. mdBook writes it on ``print.html``, the whole book again in one page
    (indexed, it took half of the Cargo book's passages and its citations from the chapters),
    and on ``toc.html``. Read in the first :data:`HEAD_CHARS` characters before ``<body``,
    each ``<meta`` tag found with ``str.find`` from where the last one ended: linear, where a
    regular expression for the tag rescans to the end of a head of unclosed ``<meta``."""
    head = text[:HEAD_CHARS].lower()
    body = head.find("<body")
    head = head if body == -1 else head[:body]
    pos = head.find("<meta")
    while pos != -1:
        end = head.find(">", pos)
        if end == -1:
            return False
        attrs = {
            m.group(1): next(g for g in m.groups()[1:] if g is not None)
            for m in _ATTRIBUTE.finditer(head, pos, end + 1)
        }
        words = {w.strip() for w in attrs.get("content", "").split(",")}
        if attrs.get("name", "").strip() in ("robots", "googlebot") and words & NOINDEX_WORDS:
            return True
        pos = head.find("<meta", end)
    return False


def _html_text(text: str, deadline: Deadline) -> str:
    """The text of an HTML document: dropped elements' content skipped (a depth counter, not
    a tree), a newline after block elements, ``<h1>``–``<h6>`` as ``#`` lines, each ``<pre>``
    as a Markdown code fence (:func:`_fenced`), and the page's
    navigation left out (:func:`_navigation`: menus, sidebars and contents lists, which name
    every page and answer nothing; indexed, they filled chunks of their own)."""
    blocks: list[_Block] = [_Block()]
    dropped = 0  # open elements whose content is dropped
    in_link = False
    heading: tuple[int, list[str]] | None = None  # (level, its text so far)
    in_pre = 0  # open <pre> elements: code, never navigation
    pres = 0  # <pre> elements opened so far: a fence each (_fenced)
    in_row, cells = False, 0  # inside a <tr>; the cells opened in it so far
    tables = 0  # open <table> elements: the white space between their rows is layout
    for kind, value, attributes in _html_events(text, deadline):
        self_closing = attributes.endswith("/")
        if value == "pre" and kind != "data" and not self_closing and not dropped:
            in_pre = in_pre + 1 if kind == "start" else max(0, in_pre - 1)
            pres += kind == "start" and in_pre == 1
        if kind == "data":
            if not dropped:
                if heading is not None:
                    heading[1].append(value)
                else:
                    if in_row:  # a row is one line: its cells' own line breaks are spaces
                        value = _SPACES.sub(" ", value).replace("|", "\\|") if value.strip() else ""
                    elif tables and not value.strip():
                        value = ""  # indentation between rows would indent the next row
                    blocks[-1].parts.append(value)
                    blocks[-1].code = blocks[-1].code or in_pre > 0
                    if in_pre and not in_row and not blocks[-1].pre:
                        blocks[-1].pre = pres
                    if in_link:
                        blocks[-1].link_chars += _visible(value)
        elif value in _HTML_DROPPED:
            if kind == "end":
                dropped = max(0, dropped - 1)
            elif not self_closing:
                dropped += 1
        elif dropped:
            continue
        elif value == "a":  # a link, not an anchor (<a name=…> marks a place, often code)
            in_link = kind == "start" and _HREF.search(attributes) is not None
            blocks[-1].links += in_link
        elif value in _HTML_CELLS:
            if kind == "start" and heading is None:
                blocks[-1].parts.append(" | " if cells else "| ")
                cells += 1
        elif value in _HTML_HEADINGS:
            if kind == "start" and heading is None:
                heading = (_HTML_HEADINGS[value], [])
            elif kind == "end" and heading is not None:
                title = " ".join(" ".join(heading[1]).split())
                blocks += [_Block([f"\n\n{'#' * heading[0]} {title}\n\n"], heading=True), _Block()]
                heading = None
        elif value in _HTML_BREAK_AFTER and kind == "start" and value != "br":
            if value == "tr":
                if cells:  # the row before was never closed
                    blocks[-1].parts.append(" |\n")
                in_row, cells = True, 0
            elif value == "table" and not self_closing:
                tables += 1
            if heading is None and blocks[-1].parts:  # a block's start ends the text before it
                blocks.append(_Block())
                in_link = False
            if value == "tr" and heading is None:
                blocks[-1].row = True
        elif value in _HTML_BREAK_AFTER and (kind == "end" or value == "br"):
            if value in ("tr", "table"):
                if cells and heading is None and blocks[-1].row:  # not after a cell's own blocks
                    blocks[-1].parts.append(" |")
                in_row, cells = False, 0
                if value == "table":
                    tables = max(0, tables - 1)
            if heading is not None:
                heading[1].append("\n")
            else:
                blocks[-1].parts.append("\n")
                blocks.append(_Block())
                in_link = False  # a link never spans blocks (an unclosed <a> ends here)
    if heading is not None:  # a heading never closed: its words are text
        blocks[-1].parts.extend(heading[1])
    navigation = _navigation(blocks)
    pieces = [
        (
            block.pre,
            "".join(p for p in block.parts if p == "\n")
            if i in navigation
            else _row(block.parts)
            if block.row
            else "".join(block.parts),
        )
        for i, block in enumerate(blocks)
    ]
    return _fenced(pieces)


def _fenced(pieces: list[tuple[int, str]]) -> str:
    """The pieces' text, each ``<pre>`` element's (the pieces of one ``pre`` number, white
    space between them included) as a Markdown code fence: the page's code is then what a
    Markdown manual's is, one unit of evidence read line by line (rag.answer.evidence), and a
    shell or TOML comment in it ("# Use the vendored sources") is no heading
    (rag.documents.loaders.markdown_headings skips fences). The fence is ``~~~`` where the code
    holds three backticks, and nothing where it holds both."""
    out: list[str] = []
    i = 0
    while i < len(pieces):
        pre, text = pieces[i]
        if not pre:
            out.append(text)
            i += 1
            continue
        code = [text]
        i += 1
        while i < len(pieces) and (pieces[i][0] == pre or not pieces[i][1].strip()):
            if pieces[i][0] not in (0, pre):
                break
            code.append(pieces[i][1])
            i += 1
        body = "".join(code).strip("\n")
        fence = "```" if "```" not in body else "~~~" if "~~~" not in body else ""
        out.append(f"\n\n{fence}\n{body}\n{fence}\n\n" if fence else body)
    return "".join(out)
