"""The documents of an index: list them, and remove one or every one under a folder.

Removal publishes the next generation exactly as an ingest does: under the index's ingest lock,
the next generation's vectors through :func:`indexes.open_for_generation` (a FAISS copy of the
live vectors minus the removed ids; Chroma's shared collection left as is until the generation
is live), then BM25, chunks and manifest written aside and published by
:func:`rag.ingest.apply._write_generation` (one rename, then the ``CURRENT`` swap), then
``reconcile``. So a ``kill -9`` at any point leaves the previous generation loadable, the next
ingest or removal cleans up what the killed run left, and every reader switches at its next
query. Nothing is embedded, so no model is loaded.

The re-ingest rule: a removal takes a document out of the *index*, not out of the folder. The
manifest forgets it, so a later ``rag.ingest`` of a folder that still holds the file adds it
back, and says so (it is counted as ``added``); a file deleted or moved out of the folder stays
out. To keep a file out of an index, remove it from the folder you ingest (or ingest another
folder).

Documents are named as people see them: the path relative to the ingested folder that
:func:`rag.storage.paths.display_names` gives (``library/io.rst.txt``; with the folder's name in front
where two ingested folders hold the same relative path), or a folder of such paths
(``library`` or ``library/``: every document under it). A name that is no document's is also
taken when it is the name one document had while another folder held a document of the same
relative path (``dupB/same.md``, now ``same.md`` since ``dupA/same.md`` was removed), and
refused naming the candidates when it could be several's: one resolver,
:func:`resolve_documents`, for every front end. Every path is checked by one function,
:func:`check_document_path`, for every front end (``rag.docs``, ``DELETE /v1/documents``, MCP's
resources, the UI): never an absolute path (``/tmp/x``, nor ``\\tmp\\x``, which reads as one
once a backslash is a separator), never the whole index (``\\``, ``.``, ``''``), never out of it
(``..``). A path that names no document is refused before anything is written, naming it, and
so is a removal that would leave the index without documents unless asked for in so many words
(``remove_documents(..., everything=True)``, ``rag.docs remove --all``; the API and the UI never
empty an index).
"""

from __future__ import annotations

import json
import posixpath
import re
import time
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

from indexes import open_for_generation
from rag.documents import document_type
from rag.ingest.apply import _write_generation
from rag.storage.manifest import (
    Manifest,
    clean_stale,
    ingest_lock,
    kept_chunk_ids,
    new_generation,
    open_generation,
    read_chunks,
)
from rag.storage.paths import display_names, earlier_display_name, printable

LIST_HINT = "python -m rag.docs list"


class DocumentNotFoundError(LookupError):
    """Paths that name no document of the index (the message names each)."""

    def __init__(self, message: str, paths: list[str]) -> None:
        super().__init__(message)
        self.paths = paths


class AmbiguousDocumentError(DocumentNotFoundError):
    """A name that is no document's and is the earlier, root-qualified name of several
    (:func:`rag.storage.paths.earlier_display_name`); the message names them (``candidates``)."""

    def __init__(self, message: str, paths: list[str], candidates: list[str]) -> None:
        super().__init__(message, paths)
        self.candidates = candidates


class DocumentPathError(ValueError):
    """A path no removal (or document resource) takes: absolute, the whole index, out of it."""


class WouldEmptyIndexError(ValueError):
    """A removal that would leave the index without a single document, not asked for as such
    (``rag.docs remove --all``); the API and the UI refuse it always."""


_DRIVE = re.compile(r"^[A-Za-z]:[\\/]")  # C:\x or C:/x: absolute on Windows


def check_document_path(path: str) -> str:
    """``path`` as a removal or a document resource names a document (or a folder of them),
    checked once for every front end, and made canonical: backslashes read as separators,
    ``./`` and doubled slashes dropped (``library//io.md`` -> ``library/io.md``).
    :class:`DocumentPathError` for a path that is absolute (``/tmp/x``; ``\\tmp\\x`` and ``C:\\x``,
    which are once a backslash is a separator: the API checked for ``/`` before turning ``\\``
    into ``/``, so ``DELETE /v1/documents/%5C`` removed all 1,512 documents and
    ``%5Ctmp%5C...`` one by its server path), that names the whole index (``\\``, ``.``, ``''``)
    or leads out of it (``..``), or holds a NUL."""
    if not isinstance(path, str) or not path.strip():
        raise DocumentPathError(f"{path!r} names no document (an empty path)")
    if "\x00" in path:
        raise DocumentPathError(f"{path!r} holds a NUL character, which no file name holds")
    slashed = path.replace("\\", "/")
    if slashed.startswith("/") or _DRIVE.match(path):
        raise DocumentPathError(
            f"{path!r} is an absolute path: name a document as the list shows it, relative to "
            "its ingested folder"
        )
    norm = posixpath.normpath(slashed)
    if norm in ("", "."):
        raise DocumentPathError(
            f"{path!r} names the whole index, not a document or a folder of them"
        )
    if norm == ".." or norm.startswith("../"):
        raise DocumentPathError(f"{path!r} leads out of the index's documents")
    return norm


@dataclass(frozen=True)
class DocumentInfo:
    """One ingested document as listed: what the manifest records about it."""

    path: str  # relative to the ingested folder (what results and citations show)
    source: str  # the absolute path the manifest keys it by (never sent over the API)
    type: str  # md, txt, rst, html, pdf, docx (rag.documents.document_type)
    chunks: int  # chunks it contributes to the index
    bytes: int  # file size when it was ingested
    hash: str  # sha256 of the file's bytes when it was ingested
    ingested: float  # time.time() when its chunks were embedded; 0: not recorded (older index)
    encoder: str  # the index's encoder, which embedded it

    def to_dict(self, include_source: bool = False) -> dict[str, Any]:
        """JSON-ready; ``ingested`` as ISO 8601 UTC (null when not recorded). The absolute
        ``source`` only when asked for (the CLI's ``--json``, never the HTTP API)."""
        d = asdict(self)
        d["ingested"] = iso_time(self.ingested)
        if not include_source:
            del d["source"]
        return d


@dataclass
class IndexDocuments:
    """The documents of an index's live generation, by path."""

    index: str
    generation: str
    documents: list[DocumentInfo]

    @property
    def chunks(self) -> int:
        return sum(d.chunks for d in self.documents)

    def to_dict(self, include_source: bool = False) -> dict[str, Any]:
        return {
            "index": self.index,
            "generation": self.generation,
            "chunks": self.chunks,
            "documents": [d.to_dict(include_source) for d in self.documents],
        }


@dataclass
class RemovalRun:
    """What ``run.json`` records for a generation a removal wrote (an ingest records its
    :class:`~rag.ingest.config.IngestConfig`)."""

    index: str  # the index as named (a name, or the folder given as --index-dir)
    paths: list[str]  # the paths asked to remove
    removed: list[str]  # the manifest keys (absolute paths) that went
    operation: str = "remove"  # tells this run.json from an ingest's


@dataclass
class RemovalReport:
    """What one removal did."""

    index: str
    removed: list[DocumentInfo] = field(default_factory=list)
    chunks_removed: int = 0
    chunks: int = 0  # chunks in the index after the removal
    generation: str = ""  # the generation published
    seconds: float = 0.0

    def summary(self) -> str:
        return (
            f"{self.index}: removed {len(self.removed)} document(s), {self.chunks_removed} "
            f"chunks; {self.chunks} chunks left in {self.generation} ({self.seconds:.1f}s)"
        )

    def to_dict(self, include_source: bool = False) -> dict[str, Any]:
        return {
            "index": self.index,
            "removed": [d.to_dict(include_source) for d in self.removed],
            "chunks_removed": self.chunks_removed,
            "chunks": self.chunks,
            "generation": self.generation,
            "seconds": round(self.seconds, 3),
            "summary": self.summary(),
        }


def iso_time(t: float) -> str | None:
    """``t`` (seconds since the epoch) as ``2025-01-31T12:00:00Z``; None for 0 (unknown)."""
    if not t:
        return None
    return datetime.fromtimestamp(t, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _documents(manifest: Manifest) -> dict[str, DocumentInfo]:
    """Every document of ``manifest`` by its manifest key."""
    encoder = str(manifest.encoder.get("name", ""))
    names = display_names(manifest.sources, manifest.roots)
    return {
        key: DocumentInfo(
            path=names[key],
            source=key,
            type=document_type(key),
            chunks=len(entry.chunk_ids),
            bytes=entry.size,
            hash=entry.hash,
            ingested=entry.ingested,
            encoder=encoder,
        )
        for key, entry in manifest.sources.items()
    }


def list_documents(index: str | Path) -> IndexDocuments:
    """The documents of ``index`` (a name under ``$RAG_HOME/indexes``, or an index folder as a
    :class:`~pathlib.Path`), sorted by path; :class:`rag.storage.manifest.IndexNotFoundError` when
    there is no index."""
    _, gen, manifest = open_generation(index)
    docs = sorted(_documents(manifest).values(), key=lambda d: (d.path, d.source))
    return IndexDocuments(str(index), gen.name, docs)


def _named_by(asked: str, path: str, folders: bool) -> bool:
    """Whether ``asked`` names the document shown as ``path``: that path, or with ``folders``
    a folder above it."""
    return path == asked or (folders and path.startswith(asked.rstrip("/") + "/"))


def resolve_documents(
    asked: str, names: dict[str, str], roots: list[str], *, as_listed: bool = True
) -> list[str]:
    """The keys of ``names`` (manifest key -> display name, :func:`display_names`) that the
    path ``asked`` names, sorted: the one resolver of every front end (``rag.docs``, the API,
    MCP's resources). First the documents it names by their current name; with ``as_listed``
    (a removal's path) also every document under it as a folder, and else the name as
    ``list`` shows it, control characters escaped (:func:`rag.storage.paths.printable`, so a
    name holding a newline is typed back as ``\\n``). Else the one document whose earlier,
    root-qualified name it is (:func:`rag.storage.paths.earlier_display_name`: ``dupB/same.md``
    once ``dupA/same.md`` is gone); :class:`AmbiguousDocumentError` when it is several's, []
    when it names none. :class:`DocumentPathError` for a path no front end takes
    (:func:`check_document_path`)."""
    clean = check_document_path(asked)
    found = {k for k, n in names.items() if _named_by(clean, n, as_listed)}
    # else the escaped form `list` shows (not normalised: the escapes hold backslashes)
    if not found and as_listed and (typed := asked.removeprefix("./")):
        found = {k for k, n in names.items() if _named_by(typed, printable(n), True)}
        if sum(printable(names[k]) == typed for k in found) > 1:
            found = set()  # the shown form of two documents names neither
    if not found:
        found = {k for k in names if earlier_display_name(clean, k, roots)}
        if len(found) > 1:
            candidates = sorted(names[k] for k in found)
            raise AmbiguousDocumentError(
                f"{asked!r} is no document's name and was the name of more than one: "
                f"{', '.join(repr(c) for c in candidates)}; name one of these",
                [asked],
                candidates,
            )
    return sorted(found)


def match_documents(manifest: Manifest, paths: list[str], index: str | Path) -> list[str]:
    """The manifest keys ``paths`` name (each a document or a folder of documents, see
    :func:`resolve_documents`; a name may be given as ``list`` shows it, escaped), sorted;
    :class:`DocumentNotFoundError` naming every path that names none (or is empty),
    :class:`AmbiguousDocumentError` naming the candidates of one that names several."""
    paths = [str(p) for p in paths]
    for p in paths:
        check_document_path(p)  # all of them, before any lookup
    names = display_names(manifest.sources, manifest.roots)
    keys: set[str] = set()
    unknown = []
    for asked in paths:
        try:
            found = resolve_documents(asked, names, manifest.roots)
        except AmbiguousDocumentError as e:
            raise AmbiguousDocumentError(
                f"index {str(index)!r}: {e}; nothing was removed", e.paths, e.candidates
            ) from None
        if not found:
            unknown.append(asked)
        keys |= set(found)
    if unknown:
        listed = ", ".join(repr(p) for p in unknown)
        how = f"--index-dir {index}" if isinstance(index, Path) else f"--index {index}"
        raise DocumentNotFoundError(
            f"index {str(index)!r} has no document {listed} (nor any under it); nothing was "
            f"removed (`{LIST_HINT} {how}` shows its documents)",
            unknown,
        )
    return sorted(keys)


def remove_documents(
    index: str | Path, paths: list[str], *, everything: bool = False
) -> RemovalReport:
    """Remove the documents ``paths`` name from ``index`` and publish the generation without
    them (see the module docstring). Every path is checked before anything is written: one
    that may not be taken raises :class:`DocumentPathError`, one that names no document
    :class:`DocumentNotFoundError`, and a removal that would leave no document
    :class:`WouldEmptyIndexError` unless ``everything`` (``rag.docs remove --all``; with no
    ``paths``, every document goes); the index is then unchanged. RuntimeError when an ingest
    (or another removal) holds the index's lock."""
    t0 = time.perf_counter()
    label = str(index)
    paths = [str(p) for p in paths]
    if not paths and not everything:
        raise ValueError("no document paths given (PATH ..., or --all for every document)")
    for p in paths:
        check_document_path(p)  # a bad path is refused before the index is even opened
    root, _, _ = open_generation(index)  # no index: refused before the lock creates a folder
    with ingest_lock(root):
        clean_stale(root)  # what a killed ingest or removal left
        root, gen, manifest = open_generation(index)
        keys = match_documents(manifest, paths, index) if paths else sorted(manifest.sources)
        if not keys:
            raise ValueError(f"index {label!r} holds no documents; nothing was removed")
        if len(keys) == len(manifest.sources) and not everything:
            names = ", ".join(repr(p) for p in paths)
            raise WouldEmptyIndexError(
                f"removing {names} would remove every document of index {label!r} "
                f"({len(keys)}); nothing was removed (`rag.docs remove --all` empties an index)"
            )
        docs = _documents(manifest)
        dropped = {i for k in keys for i in manifest.sources[k].chunk_ids}
        chunks = {i: c for i, c in read_chunks(gen).items() if i not in dropped}
        kept = {k: v for k, v in manifest.sources.items() if k not in keys}
        after = replace(manifest, sources=kept)
        tmp = new_generation(root)
        dim = manifest.encoder["dim"]
        vindex = open_for_generation(
            manifest.backend,
            root,
            gen,
            tmp,
            dim,
            chroma_url=manifest.chroma_url,
            collection=manifest.collection,
        )
        try:
            run = RemovalRun(label, paths or ["--all"], keys)
            empty = np.zeros((0, dim), dtype=np.float32)
            name = _write_generation(run, root, tmp, after, chunks, vindex, [], empty, dropped)
            # as after an ingest: a shared store keeps the previous generation's ids for readers
            # still on it, and drops them at the next publication
            vindex.reconcile(set(chunks) | kept_chunk_ids(root) if vindex.shared_store else chunks)
        finally:
            vindex.close()
        report = RemovalReport(
            label,
            removed=sorted((docs[k] for k in keys), key=lambda d: (d.path, d.source)),
            chunks_removed=len(dropped),
            chunks=len(chunks),
            generation=name,
            seconds=time.perf_counter() - t0,
        )
        with open(root / "ingest_log.jsonl", "a") as f:  # the index's one log of changes
            f.write(json.dumps({"time": time.time(), **asdict(run)}) + "\n")
    return report
