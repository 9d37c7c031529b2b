"""Several ``rag.serve`` replicas of one index, loaded by client threads while another process
re-ingests it: the pieces shared by ``benchmarks.replicas_load`` (real models, a command you
run) and ``tests/test_replicas.py`` (tiny models, bounded, in the test suite), so the test
checks the code the benchmark measures with.

A replica is a ``python -m rag.serve`` process; replicas of one index share ``$RAG_HOME`` (the
index folder: ``CURRENT``, the generations' manifests, chunks and BM25) and the Chroma server
the manifest names (the vectors). Every answer says which generation its passages came from
(``rag.generation`` in the response, docs/serving.md), which is what lets a client check that
no answer mixed two generations and see when each replica switched.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx

from benchmarks.loadgen import free_port

REPO = Path(__file__).resolve().parents[1]
PROBE_NAME = "replica-probe.md"  # the file the re-ingest adds
PROBE_TEXT = (
    "# Quokka sundial\n\nThe quokka sundial measures noon by the shadow of a bronze quokka.\n"
)
PROBE_QUESTION = "What does the quokka sundial measure?"
CHANGE_TEXT = "\n\nAppended by the replica load test: a paragraph about pelicans.\n"


def child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """This process's environment with this checkout first on the import path, so a replica
    or an ingest runs the same code as its parent whatever is installed."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", **(extra or {})}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH", "")]))
    return env


@dataclass
class Replica:
    """One ``python -m rag.serve`` process and where it answers."""

    url: str
    proc: subprocess.Popen
    log: Path

    def tail(self, chars: int = 3000) -> str:
        try:
            return self.log.read_text(errors="replace")[-chars:]
        except OSError:
            return ""


def start_replica(
    index: str, args: list[str], log_dir: Path, number: int, env: dict[str, str] | None = None
) -> Replica:
    """Start a replica of ``index`` on a free loopback port (``args``: more rag.serve flags)."""
    port = free_port()
    log = log_dir / f"replica-{number}.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "rag.serve", "--index", index, "--port", str(port), *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=child_env(env),
            cwd=REPO,
        )
    return Replica(f"http://127.0.0.1:{port}", proc, log)


def wait_ready(replicas: list[Replica], timeout: float) -> None:
    """Wait until every replica's ``/health`` answers (they preload their models first)."""
    deadline = time.monotonic() + timeout
    for r in replicas:
        while True:
            try:
                if httpx.get(r.url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if r.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"replica {r.url} did not start:\n{r.tail()}")
            time.sleep(0.2)


def stop_replicas(replicas: list[Replica]) -> None:
    for r in replicas:
        if r.proc.poll() is None:
            r.proc.terminate()
    for r in replicas:
        try:
            r.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            r.proc.kill()


@dataclass
class Record:
    """One request: when it was sent (``time.time()``), how long it took, and what came back."""

    replica: int
    question: str
    stream: bool
    sent: float
    seconds: float = 0.0
    status: int = 0  # HTTP status; 0 when no response came
    generation: str = ""
    chunk_ids: list[str] = field(default_factory=list)
    paths: list[str] = field(default_factory=list)
    error: str = ""  # why the answer is not well formed ("" = it is)


def ask(
    client: httpx.Client,
    url: str,
    question: str,
    replica: int,
    stream: bool = False,
    extra: dict[str, Any] | None = None,
) -> Record:
    """Ask one replica; a non-200 status, a malformed body or an in-band stream error is
    recorded in ``error`` (never raised), so the load goes on and every failure is counted."""
    body = {
        "model": "rag",
        "messages": [{"role": "user", "content": question}],
        "stream": stream,
        **(extra or {}),
    }
    rec = Record(replica, question, stream, time.time())
    t0 = time.perf_counter()
    try:
        if stream:
            with client.stream("POST", url + "/v1/chat/completions", json=body) as resp:
                rec.status = resp.status_code
                lines = [x for x in resp.iter_lines() if x] if resp.status_code == 200 else []
                if resp.status_code != 200:
                    resp.read()
                    rec.error = f"HTTP {resp.status_code}: {resp.text[:200]}"
            if lines:
                _read_stream(lines, rec)
        else:
            resp = client.post(url + "/v1/chat/completions", json=body)
            rec.status = resp.status_code
            if resp.status_code != 200:
                rec.error = f"HTTP {resp.status_code}: {resp.text[:200]}"
            else:
                obj = resp.json()
                content = obj["choices"][0]["message"]["content"]
                _read_final(obj, content, rec)
    except Exception as e:  # noqa: BLE001 - a transport failure is an error like any other
        rec.error = rec.error or repr(e)
    rec.seconds = time.perf_counter() - t0
    return rec


def _read_stream(lines: list[str], rec: Record) -> None:
    if lines[-1] != "data: [DONE]":
        rec.error = f"stream did not end with [DONE]: {lines[-1][:200]}"
        return
    events = [json.loads(x.removeprefix("data: ")) for x in lines[:-1]]
    if bad := [e for e in events if "error" in e]:
        rec.error = f"in-band error: {bad[0]['error']}"
        return
    text = "".join(
        (c.get("delta") or {}).get("content") or "" for e in events for c in e.get("choices", [])
    )
    finals = [e for e in events if any(c.get("finish_reason") for c in e.get("choices", []))]
    if len(finals) != 1:
        rec.error = f"{len(finals)} chunks carry a finish_reason"
        return
    _read_final(finals[0], text, rec)


def _read_final(obj: dict[str, Any], content: Any, rec: Record) -> None:
    """Check the answer text, ``sources`` and ``rag`` fields and keep what the checks need."""
    if not isinstance(content, str) or not content.strip():
        rec.error = f"empty or missing answer text: {content!r}"
        return
    sources, info = obj.get("sources"), obj.get("rag")
    if not isinstance(sources, list) or not isinstance(info, dict):
        rec.error = "missing sources or rag fields"
        return
    rec.generation = str(info.get("generation", ""))
    rec.chunk_ids = [str(s["chunk_id"]) for s in sources]
    rec.paths = [str(s["path"]) for s in sources]


class Load:
    """``clients`` threads per replica, each asking its replica the ``questions`` in turn
    (every other request streamed) until :meth:`stop`; every request becomes a :class:`Record`."""

    def __init__(
        self,
        replicas: list[Replica],
        questions: list[str],
        clients: int = 2,
        extra: dict[str, Any] | None = None,
        timeout: float = 120.0,
    ) -> None:
        self.replicas, self.questions, self.extra, self.timeout = (
            replicas,
            questions,
            extra,
            timeout,
        )
        self.records: list[Record] = []
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads = [
            threading.Thread(target=self._client, args=(i, c), daemon=True)
            for i in range(len(replicas))
            for c in range(clients)
        ]

    def _client(self, replica: int, number: int) -> None:
        url, j = self.replicas[replica].url, number
        with httpx.Client(timeout=self.timeout) as client:
            while not self._stop.is_set():
                question = self.questions[j % len(self.questions)]
                rec = ask(client, url, question, replica, stream=j % 2 == 1, extra=self.extra)
                j += 1
                with self._lock:
                    self.records.append(rec)

    def start(self) -> Load:
        for t in self._threads:
            t.start()
        return self

    def stop(self) -> list[Record]:
        """Stop starting requests, wait for those in flight, return every record."""
        self._stop.set()
        for t in self._threads:
            t.join(self.timeout + 10)
        with self._lock:
            return list(self.records)


def change_folder(folder: Path) -> dict[str, str]:
    """The re-ingest's edit: add :data:`PROBE_NAME`, append to one file, delete another (the
    first two other files in name order that ingest reads: a skipped type such as
    ``COPYRIGHT.debian`` would make the change invisible). Returns the names by role."""
    from rag.documents import SUPPORTED_SUFFIXES

    names = sorted(
        p.name
        for p in folder.iterdir()
        if p.is_file() and p.name != PROBE_NAME and p.suffix.lower() in SUPPORTED_SUFFIXES
    )
    changed, deleted = names[0], names[1]
    (folder / PROBE_NAME).write_text(PROBE_TEXT, encoding="utf-8")
    with open(folder / changed, "a", encoding="utf-8") as f:
        f.write(CHANGE_TEXT)
    (folder / deleted).unlink()
    return {"added": PROBE_NAME, "changed": changed, "deleted": deleted}


def run_ingest(
    folder: Path, index: str, args: list[str] | None = None, env: dict[str, str] | None = None
) -> dict[str, Any]:
    """``python -m rag.ingest FOLDER --index INDEX [args]`` in its own process (on an existing
    index the encoder, backend and Chroma URL come from its manifest); its ``--json`` report,
    plus the wall time and ``finished`` (``time.time()`` once the process had exited)."""
    t0 = time.perf_counter()
    cmd = [sys.executable, "-m", "rag.ingest", str(folder), "--index", index, *(args or [])]
    proc = subprocess.run(
        [*cmd, "--no-progress", "--json"],
        capture_output=True,
        text=True,
        env=child_env(env),
        cwd=REPO,
        timeout=3600,
    )
    finished = time.time()
    if proc.returncode != 0:
        raise RuntimeError(f"ingest failed ({proc.returncode}): {proc.stderr[-2000:]}")
    report = json.loads(proc.stdout)
    return {**report, "wall_s": time.perf_counter() - t0, "finished": finished}


def copy_folder(src: Path, dst: Path, max_files: int) -> Path:
    """At most ``max_files`` files of ``src`` (sorted, flattened names) copied into ``dst``."""
    dst.mkdir(parents=True, exist_ok=True)
    files = sorted(p for p in src.rglob("*") if p.is_file())[:max_files]
    for p in files:
        shutil.copy2(p, dst / str(p.relative_to(src)).replace(os.sep, "__"))
    return dst


def summary(records: list[Record], published: float, old: str, new: str) -> list[dict[str, Any]]:
    """Per replica: requests, errors, p50/p95 latency, and the switch to the new generation:
    seconds from ``published`` (``CURRENT``'s mtime) to the sending of the first request that
    answered from ``new`` (slightly negative when a request sent just before the publication
    retrieved just after it), and how many requests sent after that one still answered from
    ``old`` (requests are served concurrently, and while one thread of a replica loads the new
    generation the others answer from the old one, so a few are expected; none once the
    replica has loaded it)."""
    out = []
    for replica in sorted({r.replica for r in records}):
        mine = sorted((r for r in records if r.replica == replica), key=lambda r: r.sent)
        ok = [r for r in mine if not r.error]
        lat = sorted(r.seconds for r in ok)
        first_new = next((r.sent for r in ok if r.generation == new), None)
        late_old = sum(
            1 for r in ok if first_new is not None and r.sent > first_new and r.generation == old
        )
        out.append(
            {
                "replica": replica,
                "requests": len(mine),
                "errors": len(mine) - len(ok),
                "error_samples": sorted({r.error for r in mine if r.error})[:3],
                "p50_latency_s": statistics.median(lat) if lat else None,
                "p95_latency_s": lat[min(len(lat) - 1, int(0.95 * len(lat)))] if lat else None,
                "answers_old": sum(r.generation == old for r in ok),
                "answers_new": sum(r.generation == new for r in ok),
                "switched_after_publish_s": None if first_new is None else first_new - published,
                "old_after_switch": late_old,
            }
        )
    return out


def records_json(records: list[Record]) -> list[dict[str, Any]]:
    return [asdict(r) for r in records]
