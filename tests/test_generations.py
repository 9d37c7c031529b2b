"""A long-lived Retriever (a ``rag.serve`` replica, the UI) and the generations ingest publishes:
each search uses one generation, a new one is picked up without a restart, a search never mixes
two, and a shared store (Chroma) keeps the previous generation's vectors for readers still on
it. The multi-process version over a real Chroma server is tests/test_replicas.py."""

from __future__ import annotations

import threading

from ingest_support import write_docs

from indexes import open_index
from rag.ingest import ingest
from rag.retrieval.retriever import Retriever
from rag.storage.manifest import index_dir, kept_chunk_ids, open_generation, read_chunks

OKAPI = "# Okapi\n\nThe okapi is a forest giraffe.\n"


def _chunk_ids(index: str) -> tuple[str, set[str]]:
    """(live generation name, its chunk ids)."""
    _, gen, _ = open_generation(index)
    return gen.name, set(read_chunks(gen))


def test_hits_carry_their_generation_and_a_taken_snapshot_stays_whole(tmp_path, tiny_mlm_dir):
    docs = write_docs(tmp_path / "docs")
    first = ingest([docs], index="gens", encoder=str(tiny_mlm_dir), progress=False)
    r = Retriever.from_settings("gens")
    hits = r.search("zebra stripes", k=3, mode="hybrid")
    assert hits and {h.generation for h in hits} == {first.generation} == {r.generation}
    old = r.snapshot  # what a query in flight holds
    (docs / "okapi.md").write_text(OKAPI, encoding="utf-8")
    (docs / "notes.txt").unlink()
    second = ingest([docs], index="gens", progress=False)
    assert second.generation != first.generation
    hits = r.search("okapi giraffe", k=3, mode="bm25")  # no restart, no explicit refresh
    assert hits[0].chunk.source.endswith("okapi.md") and hits[0].generation == second.generation
    assert all(not h.chunk.source.endswith("notes.txt") for h in hits)
    # the old snapshot still answers from the old generation, whole
    rows = old.engine.search_many(["zebra stripes"], 3, "bm25")
    assert rows[0] and all(s.id in old.chunks for s in rows[0])


def test_a_query_after_a_publication_waits_for_the_new_generation(tmp_path, tiny_mlm_dir):
    """Read-after-write (issue 47, case 3): while one thread loads the newly published
    generation (the reload lock held), a query that starts then waits for it rather than
    answering from the loaded, older one (34 of 48 questions sent right after a DELETE's 200
    were answered from the previous generation, 3 citing the removed document)."""
    docs = write_docs(tmp_path / "docs")
    first = ingest([docs], index="stall", encoder=str(tiny_mlm_dir), progress=False)
    r = Retriever.from_settings("stall")
    (docs / "okapi.md").write_text(OKAPI, encoding="utf-8")
    second = ingest([docs], index="stall", progress=False)
    got: list = []
    with r._reload:  # as if another thread were loading it
        t = threading.Thread(target=lambda: got.append(r.search("okapi", k=3, mode="bm25")))
        t.start()
        t.join(0.5)
        assert t.is_alive() and not got  # waiting, not answering from the old generation
        assert r.generation == first.generation
    t.join(30)
    assert got and got[0] and got[0][0].generation == second.generation
    assert r.search("okapi", k=3, mode="bm25")[0].generation == second.generation


def test_concurrent_searches_during_publications_never_mix(tmp_path, tiny_mlm_dir):
    docs = write_docs(tmp_path / "docs")
    ingest([docs], index="mix", encoder=str(tiny_mlm_dir), progress=False)
    gens = dict([_chunk_ids("mix")])
    r = Retriever.from_settings("mix")
    results, errors, stop = [], [], threading.Event()

    def search() -> None:
        while not stop.is_set():
            try:
                for mode in ("hybrid", "bm25"):
                    results.append(r.search("file zebra okapi errors", k=8, mode=mode))
            except Exception as e:  # noqa: BLE001 - collected and asserted below
                errors.append(repr(e))

    threads = [threading.Thread(target=search) for _ in range(2)]
    for t in threads:
        t.start()
    try:
        for i in range(3):
            (docs / f"okapi{i}.md").write_text(OKAPI + f"\nVersion {i}.\n", encoding="utf-8")
            (docs / "notes.txt").write_text(f"Zebras, edition {i}.\n", encoding="utf-8")
            ingest([docs], index="mix", progress=False)
            name, ids = _chunk_ids("mix")
            gens[name] = ids
    finally:
        stop.set()
        for t in threads:
            t.join(30)
    assert not errors, errors[:3]
    assert len(gens) == 4 and results
    for hits in filter(None, results):
        (gen,) = {h.generation for h in hits}  # one generation per search
        assert {h.chunk.id for h in hits} <= gens[gen]
    assert r.search("okapi", k=1, mode="bm25")[0].generation == max(gens)


def test_shared_store_keeps_the_previous_generation(tmp_path, tiny_mlm_dir):
    """Chroma (embedded here; a server behaves the same): after a publication the collection
    still holds the previous generation's vectors; the next publication drops them."""
    docs = write_docs(tmp_path / "docs")
    ingest([docs], index="keep", encoder=str(tiny_mlm_dir), backend="chroma", progress=False)
    g1, ids1 = _chunk_ids("keep")
    reader = Retriever.from_settings("keep")  # stays on g1 for its snapshot below
    old = reader.snapshot
    (docs / "errors.rst").unlink()
    ingest([docs], index="keep", progress=False)
    g2, ids2 = _chunk_ids("keep")
    root = index_dir("keep")
    _, gen, manifest = open_generation("keep")
    col = open_index(
        "chroma", root / "chroma", manifest.encoder["dim"], collection=manifest.collection
    )
    assert ids2 < ids1 and set(col.ids()) == ids1 == kept_chunk_ids(root)
    gone = sorted(ids1 - ids2)
    rows = old.engine.search_many(["exceptions try except finally"], len(ids1), "dense")
    assert set(gone) <= {s.id for s in rows[0]}  # the old generation is still whole
    (docs / "okapi.md").write_text(OKAPI, encoding="utf-8")
    ingest([docs], index="keep", progress=False)
    g3, ids3 = _chunk_ids("keep")
    assert sorted(p.name for p in root.glob("gen-*")) == [g2, g3]
    assert set(col.ids()) == ids2 | ids3 and not set(gone) & set(col.ids())
    col.close()
    assert reader.search("okapi", k=1, mode="bm25")[0].generation == g3 != g1
