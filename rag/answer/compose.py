"""How an answer is put together from what was decided before decoding and what the decoder
wrote: the prepared prompt (:class:`Prepared`), citation markers mapped to passages, citation
completion (by the decoder's likelihoods, or by word support for excerpt prompts), the reply
around a reader span, the evidence reply with its short answer line, and the finish reason.

Pure functions of a :class:`Prepared` and a decoder's text (the decoder only where a likelihood
or a continuation is asked for), so :class:`rag.pipeline.RAGPipeline` reads as the steps it takes
and these rules can be tested alone.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from rag.answer.answerability import AnswerabilityDecision
from rag.answer.evidence import asks_how, quotations
from rag.answer.prompt import (
    DEFAULT_STOP,
    EXCERPT_LABEL,
    REFUSAL,
    SHORT_ANSWER,
    build_extract_messages,
    clean_short_answer,
    is_refusal,
    parse_citations,
    quotes_block,
    split_short_answer,
)
from rag.answer.support import content_words
from rag.answer.verify import citation_for, locate, locate_near
from rag.types import Answer, AnswerSpan, Hit


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
    # the encoder's best sentences over all the hits, best first, as (hit number from 1, text):
    # what a factoid's short answer is read from (evidence_reply); empty without excerpts
    lead: list[tuple[int, str]] = field(default_factory=list)


def make_answer(raw: str, prep: Prepared) -> Answer:
    """Answer from the model's raw text: markers parsed, each valid one mapped to its passage."""
    parsed = parse_citations(raw, len(prep.hits))
    citations = [citation_for(n, prep.hits) for n in parsed.cited]
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


# Tokens the decoder may spend on the one to three sentences around a reader span.
SPAN_MAX_NEW_TOKENS = 80
SPAN_CITATION = "[1]"  # how the reader-first reply ends (rag.answer.prompt.SPAN_SYSTEM_PROMPT)


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


def gen_timings(stats: dict[str, Any]) -> dict[str, float]:
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
    """The evidence reply's short answer (rag.answer.prompt.split_short_answer`) as an
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


def repeats_question(short: str, question: str) -> bool:
    """Whether every content word of ``short`` is one the question already has ("SNP" for
    "What did the SNP say about the oil revenues?"): it names what was asked about, not the
    answer, so it is not shown as the short answer (rag.answer.support.content_words)."""
    words = content_words(short)
    return bool(words) and words <= content_words(question)


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
    gen: Any,
    prep: Prepared,
    args: dict[str, Any],
    stats: dict[str, Any],
    factoid: str = "extract",
    extractor: Callable[[], Any] | None = None,
) -> Iterator[str]:
    """Text deltas of the reply to an evidence prompt.

    A factoid (a question that does not ask how, why or what something does:
    :func:`rag.answer.evidence.asks_how`), with ``factoid="extract"``: the decoder reads the
    encoder's best sentences (``prep.lead``) and writes the short answer alone
    (:func:`extract_short_answer`, by ``extractor()``, the decoder for that prompt, else
    ``gen``); the reply is the sentence that holds it, cited, and the line
    ``Short answer: ...``. Nothing else is decoded. When no such sentence holds what it
    wrote, the reply is written as for any other question:

    the explanation, then (not for a how-question: :func:`explained_reply`) a last line
    ``Short answer: ...`` (:data:`rag.answer.prompt.SHORT_ANSWER`) when a given passage holds
    that answer word for word (an answer the documents do not hold
    is not shown as theirs). The explanation is decoded up to that line; the short answer is
    always decoded as a continuation of the explanation (``continuation``: prompt + explanation
    + the line's label, whose keys and values the engine's prefix cache already holds: a few
    tokens of prefill), because small decoders often end their turn without it. ``stats`` gets
    the first call's time to first token and every call's tokens and time."""
    spent: dict[str, Any] = {}
    if factoid == "extract" and prep.lead and not asks_how(prep.question):
        found = extract_short_answer(extractor() if extractor else gen, prep, args, spent)
        if found is not None:
            short, number, sentence = found
            stats.update(spent)
            yield f"{sentence} [{number}]\n{SHORT_ANSWER} {short}"
            return
    yield from explained_reply(gen, prep, args, stats)
    if spent:  # the short-answer call that found nothing: its time and tokens count too
        stats["ttft_s"] = stats.get("ttft_s", 0) + spent.get("total_s", 0)  # it ran first
        for key in ("total_s", "new_tokens"):
            stats[key] = stats.get(key, 0) + spent.get(key, 0)


def explained_reply(
    gen: Any, prep: Prepared, args: dict[str, Any], stats: dict[str, Any]
) -> Iterator[str]:
    """The explanation and its short answer line (:func:`evidence_reply`). A question that
    asks how, why or what something does (:func:`rag.answer.evidence.asks_how`) gets no short
    answer: the explanation and the quotes under it answer it; a few words in bold on top said
    less than the sentences under them, and named a command for another task for about half
    of the dev questions about Git and the Linux kernel (docs/answering.md)."""
    first: dict[str, Any] = {}
    parts: list[str] = []
    stop = (*(args.get("stop") or DEFAULT_STOP), SHORT_ANSWER, EXCERPT_LABEL)
    for delta in gen.stream(prep.messages, **{**args, "stop": stop}, stats=first):
        parts.append(delta)
        yield delta
    stats.update(first)
    explanation = "".join(parts).strip()
    left = min(SHORT_ANSWER_TOKENS, args["max_new_tokens"] - first.get("new_tokens", 0))
    if not explanation or is_refusal(explanation) or first.get("finish_reason") == "length":
        return  # nothing to read it off, or the answer's token limit already reached
    if asks_how(prep.question):
        return  # its answer is the explanation (above)
    if left < 1:  # no token left of the limit for it
        return
    more: dict[str, Any] = {}
    short_args = {**args, "max_new_tokens": left, "stop": ("\n", *DEFAULT_STOP)}
    label = f"{explanation}\n{SHORT_ANSWER}"
    short = "".join(gen.stream(prep.messages, **short_args, stats=more, continuation=label))
    short = clean_short_answer(short) or ""
    if (
        short
        and not repeats_question(short, prep.question)
        and find_short_answer(short, prep.hits) is not None
    ):
        yield f"\n{SHORT_ANSWER} {short}"  # shown only where a passage holds it word for word
    stats["new_tokens"] = first.get("new_tokens", 0) + more.get("new_tokens", 0)
    stats["total_s"] = first.get("total_s", 0.0) + more.get("total_s", 0.0)


def extract_short_answer(
    gen: Any, prep: Prepared, args: dict[str, Any], stats: dict[str, Any]
) -> tuple[str, int, str] | None:
    """(short answer, hit number, the sentence holding it) that the decoder copies out of the
    encoder's best sentences (``prep.lead``, :func:`rag.answer.prompt.build_extract_messages`);
    None when it wrote nothing usable (:func:`rag.answer.prompt.clean_short_answer`), a refusal,
    only the question's own words (:func:`repeats_question`) or only function words, or words
    none of those sentences holds, not even spelt another way (:func:`rag.answer.verify.
    locate_near`: "1,232 kilometers" for the sentence's "1,232 kilometres", whose words are
    then the short answer)."""
    # a long unit (a code block, a list item) is read up to LEAD_WORDS words: a bounded prompt
    read = [" ".join(text.split()[:LEAD_WORDS]) for _, text in prep.lead]
    messages = build_extract_messages(prep.query, read)
    limit = min(SHORT_ANSWER_TOKENS, args["max_new_tokens"])
    # the sampling settings only: a refusal gate's prompt cache and ban belong to the other prompt
    call = {k: args[k] for k in ("temperature", "top_p") if k in args}
    call.update(max_new_tokens=limit, stop=("\n", *DEFAULT_STOP))
    short = clean_short_answer("".join(gen.stream(messages, **call, stats=stats)))
    if not short or is_refusal(short) or repeats_question(short, prep.question):
        return None
    if short.replace(" ", "").isalpha() and not content_words(short):
        return None  # only function words ("it", "the", "yes"): no answer to show on top
    for (number, _), sentence in zip(prep.lead, read):  # in what it read
        found = locate(short, sentence)
        if found is not None:
            return short, number, around(sentence, *found)
    for (number, _), sentence in zip(prep.lead, read):  # spelt its own way: the text's words
        found = locate_near(short, sentence)
        if found is not None:
            near = sentence[slice(*found)]
            if not repeats_question(near, prep.question):
                return near, number, around(sentence, *found)
    return None


def warm_up_extract(gen: Any) -> None:
    """One token of the short-answer prompt (:func:`extract_short_answer`) over a stand-in
    sentence, when a decoder that answers only that prompt is loaded: the engine compiles its
    kernels and keeps the prompt's fixed prefix (instructions, demonstrations) in its prefix
    cache now, so the first factoid's answer does not wait for them (docs/answering.md)."""
    messages = build_extract_messages("What is it?", ["It is a warm-up."])
    for _ in gen.stream(messages, max_new_tokens=1, temperature=0.0, top_p=1.0):
        pass


SENTENCE_WORDS = 60  # a factoid's sentence longer than this is cut around its short answer
LEAD_WORDS = 150  # the words of each best sentence the short-answer prompt reads, at most


def around(text: str, start: int, end: int, limit: int = SENTENCE_WORDS) -> str:
    """``text`` cut to about ``limit`` words around the characters ``start:end`` (a list item or
    a code block can be a long "sentence"); ``…`` marks each cut."""
    while start > 0 and not text[start - 1].isspace():  # whole words: "answer," keeps its comma
        start -= 1
    while end < len(text) and not text[end].isspace():
        end += 1
    before, after = text[:start].split(), text[end:].split()
    inside = len(text[start:end].split())
    if len(before) + inside + len(after) <= limit:
        return text
    keep = max(0, limit - inside)
    left = min(len(before), keep // 2)
    right = min(len(after), keep - left)
    left = min(len(before), keep - right)  # what the right side does not use goes left
    words = [*before[len(before) - left :], text[start:end], *after[:right]]
    return " ".join(
        (["…"] if left < len(before) else []) + words + (["…"] if right < len(after) else [])
    )


def add_quotations(answer: Answer, prep: Prepared, n: int) -> str:
    """Quote up to ``n`` of the encoder's best units under ``answer``, written from ``prep``'s
    excerpts (:func:`rag.answer.evidence.quotations`), when the question asks how, why or what
    something does (:func:`rag.answer.evidence.asks_how`; a factoid's answer is its short
    answer, and a quote from another passage would only cite a passage that does not hold it).
    ``answer.quotes``, ``answer.text`` and ``answer.citations`` (a quoted passage not cited yet
    is added) take them; returns the text to stream after the reply, markers included ("" when
    nothing is quoted: a refusal, no excerpts, nothing new)."""
    if n <= 0 or answer.refused or not prep.evidence or not asks_how(prep.question):
        return ""
    found = quotations(prep.evidence, answer.text, n)
    if not found:
        return ""
    answer.quotes = found
    cited = {c.number for c in answer.citations}
    for k in dict.fromkeys(k for k, _ in found):  # two quotes of one excerpt: one citation
        if k not in cited:
            answer.citations.append(citation_for(k, prep.hits))
    answer.text += quotes_block(found, markers=False, citations=answer.citations)
    return quotes_block(found, citations=answer.citations)


# Tokens the decoder may spend on the short answer line of an evidence reply.
SHORT_ANSWER_TOKENS = 24
