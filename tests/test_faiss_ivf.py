"""FAISS IVF and GPU (indexes/faiss_index.py): IVF recall against exact search, its options
persisted with the index, deletes, the choice ``auto`` makes by size, and the GPU path (skipped
without faiss-gpu and a GPU). Small, seeded data: the whole file runs in a few seconds on CPU."""

from __future__ import annotations

import faiss
import numpy as np
import pytest

from indexes import VectorIndexError, load_generation, open_for_generation, open_index
from indexes.faiss_index import (
    DEFAULT_NPROBE,
    KINDS,
    FaissIndex,
    gpu_available,
    ivf_nlist,
    ivf_training_sample,
)
from rag.ingest.config import FAISS_KINDS

DIM = 32
N = 5_000


def clustered(n: int = N, dim: int = DIM, centres: int = 50, seed: int = 0) -> np.ndarray:
    """Unit vectors around ``centres`` random directions: structure IVF's lists can follow."""
    rng = np.random.default_rng(seed)
    c = rng.normal(size=(centres, dim))
    v = c[rng.integers(0, centres, n)] + 0.5 * rng.normal(size=(n, dim))
    return (v / np.linalg.norm(v, axis=1, keepdims=True)).astype(np.float32)


def near(vecs: np.ndarray, n: int = 100, seed: int = 1) -> np.ndarray:
    """Queries: ``n`` stored vectors, perturbed and renormalised."""
    rng = np.random.default_rng(seed)
    q = vecs[rng.choice(len(vecs), n, replace=False)] + 0.1 * rng.normal(size=(n, vecs.shape[1]))
    return (q / np.linalg.norm(q, axis=1, keepdims=True)).astype(np.float32)


def recall(got: list[list[tuple[str, float]]], exact: list[list[tuple[str, float]]]) -> float:
    return float(
        np.mean([len({i for i, _ in g} & {i for i, _ in e}) / len(e) for g, e in zip(got, exact)])
    )


@pytest.fixture(scope="module")
def data() -> tuple[list[str], np.ndarray, np.ndarray]:
    vecs = clustered()
    return [f"v{i}" for i in range(N)], vecs, near(vecs)


def filled(ids, vecs, path=None, gpu: str = "no", **opts) -> FaissIndex:
    ix = FaissIndex(path, DIM, gpu=gpu, **opts)
    ix.add(ids, vecs)
    return ix


def test_nlist_and_sample():
    assert [ivf_nlist(n) for n in (0, 1, 38, 39, 78, 5_000, 1_000_000)] == [
        1,
        1,
        1,
        1,
        2,
        128,
        4000,
    ]
    vecs = clustered(3_000)
    assert ivf_training_sample(vecs, 100) is vecs  # 3,000 <= 256 * 100: all of them
    a, b = ivf_training_sample(vecs, 4), ivf_training_sample(vecs, 4)
    assert a.shape == (1024, DIM) and np.array_equal(a, b)  # seeded: the same rows each time
    assert set(KINDS) == set(FAISS_KINDS)  # rag.ingest.config repeats the list without faiss


def test_ivf_recall_against_flat(data):
    ids, vecs, q = data
    exact = filled(ids, vecs, kind="flat").search(q, 10)
    ivf = filled(ids, vecs, kind="ivf")
    index = ivf._faiss()
    assert isinstance(index, faiss.IndexIVFFlat)
    assert (index.nlist, index.nprobe) == (ivf_nlist(N), DEFAULT_NPROBE)
    assert recall(ivf.search(q, 10), exact) >= 0.9
    # every list probed: exhaustive, so the same top-1 (and scores) as exact search
    full = filled(ids, vecs, kind="ivf", nprobe=10_000)
    assert full._faiss().nprobe == ivf_nlist(N)  # clamped to nlist
    got = full.search(q, 10)
    assert [r[0][0] for r in got] == [r[0][0] for r in exact]
    assert np.allclose([s for r in got for _, s in r], [s for r in exact for _, s in r], atol=1e-5)
    # and nprobe is really applied: one list misses some neighbours
    assert recall(filled(ids, vecs, kind="ivf", nprobe=1).search(q, 10), exact) < 0.99


def test_ivf_save_load_keeps_kind_and_nprobe(data, tmp_path):
    ids, vecs, q = data
    ix = filled(ids, vecs, tmp_path / "ix", kind="ivf", nprobe=8)
    before = ix.search(q, 10)
    ix.commit()
    ix.close()
    again = FaissIndex(tmp_path / "ix", DIM, gpu="no")  # no kind given: the stored one
    assert (again.kind, again.nprobe, again.count()) == ("ivf", 8, N)
    assert again.search(q, 10) == before  # re-trained from the same vectors, same seed
    assert isinstance(again._faiss(), faiss.IndexIVFFlat) and again._faiss().nprobe == 8
    flat = FaissIndex(tmp_path / "ix", DIM, kind="flat", gpu="no")  # a kind given wins
    assert isinstance(flat._faiss(), faiss.IndexFlatIP)


def test_file_without_options_keeps_its_graph(tmp_path):
    """A faiss.npz written before the options were stored: a graph means its writer chose HNSW."""
    vecs = clustered(300)
    ix = filled([str(i) for i in range(300)], vecs, tmp_path / "ix", kind="hnsw")
    ix.commit()
    with np.load(tmp_path / "ix" / "faiss.npz") as z:
        old = {k: z[k] for k in z.files if k != "options"}
    np.savez(tmp_path / "ix" / "faiss.npz", **old)
    again = FaissIndex(tmp_path / "ix", DIM, gpu="no")
    assert again.kind == "hnsw" and isinstance(again._index, faiss.IndexHNSWFlat)
    assert again.search(vecs[3:4], 1)[0][0][0] == "3"


def test_generation_searches_with_its_stored_kind(tmp_path):
    vecs = clustered(200)
    root = tmp_path / "index"
    (staging := root / "gen-000001").mkdir(parents=True)
    ix = open_for_generation("faiss", root, None, staging, DIM, kind="ivf", nprobe=2)
    ix.stage_changes([], [str(i) for i in range(200)], vecs)
    live = load_generation("faiss", root, staging, DIM)  # a reader names no kind
    assert (live.kind, live.nprobe) == ("ivf", 2)
    assert live.search(vecs[7:8], 1)[0][0][0] == "7"
    (nxt := root / "gen-000002").mkdir()
    again = open_for_generation("faiss", root, staging, nxt, DIM, kind=None)  # an ingest
    assert (again.kind, again.nprobe) == ("ivf", 2)  # without --faiss-kind keeps them


def test_delete_then_search_never_returns_deleted(data):
    ids, vecs, _ = data
    ix = filled(ids, vecs, kind="ivf")
    ix.search(vecs[:1], 1)  # built once before the delete: the delete must invalidate it
    gone = set(ids[::5])
    ix.delete(sorted(gone))
    assert ix.count() == N - len(gone)
    rows = ix.search(vecs[::5][:200], 50)  # the deleted vectors themselves as queries
    assert all(len(r) == 50 for r in rows)
    assert not {i for r in rows for i, _ in r} & gone


def test_empty_and_tiny_ivf():
    ix = FaissIndex(None, DIM, kind="ivf", gpu="no")
    assert ix.search(clustered(1), 3) == [[]]
    ix.add(["a", "b"], clustered(2))  # below 39 points: one list, exact
    assert [i for i, _ in ix.search(clustered(2)[1:], 2)[0]] == ["b", "a"]


def test_auto_by_size(data):
    ids, vecs, _ = data
    small = FaissIndex(None, DIM, gpu="no", hnsw_threshold=N + 1)
    small.add(ids, vecs)
    assert isinstance(small._faiss(), faiss.IndexFlatIP)
    large = FaissIndex(None, DIM, gpu="no", hnsw_threshold=N)
    assert large.kind == "auto" and large._choice(N) == "hnsw"  # CPU: HNSW, as before IVF
    large.use_gpu = True  # what a GPU would make of it (nothing is built here)
    assert (large._choice(N), large._choice(N - 1)) == ("ivf", "flat")
    explicit = FaissIndex(None, DIM, kind="hnsw", gpu="no")
    explicit.use_gpu = True
    assert explicit._choice(10) == "hnsw"  # HNSW stays on the CPU


def test_bad_options_are_named():
    with pytest.raises(ValueError, match="kind must be one of auto, flat, hnsw, ivf, not 'ivfpq'"):
        FaissIndex(None, DIM, kind="ivfpq")
    with pytest.raises(ValueError, match="nprobe must be at least 1"):
        FaissIndex(None, DIM, nprobe=0)
    with pytest.raises(ValueError, match="gpu must be one of auto, yes, no"):
        FaissIndex(None, DIM, gpu="maybe")


@pytest.mark.skipif(gpu_available(), reason="checks the error raised without a GPU")
def test_gpu_yes_without_a_gpu_says_what_to_install(tmp_path):
    with pytest.raises(VectorIndexError, match=r"gpu='yes'.*pip install -e '\.\[gpu\]'"):
        open_index("faiss", tmp_path / "ix", DIM, gpu="yes")
    assert FaissIndex(None, DIM).use_gpu is False  # auto: CPU, no error


@pytest.mark.skipif(not gpu_available(), reason="faiss-gpu and a GPU are needed")
class TestGpu:
    """Flat and IVF built and searched on the GPU give the CPU's results within 1e-4."""

    @staticmethod
    def same(gpu_rows, cpu_rows) -> None:
        for g, c in zip(gpu_rows, cpu_rows):
            assert np.allclose([s for _, s in g], [s for _, s in c], atol=1e-4)
            # ids agree except where scores tie within the tolerance
            assert g[0][0] == c[0][0] or abs(g[0][1] - c[0][1]) < 1e-4

    def test_flat_on_gpu(self, data):
        ids, vecs, q = data
        gpu = filled(ids, vecs, kind="flat", gpu="yes")
        assert "Gpu" in type(gpu._faiss()).__name__
        self.same(gpu.search(q, 10), filled(ids, vecs, kind="flat").search(q, 10))

    def test_ivf_on_gpu(self, data):
        ids, vecs, q = data
        exact = filled(ids, vecs, kind="flat").search(q, 10)
        gpu = filled(ids, vecs, kind="ivf", gpu="yes", nprobe=10_000)
        assert "Gpu" in type(gpu._faiss()).__name__
        self.same(gpu.search(q, 10), exact)  # every list probed: exact on both
        approx = filled(ids, vecs, kind="ivf", gpu="yes")
        assert recall(approx.search(q, 10), exact) >= 0.9
        res = approx._gpu_res
        approx.delete(ids[:10])  # a rebuild reuses the index's one StandardGpuResources
        approx.search(q, 1)
        assert approx._gpu_res is res
