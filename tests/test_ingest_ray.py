"""``rag.ingest --engine ray``: on a local Ray cluster (127.0.0.1, 2 CPUs) it builds the index the
local engine builds (same chunk ids, same vectors within float tolerance), a second run is
incremental without touching Ray, and changes, deletions and bad files go through the same
publication path; with no cluster given it starts its own with the CPUs ``--workers`` needs."""

from __future__ import annotations

import os
import signal

import numpy as np
import pytest
from ingest_support import DOCS, write_docs
from test_ingest_crash import change, check_loads, run_cli

from benchmarks.ingest_engines import index_state
from rag.ingest import ingest

ray = pytest.importorskip("ray")

# starts Ray clusters on loopback: ~90 s for the file on a 2-core AVX2 CPU (make test-slow)
pytestmark = [pytest.mark.server, pytest.mark.slow]


@pytest.fixture(scope="module")
def local_ray():
    """A Ray cluster of this machine only: loopback address, 2 CPUs, no dashboard."""
    ray.init(
        num_cpus=2,
        _node_ip_address="127.0.0.1",
        include_dashboard=False,
        log_to_driver=False,
        configure_logging=False,
    )
    yield
    ray.shutdown()


def _same(a: str, b: str) -> None:
    ca, sa, va = index_state(a)
    cb, sb, vb = index_state(b)
    assert ca == cb and sa == sb  # same chunk ids, texts, offsets, per-file order
    for i, v in va.items():
        assert float(np.dot(v, vb[i])) >= 0.9999, i


@pytest.fixture(params=["faiss", "chroma-server"])
def where(request) -> dict:
    """Where the vectors go: a FAISS file, or a real `chroma run` server on loopback."""
    if request.param == "faiss":
        return {"backend": "faiss"}
    return {"backend": "chroma", "chroma_url": request.getfixturevalue("chroma_server")}


def test_own_cluster_declares_the_cpus_the_workers_need(tmp_path, tiny_mlm_dir, monkeypatch):
    """No cluster given: the ingest starts a local one with workers + 1 logical CPUs when the
    machine has fewer cores (here it is told it has 2: README's `--workers 2` on two cores),
    says so in a note, and shuts it down after. First in the file: no shared cluster yet."""
    from rag.ingest import ray_engine

    if ray.is_initialized():  # run out of order: this test needs the cluster to be its own
        ray.shutdown()
    monkeypatch.setattr(ray_engine, "machine_cpus", lambda: 2)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    docs = write_docs(tmp_path / "docs")
    r = ingest(
        [docs], index="own", encoder=str(tiny_mlm_dir), progress=False, engine="ray", workers=2
    )
    assert r.ok and r.chunks_embedded == r.chunks > 0
    assert [n for n in r.notes if n.startswith("ray:")] == [
        "ray: started a local cluster with 3 logical CPUs for --workers 2 (one per encoder "
        "actor, one for chunking) on 2 cores; they share the cores"
    ]
    assert not ray.is_initialized()  # the run started it, the run stopped it
    assert ray_engine.local_cluster_cpus(1, 16) == 16  # enough cores: the machine's count


def test_ray_engine_matches_local_and_is_incremental(tmp_path, tiny_mlm_dir, local_ray, where):
    docs = write_docs(tmp_path / "docs")
    enc, tag = str(tiny_mlm_dir), where["backend"]
    local = ingest([docs], index=f"local-{tag}", encoder=enc, progress=False, **where)
    first = ingest([docs], index=f"ray-{tag}", encoder=enc, progress=False, engine="ray", **where)
    assert first.ok and len(first.added) == len(DOCS)
    assert first.chunks == first.chunks_embedded == local.chunks > 0
    assert "ray_chunk_embed" in first.timings
    _same(f"local-{tag}", f"ray-{tag}")

    again = ingest([docs], index=f"ray-{tag}", progress=False, engine="ray")
    assert again.chunks_embedded == 0 and len(again.unchanged) == len(DOCS)
    assert again.generation == first.generation  # nothing changed: nothing published

    (docs / "notes.txt").write_text(DOCS["notes.txt"] + "\nOkapis are shy.\n", encoding="utf-8")
    (docs / "errors.rst").unlink()
    (docs / "binary.txt").write_bytes(b"\x00\x01binary\x00")
    for name, engine in ((f"local-{tag}", "local"), (f"ray-{tag}", "ray")):
        r = ingest([docs], index=name, progress=False, engine=engine)
        assert [os.path.basename(p) for p in r.updated] == ["notes.txt"]
        assert [os.path.basename(p) for p in r.removed] == ["errors.rst"]
        assert [os.path.basename(p) for p, _ in r.failures] == ["binary.txt"]
        assert "binary" in r.failures[0][1]
        assert 0 < r.chunks_embedded < r.chunks  # only the changed file is embedded again
    _same(f"local-{tag}", f"ray-{tag}")


def test_ray_engine_refusals(tmp_path, tiny_mlm_dir, local_ray):
    docs = write_docs(tmp_path / "docs")
    with pytest.raises(ValueError, match="CPUs"):  # 2 actors + chunking need 3 CPUs
        ingest([docs], index="big", encoder=str(tiny_mlm_dir), engine="ray", workers=2)
    with pytest.raises(ValueError, match="--engine ray"):
        ingest([docs], index="big", encoder=str(tiny_mlm_dir), workers=2)


@pytest.mark.slow  # two driver subprocesses join the cluster: about 30 s more per backend
def test_kill9_of_ray_driver_mid_ingest(tmp_path, tiny_mlm_dir, local_ray, where):
    """A driver killed while collecting the actors' vectors leaves the previous generation
    loadable; the next run (through the same cluster, by address) finishes the job."""
    docs = write_docs(tmp_path / "docs")
    enc, tag = str(tiny_mlm_dir), where["backend"]
    ingest([docs], index=f"rk-{tag}", encoder=enc, progress=False, engine="ray", **where)
    before = index_state(f"rk-{tag}")
    change(docs)
    address = ray.get_runtime_context().gcs_address
    extra = ["--engine", "ray", "--ray-address", address]
    if "chroma_url" in where:
        extra += ["--chroma-url", where["chroma_url"]]
    backend = where["backend"]
    code, err = run_cli(docs, f"rk-{tag}", enc, crash="mid-encode", backend=backend, extra=extra)
    assert code == -signal.SIGKILL, err[-2000:]
    check_loads(f"rk-{tag}")
    assert _comparable(index_state(f"rk-{tag}")) == _comparable(before)
    ingest([docs], index=f"rk-ref-{tag}", encoder=enc, progress=False, **where)
    code, err = run_cli(docs, f"rk-{tag}", enc, backend=backend, extra=extra)
    assert code == 0, err[-2000:]
    _same(f"rk-{tag}", f"rk-ref-{tag}")


def _comparable(state: tuple[dict, dict, dict[str, np.ndarray]]) -> tuple:
    chunks, sources, vectors = state
    return chunks, sources, {i: np.round(v, 5).tolist() for i, v in vectors.items()}


def test_joining_a_cluster_uses_its_token(tmp_path):
    """A driver given --ray-address switches Ray's client to token mode when a token is at hand
    (what `ray start` writes), and leaves an explicit RAY_AUTH_MODE alone."""
    from rag.ingest.ray_engine import use_cluster_token

    env: dict[str, str] = {}
    assert not use_cluster_token(env, home=tmp_path) and "RAY_AUTH_MODE" not in env
    (tmp_path / ".ray").mkdir()
    (tmp_path / ".ray" / "auth_token").write_text("t" * 64)
    assert use_cluster_token(env, home=tmp_path) and env["RAY_AUTH_MODE"] == "token"
    explicit = {"RAY_AUTH_MODE": "disabled"}
    assert (
        not use_cluster_token(explicit, home=tmp_path) and explicit["RAY_AUTH_MODE"] == "disabled"
    )
    given = {"RAY_AUTH_TOKEN_PATH": str(tmp_path / "tok")}
    assert use_cluster_token(given, home=tmp_path / "nowhere")
