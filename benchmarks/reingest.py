"""Re-ingest cost: an unchanged corpus must take at most 5% of the first ingest's time; touching,
changing and deleting one file must re-embed only that file.

``python -m benchmarks.reingest --docs DIR [--index NAME] [--encoder minilm] [--json]``

The first ingest's time is read from the index's ``ingest_log.jsonl`` when the index already
exists (e.g. the acceptance ingest of python-docs), else measured here. The unchanged re-run is
timed as a user runs it: ``python -m rag.ingest`` in a fresh process (start-up and model load
included). The touch / change / delete checks run on a temporary copy of at most
``--edit-files`` files, so the shared data is never modified.
Results: ``$RAG_HOME/benchmarks/reingest/results.json``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rag.cli.flags import config_parser, run_config_cli
from rag.storage.manifest import index_dir
from rag.storage.paths import rag_home

PROG = "benchmarks.reingest"


@dataclass
class ReingestConfig:
    """What to measure; every field is a ``--kebab-case`` flag."""

    docs: str = ""  # folder ingested into --index
    index: str = "pydocs"  # index name under $RAG_HOME/indexes (its first ingest is reused)
    encoder: str | None = None  # rag.ingest --encoder (default: none = the index's, else minilm)
    edit_files: int = 3  # files copied for the touch/change/delete checks (0 = skip them)


def check(cfg: ReingestConfig) -> None:
    """Refuse a run that cannot happen as given (exit 2, rag.cli), before ingesting."""
    if not Path(cfg.docs).is_dir():
        raise ValueError(f"--docs {cfg.docs} is not a folder")
    if cfg.edit_files != 0 and cfg.edit_files < 3:
        raise ValueError(f"--edit-files must be 0 (skip) or >= 3, not {cfg.edit_files}")


def first_ingest_seconds(index: str) -> float | None:
    log = index_dir(index) / "ingest_log.jsonl"
    if not log.exists():
        return None
    for line in log.read_text().splitlines():
        row = json.loads(line)
        if row.get("chunks_embedded"):
            return float(row["seconds"])
    return None


def cli_ingest(docs: list[str], index: str, encoder: str | None) -> tuple[float, dict]:
    cmd = [sys.executable, "-m", "rag.ingest", *docs, "--index", index, "--json", "--no-progress"]
    if encoder:
        cmd += ["--encoder", encoder]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - t0
    if proc.returncode not in (0, 1):
        raise RuntimeError(f"rag.ingest failed: {proc.stderr.strip().splitlines()[-1:]}")
    return wall, json.loads(proc.stdout)


def edit_checks(docs: Path, n_files: int, encoder: str | None) -> dict:
    """Touch, change and delete one file each in a copy; count what got re-embedded."""
    from rag.documents import iter_files
    from rag.ingest import ingest

    tmp = Path(tempfile.mkdtemp(prefix="rag-reingest-"))
    files = [f for f in iter_files([docs]) if not isinstance(f, Exception)][:n_files]
    for f in files:
        shutil.copy(f, tmp / f.name)
    copies = sorted(tmp.iterdir())
    index = f"reingest-edit-{os.getpid()}"
    first = ingest([tmp], index=index, encoder=encoder, progress=False)
    out = {"files": len(copies), "chunks": first.chunks}
    os.utime(copies[0])
    r = ingest([tmp], index=index, progress=False)
    out["touch"] = {
        "embedded": r.chunks_embedded,
        "updated": len(r.updated),
        "unchanged": len(r.unchanged),
    }
    with copies[1].open("a", encoding="utf-8") as f:
        f.write("\n\nAn added closing paragraph.\n")
    r = ingest([tmp], index=index, progress=False)
    out["change"] = {"embedded": r.chunks_embedded, "updated": [Path(p).name for p in r.updated]}
    copies[2].unlink()
    r = ingest([tmp], index=index, progress=False)
    out["delete"] = {
        "removed": [Path(p).name for p in r.removed],
        "chunks_removed": r.chunks_removed,
        "embedded": r.chunks_embedded,
    }
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.rmtree(index_dir(index), ignore_errors=True)
    return out


def run(cfg: ReingestConfig) -> dict[str, Any]:
    """The first ingest (read or measured), the unchanged re-run, the edit checks; writes and
    returns the summary."""
    first = first_ingest_seconds(cfg.index)
    if first is None:
        first, _ = cli_ingest([cfg.docs], cfg.index, cfg.encoder)
    wall, report = cli_ingest([cfg.docs], cfg.index, cfg.encoder)
    summary = {
        "index": cfg.index,
        "docs": cfg.docs,
        "first_ingest_s": first,
        "reingest_wall_s": wall,
        "reingest_in_process_s": report["seconds"],
        "ratio": wall / first,
        "counts": report["counts"],
        "chunks_embedded": report["chunks_embedded"],
        "load_average": os.getloadavg(),
    }
    print(
        f"first ingest {first:.1f}s, unchanged re-ingest {wall:.1f}s wall ({report['seconds']:.1f}s "
        f"in process) = {100 * wall / first:.1f}%; {report['summary']}",
        file=sys.stderr,
    )
    if cfg.edit_files >= 3:
        summary["edits"] = edit_checks(Path(cfg.docs), cfg.edit_files, cfg.encoder)
        print(f"edits: {json.dumps(summary['edits'])}", file=sys.stderr)
    out = rag_home() / "benchmarks" / "reingest"
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(summary, indent=1))
    return summary


def build_parser() -> Any:
    return config_parser(f"python -m {PROG}", __doc__, ReingestConfig, required=["docs"])


def main(argv: list[str] | None = None) -> int:
    return run_config_cli(build_parser(), ReingestConfig, run, argv, check=check)


if __name__ == "__main__":
    sys.exit(main())
