"""One grounded-QA example, the form both example builders write (:mod:`training.lora_data`
from SQuAD, :mod:`training.doc_qa_data` from documents) and :mod:`training.lora` trains on, plus
the two steps they share: trimming a passage around its answer and balancing gold positions.

Why its own module: ``lora_data`` mixes in ``doc_qa_data``'s examples, and ``doc_qa_data``
builds them in this form; with the form here, each imports only what it uses, in one direction.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field


@dataclass
class QAExample:
    """One grounded-QA example; ``cited`` are 1-based passage numbers (empty: refusal)."""

    id: str
    question: str
    passages: list[str]
    cited: list[int]
    answers: list[str]  # gold answers (for EM/F1); the first is the training answer
    target: str
    article: str
    answerable: bool = True
    passage_ids: list[str] = field(default_factory=list)
    # squad | doc (mined from documents by training.doc_qa_data) | span (the reader-first
    # prompt: passages[0] is the one passage, answers[0] the reader's short answer in it)
    kind: str = "squad"


def example_messages(ex: QAExample) -> list[dict[str, str]]:
    """The chat an example is trained and scored on: the reader-first prompt for ``kind="span"``
    (:func:`rag.prompt.build_span_messages`), else the k-passage prompt (plain profile)."""
    from rag.prompt import build_messages, build_span_messages

    if ex.kind == "span":
        return build_span_messages(ex.question, ex.passages[0], ex.answers[0])
    return build_messages(ex.question, ex.passages)


def trim_passage(text: str, max_words: int, answers: Sequence[str] = ()) -> str:
    """At most ``max_words`` words of ``text``: a window around the first gold answer found,
    else the opening words. 0 keeps the whole text. Shorter prompts make CPU training cheaper and
    match the pipeline, whose passages are chunks rather than whole paragraphs."""
    words = text.split()
    if not max_words or len(words) <= max_words:
        return text
    start = 0
    for a in answers:
        pos = text.lower().find(a.strip().lower()) if a.strip() else -1
        if pos >= 0:
            first = len(text[:pos].split())
            last = first + len(a.split())
            start = max(0, min(first - (max_words - (last - first)) // 2, len(words) - max_words))
            break
    return " ".join(words[start : start + max_words])


def gold_positions(n: int, k: int, rng: random.Random) -> list[int]:
    """``n`` gold positions (0-based) over 0..k-1, each used ``n // k`` or ``n // k + 1`` times
    (the extra ones from a random offset), in random order: each example's position is uniform,
    as with a shuffle, but without its sampling noise, so no position is favoured (a model must
    not learn "the answer is usually in [1]")."""
    offset = rng.randrange(k)
    positions = [(i + offset) % k for i in range(n)]
    rng.shuffle(positions)
    return positions
