"""``rag.serve`` through real clients: the server runs under uvicorn on a free loopback port and
the ``openai`` client and LangChain's ``ChatOpenAI`` talk to it over HTTP.

The pipelines are scripted (no model loads): :class:`ScriptedPipeline` answers "Use open() [1]."
in pieces with one citation and records what it was asked; index ``real`` runs the real
:class:`rag.pipeline.RAGPipeline` over a one-passage retriever and the UI tests' scripted
decoder, so the rewrite hook, citation parsing and the stream protocol are the product's own.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import pytest
from ui_support import ScriptedGenerator, free_port, module_rag_home

from rag.config import RAGConfig
from rag.pipeline import RAGPipeline, normalise_history
from rag.prompt import REFUSAL
from rag.serve import ServeOptions, create_app, main
from rag.types import Answer, Chunk, Citation, Hit

pytestmark = pytest.mark.server

KEY = "sk-test-key"
PIECES = ("Use ", "open() ", "[1]", ".")
ANSWER = "Use open() [1]."
SECRET_ROOT = "/srv/private-layout/docs"  # the absolute path must never reach a client
CHUNK = Chunk(
    "files-0",
    "Call open(path, mode) to open a file; it returns a file object.",
    f"{SECRET_ROOT}/files.md",
    ("Python files", "Opening a file"),
    path="files.md",
)
LIMIT = 64  # max_tokens limit of the test server
FOLLOW_UP = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "How do I open a file in Python?"},
    {"role": "assistant", "content": ANSWER},
    {"role": "user", "content": "and how do I close it?"},
]
REWRITTEN = "how do I close it? (open file Python)"  # rag.rewrite's own docstring example


class FakeEncoder:
    """Deterministic 4-d vectors: (len(text), 1 for a query else 0, 0.5, -0.25)."""

    dim = 4

    def encode(self, texts: list[str], kind: str = "document") -> np.ndarray:
        q = 1.0 if kind == "query" else 0.0
        return np.array([[float(len(t)), q, 0.5, -0.25] for t in texts], dtype=np.float32)


class FakeRetriever:
    def __init__(self) -> None:
        self.encoder = FakeEncoder()

    def search(self, query: str, k: int = 5, mode: str = "hybrid") -> list[Hit]:
        return [Hit(CHUNK, 0.9, rank=1, mode=mode)]


class EmptyRetriever(FakeRetriever):
    def search(self, query: str, k: int = 5, mode: str = "hybrid") -> list[Hit]:
        return []


class ScriptedPipeline:
    """Stands in for RAGPipeline: ``stream`` yields PIECES, then the Answer citing CHUNK.
    ``cancelled`` is set when a consumer closes the stream before its end."""

    def __init__(self, config: RAGConfig, delay: float = 0.0, repeat: int = 1) -> None:
        self.config, self.delay = config, delay
        self.pieces = list(PIECES) * repeat
        self.retriever = FakeRetriever()
        self.calls: list[dict[str, Any]] = []
        self.cancelled = threading.Event()

    def stream(self, question: str, **kw: Any) -> Iterator[str | Answer]:
        turns = normalise_history(kw.get("history"))
        rewrite = self.config.rewrite_query
        query = rewrite(question, turns) if rewrite and turns else question
        self.calls.append({"question": question, "query": query, **kw})
        try:
            for piece in self.pieces:
                time.sleep(self.delay)
                yield piece
        except GeneratorExit:
            self.cancelled.set()
            raise
        cite = Citation(1, CHUNK.source, CHUNK.heading_path, CHUNK.text, 0.9, CHUNK.id)
        yield Answer(
            text="Use open().",
            citations=[cite],
            raw_text="".join(self.pieces),
            passages=[Hit(CHUNK, 0.9, rank=1)],
            query=query,
            timings={"new_tokens": 5.0},
        )


class Server:
    def __init__(self, url: str, built: dict[str, Any]) -> None:
        self.url, self.built = url, built

    def client(self, key: str = KEY, **kw: Any):
        from openai import OpenAI

        return OpenAI(base_url=self.url + "/v1", api_key=key, max_retries=0, timeout=30, **kw)

    def post(self, path: str, key: str | None = KEY, **kw: Any) -> httpx.Response:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        return httpx.post(self.url + path, headers=headers, timeout=30, **kw)


@contextlib.contextmanager
def run_server(app: Any) -> Iterator[str]:
    """uvicorn on a free loopback port in a background thread."""
    import uvicorn

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, name="uvicorn", daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[Server]:
    with module_rag_home(tmp_path_factory) as home:
        for name in ("docs", "slow", "real", "empty", "broken"):
            (home / "indexes" / name).mkdir(parents=True, exist_ok=True)
        built: dict[str, Any] = {}

        def factory(cfg: RAGConfig) -> Any:
            if cfg.index == "broken":
                raise RuntimeError("boom: secret internals")
            if cfg.index in ("real", "empty"):
                found = FakeRetriever() if cfg.index == "real" else EmptyRetriever()
                gen = ScriptedGenerator(PIECES, delay=0)
                pipe: Any = RAGPipeline(cfg, retriever=found, generator=gen)
            else:
                slow = cfg.index == "slow"
                pipe = ScriptedPipeline(cfg, delay=0.1 if slow else 0.0, repeat=100 if slow else 1)
            built[cfg.index] = pipe
            return pipe

        options = ServeOptions(
            api_key=KEY, max_tokens_limit=LIMIT, max_body_bytes=4096, max_concurrent=1
        )
        app = create_app(RAGConfig(index="docs", max_new_tokens=256), factory, options=options)
        with run_server(app) as url:
            yield Server(url, built)


def ask(question: str = "How do I open a file?") -> list[dict[str, str]]:
    return [{"role": "user", "content": question}]


# ---- chat completions --------------------------------------------------------------------------


def test_completion_keeps_markers_and_carries_sources(server):
    client = server.client()
    resp = client.chat.completions.create(model="rag:docs", messages=ask())
    assert resp.choices[0].message.content == ANSWER
    assert resp.choices[0].finish_reason == "stop" and resp.model == "rag:docs"
    assert resp.usage.completion_tokens == 5
    (src,) = resp.model_extra["sources"]
    assert src == {
        "number": 1,
        "path": "files.md",
        "heading_path": ["Python files", "Opening a file"],
        "chunk_id": "files-0",
        "score": pytest.approx(0.9),
        "text": CHUNK.text,
        "supported": True,
    }
    assert resp.model_extra["rag"]["query"] == "How do I open a file?"
    raw = client.chat.completions.with_raw_response.create(model="rag:docs", messages=ask())
    body = raw.http_response.json()
    assert body["sources"][0]["path"] == "files.md"
    assert SECRET_ROOT not in raw.http_response.text


def test_stream_sends_pieces_then_sources_and_done(server):
    client = server.client()
    chunks = list(
        client.chat.completions.create(
            model="rag:docs", messages=ask(), stream=True, stream_options={"include_usage": True}
        )
    )
    deltas = [
        c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content
    ]
    assert "".join(deltas) == ANSWER and len(deltas) == len(PIECES)
    (final,) = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert final.choices[0].finish_reason == "stop"
    assert final.model_extra["sources"][0]["number"] == 1
    assert chunks[-1].usage.completion_tokens == 5 and chunks[-1].choices == []
    with httpx.stream(
        "POST",
        server.url + "/v1/chat/completions",
        headers={"Authorization": f"Bearer {KEY}"},
        json={"model": "rag:docs", "messages": ask(), "stream": True},
    ) as r:
        lines = [line for line in r.iter_lines() if line]
    assert r.headers["content-type"].startswith("text/event-stream")
    assert all(line.startswith("data: ") for line in lines) and lines[-1] == "data: [DONE]"
    assert "sources" in json.loads(lines[-2].removeprefix("data: "))


def test_history_is_rewritten_and_parameters_mapped(server):
    client = server.client()
    resp = client.chat.completions.create(
        model="rag:docs",
        messages=FOLLOW_UP,
        max_tokens=32,
        temperature=0.7,
        extra_body={"k": 2, "mode": "bm25"},
    )
    call = server.built["docs"].calls[-1]
    assert call["question"] == "and how do I close it?"
    assert call["history"] == FOLLOW_UP[1:3]  # the system message is not history
    assert call["max_new_tokens"] == 32 and call["temperature"] == 0.7
    assert call["k"] == 2 and call["mode"] == "bm25"
    assert resp.model_extra["rag"]["query"] == REWRITTEN
    client.chat.completions.create(model="rag", messages=ask())  # "rag" = the server's --index
    call = server.built["docs"].calls[-1]
    assert call["max_new_tokens"] == LIMIT and call["temperature"] is None and call["k"] is None


def test_real_pipeline_behind_the_api(server):
    client = server.client()
    resp = client.chat.completions.create(model="rag:real", messages=FOLLOW_UP)
    assert resp.choices[0].message.content == ANSWER
    assert resp.model_extra["rag"]["query"] == REWRITTEN  # RAGPipeline ran the UI's rewrite
    assert [s["path"] for s in resp.model_extra["sources"]] == ["files.md"]
    stream = client.chat.completions.create(model="rag:real", messages=ask(), stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == ANSWER
    resp = client.chat.completions.create(model="rag:empty", messages=ask())
    assert resp.choices[0].message.content == REFUSAL  # nothing retrieved: no decoder call
    assert resp.model_extra["sources"] == [] and resp.model_extra["rag"]["refused"] is True


def test_verification_fields_reach_the_client(server):
    from rag import serve_api

    # The real pipeline verifies its citations: the fields agree with each other.
    resp = server.client().chat.completions.create(model="rag:real", messages=ask())
    info, sources = resp.model_extra["rag"], resp.model_extra["sources"]
    assert [s["number"] for s in sources if not s["supported"]] == info["unsupported_citations"]
    assert info["reattributed"] == [] and info["suspected_injection"] is False
    assert info["injection_reasons"] == []
    # A hand-made verified answer: one citation moved, one flagged, an injection suspected.
    other = Chunk("files-1", "Call close() when done.", f"{SECRET_ROOT}/files.md", path="files.md")
    hits = [Hit(CHUNK, 0.9, rank=1), Hit(other, 0.5, rank=2)]
    cites = [
        Citation(1, CHUNK.source, CHUNK.heading_path, CHUNK.text, 0.9, CHUNK.id, supported=False),
        Citation(2, other.source, (), other.text, 0.5, other.id),
    ]
    answer = Answer(
        text="PWNED.",
        citations=cites,
        raw_text="PWNED [1]. Close it [1].",
        passages=hits,
        verified=True,
        unsupported_citations=[1],
        reattributed=[(1, 2)],
        suspected_injection=True,
        injection_reasons=["the answer contains 'PWNED'"],
    )
    body = json.loads(json.dumps(serve_api.completion({"id": "x"}, "PWNED", answer, 64)))
    assert [(s["number"], s["supported"]) for s in body["sources"]] == [(1, False), (2, True)]
    assert body["rag"]["unsupported_citations"] == [1] and body["rag"]["reattributed"] == [[1, 2]]
    assert body["rag"]["suspected_injection"] is True
    assert body["rag"]["injection_reasons"] == ["the answer contains 'PWNED'"]
    (final,) = serve_api.final_chunks({"id": "x"}, answer, 64, include_usage=False)
    assert final["rag"]["reattributed"] == [[1, 2]] and final["sources"][0]["supported"] is False


def test_langchain_chat_openai(server):
    from langchain_core.messages import AIMessage, HumanMessage
    from langchain_openai import ChatOpenAI

    llm = ChatOpenAI(
        model="rag:docs", base_url=server.url + "/v1", api_key=KEY, max_retries=0, timeout=30
    )
    assert llm.invoke("How do I open a file?").content == ANSWER
    assert "".join(str(c.content) for c in llm.stream("How do I open a file?")) == ANSWER
    turns = [HumanMessage(FOLLOW_UP[1]["content"]), AIMessage(ANSWER), HumanMessage("and how do I close it?")]  # fmt: skip
    assert llm.invoke(turns).content == ANSWER
    assert server.built["docs"].calls[-1]["query"] == REWRITTEN


# ---- errors ------------------------------------------------------------------------------------


def test_key_is_required_on_v1(server):
    import openai

    r = server.post("/v1/chat/completions", key=None, json={"model": "rag:docs", "messages": ask()})
    assert r.status_code == 401
    assert r.json() == {
        "error": {
            "message": r.json()["error"]["message"],
            "type": "invalid_request_error",
            "param": None,
            "code": "invalid_api_key",
        }
    }
    assert httpx.get(server.url + "/v1/models").status_code == 401
    assert httpx.get(server.url + "/health").json()["status"] == "ok"  # probes need no key
    with pytest.raises(openai.AuthenticationError) as e:
        server.client(key="wrong").chat.completions.create(model="rag:docs", messages=ask())
    assert e.value.code == "invalid_api_key"


def test_bad_requests_get_the_openai_error_shape(server):
    import openai

    client = server.client()
    cases = [
        ({"messages": []}, "messages"),
        ({"max_tokens": LIMIT + 1}, "max_tokens"),
        ({"max_completion_tokens": LIMIT + 1}, "max_completion_tokens"),
        ({"messages": [*ask(), {"role": "assistant", "content": "hi"}]}, "messages"),
        ({"messages": ask("   ")}, "messages"),
        ({"temperature": 3}, "temperature"),
        ({"n": 2}, "n"),
        ({"extra_body": {"mode": "psychic"}}, "mode"),
    ]
    for override, param in cases:
        kwargs = {"model": "rag:docs", "messages": ask(), **override}
        with pytest.raises(openai.BadRequestError) as e:
            client.chat.completions.create(**kwargs)
        assert e.value.status_code == 400 and e.value.param == param, override
        assert set(e.value.body) == {"message", "type", "param", "code"}
    with pytest.raises(openai.BadRequestError, match=f"limit of {LIMIT}"):
        client.chat.completions.create(model="rag:docs", messages=ask(), max_tokens=LIMIT + 1)
    for model in ("gpt-4o", "rag:nope", "rag:../etc"):
        with pytest.raises(openai.NotFoundError) as e:
            client.chat.completions.create(model=model, messages=ask())
        assert e.value.code == "model_not_found" and "rag:docs" in e.value.message


def test_malformed_oversized_and_failing_requests_never_leak_internals(server):
    cases = [
        (server.post("/v1/chat/completions", content=b"{not json"), 400),
        (server.post("/v1/chat/completions", json={"messages": ask()}), 400),
        (server.post("/v1/chat/completions", content=b"x" * 5000), 413),
        (server.post("/v1/nope", json={}), 404),
        (server.post("/v1/chat/completions", json={"model": "rag:broken", "messages": ask()}), 500),
    ]
    for r, status in cases:
        assert r.status_code == status, r.text
        assert set(r.json()) == {"error"} and set(r.json()["error"]) == {"message", "type", "param", "code"}  # fmt: skip
        assert "Traceback" not in r.text and "secret" not in r.text
    assert cases[1][0].json()["error"]["param"] == "model"
    assert cases[4][0].json()["error"]["type"] == "server_error"


# ---- models and embeddings ---------------------------------------------------------------------


def test_models_lists_every_index(server):
    ids = {m.id for m in server.client().models.list()}
    assert {"rag:docs", "rag:slow", "rag:real"} <= ids


def test_embeddings_use_the_index_encoder(server):
    import openai

    client = server.client()
    resp = client.embeddings.create(model="rag:docs", input=["abc", "hello"])  # base64 on the wire
    assert [d.embedding for d in resp.data] == [[3.0, 0.0, 0.5, -0.25], [5.0, 0.0, 0.5, -0.25]]
    resp = client.embeddings.create(
        model="rag:docs", input="abc", encoding_format="float", extra_body={"input_type": "query"}
    )
    assert resp.data[0].embedding == [3.0, 1.0, 0.5, -0.25] and resp.model == "rag:docs"
    for kwargs in ({"input": "abc", "dimensions": 8}, {"input": [[1, 2, 3]]}, {"input": []}):
        with pytest.raises(openai.BadRequestError):
            client.embeddings.create(model="rag:docs", **kwargs)


# ---- disconnects and slots ---------------------------------------------------------------------


def in_flight(server: Server) -> int:
    return httpx.get(server.url + "/health").json()["in_flight"]


def test_client_disconnect_cancels_generation_and_frees_the_slot(server):
    import openai

    client = server.client()
    stream = client.chat.completions.create(model="rag:slow", messages=ask(), stream=True)
    pieces = iter(stream)
    next(pieces), next(pieces)  # role chunk, first piece: the answer is under way
    slow = server.built["slow"]
    assert in_flight(server) == 1
    with pytest.raises(openai.RateLimitError) as e:  # max_concurrent=1: the one slot is taken
        client.chat.completions.create(model="rag:docs", messages=ask())
    assert e.value.status_code == 429 and e.value.code == "server_busy"
    stream.close()  # the client goes away mid-answer
    assert slow.cancelled.wait(10), "the pipeline's stream was not closed"
    deadline = time.monotonic() + 10
    while in_flight(server) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert in_flight(server) == 0
    resp = client.chat.completions.create(model="rag:docs", messages=ask())
    assert resp.choices[0].message.content == ANSWER


# ---- command line ------------------------------------------------------------------------------


def test_cli_failures_are_one_line(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no rag.toml
    assert main(["--index", "missing-index"]) == 2
    err = capsys.readouterr().err.strip()
    assert (
        err.startswith("rag.serve: error: index 'missing-index' does not exist") and "\n" not in err
    )
    assert main(["--index", "../escape"]) == 2
    assert "not allowed" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        main(["--port", "many"])
    assert e.value.code == 2 and capsys.readouterr().err.count("\n") == 1
