"""One grounded-QA example, the form both example builders write (:mod:`training.data.lora_data`
from SQuAD, :mod:`training.data.doc_qa_data` from documents) and :mod:`training.finetune.lora`
trains on, plus the steps they share: trimming a passage around its answer, and placing each
example's gold passage among its distractors (:class:`GoldPlacement`: which examples are
refusals, a balanced gold position for the others, distractors topped up from the pool when
retrieval found too few). Each builder keeps only what is its own: which candidates may be a
distractor and how the distractors are picked from them.

Why its own module: ``lora_data`` mixes in ``doc_qa_data``'s examples, and ``doc_qa_data``
builds them in this form; with the form here, each imports only what it uses, in one direction.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol, TypeVar


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
    # squad | doc (mined from documents by training.data.doc_qa_data) | span (the reader-first
    # prompt: passages[0] is the one passage, answers[0] the reader's short answer in it)
    kind: str = "squad"


def example_messages(ex: QAExample) -> list[dict[str, str]]:
    """The chat an example is trained and scored on: the reader-first prompt for ``kind="span"``
    (:func:`rag.answer.prompt.build_span_messages`), else the k-passage prompt (plain profile)."""
    from rag.answer.prompt import build_messages, build_span_messages

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


class Passage(Protocol):
    """A candidate passage of either builder (a SQuAD paragraph, a documentation section)."""

    @property
    def id(self) -> str: ...


P = TypeVar("P", bound=Passage)


def sample_best(cands: list[P], need: int, rng: random.Random) -> list[P]:
    """``need`` distractors drawn at random from the best ``2 * need`` candidates: close enough
    to the question to be hard, not always the very same ones."""
    return rng.sample(cands[: 2 * need], min(need, len(cands))) if need else []


@dataclass
class GoldPlacement:
    """Where the gold passage of each of ``n`` examples goes, drawn once per build: the
    ``refuse`` examples (exactly ``round(n * refusal_fraction)``) get ``k`` distractors and no
    gold; the others ``k - 1`` distractors and the gold at the next of ``positions``
    (:func:`gold_positions`: balanced over 1..k)."""

    k: int
    refuse: set[int]
    positions: list[int]

    @classmethod
    def draw(cls, n: int, k: int, refusal_fraction: float, rng: random.Random) -> GoldPlacement:
        refuse = set(rng.sample(range(n), round(n * refusal_fraction)))
        return cls(k, refuse, gold_positions(n - len(refuse), k, rng))

    def passages(
        self,
        i: int,
        gold: P,
        ranked: Iterable[P],
        pool: Sequence[P],
        usable: Callable[[P], bool],
        rng: random.Random,
        pick: Callable[[list[P], int, random.Random], list[P]] = sample_best,
    ) -> tuple[list[P], list[int]]:
        """Example ``i``'s passages and its cited numbers (``[]``: a refusal). The candidates
        are the ``usable`` ones of ``ranked`` (retrieval's order, best first), topped up from
        ``pool`` in a random order when there are fewer than needed; ``pick`` chooses the
        distractors among them, and the gold goes in at its planned position. ``usable`` must
        reject the gold itself and any passage that answers the question."""
        need = self.k if i in self.refuse else self.k - 1
        cands = [c for c in ranked if usable(c)]
        if len(cands) < need:  # retrieval found too few: fill with random usable passages
            have = {c.id for c in cands}
            for c in rng.sample(pool, len(pool)):
                if len(cands) >= need:
                    break
                if c.id not in have and usable(c):
                    cands.append(c)
                    have.add(c.id)
        chosen = pick(cands, need, rng)
        if i in self.refuse:
            return chosen, []
        pos = min(self.positions.pop(), len(chosen))
        chosen.insert(pos, gold)
        return chosen, [pos + 1]
