"""Upload safety: which uploaded files may reach ingest, and under which name.

Gradio already stores every upload under its own cache folder with the directory part of the
name removed; this module adds the project's rules before anything is ingested:

* the name the client claims (``orig_name``) must be a plain file name: no ``/`` or ``\\``,
  no ``..``, no leading dot, no control characters (a traversal-style name is refused, not
  silently "fixed", so the user learns what happened);
* the type must be one ingest supports (:data:`rag.documents.SUPPORTED_SUFFIXES`);
* the size must be within the app's limit (and the file not empty);
* the content must match the type: text formats may not contain NUL bytes, a ``.pdf`` must start
  with ``%PDF-`` and a ``.docx`` must be a zip archive.

Accepted files are copied into ``$RAG_HOME/uploads/<index>/`` under their checked name, so the
chunks' ``source`` is a stable, readable path; the Gradio temp path is never shown or kept.
"""

from __future__ import annotations

import re
import shutil
from dataclasses import dataclass
from pathlib import Path

from rag import HTML_SUFFIXES, SUPPORTED_SUFFIXES, TEXT_SUFFIXES, rag_home

DEFAULT_MAX_UPLOAD_BYTES = 10 * 1024 * 1024  # per file
_BAD_CHARS = re.compile(r"[\x00-\x1f\x7f/\\:*?\"<>|]")


@dataclass(frozen=True)
class Refusal:
    """An upload that was not ingested: the name as given and a reason a user can act on."""

    name: str
    reason: str

    def __str__(self) -> str:
        return f"{self.name}: {self.reason}"


def suffix_of(name: str) -> str:
    """Lower-case suffix, treating Sphinx ``*.rst.txt`` sources as ``.rst``."""
    low = name.lower()
    if low.endswith(".rst.txt"):
        return ".rst"
    return Path(low).suffix


def check_name(name: str) -> str | None:
    """Why ``name`` is not acceptable as an upload's file name, or None when it is."""
    if not name or not name.strip():
        return "empty file name"
    if "/" in name or "\\" in name or ".." in name:
        return "file name contains a path ('/', '\\' or '..'); upload the file itself"
    if name.startswith("."):
        return "hidden file names (starting with '.') are not accepted"
    if _BAD_CHARS.search(name):
        return "file name contains control or reserved characters"
    if len(name.encode()) > 200:
        return "file name longer than 200 bytes"
    if suffix_of(name) not in SUPPORTED_SUFFIXES:
        allowed = ", ".join(SUPPORTED_SUFFIXES)
        return f"unsupported file type '{suffix_of(name) or name}' (allowed: {allowed})"
    return None


def check_content(path: Path, name: str, max_bytes: int) -> str | None:
    """Why the bytes at ``path`` are not acceptable for a file called ``name``, or None."""
    size = path.stat().st_size
    if size > max_bytes:
        return f"too large ({size:,} bytes > limit {max_bytes:,})"
    if size == 0:
        return "empty file"
    with path.open("rb") as f:
        head = f.read(8192)
    suffix = suffix_of(name)
    if suffix in TEXT_SUFFIXES + HTML_SUFFIXES and b"\x00" in head:
        return f"binary content (NUL bytes) in a '{suffix}' file"
    if suffix == ".pdf" and not head.startswith(b"%PDF-"):
        return "not a PDF (missing %PDF- header)"
    if suffix == ".docx" and not head.startswith(b"PK\x03\x04"):
        return "not a .docx (not a zip archive)"
    return None


def uploads_dir(index: str) -> Path:
    """Where accepted uploads for ``index`` are kept (the source path their chunks cite)."""
    return rag_home() / "uploads" / Path(index).name


def stage_uploads(
    files: list[tuple[str, str]], index: str, max_bytes: int = DEFAULT_MAX_UPLOAD_BYTES
) -> tuple[list[Path], list[Refusal]]:
    """Check ``(temp_path, claimed_name)`` pairs; copy accepted ones into :func:`uploads_dir`.

    Returns the staged paths (to pass to ingest) and the refusals (to report). Nothing is
    written for a refused file.
    """
    staged: list[Path] = []
    refused: list[Refusal] = []
    dest_dir = uploads_dir(index)
    for temp_path, name in files:
        reason = check_name(name)
        if reason is None:
            try:
                reason = check_content(Path(temp_path), name, max_bytes)
            except OSError as e:
                reason = f"could not read the upload ({e.strerror or e})"
        if reason is not None:
            refused.append(Refusal(name, reason))
            continue
        dest_dir.mkdir(parents=True, exist_ok=True)
        dest = dest_dir / name
        shutil.copyfile(temp_path, dest)
        staged.append(dest)
    return staged, refused
