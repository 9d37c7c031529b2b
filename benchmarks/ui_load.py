"""Load test for the chat UI: N concurrent chat sessions over ``gradio_client`` on loopback.

    python -m benchmarks.ui_load --index docs --sessions 16 --duration 60 --max-new-tokens 16

Each session is its own ``gradio_client.Client`` (its own Gradio session) that asks questions
from a fixed list in a loop, follow-ups included, through the same ``/chat`` endpoint the browser
uses, until ``--duration`` seconds have passed; requests in flight then finish and are counted.
A request is an error when the client raises or the reply is the app's error message. Reports
requests, errors, p50/p95 latency and throughput (``--json`` for machine-readable output), and
writes ``results.json`` (with the config) and ``latency.png`` under
``$RAG_HOME/benchmarks/ui_load/``.

Without ``--url`` the app is started in this process on a free loopback port with the given
index and models (the same ``ui.app.build_app`` as ``python -m ui.app``).
"""

from __future__ import annotations

import argparse
import json
import logging
import socket
import statistics
import sys
import threading
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from rag.paths import rag_home

log = logging.getLogger("benchmarks.ui_load")

QUESTIONS = [
    "How do I start the chat UI?",
    "and how is it tested?",
    "What does the retrieval mode setting do?",
    "How are uploads checked?",
    "What happens to a follow-up question?",
    "Which models are the baselines?",
]


@dataclass
class LoadConfig:
    """One load-test run."""

    url: str | None = None  # a running app; None = start one in this process
    index: str = "docs"  # index for the in-process app and the requests
    encoder: str | None = None  # query encoder (None = the index's own)
    decoder: str = "smollm2"  # decoder for the in-process app and the requests
    mode: str = "hybrid"  # retrieval mode sent with each request
    k: int = 3  # passages per question
    max_new_tokens: int = 16  # answer length per request (small: this measures serving)
    sessions: int = 16  # concurrent chat sessions
    duration: float = 60.0  # seconds during which sessions start new requests
    concurrency: int = 4  # in-process app: Gradio queue concurrency limit
    out: str | None = None  # results folder (default $RAG_HOME/benchmarks/ui_load)


@dataclass
class Sample:
    session: int
    start: float
    latency: float
    ok: bool
    error: str = ""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_app(cfg: LoadConfig) -> tuple[Any, str]:
    """Start ``ui.app`` in this process on a free loopback port; returns (demo, url)."""
    from ui.app import AppConfig, build_app, launch, warm_up

    app_cfg = AppConfig.of(
        index=cfg.index,
        encoder=cfg.encoder,
        decoder=cfg.decoder,
        port=free_port(),
        concurrency=cfg.concurrency,
    )
    demo = build_app(app_cfg)
    warm_up(demo.chat_app, app_cfg)
    launch(demo, app_cfg, prevent_thread_lock=True, quiet=True)
    return demo, f"http://127.0.0.1:{app_cfg.port}/"


def reply_text(chat: list[dict]) -> str:
    content = chat[-1]["content"] if chat else ""
    if isinstance(content, list):
        return " ".join(p.get("text", "") for p in content if isinstance(p, dict))
    return str(content)


def run_session(i: int, cfg: LoadConfig, url: str, deadline: float, out: list[Sample]) -> None:
    from gradio_client import Client

    client = Client(url, verbose=False)
    history: list[dict] = []
    n = i  # sessions start at different questions
    while time.perf_counter() < deadline:
        question = QUESTIONS[n % len(QUESTIONS)]
        n += 1
        t0 = time.perf_counter()
        try:
            chat, *_ = client.predict(
                question, history, cfg.index, cfg.encoder or "(index default)", cfg.decoder,
                "(none)", cfg.mode, cfg.k, 0.0, cfg.max_new_tokens, api_name="/chat",
            )  # fmt: skip
            text = reply_text(chat)
            ok = not text.startswith("**Error:**")
            out.append(Sample(i, t0, time.perf_counter() - t0, ok, "" if ok else text[:200]))
            history = chat[-4:]  # keep the last two turns: follow-ups get rewritten
        except Exception as e:  # noqa: BLE001 - any failure is a counted error
            out.append(
                Sample(i, t0, time.perf_counter() - t0, False, f"{type(e).__name__}: {e}"[:200])
            )
            history = []


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[int(q) - 1]


def summarise(samples: list[Sample], wall: float) -> dict[str, Any]:
    lat = sorted(s.latency for s in samples if s.ok)
    return {
        "requests": len(samples),
        "errors": sum(not s.ok for s in samples),
        "p50_s": round(percentile(lat, 50), 3),
        "p95_s": round(percentile(lat, 95), 3),
        "max_s": round(max(lat), 3) if lat else None,
        "throughput_rps": round(len(samples) / wall, 3) if wall else None,
        "wall_s": round(wall, 1),
        "first_errors": [s.error for s in samples if not s.ok][:5],
    }


def plot(samples: list[Sample], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t0 = min(s.start for s in samples)
    fig, ax = plt.subplots(figsize=(7, 3.5))
    ok = [s for s in samples if s.ok]
    bad = [s for s in samples if not s.ok]
    ax.scatter([s.start - t0 for s in ok], [s.latency for s in ok], s=8, label="ok")
    if bad:
        ax.scatter(
            [s.start - t0 for s in bad], [s.latency for s in bad], s=12, c="red", label="error"
        )
    ax.set_xlabel("request start (s)")
    ax.set_ylabel("latency (s)")
    ax.set_title(f"ui_load: {len({s.session for s in samples})} sessions")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def run(cfg: LoadConfig) -> dict[str, Any]:
    """Run the load test; returns the summary (also written to results.json)."""
    demo = None
    url = cfg.url
    if url is None:
        demo, url = start_app(cfg)
    samples: list[Sample] = []
    try:
        t0 = time.perf_counter()
        deadline = t0 + cfg.duration
        threads = [
            threading.Thread(target=run_session, args=(i, cfg, url, deadline, samples), daemon=True)
            for i in range(cfg.sessions)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall = time.perf_counter() - t0
    finally:
        if demo is not None:
            demo.close()
    summary = summarise(samples, wall)
    out = Path(cfg.out) if cfg.out else rag_home() / "benchmarks" / "ui_load"
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps({"config": asdict(cfg), **summary}, indent=2))
    if samples:
        plot(samples, out / "latency.png")
    summary["out"] = str(out)
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.ui_load", description=__doc__.split("\n")[0]
    )
    for f in fields(LoadConfig):
        default = f.default
        conv = {int: int, float: float}.get(type(default), str)
        parser.add_argument(
            "--" + f.name.replace("_", "-"), dest=f.name, type=conv, default=default
        )
    parser.add_argument("--json", action="store_true", help="print the summary as JSON on stdout")
    args = vars(parser.parse_args(argv))
    as_json = args.pop("json")
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    cfg = LoadConfig(**args)
    if cfg.sessions < 1 or cfg.duration <= 0:
        print(
            f"error: --sessions must be >= 1 and --duration > 0 (got {cfg.sessions}, {cfg.duration})",
            file=sys.stderr,
        )
        return 2
    try:
        summary = run(cfg)
    except Exception as e:  # noqa: BLE001
        print(f"error: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    if as_json:
        print(json.dumps(summary))
    else:
        for key in (
            "requests",
            "errors",
            "p50_s",
            "p95_s",
            "max_s",
            "throughput_rps",
            "wall_s",
            "out",
        ):
            print(f"{key:>15}: {summary[key]}")
    return 0 if summary["errors"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
