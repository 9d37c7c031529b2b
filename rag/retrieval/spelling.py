"""Typo correction of a query against the index's own words.

Why: a word no chunk holds matches nothing in BM25, and the answerability check gives it the
largest IDF (a question about something the documents never mention must be refused:
rag.answer.answerability), so one slip of the fingers turned an answerable question into a
refusal: "how do i opne a fiel and raed it line by line in pyton" was refused over the Python
docs, the same question spelt right was answered (docs/retrieval.md, *Typos*, measured).

**The rule.** A word of the query is corrected when it is a plain lower-case ASCII word of
:data:`MIN_LETTERS` letters or more, no stop word (the answerability check's list), that no
chunk holds (its BM25 stem's document frequency is 0, or so low that a word :data:`TYPO_ODDS`
times as common is one edit away: a typo's stem may be a rare stem of its own) and that neither
the encoder's tokenizer nor the default decoder's knows as a whole word (so "cloud", "internet"
or "systemd", words the documents lack but a user means, stay as written). It becomes the word
one edit away that :data:`MIN_DOCS` chunks or more hold, and that a tokenizer knows or is a
swap of two neighbouring letters (the commonest slip: "opne", "fiel", "raed"; a letter replaced
may land on a non-word that stems like a common word: "shelve", which Git's manual lacks, as
"shelle", stemmed "shell"): a known word first ("serveer" is "server", not the swap "servere",
which stems alike), then a swap before a letter replaced, dropped or added, then the one in the
most chunks. Capitalised words
(names: "GitLab", "Mercurial"), options, identifiers, paths, words with digits and quoted text
are never touched: they are what the answerability check's literal terms look for, and a name or
a label the documents lack must stay missing. A query without a typo comes back unchanged.

Why not a library: spell checkers (pyspellchecker, SymSpell) correct towards a dictionary of
words with frequencies; the dictionary that matters here is the user's documents ("gitignore",
"rebase", "kref"), and the index keeps BM25 *stems*, not words, so the candidates are generated
here (Norvig's single edits, about 54 per letter) and each is looked up by its stem.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rag.retrieval.bm25 import stem_words

MIN_LETTERS = 4  # shorter words ("fid", "dik") have too many neighbours to guess from
MIN_DOCS = 2  # a correction must be a word at least this many chunks hold
# a word some chunks hold is corrected only to one this many times as common: a typo's stem can
# be a rare stem of its own ("opne" stems to "opn", which two Python docs chunks hold)
TYPO_ODDS = 50
_LETTERS = "abcdefghijklmnopqrstuvwxyz"
# What is never corrected: quoted text (a label, a message as the user saw it), options
# ("--opne"), and words joined by . / @ : = or a backslash (paths, dotted names, URLs)
_KEPT = re.compile(
    r"`[^`\n]*`|\"[^\"\n]*\"|“[^”\n]*”|‘[^’\n]*’|(?<!\w)'[^'\n]*'(?!\w)"
    r"|(?<!\S)-\S+|\S*\w[./@:=\\]\w\S*"
)
_WORD = re.compile(r"\b[A-Za-z]+\b")  # a plain word: not part of "opne2" or "opne_file"


@dataclass(frozen=True)
class Corrected:
    """A query after correction, and each (word as typed, word used) replacement in order."""

    text: str
    fixes: list[tuple[str, str]] = field(default_factory=list)


def edits(word: str) -> tuple[list[str], list[str]]:
    """The words one edit from ``word``: (swaps of two neighbouring letters, every letter
    replaced, dropped or added): the first tier is preferred, after the known words."""
    splits = [(word[:i], word[i:]) for i in range(len(word) + 1)]
    swaps = [a + b[1] + b[0] + b[2:] for a, b in splits if len(b) > 1 and b[0] != b[1]]
    replaced = [a + c + b[1:] for a, b in splits if b for c in _LETTERS if c != b[0]]
    dropped = [a + b[1:] for a, b in splits if b]
    added = [a + c + b for a, b in splits for c in _LETTERS]
    return swaps, [*replaced, *dropped, *added]


class Speller:
    """Corrects a query's typos (module docstring) given ``doc_freq``, the number of chunks that
    hold each BM25 stem, ``known``, the words a tokenizer holds whole (the encoder's and the
    default decoder's: :func:`tokenizer_words`, :func:`decoder_words`), and ``stopwords``,
    words never corrected and never a correction."""

    def __init__(
        self,
        doc_freq: Callable[[Iterable[str]], dict[str, int]],
        known: Collection[str],
        stopwords: Collection[str] = (),
    ) -> None:
        self.doc_freq, self.known, self.stopwords = doc_freq, known, frozenset(stopwords)

    def _needs(self, word: str) -> bool:
        return (
            len(word) >= MIN_LETTERS
            and word.isascii()
            and word.isalpha()
            and word.islower()
            and word not in self.stopwords
            and word not in self.known
        )

    def correct(self, query: str) -> Corrected:
        """``query`` with each typo replaced (the rest as written) and the replacements made."""
        free, start = [], 0  # the stretches outside quotes, options, paths and dotted names
        for m in _KEPT.finditer(query):
            free.append((start, m.start()))
            start = m.end()
        free.append((start, len(query)))
        found = [m for a, b in free for m in _WORD.finditer(query, a, b) if self._needs(m[0])]
        if not found:
            return Corrected(query)
        held = self._docs([m[0] for m in found])
        out, fixes, at = [], [], 0
        for m in found:
            better = self._best(m[0], held[m[0]])
            if better is not None:
                out += [query[at : m.start()], better]
                at = m.end()
                fixes.append((m[0], better))
        return Corrected("".join([*out, query[at:]]), fixes) if fixes else Corrected(query)

    def _best(self, word: str, docs_of_word: int) -> str | None:
        """The correction of ``word``, which ``docs_of_word`` chunks hold (module docstring),
        None when no candidate qualifies."""
        need = max(MIN_DOCS, TYPO_ODDS * docs_of_word)
        tier_of: dict[str, int] = {}
        for tier, found in enumerate(edits(word)):
            for c in found:
                if c not in self.stopwords:
                    tier_of.setdefault(c, tier)
        docs = self._docs(list(tier_of))
        # a word no tokenizer knows must be a swap: one letter replaced may land on a non-word
        # that stems like a common word ("shelve", which Git's manual lacks, as "shelle": "shell")
        held = [c for c in tier_of if docs[c] >= need and (c in self.known or tier_of[c] == 0)]
        # a known word first ("serveer": "server", not the swap "servere", which stems alike)
        return max(held, key=lambda c: (c in self.known, -tier_of[c], docs[c], c), default=None)

    def _docs(self, words: list[str]) -> dict[str, int]:
        """Each word's number of chunks, looked up by its stem."""
        stems = stem_words(words)  # BM25's own stemmer
        freq = self.doc_freq(set(stems))
        return {w: freq.get(s, 0) for w, s in zip(words, stems)}


def searched(retriever: Any, query: str, correct: bool) -> str:
    """``query`` as it is searched: its typos corrected when ``correct`` (the ``correct_typos``
    retrieval setting) and ``retriever`` can (``correct_typos``: an index's or a corpus's
    retriever; a test's fake may not), else as typed. What ``rag.ask`` (through
    :meth:`rag.pipeline.RAGPipeline.standalone_query`), ``rag.search`` and MCP's ``search``
    search."""
    if correct and hasattr(retriever, "correct_typos"):
        return retriever.correct_typos(query).text
    return query


def tokenizer_words(tokenizer: object) -> frozenset[str]:
    """The whole words a tokenizer's vocabulary holds, lower-cased: a WordPiece vocabulary's
    tokens but its pieces ("##ing"); a byte-level BPE one's tokens that begin a word ("Ġfile"),
    not those inside one ("ilst"); empty when it has no vocabulary."""
    get_vocab = getattr(tokenizer, "get_vocab", None)
    return vocabulary_words(get_vocab()) if get_vocab is not None else frozenset()


def vocabulary_words(vocab: Iterable[str]) -> frozenset[str]:
    """:func:`tokenizer_words` of a vocabulary's tokens."""
    tokens = list(vocab)
    mark = next((m for m in ("Ġ", "▁") if any(t.startswith(m) for t in tokens)), None)
    if mark is None:
        words = (t for t in tokens if not t.startswith("##"))
    else:
        words = (t[len(mark) :] for t in tokens if t.startswith(mark))
    return frozenset(w.lower() for w in words if w.isalpha())


def decoder_words() -> frozenset[str]:
    """The whole words of the default decoder's tokenizer (byte-level BPE, 151k tokens, trained
    on code and the web: "systemd", "nginx", "docker", "gnome", which the encoder's 30k WordPiece
    vocabulary splits), read from its engine folder once ``make setup`` has built it; empty
    before. Without them "systemd", in a question the Linux kernel's docs cannot answer, was
    corrected to "systems" and the question answered."""
    from rag.models.registry import DEFAULT_DECODER
    from rag.storage.paths import models_dir

    path = models_dir() / f"{DEFAULT_DECODER}-gguf" / "tokenizer.json"
    try:
        stat = path.stat()
    except OSError:
        return frozenset()
    return _vocabulary_file_words(path, stat.st_mtime_ns, stat.st_size)


@functools.cache
def _vocabulary_file_words(path: Path, mtime_ns: int, size: int) -> frozenset[str]:
    """:func:`vocabulary_words` of a ``tokenizer.json``'s vocabulary, read once per version of
    the file (``mtime_ns``, ``size``: the cache key)."""
    try:
        vocab = json.loads(path.read_text(encoding="utf-8"))["model"]["vocab"]
    except (OSError, ValueError, KeyError, TypeError):
        return frozenset()
    return vocabulary_words(vocab)
