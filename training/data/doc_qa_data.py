"""Grounded-QA examples mined from a user's own documents, without a teacher model.

SQuAD teaches the answer format on encyclopaedia prose; a user's corpus is documentation, whose
passages are reST/markdown chunks with headings. This module turns that structure into examples
in the same :class:`~training.data.qa_example.QAExample` form, so LoRA also sees the pipeline's real
passages (as :mod:`training.data.pairs` mines heading → section pairs for the retriever):

* **sections**: every heading of a file loaded by :mod:`rag.documents` opens a section that runs
  to the next heading (as :mod:`rag.documents.chunking` cuts them); the passage is the section's raw
  text from the heading line on, cut to its first ``passage_words`` words: the chunk the pipeline
  would retrieve, markup and all;
* **question** from the heading path, by one of five fixed templates (:func:`make_question`):
  an FAQ heading ending in ``?`` is the question; ``:mod:`x` --- ...`` gives "What is the x
  module?"; a heading opening with a common verb ("Install a package") or its gerund ("Creating
  tasks") gives "How do I install a package?" / "How do I create tasks?"; a short term or
  ``Term: description`` heading gives "What is/are <term>?"; anything else, and every heading
  that is generic ("Examples") or not unique in the corpus, gives
  ``What does the "<heading>" section of <document title> cover?``;
* **target**: the first one or two complete sentences of the section's first prose paragraph
  inside the passage window (directives, literal blocks, tables, lists and field lists are
  skipped; a section opening with the intro to a code block or list gives none), cleaned of
  markup by :func:`clean_inline` (``:func:`open``` → ``open``, link and emphasis markup dropped,
  inline code kept in single backticks) and followed by the gold passage's ``[n]``. A section
  with no such sentence gives no example (it can still be a distractor);
* **distractors**: k-1 sections of *other* files ranked by BM25 for the question (never one with
  the same heading, naming a term question's term in its headings, or repeating the answer's
  opening words), with the gold at a uniformly drawn, exactly balanced position; a
  ``refusal_fraction`` of examples drop the gold and take k distractors, with target
  :data:`rag.answer.prompt.REFUSAL`.

Why no teacher: the lead sentences of a documentation section state what it is about almost by
convention, so they are an extractive, checkable answer to "what does this section cover" — no
LLM to run, no invented text. The cost is question variety (five templates) and that a distractor
may occasionally cover the same topic; the filters above only make that rare.
"""

from __future__ import annotations

import functools
import random
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from rag.answer.prompt import REFUSAL, format_target
from rag.documents import Document, load_documents
from rag.retrieval.bm25 import BM25Index
from training.data.doc_markup import clean_inline, lead_sentences
from training.data.doc_questions import make_question, plain_heading
from training.data.qa_example import GoldPlacement, QAExample, trim_passage

DOC_PASSAGE_WORDS = 180  # about the pipeline's 256-token chunk
MIN_SECTION_WORDS = 20  # shorter sections (a bare heading) are neither gold nor distractor


@dataclass
class Section:
    """Text from one heading to the next, with the heading path that governs it."""

    id: str  # "<file>#<heading index>"
    path: str  # the file
    headings: tuple[str, ...]  # raw heading titles, top level first
    text: str  # raw text from the heading line on (what the pipeline's chunk would hold)
    rst: bool  # reStructuredText markup (else markdown / plain text)


# ---------------------------------------------------------------------------- sections + examples


def doc_sections(docs: Sequence[Document]) -> list[Section]:
    """One :class:`Section` per heading of ``docs`` with at least :data:`MIN_SECTION_WORDS`
    words; a file without headings is one untitled section (a distractor only)."""
    out = []
    for doc in docs:
        name = Path(doc.path).name.lower()
        rst = name.endswith((".rst", ".rst.txt"))
        cuts = [h.offset for h in doc.headings]
        if not cuts and len(doc.text.split()) >= MIN_SECTION_WORDS:
            out.append(Section(f"{doc.path}#0", doc.path, (), doc.text, rst))
        for i, h in enumerate(doc.headings):
            end = cuts[i + 1] if i + 1 < len(cuts) else len(doc.text)
            text = doc.text[h.offset : end].strip()
            if len(text.split()) >= MIN_SECTION_WORDS:
                path = doc.heading_path_at(h.offset)
                out.append(Section(f"{doc.path}#{i}", doc.path, path, text, rst))
    return out


def _related(cand: Section, gold: Section, heading: str, term: str) -> bool:
    """True if ``cand`` may answer ``gold``'s question: same file, same last heading, or (for a
    term question) the term among its headings."""
    if cand.path == gold.path:
        return True
    if not cand.headings:  # an untitled file: nothing to match
        return False
    if plain_heading(cand.headings[-1]).lower() == heading:
        return True
    low = " ".join(plain_heading(t) for t in cand.headings).lower()
    return bool(term) and re.search(rf"(?<!\w){re.escape(term.lower())}(?!\w)", low) is not None


def _unrelated(cand: Section, *, gold: Section, heading: str, term: str) -> bool:
    """Whether ``cand`` may be a distractor for ``gold``'s question (not :func:`_related`)."""
    return not _related(cand, gold, heading, term)


def _pick(
    cands: list[Section], need: int, rng: random.Random, *, key: str, plain: dict[str, str]
) -> list[Section]:
    """``need`` distractors, drawn at random from the best ``2 * need`` candidates (deeper ones
    only as a fallback), skipping any whose passage, as plain text, contains ``key`` (the opening
    of the gold answer: a file that repeats it would make a second right passage)."""
    if not need:
        return []
    top = rng.sample(cands[: 2 * need], min(2 * need, len(cands)))
    out = []
    for s in top + cands[2 * need :]:
        if len(out) == need:
            break
        if s.id not in plain:
            plain[s.id] = clean_inline(s.text, s.rst).replace("`", "")
        if key.replace("`", "") not in plain[s.id]:
            out.append(s)
    return out


def doc_examples(
    paths: Sequence[str | Path],
    n: int,
    k: int = 3,
    refusal_fraction: float = 0.15,
    seed: int = 0,
    passage_words: int = DOC_PASSAGE_WORDS,
) -> list[QAExample]:
    """``n`` examples (0 = one per usable section) from the documents under ``paths``: question
    from the heading path, gold = the section, k-1 BM25 distractor sections of other files, the
    gold at a balanced random position; ``round(n * refusal_fraction)`` of them without the gold,
    answered with the refusal. ``passage_words`` cuts every passage (0 = whole sections)."""
    if k < 1:
        raise ValueError(f"--k-passages must be at least 1, not {k}")
    return section_examples(load_sections(paths), n, k, refusal_fraction, seed, passage_words)


def load_sections(paths: Sequence[str | Path]) -> list[Section]:
    """The sections of the documents under ``paths``; raises when there is none."""
    docs, errors = load_documents(paths)
    sections = doc_sections(docs)
    if not sections:
        raise ValueError(
            f"no section of at least {MIN_SECTION_WORDS} words under {', '.join(map(str, paths))}"
            f" ({len(errors)} file(s) unreadable)"
        )
    return sections


def section_examples(
    sections: Sequence[Section],
    n: int,
    k: int = 3,
    refusal_fraction: float = 0.15,
    seed: int = 0,
    passage_words: int = DOC_PASSAGE_WORDS,
) -> list[QAExample]:
    """:func:`doc_examples` over sections already loaded (:func:`doc_sections`), for callers
    that also need the sections' raw text (training.data.reader_data.doc_questions)."""
    rng = random.Random(seed)
    counts = Counter(plain_heading(s.headings[-1]).lower() for s in sections if s.headings)
    golds = []
    for s in sections:
        lead = lead_sentences(s.text, s.rst, passage_words) if s.headings else ""
        if lead:
            unique = counts[plain_heading(s.headings[-1]).lower()] == 1
            golds.append((s, lead, *make_question(s.headings, unique, s.text)))
    rng.shuffle(golds)
    golds = golds[:n] if n > 0 else golds
    placement = GoldPlacement.draw(len(golds), k, refusal_fraction, rng)
    index = BM25Index(
        [s.id for s in sections],
        [" ".join(plain_heading(t) for t in s.headings) + " " + s.text for s in sections],
    )
    by_id = {s.id: s for s in sections}
    plain: dict[str, str] = {}  # section id -> its passage as plain text, filled on demand
    hits = index.search_many([q for _, _, q, _ in golds], k=4 * k + 20)
    out = []
    for i, ((gold, lead, question, term), row) in enumerate(zip(golds, hits)):
        heading = plain_heading(gold.headings[-1]).lower()
        usable = functools.partial(_unrelated, gold=gold, heading=heading, term=term)
        pick = functools.partial(_pick, key=" ".join(lead.split()[:8]), plain=plain)
        ranked = (by_id[j] for j, _ in row)
        docs_, cited = placement.passages(i, gold, ranked, sections, usable, rng, pick)
        out.append(
            QAExample(
                id=gold.id,
                question=question,
                passages=[trim_passage(s.text, passage_words) for s in docs_],
                cited=cited,
                answers=[lead],
                target=format_target(lead, cited) if cited else REFUSAL,
                article=gold.path,
                answerable=bool(cited),
                passage_ids=[s.id for s in docs_],
                kind="doc",
            )
        )
    return out
