"""Multi-turn query rewrite: turn a follow-up ("and how do I close it?") into a standalone
retrieval query, using the conversation so far.

Why a heuristic and not the decoder: retrieval needs the rewrite on every turn, before any
generation, and a 135M decoder rewrites unreliably (it often answers the question instead). A
deterministic rule is instant, testable and easy to explain, and it only has to put the right
*terms* in front of BM25 and the dense encoder, not write fluent English.

The method, applied to the user turns of the history in order (so each earlier turn has its own
standalone form and chains of follow-ups keep their topic):

1. A question is a *follow-up* when it starts with a connective ("and", "but", "what about",
   "also", ...), contains a referring pronoun ("it", "they", "this", "that one", ...), or has
   fewer than :data:`MIN_CONTENT_WORDS` content words (words that are not stop words).
2. A follow-up (with a previous turn) becomes: the question without its leading connective,
   then, in parentheses, up to :data:`MAX_CONTEXT_TERMS` key terms of the previous standalone
   query (its content words, in their original order, skipping words the question already has).
3. Anything else is already standalone and is returned unchanged (whitespace-normalised).

Example: "How do I open a file in Python?" then "and how do I close it?" gives
``how do I close it? (open file Python)``.

The result is plain text without square brackets, so it can never be mistaken for a citation
marker when the pipeline puts it in the prompt. :func:`rewrite_query` matches the
``RAGConfig.rewrite_query`` hook signature.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

MIN_CONTENT_WORDS = 3  # a question with fewer content words than this is treated as a follow-up
MAX_CONTEXT_TERMS = 6  # key terms carried over from the previous standalone query

CONNECTIVES = (
    "and",
    "but",
    "also",
    "so",
    "then",
    "what about",
    "how about",
    "and what about",
    "and how about",
    "or",
    "plus",
)


def _wordset(text: str) -> frozenset[str]:
    return frozenset(text.split())


PRONOUNS = _wordset(
    "it its it's itself they them their theirs this that these those he him his she her "
    "there one ones same former latter"
)
QUESTION_WORDS = _wordset("what which who whom whose when where why how")
STOP_WORDS = (
    _wordset(
        """a an the and or but if then else so also too of to in on at by for from with without about
    into onto over under up down out off as is are was were be been being am do does did doing
    done have has had having can could should would will shall may might must i me my mine we us
    our you your yours do not no yes please tell explain show give get got make use used using
    any some all each every more most other such own just only very than there here again still
    whats hows whos wheres why's what's how's who's where's don't doesn't didn't can't isn't
    aren't wasn't weren't won't i'm i've you're it's let's let"""
    )
    | PRONOUNS
    | QUESTION_WORDS
)

ROLES = frozenset({"user", "assistant", "system"})
_WORD = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+#'-]*[A-Za-z0-9+#]|[A-Za-z0-9]")


def words(text: str) -> list[str]:
    """Word tokens (keeps ``file.close``, ``C++``, ``don't`` whole)."""
    return _WORD.findall(text)


def content_words(text: str) -> list[str]:
    """Words that carry the topic: not stop words, pronouns or question words (original case)."""
    return [w for w in words(text) if w.lower() not in STOP_WORDS]


def _strip_connective(question: str) -> tuple[str, bool]:
    """The question without a leading connective (longest match first), and whether one was cut."""
    q = question.strip()
    low = q.lower()
    for c in sorted(CONNECTIVES, key=len, reverse=True):
        if low == c or (low.startswith(c) and not low[len(c)].isalnum()):
            rest = q[len(c) :].lstrip(" ,;:-")
            return (rest or q), True
    return q, False


def is_follow_up(question: str) -> bool:
    """True when ``question`` leans on earlier turns (see the module docstring, rule 1)."""
    _, had_connective = _strip_connective(question)
    if had_connective:
        return True
    if any(w.lower() in PRONOUNS for w in words(question)):
        return True
    return len(content_words(question)) < MIN_CONTENT_WORDS


def _rewrite_one(question: str, previous: str | None) -> str:
    question = " ".join(question.split())
    if not previous or not is_follow_up(question):
        return question
    core, _ = _strip_connective(question)
    have = {w.lower() for w in words(core)}
    terms: list[str] = []
    for w in content_words(previous):
        if w.lower() not in have and w.lower() not in {t.lower() for t in terms}:
            terms.append(w)
        if len(terms) == MAX_CONTEXT_TERMS:
            break
    if not terms:
        return core
    return f"{core} ({' '.join(terms)})"


def user_turns(history: Iterable[Any]) -> list[str]:
    """The user questions of a history, oldest first. Accepted forms: chat message dicts
    (``{"role": "user", "content": ...}``), ``(role, text)`` pairs (what ``RAGPipeline`` passes
    the hook) or ``(user, assistant)`` pairs."""
    out: list[str] = []
    for turn in history or ():
        if isinstance(turn, dict):
            if turn.get("role") == "user" and isinstance(turn.get("content"), str):
                out.append(turn["content"])
        elif isinstance(turn, list | tuple) and len(turn) == 2 and isinstance(turn[0], str):
            if turn[0] in ROLES:  # (role, text), as RAGPipeline normalises chat history
                if turn[0] == "user" and isinstance(turn[1], str):
                    out.append(turn[1])
            elif turn[0].strip():  # (user, assistant) pair
                out.append(turn[0])
    return out


def rewrite_query(question: str, history: Iterable[Any] | None = None) -> str:
    """A standalone retrieval query for ``question`` given the earlier ``history``.

    Earlier user turns are rewritten first, oldest to newest, so the previous *standalone*
    query (not just the previous raw question) supplies the context terms.
    """
    previous: str | None = None
    for turn in user_turns(history or ()):
        previous = _rewrite_one(turn, previous)
    return _rewrite_one(question, previous)
