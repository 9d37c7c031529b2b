"""The Debian documentation corpus builder (training.data.debian_corpus): which pages it takes,
what it records, and that pretraining reads its output. apt-get and dpkg-deb are replaced by a
prepared unpacked tree (no network in tests)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

import training.data.debian_corpus as dc
from training.pretrain.corpus import list_files

PROSE = "Configuring the server takes three steps. " * 10  # above MIN_CHARS

COPYRIGHT = """Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/
Files: *
License: BSD-3-clause

Files: doc/*
License: CC-BY-SA-3.0
"""


def fake_package(work: Path, name: str, pages: dict[str, str]) -> None:
    root = work / "unpacked" / name
    for rel, text in pages.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text, encoding="utf-8")
    doc = root / "usr" / "share" / "doc" / name
    doc.mkdir(parents=True, exist_ok=True)
    (doc / "copyright").write_text(COPYRIGHT, encoding="utf-8")
    (work / "debs").mkdir(parents=True, exist_ok=True)
    (work / "debs" / f"{name}_1.2-3_all.deb").write_bytes(b"not really a deb")


def html(body: str, head: str = "") -> str:
    return f"<html><head>{head}</head><body><h1>Title</h1><p>{body}</p></body></html>"


def test_licences_are_the_copyright_files_license_names():
    assert dc.licences(COPYRIGHT) == ["BSD-3-clause", "CC-BY-SA-3.0"]
    assert dc.licences("This package is in the public domain.") == ["see COPYRIGHT.debian"]


@pytest.mark.parametrize(
    ("rel", "taken"),
    [
        ("html/index.html", True),
        ("html/api/module.html", True),
        ("html/genindex.html", False),
        ("html/genindex-A.html", False),
        ("html/search.html", False),
        ("html/_modules/pkg/core.html", False),
        ("html/_static/page.html", False),
        ("html/notes.txt", False),
    ],
)
def test_pages_taken_from_a_sphinx_build(tmp_path, rel, taken):
    source = dc.Source("pkg", ("html/**/*.html",))
    (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / rel).write_text("x", encoding="utf-8")
    assert (tmp_path / rel in dc.select_pages(tmp_path, source)) is taken


def test_build_writes_text_licences_and_manifest(tmp_path, monkeypatch):
    work, out = tmp_path / "work", tmp_path / "out"
    pages = {
        "html/guide.html": html(PROSE),
        "html/zz-copy.html": html(PROSE),  # the same text again (read after): left out
        "html/stub.html": html("Moved."),  # too short: left out
        "html/api.html": html("The API reference. " * 20, '<meta name="robots" content="noindex">'),
        "html/genindex.html": html(PROSE + " index"),
        "pod/perlintro.pod": "=head1 NAME\n\nperlintro - a brief introduction\n\n" + PROSE,
    }
    fake_package(work, "pkg-doc", pages)
    monkeypatch.setattr(
        dc,
        "SOURCES",
        (dc.Source("pkg-doc", ("html/**/*.html", "pod/*.pod")),),
    )
    manifest = dc.build(dc.CorpusConfig(out=str(out), work=str(work)))
    entry = manifest["packages"][0]
    assert entry["version"] == "1.2-3" and entry["licences"] == ["BSD-3-clause", "CC-BY-SA-3.0"]
    assert entry["deb_sha256"] == hashlib.sha256(b"not really a deb").hexdigest()
    assert entry["files"] == 3  # guide, the noindex API page (a corpus reads it), the POD
    assert entry["left_out"] == {"short": 1, "copies": 1, "unreadable": 0}
    written = sorted(p.name for p in (out / "pkg-doc").iterdir())
    assert written == ["COPYRIGHT.debian", "html__api.txt", "html__guide.txt", "pod__perlintro.txt"]
    assert "Configuring the server" in (out / "pkg-doc" / "html__guide.txt").read_text()
    assert "<p>" not in (out / "pkg-doc" / "html__guide.txt").read_text()
    assert json.loads((out / "MANIFEST.json").read_text()) == manifest
    # pretraining reads the folder as a corpus: the pages, not the copyright or the manifest
    assert sorted(p.name for p in list_files([str(out)])) == written[1:]


def test_unknown_package_is_one_line_error(tmp_path, capsys):
    assert dc.main(["--out", str(tmp_path / "o"), "--packages", "no-such-doc"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("training.data.debian_corpus: error: --packages: unknown package")
    assert "no-such-doc" in err and "\n" not in err
