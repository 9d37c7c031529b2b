"""Ingest documents into a named index: load, chunk, embed, store; incremental and atomic.

``python -m rag.ingest DOCS [DOCS ...] [--index NAME] [--encoder ALIAS|DIR] [--backend faiss|chroma]
[--chroma-url URL] [--chunk-tokens N] [--overlap N] [--json]``

A file whose size and mtime match the manifest is unchanged without being read; otherwise its
bytes are hashed and only a new hash re-chunks and re-embeds it. Files that disappeared (or lie
under a folder given now and were not found) lose their chunks. Every run that changes anything
writes a complete new generation (see :mod:`rag.manifest`) and publishes it in one rename, so a
crash or ``kill -9`` leaves the previous index loadable and the next run redoes the work.
"""

from __future__ import annotations

import argparse
import errno
import hashlib
import json
import os
import shutil
import signal
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from tqdm.auto import tqdm

from indexes import BACKENDS, open_index
from rag.bm25 import BM25Index
from rag.chunking import chunk_document
from rag.documents import DEFAULT_MAX_BYTES, DocumentError, iter_files, load_document
from rag.encoding import PRECISIONS, Encoder, EncoderMismatchError, weights_fingerprint
from rag.manifest import (
    Manifest,
    SourceEntry,
    clean_stale,
    collection_name,
    current_generation,
    index_dir,
    ingest_lock,
    new_generation,
    publish_generation,
    read_chunks,
    read_manifest,
    write_chunks,
    write_json,
)
from rag.models import ModelNotFoundError, resolve_model
from rag.types import Chunk

DEFAULT_ENCODER = "minilm"
CRASH_ENV = "RAG_INGEST_CRASH_AT"  # test hook: SIGKILL ourselves at the named checkpoint


@dataclass
class IngestConfig:
    """Settings of one ingest run (saved as run.json beside the generation it writes)."""

    paths: list[str]  # files or folders to ingest
    index: str = "default"  # index name under $RAG_HOME/indexes, or a folder path
    encoder: str | None = (
        None  # alias or folder; default: the index's recorded encoder, else minilm
    )
    backend: str | None = None  # faiss | chroma; default: the index's backend, else faiss
    chroma_url: str | None = None  # Chroma server URL; default: the index's, else embedded
    chunk_tokens: int = 256  # target chunk size in encoder tokens (capped at the encoder's max)
    overlap: int = 32  # tokens shared by consecutive chunks of a section
    device: str = "auto"  # auto | cpu | cuda
    precision: str = "fp32"  # fp32 | int8 (dynamic quantisation, CPU)
    max_bytes: int = DEFAULT_MAX_BYTES  # larger files are reported and skipped
    progress: bool = True  # tqdm bars on stderr


@dataclass
class IngestReport:
    """What one run did. File lists hold absolute paths; ``failures`` are (path, reason)."""

    index: str
    added: list[str] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    failures: list[tuple[str, str]] = field(default_factory=list)
    chunks: int = 0  # chunks in the index after the run
    chunks_embedded: int = 0
    chunks_removed: int = 0
    bytes_embedded: int = 0  # source bytes of the files (re)embedded
    seconds: float = 0.0
    timings: dict[str, float] = field(default_factory=dict)  # load_chunk / encode / write
    generation: str = ""

    @property
    def failed(self) -> list[str]:
        return [p for p, _ in self.failures]

    @property
    def ok(self) -> bool:
        return not self.failures

    def summary(self) -> str:
        return (
            f"{self.index}: {len(self.added)} added, {len(self.updated)} updated, "
            f"{len(self.unchanged)} unchanged, {len(self.removed)} removed, "
            f"{len(self.failures)} failed files; {self.chunks} chunks "
            f"({self.chunks_embedded} embedded, {self.chunks_removed} removed) in {self.seconds:.1f}s"
        )

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["failures"] = [{"path": p, "reason": r} for p, r in self.failures]
        d["counts"] = {
            k: len(getattr(self, k)) for k in ("added", "updated", "unchanged", "removed")
        }
        d["counts"]["failed"] = len(self.failures)
        d["summary"] = self.summary()
        return d


def _checkpoint(name: str) -> None:
    """Crash here when the test hook asks to (used by the kill -9 tests)."""
    if os.environ.get(CRASH_ENV) == name:
        os.kill(os.getpid(), signal.SIGKILL)


def _file_hash(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _os_reason(e: OSError, path: Path) -> str:
    """A short reason for an OS error on ``path`` (links get a clearer wording)."""
    if e.errno == errno.ELOOP:
        return "symbolic link loop"
    if e.errno == errno.ENOENT and path.is_symlink():
        return f"broken symbolic link (no such file: {os.readlink(path)})"
    return e.strerror or str(e)


def _under(path: str, roots: list[Path]) -> bool:
    return any(path == str(r) or path.startswith(str(r) + os.sep) for r in roots)


@dataclass
class _Plan:
    """Which files to (re)embed and which chunks go."""

    new_chunks: list[Chunk] = field(default_factory=list)
    entries: dict[str, SourceEntry] = field(default_factory=dict)  # changed files' new entries
    drop_sources: list[str] = field(default_factory=list)  # manifest sources whose chunks go


def _plan(
    cfg: IngestConfig,
    old: Manifest | None,
    chunking: dict,
    encoder: _EncoderHandle,
    report: IngestReport,
) -> _Plan:
    """Walk the inputs, classify every file and chunk the new/changed ones."""
    plan = _Plan()
    same_chunking = old is not None and old.chunking == chunking
    sources = old.sources if old else {}
    roots = [Path(os.path.abspath(p)) for p in cfg.paths]
    seen: set[str] = set()
    files = list(iter_files(cfg.paths))
    for item in tqdm(files, desc="load+chunk", unit="file", disable=not cfg.progress):
        if isinstance(item, DocumentError):
            report.failures.append((item.path, item.reason))
            continue
        path = Path(os.path.abspath(item))
        key = str(path)
        seen.add(key)
        try:
            st = path.stat()
            prev = sources.get(key)
            if (
                prev
                and same_chunking
                and prev.size == st.st_size
                and prev.mtime_ns == st.st_mtime_ns
            ):
                report.unchanged.append(key)
                continue
            if st.st_size > cfg.max_bytes:
                raise DocumentError(
                    path, f"too large ({st.st_size:,} bytes > limit {cfg.max_bytes:,})"
                )
            digest = _file_hash(path) if path.is_file() else ""
            if prev and same_chunking and prev.hash == digest:
                report.unchanged.append(key)  # touched, same content: nothing to embed
                plan.entries[key] = SourceEntry(digest, st.st_size, st.st_mtime_ns, prev.chunk_ids)
                continue
            doc = load_document(path, max_bytes=cfg.max_bytes)
            doc.path = key
            chunks = chunk_document(
                doc,
                encoder.get().tokenizer,
                cfg.chunk_tokens,
                cfg.overlap,
                encoder.max_chunk_tokens,
            )
            if not chunks:
                raise DocumentError(path, "no text to index after chunking")
        except DocumentError as e:
            report.failures.append((e.path, e.reason))
            if key in sources:
                plan.drop_sources.append(key)
            continue
        except OSError as e:
            report.failures.append((key, _os_reason(e, path)))
            if key in sources:
                plan.drop_sources.append(key)
            continue
        (report.updated if key in sources else report.added).append(key)
        if key in sources:
            plan.drop_sources.append(key)
        plan.entries[key] = SourceEntry(digest, st.st_size, st.st_mtime_ns, [c.id for c in chunks])
        plan.new_chunks.extend(chunks)
        report.bytes_embedded += st.st_size
    for key in sorted(sources):
        if key not in seen and (not os.path.lexists(key) or _under(key, roots)):
            report.removed.append(key)
            plan.drop_sources.append(key)
    return plan


class _EncoderHandle:
    """The run's encoder, loaded only when something must be chunked or embedded: a re-run over
    an unchanged corpus compares the weights fingerprint with the manifest and never loads (or
    even imports) the model, which keeps it a small fraction of the first ingest."""

    def __init__(self, cfg: IngestConfig, old: Manifest | None, index_name: str):
        self.cfg, self.old, self.index_name = cfg, old, index_name
        self.name = cfg.encoder or (old.encoder["name"] if old else DEFAULT_ENCODER)
        self._encoder: Encoder | None = None
        self.same = False
        if old is not None:
            recorded = old.encoder.get("fingerprint")
            try:
                self.same = (
                    bool(recorded) and weights_fingerprint(resolve_model(self.name)) == recorded
                )
            except ModelNotFoundError:
                self.same = False
            if not self.same:
                self.get()  # loads it; raises EncoderMismatchError naming both when it differs
            if old.backend != cfg.backend:
                raise ValueError(
                    f"index {index_name!r} uses --backend {old.backend}, not {cfg.backend}; "
                    "ingest into a new --index"
                )

    def get(self) -> Encoder:
        if self._encoder is None:
            enc = Encoder.load(self.name, device=self.cfg.device, precision=self.cfg.precision)
            if self.old is not None:
                enc.check_matches(self.old.encoder, self.index_name)
            self._encoder = enc
        return self._encoder

    @property
    def max_chunk_tokens(self) -> int:
        if self._encoder is None and self.same and "max_tokens" in self.old.chunking:
            return int(self.old.chunking["max_tokens"])
        return self.get().max_chunk_tokens

    def identity(self) -> dict[str, Any]:
        if self._encoder is None and self.same:
            return dict(self.old.encoder)
        return self.get().identity()


def _resolve_backend(cfg: IngestConfig, old: Manifest | None) -> None:
    """Fill in the backend and Chroma URL from the index (or the defaults) and validate them."""
    if cfg.backend is None:
        cfg.backend = old.backend if old else ("chroma" if cfg.chroma_url else "faiss")
    if cfg.chroma_url is None and old is not None and cfg.backend == "chroma":
        cfg.chroma_url = old.chroma_url
    if cfg.backend not in BACKENDS:
        raise ValueError(f"--backend must be one of {', '.join(BACKENDS)}, not {cfg.backend!r}")
    if cfg.chroma_url and cfg.backend != "chroma":
        raise ValueError("--chroma-url needs --backend chroma")


def ingest_config(cfg: IngestConfig) -> IngestReport:
    """Run one ingest as configured (see :func:`ingest`)."""
    t0 = time.perf_counter()
    root = index_dir(cfg.index)
    report = IngestReport(index=str(cfg.index))
    with ingest_lock(root):
        clean_stale(root)
        gen = current_generation(root)
        old = read_manifest(gen) if gen else None
        _resolve_backend(cfg, old)
        encoder = _EncoderHandle(cfg, old, str(cfg.index))
        chunking = {
            "chunk_tokens": cfg.chunk_tokens,
            "overlap": cfg.overlap,
            "max_tokens": encoder.max_chunk_tokens,
        }
        plan = _plan(cfg, old, chunking, encoder, report)
        report.timings["load_chunk"] = time.perf_counter() - t0
        chunks = read_chunks(gen) if gen else {}
        drop = {i for s in plan.drop_sources for i in old.sources[s].chunk_ids} if old else set()
        new_ids = {c.id for c in plan.new_chunks}
        for cid in drop - new_ids:
            chunks.pop(cid, None)
        chunks.update({c.id: c for c in plan.new_chunks})
        sources = {
            k: v for k, v in (old.sources if old else {}).items() if k not in plan.drop_sources
        }
        sources.update(plan.entries)
        manifest = Manifest(
            encoder=encoder.identity(),
            backend=cfg.backend,
            chroma_url=cfg.chroma_url,
            collection=old.collection if old else collection_name(cfg.index),
            chunking=chunking,
            sources=dict(sorted(sources.items())),
            roots=sorted({*(old.roots if old else []), *(os.path.abspath(p) for p in cfg.paths)}),
        )
        report.chunks_removed = len(drop - new_ids)
        vindex, missing, tmp = _open_vectors(cfg, root, gen, manifest, chunks)
        todo = plan.new_chunks + [chunks[i] for i in sorted(missing - new_ids)]
        changed = bool(todo or drop or plan.entries or missing or old is None)
        if changed:
            t1 = time.perf_counter()
            vectors = np.zeros((0, manifest.encoder["dim"]), dtype=np.float32)
            if todo:  # deletions alone need no model
                vectors = encoder.get().encode(
                    [c.text for c in todo],
                    progress=cfg.progress,
                    on_batch=lambda n: _checkpoint("mid-encode"),
                )
            report.chunks_embedded = len(todo)
            report.timings["encode"] = time.perf_counter() - t1
            _checkpoint("after-encode")
            t2 = time.perf_counter()
            report.generation = _write_generation(
                cfg, root, tmp, manifest, chunks, vindex, todo, vectors, drop - new_ids
            )
            report.timings["write"] = time.perf_counter() - t2
        else:
            report.generation = gen.name if gen else ""
            shutil.rmtree(tmp, ignore_errors=True)
        vindex.close()
    report.chunks = len(chunks)
    report.seconds = time.perf_counter() - t0
    with open(root / "ingest_log.jsonl", "a") as f:
        f.write(
            json.dumps(
                {
                    "time": time.time(),
                    **{k: v for k, v in report.to_dict().items() if k != "unchanged"},
                }
            )
            + "\n"
        )
    return report


def _open_vectors(
    cfg: IngestConfig, root: Path, gen: Path | None, manifest: Manifest, chunks: dict[str, Chunk]
):
    """(vector store, chunk ids it lacks, temporary folder of the next generation).

    FAISS: a copy of the live vectors inside the next generation's folder. Chroma: the shared
    collection, plus the chunk ids the manifest has but the collection lacks (after a crash);
    those are re-embedded."""
    dim = manifest.encoder["dim"]
    tmp = new_generation(root)
    if cfg.backend == "faiss":
        if gen is not None and (gen / "vectors").is_dir():
            shutil.copytree(gen / "vectors", tmp / "vectors")
        return open_index("faiss", tmp / "vectors", dim), set(), tmp
    vindex = open_index(
        "chroma", root / "chroma", dim, chroma_url=cfg.chroma_url, collection=manifest.collection
    )
    return vindex, set(chunks) - set(vindex.ids()), tmp


def _write_generation(cfg, root, tmp, manifest, chunks, vindex, todo, vectors, dropped) -> str:
    """Apply the changes to the vector store, write BM25, chunks and manifest aside, publish."""
    metas = [{"source": c.source, "start": c.start, "end": c.end} for c in todo]
    if cfg.backend == "faiss":
        vindex.delete(sorted(dropped))
        vindex.add([c.id for c in todo], vectors, metas)
        vindex.commit()
    else:
        vindex.add([c.id for c in todo], vectors, metas)  # upsert: harmless if repeated
    _checkpoint("after-vectors")
    ids = sorted(chunks)
    BM25Index(ids, [chunks[i].text for i in ids]).save(tmp / "bm25")
    _checkpoint("after-bm25")
    write_chunks(tmp, chunks)
    (tmp / "manifest.json").write_text(manifest.to_json())
    write_json(tmp / "run.json", asdict(cfg))
    _checkpoint("before-publish")
    final = publish_generation(root, tmp, _checkpoint)
    if cfg.backend == "chroma":  # only after the manifest no longer names them
        extra = sorted(set(vindex.ids()) - set(chunks))
        vindex.delete(extra)
    return final.name


def ingest(
    paths: list[str | Path],
    index: str = "default",
    encoder: str | None = None,
    backend: str | None = None,
    chroma_url: str | None = None,
    chunk_tokens: int = 256,
    overlap: int = 32,
    device: str = "auto",
    **kwargs: Any,
) -> IngestReport:
    """Ingest ``paths`` into ``index`` and return what happened. ``encoder`` defaults to the
    one the index was built with (``minilm`` for a new index); a different one raises
    :class:`rag.encoding.EncoderMismatchError` naming both; ``backend`` likewise defaults to the
    index's own (``faiss`` for a new one). Extra keyword arguments are
    :class:`IngestConfig` fields (``precision``, ``max_bytes``, ``progress``)."""
    cfg = IngestConfig(
        paths=[str(p) for p in paths],
        index=str(index),
        encoder=str(encoder) if encoder else None,
        backend=backend,
        chroma_url=chroma_url,
        chunk_tokens=chunk_tokens,
        overlap=overlap,
        device=device,
        **kwargs,
    )
    return ingest_config(cfg)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m rag.ingest", description=__doc__.split("\n")[0])
    p.add_argument("paths", nargs="+", metavar="DOCS", help="files or folders to ingest")
    p.add_argument(
        "--index", default="default", help="index name (or folder); default: %(default)s"
    )
    p.add_argument(
        "--encoder", default=None, help="alias or folder; default: the index's encoder, else minilm"
    )
    p.add_argument(
        "--backend", default=None, choices=BACKENDS, help="default: the index's, else faiss"
    )
    p.add_argument("--chroma-url", default=None, help="Chroma server, e.g. http://127.0.0.1:8000")
    p.add_argument("--chunk-tokens", type=int, default=256)
    p.add_argument("--overlap", type=int, default=32)
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    p.add_argument(
        "--precision", default="fp32", choices=PRECISIONS, help="int8: quantised CPU encoder"
    )
    p.add_argument("--max-bytes", type=int, default=DEFAULT_MAX_BYTES, help="skip larger files")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.add_argument("--json", action="store_true", help="print the report as JSON on stdout")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    cfg = IngestConfig(
        paths=args.paths,
        index=args.index,
        encoder=args.encoder,
        backend=args.backend,
        chroma_url=args.chroma_url,
        chunk_tokens=args.chunk_tokens,
        overlap=args.overlap,
        device=args.device,
        precision=args.precision,
        max_bytes=args.max_bytes,
        progress=not args.no_progress,
    )
    try:
        report = ingest_config(cfg)
    except (EncoderMismatchError, ValueError, RuntimeError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for path, reason in report.failures:
        print(f"failed: {path}: {reason}", file=sys.stderr)
    print(report.summary(), file=sys.stderr)
    if args.json:
        print(json.dumps(report.to_dict(), indent=1))
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
