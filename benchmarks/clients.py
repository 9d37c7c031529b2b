"""The two front ends under load, each as a client session and an in-process server: the chat
UI through ``gradio_client`` (the ``/chat`` endpoint the browser uses) and the HTTP API through
the ``openai`` client (``POST /v1/chat/completions``, streamed).

Why real clients rather than calling the pipeline: the point of these benchmarks is what a user
of either front end waits for, queueing, rewriting, retrieval, streaming and HTTP included. Both
sessions ask :data:`QUESTIONS` in turn (or a list of distinct questions, ``Request.questions``), keep the last two turns as history (so follow-ups go
through the rewrite, as in a real chat) and time the first answer text (TTFT).
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, redirect_stdout
from dataclasses import dataclass
from typing import Any

from benchmarks.loadgen import RequestError, free_port

QUESTIONS = [
    "How do I start the chat UI?",
    "and how is it tested?",
    "What does the retrieval mode setting do?",
    "How are uploads checked?",
    "What happens to a follow-up question?",
    "Which models are the baselines?",
]
UI_POLL_S = 0.05  # how often a UI session looks for streamed text: the TTFT resolution
PLACEHOLDER = "…"  # what the UI shows before the first answer text
INDEX_DEFAULT_ENCODER, NO_ADAPTER = "(index default)", "(none)"  # the UI's dropdown values
TIMEOUT_S = 900.0  # per request: serialised decoding under 16 sessions takes minutes, not hours


@dataclass
class Request:
    """What every request asks for (the same through the UI and the API)."""

    index: str = "docs"
    encoder: str | None = None  # None = the index's own
    decoder: str = "smollm2"  # UI only: the API answers with the server's decoder
    adapter: str | None = None  # UI only, resolved (an artefact name or None)
    mode: str = "hybrid"  # retrieval mode
    k: int = 3
    max_new_tokens: int = 32
    # distinct questions asked in turn across all sessions (request j of session s asks number
    # j * sessions + s), so no two requests repeat one until the list runs out; empty = the
    # built-in QUESTIONS, each session cycling them from its own start (follow-ups included)
    questions: tuple[str, ...] = ()
    sessions: int = 1  # how many sessions share ``questions``

    def check_ui(self) -> None:
        """Refuse what the UI's sliders would refuse on every request (ValueError: exit 2)."""
        from ui.app import K_RANGE, MAX_NEW_TOKENS_RANGE

        for name, (lo, hi) in (("k", K_RANGE), ("max_new_tokens", MAX_NEW_TOKENS_RANGE)):
            if not lo <= getattr(self, name) <= hi:
                flag = "--" + name.replace("_", "-")
                raise ValueError(f"{flag} must be in {lo}-{hi} for the UI (its slider's range)")

    def question(self, session: int, j: int) -> str:
        if self.questions:
            return self.questions[(j * self.sessions + session) % len(self.questions)]
        return QUESTIONS[(session + j) % len(QUESTIONS)]  # sessions start at different ones


def reply_text(chat: list[dict] | None) -> str:
    """The text of the last chat message (a string or Gradio's list of typed parts)."""
    content = chat[-1].get("content", "") if chat else ""
    if isinstance(content, list):
        return " ".join(p.get("text", "") for p in content if isinstance(p, dict))
    return str(content or "")


class UiSession:
    """One Gradio session (its own ``gradio_client.Client``) asking through ``/chat``."""

    def __init__(self, url: str, req: Request, session: int) -> None:
        from gradio_client import Client

        self.client = Client(url, verbose=False)
        self.req, self.session = req, session
        self.history: list[dict] = []

    def ask(self, j: int) -> float | None:
        r = self.req
        t0 = time.perf_counter()
        job = self.client.submit(
            r.question(self.session, j), self.history, r.index,
            r.encoder or INDEX_DEFAULT_ENCODER, r.decoder, r.adapter or NO_ADAPTER, r.mode, r.k,
            0.0, r.max_new_tokens, api_name="/chat",
        )  # fmt: skip
        ttft = None
        # the job streams each yield of the handler into outputs(); past TIMEOUT_S, result()
        # raises TimeoutError and the request counts as an error
        while not job.done() and time.perf_counter() - t0 < TIMEOUT_S:
            if ttft is None and self._answering(job.outputs()):
                ttft = time.perf_counter() - t0
            time.sleep(UI_POLL_S)
        try:
            chat, *_ = job.result(timeout=UI_POLL_S)
        except Exception:
            self.history = []
            raise
        text = reply_text(chat)
        if text.startswith("**Error:**"):
            self.history = []
            raise RequestError(text[:200])
        self.history = chat[-4:]  # the last two turns: follow-ups get rewritten
        return ttft if ttft is not None else time.perf_counter() - t0

    @staticmethod
    def _answering(outputs: list[Any]) -> bool:
        if not outputs or not isinstance(outputs[-1], list | tuple):
            return False
        text = reply_text(outputs[-1][0]).strip()
        return bool(text) and text != PLACEHOLDER

    def close(self) -> None:
        self.client.close()


class ApiSession:
    """One ``openai`` client streaming chat completions from ``rag:<index>``."""

    def __init__(self, url: str, req: Request, session: int) -> None:
        from openai import OpenAI

        # max_retries=0: a refused or failed request is an error to count, not to hide
        self.client = OpenAI(
            base_url=url.rstrip("/") + "/v1", api_key="benchmark", max_retries=0, timeout=TIMEOUT_S
        )
        self.req, self.session = req, session
        self.history: list[dict[str, str]] = []

    def ask(self, j: int) -> float | None:
        r = self.req
        question = r.question(self.session, j)
        messages = [*self.history, {"role": "user", "content": question}]
        t0 = time.perf_counter()
        ttft, parts, finish = None, [], None
        try:
            stream = self.client.chat.completions.create(
                model=f"rag:{r.index}",
                messages=messages,  # type: ignore[arg-type]
                stream=True,
                max_tokens=r.max_new_tokens,
                temperature=0.0,
                extra_body={"k": r.k, "mode": r.mode},
            )
            with stream:  # an error event in the stream raises openai.APIError here
                for chunk in stream:
                    for choice in chunk.choices:
                        if choice.delta and choice.delta.content:
                            ttft = ttft if ttft is not None else time.perf_counter() - t0
                            parts.append(choice.delta.content)
                        finish = choice.finish_reason or finish
        except Exception:
            self.history = []
            raise
        if finish is None:
            self.history = []
            raise RequestError("the stream ended without a finish_reason")
        self.history = [*messages, {"role": "assistant", "content": "".join(parts)}][-4:]
        return ttft

    def close(self) -> None:
        self.client.close()


@contextmanager
def ui_server(
    app_config: Any, factory: Callable[[Any], Any] | None = None
) -> Iterator[tuple[str, Any]]:
    """``ui.app`` (``build_app`` + ``launch``, as ``python -m ui.app``) on a free loopback port
    in this process; yields (url, demo) and closes the app on the way out."""
    from dataclasses import replace

    from ui.app import build_app, launch

    app_config = replace(app_config, host="127.0.0.1", port=free_port())
    demo = build_app(app_config, pipeline_factory=factory)
    launch(demo, app_config, prevent_thread_lock=True, quiet=True)
    try:
        yield f"http://127.0.0.1:{app_config.port}/", demo
    finally:
        with redirect_stdout(sys.stderr):  # Gradio prints "Closing server": stdout is the report
            demo.close()


@contextmanager
def api_server(
    config: Any, factory: Callable[[Any], Any] | None, options: Any
) -> Iterator[tuple[str, Any]]:
    """``rag.serve.app.create_app`` under uvicorn on a free loopback port, in a thread of this
    process; yields (url, app) and shuts uvicorn down (gracefully) on the way out."""
    from dataclasses import replace

    import uvicorn

    from rag.serve.app import create_app

    options = replace(options, host="127.0.0.1", port=free_port())
    app = create_app(config, factory, options=options)
    server = uvicorn.Server(
        uvicorn.Config(app, host=options.host, port=options.port, log_level="warning")
    )
    thread = threading.Thread(target=server.run, name="uvicorn", daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            server.should_exit = True
            raise RuntimeError(f"the API server did not start on port {options.port}")
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{options.port}", app
    finally:
        server.should_exit = True
        thread.join(30)
