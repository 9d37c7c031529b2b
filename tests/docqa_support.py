"""Shared pieces of the documentation-QA eval tests (test_evals_docqa.py,
test_evals_docqa_scoring.py): the question file, and hand-made hits and answers shaped as the
pipeline returns them."""

from __future__ import annotations

from collections.abc import Sequence

from evals.docqa import DEFAULT_QUESTIONS, PROJECT_ROOT
from rag.types import Answer, Chunk, Citation, Hit

QUESTIONS_FILE = PROJECT_ROOT / DEFAULT_QUESTIONS
DOCS = "/data/python-docs"  # absolute source prefix, as rag.ingest records today


def hit(source: str, i: int = 1, score: float = 0.5) -> Hit:
    return Hit(Chunk(f"c{i}", f"text {i}", source, ("H", str(i))), score, rank=i)


def answer(
    text: str,
    sources: list[str],
    cited: Sequence[int] = (),
    refused: bool = False,
    completed: bool = False,
    timings: dict[str, float] | None = None,
    invalid: Sequence[int] = (),
) -> Answer:
    """An Answer as the pipeline returns it: passages given, citations by passage number."""
    hits = [hit(s, i) for i, s in enumerate(sources, start=1)]
    citations = [
        Citation(n, hits[n - 1].chunk.source, ("H",), "t", hits[n - 1].score, hits[n - 1].chunk.id)
        for n in cited
    ]
    return Answer(
        text=text,
        citations=citations,
        raw_text=text,
        refused=refused,
        invalid_citations=list(invalid),
        passages=hits,
        timings=timings or {},
        citations_completed=completed,
    )
