"""Every command line keeps the same contract (rag.cli, rag.cli.flags): ``--help`` shows each
flag's default, and a bad value exits 2 with one line, ``PROG: error: ...``, naming the flag.

In-process (``main(argv)``), so the whole table runs in seconds: nothing here loads a model.
"""

from __future__ import annotations

import importlib
import re

import pytest

from rag.cli import EXIT_FAILED, EXIT_USAGE, exit_code, fail, one_line

# module, argv with one bad value, the flag the error line must name
CLIS = [
    ("rag.ingest", ["docs", "--backend", "sqlite"], "--backend"),
    ("rag.search", ["q", "--mode", "fuzzy"], "--mode"),
    ("rag.ask", ["q", "--k", "five"], "--k"),
    ("rag.serve", ["--port", "many"], "--port"),
    ("ui.app", ["--mode", "fuzzy"], "--mode"),
    ("training.pretrain", ["--objective", "mlm", "--preset", "huge"], "--preset"),
    ("training.finetune.contrastive", ["--device", "tpu"], "--device"),
    ("training.finetune.lora", ["--r", "eight"], "--r"),
    ("training.finetune.rerank", ["--max-length", "long"], "--max-length"),
    ("training.finetune.reader", ["--stride", "wide"], "--stride"),
    ("evals.qa", ["--squad", "x.json", "--k", "three"], "--k"),
    ("evals.retrieval", ["--dataset", "d", "--retriever", "sparse"], "--retriever"),
    ("evals.docqa", ["--device", "tpu"], "--device"),
    ("benchmarks.decode", ["--parts", "kv,fast"], "--parts"),
    ("benchmarks.decode_variants", ["--repeats", "many"], "--repeats"),
    ("benchmarks.concurrent_load", ["--modes", "sideways"], "--modes"),
    ("benchmarks.serve_load", ["--target", "cli"], "--target"),
    ("benchmarks.ui_load", ["--mode", "fuzzy"], "--mode"),
    ("benchmarks.replicas_load", ["--max-files", "2"], "--max-files"),
    ("benchmarks.ingest_throughput", ["--precisions", "fp16"], "--precisions"),
    ("benchmarks.search_latency", ["--sizes", "10k"], "--sizes"),
    ("benchmarks.reingest", ["--docs", "d", "--edit-files", "two"], "--edit-files"),
    ("benchmarks.pretrain_throughput", ["--objectives", "mlm", "glue"], "--objectives"),
]


# commands whose main lives in a module of the package (``python -m rag.serve`` runs
# rag/serve/__main__.py, which calls rag.serve.app.main)
MAIN_MODULE = {"rag.serve": "rag.serve.app", "training.pretrain": "training.pretrain.train"}


def run_main(module: str, argv: list[str]) -> int:
    try:
        return importlib.import_module(MAIN_MODULE.get(module, module)).main(argv)
    except SystemExit as e:  # argparse: --help, or a refused flag
        return e.code


def option_entries(help_text: str) -> dict[str, str]:
    """``--flag`` -> its whole help entry (argparse wraps one over several lines)."""
    entries: dict[str, str] = {}
    current = None
    for line in help_text.splitlines():
        if re.match(r"^  -", line):
            current = line.split()[0].rstrip(",")
            entries[current] = line
        elif current and line.startswith("   "):
            entries[current] += " " + line.strip()
        else:
            current = None
    return entries


@pytest.mark.parametrize("module", [m for m, _, _ in CLIS])
def test_help_shows_every_default(module, capsys):
    assert run_main(module, ["--help"]) == 0
    entries = option_entries(capsys.readouterr().out)
    assert len(entries) > 2, entries
    for flag, text in entries.items():
        if flag == "-h":
            continue
        text = " ".join(text.split())
        assert "(default" in text or "(required)" in text, f"{module} {flag}: {text}"


@pytest.mark.parametrize("module,argv,flag", CLIS)
def test_bad_value_exits_2_in_one_line_naming_the_flag(module, argv, flag, capsys):
    assert run_main(module, argv) == EXIT_USAGE
    cap = capsys.readouterr()
    lines = cap.err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in cap.err, cap.err
    assert lines[0].startswith(f"{module}: error: "), lines[0]
    assert flag in lines[0] and "usage:" not in cap.err, lines[0]


def test_exit_rule():
    """2: the command cannot run as given; 1: it ran and failed (rag.cli docstring)."""
    for exc in (ValueError("v"), LookupError("l"), FileNotFoundError("f"), ImportError("i")):
        assert exit_code(exc) == EXIT_USAGE
    for exc in (RuntimeError("r"), ZeroDivisionError("z"), AssertionError("a")):
        assert exit_code(exc) == EXIT_FAILED
    assert one_line("a\n  b\tc") == "a b c"


def test_failure_line_names_unexpected_types(capsys, monkeypatch):
    monkeypatch.delenv("RAG_DEBUG", raising=False)
    assert fail("python -m rag.x", RuntimeError("no GPU")) == EXIT_FAILED
    assert capsys.readouterr().err == "rag.x: error: no GPU\n"
    assert fail("rag.x", ZeroDivisionError("boom")) == EXIT_FAILED
    err = capsys.readouterr().err
    assert (
        err.startswith("rag.x: error: unexpected ZeroDivisionError: boom") and err.count("\n") == 1
    )
    monkeypatch.setenv("RAG_DEBUG", "1")
    with pytest.raises(ValueError):
        fail("rag.x", ValueError("shown as a traceback for developers"))
