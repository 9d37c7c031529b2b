"""One contract for every vector index backend: FAISS (its default kind, and IVF), embedded
Chroma, and a real Chroma server started on 127.0.0.1 for the session (``chroma run``, the
``chroma_server`` fixture of conftest.py), stopped at the end."""

from __future__ import annotations

import ast
import shutil
from pathlib import Path

import numpy as np
import pytest

from indexes import (
    BACKENDS,
    DEFAULT_BACKEND,
    VectorIndexError,
    load_generation,
    open_for_generation,
    open_index,
    resolve_backend,
    scratch_index,
)

DIM = 16


_counter = iter(range(10**6))


# parametrised backends: the backend, and the options every index of it is opened with
VARIANTS = {
    "faiss": ("faiss", {}),
    "faiss-ivf": ("faiss", {"kind": "ivf"}),  # an approximate kind meets the same contract
    "chroma": ("chroma", {}),
    "chroma-server": ("chroma", {}),
}
SERVER = pytest.param("chroma-server", marks=pytest.mark.server)


@pytest.fixture(params=["faiss", "faiss-ivf", "chroma", SERVER])
def make_index(request, tmp_path):
    """A factory opening (or reopening) one index of the parametrised backend."""
    kind = request.param
    url = request.getfixturevalue("chroma_server") if kind == "chroma-server" else None
    collection = f"contract-{next(_counter)}"
    backend, opts = VARIANTS[kind]
    opened = []

    def make(dim: int = DIM):
        ix = open_index(
            backend, tmp_path / "ix", dim, chroma_url=url, collection=collection, **opts
        )
        opened.append(ix)
        return ix

    make.kind = kind
    yield make
    for ix in opened:
        ix.close()


def unit(rng, n: int, dim: int = DIM) -> np.ndarray:
    v = rng.normal(size=(n, dim)).astype(np.float32)
    return v / np.linalg.norm(v, axis=1, keepdims=True)


def test_backends_listed():
    assert set(BACKENDS) == {"faiss", "chroma"}
    with pytest.raises(VectorIndexError, match="unknown index backend"):
        open_index("nope", None, 4)


def test_add_search_count_ids(make_index):
    rng = np.random.default_rng(0)
    vecs = unit(rng, 40)
    ids = [f"id{i}" for i in range(40)]
    ix = make_index()
    assert ix.count() == 0
    assert ix.search(vecs[:2], 5) == [[], []]
    ix.add(ids, vecs, [{"source": f"s{i}", "heading_path": ["a", "b"]} for i in range(40)])
    assert ix.count() == 40 and sorted(ix.ids()) == sorted(ids)
    res = ix.search(vecs[:5], 3)
    assert [r[0][0] for r in res] == ids[:5]
    for row in res:
        assert len(row) == 3
        assert row[0][1] == pytest.approx(1.0, abs=1e-4)
        assert [s for _, s in row] == sorted((s for _, s in row), reverse=True)
    exact = vecs[7] @ vecs.T  # scores are inner products
    got = dict(ix.search(vecs[7:8], 40)[0])
    assert len(got) == 40
    for i, s in got.items():
        assert s == pytest.approx(float(exact[int(i[2:])]), abs=1e-4)
    assert len(ix.search(vecs[:1], 100)[0]) == 40
    order = ["id9", "id0", "id33"]  # the stored vectors come back in the order asked
    assert np.allclose(ix.vectors(order), vecs[[9, 0, 33]], atol=1e-6)
    assert ix.vectors([]).shape == (0, DIM)
    with pytest.raises(KeyError, match="nope"):
        ix.vectors(["id1", "nope"])


def test_upsert_delete_and_persist(make_index):
    rng = np.random.default_rng(1)
    vecs = unit(rng, 20)
    ids = [f"c{i}" for i in range(20)]
    ix = make_index()
    ix.add(ids, vecs)
    new = unit(rng, 1)
    ix.add(["c3"], new)  # replaces, never duplicates
    assert ix.count() == 20
    assert ix.search(new, 1)[0][0][0] == "c3"
    assert ix.search(vecs[3:4], 1)[0][0][0] != "c3" or ix.search(vecs[3:4], 1)[0][0][1] < 0.999
    ix.delete(["c0", "c1", "missing"])
    assert ix.count() == 18 and "c0" not in ix.ids()
    assert all(i not in ("c0", "c1") for i, _ in ix.search(vecs[:2], 18)[0])
    ix.commit()
    ix.close()
    again = make_index()
    assert again.count() == 18 and sorted(again.ids()) == sorted(ids[2:])
    assert again.search(vecs[5:6], 1)[0][0][0] == "c5"


def _brute_force(queries, vecs, ids, subset, k):
    """The ``k`` best of ``subset`` by exact inner product, per query: what a filtered search
    must return."""
    rows = [ids.index(i) for i in subset if i in ids]
    exact = queries @ vecs[rows].T
    return [[ids[rows[j]] for j in np.argsort(-row, kind="stable")[:k]] for row in exact]


def test_search_within_ids_equals_brute_force_over_them(make_index):
    """A filter pushed into the search (``ids``): the k best of those ids, exactly the ones a
    brute force over them finds, and k of them even where the unfiltered top k holds none."""
    rng = np.random.default_rng(7)
    vecs = unit(rng, 60)
    ids = [f"f{i}" for i in range(60)]
    ix = make_index()
    ix.add(ids, vecs)
    subset = ids[::3] + ["unknown"]  # 20 stored ids and one the index never saw
    queries = vecs[1:60:3][:4] + 0.01  # each nearest to an id outside the subset
    assert all(top[0][0] not in subset for top in ix.search(queries, 1))
    got = ix.search(queries, 5, ids=subset)
    assert [[i for i, _ in row] for row in got] == _brute_force(queries, vecs, ids, subset, 5)
    for row in got:
        for i, score in row:
            assert score == pytest.approx(
                float(queries[got.index(row)] @ vecs[ids.index(i)]), abs=1e-4
            )
    assert [len(r) for r in ix.search(queries, 100, ids=subset)] == [20] * 4
    assert ix.search(queries, 5, ids=[]) == [[]] * 4
    assert ix.search(queries, 5, ids=["unknown"]) == [[]] * 4


@pytest.mark.parametrize("kind", ["flat", "hnsw", "ivf"])
def test_faiss_filtered_search_through_the_id_selector(kind):
    """Past ``exact_subset_max`` ids a FAISS filter goes through the index with an
    IDSelectorBatch: the same hits as brute force over the subset (300 vectors: IVF's 7 lists
    are all probed, HNSW at efSearch 128 finds them all)."""
    rng = np.random.default_rng(8)
    vecs = unit(rng, 300)
    ids = [str(i) for i in range(300)]
    ix = open_index("faiss", None, DIM, kind=kind, exact_subset_max=0)
    ix.add(ids, vecs)
    subset = ids[::4]
    queries = unit(rng, 10)
    got = [[i for i, _ in row] for row in ix.search(queries, 5, ids=subset)]
    assert got == _brute_force(queries, vecs, ids, subset, 5)


def test_bad_shapes_rejected(make_index):
    ix = make_index()
    with pytest.raises(ValueError):
        ix.add(["a"], np.zeros((1, DIM + 1), np.float32))
    with pytest.raises(ValueError):
        ix.add(["a", "b"], np.zeros((1, DIM), np.float32))
    with pytest.raises(ValueError):
        ix.add(["a", "a"], np.zeros((2, DIM), np.float32))
    with pytest.raises(ValueError):
        ix.search(np.zeros((1, DIM - 1), np.float32), 1)


def test_faiss_hnsw_and_atomic_commit(tmp_path):
    rng = np.random.default_rng(2)
    vecs = unit(rng, 300)
    ids = [str(i) for i in range(300)]
    flat = open_index("faiss", tmp_path / "flat", DIM, kind="flat")
    hnsw = open_index("faiss", tmp_path / "hnsw", DIM, kind="hnsw")
    auto = open_index("faiss", None, DIM, hnsw_threshold=100)
    for ix in (flat, hnsw, auto):
        ix.add(ids, vecs)
    q = vecs[:20]
    top = [r[0][0] for r in flat.search(q, 1)]
    assert [r[0][0] for r in hnsw.search(q, 1)] == top
    assert [r[0][0] for r in auto.search(q, 1)] == top
    hnsw.commit()
    reopened = open_index("faiss", tmp_path / "hnsw", DIM, kind="hnsw")
    assert [r[0][0] for r in reopened.search(q, 1)] == top
    assert sorted(p.name for p in (tmp_path / "hnsw").iterdir()) == ["faiss.npz"]
    with pytest.raises(VectorIndexError, match="16-d"):
        open_index("faiss", tmp_path / "hnsw", 8)
    shutil.rmtree(tmp_path / "hnsw")


# ---------------------------------------------------------------------- generations (rag.ingest)


@pytest.fixture(params=["faiss", "faiss-ivf", "chroma", SERVER])
def generation_backend(request):
    """(backend, options) for the generation methods: one set of options for every backend
    (``load_generation`` gets them too, and FAISS must still search with the kind it stored)."""
    url = request.getfixturevalue("chroma_server") if request.param == "chroma-server" else None
    backend, opts = VARIANTS[request.param]
    kind = opts.get("kind", "flat")
    return backend, {"kind": kind, "chroma_url": url, "collection": f"gen-{next(_counter)}"}


def _publish(staging: Path) -> Path:
    """What rag.storage.manifest.publish_generation does to the folder, minus CURRENT."""
    final = staging.with_name(staging.name.lstrip(".").split(".tmp")[0])
    staging.rename(final)
    return final


def test_generation_lifecycle(generation_backend, tmp_path):
    """Open for the next generation, stage, publish, reconcile, load: the live generation stays
    whole until the next is published, and a crashed run's writes never reach a reader."""
    backend, opts = generation_backend
    rng = np.random.default_rng(3)
    vecs = unit(rng, 12)
    ids = [f"g{i}" for i in range(12)]
    root = tmp_path / "index"
    (staging := root / ".gen-000001.tmp-1").mkdir(parents=True)
    ix = open_for_generation(backend, root, None, staging, DIM, **opts)
    assert ix.missing(ids[:8]) == (set(ids[:8]) if ix.shared_store else set())
    ix.stage_changes([], ids[:8], vecs[:8], [{"source": "a"}] * 8)
    gen1 = _publish(staging)
    ix.reconcile(ids[:8])
    ix.close()
    with load_generation(backend, root, gen1, DIM, **opts) as live:
        assert sorted(live.ids()) == sorted(ids[:8])
        assert live.search(vecs[3:4], 1)[0][0][0] == "g3"

    # the next run drops g0, g1 and adds g8..g11; before publication gen1 still answers
    (staging := root / ".gen-000002.tmp-1").mkdir()
    ix = open_for_generation(backend, root, gen1, staging, DIM, **opts)
    assert ix.missing(ids[:8]) == set()
    ix.stage_changes({"g0", "g1"}, ids[8:], vecs[8:])
    with load_generation(backend, root, gen1, DIM, **opts) as live:
        assert set(ids[:8]) <= set(live.ids())
        assert set(live.ids()) == (set(ids) if live.shared_store else set(ids[:8]))
    gen2 = _publish(staging)
    ix.reconcile(ids[2:])
    ix.close()
    with load_generation(backend, root, gen2, DIM, **opts) as live:
        assert sorted(live.ids()) == sorted(ids[2:])
        assert live.search(vecs[10:11], 1)[0][0][0] == "g10"

    # a run that crashes after staging: the next one finds the live ids and cleans the rest
    (staging := root / ".gen-000003.tmp-1").mkdir()
    crashed = open_for_generation(backend, root, gen2, staging, DIM, **opts)
    crashed.stage_changes({"g2"}, ["ghost"], unit(rng, 1))
    crashed.close()
    shutil.rmtree(staging)  # what rag.storage.manifest.clean_stale does to it
    (staging := root / ".gen-000003.tmp-2").mkdir()
    ix = open_for_generation(backend, root, gen2, staging, DIM, **opts)
    assert ix.missing(ids[2:]) == set()
    ix.reconcile(ids[2:])
    assert sorted(ix.ids()) == sorted(ids[2:])
    ix.close()


def test_generation_that_only_removes(generation_backend, tmp_path):
    """What ``rag.docs remove`` stages: dropped ids and no vectors at all. Until it is published
    the live generation keeps them; after, the new one never returns them (a shared store keeps
    them for readers still on the previous generation, then drops them at ``reconcile``)."""
    backend, opts = generation_backend
    vecs, ids = unit(np.random.default_rng(6), 6), [f"r{i}" for i in range(6)]
    (staging := tmp_path / "index" / ".gen-000001.tmp-1").mkdir(parents=True)
    root = staging.parent
    with open_for_generation(backend, root, None, staging, DIM, **opts) as ix:
        ix.stage_changes([], ids, vecs)
        gen1 = _publish(staging)
        ix.reconcile(ids)
    (staging := root / ".gen-000002.tmp-1").mkdir()
    with open_for_generation(backend, root, gen1, staging, DIM, **opts) as ix:
        ix.stage_changes({"r0", "r1"}, [], np.zeros((0, DIM), np.float32))
        with load_generation(backend, root, gen1, DIM, **opts) as live:
            assert sorted(live.ids()) == ids
            assert live.search(vecs[0:1], 1)[0][0][0] == "r0"
        gen2 = _publish(staging)
        ix.reconcile(ids[2:] + ids)  # the previous generation still names r0, r1
        with load_generation(backend, root, gen2, DIM, **opts) as live:
            assert {"r0", "r1"} & set(live.ids()) == ({"r0", "r1"} if live.shared_store else set())
        ix.reconcile(ids[2:])  # the next publication: only the live generation is kept
        with load_generation(backend, root, gen2, DIM, **opts) as live:
            assert sorted(live.ids()) == ids[2:] and live.count() == 4
            assert live.search(vecs[0:1], 4)[0][0][0] != "r0"


def test_missing_ids_are_found_in_a_shared_store(generation_backend, tmp_path):
    """Ids the manifest names but a shared store lost are reported, to be re-embedded."""
    backend, opts = generation_backend
    (staging := tmp_path / "index" / ".gen-000001.tmp-1").mkdir(parents=True)
    with open_for_generation(backend, tmp_path / "index", None, staging, DIM, **opts) as ix:
        ix.stage_changes([], ["a", "b"], unit(np.random.default_rng(4), 2))
        ix.delete(["b"])
        assert ix.missing(["a", "b"]) == ({"b"} if ix.shared_store else set())


@pytest.mark.parametrize("backend", BACKENDS)
def test_scratch_index_leaves_nothing(backend):
    vecs = unit(np.random.default_rng(5), 5)
    ix = scratch_index(backend, DIM)
    ix.add([str(i) for i in range(5)], vecs)
    assert ix.search(vecs[2:3], 1)[0][0][0] == "2"
    where = getattr(ix, "_tmp", None)
    ix.close()
    assert where is None or not Path(where.name).exists()


def test_resolve_backend():
    assert resolve_backend(None, None) == (DEFAULT_BACKEND, None)
    assert resolve_backend(None, "http://h:1") == ("chroma", "http://h:1")
    assert resolve_backend(None, None, "chroma", "http://h:1") == ("chroma", "http://h:1")
    assert resolve_backend("chroma", "http://x:2", "chroma", "http://h:1") == (
        "chroma",
        "http://x:2",
    )
    assert resolve_backend(None, None, "faiss") == ("faiss", None)
    with pytest.raises(ValueError, match="--chroma-url needs --backend chroma"):
        resolve_backend("faiss", "http://h:1")
    with pytest.raises(VectorIndexError, match="unknown index backend"):
        resolve_backend("sqlite", None)


# ---------------------------------------------------------------------- rag/ never names a backend


def _backend_comparisons(path: Path) -> list[str]:
    """``path:line`` of every comparison (==, !=, in, not in, match) with a backend name."""
    names = set(BACKENDS)

    def names_backend(node: ast.AST) -> bool:
        return any(isinstance(n, ast.Constant) and n.value in names for n in ast.walk(node))

    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Compare) and names_backend(node):
            found.append(f"{path}:{node.lineno}")
        elif isinstance(node, ast.match_case) and names_backend(node.pattern):
            found.append(f"{path}:{node.pattern.lineno}")
    return found


def test_rag_never_branches_on_a_backend_name():
    """Storage decisions belong to indexes/ (VectorIndex): rag/ may pass a backend name along,
    never compare with one."""
    rag = Path(__file__).resolve().parents[1] / "rag"
    files = sorted(rag.rglob("*.py"))
    assert any(f.parent.name == "ingest" for f in files)  # the scan reaches the package
    assert [hit for f in files for hit in _backend_comparisons(f)] == []


def test_backend_scan_finds_a_comparison(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text(
        'def f(b):\n    if b == "faiss":\n        return 1\n    return b in ("x", "chroma")\n'
    )
    assert _backend_comparisons(probe) == [f"{probe}:2", f"{probe}:4"]
