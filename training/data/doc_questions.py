"""A question for a documentation section, from its heading path, by one of five fixed
templates (:func:`make_question`; the rules are listed in :mod:`training.data.doc_qa_data`): an FAQ
heading is the question, a ``:mod:`` heading asks about the module, a task heading ("Install a
package", "Creating tasks") asks "How do I ...?", a short term asks "What is/are ...?", anything
else asks what the section of its document covers.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence

from training.data.doc_markup import clean_inline

# Verbs whose imperative ("Install ...") or gerund ("Installing ...") heading reads as a task.
VERBS = frozenset(
    ("access", "add", "build", "call", "change", "check", "close", "compile", "configure",
     "connect", "convert", "copy", "create", "customize", "customise", "debug", "define", "delete",
     "deploy", "disable", "embed", "enable", "extend", "find", "format", "get", "handle",
     "implement", "import", "install", "integrate", "link", "load", "log", "make", "manage",
     "migrate", "monitor", "move", "open", "parse", "pass", "port", "raise", "read", "receive",
     "register", "remove", "render", "run", "save", "search", "send", "set", "sort", "specify",
     "start", "stop", "store", "test", "upgrade", "update", "use", "work", "write")
)  # fmt: skip
# Headings that name a kind of section rather than a topic: asked about with the document title.
GENERIC = frozenset(
    ("about", "introduction", "overview", "examples", "example", "summary", "notes", "note",
     "details", "background", "contents", "references", "reference", "description", "usage",
     "api", "functions", "classes", "methods", "attributes", "constants", "exceptions", "removed",
     "deprecated", "changes", "acknowledgements", "footnotes", "glossary", "index", "tutorial",
     "faq", "see also", "new features", "new modules", "improved modules", "other changes",
     "other language changes", "optimizations")
)  # fmt: skip

_TERM_SPLIT = re.compile(r"\s+(?:---|--|—|–)\s+|:\s+")


@functools.lru_cache(maxsize=65536)
def plain_heading(title: str) -> str:
    """A heading as words: markup cleaned, backticks dropped (cached: distractor filtering asks
    for the same headings many times)."""
    return clean_inline(title).replace("`", "").strip()


def _lower_words(text: str, body: str = "") -> str:
    """``text`` with its Title-case words lowered for mid-sentence use ("Binary Data Services" →
    "binary data services"), except proper nouns: words ``body`` writes capitalised between
    lower-case words ("Python basics" stays)."""
    words = text.split()
    for i, w in enumerate(words):
        title_case = w[:1].isupper() and w[1:].islower() and w[1:].isalpha()
        if title_case and not re.search(rf"\b[a-z]+[,;]? {re.escape(w)} [a-z]", body):
            words[i] = w.lower()
    return " ".join(words)


def _is_plural(term: str) -> bool:
    """A crude English plural test for "what is/are": "X and Y", "APIs", "indexes"."""
    last = term.split()[-1]
    if " and " in term or re.fullmatch(r"[A-Z]{2,}s", last):
        return True
    last = last.lower()
    return last.endswith("s") and not last.endswith(("ss", "us", "is", "ys"))


def _verb_base(word: str) -> str | None:
    """``word`` if it is one of :data:`VERBS`, or the verb of its gerund (creating → create)."""
    w = word.lower()
    if w in VERBS:
        return w
    if w.endswith("ing") and len(w) > 5:
        stem = w[:-3]
        for base in (stem, stem + "e", stem[:-1] if stem[-1:] == stem[-2:-1] else ""):
            if base in VERBS:
                return base
    return None


def _task(words: list[str], body: str) -> str | None:
    """The question "How do I ...?" for a heading opening with a verb or its gerund ("Compiling
    and Linking X" → "How do I compile and link X?"); None for any other heading, "Use of X", or
    a gerund after "and" that is no known verb."""
    base = _verb_base(words[0]) if words[1:2] != ["of"] else None
    for i in range(2, len(words) if base else 0):
        if words[i - 1] in ("and", "or") and words[i].lower().endswith("ing"):
            words = [*words[:i], _verb_base(words[i]) or "", *words[i + 1 :]]
            base = base if words[i] else None
    return (
        f"How do I {base} {_lower_words(' '.join(words[1:]), body)}".rstrip() + "?"
        if base
        else None
    )


def make_question(headings: Sequence[str], unique: bool = True, body: str = "") -> tuple[str, str]:
    """(question, term) for a section's heading path; ``term`` is the named thing for "what is"
    questions ("" otherwise), used to keep sections about it out of the distractors. ``unique``
    says whether the last heading occurs once in the corpus (else the generic template); ``body``
    (the section text) tells proper nouns, which keep their capital, from Title Case."""
    raw, h, title = headings[-1], plain_heading(headings[-1]), plain_heading(headings[0])
    if h.endswith("?"):
        return h, ""
    words = h.split()
    if unique and h.lower() not in GENERIC and words:
        if raw.lstrip().startswith(":mod:"):
            term = _TERM_SPLIT.split(h, maxsplit=1)[0]
            return f"What is the {term} module?", term
        if task := _task(words, body):
            return task, ""
        parts = _TERM_SPLIT.split(h, maxsplit=1)
        term = parts[0] if len(parts) == 2 else h
        gerund = len(words) > 1 and words[0].lower().endswith("ing")  # "Integrating X": no term
        if len(term.split()) <= 3 and not gerund:
            verb = "are" if _is_plural(term) else "is"
            return f"What {verb} {_lower_words(term, body)}?", term
    if len(headings) > 1 and title and title != h:
        return f'What does the "{h}" section of {title} cover?', ""
    return f"What does {_lower_words(h, body)} cover?", ""
