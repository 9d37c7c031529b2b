"""Hostile and broken inputs, third round (issue 47, docs/security.md): one bad file never stops a
folder, a DOCS path that vanished never empties an index, a typo creates nothing, and every file
is bounded in pages and time (loading and chunking, inside a PDF page too). Every hostile input
is generated here, in ``tmp_path``: PDFs as raw bytes, names as raw bytes."""

from __future__ import annotations

import json
import os
import shutil
import zlib
from pathlib import Path

import pytest
from ingest_support import write_docs
from test_ingest import index_state

from rag.documents import Deadline, DocumentError, Limits, load_document
from rag.documents import limits as doc_limits
from rag.ingest import ingest, list_documents, main
from rag.storage.manifest import current_generation, index_dir
from rag.storage.paths import indexes_dir

GOOD = {"good.md": "# Good\n\nOrdinary words about zebras and files.\n"}
FONT = b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>"


# ---- raw PDFs -----------------------------------------------------------------------------------


def pdf(objects: list[bytes]) -> bytes:
    """A PDF whose object ``i + 1`` is ``objects[i]`` (object 1 the catalog), with its xref."""
    out = bytearray(b"%PDF-1.4\n")
    offsets = []
    for i, body in enumerate(objects, start=1):
        offsets.append(len(out))
        out += b"%d 0 obj\n%s\nendobj\n" % (i, body)
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1)
    out += b"".join(b"%010d 00000 n \n" % off for off in offsets)
    out += b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (
        len(objects) + 1,
        xref,
    )
    return bytes(out)


def flate(data: bytes) -> bytes:
    packed = zlib.compress(data, 9)
    return b"<< /Length %d /Filter /FlateDecode >>\nstream\n%s\nendstream" % (len(packed), packed)


def page(parent: int, contents: int, font: int) -> bytes:
    return (
        b"<< /Type /Page /Parent %d 0 R /MediaBox [0 0 612 792] /Contents %d 0 R "
        b"/Resources << /Font << /F1 %d 0 R >> >> >>" % (parent, contents, font)
    )


def text_pdf(*contents: bytes) -> bytes:
    """A PDF with one page per content stream (flate-compressed)."""
    n = len(contents)
    kids = b" ".join(b"%d 0 R" % (3 + 2 * i) for i in range(n))
    objs = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        b"<< /Type /Pages /Kids [%s] /Count %d >>" % (kids, n),
    ]
    font = 3 + 2 * n
    for i, content in enumerate(contents):
        objs += [page(2, 4 + 2 * i, font), flate(content)]
    return pdf([*objs, FONT])


def words(text: str) -> bytes:
    return b"BT /F1 12 Tf 72 712 Td (%s) Tj ET" % text.encode()


def deep_tree_pdf(depth: int) -> bytes:
    """One page under ``depth`` nested /Pages nodes (pypdf stops at 100: LimitReachedError)."""
    objs = [b"<< /Type /Catalog /Pages 2 0 R >>"]
    for i in range(depth):
        me = 2 + i
        parent = b"" if i == 0 else b" /Parent %d 0 R" % (me - 1)
        objs.append(b"<< /Type /Pages /Kids [%d 0 R] /Count 1%s >>" % (me + 1, parent))
    leaf = 2 + depth
    objs += [page(leaf - 1, leaf + 1, leaf + 2), flate(words("Deep")), FONT]
    return pdf(objs)


def run(argv: list[str], capsys) -> tuple[int, dict | None, list[str]]:
    """(exit status, the --json report or None, stderr lines) of ``rag.ingest`` in-process."""
    code = main([*argv, "--no-progress", "--json"])
    cap = capsys.readouterr()
    return code, json.loads(cap.out) if cap.out.strip() else None, cap.err.strip().splitlines()


def names(paths: list[str]) -> list[str]:
    return sorted(Path(p).name for p in paths)


# ---- one bad file never stops a folder ----------------------------------------------------------


def test_a_pdf_page_tree_deeper_than_100_fails_alone(tmp_path, tiny_mlm_dir, capsys):
    """Case 1: pypdf's LimitReachedError was 'unexpected LimitReachedError', exit 1, the file
    not named, good.md not ingested; on an existing index nothing updated."""
    docs = write_docs(tmp_path / "docs", GOOD)
    (docs / "deep.pdf").write_bytes(deep_tree_pdf(150))
    enc = ["--encoder", str(tiny_mlm_dir)]
    code, out, err = run([str(docs), "--index", "deep", *enc], capsys)
    assert code == 1 and names(out["added"]) == ["good.md"]
    [failure] = out["failures"]
    assert failure["path"].endswith("deep.pdf") and "LimitReachedError" in failure["reason"]
    assert "page tree depth" in failure["reason"]
    assert any(line.startswith("failed: ") and "deep.pdf" in line for line in err)
    # an existing index: the new file added, the deleted one removed, the PDF reported again
    (docs / "new.md").write_text("# New\n\nOkapis live in forests.\n", encoding="utf-8")
    (docs / "good.md").unlink()
    code, out, _ = run([str(docs), "--index", "deep"], capsys)
    assert code == 1 and names(out["added"]) == ["new.md"] and names(out["removed"]) == ["good.md"]
    assert [d.path for d in list_documents("deep").documents] == ["new.md"]


def test_a_pdf_whose_page_expands_past_max_bytes_fails_alone(tmp_path, tiny_mlm_dir):
    """A decompression bomb: a few KB on disk, its page's content 3 MB once inflated; refused
    at --max-bytes (1 MB here) before pypdf parses it."""
    docs = write_docs(tmp_path / "docs", GOOD)
    bomb = text_pdf(words("Bomb") + b" " * 3_000_000)
    assert len(bomb) < 10_000
    (docs / "bomb.pdf").write_bytes(bomb)
    report = ingest(
        [docs], index="bomb", encoder=str(tiny_mlm_dir), max_bytes=1_000_000, progress=False
    )
    [(path, reason)] = report.failures
    assert path.endswith("bomb.pdf") and "page 1 content expands to 3,0" in reason
    assert names(report.added) == ["good.md"]


def test_any_exception_of_a_loader_or_the_chunker_is_that_files_failure(
    tmp_path, tiny_mlm_dir, monkeypatch
):
    """Whatever a parser or the chunker raises (here a KeyError and a MemoryError, as a library
    bug or a bomb would) names the file and its reason; the rest is ingested and published."""
    import rag.ingest.plan as plan

    docs = write_docs(
        tmp_path / "docs", {**GOOD, "boom.md": "# Boom\n\nx\n", "oom.md": "# Oom\n\ny\n"}
    )
    real = plan.chunk_document

    def chunk(doc, *a, **kw):
        if doc.path.endswith("boom.md"):
            raise KeyError("no such glyph")
        if doc.path.endswith("oom.md"):
            raise MemoryError()
        return real(doc, *a, **kw)

    monkeypatch.setattr(plan, "chunk_document", chunk)
    report = ingest([docs], index="boom", encoder=str(tiny_mlm_dir), progress=False)
    reasons = {Path(p).name: r for p, r in report.failures}
    assert reasons == {
        "boom.md": "could not be chunked (KeyError: 'no such glyph')",
        "oom.md": "could not be chunked (MemoryError)",
    }
    assert names(report.added) == ["good.md"] and report.generation


def test_a_file_name_that_is_not_utf8_is_reported_escaped_and_the_rest_ingested(
    tmp_path, tiny_mlm_dir, capsys
):
    """Case 5: 'caf\\xe9.md' stopped the run (exit 2, "'utf-8' codec can't encode character
    '\\udce9'" in chunk_id, the file not named). Now it is one failed line, escaped, and so is
    a folder so named (once, for all it holds); the JSON report holds no lone surrogate."""
    docs = write_docs(tmp_path / "docs", GOOD)
    raw = os.fsencode(docs)
    with open(raw + b"/caf\xe9.md", "wb") as f:
        f.write(b"# Cafe\n\nCoffee.\n")
    os.mkdir(raw + b"/d\xffr")
    with open(raw + b"/d\xffr/inner.md", "wb") as f:
        f.write(b"# Inner\n\nTea.\n")
    code, out, err = run([str(docs), "--index", "cafe", "--encoder", str(tiny_mlm_dir)], capsys)
    assert code == 1 and names(out["added"]) == ["good.md"]
    failed = {f["path"]: f["reason"] for f in out["failures"]}
    assert set(failed) == {f"{docs}/caf\\xe9.md", f"{docs}/d\\xffr"}
    assert all("not valid UTF-8" in r for r in failed.values())
    assert f"failed: {docs}/caf\\xe9.md: file name is not valid UTF-8" in "\n".join(err)
    assert "folder name" in failed[f"{docs}/d\\xffr"]
    # the index works and a re-run changes nothing
    code, out, _ = run([str(docs), "--index", "cafe"], capsys)
    assert code == 1 and not out["added"] and not out["removed"]


def test_a_hostile_pdf_upload_is_reported_and_the_note_indexed(tmp_path, tiny_mlm_dir):
    """Through the UI's upload: 'internal error (LimitReachedError)' and the note not indexed;
    now the PDF is one failed line and the note is ingested."""
    from ui.config import AppConfig
    from ui.handlers import ChatApp

    name = f"up-{tmp_path.name}"
    ingest([write_docs(tmp_path / "seed", GOOD)], index=name, encoder=str(tiny_mlm_dir))
    (tmp_path / "deep.pdf").write_bytes(deep_tree_pdf(150))
    (tmp_path / "note.md").write_text("# Note\n\nThe okapi note.\n", encoding="utf-8")
    app = ChatApp(AppConfig.of(index=name), lambda cfg: None)
    text = app._upload([tmp_path / "deep.pdf", tmp_path / "note.md"], name)
    assert "internal error" not in text and "failed **deep.pdf**" in text, text
    assert "LimitReachedError" in text
    assert "note.md" in {d.path for d in list_documents(name).documents}


def test_an_upload_passed_over_says_why_in_the_ui(tmp_path, tiny_mlm_dir):
    """A blank page or one that asks not to be indexed, uploaded through the UI, is a skipped
    line with its reason (the summary's count alone said nothing of why)."""
    from ui.config import AppConfig
    from ui.handlers import ChatApp

    name = f"upskip-{tmp_path.name}"
    ingest([write_docs(tmp_path / "seed", GOOD)], index=name, encoder=str(tiny_mlm_dir))
    (tmp_path / "print.html").write_text(
        '<html><head><meta name="robots" content="noindex"></head><body><p>All.</p></body>'
    )
    (tmp_path / "blank.md").write_text("  \n")
    app = ChatApp(AppConfig.of(index=name), lambda cfg: None)
    text = app._upload([tmp_path / "print.html", tmp_path / "blank.md"], name)
    assert "skipped **print.html**: the page asks not to be indexed" in text, text
    assert "skipped **blank.md**: no text (empty after cleaning)" in text, text
    assert "failed" not in text.replace("0 failed", "")


# ---- a DOCS path that vanished never empties an index; a typo creates nothing -------------------


def test_a_vanished_folder_leaves_the_index_untouched(tmp_path, tiny_mlm_dir, capsys):
    """Case 4: renamed away (an unmounted disk), ingested again: '3 removed', exit 1 and an
    empty index published. Now refused, one line, exit 2, the index as it was; the same for
    the folder back but empty; --allow-empty really removes everything."""
    docs = write_docs(tmp_path / "docs", {**GOOD, "b.md": "# B\n\nBees.\n", "c.txt": "Cats.\n"})
    ingest([docs], index="gone", encoder=str(tiny_mlm_dir), progress=False)
    capsys.readouterr()  # the model's loading lines
    root = index_dir("gone")
    before, gen = index_state("gone"), current_generation(root)
    docs.rename(tmp_path / "elsewhere")
    code, out, err = run([str(docs), "--index", "gone"], capsys)
    assert code == 2 and out is None and len(err) == 1, err
    assert "no such file or directory, but index 'gone' holds 3 document(s) from it" in err[0]
    assert "nothing was changed" in err[0] and "--allow-empty" in err[0]
    assert index_state("gone") == before and current_generation(root) == gen

    docs.mkdir()  # the folder is back, empty (its files deleted or not copied back)
    (docs / "photo.png").write_bytes(b"\x89PNG")  # not a document
    code, out, err = run([str(docs), "--index", "gone"], capsys)
    assert code == 2 and len(err) == 1 and "holds no supported file now" in err[0]
    assert index_state("gone") == before and current_generation(root) == gen

    code, out, _ = run([str(docs), "--index", "gone", "--allow-empty"], capsys)
    assert code == 0 and len(out["removed"]) == 3 and out["chunks"] == 0
    assert list_documents("gone").documents == []


def test_an_unreadable_folder_keeps_its_documents(tmp_path, tiny_mlm_dir, capsys, monkeypatch):
    """A sub-folder that cannot be listed (os.walk passed it over, as if empty: its documents
    were removed) is one failed line and its documents stay; a DOCS folder that cannot be
    listed refuses the run. Permission denied is simulated (the tests may run as root)."""
    docs = write_docs(tmp_path / "docs", {**GOOD, "sub/inner.md": "# Inner\n\nTea.\n"})
    ingest([docs], index="locked", encoder=str(tiny_mlm_dir), progress=False)
    capsys.readouterr()
    before = index_state("locked")
    locked: set[str] = {str(docs / "sub")}
    real = os.scandir

    def scandir(path="."):
        if not isinstance(path, int) and os.fspath(path) in locked:  # rmtree passes fds
            raise PermissionError(13, "Permission denied", os.fspath(path))
        return real(path)

    monkeypatch.setattr(os, "scandir", scandir)
    code, out, _ = run([str(docs), "--index", "locked"], capsys)
    assert code == 1 and out and not out["removed"], (code, out, _)
    [failure] = out["failures"]
    assert failure["path"] == str(docs / "sub") and "cannot be read" in failure["reason"]
    assert index_state("locked") == before
    locked.add(str(docs))  # the DOCS folder itself: refused, nothing changes
    code, _, err = run([str(docs), "--index", "locked"], capsys)
    assert code == 2 and len(err) == 1 and "folder cannot be read (Permission denied)" in err[0]
    assert index_state("locked") == before


def test_an_earlier_folder_gone_keeps_its_documents(tmp_path, tiny_mlm_dir, capsys):
    """An index of two folders, one unmounted, the other re-ingested: the missing one's
    documents stay (a note says so) unless --allow-empty."""
    a = write_docs(tmp_path / "a", {"a.md": "# A\n\nAardvarks.\n"})
    b = write_docs(tmp_path / "b", {"b.md": "# B\n\nBadgers.\n"})
    ingest([a], index="two", encoder=str(tiny_mlm_dir), progress=False)
    ingest([b], index="two", progress=False)
    capsys.readouterr()
    shutil.rmtree(a)
    code, out, err = run([str(b), "--index", "two"], capsys)
    assert code == 0 and not out["removed"]
    assert any(line.startswith("note: ") and "a.md" not in line and str(a) in line for line in err)
    assert {d.path for d in list_documents("two").documents} == {"a.md", "b.md"}
    code, out, _ = run([str(b), "--index", "two", "--allow-empty"], capsys)
    assert code == 0 and names(out["removed"]) == ["a.md"]


def test_a_missing_folder_creates_no_index(tmp_path, capsys):
    """Case 9: `rag.ingest /does-not-exist --index typo` exited 1 but published an empty index
    that then appeared as a model and in the UI. Now: exit 2 before anything is written; the
    same for a folder without a single document."""
    missing = tmp_path / "does-not-exist"
    code, out, err = run([str(missing), "--index", "typo"], capsys)
    assert code == 2 and out is None and len(err) == 1
    assert f"{missing}: no such file or directory; nothing was ingested" in err[0]
    assert not (indexes_dir() / "typo").exists()
    code, _, _ = run([str(missing), "--index-dir", str(tmp_path / "new" / "idx")], capsys)
    assert code == 2 and not (tmp_path / "new").exists()
    (tmp_path / "empty").mkdir()
    code, _, err = run([str(tmp_path / "empty"), "--index", "typo"], capsys)
    assert code == 2 and "no supported file to ingest" in err[0]
    assert not (indexes_dir() / "typo").exists()


# ---- a run that reads nothing publishes nothing; a stored document that turns unreadable stays --


def test_a_new_index_of_which_no_file_could_be_read_is_not_created(tmp_path, tiny_mlm_dir, capsys):
    """A new index whose every file failed (a hostile PDF only, a name that is not UTF-8 only,
    a symbolic link loop only) was published empty: exit 1, 0 documents, listed as a model.
    Now nothing is created: the per-file lines, one line saying no document could be read
    (with the count), exit 1. An existing index where every file fails is left as it was,
    even where a file was deleted from its folder meanwhile (--allow-empty removes it)."""
    from rag.storage.paths import list_indexes

    pdf_only = tmp_path / "pdf"
    pdf_only.mkdir()
    (pdf_only / "deep.pdf").write_bytes(deep_tree_pdf(150))
    name_only = tmp_path / "name"
    name_only.mkdir()
    with open(os.fsencode(name_only) + b"/caf\xe9.md", "wb") as f:
        f.write(b"# Cafe\n\nCoffee.\n")
    loop_only = tmp_path / "loop"
    loop_only.mkdir()
    os.symlink("b.md", loop_only / "a.md")
    os.symlink("a.md", loop_only / "b.md")
    enc = ["--encoder", str(tiny_mlm_dir)]
    for docs, failed in ((pdf_only, 1), (name_only, 1), (loop_only, 2)):
        code, out, err = run([str(docs), "--index", "nothing-read", *enc], capsys)
        assert code == 1 and out is None, (docs, code, out, err)
        err = [line for line in err if not line.startswith("Loading weights")]  # in-process
        assert [line for line in err if line.startswith("failed: ")] == err[:-1]
        assert len(err) == failed + 1, err
        files = f"{failed} file{'s' if failed > 1 else ''} failed"
        assert err[-1] == (
            f"rag.ingest: error: no document could be read ({files}); nothing was ingested "
            "and index 'nothing-read' was not created"
        ), err
        assert (
            not (indexes_dir() / "nothing-read").exists() and "nothing-read" not in list_indexes()
        )
    assert "symbolic link loop" in err[0]
    code, _, _ = run([str(pdf_only), "--index-dir", str(tmp_path / "new" / "idx"), *enc], capsys)
    assert code == 1 and not (tmp_path / "new").exists()

    docs = write_docs(tmp_path / "docs", {**GOOD, "b.md": "# B\n\nBees.\n"})
    kept = f"kept-{tmp_path.name}"
    ingest([docs], index=kept, encoder=str(tiny_mlm_dir), progress=False)
    capsys.readouterr()
    root = index_dir(kept)
    before, gen = index_state(kept), current_generation(root)
    for given in (pdf_only, loop_only):  # another folder whose every file fails
        code, out, err = run([str(given), "--index", kept], capsys)
        assert code == 1 and out["chunks"] == len(before["chunks"]) and not out["removed"]
        assert index_state(kept) == before and current_generation(root) == gen
    (docs / "b.md").unlink()  # deleted, and the folder's one other file now fails
    (docs / "good.md").write_bytes(b"\x00binary")
    code, out, err = run([str(docs), "--index", kept], capsys)
    assert code == 1 and not out["removed"] and not out["updated"], out
    assert any(
        f"no document could be read (1 file failed): index '{kept}' was not changed" in line
        for line in err
    ), err
    assert index_state(kept) == before and current_generation(root) == gen
    code, out, _ = run([str(docs), "--index", kept, "--allow-empty"], capsys)
    assert code == 1 and names(out["removed"]) == ["b.md"]
    assert [d.path for d in list_documents(kept).documents] == ["good.md"]


def test_a_stored_document_that_turns_unreadable_keeps_its_previous_version(
    tmp_path, tiny_mlm_dir, capsys
):
    """A good doc.pdf ingested, then overwritten by a hostile PDF and re-ingested, was reported
    failed while its chunks went (and the summary said 0 removed). Now a stored document that
    fails to load (an invalid PDF, a file now over --max-bytes, one now binary) keeps its
    previous version, its line says so, and it counts neither as removed nor as updated; a
    file deleted from the folder is still removed. Mended, it is updated at the next run."""
    from rag.retrieval.retriever import Retriever

    docs = write_docs(
        tmp_path / "docs",
        {
            **GOOD,
            "doc.md": "# Doc\n\nAardvarks dig burrows.\n",
            "bin.md": "# Bin\n\nBison.\n",
            "gone.md": "# Gone\n\nGnus.\n",
        },
    )
    (docs / "doc.pdf").write_bytes(text_pdf(words("Okapis live in forests")))
    turned = f"turned-{tmp_path.name}"
    ingest([docs], index=turned, encoder=str(tiny_mlm_dir), progress=False)
    capsys.readouterr()
    before = index_state(turned)
    (docs / "doc.pdf").write_bytes(deep_tree_pdf(150))  # overwritten by a hostile PDF
    (docs / "doc.md").write_text("# Doc\n\n" + "Aardvarks. " * 2000, encoding="utf-8")  # too large
    (docs / "bin.md").write_bytes(b"# Bin\n\x00\x01 binary now\n")
    (docs / "gone.md").unlink()
    code, out, err = run([str(docs), "--index", turned, "--max-bytes", "20000"], capsys)
    assert code == 1, err
    assert names(out["removed"]) == ["gone.md"] and not out["updated"] and not out["added"]
    reasons = {Path(f["path"]).name: f["reason"] for f in out["failures"]}
    assert set(reasons) == {"doc.pdf", "doc.md", "bin.md"}
    assert all(r.endswith("; kept the previous version") for r in reasons.values()), reasons
    assert "LimitReachedError" in reasons["doc.pdf"] and "too large" in reasons["doc.md"]
    lines = [line for line in err if line.startswith("failed: ")]
    assert len(lines) == 3 and all(line.endswith("kept the previous version") for line in lines)
    assert "1 removed, 3 failed" in err[-1] and "0 updated" in err[-1]
    after = index_state(turned)
    gone = str(docs / "gone.md")
    assert after["sources"] == {k: v for k, v in before["sources"].items() if k != gone}
    assert {i: c for i, c in before["chunks"].items() if c["source"] != gone} == after["chunks"]
    hits = Retriever(turned).search("okapis forests", k=1, mode="bm25")
    assert hits and hits[0].chunk.source == str(docs / "doc.pdf")
    # the next run tries again (a kept file is never unchanged), and a mended file updates
    (docs / "doc.md").write_text("# Doc\n\nAardvarks dig deep burrows.\n", encoding="utf-8")
    code, out, _ = run([str(docs), "--index", turned, "--max-bytes", "20000"], capsys)
    assert code == 1 and names(out["updated"]) == ["doc.md"] and len(out["failures"]) == 2
    assert names(out["unchanged"]) == ["good.md"] and not out["removed"]


# ---- counts: files per run, pages per PDF -------------------------------------------------------


def test_files_per_run_and_pages_per_pdf_are_bounded(tmp_path, tiny_mlm_dir, capsys):
    """Case 12: no count limits. More files than --max-files refuses the run before anything is
    read; a PDF over --max-pages is one failed file."""
    docs = write_docs(tmp_path / "docs", {f"n{i}.md": f"# N{i}\n\nNote {i}.\n" for i in range(5)})
    code, _, err = run([str(docs), "--index", "many", "--max-files", "3"], capsys)
    assert code == 2 and len(err) == 1 and "more than 3 files (--max-files)" in err[0]
    assert not (indexes_dir() / "many").exists()
    (docs / "book.pdf").write_bytes(text_pdf(words("One"), words("Two"), words("Three")))
    code, out, _ = run(
        [str(docs), "--index", "many", "--encoder", str(tiny_mlm_dir), "--max-pages", "2"],
        capsys,
    )
    assert code == 1 and len(out["added"]) == 5
    [failure] = out["failures"]
    assert (
        failure["path"].endswith("book.pdf") and "too many pages (3 > limit 2" in failure["reason"]
    )
    assert load_document(docs / "book.pdf").text == "One\n\nTwo\n\nThree"


def test_a_file_over_the_token_bound_is_one_failed_file(tmp_path, tiny_mlm_dir, capsys):
    """Case 6 of distinct text: embedding costs what the tokens cost (9.9 MB of distinct
    headings took ten minutes). A file over --max-file-tokens is one failed file, named with its
    reason; the rest is ingested; the flag raised, it is ingested; a bad value is refused."""
    heads = "".join(f"# Heading {i}\n" for i in range(400))
    docs = write_docs(tmp_path / "docs", {"heads.md": heads, "good.md": "# Good\n\nFine.\n"})
    enc = ["--encoder", str(tiny_mlm_dir)]
    code, out, _ = run([str(docs), "--index", "tok", *enc, "--max-file-tokens", "500"], capsys)
    assert code == 1 and names(out["added"]) == ["good.md"]
    [failure] = out["failures"]
    assert failure["path"].endswith("heads.md")
    assert failure["reason"] == "more than 500 tokens to embed (--max-file-tokens)"
    code, out, _ = run([str(docs), "--index", "tok", "--max-file-tokens", "100000"], capsys)
    assert (
        code == 0 and names(out["added"]) == ["heads.md"] and names(out["unchanged"]) == ["good.md"]
    )
    code, _, err = run([str(docs), "--index", "tok", "--max-file-tokens", "0"], capsys)
    assert code == 2 and err == ["rag.ingest: error: --max-file-tokens must be positive, not 0"]


# ---- one deadline: loading (inside a PDF page) and chunking -------------------------------------


class FakeClock:
    """Stands in for ``rag.documents.limits.time`` (the deadline's clock): ``step`` seconds pass
    at every reading."""

    def __init__(self, step: float) -> None:
        self.now, self.step = 0.0, step

    def monotonic(self) -> float:
        self.now += self.step
        return self.now


def test_the_deadline_is_checked_inside_a_pdf_pages_extraction(tmp_path, monkeypatch):
    """Case 6: a one-page PDF of 900,000 Tj operators took 471 s before 'took longer than
    120 s' (checked between pages only). Here a second passes at every clock reading: the
    extraction must stop inside the page, not return from it."""
    from pypdf import PageObject

    path = tmp_path / "tj.pdf"
    path.write_bytes(text_pdf(b"BT /F1 12 Tf 72 712 Td " + b"(a) Tj " * 60_000 + b"ET"))
    returned = []
    real = PageObject.extract_text

    def extract(self, *a, **kw):
        text = real(self, *a, **kw)
        returned.append(len(text))
        return text

    monkeypatch.setattr(PageObject, "extract_text", extract)
    monkeypatch.setattr(doc_limits, "time", FakeClock(step=1.0))
    with pytest.raises(DocumentError, match=r"took longer than 50 s to load and chunk"):
        load_document(path, limits=Limits(max_seconds=50))
    assert returned == []  # cut short inside the page


def test_one_deadline_covers_loading_and_chunking(tmp_path, monkeypatch):
    """A file that loads in time but whose chunking then runs past --max-load-seconds is one
    failed file, not an unbounded stall (chunking was outside the limit)."""
    from transformers import AutoTokenizer

    import rag.documents.chunking as chunking
    from rag.ingest.plan import chunk_file
    from rag.models import minilm_path

    tok = AutoTokenizer.from_pretrained(minilm_path())
    path = tmp_path / "slow.md"
    path.write_text("# Slow\n\n" + "Some words here. " * 500, encoding="utf-8")
    clock = FakeClock(step=0.0)
    monkeypatch.setattr(doc_limits, "time", clock)
    real = chunking._boundary_strength

    def slow(text):  # chunking this file takes an hour
        clock.now += 3600
        return real(text)

    settings = {"chunk_tokens": 64, "overlap": 8, "max_tokens": 254}
    assert chunk_file(path, str(path), tok, settings, Limits(max_seconds=10))  # in time
    monkeypatch.setattr(chunking, "_boundary_strength", slow)
    with pytest.raises(DocumentError, match=r"took longer than 10 s to load and chunk"):
        chunk_file(path, str(path), tok, settings, Limits(max_seconds=10))
    deadline = Deadline(path, 10)
    clock.now += 11
    with pytest.raises(DocumentError):
        deadline.check()
