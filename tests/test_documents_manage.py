"""An index's documents, listed and removed (rag.ingest.manage, python -m rag.docs), on FAISS and
embedded Chroma: removal publishes one generation with BM25, vectors, chunks and manifest in
step; an unknown path changes nothing; a kill -9 at each point of a removal leaves the previous
generation loadable and the rerun ends where an uninterrupted removal does; and the re-ingest
rule (a removed file still in its folder comes back, counted as added)."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import time

import pytest
from ingest_support import DOCS, write_docs
from test_ingest import index_state

from indexes import open_index
from rag.docs import main
from rag.ingest import (
    CRASH_ENV,
    DocumentNotFoundError,
    ingest,
    list_documents,
    remove_documents,
)
from rag.ingest.manage import (
    AmbiguousDocumentError,
    DocumentPathError,
    WouldEmptyIndexError,
    check_document_path,
)
from rag.retrieval.retriever import Retriever
from rag.storage.manifest import current_generation, index_dir, kept_chunk_ids, open_generation

LIBRARY = {
    "library/io.md": "# IO\n\nThe io module reads and writes streams of bytes and text.\n",
    "library/os.md": "# OS\n\nThe os module walks directories and reads environment variables.\n",
}
BACKENDS = ["faiss", "chroma"]


def make_index(tmp_path, encoder, backend: str, name: str | None = None) -> tuple[str, object]:
    """DOCS plus a library/ folder ingested into a fresh index; (name, docs folder)."""
    docs = write_docs(tmp_path / "docs", {**DOCS, **LIBRARY})
    name = name or f"{backend}-{tmp_path.name}"
    ingest([docs], index=name, encoder=str(encoder), backend=backend, progress=False)
    return name, docs


def collection_ids(name: str) -> set[str]:
    root, _, manifest = open_generation(name)
    with open_index(
        "chroma", root / "chroma", manifest.encoder["dim"], collection=manifest.collection
    ) as col:
        return set(col.ids())


@pytest.mark.parametrize("backend", BACKENDS)
def test_list_then_remove_keeps_every_store_in_step(tmp_path, tiny_mlm_dir, backend):
    start = time.time()
    name, docs = make_index(tmp_path, tiny_mlm_dir, backend)
    listed = list_documents(name)
    paths = [d.path for d in listed.documents]
    assert paths == sorted(["errors.rst", "files.md", "notes.txt", "page.html", *LIBRARY])
    by_path = {d.path: d for d in listed.documents}
    notes = by_path["notes.txt"]
    raw = (docs / "notes.txt").read_bytes()
    assert notes.hash == hashlib.sha256(raw).hexdigest() and notes.bytes == len(raw)
    assert notes.type == "txt" and by_path["page.html"].type == "html"
    assert notes.source == str(docs / "notes.txt") and notes.encoder == str(tiny_mlm_dir)
    assert start - 1 <= notes.ingested <= time.time()
    assert listed.chunks == len(index_state(name)["chunks"])
    assert "source" not in notes.to_dict() and notes.to_dict(include_source=True)["source"]

    before = index_state(name)
    gone = set(before["sources"][str(docs / "notes.txt")][1])
    report = remove_documents(name, ["notes.txt"])
    assert [d.path for d in report.removed] == ["notes.txt"]
    assert report.chunks_removed == len(gone) and report.chunks == len(before["chunks"]) - len(gone)
    after = index_state(name)  # asserts BM25, manifest and chunk store name the same chunks
    assert report.generation == current_generation(index_dir(name)).name
    assert not gone & set(after["chunks"]) and str(docs / "notes.txt") not in after["sources"]
    assert {k: v for k, v in before["sources"].items() if "notes.txt" not in k} == after["sources"]
    if backend == "faiss":
        assert after["vectors"] == sorted(after["chunks"])
    else:  # the previous generation's vectors stay for readers still on it, until the next one
        assert gone <= collection_ids(name)
    r = Retriever.from_settings(name)
    for mode in ("dense", "bm25", "hybrid"):
        hits = r.search("zebra stripes savanna giraffes", k=len(after["chunks"]), mode=mode)
        assert all("notes.txt" not in h.chunk.source for h in hits), mode
    dense = r.search("zebra", k=len(after["chunks"]), mode="dense")
    assert len(dense) == len(after["chunks"])  # the removed vectors take no place in the k

    folder = remove_documents(name, ["library/"])  # every document under a folder
    assert sorted(d.path for d in folder.removed) == sorted(LIBRARY)
    if backend == "chroma":  # the next publication drops what no kept generation names
        assert not gone & collection_ids(name)
        assert collection_ids(name) == kept_chunk_ids(index_dir(name))
    with pytest.raises(DocumentPathError, match="absolute path"):  # the manifest's own key
        remove_documents(name, [str(docs / "page.html")])
    page = remove_documents(name, ["page.html"])
    assert [d.path for d in page.removed] == ["page.html"]
    assert [d.path for d in list_documents(name).documents] == ["errors.rst", "files.md"]


@pytest.mark.parametrize("backend", BACKENDS)
def test_unknown_path_changes_nothing(tmp_path, tiny_mlm_dir, backend, capsys):
    name, _ = make_index(tmp_path, tiny_mlm_dir, backend)
    root = index_dir(name)
    before, gen = index_state(name), current_generation(root)
    folders = sorted(p.name for p in root.iterdir())
    with pytest.raises(DocumentNotFoundError, match=r"'nope\.md'.*'lib'") as err:
        remove_documents(name, ["notes.txt", "nope.md", "lib"])  # 'lib' is no folder: library/
    assert err.value.paths == ["nope.md", "lib"]
    capsys.readouterr()  # the ingest's own output
    assert main(["remove", "--index", name, "files.md", "nope.md"]) == 2
    out = capsys.readouterr()
    (line,) = out.err.strip().splitlines()
    assert line.startswith("rag.docs: error: ") and "'nope.md'" in line and out.out == ""
    assert index_state(name) == before and current_generation(root) == gen
    assert sorted(p.name for p in root.iterdir()) == folders


def test_cli_list_and_remove(tmp_path, tiny_mlm_dir, capsys):
    import json

    name, docs = make_index(tmp_path, tiny_mlm_dir, "faiss")
    capsys.readouterr()
    assert main(["list", "--index", name]) == 0
    out = capsys.readouterr()
    lines = out.out.splitlines()
    assert lines[0].split() == ["PATH", "TYPE", "CHUNKS", "BYTES", "INGESTED", "SHA256"]
    assert [line.split()[0] for line in lines[1:]][:2] == ["errors.rst", "files.md"]
    assert f"{name}: 6 documents" in out.err
    assert main(["list", "--index-dir", str(index_dir(name)), "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert len(listed["documents"]) == 6 and listed["documents"][0]["ingested"].endswith("Z")
    assert main(["remove", "--index", name, "--json", "library", "./notes.txt"]) == 0
    out = capsys.readouterr()
    removed = json.loads(out.out)
    assert sorted(d["path"] for d in removed["removed"]) == [
        "library/io.md",
        "library/os.md",
        "notes.txt",
    ]
    assert "removed: notes.txt" in out.err and "comes back at the next rag.ingest" in out.err
    assert main(["list", "--index", "no-such-index"]) == 2
    assert "no index at" in capsys.readouterr().err
    assert main(["remove", "--index", "no-such-index", "x.md"]) == 2
    assert not index_dir("no-such-index").exists()  # refused before the lock made a folder
    assert main(["remove", "--index", "../up", "x.md"]) == 2


def test_remove_takes_the_escaped_name_list_shows(tmp_path, tiny_mlm_dir, capsys):
    """A file whose name holds a newline is listed escaped (one line per document); that shown
    form, typed back, removes it and only it. While a file literally named so (a backslash)
    sits beside it, the shown form names neither and nothing is removed."""
    odd = {"odd\nname.md": "# Odd\n\nA newline in a name.\n", "odd\\nname.md": "# Slash\n\nA b.\n"}
    docs = write_docs(tmp_path / "docs", {**odd, **DOCS})
    name = f"faiss-{tmp_path.name}"
    ingest([docs], index=name, encoder=str(tiny_mlm_dir), backend="faiss", progress=False)
    capsys.readouterr()
    assert main(["list", "--index", name]) == 0
    shown = [line for line in capsys.readouterr().out.splitlines() if line.startswith("odd")]
    assert len(shown) == 2 and all(line.startswith("odd\\nname.md  ") for line in shown)
    before = index_state(name)
    assert main(["remove", "--index", name, "odd\\nname.md"]) == 2  # two documents show so
    assert "no document" in capsys.readouterr().err and index_state(name) == before

    remove_documents(name, ["odd\nname.md"])  # the newline one, by its real name
    assert main(["remove", "--index", name, "odd\\nname.md"]) == 0  # one document shows so now
    assert "removed: odd\\nname.md" in capsys.readouterr().err
    assert [d.path for d in list_documents(name).documents] == sorted(DOCS)


@pytest.mark.parametrize(
    "path",
    [
        "\\",  # removed all 1,512 documents (rag.docs and DELETE /v1/documents/%5C)
        "/",
        ".",
        "./",
        "",
        " ",
        "\\tmp\\docs\\notes.txt",  # an absolute path once '\\' is a separator
        "C:\\docs\\notes.txt",
        "..",
        "../docs/notes.txt",
        "library/../..",
        "notes\x00.txt",
    ],
)
def test_a_removal_never_takes_a_root_an_absolute_or_a_backslash_path(path):
    """Issue 47, case 2: one check for every front end (rag.docs, the API, MCP, the UI)."""
    with pytest.raises(DocumentPathError):
        check_document_path(path)


def test_refused_paths_and_emptying_change_nothing(tmp_path, tiny_mlm_dir, capsys):
    """`rag.docs remove '\\'` removed every document with no warning, and an absolute path removed
    one by the server's own layout. Now each is one line, exit 2, nothing changed; removing
    every document needs --all, and --all alone removes every one."""
    name, docs = make_index(tmp_path, tiny_mlm_dir, "faiss")
    root = index_dir(name)
    before, gen = index_state(name), current_generation(root)
    capsys.readouterr()
    for path in ("\\", "/", ".", str(docs), str(docs / "notes.txt"), "\\" + str(docs)[1:]):
        assert main(["remove", "--index", name, path]) == 2, path
        (line,) = capsys.readouterr().err.strip().splitlines()
        assert line.startswith("rag.docs: error: ") and ("absolute" in line or "whole" in line)
    every = [d.path for d in list_documents(name).documents]
    with pytest.raises(WouldEmptyIndexError, match="--all"):
        remove_documents(name, every)
    assert main(["remove", "--index", name, "library", *every]) == 2
    assert "would remove every document" in capsys.readouterr().err
    assert main(["remove", "--index", name]) == 2  # neither PATH nor --all
    assert "or --all" in capsys.readouterr().err
    assert index_state(name) == before and current_generation(root) == gen
    remove_documents(name, ["library/", "notes.txt"])  # a part of it, as ever
    assert main(["remove", "--index", name, "--all", "--json"]) == 0
    out = capsys.readouterr()
    import json

    assert len(json.loads(out.out)["removed"]) == len(every) - 3
    assert list_documents(name).documents == []
    assert main(["remove", "--index", name, "--all"]) == 2  # nothing left to remove
    assert "holds no documents" in capsys.readouterr().err


def test_two_folders_with_the_same_relative_name_are_told_apart(tmp_path, tiny_mlm_dir):
    """Issue 47, case 8: dupA/same.md and dupB/same.md were listed twice as 'same.md', a
    removal of 'same.md' took both, and search cited both as 'same.md'. Now each is shown with
    its folder, addressed alone, and a name no other document shares is unchanged."""
    a = write_docs(tmp_path / "dupA", {"same.md": "# Same\n\nAardvarks dig burrows.\n"})
    b = write_docs(
        tmp_path / "dupB", {"same.md": "# Same\n\nBadgers dig setts.\n", "other.md": "Otters.\n"}
    )
    name = f"dup-{tmp_path.name}"
    ingest([a, b], index=name, encoder=str(tiny_mlm_dir), progress=False)
    paths = [d.path for d in list_documents(name).documents]
    assert paths == ["dupA/same.md", "dupB/same.md", "other.md"]
    hits = Retriever.from_settings(name).search("badgers setts", k=3, mode="bm25")
    assert hits[0].chunk.path == "dupB/same.md" and "Badgers" in hits[0].chunk.text
    aardvark = Retriever.from_settings(name).search(
        "aardvarks", k=1, mode="bm25", where="path=dupA"
    )
    assert [h.chunk.path for h in aardvark] == ["dupA/same.md"]
    with pytest.raises(DocumentNotFoundError):
        remove_documents(name, ["same.md"])  # names neither
    report = remove_documents(name, ["dupA/same.md"])
    assert [d.source for d in report.removed] == [str(a / "same.md")]
    assert [d.path for d in list_documents(name).documents] == ["other.md", "same.md"]


def test_a_name_from_two_folders_still_works_once_the_other_is_removed(
    tmp_path, tiny_mlm_dir, capsys
):
    """Issue 47, case 16: removing dupA/same.md renamed dupB's to same.md, and a client holding
    `dupB/same.md` got "no document". The earlier, root-qualified name still names it (through
    rag.docs), the plain name does too, and one that was several documents' names is refused
    naming them."""
    a = write_docs(tmp_path / "dupA", {"same.md": "# Same\n\nAardvarks dig burrows.\n"})
    b = write_docs(
        tmp_path / "dupB", {"same.md": "# Same\n\nBadgers dig setts.\n", "other.md": "Otters.\n"}
    )
    name = f"dup-{tmp_path.name}"

    def paths() -> list[str]:
        return [d.path for d in list_documents(name).documents]

    for plain in (False, True):
        ingest([a, b], index=name, encoder=str(tiny_mlm_dir), progress=False)
        assert paths() == ["dupA/same.md", "dupB/same.md", "other.md"]
        assert main(["remove", "--index", name, "dupA/same.md"]) == 0
        assert paths() == ["other.md", "same.md"]  # the current names are as before
        capsys.readouterr()
        assert main(["remove", "--index", name, "dupA/same.md"]) == 2  # gone: names none
        assert "has no document 'dupA/same.md'" in capsys.readouterr().err
        assert main(["remove", "--index", name, "same.md" if plain else "dupB/same.md"]) == 0
        assert "removed: same.md (" in capsys.readouterr().err
        assert {d.source for d in list_documents(name).documents} == {str(b / "other.md")}

    # dupB/same.md was the name of p/dupB's and of q/dupB's (beside dupA's): refused, naming both
    c = write_docs(tmp_path / "p" / "dupB", {"same.md": "# Same\n\nCats.\n"})
    d = write_docs(tmp_path / "q" / "dupB", {"same.md": "# Same\n\nDogs.\n"})
    name = f"amb-{tmp_path.name}"
    ingest([a, c, d], index=name, encoder=str(tiny_mlm_dir), progress=False)
    before = paths()
    assert sorted(before) == sorted(
        [f"{tmp_path.name}/dupA/same.md", "p/dupB/same.md", "q/dupB/same.md"]
    )
    with pytest.raises(AmbiguousDocumentError) as err:
        remove_documents(name, ["dupB/same.md"])
    assert err.value.candidates == ["p/dupB/same.md", "q/dupB/same.md"]
    capsys.readouterr()
    assert main(["remove", "--index", name, "dupB/same.md"]) == 2
    said = capsys.readouterr().err.strip()
    assert "\n" not in said and "'p/dupB/same.md', 'q/dupB/same.md'" in said, said
    assert str(tmp_path) not in said and paths() == before
    assert main(["remove", "--index", name, "dupA/same.md"]) == 0  # one document's: taken
    assert paths() == ["p/dupB/same.md", "q/dupB/same.md"]


def test_reingest_brings_back_only_what_is_still_in_the_folder(tmp_path, tiny_mlm_dir):
    """The rule (docs/ingestion.md): removing takes a document out of the index, not out of
    the folder; the next ingest of the folder adds back a removed file still there (as
    ``added``) and not one deleted from it."""
    name, docs = make_index(tmp_path, tiny_mlm_dir, "faiss")
    before = index_state(name)
    remove_documents(name, ["notes.txt", "errors.rst"])
    (docs / "errors.rst").unlink()
    again = ingest([docs], index=name, progress=False)
    assert again.added == [str(docs / "notes.txt")] and not again.removed
    paths = [d.path for d in list_documents(name).documents]
    assert "notes.txt" in paths and "errors.rst" not in paths
    restored = index_state(name)
    keep = {k: v for k, v in before["sources"].items() if not k.endswith("errors.rst")}
    assert restored["sources"] == keep  # the same chunks as before the removal


# ---------------------------------------------------------------------- kill -9 mid-removal

CRASH_POINTS = ["after-vectors", "after-bm25", "before-publish", "after-rename", "after-pointer"]


def run_remove(name: str, paths: list[str], crash: str | None = None) -> tuple[int, str]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop(CRASH_ENV, None)
    if crash:
        env[CRASH_ENV] = crash
    proc = subprocess.run(
        [sys.executable, "-m", "rag.docs", "remove", "--index", name, *paths],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    return proc.returncode, proc.stderr


@pytest.mark.parametrize(
    ("backend", "point"),
    [("faiss", p) for p in CRASH_POINTS] + [("chroma", "after-bm25"), ("chroma", "after-pointer")],
)
def test_kill9_mid_removal(tmp_path, tiny_mlm_dir, backend, point):
    name, docs = make_index(tmp_path, tiny_mlm_dir, backend)
    ref, _ = make_index(tmp_path, tiny_mlm_dir, backend, name=f"ref-{name}")
    remove_documents(ref, ["notes.txt", "library/"])
    reference, before = index_state(ref), index_state(name)

    code, err = run_remove(name, ["notes.txt", "library/"], crash=point)
    assert code == -signal.SIGKILL, err[-2000:]
    state = index_state(name)  # loads whole: the old generation, or (after the pointer) the new
    assert state in (before, reference)
    assert Retriever.from_settings(name).search("zebra stripes", k=3, mode="hybrid")
    if state == before:
        code, err = run_remove(name, ["notes.txt", "library/"])
        assert code == 0, err
    else:  # published before the kill: the paths are gone, and saying so changes nothing
        code, err = run_remove(name, ["notes.txt"])
        assert code == 2 and "'notes.txt'" in err
    assert index_state(name) == reference
    root = index_dir(name)
    assert not list(root.glob(".*.tmp-*"))  # the killed run's leftovers were cleaned
    if backend == "chroma":
        ids = collection_ids(name)
        assert set(reference["chunks"]) <= ids and ids == kept_chunk_ids(root)
