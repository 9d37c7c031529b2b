"""The RAG pipeline: query → retrieve → relevance gate → fit passages → generate → citations.

One :class:`RAGPipeline` serves every caller (CLI, UI sessions, evals). The retriever and the
generator are loaded lazily, once, under a lock, so the first question pays the load time and
concurrent sessions share one copy of each model.

Grounding rules, in one place:

- nothing relevant retrieved (no hits, or every hit under the relevance threshold), or the
  answerability check (:mod:`rag.answer.answerability`) judges the passages unable to hold the answer
  → the answer is :data:`rag.prompt.REFUSAL` and the model is not called;
- citation markers ``[n]`` are parsed with :func:`rag.prompt.parse_citations`; each valid number
  maps to the passage given at that position; a number that names no given passage is dropped
  from the text, never shown as a source, and listed in ``Answer.invalid_citations``;
- an answer that is no refusal and carries no valid marker gets one by *citation completion*
  (``RAGConfig.complete_citations``): the model is asked which passage it used by comparing the
  log-probability of the continuation `` [i]`` for every given passage i after its own answer, and
  the likeliest marker is appended (``Answer.citations_completed`` is then true). Small zero-shot
  models (SmolLM2-135M) answer but almost never write markers by themselves;
- every citation is then verified against the passage it names (:mod:`rag.answer.verify`): one whose
  sentence that passage does not support is re-attributed to a passage that clearly does, or
  flagged (``Citation.supported``); an answer that repeats instruction-like passage text is
  marked ``suspected_injection``. ``RAGPipeline(verify=False)`` turns this off.

Reader first (:mod:`rag.answer.reader`, ``RAGConfig.reader``): when an extractive reader is
configured, it reads the question against every relevant passage before anything is decoded.

- its best span's margin over "not in this passage" is >= the threshold → the answer is built
  on that span: ``Answer.answer_span`` (the short answer, its passage, its offsets), the span's
  passage is the one passage given to the decoder, which writes one to three sentences around
  the span (``compose="decoder"``; a reply that drops the span, or refuses, is replaced by the
  passage's own sentence) or nothing is decoded and the passage's sentence is the answer
  (``compose="extract"``); the citation is [1], that passage, by construction;
- every passage says "not here" and the answerability check agrees → refusal, nothing decoded;
- otherwise (the reader abstains but retrieval looks answerable) → the decoder over all
  passages, as without a reader.

Each prompt gets the decoder tuned for it: an adapter trained on the reader-first prompt alone
(``training.lora --prompt-format span``, what ``make models`` trains; rag.models.span_only_adapter)
phrases spans only, and the k-passage fallback is answered by the decoder without it
(:attr:`RAGPipeline.fallback_generator`, a second copy: loaded on the first such question, or at
start-up by the UI and the server). Why:
on the 40 Python-docs questions, where the reader trusts a span for 8, the span adapter over the
k-passage prompt it never saw lost 2 keyword hits and 2 right-page citations against the
decoder alone (docs/answering.md).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rag.answer.answerability import FITTED_PASSAGES, AnswerabilityDecision, check
from rag.answer.refusal import RefusalDecision, decide, supports_gate
from rag.answer.relevance import relevant_hits
from rag.answer.rewrite import rewrite_query
from rag.answer.verify import locate, verify_answer
from rag.config import RAGConfig
from rag.prompt import (
    DEFAULT_STOP,
    REFUSAL,
    SHORT_ANSWER,
    build_evidence_messages,
    build_messages,
    build_span_messages,
    clean_short_answer,
    is_refusal,
    parse_citations,
    split_short_answer,
)
from rag.retrieval.query import check_query
from rag.types import Answer, AnswerSpan, Citation, Hit

if TYPE_CHECKING:
    from rag.retrieval.retriever import Retriever

RewriteFn = Callable[[str, list[tuple[str, str]]], str]


@dataclass
class Prepared:
    """Everything decided before decoding: the query used, the hits given, the prompt."""

    question: str
    query: str
    hits: list[Hit]  # passages given to the model, in prompt order ([1] first)
    messages: list[dict[str, str]]
    timings: dict[str, float]
    answerable: AnswerabilityDecision | None = None  # rag.answer.answerability; None = not checked
    reranker: str | None = None  # the retriever's cross-encoder (named in the Answer)
    span: AnswerSpan | None = None  # the reader's trusted short answer (hits[0] = its passage)
    # the encoder's excerpts of the hits (rag.answer.evidence), one per hit given, in prompt
    # order; None = whole passages (or a reader span)
    evidence: list[Any] | None = None


def open_retriever(config: RAGConfig, index: str | Path | None = None) -> Retriever:
    """The retriever ``config`` asks for, over ``config.index`` or over ``index`` (an index
    folder, ``rag.ask --index-dir``): both opened from the same
    :class:`~rag.retrieval.settings.RetrievalSettings` (``config.retrieval``), so a named index
    and its folder retrieve, fuse and rerank alike."""
    from rag.retrieval.retriever import Retriever

    return Retriever.from_settings(config.index if index is None else index, config.retrieval)


def conversational(config: RAGConfig) -> RAGConfig:
    """``config`` for a conversation (the UI, ``rag.serve``): follow-up questions are rewritten
    into standalone retrieval queries (:func:`rag.answer.rewrite.rewrite_query`) unless the
    config has its own rewrite hook."""
    if config.rewrite_query is not None:
        return config
    return replace(config, rewrite_query=rewrite_query)


def normalise_history(history: Any) -> list[tuple[str, str]]:
    """(role, text) pairs from tuples or ``{"role", "content"}`` dicts (gradio's format)."""
    turns: list[tuple[str, str]] = []
    for turn in history or []:
        if isinstance(turn, dict):
            turns.append((str(turn.get("role", "")), str(turn.get("content", ""))))
        else:
            role, text = turn
            turns.append((str(role), str(text)))
    return turns


def make_answer(raw: str, prep: Prepared) -> Answer:
    """Answer from the model's raw text: markers parsed, each valid one mapped to its passage."""
    parsed = parse_citations(raw, len(prep.hits))
    citations = []
    for n in parsed.cited:
        hit = prep.hits[n - 1]
        c = hit.chunk
        citations.append(Citation(n, c.source, tuple(c.heading_path), c.text, hit.score, c.id))
    return Answer(
        text=REFUSAL if parsed.refused else parsed.text,
        citations=citations,
        raw_text=raw,
        refused=parsed.refused,
        invalid_citations=parsed.invalid,
        passages=list(prep.hits),
        query=prep.query,
        timings=prep.timings,
        reranker=prep.reranker,
        unanswerable_probability=prep.answerable.probability if prep.answerable else None,
        answer_span=prep.span,
    )


def complete_citation(raw: str, prep: Prepared, generator: Any) -> Answer:
    """:func:`make_answer`, plus the likeliest marker when the model cited nothing by itself.

    Fires only when the answer is no refusal and holds no valid marker (invalid ones alone do not
    count). ``generator.score_continuations`` gives log p(`` [i]`` | prompt, answer) for each
    passage i; the argmax is appended to the raw text and parsed like a marker the model wrote.
    ``Answer.raw_text`` stays the model's own text.
    """
    answer = make_answer(raw, prep)
    if answer.refused or answer.citations or not prep.hits:
        return answer
    n = len(prep.hits)
    scores = generator.score_continuations(prep.messages, raw, [f" [{i}]" for i in range(1, n + 1)])
    best = max(range(n), key=lambda i: scores[i]) + 1
    completed = make_answer(f"{raw} [{best}]", prep)
    completed.raw_text = raw
    completed.citations_completed = True
    completed.citation_logprobs = [float(x) for x in scores]
    return completed


def refusal(prep: Prepared) -> Answer:
    """The answer when nothing relevant was retrieved (the model is not called)."""
    return Answer(
        REFUSAL, refused=True, query=prep.query, timings=prep.timings, reranker=prep.reranker
    )


class RAGPipeline:
    """Answers questions from an index with citations; share one instance across threads.

    ``retriever`` / ``generator`` may be passed in (tests, evals reusing loaded models); else they
    are built from ``config`` on first use. ``rewrite_query`` overrides ``config.rewrite_query``.
    ``verify`` checks citations against their passages (:mod:`rag.answer.verify`); None = the config's
    ``verify_citations`` when it has one, else on. ``fallback_generator`` answers the k-passage
    prompt; None = ``generator`` when one is passed in, else loaded from ``config`` (module
    docstring).
    """

    def __init__(
        self,
        config: RAGConfig | None = None,
        *,
        retriever: Any = None,
        generator: Any = None,
        rewrite_query: RewriteFn | None = None,
        verify: bool | None = None,
        reader: Any = None,
        fallback_generator: Any = None,
    ) -> None:
        self.config = config or RAGConfig()
        self.verify = getattr(self.config, "verify_citations", True) if verify is None else verify
        self._retriever = retriever
        self._generator = generator
        self._fallback = (
            fallback_generator if generator is None else fallback_generator or generator
        )
        self._reader = reader  # a SpanReader; False = resolved to none
        self.rewrite_query = rewrite_query or self.config.rewrite_query
        self._retriever_lock = threading.Lock()
        self._generator_lock = threading.Lock()
        self._reader_lock = threading.Lock()

    # ---- lazily loaded, shared models --------------------------------------------------------

    @property
    def retriever(self) -> Any:
        if self._retriever is None:
            with self._retriever_lock:
                if self._retriever is None:
                    self._retriever = open_retriever(self.config)
        return self._retriever

    @property
    def generator(self) -> Any:
        """The decoder with the configured adapter: it phrases the reader's spans, and answers
        the k-passage prompt too unless the adapter was trained for spans alone."""
        if self._generator is None:
            with self._generator_lock:
                if self._generator is None:
                    self._generator = load_decoder(self.config, self.config.adapter)
        return self._generator

    @property
    def fallback_generator(self) -> Any:
        """The decoder for the k-passage prompt (the reader abstained, or there is none):
        :attr:`generator`, or the decoder without its adapter when that adapter was trained on
        the reader-first prompt alone (module docstring); loaded on first use."""
        if self._fallback is None:
            from rag.models import resolve_adapter, span_only_adapter

            cfg = self.config
            if not span_only_adapter(resolve_adapter(cfg.decoder, cfg.adapter)):
                self._fallback = self.generator
                return self._fallback
            with self._generator_lock:
                if self._fallback is None:
                    self._fallback = load_decoder(cfg, None)
        return self._fallback

    def decoder_for(self, prep: Prepared) -> Any:
        """The generator that answers ``prep``: :attr:`generator` for a reader span's prompt,
        :attr:`fallback_generator` for the k-passage prompt."""
        return self.generator if prep.span is not None else self.fallback_generator

    @property
    def reader(self) -> Any:
        """The extractive reader (:class:`rag.answer.reader.SpanReader`), or None when
        ``config.reader`` resolves to none (``auto`` without a trained reader)."""
        if self._reader is None:
            with self._reader_lock:
                if self._reader is None:
                    from rag.answer.reader import SpanReader, resolve_reader
                    from rag.models import pick_device

                    path = resolve_reader(self.config.reader)
                    self._reader = (
                        SpanReader.load(path, device=pick_device(self.config.device))
                        if path
                        else False
                    )
        return self._reader or None

    @property
    def generation(self) -> str | None:
        """The index generation the retriever has loaded, or None before it is loaded (read
        by ``rag.serve``'s ``/health``; never loads anything)."""
        return getattr(self._retriever, "generation", None) if self._retriever else None

    # ---- steps -------------------------------------------------------------------------------

    def retrieve(
        self, query: str, k: int | None = None, mode: str | None = None, where: Any = None
    ) -> list[Hit]:
        """Top-``k`` hits for ``query`` (defaults from the config); ``where``: a document filter
        for this question (:mod:`rag.retrieval.filters`), None = the config's ``where``."""
        extra = {} if where is None else {"where": where}  # retrievers without filters stay fine
        return list(
            self.retriever.search(
                query, k=k or self.config.k, mode=mode or self.config.mode, **extra
            )
        )

    def standalone_query(self, question: str, history: Any = None) -> str:
        """The retrieval query: ``rewrite_query(question, history)`` when there is history."""
        turns = normalise_history(history)
        if self.rewrite_query is None or not turns:
            return question.strip()
        return (self.rewrite_query(question, turns) or question).strip()

    def prepare(
        self,
        question: str,
        *,
        history: Any = None,
        k: int | None = None,
        mode: str | None = None,
        max_new_tokens: int | None = None,
        where: Any = None,
    ) -> Prepared:
        """Rewrite, retrieve, gate on relevance and fit passages; ``hits`` empty = refuse.

        The prompt's question is the standalone query, so a follow-up ("and in Python 2?") is
        asked in full: the prompt format has no room for history.
        """
        check_query(question or "", "question")  # empty or punctuation only: nothing to find
        t0 = time.perf_counter()
        mode = mode or self.config.mode
        query = self.standalone_query(question, history)
        n = k or self.config.k
        if self.reads_evidence:  # the encoder reads more passages than a prompt holds
            n = max(n, self.config.evidence_passages)
        found = self.retrieve(query, k=n, mode=mode, where=where)
        hits = relevant_hits(found, mode, self.config.min_score)
        timings = {"retrieve_s": time.perf_counter() - t0}
        name = getattr(getattr(self.retriever, "reranker", None), "name", None)
        reranker = name if isinstance(name, str) else None
        if not hits:
            return Prepared(question, query, [], [], timings, reranker=reranker)
        read = self.read(query, hits, timings)
        if read is not None:
            # the span's passage is [1], the only one the decoder reads; the other hits follow
            # (shown as retrieved, uncited)
            span, hit = read
            ordered = [hit, *(h for h in hits if h is not hit)]
            messages = build_span_messages(query, hit.chunk.text, span.text)
            return Prepared(question, query, ordered, messages, timings, None, reranker, span)
        gen = self.fallback_generator
        threshold = self.config.answerability_threshold
        # the check reads as many passages as it was fitted on (rag.answer.answerability)
        answerable = check(self.retriever, query, hits[:FITTED_PASSAGES], threshold)
        budget_new = max_new_tokens or self.config.max_new_tokens
        excerpts = self.select_evidence(query, hits, gen, timings, budget_new)
        if excerpts:
            # one excerpt per hit it came from, [1] first; the other hits follow, uncited
            chosen = [hits[e.passage] for e in excerpts]
            ordered = [*chosen, *(h for h in hits if not any(h is c for c in chosen))]
            messages = build_evidence_messages(query, [e.text for e in excerpts])
            return Prepared(
                question, query, ordered, messages, timings, answerable, reranker, evidence=excerpts
            )
        hits = hits[: k or self.config.k]  # whole passages: the k best that fit
        kept = gen.fit_passages(query, [h.chunk.text for h in hits], budget_new)
        hits = hits[: len(kept)]
        messages = (
            gen.messages(query, kept) if hasattr(gen, "messages") else build_messages(query, kept)
        )
        return Prepared(question, query, hits, messages, timings, answerable, reranker)

    @property
    def reads_evidence(self) -> bool:
        """Whether answers are written from the encoder's excerpts (``config.evidence_tokens``
        > 0 and a retriever with an encoder to read with)."""
        return bool(self.config.evidence_tokens) and (
            getattr(self.retriever, "encoder", None) is not None
        )

    def select_evidence(
        self,
        query: str,
        hits: list[Hit],
        gen: Any,
        timings: dict[str, float],
        max_new_tokens: int | None = None,
    ) -> list[Any] | None:
        """The encoder's excerpts of ``hits`` (:func:`rag.answer.evidence.select`) within
        ``config.evidence_tokens`` decoder tokens (fewer when the context window has less room
        beside the evidence prompt and ``max_new_tokens``), or None when excerpts are off (0),
        the retriever has no encoder to read with, or the decoder's context has no room for
        the evidence prompt (the k-passage prompt, shorter, is used); ``timings["evidence_s"]``
        records the time."""
        if not self.reads_evidence or not hasattr(gen, "count_tokens"):
            return None
        budget, encoder = self.config.evidence_tokens, self.retriever.encoder
        if hasattr(gen, "prompt_ids") and hasattr(gen, "max_positions"):
            from rag.generate.context_budget import QuestionTooLongError, space_left

            new = max_new_tokens or self.config.max_new_tokens
            try:
                left = space_left(gen, build_evidence_messages(query, []), new)
            except QuestionTooLongError:
                left = 0
            budget = min(budget, left - 8 * len(hits))  # markers and gaps
            if budget < 16:  # no room (a small context): the k-passage path trims or refuses
                return None

        from rag.answer.evidence import UNIT_BATCH_TOKENS, select
        from rag.retrieval.encoder import Encoder

        def embed(texts: list[str], kind: str) -> Any:
            if isinstance(encoder, Encoder):  # small batches of similar length pad less
                return encoder.encode(texts, kind, batch_tokens=UNIT_BATCH_TOKENS)
            return encoder.encode(texts, kind)

        t0 = time.perf_counter()
        excerpts = select(query, [h.chunk.text for h in hits], embed, budget, gen.count_tokens)
        timings["evidence_s"] = time.perf_counter() - t0
        return excerpts or None

    def read(
        self, query: str, hits: list[Hit], timings: dict[str, float]
    ) -> tuple[AnswerSpan, Hit] | None:
        """The reader's trusted span over ``hits`` and the hit it is in, or None when there is no
        reader or it trusts no span (abstains); ``timings["read_s"]`` records its time. The
        threshold is the config's, else the one the reader's training chose."""
        reader = self.reader
        if reader is None:
            return None
        from rag.answer.reader import pick

        threshold = self.config.reader_threshold
        if threshold is None:
            threshold = reader.threshold
        t0 = time.perf_counter()
        best = pick(reader.read(query, [h.chunk.text for h in hits]), threshold)
        timings["read_s"] = time.perf_counter() - t0
        if best is None:
            return None
        hit = hits[best.passage]
        c = hit.chunk
        span = AnswerSpan(
            text=best.text,
            number=1,
            source=c.source,
            chunk_id=c.id,
            start=best.start,
            end=best.end,
            source_start=c.start + best.start,
            source_end=c.start + best.end,
            score=round(best.margin, 4),
            path=c.path,
        )
        return span, hit

    def _decode_args(
        self,
        temperature: float | None,
        max_new_tokens: int | None,
        gate: RefusalDecision | None = None,
        prep: Prepared | None = None,
    ) -> dict[str, Any]:
        """``generate``/``stream`` keywords: sampling settings, plus the gate's cache and ban;
        the sentence around a reader span is capped at :data:`SPAN_MAX_NEW_TOKENS`."""
        cfg = self.config
        limit = max_new_tokens or cfg.max_new_tokens
        extra: dict[str, Any] = {}
        if prep is not None and prep.span is not None:
            limit = min(limit, SPAN_MAX_NEW_TOKENS)
            # the instruction ends the sentences with [1]: decoding stops there (without it the
            # 0.5B decoder ran on to the token cap: python-docs p50 7.0 s)
            extra["stop"] = (*DEFAULT_STOP, SPAN_CITATION)
        return {
            "max_new_tokens": limit,
            "temperature": cfg.temperature if temperature is None else temperature,
            "top_p": cfg.top_p,
            **extra,
            **(gate.generate_kwargs if gate else {}),
        }

    # ---- public API --------------------------------------------------------------------------

    def answer(
        self,
        question: str,
        *,
        history: Any = None,
        k: int | None = None,
        mode: str | None = None,
        temperature: float | None = None,
        max_new_tokens: int | None = None,
        where: Any = None,
    ) -> Answer:
        """A grounded answer with citations (or the refusal when nothing relevant is found);
        ``where`` restricts retrieval to some documents (None: the config's filter)."""
        t0 = time.perf_counter()
        prep = self.prepare(
            question, history=history, k=k, mode=mode, max_new_tokens=max_new_tokens, where=where
        )
        early, gate = self._refuse_early(prep, t0)
        if early is not None:
            return early
        stats: dict[str, Any] = {}
        if prep.span is not None and self.config.compose == "extract":
            raw = extracted_answer(prep)
        elif prep.evidence is not None:
            args = self._decode_args(temperature, max_new_tokens, gate, prep)
            raw = "".join(evidence_reply(self.decoder_for(prep), prep, args, stats))
        else:
            raw = self.decoder_for(prep).generate(
                prep.messages,
                **self._decode_args(temperature, max_new_tokens, gate, prep),
                stats=stats,
            )
        answer = self._finish(raw, prep, gate)
        answer.finish_reason = finish_reason(stats, answer, prep)
        prep.timings.update(_gen_timings(stats), total_s=time.perf_counter() - t0)
        return answer

    def stream(
        self,
        question: str,
        *,
        history: Any = None,
        k: int | None = None,
        mode: str | None = None,
        temperature: float | None = None,
        max_new_tokens: int | None = None,
        where: Any = None,
    ) -> Iterator[str | Answer]:
        """Raw text deltas (citation markers included) as decoded, then the final :class:`Answer`
        (``where`` as for :meth:`answer`).

        A completed citation (see :func:`complete_citation`) is scored after decoding ends; its
        marker (`` [i]``) arrives as the last text delta, before the Answer.
        """
        t0 = time.perf_counter()
        prep = self.prepare(
            question, history=history, k=k, mode=mode, max_new_tokens=max_new_tokens, where=where
        )
        early, gate = self._refuse_early(prep, t0)
        if early is not None:
            yield REFUSAL
            yield early
            return
        stats: dict[str, Any] = {}
        parts: list[str] = []
        if prep.span is not None and self.config.compose == "extract":
            deltas: Iterator[str] = iter([extracted_answer(prep)])
        elif prep.evidence is not None:
            args = self._decode_args(temperature, max_new_tokens, gate, prep)
            deltas = evidence_reply(self.decoder_for(prep), prep, args, stats)
        else:
            deltas = self.decoder_for(prep).stream(
                prep.messages,
                **self._decode_args(temperature, max_new_tokens, gate, prep),
                stats=stats,
            )
        for delta in deltas:
            parts.append(delta)
            yield delta
        answer = self._finish("".join(parts), prep, gate)
        answer.finish_reason = finish_reason(stats, answer, prep)
        if answer.citations_completed:
            yield f" [{answer.citations[0].number}]"
        prep.timings.update(_gen_timings(stats), total_s=time.perf_counter() - t0)
        yield answer

    def _refuse_early(
        self, prep: Prepared, t0: float
    ) -> tuple[Answer | None, RefusalDecision | None]:
        """(the refusal, when nothing relevant was retrieved or the gate refuses, else None;
        the gate's decision). Either refusal decodes nothing."""
        # with a reader, the check runs only where it abstained (a span's Prepared has none), so
        # a refusal here is the reader and the check agreeing
        unanswerable = prep.answerable is not None and prep.answerable.refuse
        spanned = prep.span is not None  # the decoder only phrases the span: it never refuses
        gate = self._gate(prep) if prep.hits and not unanswerable and not spanned else None
        if prep.hits and not unanswerable and not (gate is not None and gate.refuse):
            return None, gate
        prep.timings["total_s"] = time.perf_counter() - t0
        if not prep.hits:
            return refusal(prep), None
        answer = make_answer(REFUSAL, prep)  # these refusals still show the passages
        answer.refusal_probability = gate.probability if gate is not None else None
        return answer, gate

    def _gate(self, prep: Prepared) -> RefusalDecision | None:
        """The refusal gate's decision (rag.answer.refusal), or None when it is off or unsupported.
        The threshold is the config's; else, when the answerability check ran, 1.0 (the
        refusal barred: with the check deciding, the decoder's own refusals only added false
        refusals, SQuAD train: 86.7% of unanswerable refused either way, false refusals 6.9%
        barred vs 9.0% at the adapter's 0.6; docs/answering.md); else the adapter's own."""
        threshold = self.config.refusal_threshold
        gen = self.decoder_for(prep)
        if threshold is None:
            own = getattr(gen, "refusal_threshold", None)
            threshold = 1.0 if own is not None and prep.answerable is not None else own
        if threshold is None or not supports_gate(gen):
            return None
        t0 = time.perf_counter()
        decision = decide(gen, prep.messages, threshold)
        prep.timings["gate_s"] = time.perf_counter() - t0
        return decision

    def _finish(self, raw: str, prep: Prepared, gate: RefusalDecision | None = None) -> Answer:
        """The Answer for ``raw``, with citation completion when configured and supported, then
        citation verification when ``self.verify``; the gate's refusal probability recorded."""
        t0 = time.perf_counter()
        if prep.span is not None:
            answer = make_answer(span_reply(raw, prep), prep)
            return verify_answer(answer) if self.verify else answer
        gen = self.fallback_generator
        if prep.evidence is not None and not parse_citations(raw, len(prep.hits)).text:
            # the decoder wrote nothing (or only markers): the encoder's best sentence answers
            raw = f"{prep.evidence[0].best} [1]"
        if not self.config.complete_citations:
            answer = make_answer(raw, prep)
        elif hasattr(gen, "score_continuations") and prep.evidence is None:
            answer = complete_citation(raw, prep, gen)
        else:
            answer = attribute_citation(raw, prep)
        if answer.citations_completed:
            prep.timings["cite_s"] = time.perf_counter() - t0
        if prep.evidence is not None:
            answer.answer_span = short_answer_span(raw, answer, prep)
        if gate is not None:
            answer.refusal_probability = gate.probability
        return verify_answer(answer) if self.verify else answer


def load_decoder(cfg: RAGConfig, adapter: str | Path | None) -> Any:
    """The decoder for ``cfg`` with ``adapter`` (``auto`` / ``none`` / a folder, as
    ``RAGConfig.adapter``) and every decoding setting, on the engine ``cfg.engine`` resolves to
    (:func:`rag.config.engine_for`: OpenVINO GenAI where it can run the decoder, a
    :class:`rag.generate.generator.Generator` on torch elsewhere)."""
    from rag.config import engine_for
    from rag.generate.generator import Generator
    from rag.generate.ov_engine import OpenVINOGenerator
    from rag.generate.speed import DecodeSpeed

    if engine_for(replace(cfg, adapter=adapter)) == "openvino":
        return OpenVINOGenerator.load(
            cfg.decoder,
            device=cfg.device,
            profile=cfg.profile,
            prompt_cache_mb=cfg.prompt_cache_mb if cfg.prefix_cache else 0,
            batching=cfg.batching,
            max_batch=cfg.max_batch,
            max_prefill_tokens=cfg.max_prefill_tokens,
            max_context_tokens=cfg.max_context_tokens,
        )
    return Generator.load(
        cfg.decoder,
        adapter=adapter,
        device=cfg.device,
        prefix_cache=cfg.prefix_cache,
        prompt_cache_mb=cfg.prompt_cache_mb if cfg.prefix_cache else 0,
        max_context_tokens=cfg.max_context_tokens,
        precision=cfg.decoder_precision,
        profile=cfg.profile,
        batching=cfg.batching,
        max_batch=cfg.max_batch,
        max_prefill_tokens=cfg.max_prefill_tokens,
        speed=DecodeSpeed.from_config(cfg),
    )


# Tokens the decoder may spend on the one to three sentences around a reader span.
SPAN_MAX_NEW_TOKENS = 80
SPAN_CITATION = "[1]"  # how the reader-first reply ends (rag.prompt.SPAN_SYSTEM_PROMPT)


def extracted_answer(prep: Prepared) -> str:
    """The passage's own sentence(s) holding the reader's span, cited: the answer when nothing is
    decoded (``compose="extract"``), or when the decoder's reply lost the span."""
    from rag.answer.reader import sentence_around

    span = prep.span
    return f"{sentence_around(prep.hits[0].chunk.text, span.start, span.end)} {SPAN_CITATION}"


def span_reply(raw: str, prep: Prepared) -> str:
    """The decoder's sentence around the span, cited [1]; the extracted sentence instead when
    the reply refuses or does not hold the span word for word (normalised)."""
    from rag.evaluation.metrics import normalize_answer

    parsed = parse_citations(raw, 1)  # the markers it wrote come out; [1] is appended
    if parsed.refused or normalize_answer(prep.span.text) not in normalize_answer(parsed.text):
        return extracted_answer(prep)
    return f"{parsed.text} {SPAN_CITATION}"


def finish_reason(stats: dict[str, Any], answer: Answer, prep: Prepared) -> str:
    """``"length"`` when the decoder stopped at its token limit (``stats["finish_reason"]``,
    :meth:`rag.generate.generator.Generator.finish_reason`) and its reply is the answer, else
    ``"stop"``: a reply around a reader span that was replaced by the passage's own sentence
    was not cut, nor is text nothing decoded."""
    if stats.get("finish_reason") != "length":
        return "stop"
    if prep.span is not None and answer.raw_text == extracted_answer(prep):
        return "stop"
    return "length"


def _gen_timings(stats: dict[str, Any]) -> dict[str, float]:
    out = {}
    if "prompt_tokens" in stats:
        out["prompt_tokens"] = float(stats["prompt_tokens"])
    if "ttft_s" in stats:
        out["ttft_s"] = stats["ttft_s"]
    if "total_s" in stats:
        out["generate_s"] = stats["total_s"]
    if "new_tokens" in stats:
        out["new_tokens"] = float(stats["new_tokens"])
    return out


def attribute_citation(raw: str, prep: Prepared) -> Answer:
    """:func:`make_answer`, plus a marker for the passage that supports the answer best when the
    model cited nothing (:func:`rag.answer.verify.attribute`): citation completion for a decoder
    whose engine gives no marker likelihoods, and for excerpt prompts, whose markers name
    excerpts the support of the passage's words checks directly."""
    from rag.answer.verify import attribute

    answer = make_answer(raw, prep)
    if answer.refused or answer.citations or not prep.hits:
        return answer
    given = prep.evidence or []
    texts = [e.text for e in given] or [h.chunk.text for h in prep.hits]
    best = attribute(answer.text, texts, prep.query)
    if best is None:
        return answer
    completed = make_answer(f"{raw} [{best}]", prep)
    completed.raw_text = raw
    completed.citations_completed = True
    return completed


def short_answer_span(raw: str, answer: Answer, prep: Prepared) -> AnswerSpan | None:
    """The evidence reply's short answer (:func:`rag.prompt.split_short_answer`) as an
    :class:`AnswerSpan`, found word for word in a given passage: the cited ones first, then the
    rest in prompt order; None when the reply has none or no passage holds it (an answer
    the documents do not contain is never shown as a span of them)."""
    if answer.refused:
        return None
    short = split_short_answer(raw).short
    if not short:
        return None
    found = find_short_answer(short, prep.hits, [c.number for c in answer.citations])
    if found is None:
        return None
    n, start, end = found
    c = prep.hits[n - 1].chunk
    return AnswerSpan(
        text=c.text[start:end],
        number=n,
        source=c.source,
        chunk_id=c.id,
        start=start,
        end=end,
        source_start=c.start + start,
        source_end=c.start + end,
        score=0.0,
        path=c.path,
        origin="decoder",
    )


def find_short_answer(
    short: str, hits: list[Hit], first: list[int] | tuple[int, ...] = ()
) -> tuple[int, int, int] | None:
    """(passage number, start, end) of the first given passage that holds ``short`` word for
    word (:func:`rag.answer.verify.locate`): the numbers in ``first`` (the cited ones) before
    the rest in prompt order; None when none does."""
    order = [*first, *(n for n in range(1, len(hits) + 1) if n not in first)]
    for n in order:
        found = locate(short, hits[n - 1].chunk.text)
        if found is not None:
            return n, *found
    return None


def evidence_reply(
    gen: Any, prep: Prepared, args: dict[str, Any], stats: dict[str, Any]
) -> Iterator[str]:
    """Text deltas of the reply to an evidence prompt: the explanation, then a last line
    ``Short answer: ...`` (:data:`rag.prompt.SHORT_ANSWER`) when a given passage holds that
    answer word for word (an answer the documents do not hold is not shown as theirs). The explanation is decoded up to
    that line; the short answer is always decoded as a continuation of the explanation
    (``continuation``: prompt + explanation + the line's label, whose keys and values the
    engine's prefix cache already holds: a few tokens of prefill), because small decoders
    often end their turn without it. ``stats`` gets the first call's time to first token and
    both calls' tokens and time."""
    first: dict[str, Any] = {}
    parts: list[str] = []
    stop = (*(args.get("stop") or DEFAULT_STOP), SHORT_ANSWER)
    for delta in gen.stream(prep.messages, **{**args, "stop": stop}, stats=first):
        parts.append(delta)
        yield delta
    stats.update(first)
    explanation = "".join(parts).strip()
    left = min(SHORT_ANSWER_TOKENS, args["max_new_tokens"] - first.get("new_tokens", 0))
    if not explanation or is_refusal(explanation) or first.get("finish_reason") == "length":
        return  # nothing to read it off, or the answer's token limit already reached
    if left < 1:  # no token left of the limit for it
        return
    more: dict[str, Any] = {}
    short_args = {**args, "max_new_tokens": left, "stop": ("\n", *DEFAULT_STOP)}
    label = f"{explanation}\n{SHORT_ANSWER}"
    short = "".join(gen.stream(prep.messages, **short_args, stats=more, continuation=label))
    short = clean_short_answer(short) or ""
    if short and find_short_answer(short, prep.hits) is not None:
        yield f"\n{SHORT_ANSWER} {short}"  # shown only where a passage holds it word for word
    stats["new_tokens"] = first.get("new_tokens", 0) + more.get("new_tokens", 0)
    stats["total_s"] = first.get("total_s", 0.0) + more.get("total_s", 0.0)


# Tokens the decoder may spend on the short answer line of an evidence reply.
SHORT_ANSWER_TOKENS = 24
