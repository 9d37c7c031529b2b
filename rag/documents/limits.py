"""What loading one file may cost, and how a file that could not be loaded is reported.

Every file is loaded within :class:`Limits` (docs/ingestion.md, *Limits*), so one hostile or
broken file costs bounded time and memory and is reported instead of stalling the run: its size
on disk (``max_bytes``); for a zip-based format (.docx) the sizes its members declare, their
compression ratio and the bytes they really expand to, checked before the parser sees them
(:func:`check_zip`); the length of the extracted text (``max_text_chars``) and its encoder
tokens (``max_file_tokens``, counted as chunking tokenises: what embedding costs); the pages of a PDF (``max_pages``) and the decompressed content of each page (at
most ``max_bytes``); and the time loading takes (``max_seconds``: one :class:`Deadline` per file,
which ingest then hands on to chunking; checked between the steps of a loader, every few thousand
tags of an HTML file and every few hundred operators inside a PDF page's text extraction).
Whatever else a parser raises on a hostile file (pypdf's ``LimitReachedError`` on a page tree
deeper than 100, a decompression bomb, a ``RecursionError``) is a :class:`DocumentError` naming
the file too (:func:`failure_reason`), never an exception that stops a whole run.
"""

from __future__ import annotations

import time
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path

DEFAULT_MAX_BYTES = 20 * 1024 * 1024
# The text one file may yield: as much as the largest plain-text file --max-bytes lets in, so a
# small .docx or .pdf that expands (a 160 KB .docx to 21M characters, an hour of embedding) costs
# no more than that file would.
DEFAULT_MAX_TEXT_CHARS = DEFAULT_MAX_BYTES
DEFAULT_MAX_SECONDS = 120.0  # loading and chunking one file, checked between steps
# Tokens of one file: embedding costs what the text's tokens cost (a 9.9 MB file of distinct
# headings, 2.5M tokens, took about ten minutes on 2 cores), so a file is refused while it is
# tokenised, before chunks exist. 6 times the largest file of the Python, Git and Linux manuals
# (kvm/api.rst, about 80k tokens); a PDF of about 1,800 pages of prose.
DEFAULT_MAX_FILE_TOKENS = 500_000
# Pages of one PDF: a 20,000-page PDF took 132 s; a manual of a few thousand pages still fits.
DEFAULT_MAX_PAGES = 5000
PDF_CHECK_EVERY = 256  # operators of a PDF page between two deadline checks
MAX_REASON_CHARS = 300  # a library's message in a failure reason (some are paragraphs)
ZIP_EXPANSION = 5  # a zip-based file may expand to at most this many times max_bytes in all
ZIP_MAX_RATIO = 100  # uncompressed / compressed size of one member (text XML: about 5 to 20)
ZIP_RATIO_FLOOR = 1 << 20  # members expanding to less than 1 MiB are not ratio-checked


class DocumentError(Exception):
    """A file that could not be loaded; ``str()`` reads ``path: reason``."""

    def __init__(self, path: str | Path, reason: str):
        self.path = str(path)
        self.reason = reason
        super().__init__(f"{self.path}: {reason}")


def failure_reason(exc: BaseException) -> str:
    """The reason a file failed for an exception a parser (or chunking) raised that is not a
    :class:`DocumentError`: its type and its message on one line, capped. pypdf's
    ``LimitReachedError: Maximum page tree depth reached: 101 > 100.`` used to stop a whole
    ingest; now it is this file's reason and the rest of the folder is ingested."""
    text = " ".join(str(exc).split())
    if len(text) > MAX_REASON_CHARS:
        text = text[: MAX_REASON_CHARS - 1] + "…"
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


class UnreadableFolderError(DocumentError):
    """A folder under an ingested one that cannot be listed (permission denied): reported, and
    the documents an index holds from it are kept (nothing is known to be gone)."""


@dataclass(frozen=True)
class Limits:
    """What loading one file may cost (module docstring); each bound reported when passed. And
    one rule of what is read: ``skip_noindex``."""

    max_bytes: int = DEFAULT_MAX_BYTES  # size on disk (and a PDF page's decompressed content)
    max_text_chars: int = DEFAULT_MAX_TEXT_CHARS  # characters of extracted text
    max_seconds: float = DEFAULT_MAX_SECONDS  # time to load and chunk
    max_pages: int = DEFAULT_MAX_PAGES  # pages of a PDF
    max_file_tokens: int = DEFAULT_MAX_FILE_TOKENS  # encoder tokens of the text (embedding cost)
    # pass over an HTML page whose head asks not to be indexed (rag.documents.html.asks_noindex)
    skip_noindex: bool = True


class Deadline:
    """The time bound of one file (``--max-load-seconds``), started when its loading starts and
    checked between the steps of the loader and then of chunking
    (:func:`rag.ingest.plan.chunk_file` hands the same one on), so one bound covers both."""

    def __init__(self, path: str | Path, seconds: float):
        self.path, self.seconds = path, seconds
        self.end = time.monotonic() + seconds

    def check(self) -> None:
        if time.monotonic() > self.end:
            raise DocumentError(
                self.path,
                f"took longer than {self.seconds:g} s to load and chunk (--max-load-seconds)",
            )


def check_zip(path: Path, max_bytes: int) -> None:
    """Refuse a zip-based file (.docx) that would expand beyond what its size justifies, before
    any parser opens it: the sizes its members declare (in all at most :data:`ZIP_EXPANSION`
    times ``max_bytes``, each at most :data:`ZIP_MAX_RATIO` times its compressed size), then the
    bytes each really expands to, read in blocks and counted (a member that expands beyond what
    it declares fails its CRC check and is refused too). Why: python-docx parses the whole
    ``word/document.xml`` in memory, about 7 bytes of memory per byte of XML, so a 3.4 MB file
    that expands to 1.16 GB took 8.6 GB before anything was reported."""
    limit = ZIP_EXPANSION * max_bytes
    try:
        with zipfile.ZipFile(path) as z:
            members = z.infolist()
            declared = sum(m.file_size for m in members)
            if declared > limit:
                raise DocumentError(
                    path,
                    f"zip bomb suspected: members declare {declared:,} bytes uncompressed "
                    f"(> {ZIP_EXPANSION} x --max-bytes = {limit:,})",
                )
            for m in members:
                ratio = m.file_size / max(m.compress_size, 1)
                if m.file_size >= ZIP_RATIO_FLOOR and ratio > ZIP_MAX_RATIO:
                    raise DocumentError(
                        path,
                        f"zip bomb suspected: member {m.filename} expands {ratio:,.0f} times "
                        f"({m.compress_size:,} -> {m.file_size:,} bytes; limit {ZIP_MAX_RATIO})",
                    )
            total = 0
            for m in members:
                with z.open(m) as f:
                    while block := f.read(1 << 20):
                        total += len(block)
                        if total > limit:
                            raise DocumentError(
                                path,
                                f"zip bomb suspected: members expand beyond {limit:,} bytes",
                            )
    except (
        zipfile.BadZipFile,
        zipfile.LargeZipFile,
        NotImplementedError,
        EOFError,
        RuntimeError,
        zlib.error,
    ) as e:  # a bad CRC, a corrupt stream, an encrypted or unknown member
        raise DocumentError(path, f"unreadable zip archive ({e})") from None


def _too_long(path: Path, limits: Limits) -> None:
    raise DocumentError(
        path,
        f"extracted text too long (more than {limits.max_text_chars:,} characters; "
        "--max-text-chars)",
    )
