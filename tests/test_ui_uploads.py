"""Upload checks (ui/uploads.py): names, types, sizes and content are refused with a readable
reason, and nothing is written for a refused file."""

from __future__ import annotations

import pytest

from ui.uploads import check_name, stage_uploads, uploads_dir


@pytest.mark.parametrize(
    "name",
    ["../../etc/passwd.md", "..\\evil.md", "a/b.md", "..", ".hidden.md", "x\x00.md", "run.exe", ""],
)
def test_bad_names_refused(name):
    assert check_name(name)


@pytest.mark.parametrize("name", ["notes.md", "guide.rst.txt", "Report 2024.pdf", "page.html"])
def test_good_names_accepted(name):
    assert check_name(name) is None


def _write(tmp_path, name, data: bytes):
    p = tmp_path / name
    p.write_bytes(data)
    return str(p)


def test_stage_refuses_and_writes_nothing(tmp_path):
    files = [
        (_write(tmp_path, "a.md", b"x" * 2000), "a.md"),  # too large for the 1000-byte limit
        (_write(tmp_path, "b.md", b"ok\x00\x01binary"), "b.md"),  # NUL bytes in a text type
        (_write(tmp_path, "c.pdf", b"not a pdf"), "c.pdf"),
        (_write(tmp_path, "d.md", b"# fine"), "../../d.md"),  # traversal-style claimed name
        (_write(tmp_path, "e.md", b""), "e.md"),
    ]
    staged, refused = stage_uploads(files, "idx", max_bytes=1000)
    assert staged == []
    reasons = {r.name: r.reason for r in refused}
    assert "too large" in reasons["a.md"]
    assert "binary" in reasons["b.md"]
    assert "PDF" in reasons["c.pdf"]
    assert "path" in reasons["../../d.md"]
    assert "empty" in reasons["e.md"]
    assert not uploads_dir("idx").exists()


def test_stage_copies_accepted_file(tmp_path):
    staged, refused = stage_uploads([(_write(tmp_path, "t", b"# Title\n\nbody"), "ok.md")], "idx2")
    assert refused == [] and [p.name for p in staged] == ["ok.md"]
    assert staged[0].parent == uploads_dir("idx2") and staged[0].read_bytes().startswith(b"# Title")
