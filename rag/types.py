"""Plain data types shared across rag/, indexes/, the UI and evals."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Any


def page_label(page: int) -> str:
    """How every source line names a PDF passage's page, after its place: ", p. 12"; "" for a
    document without pages (``page`` 0)."""
    return f", p. {page}" if page else ""


@dataclass(frozen=True)
class Chunk:
    """A piece of a source document, the unit that is embedded, indexed and cited.

    ``id`` is stable: derived from the source path, the file's content hash and the chunk's
    position, so re-ingesting an unchanged file yields the same ids.

    ``source`` is the absolute path (the manifest's key, what incremental re-ingest matches on);
    ``path`` is how the user knows the file, relative to the folder they ingested
    (``library/io.rst.txt``). The retriever fills ``path`` from the manifest's ingest roots
    when it returns a hit, so it is never stored and follows the roots as they change.
    """

    id: str
    text: str
    source: str
    heading_path: tuple[str, ...] = ()
    start: int = 0  # character offsets into the loaded document text
    end: int = 0
    path: str = ""  # display path relative to the ingested folder ("" = not known here)
    page: int = 0  # the page (1-based, as a PDF viewer counts) the chunk starts on; 0 = no pages

    @property
    def display_path(self) -> str:
        """What to show the user: ``path`` when known, else ``source`` as stored."""
        return self.path or self.source

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["heading_path"] = list(self.heading_path)
        if not self.path:  # the chunk store keeps its old shape
            del d["path"]
        if not self.page:  # a document without pages: as before pages were recorded
            del d["page"]
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Chunk:
        return cls(**{**d, "heading_path": tuple(d.get("heading_path", ()))})


@dataclass(frozen=True)
class Hit:
    """One retrieved chunk with its score (higher is better) and the stage that produced it."""

    chunk: Chunk
    score: float
    rank: int = 0
    mode: str = "dense"  # dense | bm25 | hybrid | rerank

    def to_dict(self) -> dict[str, Any]:
        return {
            **self.chunk.to_dict(),
            "path": self.chunk.display_path,
            "score": self.score,
            "rank": self.rank,
            "mode": self.mode,
        }


@dataclass(frozen=True)
class Citation:
    """A passage the answer cites: its number in the prompt and where it came from.

    ``source`` is the absolute path as stored; ``path`` the one to show (relative to the
    ingested folder, see :class:`Chunk`). :class:`Answer` fills an empty ``path`` from the
    passage with the same chunk id. ``supported`` is False when citation verification
    (:mod:`rag.answer.verify`) found a sentence it covers that the passage does not support."""

    number: int
    source: str
    heading_path: tuple[str, ...]
    text: str
    score: float
    chunk_id: str
    path: str = ""
    supported: bool = True
    page: int = 0  # the passage's page in a PDF (1-based); 0 = a document without pages

    @property
    def display_path(self) -> str:
        return self.path or self.source

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["heading_path"] = list(self.heading_path)
        d["path"] = self.display_path
        if not self.page:
            del d["page"]
        return d


@dataclass(frozen=True)
class AnswerSpan:
    """The short answer the extractive reader (:mod:`rag.answer.reader`) or the evidence prompt's
    first line (:func:`rag.answer.prompt.split_short_answer`) gave, and where it is in a passage.

    ``start``/``end`` are character offsets into the cited passage's text (``passage_text[start:
    end] == text``); ``source_start``/``source_end`` the same span in the loaded document
    (the chunk's own offsets added). ``number`` is the passage's citation number."""

    text: str
    number: int
    source: str
    chunk_id: str
    start: int
    end: int
    source_start: int
    source_end: int
    score: float  # the reader's margin over "not in this passage" (higher = surer); 0 = decoder's
    path: str = ""
    # who found it: "reader" (the extractive reader's span) or "decoder" (the evidence prompt's
    # short answer, kept only where it occurs word for word in the passage: rag.pipeline)
    origin: str = "reader"

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["path"] = self.path or self.source
        return d


@dataclass
class Answer:
    """A grounded answer: text without markers, the citations it made, and diagnostics.

    ``invalid_citations`` are numbers the model emitted that named no given passage (dropped,
    never shown as sources); ``passages`` are every retrieved hit given to the model, cited or not.
    """

    text: str
    citations: list[Citation] = field(default_factory=list)
    raw_text: str = ""
    refused: bool = False
    invalid_citations: list[int] = field(default_factory=list)
    passages: list[Hit] = field(default_factory=list)
    query: str = ""  # the (possibly rewritten) query used for retrieval
    timings: dict[str, float] = field(default_factory=dict)
    # the cross-encoder that reranked the retrieved passages (rag.retrieval.rerank); None = no rerank stage
    reranker: str | None = None
    # True when the model wrote no marker and the pipeline appended the one it scored likeliest
    # (see rag.pipeline.complete_citation); ``citation_logprobs[i-1]`` is the score of `` [i]``.
    citations_completed: bool = False
    citation_logprobs: list[float] = field(default_factory=list)
    # p(REFUSAL | prompt) when the refusal gate is on (rag.answer.refusal); None when it is off
    refusal_probability: float | None = None
    # p(the passages cannot answer) from retrieval signals (rag.answer.answerability); None = unchecked
    unanswerable_probability: float | None = None
    # Citation verification (rag.answer.verify), when ``verified``: numbers of citations flagged as
    # unsupported by their passage (kept, Citation.supported False); (from, to) pairs of
    # citations moved to the passage that supports the sentence; whether the answer looks like
    # it follows an instruction planted in a passage (a heuristic), and why.
    verified: bool = False
    unsupported_citations: list[int] = field(default_factory=list)
    reattributed: list[tuple[int, int]] = field(default_factory=list)
    suspected_injection: bool = False
    injection_reasons: list[str] = field(default_factory=list)
    # the reader's short answer (its passage is the cited one); None = no reader stage, or it
    # found no span it trusts (the decoder then answered over every passage)
    answer_span: AnswerSpan | None = None
    # why the answer ended, in OpenAI's words (rag.serve's finish_reason): "length" when the
    # decoder stopped at its token limit, "stop" otherwise, and for text nothing decoded (a
    # refusal, a reader's extracted sentence)
    finish_reason: str = "stop"
    # the encoder's sentences quoted under a reply written from its excerpts, as (citation
    # number, text), word for word from the passage cited (rag.answer.compose.add_quotations);
    # ``text`` ends with them, ``raw_text`` (the decoder's own reply) does not
    quotes: list[tuple[int, str]] = field(default_factory=list)

    def __post_init__(self) -> None:
        # Citations are made from a passage's chunk fields (rag.pipeline); the passages carry
        # the display path the retriever derived, so every citation shows the same one.
        paths = {h.chunk.id: h.chunk.path for h in self.passages if h.chunk.path}
        self.citations = [
            replace(c, path=paths[c.chunk_id]) if not c.path and c.chunk_id in paths else c
            for c in self.citations
        ]

    @property
    def generation(self) -> str:
        """The index generation the passages came from (``gen-000007``; "" when none was
        retrieved or the retriever names none). One search takes all its hits from one
        generation (:class:`rag.retrieval.retriever.Snapshot`); were they ever mixed, every name would
        show here, comma-separated, rather than one hiding the other."""
        return ",".join(sorted({g for h in self.passages if (g := getattr(h, "generation", ""))}))

    def to_dict(self) -> dict[str, Any]:
        return {
            "text": self.text,
            "generation": self.generation,
            "citations": [c.to_dict() for c in self.citations],
            "raw_text": self.raw_text,
            "refused": self.refused,
            "invalid_citations": self.invalid_citations,
            "passages": [h.to_dict() for h in self.passages],
            "query": self.query,
            "reranker": self.reranker,
            "timings": self.timings,
            "citations_completed": self.citations_completed,
            "citation_logprobs": self.citation_logprobs,
            "refusal_probability": self.refusal_probability,
            "unanswerable_probability": self.unanswerable_probability,
            "verified": self.verified,
            "unsupported_citations": self.unsupported_citations,
            "reattributed": [list(pair) for pair in self.reattributed],
            "suspected_injection": self.suspected_injection,
            "injection_reasons": self.injection_reasons,
            "answer_span": self.answer_span.to_dict() if self.answer_span else None,
            "quotes": [list(q) for q in self.quotes],
        }
