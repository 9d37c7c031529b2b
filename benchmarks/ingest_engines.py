"""The ingest engines side by side: ``rag.ingest --engine local`` against ``--engine ray`` with 1, 2,
... encoder actors on a Ray cluster started here on loopback, on the same documents, each into a
fresh index; then the indexes are compared (same chunk ids, texts and per-file order; vectors
within float tolerance).

``python -m benchmarks.ingest_engines --docs DIR [DIR ...] [--workers 1,2] [--local-threads 2]
[--encoder minilm-tuned] [--precision bf16] [--json]``

Each run is the command a user types (``python -m rag.ingest ... --json``) in a fresh process,
timed wall-clock (start-up and model load included) and by the report's own ``seconds``. The
local engine's encoder uses ``--local-threads`` torch threads (``OMP_NUM_THREADS``); a Ray
encoder actor holds one CPU, so ``--local-threads 1`` against ``--workers 1`` isolates what the
engine itself costs. Indexes are ``engines-local-tN`` / ``engines-rayN`` under ``$RAG_HOME``
(replaced each run); results in ``$RAG_HOME/benchmarks/ingest_engines/results.json``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.cli import command
from benchmarks.loadgen import free_port
from rag.cli.flags import config_parser, run_config_cli
from rag.models.precision import PRECISIONS
from rag.storage.manifest import index_dir
from rag.storage.paths import rag_home

PROG = "benchmarks.ingest_engines"


@dataclass
class EnginesConfig:
    """What to run; every field is a ``--kebab-case`` flag."""

    docs: list[str] = field(default_factory=list)  # files or folders, as rag.ingest takes them
    workers: str = "1,2"  # Ray encoder actor counts to run (comma-separated; "" = none)
    local_threads: str = "2"  # torch threads of the local engine's runs (comma-separated)
    encoder: str = "minilm-tuned"  # rag.ingest --encoder, the same for every run
    precision: str = "bf16"  # rag.ingest --precision, the same for every run
    ray_cpus: int = 0  # CPUs the loopback cluster offers (0: max workers + 1)


def check(cfg: EnginesConfig) -> None:
    """Refuse a run that cannot happen as given (exit 2), before anything starts."""
    for d in cfg.docs:
        if not Path(d).exists():
            raise ValueError(f"--docs {d} is not a folder or file")
    if cfg.precision not in PRECISIONS:
        raise ValueError(f"--precision must be one of {', '.join(PRECISIONS)}, not {cfg.precision}")
    for flag, value in (("--workers", cfg.workers), ("--local-threads", cfg.local_threads)):
        if any(not v.strip().isdigit() or int(v) < 1 for v in value.split(",") if value):
            raise ValueError(f"{flag} must be positive integers separated by commas, not {value!r}")


def counts(value: str) -> list[int]:
    return [int(v) for v in value.split(",") if v.strip()]


RAY = str(Path(sys.executable).parent / "ray")  # the venv's CLI, activated or not


def start_ray(cpus: int) -> str:
    """A Ray head on 127.0.0.1 with ``cpus`` CPUs; returns its address."""
    port = free_port()
    subprocess.run(
        [RAY, "start", "--head", "--node-ip-address", "127.0.0.1", "--port", str(port),
         "--num-cpus", str(cpus), "--include-dashboard", "false", "--disable-usage-stats"],
        check=True, capture_output=True, text=True,
    )  # fmt: skip
    return f"127.0.0.1:{port}"


def stop_ray() -> None:
    subprocess.run([RAY, "stop", "--force"], check=False, capture_output=True)


def ingest_run(cfg: EnginesConfig, index: str, extra: list[str], env: dict[str, str]) -> dict:
    """One ``python -m rag.ingest`` into a fresh ``index``: its report plus wall seconds."""
    shutil.rmtree(index_dir(index), ignore_errors=True)
    cmd = [sys.executable, "-m", "rag.ingest", *cfg.docs, "--index", index, "--encoder",
           cfg.encoder, "--precision", cfg.precision, "--json", "--no-progress", *extra]  # fmt: skip
    load_before = os.getloadavg()
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, **env})
    wall = time.perf_counter() - t0
    if proc.returncode not in (0, 1):  # 1: some files failed, the rest is published
        raise RuntimeError(f"{' '.join(cmd)} exited {proc.returncode}: {proc.stderr[-2000:]}")
    report = json.loads(proc.stdout)
    return {
        "index": index,
        "command": " ".join(["python -m rag.ingest", *cmd[3:]]),
        "env": env,
        "wall_s": wall,
        "seconds": report["seconds"],
        "chunks": report["chunks"],
        "chunks_embedded": report["chunks_embedded"],
        "chunks_per_s": report["chunks_embedded"] / wall,
        "timings": report.get("timings", {}),
        "failed_files": len(report.get("failures", [])),
        "load_average": [load_before, os.getloadavg()],
    }


def index_state(index: str) -> tuple[dict, dict, dict[str, np.ndarray]]:
    """(chunks by id, manifest sources as (hash, chunk ids), vectors by id) of an index, the
    vectors read from wherever the manifest says they live (FAISS file or Chroma server)."""
    from rag.retrieval.retriever import generation_vectors
    from rag.storage.manifest import open_generation, read_chunks

    root, gen, m = open_generation(index)
    chunks = {i: c.to_dict() for i, c in read_chunks(gen).items()}
    sources = {k: (v.hash, list(v.chunk_ids)) for k, v in m.sources.items()}
    ids = sorted(chunks)
    return chunks, sources, dict(zip(ids, generation_vectors(root, gen, m).vectors(ids)))


def compare(reference: str, other: str) -> dict[str, Any]:
    """How ``other`` differs from ``reference``: chunk and file sets, and vector agreement."""
    ca, sa, va = index_state(reference)
    cb, sb, vb = index_state(other)
    shared = sorted(set(va) & set(vb))
    a = np.stack([va[i] for i in shared]) if shared else np.zeros((0, 1))
    b = np.stack([vb[i] for i in shared]) if shared else np.zeros((0, 1))
    cos = np.sum(a * b, axis=1) if shared else np.zeros(0)
    return {
        "same_chunks": ca == cb,  # ids, texts, offsets, headings
        "same_sources": sa == sb,  # per-file hash and chunk order
        "chunks_only_in_reference": len(set(ca) - set(cb)),
        "chunks_only_in_other": len(set(cb) - set(ca)),
        "min_cosine": float(cos.min()) if len(cos) else None,
        "max_abs_diff": float(np.abs(a - b).max()) if shared else None,
    }


def run(cfg: EnginesConfig) -> dict[str, Any]:
    """Every local and Ray run, then each compared with the first local run."""
    runs: list[dict] = []
    for threads in counts(cfg.local_threads):
        env = {"OMP_NUM_THREADS": str(threads)}
        runs.append({"engine": "local", "threads": threads,
                     **ingest_run(cfg, f"engines-local-t{threads}", [], env)})  # fmt: skip
        print(f"local, {threads} threads: {runs[-1]['wall_s']:.1f}s", file=sys.stderr)
    workers = counts(cfg.workers)
    if workers:
        address = start_ray(cfg.ray_cpus or max(workers) + 1)
        try:
            for n in workers:
                extra = ["--engine", "ray", "--ray-address", address, "--workers", str(n)]
                runs.append({"engine": "ray", "workers": n,
                             **ingest_run(cfg, f"engines-ray{n}", extra, {})})  # fmt: skip
                print(f"ray, {n} workers: {runs[-1]['wall_s']:.1f}s", file=sys.stderr)
        finally:
            stop_ray()
    for r in runs[1:]:
        r["vs_first"] = compare(runs[0]["index"], r["index"])
        print(f"{r['index']} vs {runs[0]['index']}: {json.dumps(r['vs_first'])}", file=sys.stderr)
    return {
        "config": asdict(cfg),
        "runs": runs,
        "hardware": f"{os.uname().machine}, {os.cpu_count()} CPUs",
    }


def build_parser() -> Any:
    return config_parser(f"python -m {PROG}", __doc__, EnginesConfig, required=["docs"])


def main(argv: list[str] | None = None) -> int:
    def measure(cfg: EnginesConfig) -> dict:
        summary = {"command": command(PROG, argv), **run(cfg)}
        out = rag_home() / "benchmarks" / "ingest_engines"
        out.mkdir(parents=True, exist_ok=True)
        (out / "results.json").write_text(json.dumps(summary, indent=1, default=str))
        return summary

    return run_config_cli(build_parser(), EnginesConfig, measure, argv, check=check)


if __name__ == "__main__":
    sys.exit(main())
