"""The RAG pipeline: query → retrieve → relevance gate → fit passages → generate → citations.

One :class:`RAGPipeline` serves every caller (CLI, UI sessions, evals). The retriever and the
generator are loaded lazily, once, under a lock, so the first question pays the load time and
concurrent sessions share one copy of each model.

Grounding rules, in one place:

- nothing relevant retrieved (no hits, or every hit under the relevance threshold), or the
  answerability check (:mod:`rag.answer.answerability`) judges the passages unable to hold the answer
  → the answer is :data:`rag.answer.prompt.REFUSAL` and the model is not called;
- citation markers ``[n]`` are parsed with :func:`rag.answer.prompt.parse_citations`; each valid number
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
(``training.finetune.lora --prompt-format span``, what ``make models`` trains; rag.models.span_only_adapter)
phrases spans only, and the k-passage fallback is answered by the decoder without it
(:attr:`RAGPipeline.fallback_generator`, a second copy: loaded on the first such question, or at
start-up by the UI and the server): over a prompt it never saw, the span adapter answered worse
than the decoder alone (measured in docs/answering.md).

How the answer is put together from the decoder's text (markers, completion, the span reply,
the evidence reply's short answer) is :mod:`rag.answer.compose`; the settings each step reads
are the config's sections (``config.retrieval``, ``config.answer``, ``config.generate``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rag.answer.answerability import FITTED_PASSAGES, asked_sentences, check, refusal_text
from rag.answer.compose import (
    SPAN_CITATION,
    SPAN_MAX_NEW_TOKENS,
    Prepared,
    add_quotations,
    attribute_citation,
    complete_citation,
    evidence_reply,
    extracted_answer,
    finish_reason,
    gen_timings,
    make_answer,
    refusal,
    short_answer_span,
    span_reply,
    warm_up_extract,
)
from rag.answer.prompt import (
    DEFAULT_STOP,
    REFUSAL,
    build_evidence_messages,
    build_messages,
    build_span_messages,
    parse_citations,
)
from rag.answer.refusal import RefusalDecision, decide, supports_gate
from rag.answer.relevance import relevant_hits
from rag.answer.rewrite import rewrite_query
from rag.answer.verify import verify_answer
from rag.config import RAGConfig
from rag.retrieval.query import check_query
from rag.retrieval.spelling import searched
from rag.types import Answer, AnswerSpan, Hit

if TYPE_CHECKING:
    from rag.generate.settings import GenerationSettings
    from rag.retrieval.retriever import Retriever

RewriteFn = Callable[[str, list[tuple[str, str]]], str]


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


def separate_factoid_decoder(settings: GenerationSettings) -> str | None:
    """The decoder that copies factoids' short answers
    (:func:`rag.models.resolve_factoid_decoder`) when it is not the answering
    ``settings.decoder`` (the 1.5B beside the default 0.5B); None when that one copies them."""
    from rag.models import resolve_factoid_decoder

    name = resolve_factoid_decoder(settings.decoder, settings.factoid_decoder)
    return None if name == str(settings.decoder) else name


def load_factoid_decoder(settings: GenerationSettings, device: str = "auto") -> Any:
    """The decoder :func:`separate_factoid_decoder` names, without an adapter, and warmed up
    (:func:`rag.answer.compose.warm_up_extract`: the engine's first call at load, not in the
    first factoid's time). For a caller that checked there is one
    (:attr:`RAGPipeline.factoid_generator`, ``evals.qa``, ``benchmarks.serve_load``)."""
    from rag.generate.load import load_decoder

    name = separate_factoid_decoder(settings) or str(settings.decoder)
    loaded = load_decoder(
        settings.replace(decoder=name, adapter="none"), device, "none", short_replies=True
    )
    warm_up_extract(loaded)
    return loaded


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
        factoid_generator: Any = None,
    ) -> None:
        self.config = config or RAGConfig()
        self.verify = self.config.answer.verify_citations if verify is None else verify
        self._retriever = retriever
        self._generator = generator
        self._fallback = (
            fallback_generator if generator is None else fallback_generator or generator
        )
        # passed-in decoders (tests, evals) copy factoids too unless one is given for it
        self._factoid = (
            factoid_generator if generator is None else factoid_generator or self._fallback
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
                    self._generator = self._load_decoder(self.config.generate.adapter)
        return self._generator

    @property
    def fallback_generator(self) -> Any:
        """The decoder for the k-passage prompt (the reader abstained, or there is none):
        :attr:`generator`, or the decoder without its adapter when that adapter was trained on
        the reader-first prompt alone (module docstring); loaded on first use."""
        if self._fallback is None:
            from rag.models import resolve_adapter, span_only_adapter

            gen = self.config.generate
            if not span_only_adapter(resolve_adapter(gen.decoder, gen.adapter)):
                self._fallback = self.generator
                return self._fallback
            with self._generator_lock:
                if self._fallback is None:
                    self._fallback = self._load_decoder(None)
        return self._fallback

    @property
    def factoid_generator(self) -> Any:
        """The decoder that copies a factoid's short answer out of the encoder's best sentences
        (``config.generate.factoid_decoder``, :func:`rag.models.resolve_factoid_decoder`: the
        1.5B beside the default 0.5B when installed), without an adapter; it is
        :attr:`fallback_generator` when that resolves to the answering decoder. Loaded on first
        use."""
        if self._factoid is None:
            gen = self.config.generate
            if separate_factoid_decoder(gen) is None:
                self._factoid = self.fallback_generator
                return self._factoid
            with self._generator_lock:
                if self._factoid is None:
                    self._factoid = load_factoid_decoder(gen, self.config.device)
        return self._factoid

    def load_models(self) -> None:
        """Load now every model this pipeline may answer with (they are lazy): the retriever's
        query encoder (which also picks the answering sentences), the reader when one is set,
        and every decoder. A front end's preload, so a bad model fails at start-up and no first
        question pays a load. A decoder shared with other pipelines
        (rag.serve.state.SharedDecoder) is loaded through its ``ensure_loaded``."""
        from rag.generate.load import ensure_loaded

        _ = getattr(self.retriever, "encoder", None)  # an index's encoder loads on first use
        _ = self.reader
        for model in (self.generator, self.fallback_generator, self.factoid_generator):
            ensure_loaded(model)
        # the words typos are corrected against, read once (after the decoder: its vocabulary)
        searched(self.retriever, "", self.config.retrieval.correct_typos)

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

                    path = resolve_reader(self.config.answer.reader)
                    self._reader = (
                        SpanReader.load(
                            path, device=pick_device(self.config.device), precision="fp32"
                        )
                        if path
                        else False
                    )
        return self._reader or None

    def _load_decoder(self, adapter: str | Path | None) -> Any:
        """The decoder of the generation settings with ``adapter`` (``auto`` / ``none`` / a
        folder), on the engine they resolve to (:func:`rag.generate.load.load_decoder`): its
        tokenizer now (the excerpts' token budget needs it), an OpenVINO engine at its first
        request, so a factoid the factoid decoder answers never builds it (:meth:`load_models`
        builds it now)."""
        from rag.generate.load import load_decoder

        return load_decoder(self.config.generate, self.config.device, adapter, lazy=True)

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
                query,
                k=k or self.config.retrieval.k,
                mode=mode or self.config.retrieval.mode,
                **extra,
            )
        )

    def standalone_query(self, question: str, history: Any = None) -> str:
        """The retrieval query: ``rewrite_query(question, history)`` when there is history, its
        typos corrected against the index's words when the retrieval settings say so
        (``correct_typos``, :mod:`rag.retrieval.spelling`)."""
        turns = normalise_history(history)
        query = question.strip()
        if self.rewrite_query is not None and turns:
            query = (self.rewrite_query(question, turns) or question).strip()
        return searched(self.retriever, query, self.config.retrieval.correct_typos)

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
        settings = self.config.answer
        mode = mode or self.config.retrieval.mode
        k = k or self.config.retrieval.k
        query = self.standalone_query(question, history)
        n = k
        if self.reads_evidence:  # the encoder reads more passages than a prompt holds
            n = max(n, settings.evidence_passages)
        found = self.retrieve(query, k=n, mode=mode, where=where)
        hits = relevant_hits(found, mode, settings.min_score)
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
        budget_new = max_new_tokens or self.config.generate.max_new_tokens
        excerpts, lead, answerable = self.read_and_check(
            query, hits, gen, timings, budget_new, literal=settings.literal_terms
        )
        if answerable is not None and answerable.refuse and not answerable.missing:
            asked = asked_sentences(query)
            retry = asked and self.check_asked(asked, n, mode, where, gen, timings, budget_new)
            if retry:  # the question's own sentences find what it asks: answer from that
                hits, excerpts, lead, answerable = retry
        if excerpts:
            # one excerpt per hit it came from, [1] first; the other hits follow, uncited
            chosen = [hits[e.passage] for e in excerpts]
            ordered = [*chosen, *(h for h in hits if not any(h is c for c in chosen))]
            from rag.answer.evidence import plain_markup

            messages = build_evidence_messages(query, [plain_markup(e.text) for e in excerpts])
            number = {id(h): n for n, h in enumerate(ordered, start=1)}
            return Prepared(
                question,
                query,
                ordered,
                messages,
                timings,
                answerable,
                reranker,
                evidence=excerpts,
                lead=[(number[id(hits[p])], text) for p, text in lead],
            )
        hits = hits[:k]  # whole passages: the k best that fit
        kept = gen.fit_passages(query, [h.chunk.text for h in hits], budget_new)
        hits = hits[: len(kept)]
        messages = (
            gen.messages(query, kept) if hasattr(gen, "messages") else build_messages(query, kept)
        )
        return Prepared(question, query, hits, messages, timings, answerable, reranker)

    def check_asked(
        self,
        asked: str,
        n: int,
        mode: str,
        where: Any,
        gen: Any,
        timings: dict[str, float],
        max_new_tokens: int,
    ) -> tuple[list[Hit], list[Any] | None, list[tuple[int, str]], Any] | None:
        """Retrieval, excerpts and the answerability check again for ``asked``, the asking
        sentences of a question the check refused (:func:`rag.answer.answerability.asked_sentences`,
        its preamble left out); their hits, excerpts, lead units and decision when the check
        now passes, else None. The prompt still asks the whole question (the preamble says
        what the user has: "Port 8000 is already taken"), and its literal terms were checked
        with it."""
        t0 = time.perf_counter()
        hits = relevant_hits(
            self.retrieve(asked, k=n, mode=mode, where=where), mode, self.config.answer.min_score
        )
        timings["retrieve_s"] += time.perf_counter() - t0
        if not hits:
            return None
        excerpts, lead, decision = self.read_and_check(
            asked, hits, gen, timings, max_new_tokens, literal=False
        )
        if decision is None or decision.refuse:
            return None
        return hits, excerpts, lead, decision

    def read_and_check(
        self,
        query: str,
        hits: list[Hit],
        gen: Any,
        timings: dict[str, float],
        max_new_tokens: int,
        *,
        literal: bool,
    ) -> tuple[list[Any] | None, list[tuple[int, str]], Any]:
        """The encoder's excerpts and lead units of ``hits`` (:meth:`select_evidence`) and the
        answerability check's decision for ``query`` over them: it reads as many passages as
        it was fitted on, and their best sentence's score where the encoder read them
        (:func:`rag.answer.answerability.check`; ``literal``: its literal-terms rule)."""
        excerpts, lead, unit = self.select_evidence(query, hits, gen, timings, max_new_tokens)
        decision = check(
            self.retriever,
            query,
            hits[:FITTED_PASSAGES],
            self.config.answer.answerability_threshold,
            literal=literal,
            unit=unit,
        )
        return excerpts, lead, decision

    @property
    def reads_evidence(self) -> bool:
        """Whether answers are written from the encoder's excerpts (``evidence_tokens`` > 0 in
        the answer settings, and a retriever with an encoder to read with)."""
        return bool(self.config.answer.evidence_tokens) and (
            getattr(self.retriever, "encoder", None) is not None
        )

    def select_evidence(
        self,
        query: str,
        hits: list[Hit],
        gen: Any,
        timings: dict[str, float],
        max_new_tokens: int | None = None,
    ) -> tuple[list[Any] | None, list[tuple[int, str]], float | None]:
        """The encoder's excerpts of ``hits`` (:func:`rag.answer.evidence.select`) within
        ``config.evidence_tokens`` decoder tokens (fewer when the context window has less room
        beside the evidence prompt and ``max_new_tokens``), or None when excerpts are off (0),
        the retriever has no encoder to read with, or the decoder's context has no room for
        the evidence prompt (the k-passage prompt, shorter, is used); and the best units over
        all hits (:func:`rag.answer.evidence.lead_units`: (index in ``hits``, text), best
        first; empty with no excerpts); and the best unit's score among the passages the
        answerability check reads (its sentence signal; None with no excerpts).
        ``timings["evidence_s"]`` records the time."""
        if not self.reads_evidence or not hasattr(gen, "count_tokens"):
            return None, [], None
        budget, encoder = self.config.answer.evidence_tokens, self.retriever.encoder
        if hasattr(gen, "prompt_ids") and hasattr(gen, "max_positions"):
            from rag.generate.context_budget import QuestionTooLongError, space_left

            new = max_new_tokens or self.config.generate.max_new_tokens
            try:
                left = space_left(gen, build_evidence_messages(query, []), new)
            except QuestionTooLongError:
                left = 0
            budget = min(budget, left - 8 * len(hits))  # markers and gaps
            if budget < 16:  # no room (a small context): the k-passage path trims or refuses
                return None, [], None

        from rag.answer.evidence import best_unit, excerpts_of, lead_units, read_units

        t0 = time.perf_counter()
        scored = read_units(encoder, query, [h.chunk.text for h in hits])
        excerpts = excerpts_of(scored, budget, gen.count_tokens)
        timings["evidence_s"] = time.perf_counter() - t0
        if not excerpts:
            return None, [], None
        return excerpts, lead_units(scored), best_unit(scored, FITTED_PASSAGES)

    def read(
        self, query: str, hits: list[Hit], timings: dict[str, float]
    ) -> tuple[AnswerSpan, Hit] | None:
        """The reader's trusted span over ``hits`` and the hit it is in, or None when there is no
        reader or it trusts no span (abstains); ``timings["read_s"]`` records its time. The
        threshold is the config's, else the one the reader's training chose
        (:meth:`rag.answer.reader.SpanReader.threshold_for`)."""
        reader = self.reader
        if reader is None:
            return None
        from rag.answer.reader import pick

        threshold = reader.threshold_for(self.config.answer.reader_threshold)
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
        gen = self.config.generate
        limit = max_new_tokens or gen.max_new_tokens
        extra: dict[str, Any] = {}
        if prep is not None and prep.span is not None:
            limit = min(limit, SPAN_MAX_NEW_TOKENS)
            # the instruction ends the sentences with [1]: decoding stops there (without it the
            # 0.5B decoder ran on to the token cap: python-docs p50 7.0 s)
            extra["stop"] = (*DEFAULT_STOP, SPAN_CITATION)
        return {
            "max_new_tokens": limit,
            "temperature": gen.temperature if temperature is None else temperature,
            "top_p": gen.top_p,
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
        ``where`` restricts retrieval to some documents (None: the config's filter). The
        :class:`Answer` that :meth:`stream` ends with: one body for both."""
        for item in self.stream(
            question,
            history=history,
            k=k,
            mode=mode,
            temperature=temperature,
            max_new_tokens=max_new_tokens,
            where=where,
        ):
            if isinstance(item, Answer):
                return item
        raise AssertionError("stream() ended without an Answer")

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
        marker (`` [i]``) arrives after the reply, then the quotes of an answer written from
        excerpts (:func:`add_quotations`), then the Answer.
        """
        t0 = time.perf_counter()
        prep = self.prepare(
            question, history=history, k=k, mode=mode, max_new_tokens=max_new_tokens, where=where
        )
        early, gate = self._refuse_early(prep, t0)
        if early is not None:
            yield early.text
            yield early
            return
        stats: dict[str, Any] = {}
        parts: list[str] = []
        if prep.span is not None and self.config.answer.compose == "extract":
            deltas: Iterator[str] = iter([extracted_answer(prep)])
        elif prep.evidence is not None:
            args = self._decode_args(temperature, max_new_tokens, gate, prep)
            factoid = self.config.answer.factoid
            deltas = evidence_reply(
                self.decoder_for(prep),
                prep,
                args,
                stats,
                factoid,
                extractor=lambda: self.factoid_generator,
            )
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
        if quoted := add_quotations(answer, prep, self.config.answer.quotes):
            yield quoted  # the encoder's sentences, word for word, after the reply
        prep.timings.update(gen_timings(stats), total_s=time.perf_counter() - t0)
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
        # these refusals still show the passages; nothing was decoded, so the refusal (naming
        # any term no document holds) is the reply itself, raw_text too
        answer = make_answer(REFUSAL, prep)
        answer.text = answer.raw_text = refusal_text(prep.answerable, answer.text)
        answer.refusal_probability = gate.probability if gate is not None else None
        return answer, gate

    def _gate(self, prep: Prepared) -> RefusalDecision | None:
        """The refusal gate's decision (rag.answer.refusal), or None when it is off or unsupported.
        The threshold is the config's; else, when the answerability check ran, 1.0 (the
        refusal barred: with the check deciding, the decoder's own refusals only added false
        refusals, SQuAD train: 86.7% of unanswerable refused either way, false refusals 6.9%
        barred vs 9.0% at the adapter's 0.6; docs/answering.md); else the adapter's own."""
        threshold = self.config.answer.refusal_threshold
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
        if not self.config.answer.complete_citations:
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
