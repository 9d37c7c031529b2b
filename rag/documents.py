"""Document loading: one module for ingestion, pretraining corpora and pair mining.

Every supported file becomes a :class:`Document`: clean text plus the headings found in it, each
with its character offset, so that chunking can split on headings and keep a heading path.

Formats: .md/.markdown, .txt, .rst (and Sphinx ``*.rst.txt`` sources), .html/.htm (text only,
scripts and styles dropped, headings kept as ``#`` lines), .pdf (pypdf), .docx (python-docx,
optional extra). Anything that cannot be loaded raises :class:`DocumentError` naming the path
and the reason; :func:`load_documents` collects those instead of stopping.

Every file is loaded within :class:`Limits` (docs/ingestion.md, *Limits*), so one hostile or
broken file costs bounded time and memory and is reported instead of stalling the run: its size
on disk (``max_bytes``); for a zip-based format (.docx) the sizes its members declare, their
compression ratio and the bytes they really expand to, checked before the parser sees them; the
length of the extracted text (``max_text_chars``: what chunking and embedding cost); the pages of
a PDF (``max_pages``) and the decompressed content of each page (at most ``max_bytes``); and the
time loading takes (``max_seconds``: one :class:`Deadline` per file, which ingest then hands on
to chunking; checked between the steps of a loader, every few thousand tags of an HTML file and
every few hundred operators inside a PDF page's text extraction). Whatever else a parser raises
on a hostile file (pypdf's ``LimitReachedError`` on a page tree deeper than 100, a
decompression bomb, a ``RecursionError``) is a :class:`DocumentError` naming the file too
(:func:`failure_reason`), never an exception that stops a whole run.

Why hand-written: the PDF and Word parsers are libraries (pypdf, python-docx); what is ours is
the heading extraction for md/rst/html, the limits and the uniform error reporting that ingest
needs, and the HTML text extraction. HTML is read by a small scanner of our own
(:func:`_html_events`) that is linear in the text whatever the markup: building BeautifulSoup's
tree costs time quadratic in the nesting depth (``'<div>' * 100000`` ran past 300 s), and the
standard library's ``html.parser`` backtracks on malformed tags (``'<a ' * 4000``: 3 s, growing faster than the square) in
one call no deadline can interrupt. Only text, tag names and where tags end matter here, so the
scanner keeps a counter of dropped elements and the current heading, not a tree.
"""

from __future__ import annotations

import html
import itertools
import logging
import os
import re
import time
import unicodedata
import zipfile
import zlib
from bisect import bisect_right
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rag.paths import printable

TEXT_SUFFIXES = (".md", ".markdown", ".txt", ".rst")
HTML_SUFFIXES = (".html", ".htm")
ZIP_SUFFIXES = (".docx",)  # formats that are zip archives (checked by check_zip before parsing)
SUPPORTED_SUFFIXES = TEXT_SUFFIXES + HTML_SUFFIXES + (".pdf",) + ZIP_SUFFIXES
DEFAULT_MAX_BYTES = 20 * 1024 * 1024
# The text one file may yield: as much as the largest plain-text file --max-bytes lets in, so a
# small .docx or .pdf that expands (a 160 KB .docx to 21M characters, an hour of embedding) costs
# no more than that file would.
DEFAULT_MAX_TEXT_CHARS = DEFAULT_MAX_BYTES
DEFAULT_MAX_SECONDS = 120.0  # loading and chunking one file, checked between steps
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
    """What loading one file may cost (module docstring); each bound reported when passed."""

    max_bytes: int = DEFAULT_MAX_BYTES  # size on disk (and a PDF page's decompressed content)
    max_text_chars: int = DEFAULT_MAX_TEXT_CHARS  # characters of extracted text
    max_seconds: float = DEFAULT_MAX_SECONDS  # time to load and chunk
    max_pages: int = DEFAULT_MAX_PAGES  # pages of a PDF


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


@dataclass(frozen=True)
class Heading:
    """A heading at character ``offset`` of the document text; ``level`` 1 is the top."""

    offset: int
    level: int
    title: str


@dataclass
class Document:
    """Clean text of one file plus its headings (in order of offset)."""

    path: str
    text: str
    headings: list[Heading] = field(default_factory=list)
    # (headings list, its length, prefix maxima of the offsets, the heading path after each
    # heading): built once by heading_path_at, rebuilt when the headings change
    _paths: Any = field(default=None, init=False, repr=False, compare=False)

    def _heading_index(self) -> tuple[list[int], list[tuple[str, ...]]]:
        """The heading path in force after each heading, computed in one pass over the
        headings (a stack of open levels), with the running maximum of their offsets."""
        cached = self._paths
        if cached is not None and cached[0] is self.headings and cached[1] == len(self.headings):
            return cached[2], cached[3]
        ends: list[int] = []
        paths: list[tuple[str, ...]] = []
        stack: list[Heading] = []
        top = -1
        for h in self.headings:
            while stack and stack[-1].level >= h.level:
                stack.pop()
            stack.append(h)
            top = max(top, h.offset)
            ends.append(top)
            paths.append(tuple(s.title for s in stack))
        self._paths = (self.headings, len(self.headings), ends, paths)
        return ends, paths

    def heading_path_at(self, offset: int) -> tuple[str, ...]:
        """The chain of headings (top level first) that governs character ``offset``: the
        path after the last of the leading headings that start at or before it, found by
        bisection, so chunking a file of 200,000 headings costs one pass over them, not one
        per chunk (a scan per chunk took 356 s)."""
        ends, paths = self._heading_index()
        i = bisect_right(ends, offset)
        return paths[i - 1] if i else ()


# ---------------------------------------------------------------------------- file discovery


def _suffix_of(path: Path) -> str:
    name = path.name.lower()
    if name.endswith(".rst.txt"):
        return ".rst"
    return path.suffix.lower()


# a file's type as filters and document listings name it: its suffix without the dot, the
# spellings of one format under one name (Sphinx ``*.rst.txt`` is rst)
_TYPE_ALIASES = {"markdown": "md", "htm": "html"}


def document_type(path: str | Path) -> str:
    """``md``, ``txt``, ``rst``, ``html``, ``pdf``, ``docx`` (or another file's bare suffix)."""
    suffix = _suffix_of(Path(path)).lstrip(".")
    return _TYPE_ALIASES.get(suffix, suffix)


def _outside(path: Path, root: Path) -> str | None:
    """The target of ``path`` when it is a symbolic link that resolves outside ``root`` (already
    resolved), else None. Links that stay inside the folder are harmless and read as usual."""
    if not path.is_symlink():
        return None
    try:
        target = path.resolve(strict=True)
    except (OSError, RuntimeError):
        return None  # broken or looping: load_document reports it with its own reason
    return None if target == root or target.is_relative_to(root) else str(target)


def iter_files(
    paths: Iterable[str | Path],
    suffixes: tuple[str, ...] = SUPPORTED_SUFFIXES,
    follow_links: bool = False,
    skipped: list[DocumentError] | None = None,
) -> Iterator[Path | DocumentError]:
    """Yield supported files under ``paths`` in sorted order, or a DocumentError for a path that
    does not exist or a link that is not followed. A file given explicitly is yielded whatever
    its suffix or link (the user named it).

    Inside a folder, symbolic links are the one way a document can reach beyond it: whoever can
    write the folder could plant ``notes.md -> /etc/passwd`` and have it indexed and quoted. So
    unless ``follow_links``, a linked file whose target lies outside the folder and a linked
    directory are reported, not read. With ``follow_links`` both are followed (each real
    directory walked once, so link cycles end). Files of other types are passed over; when
    ``skipped`` is a list they are appended to it (path and reason) so ingest can list them.
    Hidden files and folders (``.git``) are passed over silently.

    A name that is not valid UTF-8 (``caf\\xe9.md`` written by a Latin-1 system: Python holds
    its bytes as lone surrogates, which every later encode fails on) is reported by its escaped
    path (:func:`undecodable_name`), a folder so named once for all it holds, and not read. A
    folder that cannot be listed (permission denied) is reported too, as an
    :class:`UnreadableFolderError` whose path is that folder (``os.walk`` would pass it over
    silently, as if it were empty)."""
    for raw in paths:
        root = Path(raw)
        if (bad := undecodable_name(root)) is not None:
            yield bad
            continue
        if not root.exists() and not root.is_symlink():
            yield DocumentError(root, "no such file or directory")
            continue
        if not root.is_dir():
            yield root
            continue
        real_root = root.resolve()
        walked: set[str] = set()
        unlisted: list[OSError] = []
        for dirpath, dirnames, filenames in os.walk(
            root, followlinks=follow_links, onerror=unlisted.append
        ):
            yield from _unlisted(unlisted)
            real = os.path.realpath(dirpath)
            if real in walked:  # reached again through a link: a cycle or a duplicate
                dirnames[:] = []
                continue
            walked.add(real)
            kept = []
            for d in sorted(d for d in dirnames if not d.startswith(".")):
                if (bad := undecodable_name(Path(dirpath) / d)) is not None:
                    yield bad  # one line for the folder; nothing under it is read
                else:
                    kept.append(d)
            dirnames[:] = kept
            for name in sorted(filenames):
                if name.startswith("."):
                    continue
                p = Path(dirpath) / name
                bad = undecodable_name(p)
                if _suffix_of(p) not in suffixes:
                    if skipped is not None:
                        shown = p if bad is None else bad.path
                        skipped.append(
                            DocumentError(
                                shown, f"unsupported file type '{printable(_suffix_of(p) or name)}'"
                            )
                        )
                    continue
                if bad is not None:
                    yield bad
                    continue
                target = None if follow_links else _outside(p, real_root)
                if target is not None:
                    yield DocumentError(
                        p,
                        f"symlink points outside the ingested folder: {target} "
                        "(--follow-links reads it)",
                    )
                    continue
                yield p
            if not follow_links:  # linked directories are listed as dirs but not walked
                for d in dirnames:
                    p = Path(dirpath) / d
                    if p.is_symlink():
                        yield DocumentError(
                            p, "symbolic link to a directory (not followed; --follow-links does)"
                        )
        yield from _unlisted(unlisted)


def _unlisted(errors: list[OSError]) -> Iterator[DocumentError]:
    """The folders ``os.walk`` could not list (its ``onerror``), as failures naming each."""
    while errors:
        e = errors.pop(0)
        yield UnreadableFolderError(
            os.fspath(e.filename or "?"), f"folder cannot be read ({e.strerror or e})"
        )


def undecodable_name(path: Path) -> DocumentError | None:
    """A :class:`DocumentError` for ``path`` when its name holds bytes that are not UTF-8
    (held by Python as lone surrogates, which chunk ids, JSON, the tokenizer and every
    terminal would fail on), naming it escaped (``caf\\xe9.md``, as
    :func:`rag.paths.printable` writes it); None for a name that is text."""
    text = str(path)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        what = "folder" if path.is_dir() and not path.is_symlink() else "file"
        return DocumentError(
            printable(text),
            f"{what} name is not valid UTF-8; rename it (e.g. convmv -f latin1 -t utf8) "
            "to ingest it",
        )
    return None


# ---------------------------------------------------------------------------- text cleaning

_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")


def clean_text(text: str) -> str:
    """NFC-normalise, unify newlines, drop control characters and trailing spaces, and collapse
    runs of blank lines; meaning-bearing layout (indentation, single newlines) is kept."""
    text = unicodedata.normalize("NFC", text).replace("\r\n", "\n").replace("\r", "\n")
    text = _CONTROL.sub("", text)
    text = "\n".join(line.rstrip() for line in text.split("\n"))
    text = re.sub(r"\n{3,}", "\n\n", text)
    return text.strip()


# ---------------------------------------------------------------------------- headings

_ATX = re.compile(r"^(#{1,6})\s+(.+?)\s*#*\s*$")
_RST_UNDERLINE = re.compile(r"^([=\-~^\"'`#*+<>:._])\1{2,}\s*$")


def markdown_headings(text: str) -> list[Heading]:
    """ATX (``# Title``) headings, skipping fenced code blocks."""
    out, offset, fenced = [], 0, False
    for line in text.split("\n"):
        if line.lstrip().startswith(("```", "~~~")):
            fenced = not fenced
        elif not fenced and (m := _ATX.match(line)):
            out.append(Heading(offset, len(m.group(1)), m.group(2).strip()))
        offset += len(line) + 1
    return out


def rst_headings(text: str) -> list[Heading]:
    """reStructuredText section titles: a line underlined (optionally overlined) by a repeated
    punctuation character at least as long as the title. Levels follow the order in which
    adornment styles first appear, as docutils assigns them."""
    lines = text.split("\n")
    offsets, pos = [], 0
    for line in lines:
        offsets.append(pos)
        pos += len(line) + 1
    styles: list[tuple[str, bool]] = []
    out: list[Heading] = []
    for i in range(1, len(lines)):
        under, title = lines[i], lines[i - 1].strip()
        m = _RST_UNDERLINE.match(under)
        if (
            not m
            or not title
            or _RST_UNDERLINE.match(lines[i - 1])
            or len(under.rstrip()) < len(title)
        ):
            continue
        overlined = i >= 2 and lines[i - 2].strip() == under.strip()
        style = (m.group(1), overlined)
        if style not in styles:
            styles.append(style)
        out.append(Heading(offsets[i - 1], styles.index(style) + 1, title))
    return out


# ---------------------------------------------------------------------------- format loaders


def _decode(path: Path, data: bytes) -> str:
    if b"\x00" in data[:8192]:
        raise DocumentError(path, "binary file (contains NUL bytes)")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise DocumentError(
            path,
            f"not valid UTF-8 (byte 0x{data[e.start]:02x} at offset {e.start}); re-save it as UTF-8",
        ) from None


_HTML_DROPPED = frozenset({"script", "style", "noscript", "template", "svg"})
_HTML_RAW = ("script", "style")  # raw text: no tag inside counts until the element's end tag
_HTML_BREAK_AFTER = frozenset({"p", "div", "li", "pre", "tr", "br", "section", "article"})
_HTML_HEADINGS = {f"h{n}": n for n in range(1, 7)}
_HTML_TAG = re.compile(r"<(/?)([a-zA-Z][a-zA-Z0-9:_-]*)")
_HTML_RAW_END = {t: re.compile(rf"</{t}[\s/>]", re.IGNORECASE) for t in _HTML_RAW}
HTML_CHECK_EVERY = 4096  # tags between two deadline checks


class _Next:
    """Where the next occurrence of each character is, found once and reused until the scan
    passes it: the searches of a whole scan together cost one pass over the text, whatever
    the markup (an unclosed tag or quote is searched for once, not once per ``<``)."""

    def __init__(self, text: str):
        self.text, self.at = text, {}

    def __call__(self, char: str, start: int) -> int:
        pos = self.at.get(char)
        if pos is None or (pos != -1 and pos < start):
            pos = self.at[char] = self.text.find(char, start)
        return pos


def _tag_end(text: str, start: int, find: _Next) -> int:
    """Index of the ``>`` that ends the tag whose attributes begin at ``start`` (quoted values
    may hold ``>``), or -1 when the tag never ends."""
    pos = start
    while True:
        gt = find(">", pos)
        quotes = [q for q in (find('"', pos), find("'", pos)) if q != -1 and (gt == -1 or q < gt)]
        if not quotes:
            return gt
        q = min(quotes)
        close = find(text[q], q + 1)
        if close == -1:  # an unclosed quote: the tag ends at the first '>' (as browsers recover)
            return gt
        pos = close + 1


def _html_events(text: str, deadline: Deadline) -> Iterator[tuple[str, str, bool]]:
    """(kind, value, self-closing) events of an HTML text: ``data`` (entities unescaped),
    ``start`` and ``end`` (lower-case tag names); comments, declarations and processing
    instructions are skipped, as are the contents of ``<script>`` and ``<style>``. Linear in
    the text by construction (module docstring: why not html.parser or BeautifulSoup)."""
    find, pos, n, count = _Next(text), 0, len(text), 0
    while pos < n:
        lt = find("<", pos)
        if lt == -1:
            yield "data", html.unescape(text[pos:]), False
            return
        if lt > pos:
            yield "data", html.unescape(text[pos:lt]), False
        count += 1
        if count % HTML_CHECK_EVERY == 0:
            deadline.check()
        if text.startswith("<!--", lt):
            end = text.find("-->", lt + 4)
            pos = n if end == -1 else end + 3
            continue
        m = _HTML_TAG.match(text, lt)
        if m is None:
            if text.startswith(("<!", "<?"), lt):  # <!DOCTYPE ...>, <?xml ...?>
                gt = find(">", lt)
                pos = n if gt == -1 else gt + 1
            else:  # a '<' that opens no tag is text
                yield "data", "<", False
                pos = lt + 1
            continue
        gt = _tag_end(text, m.end(), find)
        if gt == -1:  # a tag that never ends: the rest is not text
            return
        tag, closing = m.group(2).lower(), bool(m.group(1))
        yield ("end" if closing else "start"), tag, text[gt - 1] == "/"
        pos = gt + 1
        if not closing and tag in _HTML_RAW and text[gt - 1] != "/":
            end = _HTML_RAW_END[tag].search(text, pos)
            pos = n if end is None else end.start()


def _html_text(text: str, deadline: Deadline) -> str:
    """The text of an HTML document: dropped elements' content skipped (a depth counter, not
    a tree), a newline after block elements, ``<h1>``–``<h6>`` as ``#`` lines."""
    parts: list[str] = []
    dropped = 0  # open elements whose content is dropped
    heading: tuple[int, list[str]] | None = None  # (level, its text so far)
    for kind, value, self_closing in _html_events(text, deadline):
        if kind == "data":
            if not dropped:
                (heading[1] if heading is not None else parts).append(value)
        elif value in _HTML_DROPPED:
            if kind == "end":
                dropped = max(0, dropped - 1)
            elif not self_closing:
                dropped += 1
        elif dropped:
            continue
        elif value in _HTML_HEADINGS:
            if kind == "start" and heading is None:
                heading = (_HTML_HEADINGS[value], [])
            elif kind == "end" and heading is not None:
                title = " ".join(" ".join(heading[1]).split())
                parts.append(f"\n\n{'#' * heading[0]} {title}\n\n")
                heading = None
        elif value in _HTML_BREAK_AFTER and (kind == "end" or value == "br"):
            (heading[1] if heading is not None else parts).append("\n")
    if heading is not None:  # a heading never closed: its words are text
        parts.extend(heading[1])
    return "".join(parts)


def _load_html(path: Path, data: bytes, deadline: Deadline) -> tuple[str, list[Heading]]:
    text = clean_text(_html_text(_decode(path, data), deadline))
    return text, markdown_headings(text)


def _load_pdf(path: Path, limits: Limits, deadline: Deadline) -> tuple[str, list[Heading]]:
    """The text of a PDF, page by page, within ``limits``: at most ``max_pages`` pages, each
    page's decompressed content at most ``max_bytes`` (so no page's extraction parses more than
    that), and the deadline checked every :data:`PDF_CHECK_EVERY` operators inside a page's
    extraction (a one-page PDF of 900,000 ``Tj`` operators took 471 s in one call). Whatever
    pypdf raises (``LimitReachedError`` for a page tree deeper than 100 or a stream that
    decompresses beyond its cap, ``RecursionError``, ...) is this file's failure."""
    # pypdf logs its repairs of damaged files ("Ignoring wrong pointing object ...") as
    # warnings; without a handler Python prints them on stderr between ingest's own one-line
    # failure reports. A file it cannot read still raises and is reported once, by us.
    logging.getLogger("pypdf").setLevel(logging.ERROR)
    from pypdf import PdfReader

    ops = itertools.count(1)

    def every_operator(*_: Any) -> None:  # pypdf's visitor, called before each operator
        if next(ops) % PDF_CHECK_EVERY == 0:
            deadline.check()

    try:
        reader = PdfReader(str(path))
        if (n := len(reader.pages)) > limits.max_pages:
            raise DocumentError(
                path, f"too many pages ({n:,} > limit {limits.max_pages:,}; --max-pages)"
            )
        pages, chars = [], 0
        for number, page in enumerate(reader.pages, start=1):
            deadline.check()
            contents = page.get_contents()
            size = len(contents.get_data()) if contents is not None else 0
            if size > limits.max_bytes:
                raise DocumentError(
                    path,
                    f"page {number} content expands to {size:,} bytes "
                    f"(> limit {limits.max_bytes:,}; --max-bytes)",
                )
            pages.append(page.extract_text(visitor_operand_before=every_operator) or "")
            chars += len(pages[-1])
            if chars > limits.max_text_chars:
                _too_long(path, limits)
    except DocumentError:
        raise
    except Exception as e:  # noqa: BLE001 - pypdf raises many types on hostile files
        raise DocumentError(path, f"unreadable PDF ({failure_reason(e)})") from None
    return clean_text("\n\n".join(pages)), []


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


def _load_docx(path: Path, limits: Limits, deadline: Deadline) -> tuple[str, list[Heading]]:
    try:
        import docx
    except ImportError:
        raise DocumentError(
            path, "reading .docx needs the 'docx' extra (pip install python-docx)"
        ) from None
    check_zip(path, limits.max_bytes)
    deadline.check()
    try:
        document = docx.Document(str(path))
    except Exception as e:  # python-docx raises several unrelated types for corrupt files
        raise DocumentError(path, f"unreadable .docx ({e})") from None
    parts, headings, offset = [], [], 0
    for para in document.paragraphs:
        deadline.check()
        text = para.text.strip()
        if not text:
            continue
        style = (para.style.name or "").lower() if para.style is not None else ""
        if style.startswith("heading") and style[-1:].isdigit():
            headings.append(Heading(offset, int(style[-1]), text))
        parts.append(text)
        offset += len(text) + 2
        if offset > limits.max_text_chars:
            _too_long(path, limits)
    return "\n\n".join(parts), headings


def _too_long(path: Path, limits: Limits) -> None:
    raise DocumentError(
        path,
        f"extracted text too long (more than {limits.max_text_chars:,} characters; "
        "--max-text-chars)",
    )


def load_document(
    path: str | Path,
    max_bytes: int = DEFAULT_MAX_BYTES,
    limits: Limits | None = None,
    deadline: Deadline | None = None,
) -> Document:
    """Load one file into a :class:`Document` within ``limits`` (default: :class:`Limits` with
    ``max_bytes``); raise :class:`DocumentError` saying why not, whatever went wrong (a
    parser's own exception becomes its :func:`failure_reason`). ``deadline``: the file's time
    bound when the caller goes on to chunk it within the same bound (default: a new one of
    ``limits.max_seconds``)."""
    path = Path(path)
    limits = limits or Limits(max_bytes=max_bytes)
    deadline = deadline or Deadline(path, limits.max_seconds)
    try:
        size = path.stat().st_size
        if path.is_dir():
            raise DocumentError(path, "is a directory")
        if size > limits.max_bytes:
            raise DocumentError(path, f"too large ({size:,} bytes > limit {limits.max_bytes:,})")
        if size == 0:
            raise DocumentError(path, "empty file")
        suffix = _suffix_of(path)
        if suffix == ".pdf":
            text, headings = _load_pdf(path, limits, deadline)
        elif suffix == ".docx":
            text, headings = _load_docx(path, limits, deadline)
        else:
            data = path.read_bytes()
            if suffix in HTML_SUFFIXES:
                text, headings = _load_html(path, data, deadline)
            elif suffix in TEXT_SUFFIXES:
                text = clean_text(_decode(path, data))
                headings = rst_headings(text) if suffix == ".rst" else markdown_headings(text)
            else:
                raise DocumentError(path, f"unsupported file type '{suffix or path.name}'")
    except DocumentError:
        raise
    except OSError as e:
        reason = e.strerror or str(e)
        if e.errno == 40:
            reason = "symbolic link loop"
        raise DocumentError(path, reason) from None
    except Exception as e:  # noqa: BLE001 - a parser's surprise is this file's failure only
        raise DocumentError(path, failure_reason(e)) from None
    if not text.strip():
        raise DocumentError(path, "no text (empty after cleaning)")
    if len(text) > limits.max_text_chars:
        _too_long(path, limits)
    deadline.check()
    return Document(path=str(path), text=text, headings=headings)


def load_documents(
    paths: Iterable[str | Path],
    suffixes: tuple[str, ...] = SUPPORTED_SUFFIXES,
    max_bytes: int = DEFAULT_MAX_BYTES,
    follow_links: bool = False,
) -> tuple[list[Document], list[DocumentError]]:
    """Load every supported file under ``paths``; failures are collected, never raised."""
    docs: list[Document] = []
    errors: list[DocumentError] = []
    for item in iter_files(paths, suffixes, follow_links=follow_links):
        if isinstance(item, DocumentError):
            errors.append(item)
            continue
        try:
            docs.append(load_document(item, max_bytes=max_bytes))
        except DocumentError as e:
            errors.append(e)
    return docs, errors
