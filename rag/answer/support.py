"""The support rule of citation verification (:mod:`rag.answer.verify`): which words of a sentence
are claims, and what share of them a passage holds.

**Content words**: lower-cased word tokens (``\\w+``) minus English function words, the glue
words answers add ("according", "passage") and one-letter tokens, with a plural / third-person
``-s`` folded (``boils`` → ``boil``); digits count (``1871``). **Claim words**: the sentence's
content words that are not in the question ("It was built in 1871", asked "When was the
lighthouse built?", claims ``1871``): every passage retrieved for a question shares its words,
a hostile one by design, so they say nothing about where a claim came from. A sentence that only
restates the question keeps all its content words.

**Support** of a sentence by a passage (:func:`support`): the share of its distinct claim words
that occur in the passage; 1.0 when the sentence's words occur verbatim in it, so a short answer
span ("1871", "The Who") is supported; ``None`` (nothing to check) for a sentence without content
words that does not occur verbatim ("Yes.").

Sentences (:func:`split_sentences`) are what is checked: a fenced code block is one; elsewhere
each line, list bullet removed, is split after ``.``, ``!`` or ``?``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

SUPPORT_THRESHOLD = 0.5  # supported: at least half of what a sentence claims is in the passage

# English function words, and the glue words answers add ("according to the passage").
_STOPWORDS = """
    a about above after again against all also am an and any are aren as at be because been
    before being below between both but by can cannot could couldn did didn do does doesn doing
    don down during each either else etc even ever every few for from further had hadn has hasn
    have haven having he her here hers herself him himself his how however i if in into is isn it
    its itself just let like may me might more most must mustn my myself neither no nor not now
    of off on once one only or other ought our ours ourselves out over own per quite rather
    same shall shan she should shouldn since so some such than that the their theirs them
    themselves then there these they this those though through thus to too under until up upon
    us very via was wasn we were weren what when where whether which while who whom whose why
    will with within without won would wouldn yes yet you your yours yourself yourselves
    according answer based context document documents given mentioned passage passages provided
    source sources stated states text
"""
STOPWORDS = frozenset(_STOPWORDS.split())

_WORD = re.compile(r"\w+")
_LIST_MARK = re.compile(r"^\s*(?:[-*•]|\d+[.)])\s+")
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


# ---------------------------------------------------------------------------- the support rule


def _fold(word: str) -> str:
    """Fold a plural / third-person -s so "boils" matches "boil" and "libraries" "library"."""
    if len(word) > 4 and word.endswith("ies"):
        return word[:-3] + "y"
    if len(word) > 3 and word.endswith("s") and not word.endswith(("ss", "us", "is")):
        return word[:-1]
    return word


def content_words(text: str) -> set[str]:
    """The words a claim rests on (see the module docstring)."""
    words = _WORD.findall(text.lower().replace("\u2019", "'").replace("'s ", " "))
    return {
        _fold(w)
        for w in words
        if w not in STOPWORDS and (len(w) > 1 or w.isdigit()) and w.strip("_")
    }


def normalise(text: str) -> str:
    """Lower-cased word tokens joined by single spaces: what verbatim occurrence compares."""
    return " ".join(_WORD.findall(text.lower()))


def claim_words(sentence: str, question: str = "") -> set[str]:
    """The sentence's content words not in ``question`` (all of them when none is left)."""
    words = content_words(sentence)
    return (words - content_words(question)) or words


def support(sentence: str, passage: str, question: str = "") -> float | None:
    """Share of the sentence's claim words found in ``passage``; 1.0 when the sentence occurs
    in it verbatim; None when there is nothing to check (no content word, no verbatim match)."""
    return passage_support(sentence, claim_words(sentence, question), PassageWords.of(passage))


@dataclass(frozen=True)
class PassageWords:
    """A passage's words, computed once per answer."""

    words: frozenset[str]
    norm: str

    @classmethod
    def of(cls, text: str) -> PassageWords:
        return cls(frozenset(content_words(text)), f" {normalise(text)} ")


def passage_support(sentence: str, words: set[str], passage: PassageWords) -> float | None:
    norm = normalise(sentence)
    if norm and f" {norm} " in passage.norm:
        return 1.0
    if not words:
        return None
    return len(words & passage.words) / len(words)


def split_sentences(text: str) -> list[str]:
    """Sentences of an answer: a fenced code block is one; elsewhere each line, with its list
    bullet removed, is split after ``.``, ``!`` or ``?`` followed by whitespace."""
    out: list[str] = []
    for i, block in enumerate(re.split(r"^\s*```.*$", text, flags=re.MULTILINE)):
        if i % 2:  # inside a fence
            if block.strip():
                out.append(block.strip())
            continue
        for line in block.splitlines():
            line = _LIST_MARK.sub("", line).strip()
            out.extend(" ".join(s.split()) for s in _SENTENCE_END.split(line) if _WORD.search(s))
    return out
