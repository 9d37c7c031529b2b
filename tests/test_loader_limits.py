"""Every loader within bounded time and memory (rag.documents.Limits, docs/ingestion.md *Limits*):
deeply nested and malformed HTML in linear time, a slow file reported and skipped while the rest
of the folder is ingested, .docx zip bombs refused before python-docx sees them, and extracted
text capped by --max-text-chars. Every hostile input is generated here, small on disk."""

from __future__ import annotations

import io
import json
import struct
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest
from ingest_support import write_docs

from rag.documents import ZIP_EXPANSION, DocumentError, load_document
from rag.documents import html as html_scanner
from rag.ingest import main

NESTED = "<div>" * 100_000 + "t" + "</div>" * 100_000  # 1.1 MB: past 300 s with BeautifulSoup


def run(argv: list[str], capsys) -> tuple[int, dict, list[str]]:
    """(exit status, --json report, stderr lines) of ``rag.ingest`` in-process."""
    code = main([*argv, "--no-progress", "--json"])
    cap = capsys.readouterr()
    return code, json.loads(cap.out), cap.err.strip().splitlines()


def names(paths: list[str]) -> list[str]:
    return sorted(Path(p).name for p in paths)


# ---- HTML ---------------------------------------------------------------------------------------


def test_deeply_nested_html_loads_in_seconds(tmp_path):
    path = tmp_path / "nested.html"
    path.write_text(NESTED, encoding="utf-8")
    t0 = time.perf_counter()
    doc = load_document(path)
    assert time.perf_counter() - t0 < 10 and doc.text == "t"


@pytest.mark.parametrize(
    "html",
    [
        "<a " * 300_000 + "x",  # tags that never end (html.parser backtracks: minutes)
        '<a b="' * 200_000 + "x",  # quotes that never close
        "<" * 1_000_000 + "x",
        "<!--" * 300_000 + "x",
        "<p>" + "<script>" * 200_000 + "x",
        "<!DOCTYPE" * 200_000,
    ],
    ids=["open-tags", "open-quotes", "lone-lt", "open-comments", "open-scripts", "declarations"],
)
def test_malformed_html_takes_linear_time(tmp_path, html):
    path = tmp_path / "bad.html"
    path.write_text(html, encoding="utf-8")
    t0 = time.perf_counter()
    try:
        load_document(path)
    except DocumentError as e:
        assert "no text" in e.reason
    assert time.perf_counter() - t0 < 10


def test_html_text_headings_and_dropped_elements(tmp_path):
    html = (
        '<!DOCTYPE html><html><head><title>T</title><style>p{}</style></head><body><h1 id="a">'
        'Ti<b>tle</b></h1><p title="1 > 0">a &amp; b</p><svg><text>vector</text></svg><svg/>'
        "<script>if (a<b) {x='</p>'}</script><noscript>enable js</noscript>c<br/>d<h2>Two</h2>"
        "<!-- <p>hidden</p> -->e 1 < 2</body></html>"
    )
    path = tmp_path / "p.html"
    path.write_text(html, encoding="utf-8")
    doc = load_document(path)
    assert doc.text == "T\n\n# Ti tle\n\na & b\nc\nd\n\n## Two\n\ne 1 < 2"
    assert [(h.level, h.title) for h in doc.headings] == [(1, "Ti tle"), (2, "Two")]


def test_a_slow_file_is_reported_and_the_rest_ingested(tmp_path, tiny_mlm_dir, capsys, monkeypatch):
    """--max-load-seconds: a file past it is one failed line by name; the nested HTML and the
    other files are ingested in the same run."""
    docs = write_docs(tmp_path / "docs", {"good.md": "# Good\n\nOrdinary words about files.\n"})
    (docs / "nested.html").write_text(NESTED, encoding="utf-8")
    (docs / "slow.html").write_text("<p>slow</p>" * 1000, encoding="utf-8")  # 20 s to load

    class SlowUnescape:  # stands in for the html module: each text piece of slow.html takes 20 ms
        @staticmethod
        def unescape(text: str) -> str:
            if text == "slow":
                time.sleep(0.02)
            return text

    monkeypatch.setattr(html_scanner, "html", SlowUnescape)
    monkeypatch.setattr(html_scanner, "HTML_CHECK_EVERY", 1)
    t0 = time.perf_counter()
    code, out, err = run(
        [str(docs), "--index", "slow", "--encoder", str(tiny_mlm_dir), "--max-load-seconds", "5"],
        capsys,
    )
    assert time.perf_counter() - t0 < 60
    assert code == 1 and names(out["added"]) == ["good.md", "nested.html"], out["failures"]
    [(path, reason)] = [(f["path"], f["reason"]) for f in out["failures"]]
    assert path.endswith("slow.html") and "took longer than 5 s to load" in reason
    assert any(line.startswith("failed: ") and "slow.html" in line for line in err)


# ---- zip bombs ------------------------------------------------------------------------------------


def _docx_with(path: Path, xml_member: bytes | None = None, *, repeat: int = 0) -> Path:
    """A real .docx (python-docx) whose ``word/document.xml`` is replaced by ``xml_member``, or
    by a paragraph repeated ``repeat`` times (streamed into the zip: small on disk, large
    expanded)."""
    docx = pytest.importorskip("docx")
    d = docx.Document()
    d.add_paragraph("Real words.")
    buf = io.BytesIO()
    d.save(buf)
    with zipfile.ZipFile(buf) as src, zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as out:
        for item in src.infolist():
            if item.filename != "word/document.xml":
                out.writestr(item, src.read(item))
                continue
            if xml_member is not None:
                out.writestr(item.filename, xml_member)
                continue
            head, tail = src.read(item).split(b"<w:body>")
            para = b"<w:p><w:r><w:t>" + b"bomb " * 200 + b"</w:t></w:r></w:p>"
            with out.open(item.filename, "w", force_zip64=True) as f:
                f.write(head + b"<w:body>")
                for start in range(0, repeat, 1000):
                    f.write(para * min(1000, repeat - start))
                f.write(b"</w:body>" + tail.split(b"</w:body>")[-1])
    return path


def test_declared_sizes_refuse_a_bomb_in_bounded_time_and_memory(tmp_path):
    """About 400 MB of XML in a file of a few hundred KB: refused from the zip's directory,
    before python-docx parses anything, in a fresh process that stays small."""
    bomb = _docx_with(tmp_path / "bomb.docx", repeat=400_000)
    assert bomb.stat().st_size < 5_000_000
    code = (  # VmHWM: this process's peak (ru_maxrss would carry pytest's across exec)
        "import re, sys, time\n"
        "from rag.documents import DocumentError, load_document\n"
        "t = time.perf_counter()\n"
        "try:\n    load_document(sys.argv[1])\nexcept DocumentError as e:\n    print(e.reason)\n"
        "print(time.perf_counter() - t)\n"
        "print(re.search(r'VmHWM:\\s+(\\d+)', open('/proc/self/status').read()).group(1))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, str(bomb)], capture_output=True, text=True, timeout=120
    )
    reason, seconds, rss_kb = proc.stdout.strip().splitlines()
    assert "zip bomb suspected: members declare" in reason and f"{ZIP_EXPANSION} x" in reason
    assert float(seconds) < 5 and int(rss_kb) < 300_000


def test_compression_ratio_refuses_a_bomb_under_the_total_limit(tmp_path):
    bomb = _docx_with(tmp_path / "ratio.docx", repeat=5_000)  # 5 MB of XML in a few KB
    with pytest.raises(DocumentError, match=r"member word/document.xml expands [\d,]+ times"):
        load_document(bomb)


def test_a_member_larger_than_it_declares_is_refused(tmp_path):
    """The real expansion is read and counted: a member whose headers under-declare its size
    fails before python-docx is given it."""
    path = _docx_with(tmp_path / "liar.docx", b"<w:document>" + b"x" * 100_000 + b"</w:document>")
    data = bytearray(path.read_bytes())
    name = b"word/document.xml"
    for sig, size_at in ((b"PK\x03\x04", 22), (b"PK\x01\x02", 24)):  # local, central headers
        pos = 0
        while (pos := data.find(sig, pos)) != -1:
            name_len = struct.unpack_from("<H", data, pos + (26 if sig == b"PK\x03\x04" else 28))[0]
            start = pos + (30 if sig == b"PK\x03\x04" else 46)
            if data[start : start + name_len] == name:
                struct.pack_into("<I", data, pos + size_at, 1000)  # uncompressed size: 1,000
            pos += 4
    path.write_bytes(bytes(data))
    with pytest.raises(DocumentError, match="unreadable zip archive"):
        load_document(path)


def test_extracted_text_is_capped_and_reported(tmp_path, tiny_mlm_dir, capsys):
    """--max-text-chars: a .docx (and a text file) whose text is longer is reported by name;
    a bomb is refused beside them; the folder's other files are ingested."""
    docs = write_docs(tmp_path / "docs", {"good.md": "# Good\n\nOrdinary words about files.\n"})
    (docs / "long.txt").write_text("word " * 2_000, encoding="utf-8")
    _docx_with(docs / "long.docx", repeat=900)  # 900 paragraphs of 1,000 characters
    _docx_with(docs / "bomb.docx", repeat=400_000)
    t0 = time.perf_counter()
    code, out, err = run(
        [
            str(docs),
            "--index",
            "capped",
            "--encoder",
            str(tiny_mlm_dir),
            "--max-text-chars",
            "5000",
        ],
        capsys,
    )
    assert time.perf_counter() - t0 < 60
    assert code == 1 and names(out["added"]) == ["good.md"]
    reasons = {Path(f["path"]).name: f["reason"] for f in out["failures"]}
    assert set(reasons) == {"long.txt", "long.docx", "bomb.docx"}
    for name in ("long.txt", "long.docx"):
        assert "extracted text too long (more than 5,000 characters" in reasons[name]
    assert "zip bomb suspected" in reasons["bomb.docx"]
    assert sum(line.startswith("failed: ") for line in err) == 3


def test_limits_must_be_positive(tmp_path, capsys):
    docs = str(write_docs(tmp_path / "docs"))
    for flag in ("--max-text-chars", "--max-load-seconds"):
        code = main([docs, "--index", "neg", flag, "0"])
        err = capsys.readouterr().err.strip().splitlines()
        assert code == 2 and len(err) == 1 and f"{flag} must be positive" in err[0]
