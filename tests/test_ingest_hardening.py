"""Ingest hardening (docs/security.md): links that leave the folder, index names, refused runs
that leave nothing behind, a capped --chunk-tokens said out loud, skipped types, quiet pypdf."""

from __future__ import annotations

import io
import json
import os

import pytest
from ingest_support import write_docs

from rag.documents import SOURCE_OF_PAGE
from rag.documents.chunking import indexed_text
from rag.ingest import ingest, main
from rag.ingest.config import effective_chunking, same_chunking
from rag.retrieval.retriever import Retriever
from rag.retrieval.settings import RetrievalSettings
from rag.storage.manifest import open_generation, read_manifest
from rag.storage.paths import indexes_dir, rag_home

SECRET = "Zanzibar passphrase: the okapi sleeps at noon.\n"


def run(argv: list[str], capsys) -> tuple[int, dict | None, list[str]]:
    """(exit status, the --json report or None, stderr lines) of ``rag.ingest`` in-process."""
    try:
        code = main([*argv, "--no-progress"])
    except SystemExit as e:  # argparse errors
        code = e.code
    cap = capsys.readouterr()
    return code, json.loads(cap.out) if cap.out.strip() else None, cap.err.strip().splitlines()


@pytest.fixture
def linked_docs(tmp_path):
    """A folder with a good file, a link to a secret outside it, a link inside it, a linked
    outside folder and a link cycle back to itself."""
    docs = write_docs(tmp_path / "docs", {"good.md": "# Good\n\nOrdinary words about files.\n"})
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.md").write_text(SECRET, encoding="utf-8")
    (outside / "more.md").write_text("Quokkas are marsupials.\n", encoding="utf-8")
    os.symlink(outside / "secret.md", docs / "leak.md")
    os.symlink("good.md", docs / "alias.md")  # stays inside: read as usual
    os.symlink(outside, docs / "linked")
    os.symlink(".", docs / "cycle")
    return docs


def test_symlink_outside_folder_is_reported_not_read(linked_docs, tiny_mlm_dir, capsys):
    code, out, err = run(
        [str(linked_docs), "--index", "links", "--encoder", str(tiny_mlm_dir), "--json"], capsys
    )
    assert code == 1
    reasons = {os.path.basename(f["path"]): f["reason"] for f in out["failures"]}
    secret = os.path.realpath(linked_docs.parent / "outside" / "secret.md")
    assert reasons["leak.md"].startswith(f"symlink points outside the ingested folder: {secret}")
    assert "not followed" in reasons["linked"] and "not followed" in reasons["cycle"]
    assert sorted(os.path.basename(p) for p in out["added"]) == ["alias.md", "good.md"]
    assert any(line.startswith("failed: ") and "leak.md" in line for line in err)
    r = Retriever.from_settings("links")
    assert all("Zanzibar" not in c.text for c in r.chunks.values())


def test_follow_links_reads_them_and_ends_cycles(linked_docs, tiny_mlm_dir, capsys):
    code, out, _ = run(
        [str(linked_docs), "--index", "followed", "--encoder", str(tiny_mlm_dir)]
        + ["--follow-links", "--json"],
        capsys,
    )
    assert code == 0, out["failures"]
    added = {os.path.relpath(p, linked_docs) for p in out["added"]}
    assert {"leak.md", "good.md", "alias.md", os.path.join("linked", "more.md")} <= added
    assert not any(p.startswith("cycle") for p in added)  # the folder is walked once
    # one file, two links: both indexed (a search returns the text once, near-duplicate hits
    # left out by default; docs/retrieval.md)
    every = RetrievalSettings(dedup=None)
    hits = Retriever.from_settings("followed", every).search(
        "Zanzibar passphrase", k=2, mode="bm25"
    )
    assert {h.chunk.path for h in hits} == {"leak.md", "linked/secret.md"}
    hits = Retriever.from_settings("followed").search("Zanzibar passphrase", k=2, mode="bm25")
    assert len(hits) == 1 and hits[0].chunk.path in {"leak.md", "linked/secret.md"}
    # Without the flag again, the link's chunks leave the index.
    code, out, _ = run([str(linked_docs), "--index", "followed", "--json"], capsys)
    assert code == 1 and any(p.endswith("leak.md") for p in out["removed"])


@pytest.mark.parametrize("name", ["../../escape", "/tmp/abs", "a/b", ".hidden", "-flag", "a..b"])
def test_index_takes_names_only(name, tmp_path, capsys):
    code, _, err = run([str(write_docs(tmp_path / "docs")), f"--index={name}"], capsys)
    assert code == 2 and len(err) == 1 and "Traceback" not in err[0]
    assert err[0].startswith("rag.ingest: error: index name") and repr(name) in err[0]
    assert "--index-dir" in err[0]
    assert not (rag_home().parent / "escape").exists() and not (tmp_path / "escape").exists()


def test_index_dir_is_explicit(tmp_path, tiny_mlm_dir, capsys):
    where = tmp_path / "elsewhere" / "my-index"
    docs = str(write_docs(tmp_path / "docs"))
    code, out, _ = run([docs, "--index-dir", str(where), "--encoder", str(tiny_mlm_dir)], capsys)
    assert code == 0 and (where / "CURRENT").is_file()
    assert not (indexes_dir() / "my-index").exists()
    assert len(Retriever.from_settings(where)) > 0
    code, _, err = run([docs, "--index", "x", "--index-dir", str(where)], capsys)
    assert code == 2 and len(err) == 1 and "not allowed with" in err[0]


@pytest.mark.parametrize(
    "flags,says",
    [
        (["--chunk-tokens", "0"], "--chunk-tokens must be at least 8, not 0"),
        (["--chunk-tokens", "64", "--overlap", "64"], "--overlap must be in [0, 32)"),
        (["--overlap", "-1"], "--overlap must be in"),
        (["--max-bytes", "0"], "--max-bytes must be positive"),
        (["--encoder", "/no/such/encoder"], "/no/such/encoder"),
    ],
)
def test_refused_ingest_leaves_no_index_folder(flags, says, tmp_path, capsys):
    docs = str(write_docs(tmp_path / "docs"))
    code, _, err = run([docs, "--index", "refused", *flags], capsys)
    assert code == 2 and len(err) == 1 and says in err[0]
    assert not (indexes_dir() / "refused").exists()
    nested = tmp_path / "new" / "deeper" / "idx"
    code, _, _ = run([docs, "--index-dir", str(nested), *flags], capsys)
    assert code == 2 and not (tmp_path / "new").exists()


def test_failure_after_creation_removes_only_a_new_index(tmp_path, tiny_mlm_dir, monkeypatch):
    import rag.ingest.apply as ingest_mod

    docs = write_docs(tmp_path / "docs")

    def boom(*a, **kw):
        raise RuntimeError("disk on fire")

    real = ingest_mod.plan_changes
    monkeypatch.setattr(ingest_mod, "plan_changes", boom)
    with pytest.raises(RuntimeError, match="disk on fire"):
        ingest([docs], index="fresh", encoder=str(tiny_mlm_dir), progress=False)
    assert not (indexes_dir() / "fresh").exists()
    monkeypatch.setattr(ingest_mod, "plan_changes", real)
    first = ingest([docs], index="kept", encoder=str(tiny_mlm_dir), progress=False)
    monkeypatch.setattr(ingest_mod, "plan_changes", boom)
    with pytest.raises(RuntimeError):
        ingest([docs], index="kept", progress=False)
    assert (
        len(Retriever.from_settings("kept")) == first.chunks
    )  # an existing index is never removed


def test_chunk_tokens_above_the_encoder_limit_is_capped_and_said(tmp_path, tiny_mlm_dir, capsys):
    docs = str(write_docs(tmp_path / "docs"))
    argv = [docs, "--index", "cap", "--encoder", str(tiny_mlm_dir), "--chunk-tokens", "100000"]
    code, out, err = run([*argv, "--json"], capsys)
    _, gen, manifest = open_generation("cap")
    limit = manifest.chunking["max_tokens"]
    assert code == 0 and limit < 100000
    assert manifest.chunking["chunk_tokens"] == limit == out["chunking"]["chunk_tokens"]
    assert manifest.chunking["requested_chunk_tokens"] == 100000
    assert any(f"capped at {limit} tokens" in n for n in out["notes"])
    assert any(line.startswith("note: --chunk-tokens 100000") for line in err)
    # An index written before effective values were stored (requested ones in the manifest)
    # makes the same chunks: re-ingesting it must embed nothing.
    old = dict(manifest.chunking, chunk_tokens=100000, overlap=32)
    del old["requested_chunk_tokens"], old["requested_overlap"]
    m = read_manifest(gen)
    m.chunking = old
    (gen / "manifest.json").write_text(m.to_json())
    again = ingest([docs], index="cap", chunk_tokens=100000, progress=False)
    assert again.chunks_embedded == 0 and len(again.unchanged) == len(out["added"])


def test_same_chunking_compares_effective_values():
    old_style = {"chunk_tokens": 256, "overlap": 32, "max_tokens": 254}  # minilm's old manifests
    assert same_chunking(old_style, effective_chunking(256, 32, 254))
    assert same_chunking(old_style, effective_chunking(300, 32, 254))  # same chunks either way
    assert not same_chunking(old_style, effective_chunking(128, 32, 254))
    assert not same_chunking({}, effective_chunking(256, 32, 254))
    # indexed without the file and headings line: a run with --context embeds it all again
    assert not same_chunking(old_style, effective_chunking(256, 32, 254, context=True))
    assert same_chunking(
        {**old_style, "context": 1}, effective_chunking(256, 32, 254, context=True)
    )


def test_chunks_are_embedded_under_their_file_and_headings(tmp_path, tiny_mlm_dir, capsys):
    """The vector of a chunk is its text's under the line naming its file and headings
    (``indexed_text``: the query made of exactly that text scores 1); BM25 and the stored,
    shown text are the chunk's own. Without ``--context`` (the default) the text alone."""
    body = "All listed refs are deleted from the remote repository.\n"
    docs = write_docs(tmp_path / "docs", {"okapi-push.md": f"# Wombat options\n\n{body}"})
    for name, flags, context in (("ctx", ["--context"], True), ("plain", [], False)):
        code, _, _ = run(
            [str(docs), "--index", name, "--encoder", str(tiny_mlm_dir), *flags], capsys
        )
        assert code == 0
        r = Retriever.from_settings(name)
        (chunk,) = r.chunks.values()
        assert chunk.text.startswith("# Wombat") and "okapi" not in chunk.text
        assert not r.search("okapi", k=1, mode="bm25")  # the file name is not a BM25 term
        embedded = indexed_text(chunk, context)
        assert embedded.startswith("okapi-push › Wombat options\n") == context
        for query, exact in ((embedded, True), (indexed_text(chunk, not context), False)):
            (hit,) = r.search(query, k=1, mode="dense")
            assert (abs(hit.score - 1.0) < 1e-4) == exact, (name, query, hit.score)
        assert open_generation(name)[2].chunking["context"] == context
    # the same folder into the plain index with the line: everything again, and the note says why
    code, out, err = run([str(docs), "--index", "plain", "--context", "--json"], capsys)
    assert code == 0 and out["chunks_embedded"] == 1
    assert [line for line in err if line.startswith("note: re-embedding")] == [
        "note: re-embedding every document: the index was written without the line naming each "
        "chunk's file and headings (--context)"
    ]
    code, out, err = run([str(docs), "--index", "plain", "--context", "--json"], capsys)
    assert out["chunks_embedded"] == 0 and not any("re-embedding" in line for line in err)


def test_unsupported_types_are_listed_as_skipped(tmp_path, tiny_mlm_dir, capsys):
    docs = write_docs(tmp_path / "docs")
    (docs / "photo.png").write_bytes(b"\x89PNG\r\n")
    (docs / "table.csv").write_text("a,b\n1,2\n")
    (docs / ".hidden.png").write_bytes(b"x")  # hidden files stay silent
    code, out, err = run(
        [str(docs), "--index", "skip", "--encoder", str(tiny_mlm_dir), "--json"], capsys
    )
    assert code == 0 and out["counts"]["skipped"] == 2
    reasons = {os.path.basename(s["path"]): s["reason"] for s in out["skipped"]}
    assert reasons == {
        "photo.png": "unsupported file type '.png'",
        "table.csv": "unsupported file type '.csv'",
    }
    assert any(line.startswith("skipped: ") and "photo.png" in line for line in err)
    assert "0 failed, 2 skipped files" in err[-1]
    # an HTML manual's scripts and fonts: one line per reason shared by three files or more
    for name in ("a.js", "b.js", "c.js", "d.woff2"):
        (docs / name).write_bytes(b"x")
    code, out, err = run(
        [str(docs), "--index", "skip", "--encoder", str(tiny_mlm_dir), "--json"], capsys
    )
    assert out["counts"]["skipped"] == 6 and len(out["skipped"]) == 6  # --json: every file
    skipped = [line for line in err if line.startswith("skipped: ")]
    assert f"skipped: 3 files: unsupported file type '.js' (first: {docs / 'a.js'})" in skipped
    assert len(skipped) == 4  # the group, the font, the image, the table


def test_a_file_with_no_text_is_skipped_not_failed(tmp_path, tiny_mlm_dir, capsys):
    """A blank file, or an HTML page that is navigation only (mdBook's ``toc.html`` beside
    every book's pages), is read without error and holds nothing: it is passed over as
    skipped, with its reason, and the run exits 0 (it used to count as failed, exit 1, for
    every mdBook folder). A document that turns blank leaves the index; a new index of blank
    files only is not created."""
    docs = write_docs(tmp_path / "docs")
    (docs / "blank.md").write_text("   \n\n")
    (docs / "toc.html").write_text(
        "<html><head><style>p {}</style><script>var toc = 1;</script></head><body></body></html>"
    )
    enc = ["--encoder", str(tiny_mlm_dir)]
    code, out, err = run([str(docs), "--index", "blank", *enc, "--json"], capsys)
    assert code == 0 and out["counts"]["failed"] == 0
    reasons = {os.path.basename(s["path"]): s["reason"] for s in out["skipped"]}
    assert reasons == {
        "blank.md": "no text (empty after cleaning)",
        "toc.html": reasons["toc.html"],
    }
    assert reasons["toc.html"] == "no text (empty after cleaning)"
    assert f"skipped: {docs / 'blank.md'}: no text (empty after cleaning)" in err
    held = sorted(os.path.basename(k) for k in open_generation("blank")[2].sources)
    assert "blank.md" not in held and held  # the other files are in
    # a stored document emptied: skipped, and removed from the index (not kept, not failed)
    first = held[0]
    (docs / first).write_text("\n")
    code, out, err = run([str(docs), "--index", "blank", *enc, "--json"], capsys)
    assert code == 0 and out["counts"]["failed"] == 0 and out["counts"]["removed"] == 1
    assert first not in {os.path.basename(k) for k in open_generation("blank")[2].sources}
    # nothing but blank files: no index is created, exit 1, and the line says why
    only = tmp_path / "only"
    only.mkdir()
    (only / "a.md").write_text(" ")
    code, out, err = run([str(only), "--index", "only-blank", *enc], capsys)
    assert code == 1 and not (indexes_dir() / "only-blank").exists()
    assert err[-1] == (
        "rag.ingest: error: no document could be read (no file holds text); nothing was "
        "ingested and index 'only-blank' was not created"
    )


PRINT_PAGE = (
    '<html><head><meta charset="UTF-8"><meta content="noindex" name="robots">'
    "<title>Print</title></head><body><h1>Guide</h1><p>Frobnicators read widgets.</p>"
    "</body></html>"
)


def test_a_page_that_asks_not_to_be_indexed_is_skipped_unless_told(tmp_path, tiny_mlm_dir, capsys):
    """mdBook's print.html (the whole book again in one page) says noindex in its head: it is
    passed over as skipped, with the reason naming the flag that reads it; the flag does."""
    docs = write_docs(tmp_path / "docs")
    (docs / "print.html").write_text(PRINT_PAGE)
    enc = ["--encoder", str(tiny_mlm_dir)]
    code, out, err = run([str(docs), "--index", "noindex", *enc, "--json"], capsys)
    assert code == 0 and out["counts"]["failed"] == 0
    reasons = {os.path.basename(s["path"]): s["reason"] for s in out["skipped"]}
    assert reasons == {
        "print.html": 'the page asks not to be indexed (<meta name="robots" '
        'content="noindex">; --no-skip-noindex reads it)'
    }
    held = {os.path.basename(k) for k in open_generation("noindex")[2].sources}
    assert "print.html" not in held
    code, out, err = run(
        [str(docs), "--index", "noindex", *enc, "--no-skip-noindex", "--json"], capsys
    )
    assert code == 0 and out["counts"]["added"] == 1 and not out["skipped"]
    assert "print.html" in {os.path.basename(k) for k in open_generation("noindex")[2].sources}


def test_the_sources_of_rendered_pages_are_skipped_unless_told(tmp_path, tiny_mlm_dir, capsys):
    """A Sphinx build holds every page twice (``_sources/*.rst.txt`` beside the ``.html``), Node's
    API docs ``fs.md`` beside ``fs.html``: the rendered page is read and cited, its source
    passed over as skipped (one line for all), and removed from an index that held it; a text
    file with no page rendered from it is read; ``--no-skip-sources`` reads both."""
    docs = tmp_path / "build"
    page = "<html><body><h1>{0}</h1><p>{0} widgets frobnicate gently.</p></body></html>"
    for rel in ("index.html", "guide/intro.html", "api/fs.html"):
        (docs / rel).parent.mkdir(parents=True, exist_ok=True)
        (docs / rel).write_text(page.format(rel))
    sources = ["_sources/index.rst.txt", "_sources/guide/intro.rst.txt", "api/fs.md"]
    for rel in [*sources, "_sources/orphan.rst.txt", "notes.md"]:
        (docs / rel).parent.mkdir(parents=True, exist_ok=True)
        (docs / rel).write_text(f"{rel}\n\nWidgets frobnicate gently, says {rel}.\n")
    enc = ["--encoder", str(tiny_mlm_dir)]
    both = ["--no-skip-sources", "--json"]
    code, out, _ = run([str(docs), "--index", "sources", *enc, *both], capsys)
    assert code == 0 and out["counts"]["added"] == 8 and not out["skipped"]
    code, out, err = run([str(docs), "--index", "sources", *enc, "--json"], capsys)
    assert code == 0 and out["counts"]["removed"] == 3 and out["counts"]["failed"] == 0
    skipped = {os.path.relpath(s["path"], docs): s["reason"] for s in out["skipped"]}
    assert skipped == {rel: SOURCE_OF_PAGE for rel in sources}
    held = {os.path.relpath(k, docs) for k in open_generation("sources")[2].sources}
    assert held == {
        "index.html",
        "guide/intro.html",
        "api/fs.html",
        "_sources/orphan.rst.txt",
        "notes.md",
    }
    code, _, err = run([str(docs), "--index", "sources", *enc], capsys)
    assert any(line.startswith(f"skipped: 3 files: {SOURCE_OF_PAGE} (first: ") for line in err)


def test_pypdf_warnings_stay_off_stderr(tmp_path, tiny_mlm_dir, capsys, caplog):
    from pypdf import PdfWriter

    docs = write_docs(tmp_path / "docs")
    writer = PdfWriter()
    writer.add_blank_page(width=200, height=200)
    buf = io.BytesIO()
    writer.write(buf)
    data = buf.getvalue()
    # a wrong startxref pointer: pypdf repairs it and logs warnings about it
    (docs / "damaged.pdf").write_bytes(
        data[: data.rindex(b"startxref")] + b"startxref\n999999\n%%EOF\n"
    )
    code, out, err = run([str(docs), "--index", "pdf", "--encoder", str(tiny_mlm_dir)], capsys)
    assert code == 1
    # Python prints an unhandled logger's warnings on stderr (pytest captures them as records)
    assert not [r.getMessage() for r in caplog.records if r.name.startswith("pypdf")]
    assert not any("startxref" in line for line in err)
    assert [line for line in err if "damaged.pdf" in line] == [
        f"failed: {docs / 'damaged.pdf'}: no text on its pages (scanned images? make it "
        "searchable first, e.g. with ocrmypdf)"
    ]
