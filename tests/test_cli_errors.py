"""Every failure of rag.ingest / rag.search / rag.ask is one line naming the value, exit status
2, no traceback: a bad model path, a bad index, a bad flag value (docs/security.md)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from ingest_support import write_docs

from rag import ask, ingest, search
from rag.storage.paths import rag_home

MAINS = {"ingest": ingest.main, "search": search.main, "ask": ask.main}


@pytest.fixture
def index_name(tmp_path, tiny_mlm_dir) -> str:
    """A small index, so that search errors past "no such index" can be reached."""
    ingest.ingest([write_docs(tmp_path / "docs")], "cli-err", str(tiny_mlm_dir), progress=False)
    return "cli-err"


def one_line_failure(cli: str, argv: list[str], capsys) -> str:
    """Run ``rag.<cli>`` in-process; assert exit 2, one stderr line, no traceback; return it."""
    try:
        code = MAINS[cli](argv)
    except SystemExit as e:  # argparse exits
        code = e.code
    cap = capsys.readouterr()
    lines = cap.err.strip().splitlines()
    assert code == 2, (code, cap.err)
    assert len(lines) == 1 and "Traceback" not in cap.err, cap.err
    assert lines[0].startswith(f"rag.{cli}: error: ")
    return lines[0]


CASES = [
    # (cli, argv, text the line must contain); DOCS / IDX / TMP are filled in by the test
    ("ingest", ["DOCS", "--index", "e1", "--encoder", "/no/such/dir"], "/no/such/dir"),
    ("ingest", ["DOCS", "--index", "../../escape"], "../../escape"),
    ("ingest", ["DOCS", "--index-dir", "TMP/a-file"], "a-file"),
    ("ingest", ["DOCS", "--chunk-tokens", "many"], "'many'"),
    ("ingest", ["DOCS", "--backend", "sqlite"], "'sqlite'"),
    ("ingest", ["DOCS", "--index", "e2", "--chunk-tokens", "0"], "--chunk-tokens"),
    ("search", ["q", "--index", "IDX", "--encoder", "/no/such/dir"], "/no/such/dir"),
    ("search", ["q", "--index", "IDX", "--rerank", "/no/such/reranker"], "/no/such/reranker"),
    ("search", ["q", "--index", "../x"], "'../x'"),
    ("search", ["q", "--index", "missing-index"], "missing-index"),
    ("search", ["q", "--index-dir", "TMP/nothing"], "nothing"),
    ("search", ["q", "--k", "ten"], "'ten'"),
    ("search", ["q", "--index", "IDX", "--k", "0"], "--k"),
    ("search", ["q", "--mode", "fuzzy"], "'fuzzy'"),
    ("ask", ["q", "--decoder", "/no/such/dir"], "/no/such/dir"),
    ("ask", ["q", "--adapter", "/no/such/adapter"], "/no/such/adapter"),
    ("ask", ["q", "--index", "IDX", "--encoder", "/no/such/encoder"], "/no/such/encoder"),
    ("ask", ["q", "--index", "../../escape"], "../../escape"),
    ("ask", ["q", "--index", "missing-index"], "missing-index"),
    ("ask", ["q", "--index-dir", "TMP/nothing"], "nothing"),
    ("ask", ["q", "--k", "ten"], "'ten'"),
    ("ask", ["q", "--k", "0"], "0"),
    ("ask", ["q", "--temperature", "-1"], "-1"),
]


@pytest.mark.parametrize("cli,argv,names", CASES)
def test_cli_failure_is_one_line_exit_2(cli, argv, names, tmp_path, request, capsys):
    (tmp_path / "a-file").write_text("not an index")
    fill = {"DOCS": str(write_docs(tmp_path / "docs")), "TMP": str(tmp_path)}
    if any("IDX" in a for a in argv):
        fill["IDX"] = request.getfixturevalue("index_name")
    for key in sorted(fill, key=len, reverse=True):
        argv = [a.replace(key, fill[key]) for a in argv]
    capsys.readouterr()  # what building the index printed is not the CLI's output
    line = one_line_failure(cli, argv, capsys)
    assert names in line


@pytest.mark.parametrize(
    "case", ["missing index", pytest.param("other encoder", marks=pytest.mark.slow)]
)
def test_real_process_prints_one_line(case, request, tmp_path):
    """``rag.search q --index x --encoder /no/such/dir`` as a user runs it, and an encoder that
    loads but does not match the index: no traceback, no loading bars or reports, exit 2."""
    from ingest_support import perturbed_copy

    if case == "missing index":
        index, encoder, names = "x", "/no/such/dir", "--index x"
    else:
        index = request.getfixturevalue("index_name")
        tiny = request.getfixturevalue("tiny_mlm_dir")
        encoder = names = str(perturbed_copy(tiny, tmp_path / "other-encoder"))
    env = {**os.environ, "RAG_HOME": str(rag_home())}
    for key in ("TRANSFORMERS_VERBOSITY", "HF_HUB_DISABLE_PROGRESS_BARS"):
        env.pop(key, None)  # the CLI's own defaults are under test
    proc = subprocess.run(
        [sys.executable, "-m", "rag.search", "q", "--index", index, "--encoder", encoder],
        capture_output=True,
        text=True,
        env=env,
        cwd=Path(__file__).resolve().parents[1],
        timeout=300,
    )
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and "Traceback" not in proc.stderr, lines
    assert lines[0].startswith("rag.search: error: ") and proc.stdout == ""
    assert names in lines[0]


@pytest.mark.parametrize(
    "cli,argv,names",
    [
        ("search", ["\udcff"], "argument 1 is not valid UTF-8: '\\xff'"),
        ("ingest", ["docs", "--index-dir", "caf\udce9"], "argument 3 (after --index-dir)"),
        ("ask", ["q", "--index=\udcff"], "argument 2 (of --index) is not valid UTF-8"),
    ],
)
def test_non_utf8_argument_is_one_line_exit_2(cli, argv, names, capsys):
    """Bytes that are not UTF-8 (Python holds them as lone surrogates) are refused before
    anything runs, naming the argument; they used to end in ``unexpected TypeError``."""
    line = one_line_failure(cli, argv, capsys)
    assert names in line and "unexpected" not in line


def test_non_utf8_argument_from_a_real_shell(tmp_path):
    """``python -m rag.search $'\\xff'`` and a folder argument with a Latin-1 byte, as a shell
    passes them (bytes)."""
    env = {**os.environ, "RAG_HOME": str(rag_home())}
    for argv in ([b"rag.search", b"\xff"], [b"rag.ingest", os.fsencode(tmp_path) + b"/caf\xe9"]):
        proc = subprocess.run(
            [sys.executable, "-m", *argv],
            capture_output=True,
            env=env,
            cwd=Path(__file__).resolve().parents[1],
            timeout=300,
        )
        lines = proc.stderr.decode("utf-8", "replace").strip().splitlines()
        assert proc.returncode == 2 and len(lines) == 1, lines
        assert "is not valid UTF-8" in lines[0] and proc.stdout == b""
