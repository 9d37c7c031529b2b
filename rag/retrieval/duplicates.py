"""Near-duplicate hits: the same text met twice among a search's best candidates.

A folder often holds one document twice: a manual as ``fs.html`` and as its source ``fs.md``,
a PDF beside the Word file it was exported from, ``guide.md`` and ``guide (copy).md``. Their
chunks are cut at other places and differ in markup, so no two are equal, but they say the same
thing, and both rank: the passages a decoder reads then say fewer things, and the quotes under
an answer say one sentence twice (measured in docs/retrieval.md, *Near-duplicate hits*).

A hit is a near-duplicate of a better one when the word trigrams of the smaller of the two are
mostly (:data:`DEFAULT_DEDUP`) trigrams of the other: containment, not Jaccard, so a chunk that
copies half of a longer one counts. Words are runs of letters and digits, lower case, so markup
(backquotes, ``#``, link brackets) does not tell copies apart; chunks of one page that share
only their overlap stay far below it.

Why hand-written: MinHash/LSH (datasketch) and text-dedup tools clean corpora of millions of
documents ahead of time; here a dozen candidates are compared exactly at query time, and the
index keeps both files (a user may filter to one).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from typing import TypeVar

DEFAULT_DEDUP = 0.7

_WORD = re.compile(r"[^\W_]+")

T = TypeVar("T")


def trigrams(text: str) -> frozenset[tuple[str, ...]]:
    """The word trigrams of ``text`` (lower case, letters and digits); a text of fewer than
    three words is its one word tuple."""
    words = _WORD.findall(text.lower())
    return (
        frozenset(zip(words, words[1:], words[2:])) if len(words) > 2 else frozenset([tuple(words)])
    )


def containment(a: frozenset, b: frozenset) -> float:
    """How much of the smaller set the other holds, in [0, 1]; 0 when either is empty."""
    if not a or not b:
        return 0.0
    if len(a) > len(b):
        a, b = b, a
    return len(a & b) / len(a)


def distinct(
    row: Sequence[T],
    text_of: Callable[[T], str],
    threshold: float = DEFAULT_DEDUP,
    need: int | None = None,
) -> list[T]:
    """``row`` (best first) without the items whose text is a near-duplicate
    (:func:`containment` of trigrams ≥ ``threshold``) of a better item kept, in order. Only
    the first ``need`` distinct items are compared (what a search returns or reranks); the
    ones after them follow unchecked. ``need`` None: the whole row."""
    kept: list[T] = []
    seen: list[frozenset] = []
    rest: Iterable[T] = ()
    for i, item in enumerate(row):
        if need is not None and len(kept) >= need:
            rest = row[i:]
            break
        grams = trigrams(text_of(item))
        if any(containment(grams, other) >= threshold for other in seen):
            continue
        kept.append(item)
        seen.append(grams)
    return [*kept, *rest]


def check_dedup(threshold: float | None) -> None:
    """``--dedup`` is None (off) or a share in (0, 1]."""
    if threshold is not None and not 0.0 < float(threshold) <= 1.0:
        raise ValueError(f"--dedup must be in (0, 1] or none, not {threshold!r}")
