"""benchmarks/gpu_run.sh and its summary table (benchmarks/gpu_summary.py): the table from a
results folder with every kind of ending (pure), and the script's --dry-run at tiny sizes on the
CPU, which must leave one summary row per job."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.gpu_summary import GpuSummaryConfig, last_json, main, summarise

REPO = Path(__file__).resolve().parents[1]
JOBS = ["throughput", "throughput-compile", "reader", "lora", "dol"]


def dry_run(out: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    """``gpu_run.sh --dry-run OUT`` with ``env``; it must exit 0 (its stderr tail if not)."""
    run = subprocess.run(
        ["bash", str(REPO / "benchmarks" / "gpu_run.sh"), "--dry-run", str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    return run


def _write(folder: Path, name: str, value) -> None:
    (folder / name).write_text(value if isinstance(value, str) else json.dumps(value, indent=2))


def test_summary_has_a_row_per_job_whatever_its_ending(tmp_path):
    rows = [("throughput", 0, 61, 90), ("reader", 0, 200, 400), ("lora", 124, 400, 400)]
    rows += [("dol", 124, 400, 400), ("throughput-compile", 1, 3, 180)]
    _write(tmp_path, "jobs.tsv", "".join(f"{n}\t{rc}\t{s}\t{t}\n" for n, rc, s, t in rows))
    _write(tmp_path, "hardware.txt", "gpu: NVIDIA H200, 143771 MiB\nbudget_s: 570\n")
    row = {"objective": "mlm", "preset": "base", "batch": 64, "seq_len": 512, "compile": False}
    row |= {"ours_tokens_per_s": 1.31e6, "plain_tokens_per_s": 4.59e5, "ratio": 2.85}
    row |= {"ours_mfu": 0.396, "plain_mfu": 0.139}
    _write(tmp_path, "throughput.json", {"device": "cuda", "rows": [row]})
    reader = {"dev": {"em": 71.2, "f1": 80.4, "questions": 1941}, "dev_before_200": {"f1": 9.1}}
    reader |= {"calibration": {"threshold": 1.5}, "windows": 40000, "steps": 3750}
    reader |= {"train_seconds": 150.2}
    # a library printed to stdout before the --json document
    _write(tmp_path, "reader.json", "{'loss': 1.2}\n" + json.dumps(reader, indent=2))
    _write(tmp_path, "throughput-compile.log", "compiling\nRuntimeError: no triton\n")
    cells = tmp_path / "dol" / "cells"
    cells.mkdir(parents=True)
    _write(cells, "pretrain__mlm15__s0.json", {"tokens_seen": 98304000, "wall_time_s": 101.5})
    _write(cells, "retrieval__mlm15-mean__s0.json", {"scifact_dev": 0.5123, "squad_dev": 0.6011})

    out = summarise(GpuSummaryConfig(out=str(tmp_path)))
    by_job = {r["job"]: r for r in out["jobs"]}
    assert list(by_job) == ["throughput", "reader", "lora", "dol", "throughput-compile"]
    assert by_job["throughput"]["status"] == "ok"
    assert "ours 1,310,000 tok/s" in by_job["throughput"]["result"]
    assert "MFU 39.6% vs 13.9%" in by_job["throughput"]["result"]
    assert "dev EM 71.2 / F1 80.4 (1941 questions" in by_job["reader"]["result"]
    assert by_job["lora"]["status"] == "timeout (400 s)"
    assert by_job["dol"]["status"] == "timeout (400 s)"  # yet its finished cells are reported
    assert "2 cells, pairs finished: none; no report (stopped)" in by_job["dol"]["result"]
    assert "SciFact 0.512, SQuAD 0.601" in by_job["dol"]["result"]
    assert by_job["throughput-compile"]["status"] == "failed (exit 1)"
    assert by_job["throughput-compile"]["result"] == "RuntimeError: no triton"
    table = (tmp_path / "summary.md").read_text()
    assert "- gpu: NVIDIA H200, 143771 MiB" in table
    assert sum(line.startswith("| ") for line in table.splitlines()) == 1 + len(rows)
    assert json.loads((tmp_path / "summary.json").read_text())["jobs"] == out["jobs"]


def test_span_lora_row_names_span_scores_and_distilled_targets(tmp_path):
    _write(tmp_path, "jobs.tsv", "lora\t0\t300\t540\n")
    result = {"before": {"span_kept": 0.8, "grounded": 0.7}, "after": {"span_kept": 0.95}}
    result |= {"n_train_examples": 2000, "n_distilled_targets": 1100, "steps": 125}
    result |= {"train_seconds": 210.0}
    _write(tmp_path, "lora.json", json.dumps(result, indent=2))
    row = summarise(GpuSummaryConfig(out=str(tmp_path)))["jobs"][0]
    assert row["result"].startswith("held-out span_kept 0.8 → 0.95;")
    assert "2000 examples (1100 distilled), 125 steps" in row["result"]


def test_gpu_lora_flags_are_the_base_span_recipe(tmp_path):
    """The script spells training.finetune.lora.span_preset_config(..., "base") out as flags: no
    drift."""
    import re
    import shlex

    from training_support import span_recipe_drift

    script = (REPO / "benchmarks" / "gpu_run.sh").read_text()
    gpu_branch = script.split("DEV=cuda", 1)[1]
    flags = re.search(r'LORA="([^"]*)"', gpu_branch).group(1).replace("$DATA", "data")
    skip = {"model", "out", "data", "device", "threads"}
    assert not span_recipe_drift(shlex.split(flags), tmp_path, "base", skip)


def test_returned_is_at_most_8_files_without_models(tmp_path):
    """--returned (the packed run): one archive of the small results, the summary, the first
    six plots; model weights, checkpoints and big files stay out and are named."""
    run = tmp_path / "run"
    (run / "dol" / "cells").mkdir(parents=True)
    _write(run, "jobs.tsv", "dol\t0\t300\t540\n")
    _write(run / "dol" / "cells", "pretrain__clm__s0.json", {"tokens_seen": 10})
    for name in ("a", "division_of_labor", "pretrain_loss", "retrieval_scifact_dev", "retrieval_squad_dev",
                 "bpb_wikitext_bpb", "reading_f1", "reading_em", "qa_f1"):  # fmt: skip
        (run / "dol" / f"{name}.png").write_bytes(b"png")
    (run / "reader" / "checkpoint-10").mkdir(parents=True)
    (run / "reader" / "checkpoint-10" / "state.json").write_text("{}")
    (run / "reader" / "model.safetensors").write_bytes(b"w")
    (run / "big.log").write_bytes(b"x" * (5 << 20))
    back = tmp_path / "back"
    out = summarise(GpuSummaryConfig(out=str(run), returned=str(back)))
    files = sorted(p.name for p in back.iterdir())
    assert files == out["returned"]["files"] and len(files) == 8
    assert files[:6] == [
        "dol-bpb_wikitext_bpb.png", "dol-division_of_labor.png", "dol-pretrain_loss.png",
        "dol-reading_f1.png", "dol-retrieval_scifact_dev.png", "dol-retrieval_squad_dev.png",
    ]  # fmt: skip
    assert files[6:] == ["results.tar.xz", "summary.md"]
    import tarfile

    with tarfile.open(back / "results.tar.xz") as tar:
        names = tar.getnames()
    assert "run/dol/cells/pretrain__clm__s0.json" in names and "run/dol/qa_f1.png" in names
    assert not [n for n in names if "checkpoint" in n or n.endswith((".safetensors", "big.log"))]
    left = (back / "summary.md").read_text().splitlines()[-1]
    assert left.startswith("Left out of results.tar.xz") and "big.log (5.0 MiB)" in left
    assert "reader/model.safetensors" in left and "checkpoint-10/state.json" in left


def test_summary_cli_refuses_a_folder_that_is_not_a_run(tmp_path, capsys):
    assert main(["--out", str(tmp_path)]) == 2
    assert "no jobs.tsv" in capsys.readouterr().err


def test_last_json_skips_what_is_not_the_document():
    assert last_json('{"a": 1}') is None  # not an indented --json document
    assert last_json('noise\n{\n  "a": [\n    1\n  ]\n}\ntrailing') is None
    assert last_json('{\n  "a": 1\n}\n{\n  "b": 2\n}') == {"b": 2}


def test_the_script_refuses_bad_arguments():
    run = subprocess.run(
        ["bash", str(REPO / "benchmarks" / "gpu_run.sh"), "--bogus"], capture_output=True, text=True
    )
    assert run.returncode == 2 and "usage" in run.stderr


def test_the_packed_run_refuses_a_folder_that_is_not_a_pack(tmp_path):
    run = subprocess.run(
        ["bash", str(REPO / "benchmarks" / "gpu_run.sh"), "--dry-run", str(tmp_path / "out")],
        env={**os.environ, "PACK": str(tmp_path)},
        capture_output=True,
        text=True,
    )
    assert run.returncode == 2 and "no MANIFEST.json (make gpu-pack)" in run.stderr


def test_summary_names_the_finished_pairs_and_those_left(tmp_path):
    _write(tmp_path, "jobs.tsv", "dol\t1\t300\t475\n")
    cells = tmp_path / "dol" / "cells"
    cells.mkdir(parents=True)
    _write(cells, "bpb__mlm15__s0.json", {"wikitext_bpb": 1.234})
    _write(cells, "done__mlm15__s0.json", {"row": "mlm15", "seed": 0})
    _write(tmp_path / "dol", "results.json", {"left": ["clm/s0", "clm/s1"]})
    (tmp_path / "dol" / "results.md").write_text("# report\n")
    row = summarise(GpuSummaryConfig(out=str(tmp_path)))["jobs"][0]
    assert row["result"].startswith("1 cells, pairs finished: mlm15/s0; left: clm/s0, clm/s1:")
    assert "bpb mlm15 s0: 1.234 bits/byte" in row["result"]


def test_dry_run_resumes_from_the_cells_of_an_earlier_run(shared_data, tmp_path):
    """DOL_CELLS (the dol/cells that came back from a GPU run): its finished pairs are not run
    again, here or anywhere; the report is written from them."""
    earlier = tmp_path / "earlier"
    earlier.mkdir()
    for row in ("mlm15", "clm"):
        _write(earlier, f"done__{row}__s0.json", {"row": row, "seed": 0})
        _write(earlier, f"bpb__{row}__s0.json", {"wikitext_bpb": 4.5, "objective": "clm"})
    _write(earlier, "retrieval__bm25__s0.json", {"scifact_dev": 0.9, "squad_dev": 1.0})
    out = tmp_path / "out"
    env = {**os.environ, "PY": sys.executable, "DATA": str(shared_data), "JOBS": "dol"}
    env |= {"WORK": str(tmp_path / "work"), "DOL_CELLS": str(earlier), "PYTHONPATH": str(REPO)}
    run = dry_run(out, env)
    assert "dol: resuming from the 2 finished pairs" in run.stderr
    assert "started" not in (out / "dol.log").read_text()  # no worker
    assert not (tmp_path / "work" / "dol-tiny" / "models").exists()  # nothing pretrained
    results = json.loads((out / "dol" / "results.json").read_text())
    assert results["left"] == [] and set(results["summary"]["bpb"]) == {"mlm15", "clm"}


@pytest.mark.slow  # ~2-3 min on a loaded 2-core CPU: five tiny jobs end to end
def test_dry_run_on_cpu_writes_every_result_and_the_summary(shared_data, tmp_path):
    from training_support import save_tiny_decoder, save_tiny_encoder

    out = tmp_path / "out"
    env = {
        **os.environ,
        "PY": sys.executable,
        "DATA": str(shared_data),
        "WORK": str(tmp_path / "work"),
        "RAG_HOME": str(tmp_path / "home"),
        "READER_MODEL": str(save_tiny_encoder(tmp_path / "enc")),
        "LORA_MODEL": str(save_tiny_decoder(tmp_path / "dec")),
        "BUDGET_S": "500",
        "PYTHONPATH": str(REPO),
    }
    dry_run(out, env)
    summary = json.loads((out / "summary.json").read_text())
    jobs = {r["job"]: r for r in summary["jobs"]}
    assert sorted(jobs) == sorted(JOBS)
    failed = {j: (r["status"], r["result"]) for j, r in jobs.items() if r["status"] != "ok"}
    assert not failed
    table = (out / "summary.md").read_text().splitlines()
    assert [line.split(" | ")[0].lstrip("| ") for line in table if line.startswith("| ")][1:] == [
        r["job"] for r in summary["jobs"]
    ]
    assert "tok/s" in jobs["throughput"]["result"]
    assert "dev EM" in jobs["reader"]["result"]
    # the reader-first recipe scores span kept / grounded (no EM: the span is given)
    assert "held-out span_kept" in jobs["lora"]["result"] and "distilled" in jobs["lora"]["result"]
    assert "complete (results.md)" in jobs["dol"]["result"]
    assert "mode: dry-run" in (out / "hardware.txt").read_text()
    for f in ("reader/run.json", "lora/run.json", "dol/results.json", "dol/results.md"):
        assert (out / f).is_file(), f
    assert not list(out.rglob("*.safetensors"))  # models stay in WORK, not with the results
