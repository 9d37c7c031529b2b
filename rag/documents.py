"""Document loading: one module for ingestion, pretraining corpora and pair mining.

Every supported file becomes a :class:`Document`: clean text plus the headings found in it, each
with its character offset, so that chunking can split on headings and keep a heading path.

Formats: .md/.markdown, .txt, .rst (and Sphinx ``*.rst.txt`` sources), .html/.htm (text only,
scripts and styles dropped, headings kept as ``#`` lines), .pdf (pypdf), .docx (python-docx,
optional extra). Anything that cannot be loaded raises :class:`DocumentError` naming the path
and the reason; :func:`load_documents` collects those instead of stopping.

Why hand-written: the parsers are libraries (BeautifulSoup, pypdf, python-docx); what is ours is
the heading extraction for md/rst and the uniform error reporting that ingest needs.
"""

from __future__ import annotations

import logging
import os
import re
import unicodedata
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

TEXT_SUFFIXES = (".md", ".markdown", ".txt", ".rst")
HTML_SUFFIXES = (".html", ".htm")
SUPPORTED_SUFFIXES = TEXT_SUFFIXES + HTML_SUFFIXES + (".pdf", ".docx")
DEFAULT_MAX_BYTES = 20 * 1024 * 1024


class DocumentError(Exception):
    """A file that could not be loaded; ``str()`` reads ``path: reason``."""

    def __init__(self, path: str | Path, reason: str):
        self.path = str(path)
        self.reason = reason
        super().__init__(f"{self.path}: {reason}")


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

    def heading_path_at(self, offset: int) -> tuple[str, ...]:
        """The chain of headings (top level first) that governs character ``offset``."""
        stack: list[Heading] = []
        for h in self.headings:
            if h.offset > offset:
                break
            while stack and stack[-1].level >= h.level:
                stack.pop()
            stack.append(h)
        return tuple(h.title for h in stack)


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
    Hidden files and folders (``.git``) are passed over silently."""
    for raw in paths:
        root = Path(raw)
        if not root.exists() and not root.is_symlink():
            yield DocumentError(root, "no such file or directory")
            continue
        if not root.is_dir():
            yield root
            continue
        real_root = root.resolve()
        walked: set[str] = set()
        for dirpath, dirnames, filenames in os.walk(root, followlinks=follow_links):
            real = os.path.realpath(dirpath)
            if real in walked:  # reached again through a link: a cycle or a duplicate
                dirnames[:] = []
                continue
            walked.add(real)
            dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
            for name in sorted(filenames):
                if name.startswith("."):
                    continue
                p = Path(dirpath) / name
                if _suffix_of(p) not in suffixes:
                    if skipped is not None:
                        skipped.append(
                            DocumentError(p, f"unsupported file type '{_suffix_of(p) or name}'")
                        )
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


def _load_html(path: Path, data: bytes) -> tuple[str, list[Heading]]:
    from bs4 import BeautifulSoup

    soup = BeautifulSoup(_decode(path, data), "html.parser")
    for tag in soup(["script", "style", "noscript", "template", "svg"]):
        tag.decompose()
    for tag in soup.find_all(["h1", "h2", "h3", "h4", "h5", "h6"]):
        title = " ".join(tag.get_text(" ").split())
        tag.replace_with(f"\n\n{'#' * int(tag.name[1])} {title}\n\n")
    for tag in soup.find_all(["p", "div", "li", "pre", "tr", "br", "section", "article"]):
        tag.insert_after("\n")
    text = clean_text(soup.get_text())
    return text, markdown_headings(text)


def _load_pdf(path: Path) -> tuple[str, list[Heading]]:
    # pypdf logs its repairs of damaged files ("Ignoring wrong pointing object ...") as
    # warnings; without a handler Python prints them on stderr between ingest's own one-line
    # failure reports. A file it cannot read still raises and is reported once, by us.
    logging.getLogger("pypdf").setLevel(logging.ERROR)
    from pypdf import PdfReader
    from pypdf.errors import PdfReadError

    try:
        reader = PdfReader(str(path))
        pages = [page.extract_text() or "" for page in reader.pages]
    except (PdfReadError, ValueError, KeyError, TypeError) as e:
        raise DocumentError(path, f"unreadable PDF ({e})") from None
    return clean_text("\n\n".join(pages)), []


def _load_docx(path: Path) -> tuple[str, list[Heading]]:
    try:
        import docx
    except ImportError:
        raise DocumentError(
            path, "reading .docx needs the 'docx' extra (pip install python-docx)"
        ) from None
    try:
        document = docx.Document(str(path))
    except Exception as e:  # python-docx raises several unrelated types for corrupt files
        raise DocumentError(path, f"unreadable .docx ({e})") from None
    parts, headings, offset = [], [], 0
    for para in document.paragraphs:
        text = para.text.strip()
        if not text:
            continue
        style = (para.style.name or "").lower() if para.style is not None else ""
        if style.startswith("heading") and style[-1:].isdigit():
            headings.append(Heading(offset, int(style[-1]), text))
        parts.append(text)
        offset += len(text) + 2
    return "\n\n".join(parts), headings


def load_document(path: str | Path, max_bytes: int = DEFAULT_MAX_BYTES) -> Document:
    """Load one file into a :class:`Document`; raise :class:`DocumentError` saying why not."""
    path = Path(path)
    try:
        size = path.stat().st_size
        if path.is_dir():
            raise DocumentError(path, "is a directory")
        if size > max_bytes:
            raise DocumentError(path, f"too large ({size:,} bytes > limit {max_bytes:,})")
        if size == 0:
            raise DocumentError(path, "empty file")
        suffix = _suffix_of(path)
        if suffix == ".pdf":
            text, headings = _load_pdf(path)
        elif suffix == ".docx":
            text, headings = _load_docx(path)
        else:
            data = path.read_bytes()
            if suffix in HTML_SUFFIXES:
                text, headings = _load_html(path, data)
            elif suffix in TEXT_SUFFIXES:
                text = clean_text(_decode(path, data))
                headings = rst_headings(text) if suffix == ".rst" else markdown_headings(text)
            else:
                raise DocumentError(path, f"unsupported file type '{suffix or path.name}'")
    except OSError as e:
        reason = e.strerror or str(e)
        if e.errno == 40:
            reason = "symbolic link loop"
        raise DocumentError(path, reason) from None
    if not text.strip():
        raise DocumentError(path, "no text (empty after cleaning)")
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
