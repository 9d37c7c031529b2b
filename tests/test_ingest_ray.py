"""``rag.ingest --engine ray``: on a local Ray cluster (127.0.0.1, 2 CPUs) it builds the index the
local engine builds (same chunk ids, same vectors within float tolerance), a second run is
incremental without touching Ray, and changes, deletions and bad files go through the same
publication path."""

from __future__ import annotations

import os
import signal

import numpy as np
import pytest
from ingest_support import DOCS, write_docs
from test_ingest import index_state
from test_ingest_crash import change, check_loads, run_cli

from indexes import open_index
from rag.ingest import ingest
from rag.manifest import open_generation, read_chunks

ray = pytest.importorskip("ray")

# starts a Ray cluster on loopback; about 25 s here beside a heavy job, so not marked slow
pytestmark = pytest.mark.server


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


def _state(name: str) -> tuple[dict, dict, dict[str, np.ndarray]]:
    """(chunks by id, manifest sources as (hash, chunk ids), vectors by id) of an index."""
    _, gen, manifest = open_generation(name)
    chunks = {i: c.to_dict() for i, c in read_chunks(gen).items()}
    sources = {k: (v.hash, list(v.chunk_ids)) for k, v in manifest.sources.items()}
    store = open_index("faiss", gen / "vectors", manifest.encoder["dim"])
    ids = sorted(store.ids())
    assert ids == sorted(chunks)
    return chunks, sources, dict(zip(ids, store.vectors(ids)))


def _same(a: str, b: str) -> None:
    ca, sa, va = _state(a)
    cb, sb, vb = _state(b)
    assert ca == cb and sa == sb  # same chunk ids, texts, offsets, per-file order
    for i, v in va.items():
        assert float(np.dot(v, vb[i])) >= 0.9999, i


def test_ray_engine_matches_local_and_is_incremental(tmp_path, tiny_mlm_dir, local_ray):
    docs = write_docs(tmp_path / "docs")
    enc = str(tiny_mlm_dir)
    local = ingest([docs], index="local", encoder=enc, progress=False)
    first = ingest([docs], index="viaray", encoder=enc, progress=False, engine="ray")
    assert first.ok and len(first.added) == len(DOCS)
    assert first.chunks == first.chunks_embedded == local.chunks > 0
    assert "ray_chunk_embed" in first.timings
    _same("local", "viaray")

    again = ingest([docs], index="viaray", progress=False, engine="ray")
    assert again.chunks_embedded == 0 and len(again.unchanged) == len(DOCS)
    assert again.generation == first.generation  # nothing changed: nothing published

    (docs / "notes.txt").write_text(DOCS["notes.txt"] + "\nOkapis are shy.\n", encoding="utf-8")
    (docs / "errors.rst").unlink()
    (docs / "binary.txt").write_bytes(b"\x00\x01binary\x00")
    for name, engine in (("local", "local"), ("viaray", "ray")):
        r = ingest([docs], index=name, progress=False, engine=engine)
        assert [os.path.basename(p) for p in r.updated] == ["notes.txt"]
        assert [os.path.basename(p) for p in r.removed] == ["errors.rst"]
        assert [os.path.basename(p) for p, _ in r.failures] == ["binary.txt"]
        assert "binary" in r.failures[0][1]
    _same("local", "viaray")


def test_ray_engine_refusals(tmp_path, tiny_mlm_dir, local_ray):
    docs = write_docs(tmp_path / "docs")
    with pytest.raises(ValueError, match="CPUs"):  # 2 actors + chunking need 3 CPUs
        ingest([docs], index="big", encoder=str(tiny_mlm_dir), engine="ray", workers=2)
    with pytest.raises(ValueError, match="--engine ray"):
        ingest([docs], index="big", encoder=str(tiny_mlm_dir), workers=2)


@pytest.mark.slow  # two driver subprocesses join the cluster: about 30 s more
def test_kill9_of_ray_driver_mid_ingest(tmp_path, tiny_mlm_dir, local_ray):
    """A driver killed while collecting the actors' vectors leaves the previous generation
    loadable; the next run (through the same cluster, by address) finishes the job."""
    docs = write_docs(tmp_path / "docs")
    enc = str(tiny_mlm_dir)
    ingest([docs], index="rk", encoder=enc, progress=False, engine="ray")
    before = index_state("rk")
    change(docs)
    address = ray.get_runtime_context().gcs_address
    extra = ["--engine", "ray", "--ray-address", address]
    code, err = run_cli(docs, "rk", enc, crash="mid-encode", extra=extra)
    assert code == -signal.SIGKILL, err[-2000:]
    check_loads("rk")
    assert index_state("rk") == before
    ingest([docs], index="rk-ref", encoder=enc, progress=False)
    code, err = run_cli(docs, "rk", enc, extra=extra)
    assert code == 0, err[-2000:]
    assert index_state("rk") == index_state("rk-ref")
