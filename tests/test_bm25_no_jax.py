"""BM25 never touches an accelerator (issue 44): with a ``jax`` package importable, bm25s would
run ``jax.lax.top_k`` at import and for every search, and JAX's first op preallocates 75% of a
GPU's memory. A fake ``jax`` on ``PYTHONPATH`` records each import (with the value of
``XLA_PYTHON_CLIENT_PREALLOCATE`` at that moment) and each ``top_k`` call; the real command
lines then ingest and search a folder, and a program that imported JAX itself keeps it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from ingest_support import write_docs

REPO = Path(__file__).resolve().parents[1]

FAKE_INIT = """
import json, os
with open(os.environ["FAKE_JAX_LOG"], "a") as f:
    f.write(json.dumps({"event": "import", "prealloc": os.environ.get("XLA_PYTHON_CLIENT_PREALLOCATE")}) + "\\n")
"""
FAKE_LAX = """
import json, os
def top_k(x, k):
    with open(os.environ["FAKE_JAX_LOG"], "a") as f:
        f.write(json.dumps({"event": "top_k"}) + "\\n")
    raise RuntimeError("fake jax: top_k must not be called")
"""


def fake_jax(tmp_path: Path) -> tuple[dict[str, str], Path]:
    """An environment whose ``import jax`` finds the fake, and the log it writes."""
    pkg = tmp_path / "fakejax" / "jax"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(FAKE_INIT, encoding="utf-8")
    (pkg / "lax.py").write_text(FAKE_LAX, encoding="utf-8")
    log = tmp_path / "jax.log"
    env = {**os.environ, "FAKE_JAX_LOG": str(log), "PYTHONUNBUFFERED": "1"}
    env.pop("XLA_PYTHON_CLIENT_PREALLOCATE", None)
    env["PYTHONPATH"] = os.pathsep.join([str(pkg.parent), str(REPO), env.get("PYTHONPATH", "")])
    return env, log


def events(log: Path) -> list[dict]:
    if not log.exists():
        return []
    return [json.loads(line) for line in log.read_text(encoding="utf-8").splitlines()]


def run(cmd: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc


def test_the_fake_jax_is_what_bm25s_would_call(tmp_path):
    """The probe works: bm25s imported as is (not through rag) calls the fake's top_k, so the
    tests below would see a call if rag let one through."""
    env, log = fake_jax(tmp_path)
    proc = subprocess.run(
        [sys.executable, "-c", "import bm25s"], env=env, capture_output=True, text=True
    )
    assert proc.returncode != 0 and "top_k must not be called" in proc.stderr
    assert [e["event"] for e in events(log)] == ["import", "top_k"]


def test_ingest_and_search_never_call_jax(tmp_path, tiny_mlm_dir):
    env, log = fake_jax(tmp_path)
    env["RAG_HOME"] = str(tmp_path / "home")
    docs = write_docs(tmp_path / "docs")
    ingest = [sys.executable, "-m", "rag.ingest", str(docs), "--index", "nojax"]
    run([*ingest, "--encoder", str(tiny_mlm_dir), "--no-progress"], env)
    for mode in ("bm25", "hybrid"):
        out = run(
            [sys.executable, "-m", "rag.search", "zebra stripes", "--index", "nojax"]
            + ["--mode", mode, "--json"],
            env,
        ).stdout
        assert "notes.txt" in out  # BM25 ran and found the page
    assert not [e for e in events(log) if e["event"] == "top_k"]
    # if anything imported JAX at all, the preallocation was already off
    assert all(e["prealloc"] == "false" for e in events(log) if e["event"] == "import")


def test_bm25_in_a_program_that_uses_jax(tmp_path):
    """A program that imported JAX before rag keeps its module; BM25 still searches on numpy;
    a value the user set for the preallocation is left as it is."""
    env, log = fake_jax(tmp_path)
    env["XLA_PYTHON_CLIENT_PREALLOCATE"] = "true"
    code = (
        "import jax, jax.lax, sys\n"
        "from rag.retrieval.bm25 import BM25Index\n"
        "assert sys.modules['jax'] is jax and sys.modules['jax.lax'] is jax.lax\n"
        "idx = BM25Index(['a', 'b'], ['zebras have stripes', 'giraffes are tall'])\n"
        "print(idx.search('zebra stripes', k=2))\n"
        "import os; print(os.environ['XLA_PYTHON_CLIENT_PREALLOCATE'])\n"
    )
    out = run([sys.executable, "-c", code], env).stdout.splitlines()
    assert out[0].startswith("[('a',") and out[1] == "true"
    assert [e["event"] for e in events(log)] == ["import"]
