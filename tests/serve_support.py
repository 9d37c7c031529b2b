"""Shared pieces of the ``rag.serve`` tests (test_serve.py, test_serve_errors.py): a scripted
pipeline and retriever, and the app served by uvicorn on a free loopback port.

The pipelines are scripted (no model loads): :class:`ScriptedPipeline` answers "Use open() [1]."
in pieces with one citation and records what it was asked; index ``real`` runs the real
:class:`rag.pipeline.RAGPipeline` over a one-passage retriever and the UI tests' scripted
decoder, so the rewrite hook, citation parsing and the stream protocol are the product's own;
the ``tiny`` indexes run it with a real :class:`rag.generate.generator.Generator` over a tiny
random Llama (tests/generate_support.py, built in a second, nothing downloaded), whose token
counts and stop reasons are the decoder's own.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
from generate_support import build_model, build_tokenizer
from ingest_support import listed_index
from ui_support import ScriptedGenerator, free_port, module_rag_home

from rag.config import RAGConfig
from rag.generate.generator import Generator
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
MAX_BODY = 300_000  # its body limit: room for a question far over max_question_chars
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


TINY = ("tiny", "tiny-batched", "tiny-eos")  # indexes answered by the tiny random decoder


def tiny_generator(cfg: RAGConfig) -> Generator:
    """The real decoder over a tiny random Llama: ``tiny-batched`` with batching on, ``tiny-eos``
    with every token an eos (its answer ends after one token)."""
    tok = build_tokenizer()
    model = build_model("llama", tok)
    if cfg.index == "tiny-eos":
        model.generation_config.eos_token_id = list(range(len(tok)))
    return Generator(model, tok, "cpu", batching=cfg.index == "tiny-batched")


class Server:
    def __init__(self, url: str, built: dict[str, Any]) -> None:
        self.url, self.built = url, built

    def client(self, key: str = KEY, **kw: Any):
        from openai import OpenAI

        return OpenAI(base_url=self.url + "/v1", api_key=key, max_retries=0, timeout=30, **kw)

    def post(
        self, path: str, key: str | None = KEY, headers: dict[str, str] | None = None, **kw: Any
    ) -> httpx.Response:
        sent = {"Authorization": f"Bearer {key}"} if key else {}
        return httpx.post(self.url + path, headers={**sent, **(headers or {})}, timeout=30, **kw)


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
    apart), real and empty (the real RAGPipeline over a one-passage or an empty retriever),
    broken (its factory raises), TINY (the real pipeline and decoder: a tiny random Llama,
    unbatched, batched, or one whose every token is eos), damaged (a real index whose
    ``CURRENT`` names a missing generation) and unpublished (a folder a killed first ingest
    left, only its ``.lock``: not an index); one answer at a time, max_tokens capped at LIMIT.
    Each test module starts its own, module-scoped."""
    with module_rag_home(tmp_path_factory) as home:
        for name in ("docs", "slow", "real", "empty", "broken", *TINY):
            listed_index(home / "indexes" / name)
        (home / "indexes" / "damaged").mkdir(parents=True, exist_ok=True)
        (home / "indexes" / "damaged" / "CURRENT").write_text("gen-000009\n")
        (home / "indexes" / "unpublished").mkdir(parents=True, exist_ok=True)
        (home / "indexes" / "unpublished" / ".lock").touch()
        built: dict[str, Any] = {}

        def factory(cfg: RAGConfig) -> Any:
            if cfg.index == "broken":
                raise RuntimeError("boom: secret internals")
            if cfg.index == "damaged":
                pipe: Any = RAGPipeline(cfg)  # opens the index by name, as rag.serve does
            elif cfg.index in TINY:
                pipe = RAGPipeline(cfg, retriever=FakeRetriever(), generator=tiny_generator(cfg))
            elif cfg.index in ("real", "empty"):
                found = FakeRetriever() if cfg.index == "real" else EmptyRetriever()
                gen = ScriptedGenerator(PIECES, delay=0)
                pipe = RAGPipeline(cfg, retriever=found, generator=gen)
            else:
                slow = cfg.index == "slow"
                pipe = ScriptedPipeline(cfg, delay=0.1 if slow else 0.0, repeat=100 if slow else 1)
            built[cfg.index] = pipe
            return pipe

        options = ServeOptions(
            api_key=KEY, max_tokens_limit=LIMIT, max_body_bytes=MAX_BODY, max_concurrent=1
        )
        app = create_app(RAGConfig.of(index="docs", max_new_tokens=256), factory, options=options)
        with run_server(app) as url:
            yield Server(url, built)


def ask(question: str = "How do I open a file?") -> list[dict[str, str]]:
    return [{"role": "user", "content": question}]


def in_flight(server: Server) -> int:
    return httpx.get(server.url + "/health").json()["in_flight"]
