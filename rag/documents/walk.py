"""Which files a folder holds for ingest: the supported suffixes, the walk and its refusals.

:func:`iter_files` walks the given paths in sorted order and yields each supported file, or a
:class:`~rag.documents.limits.DocumentError` for what is not read: a path that does not exist, a
symbolic link out of the folder (unless followed), a name that is not UTF-8
(:func:`undecodable_name`), a folder that cannot be listed. :func:`document_type` is a file's
type as filters and listings name it. :func:`sources_of_pages`: the text sources a folder holds
beside the HTML pages rendered from them (a Sphinx build's ``_sources``), which ingest passes
over.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from pathlib import Path

from rag.documents.limits import DocumentError, UnreadableFolderError
from rag.storage.paths import printable

MARKDOWN_SUFFIXES = (".md", ".markdown")
TEXT_SUFFIXES = (*MARKDOWN_SUFFIXES, ".txt", ".rst")
HTML_SUFFIXES = (".html", ".htm")
ZIP_SUFFIXES = (".docx",)  # formats that are zip archives (checked by check_zip before parsing)
SUPPORTED_SUFFIXES = TEXT_SUFFIXES + HTML_SUFFIXES + (".pdf",) + ZIP_SUFFIXES


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
    :func:`rag.storage.paths.printable` writes it); None for a name that is text."""
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


# A text file passed over because the HTML page rendered from it is read: one reason for every
# such file, so a Sphinx build's are one line of rag.ingest's report.
SOURCE_OF_PAGE = (
    "the source of an HTML page in the same folder, which is read instead "
    "(--no-skip-sources reads both)"
)
_SOURCE_SUFFIXES = (*TEXT_SUFFIXES, ".ipynb")  # what Sphinx copies into _sources as NAME.txt


def rendered_pages(path: Path) -> list[Path]:
    """Where the HTML page rendered from the text source ``path`` would be, when it is one:
    beside it (Node's ``fs.md`` → ``fs.html``), or, for the copy of a source under a Sphinx
    build's ``_sources`` folder, in the build's root (``_sources/guide/intro.rst.txt`` →
    ``guide/intro.html``, or ``guide/intro/index.html`` from the dirhtml builder). Empty for
    a file that is no text source."""
    if _suffix_of(path) not in TEXT_SUFFIXES:
        return []
    parts = path.parts
    if "_sources" in parts[:-1] and path.name.endswith(".txt"):
        at = len(parts) - 1 - parts[::-1].index("_sources")
        rel = Path(*parts[at + 1 :])
        stem = rel.name[: -len(".txt")]
        for suffix in _SOURCE_SUFFIXES:
            if stem.lower().endswith(suffix) and len(stem) > len(suffix):
                stem = stem[: -len(suffix)]
                break
        base = Path(*parts[:at]) / rel.parent / stem
        return [base.with_name(stem + ".html"), base / "index.html"]
    return [path.with_suffix(s) for s in HTML_SUFFIXES]


def sources_of_pages(files: Iterable[Path | DocumentError]) -> set[Path]:
    """The text files among ``files`` whose rendered HTML page is among them too: a documentation
    build holds each page twice (Sphinx's ``_sources``, Node's ``api/*.md`` beside its
    ``*.html``), and the rendered page is what a reader opens and a citation should name; read
    twice, the copies took every other place among a search's best hits."""
    paths = [f for f in files if isinstance(f, Path)]
    pages = {p for p in paths if _suffix_of(p) in HTML_SUFFIXES}
    return {p for p in paths if any(page in pages for page in rendered_pages(p))}
