"""The OpenAI wire format of :mod:`rag.serve`: request models, the error shape, and the builders
of completions, stream chunks and embeddings.

Kept apart from the app so the protocol can be read (and checked against the OpenAI reference)
in one place. Requests accept unknown fields: OpenAI clients send parameters this server has no
use for (``user``, ``seed``, ``top_p`` ...), and refusing them would break those clients for
nothing. Parameters this server would otherwise accept and not honour, so that the client gets
another answer than it asked for, are refused instead (:func:`check_chat_request`): ``n`` > 1,
``tools``, a ``stop`` sequence (the answer is not cut at a client's string: its citations and
verification are the whole answer's), a ``response_format`` other than text, ``logprobs``,
a ``tool_choice`` or ``function_call`` other than ``none``, and ``functions``. Their empty or
default values (``stop: null``, ``response_format: {"type": "text"}``, ``logprobs: false``) pass.
An embedding input longer than the encoder reads is refused, not cut silently, its length
counted as ingest counts a chunk's, so a long run without spaces (one unknown token to a
WordPiece encoder) is refused too (:func:`embedding_tokens`).

The extensions to the format, all documented in docs/serving.md:

- top-level ``sources`` on a completion (and on the stream chunk that carries the
  ``finish_reason``): the passages the answer's ``[n]`` markers cite;
- top-level ``rag``: the index generation the passages came from, the retrieval query after
  the follow-up rewrite, the reranker that ordered the passages (null: none), whether the
  answer is the refusal, whether the marker was added by citation completion, dropped marker
  numbers, and what citation verification found (unsupported and re-attributed citations, the
  injection suspicion and its reasons); each ``sources`` entry says whether its passage is
  ``supported``;
- request fields ``k`` and ``mode`` (retrieval depth and mode for this request), and ``rag``
  with ``filter``: a document filter for this request (:mod:`rag.retrieval.filters`);
- ``input_type`` on embedding requests (``document`` or ``query``: the encoder's prompts differ).
"""

from __future__ import annotations

import base64
import json
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from rag.defaults import MODES
from rag.retrieval.filters import FilterError, Where
from rag.retrieval.query import check_query
from rag.types import Answer

MODEL_PREFIX = "rag:"
DONE = "data: [DONE]\n\n"


class ApiError(Exception):
    """A failure answered with ``status`` and the OpenAI error body (never a traceback)."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",  # noqa: A002 - the OpenAI field name
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message = status, message
        self.type, self.param, self.code = type, param, code
        self.headers = headers

    def body(self) -> dict[str, Any]:
        return error_body(self.message, self.type, self.param, self.code)


def error_body(
    message: str,
    type: str,
    param: str | None = None,
    code: str | None = None,  # noqa: A002
) -> dict[str, Any]:
    """``{"error": {"message", "type", "param", "code"}}``: what every OpenAI client parses."""
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


# ---- requests --------------------------------------------------------------------------------


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")

    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: str | list[dict[str, Any]] | None = None


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="allow")

    include_usage: bool = False


class RagOptions(BaseModel):
    """The request extension ``rag``: this server's own options for one question."""

    model_config = ConfigDict(extra="forbid")  # a misspelt option must not pass unnoticed

    # document filter (rag.retrieval.filters): ["path=library/*", "type=pdf"] or
    # {"path": "library/*", "type": ["pdf", "md"]}; None = the server's own (--where)
    filter: list[str] | dict[str, str | list[str]] | None = None


class ChatRequest(BaseModel):
    """``POST /v1/chat/completions``; unknown fields are accepted and ignored."""

    model_config = ConfigDict(extra="allow")

    model: str = Field(min_length=1)
    messages: list[ChatMessage] = Field(min_length=1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0, le=2)
    n: int | None = Field(default=None, ge=1)
    tools: list[Any] | None = None
    # accepted only in their empty or default form (check_chat_request): otherwise refused,
    # never ignored
    stop: Any = None
    response_format: Any = None
    logprobs: Any = None
    top_logprobs: Any = None
    tool_choice: Any = None
    functions: Any = None
    function_call: Any = None
    k: int | None = Field(default=None, ge=1, le=100)  # extension: passages retrieved
    mode: str | None = None  # extension: retrieval mode, one of rag.defaults.MODES
    rag: RagOptions | None = None  # extension: rag.filter


class EmbeddingRequest(BaseModel):
    """``POST /v1/embeddings``; token-id inputs are refused (the index's encoder has its own
    tokenizer, so ids from another one would mean other words)."""

    model_config = ConfigDict(extra="allow")

    model: str = Field(min_length=1)
    input: str | list[str] | list[int] | list[list[int]]
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(default=None, ge=1)
    input_type: Literal["document", "query"] = "document"  # extension


def message_text(message: ChatMessage) -> str:
    """The text of a message: a string, or the text parts of a content list (others refused)."""
    content = message.content
    if content is None or isinstance(content, str):
        return content or ""
    texts = []
    for part in content:
        if part.get("type") != "text":
            raise ApiError(
                400,
                f"only text message content is supported, not {part.get('type')!r}",
                param="messages",
            )
        texts.append(str(part.get("text") or ""))
    return "\n".join(texts)


def split_messages(messages: list[ChatMessage]) -> tuple[str, list[dict[str, str]]]:
    """(question, history): the last message must be the user's question; earlier user and
    assistant turns are the history the follow-up rewrite reads. System messages are ignored:
    the grounded prompt is fixed, so a client's system prompt cannot loosen the grounding."""
    last = messages[-1]
    if last.role != "user":
        raise ApiError(
            400, f"the last message must have role 'user', not {last.role!r}", param="messages"
        )
    question = message_text(last).strip()
    if not question:
        raise ApiError(400, "the last user message is empty", param="messages")
    history = []
    for m in messages[:-1]:
        text = message_text(m).strip()
        if m.role in ("user", "assistant") and text:
            history.append({"role": m.role, "content": text})
    return question, history


def check_text(value: Any, param: str = "") -> None:
    """Refuse a request whose parsed JSON holds a lone surrogate (``"\\ud800"``): JSON allows the
    escape and Python parses it, but it is no text, and the tokenizers and UTF-8 encoders behind
    the pipeline fail on it (a 500, which OpenAI clients retry). ``param`` names the field."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as e:
            where = param or "the request"
            raise ApiError(
                400,
                f"{where} holds a lone surrogate ({ascii(value[e.start])}), which is not text",
                param=param or None,
                code="invalid_value",
            ) from None
    elif isinstance(value, dict):
        for key, item in value.items():
            check_text(key, param)
            check_text(item, f"{param}.{key}" if param else str(key))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            check_text(item, f"{param}.{i}" if param else str(i))


def check_question(question: str, limit: int) -> None:
    """A question over ``limit`` characters is refused (400, OpenAI's code for a string over
    its maximum length), and so is one without a word (:func:`rag.retrieval.query.check_query`),
    before anything is retrieved."""
    if len(question) > limit:
        raise ApiError(
            400,
            f"the question is {len(question)} characters, over this server's limit of {limit}",
            param="messages",
            code="string_above_max_length",
        )
    try:
        check_query(question, "question")
    except ValueError as e:
        raise ApiError(400, str(e), param="messages") from None


def _unsupported(param: str, why: str) -> ApiError:
    return ApiError(400, f"{param} {why}", param=param, code="unsupported_parameter")


def check_chat_request(req: ChatRequest) -> None:
    """Refuse what this server would otherwise quietly answer differently from OpenAI (the
    module docstring): each parameter it cannot honour, unless empty or its default."""
    if req.n is not None and req.n > 1:
        raise ApiError(400, "n > 1 is not supported: one answer per request", param="n")
    if req.tools:
        raise ApiError(400, "tools are not supported by this server", param="tools")
    if req.stop not in (None, "", []):
        raise _unsupported(
            "stop",
            "is not supported: the answer ends where the decoder ends it, with its citations "
            "checked over the whole answer; leave stop out",
        )
    fmt = req.response_format
    if fmt is not None and not (isinstance(fmt, dict) and fmt.get("type") == "text"):
        raise _unsupported(
            "response_format", "is not supported: the answer is text with [n] citations"
        )
    if req.logprobs not in (None, False) or req.top_logprobs not in (None, 0):
        param = "top_logprobs" if req.logprobs in (None, False) else "logprobs"
        raise _unsupported(param, "is not supported by this server")
    for param in ("tool_choice", "function_call"):
        if getattr(req, param) not in (None, "none"):
            raise _unsupported(param, "is not supported: this server calls no tools")
    if req.functions:
        raise _unsupported("functions", "are not supported: this server calls no tools")
    if req.mode is not None and req.mode not in MODES:
        raise ApiError(
            400, f"mode must be one of {', '.join(MODES)}, not {req.mode!r}", param="mode"
        )
    request_filter(req)


def request_filter(req: ChatRequest) -> Where | None:
    """The request's ``rag.filter``, parsed (None: not given, the server's own applies); a
    filter that cannot be read is a 400 naming it."""
    spec = req.rag.filter if req.rag is not None else None
    if spec is None:
        return None
    try:
        return Where.parse(spec)
    except FilterError as e:
        raise ApiError(
            400, f"rag.filter: {e}".replace("--where ", ""), param="rag.filter"
        ) from None


def max_new_tokens(req: ChatRequest, default: int, limit: int) -> int:
    """``max_completion_tokens`` (or the older ``max_tokens``) as the decoder's max_new_tokens;
    over ``limit`` is an error rather than a silent cut, so a client learns the real bound."""
    param = "max_completion_tokens" if req.max_completion_tokens else "max_tokens"
    asked = req.max_completion_tokens or req.max_tokens
    if asked is None:
        return min(default, limit)
    if asked > limit:
        raise ApiError(
            400,
            f"{param} is {asked}, over this server's limit of {limit}",
            param=param,
            code="invalid_value",
        )
    return asked


def embedding_texts(req: EmbeddingRequest, max_inputs: int) -> list[str]:
    texts = [req.input] if isinstance(req.input, str) else list(req.input)
    if not texts:
        raise ApiError(400, "input is empty", param="input")
    if not all(isinstance(t, str) for t in texts):
        raise ApiError(400, "token-id input is not supported: send text", param="input")
    if len(texts) > max_inputs:
        raise ApiError(
            400, f"{len(texts)} inputs, over this server's limit of {max_inputs}", param="input"
        )
    if any(not t.strip() for t in texts):
        raise ApiError(400, "input holds an empty string", param="input")
    return texts


def embedding_tokens(encoder: Any, texts: list[str], kind: str) -> int:
    """The tokens ``encoder`` reads of ``texts`` (with its prompt for ``kind``), for ``usage``.
    An input longer than the encoder reads is refused, a 400 naming it, rather than cut
    silently: one 900 KB input was reported as 180,000 prompt tokens while the encoder read
    256 of them. 0 for an encoder without a tokenizer (nothing to count with).

    The length is counted as ingest counts a chunk's (:data:`rag.documents.chunking.MAX_TOKEN_CHARS`):
    a token that covers more than 32 characters counts as one per 32. A WordPiece encoder
    (minilm) reads a run of more than 100 characters without a space or punctuation as one
    ``[UNK]``, so a 200 KB run was one token, accepted, and embedded as the vector of "unknown"
    (every such input alike). Ingest never embeds such a run whole: it cuts it every 32
    characters, a chunk at most budget x 32 characters. Refusing here, rather than cutting
    the input, keeps one input one vector of what it says: the endpoint takes exactly what
    ingest would embed as one chunk, and a longer run is a 400 naming the input and the run
    (the client splits it, as ingest would), never a meaningless vector. ``usage`` stays the
    tokens the encoder really reads (the ``[UNK]`` is one)."""
    tokenizer = getattr(encoder, "tokenizer", None)
    if tokenizer is None:
        return 0
    from rag.documents.chunking import MAX_TOKEN_CHARS, _backend

    prompt = getattr(encoder, "query_prompt" if kind == "query" else "document_prompt", "")
    prompt = prompt if isinstance(prompt, str) else ""
    encodings = _backend(tokenizer).encode_batch(
        [prompt + t for t in texts], add_special_tokens=False
    )
    limit = getattr(encoder, "max_chunk_tokens", None)
    total = 0
    for i, enc in enumerate(encodings):
        read = len(enc.ids)
        total += read
        if not isinstance(limit, int):
            continue
        runs = [b - a for a, b in enc.offsets if b - a > MAX_TOKEN_CHARS]
        counted = read + sum(-(-n // MAX_TOKEN_CHARS) - 1 for n in runs)  # as ingest counts
        if counted > limit:
            why = (
                f" as ingest counts them, over the {limit} this index's encoder reads: a run of "
                f"{max(runs):,} characters without a space, which the encoder reads as one "
                f"token (ingest cuts such runs every {MAX_TOKEN_CHARS} characters); split it"
                if runs and read <= limit
                else f", over the {limit} this index's encoder reads (it would be cut "
                "silently); split it"
            )
            raise ApiError(
                400,
                f"input {i} is {counted:,} tokens{why}",
                param="input",
                code="context_length_exceeded",
            )
    return total


# ---- responses -------------------------------------------------------------------------------


def sources(answer: Answer) -> list[dict[str, Any]]:
    """The cited passages, one per citation after verification (:mod:`rag.answer.verify`). ``path`` is
    relative to the ingested folder; the absolute path on the server is not sent
    (docs/security.md: never reveal the machine's layout). ``supported`` is False for a citation
    the check flagged."""
    return [
        {
            "number": c.number,
            "path": c.display_path,
            "heading_path": list(c.heading_path),
            **({"page": c.page} if c.page else {}),
            "chunk_id": c.chunk_id,
            "score": float(c.score),
            "text": c.text,
            "supported": c.supported,
        }
        for c in answer.citations
    ]


def answer_span(answer: Answer) -> dict[str, Any] | None:
    """The reader's short answer (:mod:`rag.answer.reader`): its text, the cited passage's
    number and display path, character offsets into that passage (``start``/``end``) and into
    the loaded document (``source_start``/``source_end``), and the reader's margin; None when
    the reader gave none. Like :func:`sources`, the server's absolute path is not sent."""
    span = answer.answer_span
    if span is None:
        return None
    d = span.to_dict()
    del d["source"]
    return d


def rag_info(answer: Answer) -> dict[str, Any]:
    """The ``rag`` extension: the index generation the passages came from (how a client of
    several replicas sees which published index answered), retrieval query, reranker, refusal,
    citation completion, dropped markers and what citation verification found (all empty /
    false when it did not run)."""
    return {
        "generation": answer.generation,
        "query": answer.query,
        "reranker": answer.reranker,
        "refused": answer.refused,
        "citations_completed": answer.citations_completed,
        "invalid_citations": list(answer.invalid_citations),
        "unsupported_citations": list(answer.unsupported_citations),
        "reattributed": [list(pair) for pair in answer.reattributed],
        "suspected_injection": answer.suspected_injection,
        "injection_reasons": list(answer.injection_reasons),
    }


def usage(answer: Answer) -> dict[str, int]:
    """The decoder's token counts, in its tokenizer's tokens (the pipeline's timings): the
    prompt it decoded from and the tokens it decoded. An answer nothing was decoded for (a
    refusal, a reader's extracted sentence) counts 0 and 0 (docs/serving.md, *Usage*)."""
    prompt = int(answer.timings.get("prompt_tokens", 0))
    completion = int(answer.timings.get("new_tokens", 0))
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }


def completion(meta: dict[str, Any], text: str, answer: Answer) -> dict[str, Any]:
    """A ``chat.completion`` object; ``meta`` holds id, created and model. ``finish_reason`` is
    the answer's own: ``length`` when the decoder stopped at max_tokens, else ``stop``."""
    choice = {
        "index": 0,
        "message": {"role": "assistant", "content": text},
        "finish_reason": answer.finish_reason,
        "logprobs": None,
    }
    return {
        **meta,
        "object": "chat.completion",
        "choices": [choice],
        "usage": usage(answer),
        "sources": sources(answer),
        "answer_span": answer_span(answer),
        "rag": rag_info(answer),
    }


def chunk(
    meta: dict[str, Any], delta: dict[str, Any], finish: str | None = None, **extra: Any
) -> dict[str, Any]:
    """A ``chat.completion.chunk`` with one choice (``extra`` adds top-level fields)."""
    choice = {"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}
    return {**meta, "object": "chat.completion.chunk", "choices": [choice], **extra}


def final_chunks(meta: dict[str, Any], answer: Answer, include_usage: bool) -> list[dict[str, Any]]:
    """The chunk with ``finish_reason`` (carrying ``sources`` and ``rag``), then the usage chunk
    when the client asked for it (``stream_options.include_usage``: as OpenAI sends it, one
    last chunk with empty ``choices`` and ``usage``; without it no chunk carries usage)."""
    out = [
        chunk(
            meta,
            {},
            answer.finish_reason,
            sources=sources(answer),
            answer_span=answer_span(answer),
            rag=rag_info(answer),
        )
    ]
    if include_usage:
        out.append(
            {**meta, "object": "chat.completion.chunk", "choices": [], "usage": usage(answer)}
        )
    return out


def sse(obj: dict[str, Any]) -> str:
    """One server-sent event: ``data: <json>`` and a blank line."""
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


def embedding_data(vectors: np.ndarray, encoding_format: str) -> list[dict[str, Any]]:
    """``base64`` is the little-endian float32 bytes (what the openai client decodes by
    default), ``float`` a JSON list."""
    out = []
    for i, vec in enumerate(np.asarray(vectors, dtype=np.float32)):
        if encoding_format == "base64":
            value: Any = base64.b64encode(vec.astype("<f4").tobytes()).decode("ascii")
        else:
            value = [float(x) for x in vec]
        out.append({"object": "embedding", "index": i, "embedding": value})
    return out
