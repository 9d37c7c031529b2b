"""Load test for the chat UI: N concurrent chat sessions over ``gradio_client`` on loopback.

    python -m benchmarks.ui_load --index docs --sessions 16 --duration 60 --max-new-tokens 16

Each session is its own ``gradio_client.Client`` (its own Gradio session) that asks questions
from a fixed list in a loop, follow-ups included, through the same ``/chat`` endpoint the browser
uses, until ``--duration`` seconds have passed; requests in flight then finish and are counted.
A request is an error when the client raises or the reply is the app's error message. Reports
answered requests, errors, p50/p95 latency, p50 time to first answer text and answered req/s
(``--json`` for machine-readable output), and writes ``results.json`` (with the config) and
``latency.png`` under ``$RAG_HOME/benchmarks/ui_load/``. Exit status 1 when any request failed.

Without ``--url`` the app is started in this process on a free loopback port with the given
index and models (the same ``ui.app.build_app`` as ``python -m ui.app``, its own model loading).
To compare batching off and on, and the UI with the HTTP API, use ``benchmarks.serve_load``.
"""

from __future__ import annotations

import contextlib
import json
import sys
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path
from typing import Any

from benchmarks.clients import Request, UiSession, ui_server
from benchmarks.loadgen import machine_counters, plot, run_sessions, sample_rows, summarise, warm_up
from rag.cli import run_cli
from rag.cli.flags import dataclass_parser
from rag.defaults import MODES
from rag.storage.paths import rag_home

PROG = "benchmarks.ui_load"
SHOWN = ("requests", "errors", "p50_latency_s", "p95_latency_s", "max_latency_s", "p50_ttft_s",
         "throughput_req_s", "wall_s", "out")  # fmt: skip


@dataclass
class LoadConfig:
    """One load-test run; every field is a ``--kebab-case`` flag."""

    url: str | None = None  # a running app; none = start one in this process
    index: str = "docs"  # index for the in-process app and the requests
    encoder: str | None = None  # query encoder (none = the index's own)
    decoder: str = "smollm2"  # decoder for the in-process app and the requests
    mode: str = "hybrid"  # retrieval mode sent with each request
    k: int = 3  # passages per question
    max_new_tokens: int = 16  # answer length per request (small: this measures serving)
    sessions: int = 16  # concurrent chat sessions
    duration: float = 60.0  # seconds during which sessions start new requests
    concurrency: int = 16  # in-process app: Gradio queue concurrency limit (the app's default)
    out: str | None = None  # results folder (default $RAG_HOME/benchmarks/ui_load)


def run(cfg: LoadConfig) -> dict[str, Any]:
    """Run the load test; returns the summary (also written to results.json)."""
    if cfg.sessions < 1 or cfg.duration <= 0:
        raise ValueError(
            f"--sessions must be >= 1 and --duration > 0, not {cfg.sessions}, {cfg.duration}"
        )
    req = Request(
        index=cfg.index, encoder=cfg.encoder, decoder=cfg.decoder, mode=cfg.mode, k=cfg.k,
        max_new_tokens=cfg.max_new_tokens,
    )  # fmt: skip
    req.check_ui()
    with contextlib.ExitStack() as stack:
        url = cfg.url
        if url is None:
            from ui.app import AppConfig

            app_cfg = AppConfig.of(
                index=cfg.index, encoder=cfg.encoder, decoder=cfg.decoder,
                concurrency=cfg.concurrency, queue_size=max(64, 4 * cfg.sessions),
            )  # fmt: skip
            url, demo = stack.enter_context(ui_server(app_cfg))
            req.adapter = demo.chat_app.config.rag.generate.adapter
        open_session = partial(UiSession, url, req)
        warm_up(open_session, PROG)  # in-process: this loads the models
        with machine_counters() as machine:
            samples, wall = run_sessions(cfg.sessions, cfg.duration, open_session)
    summary = {**summarise(samples, wall), **machine}
    out = Path(cfg.out) if cfg.out else rag_home() / "benchmarks" / "ui_load"
    out.mkdir(parents=True, exist_ok=True)
    results = {"config": asdict(cfg), **summary, "samples": sample_rows(samples)}
    (out / "results.json").write_text(json.dumps(results, indent=2))
    if samples:
        plot({"ui": samples}, out / "latency.png", f"ui_load: {cfg.sessions} sessions")
    summary["out"] = str(out)
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = dataclass_parser(f"python -m {PROG}", __doc__, LoadConfig, choices={"mode": MODES})
    parser.add_argument("--json", action="store_true", help="print the summary as JSON on stdout")

    def body(args: Any) -> int:
        as_json = vars(args).pop("json")
        summary = run(LoadConfig(**vars(args)))
        if as_json:
            print(json.dumps(summary))
        else:
            for key in SHOWN:
                value = summary[key]
                print(f"{key:>16}: {round(value, 3) if isinstance(value, float) else value}")
        return 0 if summary["errors"] == 0 else 1

    return run_cli(parser, body, argv, quiet=True)


if __name__ == "__main__":
    sys.exit(main())
