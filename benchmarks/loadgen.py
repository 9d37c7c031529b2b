"""What the load benchmarks share: the session loop, the per-request record, the summary
(percentiles, req/s, machine counters) and the latency plot.

Why one module: ``benchmarks.ui_load`` (the chat UI), ``benchmarks.serve_load`` (UI and HTTP API,
batching off vs on) and ``benchmarks.concurrent_load`` (the decoder alone) measure the same
thing at different depths, and their numbers are compared side by side in docs/benchmarks.md;
written three times, their session loops and percentiles had drifted (two p95 definitions).
Here a session is anything with ``ask(j) -> TTFT or None`` (raising on a failed request) and
``close()``; :func:`run_sessions` drives N of them for a bounded time.
"""

from __future__ import annotations

import os
import socket
import statistics
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol


class RequestError(Exception):
    """The server answered, but with an error (the UI's ``Error:`` reply, an API error event)."""


class Session(Protocol):
    def ask(self, j: int) -> float | None:
        """Send this session's ``j``-th request and wait for the whole answer; returns the
        seconds to the first answer text (None when not observable). Raises on failure."""

    def close(self) -> None: ...


@dataclass
class Sample:
    """One finished request: when it started (``perf_counter``), how long it took, its time to
    first token when observed, and why it failed."""

    session: int
    start: float
    latency: float
    ok: bool
    ttft: float | None = None
    error: str = ""


def log(prog: str, msg: str) -> None:
    print(f"[{prog}] {msg}", file=sys.stderr, flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:200]


def warm_up(open_session: Callable[[int], Session], prog: str) -> None:
    """One request before the clock starts, so model loading, the prefix cache, the pipeline
    build and the first connection are not measured. A failure is logged, not raised: the
    sessions then fail too and are counted as errors."""
    session = None
    try:
        session = open_session(0)
        session.ask(0)
    except Exception as e:  # noqa: BLE001
        log(prog, f"  warm-up request failed: {describe(e)}")
    finally:
        if session is not None:
            session.close()


def run_sessions(
    n: int, duration: float, open_session: Callable[[int], Session]
) -> tuple[list[Sample], float]:
    """``n`` sessions, each asking in a loop until ``duration`` seconds have passed; requests in
    flight then finish and are counted. Clients are opened before the clock starts (a Gradio
    client fetches the app's config), so ``duration`` is all load. Returns (samples, wall
    seconds from the start until the last request finished)."""
    samples: list[Sample] = []
    lock = threading.Lock()
    ready, go = threading.Barrier(n + 1), threading.Event()
    deadline = [0.0]

    def record(sample: Sample) -> None:
        with lock:
            samples.append(sample)

    def loop(i: int) -> None:
        try:
            session: Session | None = open_session(i)
        except Exception as e:  # noqa: BLE001 - a client that cannot connect is an error
            session = None
            record(Sample(i, time.perf_counter(), 0.0, False, error=describe(e)))
        ready.wait()
        go.wait()
        if session is None:
            return
        j = 0
        try:
            while time.perf_counter() < deadline[0]:
                t0 = time.perf_counter()
                try:
                    ttft = session.ask(j)
                    record(Sample(i, t0, time.perf_counter() - t0, True, ttft))
                except Exception as e:  # noqa: BLE001 - any failure is a counted error
                    record(Sample(i, t0, time.perf_counter() - t0, False, error=describe(e)))
                j += 1
        finally:
            session.close()

    threads = [threading.Thread(target=loop, args=(i,), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    ready.wait()  # every client is open
    t0 = time.perf_counter()
    deadline[0] = t0 + duration
    go.set()
    for t in threads:
        t.join()
    return samples, time.perf_counter() - t0


def percentile(values: list[float], q: float) -> float | None:
    """The ``q``-th percentile, interpolated (``statistics.quantiles``, inclusive); None when
    there is nothing to rank."""
    if not values:
        return None
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(sorted(values), n=100, method="inclusive")[int(q) - 1]


def summarise(samples: list[Sample], wall: float) -> dict[str, Any]:
    """``requests`` are the answered ones; ``errors`` failed and are not in ``requests``;
    ``throughput_req_s`` is answered requests per second of wall time (the drain included)."""
    ok = [s for s in samples if s.ok]
    lat = [s.latency for s in ok]
    ttft = [s.ttft for s in ok if s.ttft is not None]
    return {
        "requests": len(ok),
        "errors": len(samples) - len(ok),
        "wall_s": wall,
        "throughput_req_s": len(ok) / wall if wall else None,
        "p50_latency_s": percentile(lat, 50),
        "p95_latency_s": percentile(lat, 95),
        "max_latency_s": max(lat) if lat else None,
        "p50_ttft_s": percentile(ttft, 50),
        "error_examples": sorted({s.error for s in samples if not s.ok})[:3],
    }


@contextmanager
def machine_counters() -> Iterator[dict[str, float]]:
    """CPU seconds of this process (server and clients together, all threads) and the 1-minute
    load average before and after, so a run slowed by other jobs says so."""
    out: dict[str, float] = {"load_avg_1m_start": os.getloadavg()[0]}
    cpu0 = time.process_time()
    yield out
    out.update(cpu_s=time.process_time() - cpu0, load_avg_1m_end=os.getloadavg()[0])


def sample_rows(samples: list[Sample]) -> list[dict[str, Any]]:
    """Per-request records for results.json, times relative to the first request."""
    t0 = min((s.start for s in samples), default=0.0)
    return [
        {
            "session": s.session,
            "start_s": round(s.start - t0, 3),
            "latency_s": round(s.latency, 3),
            "ttft_s": None if s.ttft is None else round(s.ttft, 3),
            "ok": s.ok,
            **({"error": s.error} if s.error else {}),
        }
        for s in samples
    ]


def plot(
    series: dict[str, list[Sample]],
    path: Path,
    title: str,
    rates: dict[str, float] | None = None,
) -> None:
    """Latency against request start, one colour per series (errors in red), and answered
    requests per second per series beside it (``rates``, else counted from the samples)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 3.8), width_ratios=(2, 1))
    counted = {}
    for label, samples in series.items():
        if not samples:
            continue
        t0 = min(s.start for s in samples)
        ok = [s for s in samples if s.ok]
        a.scatter([s.start - t0 for s in ok], [s.latency for s in ok], s=8, label=label)
        bad = [s for s in samples if not s.ok]
        if bad:
            a.scatter([s.start - t0 for s in bad], [s.latency for s in bad], s=14, c="red")
        span = max(s.start + s.latency for s in samples) - t0
        counted[label] = len(ok) / span if span > 0 else 0.0
    rates = counted if rates is None else rates
    a.set_xlabel("request start (s)")
    a.set_ylabel("latency (s)")
    a.set_title(title)
    if rates:
        a.legend(fontsize=7)
    b.bar(list(rates), list(rates.values()))
    b.set_ylabel("answered req/s")
    b.tick_params(axis="x", labelrotation=30, labelsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def fmt_num(v: float | None, spec: str) -> str:
    return "–" if v is None else format(v, spec)


def fmt_s(v: float | None) -> str:
    return "–" if v is None else f"{v:.2f} s"
