"""Ingest: incremental and idempotent, BM25 in step, bad input reported, encoder identity."""

from __future__ import annotations

import json
import os
import time

import pytest
from ingest_support import DOCS, perturbed_copy, write_docs

from indexes import open_index
from rag.ingest import ingest, main
from rag.retrieval.bm25 import BM25Index
from rag.retrieval.encoder import EncoderMismatchError
from rag.retrieval.retriever import Retriever
from rag.storage.manifest import open_generation, read_chunks


def index_state(name: str) -> dict:
    """Everything that defines an index's content, for equality checks."""
    root, gen, manifest = open_generation(name)
    chunks = read_chunks(gen)
    state = {
        "chunks": {i: c.to_dict() for i, c in chunks.items()},
        "sources": {k: (v.hash, sorted(v.chunk_ids)) for k, v in manifest.sources.items()},
        "bm25": sorted(BM25Index.load(gen / "bm25").ids),
    }
    if manifest.backend == "faiss":
        state["vectors"] = sorted(
            open_index("faiss", gen / "vectors", manifest.encoder["dim"]).ids()
        )
    assert state["bm25"] == sorted(chunks)
    assert sorted(i for _, ids in state["sources"].values() for i in ids) == sorted(chunks)
    return state


def test_incremental_reingest(tmp_path, tiny_mlm_dir):
    docs = write_docs(tmp_path / "docs")
    enc = str(tiny_mlm_dir)
    first = ingest([docs], index="inc", encoder=enc, progress=False)
    assert len(first.added) == len(DOCS) and first.ok and first.chunks == first.chunks_embedded > 0
    before = index_state("inc")

    again = ingest([docs], index="inc", progress=False)  # encoder defaults to the recorded one
    assert (len(again.added), len(again.removed), len(again.updated)) == (0, 0, 0)
    assert len(again.unchanged) == len(DOCS) and again.chunks_embedded == 0
    assert again.generation == first.generation
    assert index_state("inc") == before

    target = docs / "notes.txt"
    time.sleep(0.01)
    os.utime(target)  # touched, same content: re-hashed, nothing embedded
    touched = ingest([docs], index="inc", progress=False)
    assert touched.chunks_embedded == 0 and len(touched.unchanged) == len(DOCS)

    target.write_text(DOCS["notes.txt"] + "\nOkapis are shy forest animals.\n", encoding="utf-8")
    changed = ingest([docs], index="inc", progress=False)
    assert changed.updated == [os.path.abspath(target)] and not changed.added
    after = index_state("inc")
    new_ids = set(after["sources"][os.path.abspath(target)][1])
    assert changed.chunks_embedded == len(new_ids)
    others = {k: v for k, v in before["sources"].items() if k != os.path.abspath(target)}
    assert {k: after["sources"][k] for k in others} == others  # untouched files keep their chunks

    gone = docs / "errors.rst"
    gone_ids = set(after["sources"][os.path.abspath(gone)][1])
    gone.unlink()
    removed = ingest([docs], index="inc", progress=False)
    assert removed.removed == [os.path.abspath(gone)] and removed.chunks_removed == len(gone_ids)
    final = index_state("inc")
    assert not gone_ids & set(final["chunks"]) and not gone_ids & set(final["bm25"])
    r = Retriever.from_settings("inc")
    assert all(
        "errors.rst" not in h.chunk.source
        for h in r.search("exception finally try", k=10, mode="bm25")
    )
    assert any("notes.txt" in h.chunk.source for h in r.search("okapis forest", k=3, mode="bm25"))


def test_bad_inputs_reported_and_rest_ingested(tmp_path, tiny_mlm_dir, monkeypatch, capsys):
    docs = write_docs(tmp_path / "bad", {"good.md": "# Good\n\nThis file is fine and has words.\n"})
    (docs / "binary.txt").write_bytes(b"\x00\x01\x02binary\x00data")
    (docs / "empty.md").write_bytes(b"")
    (docs / "latin1.txt").write_bytes("caf\xe9 cr\xe8me br\xfbl\xe9e".encode("latin-1"))
    (docs / "zero.pdf").write_bytes(b"")
    (docs / "locked.md").write_text("secret", encoding="utf-8")
    (docs / "locked.md").chmod(0)
    os.symlink("loop.md", docs / "loop.md")  # a link to itself
    os.symlink("missing.md", docs / "dangling.md")
    if os.geteuid() == 0:  # root reads chmod-000 files: simulate the EACCES a user would get
        import rag.ingest.plan as plan_mod

        real = plan_mod.file_hash

        def denied(path):
            if path.name == "locked.md":
                raise PermissionError(13, "Permission denied")
            return real(path)

        monkeypatch.setattr(plan_mod, "file_hash", denied)
    code = main(
        [str(docs), "--index", "bad", "--encoder", str(tiny_mlm_dir), "--json", "--no-progress"]
    )
    out = json.loads(capsys.readouterr().out)
    assert code == 1
    reasons = {os.path.basename(f["path"]): f["reason"] for f in out["failures"]}
    assert "binary" in reasons["binary.txt"]
    assert "empty" in reasons["zero.pdf"]  # a PDF of no bytes is broken
    skipped = {os.path.basename(f["path"]): f["reason"] for f in out["skipped"]}
    assert skipped == {"empty.md": "no text (empty after cleaning)"}  # an empty text: no failure
    assert "UTF-8" in reasons["latin1.txt"]
    assert "ermission" in reasons["locked.md"]
    assert "link loop" in reasons["loop.md"]
    assert "no such file" in reasons["dangling.md"].lower() and "link" in reasons["dangling.md"]
    assert [os.path.basename(p) for p in out["added"]] == ["good.md"]
    assert out["counts"]["failed"] == 6
    r = Retriever.from_settings("bad")
    assert len(r) == out["chunks"] > 0
    assert r.search("fine words", k=1, mode="bm25")[0].chunk.source.endswith("good.md")


def test_other_encoder_is_refused(tmp_path, tiny_mlm_dir):
    docs = write_docs(tmp_path / "docs")
    ingest([docs], index="enc", encoder=str(tiny_mlm_dir), progress=False)
    other = perturbed_copy(tiny_mlm_dir, tmp_path / "other-encoder")
    with pytest.raises(EncoderMismatchError) as e:
        ingest([docs], index="enc", encoder=str(other), progress=False)
    assert str(tiny_mlm_dir) in str(e.value) and str(other) in str(e.value)
    with pytest.raises(EncoderMismatchError, match="other-encoder"):
        Retriever.from_settings("enc", encoder=str(other))
    assert main([str(docs), "--index", "enc", "--encoder", str(other), "--no-progress"]) == 2
    Retriever.from_settings("enc", encoder=str(tiny_mlm_dir))  # the same weights are accepted


def test_chroma_backend_reconciles_with_manifest(tmp_path, tiny_mlm_dir):
    docs = write_docs(tmp_path / "docs")
    first = ingest([docs], index="chr", encoder=str(tiny_mlm_dir), backend="chroma", progress=False)
    root, gen, manifest = open_generation("chr")
    col = open_index(
        "chroma", root / "chroma", manifest.encoder["dim"], collection=manifest.collection
    )
    ids = sorted(read_chunks(gen))
    assert sorted(col.ids()) == ids and first.chunks == len(ids)
    # simulate a crash between the store and the manifest: a stray id and a missing one
    import numpy as np

    col.add(
        ["stray"],
        np.ones((1, manifest.encoder["dim"]), np.float32) / manifest.encoder["dim"] ** 0.5,
    )
    col.delete([ids[0]])
    r = Retriever.from_settings("chr")
    assert all(h.chunk.id != "stray" for h in r.search("zebra", k=50, mode="dense"))
    fixed = ingest([docs], index="chr", progress=False)
    assert fixed.chunks_embedded == 1 and not fixed.added
    assert sorted(col.ids()) == ids
    with pytest.raises(ValueError, match="backend"):
        ingest([docs], index="chr", backend="faiss", progress=False)


def test_faiss_hnsw_flag(tmp_path, tiny_mlm_dir):
    docs = write_docs(tmp_path / "docs")
    code = main(
        [
            str(docs),
            "--index",
            "hnsw",
            "--encoder",
            str(tiny_mlm_dir),
            "--faiss-kind",
            "hnsw",
            "--no-progress",
        ]
    )
    assert code == 0
    flat = ingest([docs], index="flat", encoder=str(tiny_mlm_dir), progress=False)
    assert flat.ok
    q = "read a file line by line"
    got = [h.chunk.text for h in Retriever.from_settings("hnsw").search(q, k=3, mode="dense")]
    assert got == [
        h.chunk.text for h in Retriever.from_settings("flat").search(q, k=3, mode="dense")
    ]
    root, gen, _ = open_generation("hnsw")
    import numpy as np

    with np.load(gen / "vectors" / "faiss.npz") as z:
        assert z["graph"].size > 0  # the HNSW graph is persisted beside the vectors


def test_faiss_ivf_flag(tmp_path, tiny_mlm_dir, capsys):
    """--faiss-kind ivf / --faiss-nprobe are recorded with the vectors: the reader searches with
    them, and the next ingest keeps them unless given others. A bad value names its flag.
    (RAG_HOME is shared by the session: index names no other test uses.)"""
    docs = write_docs(tmp_path / "docs")
    enc = str(tiny_mlm_dir)
    argv = [str(docs), "--index", "ivf-kind", "--encoder", enc, "--no-progress"]
    assert main([*argv, "--faiss-kind", "ivf", "--faiss-nprobe", "4"]) == 0
    flat = ingest([docs], index="ivf-flat", encoder=enc, faiss_kind="flat", progress=False)
    assert flat.ok
    q = "read a file line by line"
    ivf = Retriever.from_settings("ivf-kind")
    assert (ivf.engine.vectors.kind, ivf.engine.vectors.nprobe) == ("ivf", 4)
    # a few dozen chunks: one IVF list, so exactly the flat index's hits
    got = [(h.chunk.text, h.score) for h in ivf.search(q, k=3, mode="dense")]
    want = [
        (h.chunk.text, h.score)
        for h in Retriever.from_settings("ivf-flat").search(q, k=3, mode="dense")
    ]
    assert [t for t, _ in got] == [t for t, _ in want], (got, want)
    assert [s for _, s in got] == pytest.approx([s for _, s in want], abs=1e-5)
    (docs / "new.md").write_text("# New\n\nA new page about zebras.\n")
    assert ingest([docs], index="ivf-kind", progress=False).ok  # no --faiss-kind: the index's own
    assert Retriever.from_settings("ivf-kind").engine.vectors.kind == "ivf"
    capsys.readouterr()
    assert main([*argv, "--faiss-nprobe", "0"]) == 2
    assert "--faiss-nprobe must be at least 1, not 0" in capsys.readouterr().err
    with pytest.raises(SystemExit) as refused:  # argparse's choices: rag.cli exits 2
        main([*argv, "--faiss-kind", "ivfpq"])
    assert refused.value.code == 2 and "--faiss-kind" in capsys.readouterr().err
