"""Does any document of the index hold this text? The exact look-up behind the answerability
check's literal terms (:func:`rag.answer.answerability.unmentioned`).

BM25's vocabulary cannot answer it: its tokens are stemmed words, so ``--auto-rebase-remote``
becomes "auto", "rebas", "remot", all of which a Git manual holds, and a quoted phrase becomes
words that each occur somewhere. So the chunks' texts are joined once, lower-cased with their
whitespace collapsed (a phrase wrapped over two lines still matches), and a term is a substring
search in that string: one pass of CPython's fast search, milliseconds for a manual of tens of
megabytes. The string is built on the first look-up (most questions name no literal term) and
costs about the text's own size in memory.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Sequence


def normalise(text: str) -> str:
    """Lower case, runs of whitespace as one space, no outer spaces."""
    return " ".join(text.lower().split())


class CorpusText:
    """The texts ``texts()`` gives, searchable for literal phrases (module docstring)."""

    def __init__(self, texts: Callable[[], Iterable[str]]):
        self._texts = texts
        self._joined: str | None = None
        self._lock = threading.Lock()

    def _haystack(self) -> str:
        if self._joined is None:
            with self._lock:  # one thread builds it; the others wait for it
                if self._joined is None:
                    # "\n" never occurs in a normalised text: no match spans two chunks
                    self._joined = "\n".join(normalise(t) for t in self._texts())
        return self._joined

    def mentions(self, phrases: Sequence[str]) -> list[bool]:
        """For each phrase, whether some text holds it (case and spacing aside); an empty
        phrase is held by all."""
        if not phrases:
            return []
        haystack = self._haystack()
        return [normalise(p) in haystack for p in phrases]
