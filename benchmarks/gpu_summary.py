"""The summary table of ``benchmarks/gpu_run.sh``: one row per job of a run's results folder.

    python -m benchmarks.gpu_summary --out artifacts/gpu_run/20250101-120000

Reads ``jobs.tsv`` (name, exit status, seconds, limit; written by the script as each job ends),
each job's ``<job>.json`` (its ``--json`` output) and, for the division-of-labour job, the cells
under ``dol/cells``; writes ``summary.md`` (the hardware lines, then the table) and
``summary.json``. A job that failed or ran out of time is a row that says so, with the last line
of its log; the numbers of a job that finished are its headline figures (tokens/s and MFU, dev
EM/F1, held-out QA before and after, the experiment's finished cells).

``--returned DIR`` (the packed run on a lent GPU machine, ``PACK=... bash benchmarks/gpu_run.sh``)
also writes what that machine can hand back, at most 8 files of at most 16 MiB
(../shared/design/GPU.md): ``results.tar.xz`` (every file of the folder but models, checkpoints
and anything over 4 MiB, which are listed in ``summary.md`` instead), ``summary.md`` and up to
six plots of the experiment (:data:`PLOTS`), named ``dol-<plot>.png``.
"""

from __future__ import annotations

import json
import shutil
import sys
import tarfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rag.cli.flags import config_parser, run_config_cli

TIMEOUT_EXITS = (124, 137)  # timeout(1): the limit was reached (137: killed after the grace)
MIB = 1 << 20
# --returned: what a lent machine hands back from $OUT (GPU.md): at most 8 files of 16 MiB
RETURNED_FILES, RETURNED_BYTES = 8, 16 * MIB
# never in results.tar.xz: model weights, checkpoints, optimiser states, embeddings
HEAVY_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".gguf", ".onnx", ".npy", ".npz")
MAX_MEMBER = 4 * MIB  # a larger file is a model or a copy of data, not a result
# the experiment's plots worth a look without unpacking, in this order (RETURNED_FILES - 2 kept)
PLOTS = (
    "dol/division_of_labor.png", "dol/pretrain_loss.png", "dol/retrieval_scifact_dev.png",
    "dol/retrieval_squad_dev.png", "dol/bpb_wikitext_bpb.png", "dol/reading_f1.png",
)  # fmt: skip


@dataclass
class GpuSummaryConfig:
    """Which run to summarise."""

    out: str = ""  # the run's results folder (jobs.tsv, <job>.json, <job>.log, dol/)
    returned: str = ""  # also pack it into this folder as <= 8 files (a lent machine's $OUT)


def last_json(text: str) -> Any:
    """The last indented JSON document in ``text`` (a command's ``--json`` output; libraries
    may have printed other lines to stdout before it), or None."""
    lines = text.splitlines()
    for i in range(len(lines) - 1, -1, -1):
        if lines[i] in ("{", "["):
            try:
                return json.loads("\n".join(lines[i:]))
            except json.JSONDecodeError:
                continue
    return None


def _n(x: Any, digits: int = 0) -> str:
    if not isinstance(x, (int, float)):
        return "–"
    return f"{x:,.{digits}f}"


def throughput(result: dict, folder: Path) -> str:
    """Per (objective, preset): ours vs plain tokens/s, MFU where the GPU's peak is known."""
    parts = []
    for r in result.get("rows", []):
        mfu = f" (MFU {r['ours_mfu']:.1%} vs {r['plain_mfu']:.1%})" if "ours_mfu" in r else ""
        parts.append(
            f"{r['objective']} {r['preset']} {r['batch']}×{r['seq_len']}"
            f"{' compiled' if r.get('compile') else ''}: ours {_n(r['ours_tokens_per_s'])} tok/s,"
            f" plain {_n(r['plain_tokens_per_s'])} (×{r['ratio']:.2f}){mfu}"
        )
    return "; ".join(parts) or "no rows"


def reader(result: dict, folder: Path) -> str:
    dev, before = result.get("dev", {}), result.get("dev_before_200", {})
    cal = result.get("calibration", {})
    return (
        f"dev EM {dev.get('em')} / F1 {dev.get('f1')} ({dev.get('questions')} questions, gold "
        f"paragraph; F1 before {before.get('f1')}), null threshold {cal.get('threshold')}; "
        f"{_n(result.get('windows'))} windows, {result.get('steps')} steps, "
        f"{result.get('train_seconds')} s training"
    )


def lora(result: dict, folder: Path) -> str:
    """Held-out scores before → after; the reader-first recipe adds span kept / grounded and
    how many targets were distilled."""
    b, a = result.get("before", {}), result.get("after", {})
    keys = ("em", "f1", "citation_accuracy", "span_kept", "grounded")
    held = ", ".join(f"{k} {b.get(k)} → {a.get(k)}" for k in keys if k in a)
    distilled = result.get("n_distilled_targets")
    targets = f" ({distilled} distilled)" if distilled is not None else ""
    return (
        f"held-out {held or '(not scored)'}; {result.get('n_train_examples')} examples"
        f"{targets}, {result.get('steps')} steps, {result.get('train_seconds')} s training"
    )


def dol(result: dict | None, folder: Path) -> str:
    """The experiment's finished cells (they survive a timeout: the run resumes from them)."""
    cells = sorted((folder / "dol" / "cells").glob("*.json"))
    if not cells:
        return "no finished cell"
    shown, finished = [], []
    for p in cells:
        column, model, seed = (p.stem.split("__") + ["", ""])[:3]
        c = json.loads(p.read_text())
        if column == "done":  # a (row, seed) pair with every cell finished
            finished.append(f"{model}/{seed}")
            continue
        if "skipped" in c:
            continue
        if column == "pretrain":
            what = f"{_n(c.get('tokens_seen'))} tokens in {_n(c.get('wall_time_s'))} s"
        elif column == "retrieval":
            what = (
                f"nDCG@10 SciFact {_n(c.get('scifact_dev'), 3)}, SQuAD {_n(c.get('squad_dev'), 3)}"
            )
        elif column == "bpb":
            what = f"{_n(c.get('wikitext_bpb'), 3)} bits/byte"
        elif column == "qa":
            what = f"EM {_n(c.get('em'), 3)}, F1 {_n(c.get('f1'), 3)}"
        else:
            what = ", ".join(f"{k} {v}" for k, v in c.items() if isinstance(v, (int, float)))
        shown.append(f"{column} {model} {seed}: {what}")
    report = folder / "dol" / "results.json"
    left = json.loads(report.read_text()).get("left") if report.exists() else None
    if left is None:
        state = "no report (stopped)"
    else:
        state = f"left: {', '.join(left)}" if left else "complete (results.md)"
    pairs = ", ".join(finished) or "none"
    return f"{len(cells) - len(finished)} cells, pairs finished: {pairs}; {state}: " + "; ".join(
        shown
    )


SUMMARIES: dict[str, Callable[[Any, Path], str]] = {
    "throughput": throughput,
    "throughput-compile": throughput,
    "reader": reader,
    "lora": lora,
    "dol": dol,
}


def read_jobs(folder: Path) -> list[dict[str, Any]]:
    """The rows of ``jobs.tsv``: name, exit status, seconds, limit."""
    path = folder / "jobs.tsv"
    if not path.is_file():
        raise FileNotFoundError(f"--out {folder}: no jobs.tsv (not a gpu_run.sh results folder)")
    rows = []
    for line in path.read_text().splitlines():
        if line.strip():
            name, rc, seconds, limit = line.split("\t")
            rows.append(
                {"job": name, "exit": int(rc), "seconds": int(seconds), "limit_s": int(limit)}
            )
    return rows


def _last_log_line(folder: Path, job: str) -> str:
    log = folder / f"{job}.log"
    lines = (
        [x for x in log.read_text(errors="replace").splitlines() if x.strip()]
        if log.is_file()
        else []
    )
    return lines[-1].strip()[:200] if lines else "(no log)"


def summarise(cfg: GpuSummaryConfig) -> dict[str, Any]:
    """Every job's row; writes summary.md and summary.json into ``cfg.out``."""
    folder = Path(cfg.out)
    rows = read_jobs(folder)
    for row in rows:
        job = row["job"]
        out = folder / f"{job}.json"
        result = last_json(out.read_text(errors="replace")) if out.is_file() else None
        if row["exit"] == 0:
            row["status"] = "ok"
        elif row["exit"] in TIMEOUT_EXITS:
            row["status"] = f"timeout ({row['limit_s']} s)"
        else:
            row["status"] = f"failed (exit {row['exit']})"
        summary = SUMMARIES.get(job)
        try:
            if summary is dol:
                row["result"] = dol(result, folder)
            elif row["exit"] == 0 and summary is not None and isinstance(result, dict):
                row["result"] = summary(result, folder)
            else:
                row["result"] = _last_log_line(folder, job)
        except (KeyError, TypeError, ValueError) as e:  # an output of another shape
            row["result"] = f"(unreadable result: {e})"
    hardware = folder / "hardware.txt"
    head = hardware.read_text().splitlines() if hardware.is_file() else []
    md = ["# GPU run", "", *[f"- {x}" for x in head], ""]
    md += ["| job | status | seconds | limit s | result |", "|---|---|---|---|---|"]
    md += [
        f"| {r['job']} | {r['status']} | {r['seconds']} | {r['limit_s']} | "
        + r["result"].replace("|", "\\|")
        + " |"
        for r in rows
    ]
    text = "\n".join(md) + "\n"
    (folder / "summary.md").write_text(text)
    result = {"folder": str(folder), "hardware": head, "jobs": rows, "markdown": text}
    (folder / "summary.json").write_text(json.dumps(result, indent=2) + "\n")
    if cfg.returned:
        result["returned"] = pack_returned(folder, Path(cfg.returned))
    return result


def _heavy(path: Path, rel: Path) -> bool:
    """A file that is no result to hand back: weights, a checkpoint's, anything over 4 MiB."""
    return (
        path.suffix in HEAVY_SUFFIXES
        or path.stat().st_size > MAX_MEMBER
        or any(part.startswith("checkpoint") for part in rel.parts)
    )


def pack_returned(folder: Path, dest: Path) -> dict[str, Any]:
    """Pack the results ``folder`` into ``dest`` as at most :data:`RETURNED_FILES` files:
    ``results.tar.xz`` (every file but the heavy ones, which ``summary.md`` lists), the
    summary and the first six of :data:`PLOTS` present. Why: a lent machine hands back only 8
    files from ``$OUT`` (GPU.md), and a results folder holds dozens."""
    dest.mkdir(parents=True, exist_ok=True)
    left_out = []
    with tarfile.open(dest / "results.tar.xz", "w:xz") as tar:
        for path in sorted(folder.rglob("*")):
            rel = path.relative_to(folder)
            if not path.is_file():
                continue
            if _heavy(path, rel):
                left_out.append(f"{rel} ({path.stat().st_size / MIB:.1f} MiB)")
                continue
            tar.add(path, arcname=str(Path(folder.name) / rel))
    summary = (folder / "summary.md").read_text()
    if left_out:
        summary += "\nLeft out of results.tar.xz (models, checkpoints, > 4 MiB): "
        summary += ", ".join(left_out) + "\n"
    (dest / "summary.md").write_text(summary)
    plots = [p for p in PLOTS if (folder / p).is_file()][: RETURNED_FILES - 2]
    for rel in plots:
        shutil.copyfile(folder / rel, dest / rel.replace("/", "-"))
    files = sorted(p.name for p in dest.iterdir() if p.is_file())
    big = [f for f in files if (dest / f).stat().st_size > RETURNED_BYTES]
    if big:
        print(f"gpu_summary: warning: over 16 MiB, will not come back: {big}", file=sys.stderr)
    return {"folder": str(dest), "files": files, "left_out": left_out}


def main(argv: list[str] | None = None) -> int:
    parser = config_parser(
        "python -m benchmarks.gpu_summary", __doc__, GpuSummaryConfig, required=("out",)
    )
    return run_config_cli(
        parser, GpuSummaryConfig, summarise, argv, report=lambda r: r["markdown"].rstrip()
    )


if __name__ == "__main__":
    raise SystemExit(main())
