"""Answer settings: how an answer is composed from what retrieval found, in one dataclass whose
defaults are the only answer defaults in the project.

Owned here, beside the decisions they steer (the relevance gate, the reader, the encoder's
excerpts, the answerability check, the refusal gate, citation completion and verification), and
passed whole (:class:`rag.config.RAGConfig` ``.answer``; ``rag.toml``'s ``[answer]`` table). The
measured choices behind the defaults are in docs/answering.md.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any, ClassVar

from rag.answer.answerability import DEFAULT_MODEL
from rag.answer.reader import COMPOSE, DEFAULT_READER, check_reader_threshold

FACTOID = ("extract", "explain")  # the values of AnswerSettings.factoid


@dataclass(frozen=True)
class AnswerSettings:
    """How an answer is built from the retrieved passages (module docstring)."""

    # relevance threshold on hit scores below which a passage is not given; None = the
    # retrieval mode's default (rag.answer.relevance)
    min_score: float | None = None
    # extractive reader (rag.answer.reader) that finds the answer span before anything is
    # decoded: auto = minilm-reader under $RAG_HOME/models when `make models` trained it, else
    # none; none = off (the decoder answers over every passage); or a reader folder/artefact
    reader: str | None = DEFAULT_READER
    # the reader answers when its best span beats "not in this passage" by this margin; None =
    # the threshold its training run chose on train questions (its reader.json)
    reader_threshold: float | None = None
    # who writes the answer around the reader's span: decoder (one to three sentences from the
    # span's passage alone) | extract (that passage's own sentence; nothing decoded: fastest)
    compose: str = "decoder"
    # decoder tokens of excerpts the encoder keeps from the retrieved passages for the decoder
    # to answer from (rag.answer.evidence: the sentences that answer, a fraction of the
    # passages' length); 0 = the whole passages (the k-passage prompt)
    evidence_tokens: int = 320
    # passages retrieved for the encoder to read when excerpts are on (k when larger): it reads
    # more than a prompt of whole passages could hold, so the answer is found further down
    evidence_passages: int = 10
    # the encoder's best sentences quoted word for word under an answer written from its
    # excerpts, each with its citation, when the question asks how, why or what something does
    # (rag.answer.compose.add_quotations; what the answer already says is skipped): up to this
    # many, two from one excerpt at most; 0 = none (5 chosen on 96 dev questions, docs/answering.md)
    quotes: int = 5
    # how a factoid (a question that does not ask how, why or what something does) is
    # answered from excerpts: extract = the decoder reads the encoder's best sentences and
    # writes the short answer alone, shown with the sentence that holds it, cited (nothing
    # else decoded; rag.answer.compose.evidence_reply) | explain = like any other question
    factoid: str = "extract"
    # answerability check (rag.answer.answerability): refuse without decoding when p(unanswerable),
    # from the best passage's cosine, the query's IDF coverage and the best sentence the encoder
    # read in them, is >= this; none = off
    answerability_threshold: float | None = DEFAULT_MODEL.threshold
    # the same check also refuses a question naming an option, a name it asks about or a quoted
    # label that no document holds (--smart-split, vm.swap_boost_factor, "the 'X' button"),
    # and says which (rag.answer.answerability.literal_terms)
    literal_terms: bool = True
    # refusal gate (rag.answer.refusal): refuse only when p(refusal | prompt) >= this, else decode
    # the answer with the refusal barred; None = the adapter's tuned threshold (its run.json),
    # and without one the decoder's greedy choice stands
    refusal_threshold: float | None = None
    # check each cited sentence against the passage it names; re-attribute or flag
    # (rag.answer.verify)
    verify_citations: bool = True
    # when the answer cites nothing (and is no refusal), add the marker [i] of the passage it
    # used (the decoder's likeliest, or the best-supporting passage); Answer.citations_completed
    complete_citations: bool = True

    # The value sets of the fields that have one: checked here, argparse choices on every CLI.
    CHOICES: ClassVar[dict[str, tuple[str, ...]]] = {"compose": COMPOSE, "factoid": FACTOID}

    def __post_init__(self) -> None:
        for name, values in self.CHOICES.items():
            if getattr(self, name) not in values:
                raise ValueError(
                    f"--{name} must be one of {', '.join(values)}, not {getattr(self, name)!r}"
                )
        if self.evidence_tokens < 0:
            raise ValueError(
                f"--evidence-tokens must be >= 0 (0 = whole passages), not {self.evidence_tokens}"
            )
        if self.quotes < 0:
            raise ValueError(f"--quotes must be >= 0 (0 = none), not {self.quotes}")
        if int(self.evidence_passages) < 1:
            raise ValueError(f"--evidence-passages must be >= 1, not {self.evidence_passages}")
        for name in ("answerability_threshold", "refusal_threshold"):
            t = getattr(self, name)
            if t is not None and not 0 < t <= 1:
                flag = "--" + name.replace("_", "-")
                raise ValueError(f"{flag} must be in (0, 1] or none, not {t}")
        if self.reader_threshold is not None:
            check_reader_threshold(self.reader_threshold, "--reader-threshold")

    def replace(self, **changes: Any) -> AnswerSettings:
        """A copy with ``changes`` applied (checked again)."""
        return replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}
