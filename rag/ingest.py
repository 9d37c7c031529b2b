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

from indexes import BACKENDS, open_index
from rag.bm25 import BM25Index
from rag.documents import DEFAULT_MAX_BYTES
from rag.encoding import PRECISIONS, EncoderMismatchError
from rag.ingest_plan import EncoderHandle, plan_changes
from rag.manifest import (
    Manifest,
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
from rag.types import Chunk

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
    faiss_kind: str = "auto"  # auto (HNSW from 200k vectors) | flat (exact) | hnsw
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
        encoder = EncoderHandle(cfg, old, str(cfg.index))
        chunking = {
            "chunk_tokens": cfg.chunk_tokens,
            "overlap": cfg.overlap,
            "max_tokens": encoder.max_chunk_tokens,
        }
        plan = plan_changes(cfg, old, chunking, encoder, report)
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
        if cfg.backend == "chroma":  # ids the published manifest does not name: a crashed run's
            vindex.delete(sorted(set(vindex.ids()) - set(chunks)))
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
        return open_index("faiss", tmp / "vectors", dim, kind=cfg.faiss_kind), set(), tmp
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
        "--faiss-kind",
        default="auto",
        choices=["auto", "flat", "hnsw"],
        help="FAISS index: exact flat, HNSW, or auto (HNSW from 200k vectors)",
    )
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
        faiss_kind=args.faiss_kind,
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
