"""An index's pointer and files are checked (rag.storage.manifest, *Integrity*): a bad ``CURRENT`` is an
error naming the file and costs no generation; garbage collection keeps the newest complete one;
a missing, truncated or altered file is one line naming the index and the file, exit 2, never a
silently smaller (or BM25-only) index."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from ingest_support import write_docs

from rag import ingest as ingest_cli
from rag import search
from rag.ingest import ingest
from rag.retrieval.retriever import Retriever
from rag.storage.manifest import (
    CURRENT,
    IndexIntegrityError,
    current_generation,
    open_generation,
    read_manifest,
)
from rag.storage.paths import index_path


def two_generations(tmp_path: Path, name: str, encoder: Path) -> tuple[Path, Path]:
    """Index ``name`` ingested twice (gen-000001, then gen-000002 with one more file)."""
    docs = write_docs(tmp_path / "docs")
    ingest([docs], index=name, encoder=str(encoder), progress=False)
    (docs / "okapi.md").write_text("# Okapi\n\nThe okapi is a forest giraffe.\n", encoding="utf-8")
    ingest([docs], index=name, progress=False)
    root = index_path(name)
    assert [g.name for g in sorted(root.glob("gen-*"))] == ["gen-000001", "gen-000002"]
    return root, docs


def gens(root: Path) -> list[str]:
    return sorted(g.name for g in root.glob("gen-*"))


def cli(module, argv: list[str], capsys) -> tuple[int, list[str]]:
    capsys.readouterr()  # what earlier steps printed (model loading bars) is not this command's
    code = module.main(argv)
    return code, capsys.readouterr().err.strip().splitlines()


# ---- the CURRENT pointer ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "pointer,says",
    [
        ("", "does not name a generation (empty"),
        ("../other/gen-000001\n", "does not name a generation ('../other/gen-000001'"),
        ("gen-000009\n", "names gen-000009, which is not a folder of the index"),
        ("gen-1\n", "does not name a generation"),
    ],
    ids=["empty", "foreign", "missing", "malformed"],
)
def test_a_bad_pointer_is_refused_and_deletes_nothing(
    tmp_path, tiny_mlm_dir, capsys, pointer, says
):
    name = f"docs-{tmp_path.name}"  # sorts before gen-: the old GC removed generations after it
    root, docs = two_generations(tmp_path, name, tiny_mlm_dir)
    other = index_path(f"other-{tmp_path.name}")
    shutil.copytree(root, other)  # what ../other/gen-000001 would reach
    (root / CURRENT).write_text(pointer.replace("other", other.name), encoding="utf-8")
    (docs / "new.md").write_text("# New\n\nSomething to publish.\n", encoding="utf-8")
    for module, argv in (
        (ingest_cli, [str(docs), "--index", name, "--no-progress"]),
        (search, ["zebra", "--index", name]),
    ):
        code, err = cli(module, argv, capsys)
        assert code == 2 and len(err) == 1, err
        assert (
            f"index {root}: {root / CURRENT}: " in err[0]
            and says.replace("other", other.name) in err[0]
        )
        assert "newest complete generation is gen-000002" in err[0]
    assert gens(root) == ["gen-000001", "gen-000002"]  # nothing deleted, nothing published
    assert (root / "gen-000002" / "manifest.json").is_file()
    (root / CURRENT).write_text("gen-000002\n")  # what the message says restores it
    assert len(Retriever.from_settings(name)) > 0


def test_a_linked_generation_out_of_the_index_is_refused(tmp_path, tiny_mlm_dir):
    name = f"link-{tmp_path.name}"
    root, _ = two_generations(tmp_path, name, tiny_mlm_dir)
    elsewhere = tmp_path / "elsewhere"
    shutil.move(root / "gen-000002", elsewhere)
    (root / "gen-000002").symlink_to(elsewhere)
    with pytest.raises(IndexIntegrityError, match="gen-000002 is a link out of the index"):
        current_generation(root)


def test_gc_keeps_the_newest_complete_generation(tmp_path, tiny_mlm_dir):
    """CURRENT rolled back to gen-000001 while gen-000002 is the newest complete generation (by
    hand, or a crash between the rename and the pointer): a re-ingest with nothing to publish
    keeps both; one that publishes numbers its generation gen-000003, never replacing one."""
    name = f"gc-{tmp_path.name}"
    root, docs = two_generations(tmp_path, name, tiny_mlm_dir)
    (root / CURRENT).write_text("gen-000001\n")
    (docs / "okapi.md").unlink()  # gen-000001's content: nothing to publish
    report = ingest([docs], index=name, progress=False)
    assert report.generation == "gen-000001" and gens(root) == ["gen-000001", "gen-000002"]
    (docs / "new.md").write_text("# New\n\nSomething to publish.\n", encoding="utf-8")
    report = ingest([docs], index=name, progress=False)
    assert report.generation == "gen-000003" == current_generation(root).name
    assert gens(root) == ["gen-000001", "gen-000003"]  # the live one and the one live before it
    assert len(Retriever.from_settings(name)) > 0


# ---- recorded sizes and checksums -----------------------------------------------------------------


@pytest.fixture
def index(tmp_path, tiny_mlm_dir) -> tuple[str, Path, Path]:
    """(name, root, live generation) of a fresh two-generation index."""
    name = f"ix-{tmp_path.name}"
    root, _ = two_generations(tmp_path, name, tiny_mlm_dir)
    return name, root, root / "gen-000002"


def test_publication_records_every_file(index):
    _, _, gen = index
    files = read_manifest(gen).files
    assert {"chunks.jsonl", "run.json", "vectors/faiss.npz", "bm25/bm25_ids.json"} <= set(files)
    assert "manifest.json" not in files
    for rel, rec in files.items():
        assert rec["size"] == (gen / rel).stat().st_size and len(rec["sha256"]) == 64


def _cut_lines(path: Path, n: int) -> None:
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    path.write_text("".join(lines[:-n]), encoding="utf-8")


def _truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


DAMAGE = {
    "vectors-deleted": ("vectors/faiss.npz", lambda p: p.unlink(), "missing"),
    "chunks-cut": ("chunks.jsonl", lambda p: _cut_lines(p, 3), "when published"),
    "bm25-truncated": ("bm25/bm25_ids.json", _truncate, "when published"),
    "manifest-truncated": ("manifest.json", _truncate, "not what was published"),
}


@pytest.mark.parametrize(
    "damage,mode",
    [(d, "hybrid") for d in sorted(DAMAGE)]
    + [("vectors-deleted", "dense"), ("chunks-cut", "bm25")],
)
def test_a_damaged_file_is_one_line_naming_it(index, capsys, damage, mode):
    name, root, gen = index
    rel, act, says = DAMAGE[damage]
    act(gen / rel)
    code, err = cli(search, ["zebra stripes", "--index", name, "--mode", mode], capsys)
    assert code == 2 and len(err) == 1, err
    assert err[0].startswith(f"rag.search: error: index {root}: {gen / rel}") and says in err[0]


def test_same_size_alteration_is_found_by_verify(index, capsys):
    name, _, gen = index
    chunks = gen / "chunks.jsonl"
    data = chunks.read_bytes()
    chunks.write_bytes(data.replace(b"Zebras", b"Zebrax", 1))  # same size: the cheap check passes
    assert cli(search, ["zebra", "--index", name, "--mode", "bm25"], capsys)[0] == 0
    code, err = cli(search, ["zebra", "--index", name, "--verify"], capsys)
    assert code == 2 and len(err) == 1 and f"{chunks}: checksum differs" in err[0]


def test_verify_passes_an_intact_index(index, capsys):
    name, _, _ = index
    code, err = cli(search, ["zebra", "--index", name, "--mode", "bm25", "--verify"], capsys)
    assert code == 0 and any("verified" in line and "gen-000002" in line for line in err)


def _unrecorded(gen: Path) -> None:
    """Make ``gen`` look like one published before sizes were recorded."""
    m = json.loads((gen / "manifest.json").read_text())
    m.pop("files")
    (gen / "manifest.json").write_text(json.dumps(m))


def test_chunks_cut_from_an_unrecorded_generation_are_found(index):
    name, root, gen = index
    _unrecorded(gen)
    _cut_lines(gen / "chunks.jsonl", 2)
    with pytest.raises(IndexIntegrityError, match=r"chunks.jsonl: 2 chunk\(s\) the manifest names"):
        Retriever.from_settings(name)


def test_vectors_of_another_index_are_refused(index, tmp_path, tiny_mlm_dir):
    """A vector file taken from another index (sizes unrecorded, so only the ids tell): an
    error, never a dense search that finds nothing while hybrid quietly runs BM25 only."""
    name, _, gen = index
    _unrecorded(gen)
    other = tmp_path / "other"
    ingest(
        [write_docs(tmp_path / "odocs", {"o.md": "# O\n\nOther text.\n"})],
        index=other,
        encoder=str(tiny_mlm_dir),
        progress=False,
    )
    _, ogen, _ = open_generation(other)
    shutil.copy(ogen / "vectors" / "faiss.npz", gen / "vectors" / "faiss.npz")
    with pytest.raises(IndexIntegrityError, match=r"vectors/faiss.npz: its \d+ vectors .* another"):
        Retriever.from_settings(name)
    (gen / "vectors" / "faiss.npz").unlink()
    with pytest.raises(Exception, match="faiss.npz: missing"):
        Retriever.from_settings(name)


def test_a_damaged_index_is_not_built_upon(index, tmp_path, capsys):
    """Re-ingest refuses a generation whose files differ from its manifest (exit 2 naming the
    file) rather than carrying the damage into the next generation."""
    name, root, gen = index
    _cut_lines(gen / "chunks.jsonl", 1)
    code, err = cli(ingest_cli, [str(tmp_path / "docs"), "--index", name, "--no-progress"], capsys)
    assert code == 2 and len(err) == 1 and f"{gen / 'chunks.jsonl'}" in err[0]
    assert gens(root) == ["gen-000001", "gen-000002"]
