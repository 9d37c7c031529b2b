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
one live before it stay on disk, and a vector store every generation shares keeps every id
either one names (:func:`kept_chunk_ids`). So a long-lived reader (a ``rag.serve`` replica, the
UI) still searching the previous generation finds it whole, on disk and in the store, until the
*next* publication; it switches at its next query (:class:`rag.retrieval.retriever.Retriever`).
The newest complete generation is never removed either, whatever ``CURRENT`` says (after a crash
between the rename and the pointer, or a hand-edited pointer), and a new generation is numbered
after every one on disk, so publishing never replaces a folder.

Integrity: ``CURRENT`` must hold one ``gen-NNNNNN`` name of a folder directly inside the index
(:func:`current_generation`); anything else (empty, ``../other/gen-000001``, a missing folder) is
an :class:`IndexIntegrityError` naming the index and the file, and nothing is deleted. Each
generation's manifest records the size and SHA-256 of every other file in it (``files``, written
at publication); opening checks the sizes (a ``stat`` per file) and the chunk store against the
manifest, :func:`verify_generation` (``rag.search --verify``) the checksums too.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rag.storage.paths import CURRENT, index_path
from rag.types import Chunk

MANIFEST_VERSION = 1
MANIFEST = "manifest.json"
CHUNKS = "chunks.jsonl"
GENERATION_NAME = re.compile(r"gen-(\d{6,})")  # what CURRENT may hold, and every generation's name
POINTER_READS = 3  # reads of CURRENT when the generation it names vanished (two publications)


class IndexNotFoundError(FileNotFoundError):
    """No ingested index at the given name or path."""


class IndexIntegrityError(OSError):
    """An index whose files are not what was published (a bad ``CURRENT``, a missing, truncated
    or altered file); the message names the index and the file. An OSError: exit status 2
    (rag.cli), the command cannot run on this index as it is."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


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
    # every other file of the generation (relative path -> {"size", "sha256"}), recorded at
    # publication; empty for generations written before it was (nothing to check)
    files: dict[str, dict[str, Any]] = field(default_factory=dict)
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

    Names are checked (:func:`rag.storage.paths.check_index_name`) so that a name typed into a CLI, a
    ``rag.toml`` or the UI can never address a folder outside ``$RAG_HOME/indexes``."""
    if isinstance(index, Path):
        return index.expanduser()
    return index_path(index)


def collection_name(index: str | Path) -> str:
    """A Chroma collection name for an index (3-63 chars of [a-zA-Z0-9._-], alnum ends)."""
    name = re.sub(r"[^a-zA-Z0-9._-]", "-", Path(str(index)).name).strip("._-") or "rag"
    return f"rag-{name}"[:63].rstrip("._-")


def _number(gen: Path) -> int:
    return int(gen.name.split("-")[1])


def generations(root: Path) -> list[Path]:
    """The generation folders of ``root`` (valid ``gen-NNNNNN`` names), oldest first."""
    gens = [p for p in root.glob("gen-*") if GENERATION_NAME.fullmatch(p.name) and p.is_dir()]
    return sorted(gens, key=_number)


def is_complete(gen: Path) -> bool:
    """Whether ``gen`` holds what every published generation holds (its manifest and chunks)."""
    return (gen / MANIFEST).is_file() and (gen / CHUNKS).is_file()


def newest_complete(root: Path) -> Path | None:
    """The newest complete generation on disk, whatever ``CURRENT`` says."""
    return next((g for g in reversed(generations(root)) if is_complete(g)), None)


def _pointer_error(root: Path, problem: str) -> IndexIntegrityError:
    newest = newest_complete(root)
    hint = (
        f"; the newest complete generation is {newest.name} "
        f"(echo {newest.name} > {root / CURRENT} restores it)"
        if newest is not None
        else ""
    )
    return IndexIntegrityError(f"index {root}: {root / CURRENT}: {problem}{hint}")


def current_generation(root: Path) -> Path | None:
    """The live generation folder, or None for an index never committed (no ``CURRENT``).

    ``CURRENT`` must hold a ``gen-NNNNNN`` name of a folder directly inside ``root``, else
    :class:`IndexIntegrityError` naming the file: an empty pointer, a path
    (``../other/gen-000001``: one index serving another's generation) or a name whose folder
    is missing would otherwise read as "no index yet", and the next ingest would number its
    generation 1 and garbage-collect the intact ones."""
    pointer = root / CURRENT
    for _ in range(POINTER_READS):
        try:
            raw = pointer.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as e:
            raise _pointer_error(root, f"unreadable ({e.strerror or e})") from None
        name = raw.decode("utf-8", "replace").strip()
        if not GENERATION_NAME.fullmatch(name):
            shown = repr(name[:80]) if name else "empty"
            raise _pointer_error(root, f"does not name a generation ({shown}; expected gen-NNNNNN)")
        gen = root / name
        if gen.is_symlink() or (gen.exists() and gen.resolve().parent != root.resolve()):
            raise _pointer_error(root, f"{name} is a link out of the index")
        if gen.is_dir():
            return gen
        try:  # published over twice while we read: read the pointer again
            if pointer.read_bytes() != raw:
                continue
        except FileNotFoundError:
            return None
        break
    raise _pointer_error(root, f"names {name}, which is not a folder of the index")


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def new_generation(root: Path) -> Path:
    """A fresh hidden temporary folder for the next generation, numbered after every generation
    on disk (not only the live one), so its publication never replaces a folder."""
    current = current_generation(root)
    numbers = [_number(g) for g in generations(root)] + ([_number(current)] if current else [])
    n = max(numbers, default=0) + 1
    tmp = root / f".gen-{n:06d}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    return tmp


def publish_generation(root: Path, tmp: Path, checkpoint=lambda name: None) -> Path:
    """Rename ``tmp`` into place and point CURRENT at it (the commit point), then drop the
    generations no reader needs (:func:`clean_stale`; the one live until now is kept, so a
    reader that has just read CURRENT, or is still searching the generation it loaded, can go
    on using it)."""
    final = root / tmp.name.split(".tmp-")[0].lstrip(".")
    if final.exists():  # new_generation numbers past every folder: something else made it
        raise IndexIntegrityError(f"index {root}: {final} appeared during the ingest; not replaced")
    previous = current_generation(root)
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
    clean_stale(root, previous=previous)
    return final


def kept_generations(root: Path, previous: Path | None = None) -> list[Path]:
    """The generations garbage collection keeps: the live one, the one live before it
    (``previous``; unknown: the newest older than the live one) and the newest complete one.
    Empty for an index never committed. Raises :class:`IndexIntegrityError` for a bad
    ``CURRENT`` (so nothing is collected on its word)."""
    current = current_generation(root)
    if current is None:
        return []
    gens = generations(root)
    if previous is None:
        previous = next((g for g in reversed(gens) if _number(g) < _number(current)), None)
    keep = [current, previous, newest_complete(root)]
    return [g for g in gens if g in keep]


def clean_stale(root: Path, previous: Path | None = None) -> None:
    """Remove temporary folders of crashed runs and the generations :func:`kept_generations`
    does not keep (older ones, and newer ones that are incomplete). A bad ``CURRENT`` raises
    before anything is removed; an index never committed loses its temporary folders only."""
    kept = kept_generations(root, previous)
    for p in root.glob(".*.tmp-*"):
        shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)
    if not kept:
        return
    for g in generations(root):
        if g not in kept:
            shutil.rmtree(g, ignore_errors=True)


def kept_chunk_ids(root: Path) -> set[str]:
    """Chunk ids named by the published generations still on disk that a reader may search
    (after :func:`clean_stale`: the live one and the one before it; a newer one kept only as
    the newest complete was never live). A store all generations share must keep these, so a
    reader still on the previous generation never misses a vector it names."""
    current = current_generation(root)
    ids: set[str] = set()
    for gen in generations(root):
        if current is None or _number(gen) > _number(current):
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


def _bad_json(gen: Path, file: Path, e: Exception) -> IndexIntegrityError:
    return IndexIntegrityError(f"index {gen.parent}: {file}: not what was published ({e})")


def read_manifest(gen: Path) -> Manifest:
    """The manifest of ``gen``; FileNotFoundError when it is gone, IndexIntegrityError naming
    the file when it is not a manifest (truncated, altered)."""
    file = gen / MANIFEST
    text = file.read_text(encoding="utf-8", errors="replace")
    try:
        return Manifest.from_json(text)
    except (ValueError, TypeError, AttributeError) as e:
        raise _bad_json(gen, file, e) from None


def read_chunks(gen: Path) -> dict[str, Chunk]:
    """The chunk store of ``gen`` by id (IndexIntegrityError naming the file and line for a
    line that is not a chunk)."""
    chunks = {}
    file = gen / CHUNKS
    with open(file, encoding="utf-8", errors="replace") as f:
        for n, line in enumerate(f, start=1):
            if line.strip():
                try:
                    c = Chunk.from_dict(json.loads(line))
                except (ValueError, TypeError, KeyError, AttributeError) as e:
                    raise _bad_json(gen, file, f"line {n}: {e}") from None
                chunks[c.id] = c
    return chunks


def write_json(path: Path, data: Any) -> None:
    path.write_text(json.dumps(data, indent=1, sort_keys=True, default=str))


def write_chunks(gen: Path, chunks: dict[str, Chunk]) -> None:
    with open(gen / CHUNKS, "w", encoding="utf-8") as f:
        for cid in sorted(chunks):
            f.write(json.dumps(chunks[cid].to_dict(), ensure_ascii=False) + "\n")


# ---------------------------------------------------------------------------- integrity


def file_hash(path: Path) -> str:
    """SHA-256 of a file's bytes, read in 1 MiB blocks (sources in the manifest, and the
    generation's own files)."""
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def file_records(gen: Path) -> dict[str, dict[str, Any]]:
    """Size and SHA-256 of every file of ``gen`` but its manifest (which stores them), by path
    relative to ``gen``: what :func:`check_generation` compares against."""
    return {
        f.relative_to(gen).as_posix(): {"size": f.stat().st_size, "sha256": file_hash(f)}
        for f in sorted(gen.rglob("*"))
        if f.is_file() and f.name != MANIFEST
    }


def check_generation(root: Path, gen: Path, manifest: Manifest, checksums: bool = False) -> None:
    """Raise :class:`IndexIntegrityError` naming the index and the first file of ``gen`` that is
    missing or differs from what its manifest recorded at publication: by size always (one
    ``stat`` a file), by SHA-256 too with ``checksums``. A generation whose folder is gone
    raises FileNotFoundError instead (removed by a publication meanwhile: read CURRENT again)."""
    for rel, rec in sorted(manifest.files.items()):
        file = gen / rel
        try:
            size = file.stat().st_size
        except FileNotFoundError:
            if not gen.is_dir():
                raise
            raise IndexIntegrityError(f"index {root}: {file}: missing") from None
        if size != rec["size"]:
            raise IndexIntegrityError(
                f"index {root}: {file}: {size:,} bytes, {rec['size']:,} when published "
                "(truncated or replaced)"
            )
        if checksums and file_hash(file) != rec["sha256"]:
            raise IndexIntegrityError(
                f"index {root}: {file}: checksum differs from the one recorded at publication"
            )


def check_chunks(root: Path, gen: Path, manifest: Manifest, chunks: dict[str, Chunk]) -> None:
    """The chunk store holds exactly the chunks the manifest's sources name (checked on every
    opening, also for generations that recorded no file sizes)."""
    named = manifest.chunk_ids()
    if set(chunks) != named:
        lost, extra = len(named - set(chunks)), len(set(chunks) - named)
        raise IndexIntegrityError(
            f"index {root}: {gen / CHUNKS}: {lost} chunk(s) the manifest names are missing, "
            f"{extra} it does not name are present"
        )


def verify_generation(index: str | Path) -> tuple[Path, Path, int]:
    """Check the live generation of ``index`` fully: the pointer, every recorded file's size and
    SHA-256, the chunk store against the manifest. Returns (root, generation, files checked);
    raises :class:`IndexIntegrityError` (or IndexNotFoundError) naming the index and file."""
    root, gen, manifest = open_generation(index, checksums=True)
    check_chunks(root, gen, manifest, read_chunks(gen))
    return root, gen, len(manifest.files)


def open_generation(index: str | Path, checksums: bool = False) -> tuple[Path, Path, Manifest]:
    """(index root, live generation, manifest) or IndexNotFoundError naming the index; the
    generation's files are checked against its manifest (:func:`check_generation`: sizes, and
    with ``checksums`` their SHA-256)."""
    root = index_dir(index)
    gen = current_generation(root)
    if gen is None:
        how = f"--index-dir {root}" if isinstance(index, Path) else f"--index {index}"
        raise IndexNotFoundError(f"no index at {root} (run: python -m rag.ingest DOCS {how})")
    try:
        manifest = read_manifest(gen)
    except FileNotFoundError:
        if not gen.is_dir():
            raise  # removed by a publication meanwhile: the caller reads CURRENT again
        raise IndexIntegrityError(f"index {root}: {gen / MANIFEST}: missing") from None
    check_generation(root, gen, manifest, checksums)
    return root, gen, manifest
