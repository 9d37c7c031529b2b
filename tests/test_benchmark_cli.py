"""The benchmarks' command lines, built like every CLI's (rag.cli.flags + rag.cli.run_cli):
every ``python -m benchmarks.X ...`` that README.md and docs/ write parses as typed with the
benchmark's own parser and passes its ``check()``; every config field has the comment its
``--help`` shows; ``check()`` refuses values that cannot run, exit 2 in one line naming the flag.
(tests/test_cli_contract.py holds the shared contract: defaults in ``--help``, one bad value.)

In-process: parsing and ``check()`` run before anything is loaded; the runs are
``benchmarks.decode`` on a tiny random Llama folder (seconds), through ``main`` with ``--json``,
and ``benchmarks.search_latency`` with its rerank rows on tiny random BERTs (a bi-encoder and a
cross-encoder folder) at a few dozen chunks.
"""

from __future__ import annotations

import importlib
import json
import re
import shlex
from pathlib import Path

import pytest
from generate_support import save_tiny_llama
from training_support import save_tiny_cross_encoder, save_tiny_encoder

from rag.cli import EXIT_USAGE
from rag.cli.flags import config_from_args, field_help

REPO = Path(__file__).resolve().parents[1]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
# module -> its config dataclass (each has build_parser() and check(cfg))
BENCHMARKS = {
    "benchmarks.decode": "DecodeBenchConfig",
    "benchmarks.concurrent_load": "LoadConfig",
    "benchmarks.replicas_load": "ReplicasConfig",
    "benchmarks.ingest_throughput": "ThroughputConfig",
    "benchmarks.search_latency": "LatencyConfig",
    "benchmarks.reingest": "ReingestConfig",
    "benchmarks.ingest_engines": "EnginesConfig",
    "benchmarks.pretrain_throughput": "PretrainBenchConfig",
    "benchmarks.batch_cache": "BatchCacheBenchConfig",
}
COMMAND = re.compile(r"^(?:nice -n \d+ )?python -m (benchmarks\.\w+)(.*)$")


def documented_commands() -> list[tuple[str, str, list[str]]]:
    """(where, module, args) of each benchmark command in the docs' bash blocks (continuation
    lines joined, comments dropped) and inline code spans (which may wrap over a line)."""
    found = []
    for path in DOCS:
        text = path.read_text(encoding="utf-8")
        lines = [
            line
            for block in re.findall(r"^```(?:bash|sh|shell)\n(.*?)^```", text, re.M | re.S)
            for line in re.sub(r"\\\n\s*", " ", block).splitlines()
        ]
        lines += [" ".join(span.split()) for span in re.findall(r"(?<!`)`([^`]+)`(?!`)", text)]
        for line in lines:
            if (m := COMMAND.match(line.strip())) and m.group(1) in BENCHMARKS:
                args = shlex.split(m.group(2), comments=True)
                found.append((f"{path.name}: {' '.join(line.split())}", m.group(1), args))
    return found


COMMANDS = documented_commands()


def test_every_converted_benchmark_is_documented():
    """The extraction finds commands at all (a regex gone wrong would pass the test below)."""
    assert {module for _, module, _ in COMMANDS} == set(BENCHMARKS)


@pytest.mark.parametrize(
    "module,args", [(m, a) for _, m, a in COMMANDS], ids=[w for w, _, _ in COMMANDS]
)
def test_documented_command_parses_as_typed(module, args, monkeypatch):
    mod = importlib.import_module(module)
    ns = mod.build_parser().parse_args(args)  # a flag the parser lacks exits 2 here
    cfg = config_from_args(getattr(mod, BENCHMARKS[module]), ns)
    monkeypatch.chdir(REPO)  # the docs' relative paths are from the checkout
    try:
        mod.check(cfg)
    except ValueError as e:  # only a folder the docs name and this machine lacks
        missing = re.match(r"(--[\w-]+) (\S+) is not a folder", str(e))
        if missing and not Path(missing.group(2)).is_dir():
            pytest.skip(f"parsed; check() needs {missing.group(2)}, absent here")
        raise


@pytest.mark.parametrize("module,cls", BENCHMARKS.items())
def test_every_config_field_has_help(module, cls):
    config = getattr(importlib.import_module(module), cls)
    fields = set(config.__dataclass_fields__)
    assert fields and set(field_help(config)) == fields


@pytest.mark.parametrize(
    "module,argv,flag",
    [
        ("benchmarks.decode", ["--prompt-tokens", "10"], "--prompt-tokens"),
        ("benchmarks.decode", ["--no-cache-new-tokens", "0"], "--no-cache-new-tokens"),
        ("benchmarks.concurrent_load", ["--modes", "on,on"], "--modes"),
        ("benchmarks.concurrent_load", ["--duration", "0"], "--duration"),
        ("benchmarks.replicas_load", ["--docs", "no/such/folder"], "--docs"),
        ("benchmarks.replicas_load", ["--before", "-1"], "--before"),
        ("benchmarks.ingest_throughput", ["--docs", "no/such/folder"], "--docs"),
        ("benchmarks.ingest_throughput", ["--encoder-backends", "tensorrt"], "--encoder-backends"),
        ("benchmarks.search_latency", ["--sizes", "5"], "--sizes"),  # fewer chunks than --k
        ("benchmarks.search_latency", ["--text-words", "0"], "--text-words"),
        ("benchmarks.search_latency", ["--rerank-depth", "10", "0"], "--rerank-depth"),
        ("benchmarks.search_latency", ["--rerank-depth", "10", "10"], "--rerank-depth"),
        ("benchmarks.search_latency", ["--rerank-max-length", "0"], "--rerank-max-length"),
        ("benchmarks.search_latency", ["--rerank-precision", "fp16"], "--rerank-precision"),
        ("benchmarks.search_latency", ["--rerank-precision", "int8"], "--rerank-precision"),
        ("benchmarks.reingest", ["--docs", "no/such/folder"], "--docs"),
        ("benchmarks.reingest", ["--docs", ".", "--edit-files", "2"], "--edit-files"),
        ("benchmarks.reingest", [], "--docs"),  # required
        ("benchmarks.ingest_engines", ["--docs", "no/such/folder"], "--docs"),
        ("benchmarks.ingest_engines", ["--docs", ".", "--workers", "0"], "--workers"),
        ("benchmarks.ingest_engines", ["--docs", ".", "--local-threads", "two"], "--local-threads"),
        ("benchmarks.ingest_engines", ["--docs", ".", "--precision", "fp8"], "--precision"),
        ("benchmarks.pretrain_throughput", ["--steps", "0"], "--steps"),
        ("benchmarks.batch_cache", ["--rows", "4,4"], "--rows"),
        ("benchmarks.batch_cache", ["--rows", "two"], "--rows"),
    ],
)
def test_check_refuses_in_one_line_naming_the_flag(module, argv, flag, capsys, monkeypatch):
    monkeypatch.chdir(REPO)
    try:
        status = importlib.import_module(module).main(argv)
    except SystemExit as e:  # argparse's own refusals
        status = e.code
    assert status == EXIT_USAGE
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"{module}: error: ") and flag in err[0], err


def test_decode_main_runs_and_prints_json(tmp_path, capsys):
    from benchmarks.decode import main

    model_dir = save_tiny_llama(tmp_path / "tiny")
    out = tmp_path / "out"
    argv = [
        "--decoder", str(model_dir), "--threads", "1", "--prompt-tokens", "400",
        "--short-prompt-tokens", "250", "--new-tokens", "6", "--no-cache-new-tokens", "3",
        "--repeats", "1", "--out", str(out), "--json",
    ]  # fmt: skip
    assert main(argv) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["config"]["no_cache_new_tokens"] == 3 and printed["config"]["threads"] == 1
    assert printed["no_kv_cache"]["new_tokens"] == 3 and printed["kv_cache"]["new_tokens"] == 6
    assert json.loads((out / "results.json").read_text())["command"].endswith("--json")
    assert (out / "decode.png").stat().st_size > 0


def test_batch_cache_main_compares_both_layers_on_the_same_logits(tmp_path, capsys):
    from benchmarks.batch_cache import main

    out = tmp_path / "out"
    argv = [
        "--decoder", str(save_tiny_llama(tmp_path / "tiny")), "--rows", "1,3",
        "--prompt-tokens", "300", "--steps", "4", "--repeats", "1", "--threads", "1",
        "--precision", "fp32", "--out", str(out), "--json",
    ]  # fmt: skip
    assert main(argv) == 0
    printed = json.loads(capsys.readouterr().out)
    assert [r["rows"] for r in printed["results"]] == [1, 3]
    assert all(r["same_logits"] for r in printed["results"])
    assert all(
        len(r["times_s"]["cat"]) == len(r["times_s"]["append"]) == 1 for r in printed["results"]
    )
    assert (out / "batch_cache.png").stat().st_size > 0


def test_search_latency_rerank_rows(tmp_path, capsys):
    """--rerank adds a hybrid+rerank@D row (and its rerank stage alone, rerank@D) per depth at
    every size, beside the raw/dense/hybrid rows; int8 and the markdown table through ``main``.
    Latencies are only checked to be measured (positive), never compared."""
    from benchmarks.search_latency import LatencyConfig, main, run

    enc = save_tiny_encoder(tmp_path / "enc")
    ce = save_tiny_cross_encoder(tmp_path / "ce")
    cfg = LatencyConfig(
        sizes="40,60", queries=3, k=5, encoder=str(enc), text_words=40, rerank=str(ce),
        rerank_depth=[4, 8], rerank_max_length=64,
    )  # fmt: skip
    summary = run(cfg)
    meta = {"model": str(ce), "depths": [4, 8], "max_length": 64, "precision": "fp32"}
    assert summary["rerank"] == meta
    assert summary["config"]["k"] == 5 and summary["config"]["text_words"] == 40
    for n in ("40", "60"):
        rows = summary["results"][n]
        names = [f"{row}@{d}" for d in (4, 8) for row in ("hybrid+rerank", "rerank")]
        for name in ["raw", "dense", "hybrid", *names]:
            assert rows[name]["p50_ms"] > 0 and rows[name]["p99_ms"] > 0, (n, name)
    plain = run(LatencyConfig(sizes="20", queries=1, k=5, encoder=str(enc), text_words=10))
    assert "rerank" not in plain and not any("rerank" in row for row in plain["results"]["20"])

    out = tmp_path / "out"
    argv = [
        "--sizes", "30", "--queries", "2", "--k", "5", "--encoder", str(enc), "--text-words", "30",
        "--rerank", str(ce), "--rerank-depth", "6", "--rerank-max-length", "64",
        "--rerank-precision", "int8", "--out", str(out),
    ]  # fmt: skip
    assert main(argv) == 0
    assert "| hybrid+rerank@6 p50 / p99 |" in capsys.readouterr().out
    saved = json.loads((out / "results.json").read_text())
    assert saved["rerank"]["precision"] == "int8" and saved["rerank"]["depths"] == [6]
    assert saved["results"]["30"]["hybrid+rerank@6"]["p50_ms"] > 0
    assert saved["command"].endswith(f"--rerank-precision int8 --out {out}")
