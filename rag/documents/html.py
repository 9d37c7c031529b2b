"""The text of an HTML document, read by a small scanner of our own.

:func:`_html_events` is linear in the text whatever the markup: building BeautifulSoup's tree
costs time quadratic in the nesting depth (``'<div>' * 100000`` ran past 300 s), and the standard
library's ``html.parser`` backtracks on malformed tags (``'<a ' * 4000``: 3 s, growing faster
than the square) in one call no deadline can interrupt. Only text, tag names and where tags end
matter here, so the scanner keeps a counter of dropped elements and the current heading, not a
tree (:func:`_html_text`); the file's :class:`~rag.documents.limits.Deadline` is checked every
:data:`HTML_CHECK_EVERY` tags.
"""

from __future__ import annotations

import html
import re
from collections.abc import Iterator

from rag.documents.limits import Deadline

_HTML_DROPPED = frozenset({"script", "style", "noscript", "template", "svg"})
_HTML_RAW = ("script", "style")  # raw text: no tag inside counts until the element's end tag
_HTML_BREAK_AFTER = frozenset({"p", "div", "li", "pre", "tr", "br", "section", "article"})
_HTML_HEADINGS = {f"h{n}": n for n in range(1, 7)}
_HTML_TAG = re.compile(r"<(/?)([a-zA-Z][a-zA-Z0-9:_-]*)")
_HTML_RAW_END = {t: re.compile(rf"</{t}[\s/>]", re.IGNORECASE) for t in _HTML_RAW}
HTML_CHECK_EVERY = 4096  # tags between two deadline checks


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


def _html_events(text: str, deadline: Deadline) -> Iterator[tuple[str, str, bool]]:
    """(kind, value, self-closing) events of an HTML text: ``data`` (entities unescaped),
    ``start`` and ``end`` (lower-case tag names); comments, declarations and processing
    instructions are skipped, as are the contents of ``<script>`` and ``<style>``. Linear in
    the text by construction (module docstring: why not html.parser or BeautifulSoup)."""
    find, pos, n, count = _Next(text), 0, len(text), 0
    while pos < n:
        lt = find("<", pos)
        if lt == -1:
            yield "data", html.unescape(text[pos:]), False
            return
        if lt > pos:
            yield "data", html.unescape(text[pos:lt]), False
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
                yield "data", "<", False
                pos = lt + 1
            continue
        gt = _tag_end(text, m.end(), find)
        if gt == -1:  # a tag that never ends: the rest is not text
            return
        tag, closing = m.group(2).lower(), bool(m.group(1))
        yield ("end" if closing else "start"), tag, text[gt - 1] == "/"
        pos = gt + 1
        if not closing and tag in _HTML_RAW and text[gt - 1] != "/":
            end = _HTML_RAW_END[tag].search(text, pos)
            pos = n if end is None else end.start()


def _html_text(text: str, deadline: Deadline) -> str:
    """The text of an HTML document: dropped elements' content skipped (a depth counter, not
    a tree), a newline after block elements, ``<h1>``–``<h6>`` as ``#`` lines."""
    parts: list[str] = []
    dropped = 0  # open elements whose content is dropped
    heading: tuple[int, list[str]] | None = None  # (level, its text so far)
    for kind, value, self_closing in _html_events(text, deadline):
        if kind == "data":
            if not dropped:
                (heading[1] if heading is not None else parts).append(value)
        elif value in _HTML_DROPPED:
            if kind == "end":
                dropped = max(0, dropped - 1)
            elif not self_closing:
                dropped += 1
        elif dropped:
            continue
        elif value in _HTML_HEADINGS:
            if kind == "start" and heading is None:
                heading = (_HTML_HEADINGS[value], [])
            elif kind == "end" and heading is not None:
                title = " ".join(" ".join(heading[1]).split())
                parts.append(f"\n\n{'#' * heading[0]} {title}\n\n")
                heading = None
        elif value in _HTML_BREAK_AFTER and (kind == "end" or value == "br"):
            (heading[1] if heading is not None else parts).append("\n")
    if heading is not None:  # a heading never closed: its words are text
        parts.extend(heading[1])
    return "".join(parts)
