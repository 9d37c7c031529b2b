"""kill -9 during ingest: the index always loads, and the next run ends with exactly the content
of an uninterrupted run. The ingest runs in a subprocess that SIGKILLs itself at a named
checkpoint (``RAG_INGEST_CRASH_AT``, a test hook in rag.ingest), so every moment is reached
deterministically; one slow test also kills at random times."""

from __future__ import annotations

import contextlib
import os
import random
import signal
import subprocess
import sys
import time

import pytest
from ingest_support import DOCS, write_docs
from test_ingest import index_state

from indexes import open_index
from rag.ingest import CRASH_ENV, ingest
from rag.retrieval.retriever import Retriever
from rag.storage.manifest import kept_chunk_ids, open_generation, read_chunks
from rag.storage.paths import indexes_dir, list_indexes

FAST = ["mid-encode"]
SLOW = [
    "after-bm25",
    "after-rename",
    "after-encode",
    "after-vectors",
    "before-publish",
    "after-pointer",
]


def run_cli(docs, index, encoder, crash=None, backend="faiss", wait=True, extra=()):
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop(CRASH_ENV, None)
    if crash:
        env[CRASH_ENV] = crash
    cmd = [
        sys.executable,
        "-m",
        "rag.ingest",
        str(docs),
        "--index",
        index,
        "--encoder",
        str(encoder),
        "--backend",
        backend,
        "--no-progress",
        *extra,
    ]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    if not wait:
        return proc
    _, err = proc.communicate(timeout=300)
    return proc.returncode, err.decode()


def change(docs):
    """The edit the interrupted run is applying: one file changed, one deleted, one added."""
    (docs / "notes.txt").write_text(
        DOCS["notes.txt"] + "\nOkapis live in forests.\n", encoding="utf-8"
    )
    (docs / "errors.rst").unlink()
    (docs / "new.md").write_text("# New\n\nA new page about parsing arguments.\n", encoding="utf-8")


def check_loads(index):
    r = Retriever.from_settings(index)
    assert len(r) > 0
    assert r.search("zebra stripes", k=3, mode="hybrid")


def crash_then_rerun(tmp_path, tiny_mlm_dir, point, backend="faiss"):
    """Returns the crashed index's name (unique per test: RAG_HOME is shared by the session)."""
    docs = write_docs(tmp_path / "docs")
    enc = str(tiny_mlm_dir)
    name, ref = f"crash-{tmp_path.name}", f"ref-{tmp_path.name}"
    ingest([docs], index=name, encoder=enc, backend=backend, progress=False)
    before = index_state(name)
    change(docs)
    code, err = run_cli(docs, name, enc, crash=point, backend=backend)
    assert code == -signal.SIGKILL, err[-2000:]
    check_loads(name)
    after_crash = index_state(name)
    ingest([docs], index=ref, encoder=enc, backend=backend, progress=False)
    reference = index_state(ref)
    assert after_crash in (before, reference)  # the old index, or (after the commit) the new one
    ingest([docs], index=name, progress=False)
    assert index_state(name) == reference
    check_loads(name)
    return name


@pytest.mark.parametrize("point", FAST + [pytest.param(p, marks=pytest.mark.slow) for p in SLOW])
def test_kill9_at_checkpoint(tmp_path, tiny_mlm_dir, point):
    crash_then_rerun(tmp_path, tiny_mlm_dir, point)


@pytest.mark.slow  # four ingest processes: ~30 s on a 2-core AVX2 CPU
def test_sigterm_stops_an_ingest_cleanly(tmp_path, tiny_mlm_dir):
    """SIGTERM (a service manager or container stopping it) ends an ingest through its
    clean-ups, with one line and exit 143: a first run removes the folder it created, so no
    folder holding only a ``.lock`` is left to be listed as an index; on an existing index the
    live generation stays as it was and the lock is free for the next run."""
    docs = write_docs(tmp_path / "docs")
    enc, name = str(tiny_mlm_dir), f"term-{tmp_path.name}"
    for point in ("mid-encode", "before-publish"):
        code, err = run_cli(docs, name, enc, crash=f"{point}:TERM")
        assert code == 143, err[-2000:]
        assert err.strip().splitlines()[-1] == (
            "rag.ingest: error: terminated (SIGTERM); stopped cleanly"
        )
        assert "Traceback" not in err and not (indexes_dir() / name).exists()
    ingest([docs], index=name, encoder=enc, progress=False)
    before = index_state(name)
    change(docs)
    code, err = run_cli(docs, name, enc, crash="before-publish:TERM")
    assert code == 143 and "Traceback" not in err, err[-2000:]
    assert index_state(name) == before and name in list_indexes()
    ingest([docs], index=name, progress=False)  # not blocked: the lock went with the process
    assert index_state(name) != before


def test_a_killed_first_ingest_is_no_index_and_blocks_nothing(tmp_path, tiny_mlm_dir):
    """kill -9 runs no clean-up: the first run's folder stays with its ``.lock``. It is not
    listed (no published generation), and the dead process's lock does not hold the next run
    back (an flock, released by the kernel with the process; no pid file to go stale)."""
    docs = write_docs(tmp_path / "docs")
    enc, name = str(tiny_mlm_dir), f"killed-{tmp_path.name}"
    code, err = run_cli(docs, name, enc, crash="mid-encode")
    assert code == -signal.SIGKILL, err[-2000:]
    root = indexes_dir() / name
    assert (root / ".lock").exists() and not (root / "CURRENT").exists()
    assert name not in list_indexes()
    ingest([docs], index=name, encoder=enc, progress=False)
    assert name in list_indexes()
    check_loads(name)


@pytest.mark.slow
@pytest.mark.parametrize("point", ["after-vectors", "after-pointer"])
def test_kill9_chroma(tmp_path, tiny_mlm_dir, point):
    name = crash_then_rerun(tmp_path, tiny_mlm_dir, point, backend="chroma")
    root, gen, manifest = open_generation(name)
    col = open_index(
        "chroma", root / "chroma", manifest.encoder["dim"], collection=manifest.collection
    )
    # the live generation's ids, plus the previous generation's (kept for readers still on it)
    assert set(read_chunks(gen)) <= set(col.ids())
    assert sorted(col.ids()) == sorted(kept_chunk_ids(root))


@pytest.mark.slow
def test_kill9_at_random_moments(tmp_path, tiny_mlm_dir):
    docs = write_docs(tmp_path / "docs")
    for i in range(30):
        (docs / f"extra{i}.md").write_text(f"# Page {i}\n\n" + f"Some words about topic {i}. " * 40)
    enc = str(tiny_mlm_dir)
    ingest([docs], index="ref-random", encoder=enc, progress=False)
    reference = index_state("ref-random")
    rng = random.Random(0)
    for _ in range(4):
        proc = run_cli(docs, "rand", enc, wait=False)
        time.sleep(rng.uniform(1.0, 12.0))
        proc.kill()
        proc.wait()
        # killed before the first commit: there is no index yet, which is consistent
        with contextlib.suppress(FileNotFoundError):
            check_loads("rand")
    ingest([docs], index="rand", encoder=enc, progress=False)
    assert index_state("rand") == reference
