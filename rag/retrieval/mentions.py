"""Does any document of the index hold this text? The exact look-up behind the answerability
check's literal terms (:func:`rag.answer.answerability.unmentioned`).

BM25's vocabulary cannot answer it: its tokens are stemmed words, so ``--auto-rebase-remote``
becomes "auto", "rebas", "remot", all of which a Git manual holds, and a quoted phrase becomes
words that each occur somewhere. So the chunks' texts are joined once, lower-cased with their
whitespace collapsed (a phrase wrapped over two lines still matches), and a term is a substring
search in that string: one pass of CPython's fast search, milliseconds for a manual of tens of
megabytes. The string is built on the first look-up (most questions name no literal term) and
costs about the text's own size in memory. A phrase not found as written is looked up again
with the accents of both sides taken off (users type "Gospic" for "Gospić"): a second string,
built on the first such look-up, and only for a text that has any non-ASCII character.
"""

from __future__ import annotations

import re
import threading
import unicodedata
from collections.abc import Callable, Iterable, Sequence


def normalise(text: str) -> str:
    """Lower case, runs of whitespace as one space, no outer spaces."""
    return " ".join(text.lower().split())


_MARKS = re.compile(r"[\u0300-\u036f]")  # combining accents, once NFKD has split them off


def fold(text: str) -> str:
    """``text`` without its accents ("Gospić" → "Gospic"): users type names without them."""
    return _MARKS.sub("", unicodedata.normalize("NFKD", text))


class CorpusText:
    """The texts ``texts()`` gives, searchable for literal phrases (module docstring)."""

    def __init__(self, texts: Callable[[], Iterable[str]]):
        self._texts = texts
        self._joined: str | None = None
        self._folded: str | None = None
        self._lock = threading.Lock()

    def _haystack(self) -> str:
        if self._joined is None:
            with self._lock:  # one thread builds it; the others wait for it
                if self._joined is None:
                    # "\n" never occurs in a normalised text: no match spans two chunks
                    self._joined = "\n".join(normalise(t) for t in self._texts())
        return self._joined

    def _folded_haystack(self) -> str:
        if self._folded is None:
            joined = self._haystack()
            folded = joined if joined.isascii() else fold(joined)
            with self._lock:
                self._folded = folded
        return self._folded

    def mentions(self, phrases: Sequence[str]) -> list[bool]:
        """For each phrase, whether some text holds it (case, spacing and accents aside: a
        phrase not found as written is looked up again with the accents of both taken off,
        :func:`fold`); an empty phrase is held by all."""
        if not phrases:
            return []
        haystack = self._haystack()
        found = [normalise(p) in haystack for p in phrases]
        for i, p in enumerate(phrases):
            if not found[i]:
                found[i] = fold(normalise(p)) in self._folded_haystack()
        return found
