"""The on-disk layout of an index and its atomic generations.

::

    indexes/NAME/
      CURRENT              name of the live generation (replaced atomically)
      gen-000007/          one complete, immutable index
        manifest.json      sources (content hash, size, mtime, chunk ids), encoder identity,
                           backend, chunking settings
        chunks.jsonl       chunk store: text + metadata by id
        bm25/              rag.retrieval.bm25.BM25Index over the same chunks
        vectors/faiss.npz  the FAISS backend's vectors (Chroma keeps its own store)
        run.json           the ingest config that wrote it
      chroma/              embedded Chroma data (chroma backend only)
      ingest_log.jsonl     one line per ingest run
      .lock                held while an ingest runs

An ingest builds the next generation in a hidden temporary folder, renames it into place and
then replaces ``CURRENT``: a crash at any moment leaves the previous generation live and whole.
For Chroma the manifest is the source of truth; ingest reconciles the collection with it.

Garbage collection (the rule readers rely on): after a publication the live generation and the
one before it stay on disk (:data:`KEEP_GENERATIONS`), and a vector store every generation
shares keeps every id either one names (:func:`kept_chunk_ids`). So a long-lived reader (a
``rag.serve`` replica, the UI) still searching the previous generation finds it whole, on disk
and in the store, until the *next* publication; it switches at its next query
(:class:`rag.retrieval.retriever.Retriever`).
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rag.paths import index_path
from rag.types import Chunk

MANIFEST_VERSION = 1
CURRENT = "CURRENT"
KEEP_GENERATIONS = 2  # the live generation and the one before it (readers may still use it)


class IndexNotFoundError(FileNotFoundError):
    """No ingested index at the given name or path."""


@dataclass
class SourceEntry:
    """What the manifest remembers about one ingested file."""

    hash: str  # sha256 of the file's bytes
    size: int
    mtime_ns: int
    chunk_ids: list[str] = field(default_factory=list)
    ingested: float = 0.0  # time.time() when these chunks were embedded; 0: not recorded


@dataclass
class Manifest:
    """Everything needed to reopen an index and to ingest into it incrementally."""

    encoder: dict[str, Any]  # Encoder.identity(): name, path, dim, fingerprint, ...
    backend: str = "faiss"
    chroma_url: str | None = None
    collection: str = "rag"
    chunking: dict[str, int] = field(default_factory=dict)  # chunk_tokens, overlap, max_tokens
    sources: dict[str, SourceEntry] = field(default_factory=dict)  # absolute path -> entry
    roots: list[str] = field(default_factory=list)  # folders/files given to ingest so far
    version: int = MANIFEST_VERSION

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Manifest:
        d = json.loads(text)
        d["sources"] = {k: SourceEntry(**v) for k, v in d.get("sources", {}).items()}
        return cls(**d)

    def chunk_ids(self) -> set[str]:
        return {i for s in self.sources.values() for i in s.chunk_ids}


def index_dir(index: str | Path) -> Path:
    """The folder of ``index``: a :class:`~pathlib.Path` is taken as the folder itself (what
    ``--index-dir`` gives); a string must be a plain name and lives under ``indexes_dir()``.

    Names are checked (:func:`rag.paths.check_index_name`) so that a name typed into a CLI, a
    ``rag.toml`` or the UI can never address a folder outside ``$RAG_HOME/indexes``."""
    if isinstance(index, Path):
        return index.expanduser()
    return index_path(index)


def collection_name(index: str | Path) -> str:
    """A Chroma collection name for an index (3-63 chars of [a-zA-Z0-9._-], alnum ends)."""
    name = re.sub(r"[^a-zA-Z0-9._-]", "-", Path(str(index)).name).strip("._-") or "rag"
    return f"rag-{name}"[:63].rstrip("._-")


def current_generation(root: Path) -> Path | None:
    """The live generation folder, or None for an index never committed."""
    try:
        name = (root / CURRENT).read_text().strip()
    except FileNotFoundError:
        return None
    gen = root / name
    return gen if gen.is_dir() else None


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def new_generation(root: Path) -> Path:
    """A fresh hidden temporary folder for the next generation."""
    current = current_generation(root)
    n = int(current.name.split("-")[1]) + 1 if current else 1
    tmp = root / f".gen-{n:06d}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    return tmp


def publish_generation(root: Path, tmp: Path, checkpoint=lambda name: None) -> Path:
    """Rename ``tmp`` into place and point CURRENT at it (the commit point), then drop all but
    the previous generation (kept so a reader that has just read CURRENT, or is still searching
    the generation it loaded, can go on using it)."""
    final = root / tmp.name.split(".tmp-")[0].lstrip(".")
    if final.exists():  # left by a run that crashed before updating CURRENT
        shutil.rmtree(final)
    for f in tmp.rglob("*"):  # durable against power loss too, not only process death
        if f.is_file():
            with open(f, "rb") as fh:
                os.fsync(fh.fileno())
    os.rename(tmp, final)
    _fsync_dir(root)
    checkpoint("after-rename")
    pointer = root / f".{CURRENT}.tmp-{os.getpid()}"
    with open(pointer, "w") as f:
        f.write(final.name + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(pointer, root / CURRENT)
    _fsync_dir(root)
    checkpoint("after-pointer")
    clean_stale(root)
    return final


def clean_stale(root: Path, keep: int = KEEP_GENERATIONS) -> None:
    """Remove temporary folders of crashed runs and generations older than the last ``keep``."""
    current = current_generation(root)
    for p in root.glob(".*.tmp-*"):
        shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)
    gens = sorted(p for p in root.glob("gen-*") if p.is_dir())
    if current is None:
        return
    older = [g for g in gens if g.name < current.name]
    for g in older[: max(0, len(older) - (keep - 1))]:
        shutil.rmtree(g, ignore_errors=True)
    for g in gens:
        if g.name > current.name:  # renamed into place but never made current
            shutil.rmtree(g, ignore_errors=True)


def kept_chunk_ids(root: Path) -> set[str]:
    """Chunk ids named by any published generation still on disk (after :func:`clean_stale`:
    the live one and the one before it). A store all generations share must keep these, so a
    reader still on the previous generation never misses a vector it names."""
    current = current_generation(root)
    ids: set[str] = set()
    for gen in sorted(root.glob("gen-*")):
        if current is None or gen.name > current.name or not gen.is_dir():
            continue  # never published: its ids are no reader's
        try:
            ids |= read_manifest(gen).chunk_ids()
        except FileNotFoundError:  # removed meanwhile (no ingest runs beside us: the lock)
            continue
    return ids


@contextmanager
def ingest_lock(root: Path) -> Iterator[None]:
    """Exclusive lock so two ingests never write one index at once (released on any exit,
    including kill -9, because the kernel drops flock locks with the process)."""
    root.mkdir(parents=True, exist_ok=True)
    with open(root / ".lock", "w") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise RuntimeError(f"{root}: another ingest is running on this index") from None
        yield


def read_manifest(gen: Path) -> Manifest:
    return Manifest.from_json((gen / "manifest.json").read_text())


def read_chunks(gen: Path) -> dict[str, Chunk]:
    chunks = {}
    with open(gen / "chunks.jsonl", encoding="utf-8") as f:
        for line in f:
            if line.strip():
                c = Chunk.from_dict(json.loads(line))
                chunks[c.id] = c
    return chunks


def write_json(path: Path, data: Any) -> None:
    path.write_text(json.dumps(data, indent=1, sort_keys=True, default=str))


def write_chunks(gen: Path, chunks: dict[str, Chunk]) -> None:
    with open(gen / "chunks.jsonl", "w", encoding="utf-8") as f:
        for cid in sorted(chunks):
            f.write(json.dumps(chunks[cid].to_dict(), ensure_ascii=False) + "\n")


def open_generation(index: str | Path) -> tuple[Path, Path, Manifest]:
    """(index root, live generation, manifest) or IndexNotFoundError naming the index."""
    root = index_dir(index)
    gen = current_generation(root)
    if gen is None:
        how = f"--index-dir {root}" if isinstance(index, Path) else f"--index {index}"
        raise IndexNotFoundError(f"no index at {root} (run: python -m rag.ingest DOCS {how})")
    return root, gen, read_manifest(gen)
