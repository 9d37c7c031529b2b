"""Replicas under load through a re-ingest: N ``rag.serve`` processes on one Chroma server, client
threads asking all of them the whole time, and a separate ``rag.ingest`` process that adds,
changes and deletes a file in the middle (issue 14, part 2).

    chroma run --path /tmp/rag-chroma --host 127.0.0.1 --port 8001 &
    python -m benchmarks.replicas_load --chroma-url http://127.0.0.1:8001 \\
        --docs ../shared/data/python-docs --max-files 200 [--replicas 2] [--clients 2] \\
        [--encoder minilm] [--decoder smollm2] [--before 20] [--after 20] [--replace] [--json]

Copies at most ``--max-files`` files of ``--docs`` into a scratch folder, ingests them into
``--index`` on the Chroma server (a separate process, timed), starts ``--replicas`` replicas
(``--clients`` threads each, every other request streamed), loads them ``--before`` seconds,
then edits the folder (adds ``replica-probe.md``, appends to one file, deletes another) and
re-ingests it in a third process while the load goes on, and loads ``--after`` seconds more.

Reports per replica: requests, errors, p50/p95 latency, answers from the old and the new
generation, and when it switched (from the publication, ``CURRENT``'s mtime, to the first
request answered from the new generation); then whether each replica finds the added file
(``mode bm25, k 1``). ``results.json`` and ``records.jsonl`` (one line per request) go to
``$RAG_HOME/benchmarks/replicas_load/``, the replicas' logs beside them. The index must not
exist unless ``--replace`` (which removes its folder; the first ingest then reconciles the
server's collection). Run it alone on the machine.
"""

from __future__ import annotations

import json
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx

from benchmarks.cli import command, results_dir, save_result
from benchmarks.replicas import (
    PROBE_NAME,
    PROBE_QUESTION,
    Load,
    ask,
    change_folder,
    copy_folder,
    records_json,
    run_ingest,
    start_replica,
    stop_replicas,
    summary,
    wait_ready,
)
from rag.cli.flags import config_parser, run_config_cli
from rag.storage.manifest import CURRENT, index_dir

PROG = "benchmarks.replicas_load"
QUESTIONS = [
    "How do I read a file line by line?",
    "What does the with statement do?",
    "How are exceptions handled?",
    "How do I define a function with default arguments?",
    "What is the difference between a list and a tuple?",
    PROBE_QUESTION,  # refused or off-topic before the re-ingest, the added file after it
]


@dataclass
class ReplicasConfig:
    """One run; every field is a ``--kebab-case`` flag."""

    chroma_url: str = "http://127.0.0.1:8001"  # a running Chroma server (chroma run ...)
    docs: str = "../shared/data/python-docs"  # folder whose files are copied and ingested
    max_files: int = 200  # files copied from --docs
    index: str = "replicas-bench"  # index name under $RAG_HOME/indexes
    encoder: str = "minilm"  # encoder of the new index
    decoder: str = "smollm2"  # decoder of every replica
    adapter: str = "none"  # LoRA adapter of the replicas: none | auto | folder
    replicas: int = 2  # rag.serve processes
    clients: int = 2  # client threads per replica
    max_new_tokens: int = 32  # answer length cap
    k: int = 5  # passages per answer
    before: float = 20.0  # seconds of load before the re-ingest starts
    after: float = 20.0  # seconds of load after it has finished
    device: str = "cpu"  # cpu | cuda | auto (every replica and the ingest)
    decoder_precision: str = "auto"  # decoder weights of the replicas (rag.models.precision)
    threads: int = 1  # OMP/MKL threads per process
    startup_timeout: float = 600.0  # seconds for the replicas to load their models
    replace: bool = False  # remove an existing --index folder first
    out: str | None = None  # output folder (default $RAG_HOME/benchmarks/replicas_load)


def log(msg: str) -> None:
    print(f"[replicas_load] {msg}", file=sys.stderr, flush=True)


def check(cfg: ReplicasConfig) -> None:
    """Refuse a run that cannot happen as given (exit 2, rag.cli), before starting anything."""
    for name, low in (("replicas", 1), ("clients", 1), ("max_files", 3), ("max_new_tokens", 1),
                      ("k", 1), ("threads", 1), ("before", 0), ("after", 0)):  # fmt: skip
        if getattr(cfg, name) < low:
            raise ValueError(
                f"--{name.replace('_', '-')} must be >= {low}, not {getattr(cfg, name)}"
            )
    if cfg.startup_timeout <= 0:
        raise ValueError(f"--startup-timeout must be > 0, not {cfg.startup_timeout}")
    if not Path(cfg.docs).is_dir():
        raise ValueError(f"--docs {cfg.docs} is not a folder")


def run(cfg: ReplicasConfig, out: Path) -> dict[str, Any]:
    """The whole scenario; returns the results (records are written to ``out``)."""
    root = index_dir(cfg.index)
    if root.exists():
        if not cfg.replace:
            raise ValueError(f"index {cfg.index!r} exists ({root}): pass --replace or --index")
        shutil.rmtree(root)
    env = {"OMP_NUM_THREADS": str(cfg.threads), "MKL_NUM_THREADS": str(cfg.threads)}
    work = Path(tempfile.mkdtemp(prefix="replicas-load-"))
    try:
        folder = copy_folder(Path(cfg.docs), work / "docs", cfg.max_files)
        ingest_args = ["--encoder", cfg.encoder, "--backend", "chroma"]
        ingest_args += ["--chroma-url", cfg.chroma_url, "--device", cfg.device]
        log(f"first ingest of {cfg.max_files} files into {cfg.index}")
        first = run_ingest(folder, cfg.index, ingest_args, env)
        serve_args = [
            "--decoder", cfg.decoder, "--adapter", cfg.adapter, "--device", cfg.device,
            "--decoder-precision", cfg.decoder_precision, "--max-new-tokens", str(cfg.max_new_tokens), "--k", str(cfg.k),
            "--max-concurrent", str(max(4, cfg.clients)), "--log-level", "warning",
        ]  # fmt: skip
        replicas = [start_replica(cfg.index, serve_args, out, i, env) for i in range(cfg.replicas)]
        try:
            wait_ready(replicas, cfg.startup_timeout)
            log(f"{cfg.replicas} replicas ready; loading {cfg.before:.0f} s before the re-ingest")
            load = Load(replicas, QUESTIONS, clients=cfg.clients).start()
            time.sleep(cfg.before)
            edit = change_folder(folder)
            started = time.time()
            second = run_ingest(folder, cfg.index, ["--device", cfg.device], env)
            log(f"re-ingest done in {second['wall_s']:.1f} s; loading {cfg.after:.0f} s more")
            time.sleep(cfg.after)
            records = load.stop()
            probe_args = {"mode": "bm25", "k": 1}
            with httpx.Client(timeout=300) as client:
                probes = [
                    ask(client, r.url, PROBE_QUESTION, i, extra=probe_args)
                    for i, r in enumerate(replicas)
                ]
        finally:
            stop_replicas(replicas)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    published = (root / CURRENT).stat().st_mtime
    old, new = first["generation"], second["generation"]
    with open(out / "records.jsonl", "w") as f:
        for row in records_json(records):
            f.write(json.dumps(row) + "\n")
    return {
        "config": asdict(cfg),
        "edit": edit,
        "first_ingest": _ingest_summary(first),
        "reingest": _ingest_summary(second),
        "generations": {"old": old, "new": new},
        "published_after_reingest_start_s": published - started,
        "replicas": summary(records, published, old, new),
        "probes": [
            {"replica": p.replica, "ok": not p.error and p.paths == [PROBE_NAME], **asdict(p)}
            for p in probes
        ],
        "p50_latency_all_s": statistics.median(r.seconds for r in records if not r.error)
        if any(not r.error for r in records)
        else None,
    }


def _ingest_summary(report: dict[str, Any]) -> dict[str, Any]:
    keys = ("generation", "chunks", "chunks_embedded", "chunks_removed", "wall_s", "seconds")
    return {k: report.get(k) for k in keys} | {
        "added": len(report.get("added", [])),
        "updated": len(report.get("updated", [])),
        "removed": len(report.get("removed", [])),
    }


def markdown(result: dict[str, Any]) -> str:
    def s(v: float | None) -> str:
        return "–" if v is None else f"{v:.2f} s"

    g = result["generations"]
    re_ = result["reingest"]
    lines = [
        f"re-ingest {g['old']} → {g['new']}: {re_['added']} added, {re_['updated']} changed, "
        f"{re_['removed']} deleted, {re_['chunks_embedded']} chunks embedded, "
        f"{re_['wall_s']:.1f} s (process), published "
        f"{s(result['published_after_reingest_start_s'])} after it started",
        "",
        "| replica | requests | errors | p50 | p95 | old gen | new gen | switched after publish "
        "| old after first new | probe finds added file |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    probes = {p["replica"]: p["ok"] for p in result["probes"]}
    for r in result["replicas"]:
        lines.append(
            f"| {r['replica']} | {r['requests']} | {r['errors']} | {s(r['p50_latency_s'])} | "
            f"{s(r['p95_latency_s'])} | {r['answers_old']} | {r['answers_new']} | "
            f"{s(r['switched_after_publish_s'])} | {r['old_after_switch']} | "
            f"{probes.get(r['replica'])} |"
        )
    return "\n".join(lines)


def build_parser() -> Any:
    return config_parser(f"python -m {PROG}", __doc__, ReplicasConfig)


def main(argv: list[str] | None = None) -> int:
    def measure(cfg: ReplicasConfig) -> dict:
        out = results_dir(cfg.out, "replicas_load")
        result = run(cfg, out)
        log(f"wrote {save_result(result, out, command(PROG, argv))}")
        return result

    return run_config_cli(
        build_parser(), ReplicasConfig, measure, argv, check=check, report=markdown
    )


if __name__ == "__main__":
    sys.exit(main())
