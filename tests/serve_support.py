"""Shared pieces of the ``rag.serve`` tests (test_serve.py, test_serve_errors.py): a scripted
pipeline and retriever, and the app served by uvicorn on a free loopback port.

The pipelines are scripted (no model loads): :class:`ScriptedPipeline` answers "Use open() [1]."
in pieces with one citation and records what it was asked; index ``real`` runs the real
:class:`rag.pipeline.RAGPipeline` over a one-passage retriever and the UI tests' scripted
decoder, so the rewrite hook, citation parsing and the stream protocol are the product's own.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
from ui_support import ScriptedGenerator, free_port, module_rag_home

from rag.config import RAGConfig
from rag.pipeline import RAGPipeline, normalise_history
from rag.serve.app import ServeOptions, create_app
from rag.types import Answer, Chunk, Citation, Hit

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
REWRITTEN = "how do I close it? (open file Python)"  # rag.answer.rewrite's own docstring example


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


@contextlib.contextmanager
def started_server(tmp_path_factory: Any) -> Iterator[Server]:
    """The test server. Indexes: docs and slow (scripted pipelines; slow yields its pieces 0.1 s
    apart), real and empty (the real RAGPipeline over a one-passage or an empty retriever) and
    broken (its factory raises); one answer at a time, max_tokens capped at LIMIT. Each test
    module starts its own, module-scoped."""
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


def in_flight(server: Server) -> int:
    return httpx.get(server.url + "/health").json()["in_flight"]
