"""Applying an ingest plan: embed what changed, write the next generation, publish it.

A file whose size and mtime match the manifest is unchanged without being read; otherwise its
bytes are hashed and only a new hash re-chunks and re-embeds it (:mod:`rag.ingest.plan`). Files
that disappeared (or lie under a folder given now and were not found) lose their chunks. Every
run that changes anything writes a complete new generation (see :mod:`rag.storage.manifest`) and
publishes it in one rename, so a crash or ``kill -9`` leaves the previous index loadable and the
next run redoes the work. Where the vectors of a generation live and how they are written
without disturbing the live one is the vector index's business (:mod:`indexes`), so nothing
here depends on the backend. Settings are checked before anything is written, and a run that
fails before its first generation is published removes the index folder it created
(docs/security.md); so does a first run in which every file failed
(:class:`rag.ingest.config.NoDocumentReadError`): no empty index is ever published.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from indexes import VectorIndex, open_for_generation, resolve_backend
from rag.defaults import DEFAULT_CHUNK_TOKENS, DEFAULT_OVERLAP
from rag.documents.chunking import indexed_text
from rag.ingest.config import (
    IngestConfig,
    IngestReport,
    NoDocumentReadError,
    check_sources,
    effective_chunking,
    validate_config,
)
from rag.ingest.plan import EncoderHandle, plan_changes, walk_sources
from rag.retrieval.bm25 import BM25Index
from rag.storage.manifest import (
    CURRENT,
    MANIFEST,
    Manifest,
    check_chunks,
    check_generation,
    clean_stale,
    collection_name,
    current_generation,
    file_records,
    ingest_lock,
    kept_chunk_ids,
    new_generation,
    publish_generation,
    read_chunks,
    read_manifest,
    write_chunks,
    write_json,
)
from rag.types import Chunk

# test hook: SIGKILL ourselves at the named checkpoint ("mid-encode"), or SIGTERM
# ("mid-encode:TERM")
CRASH_ENV = "RAG_INGEST_CRASH_AT"


def _checkpoint(name: str) -> None:
    """Crash here when the test hook asks to (used by the kill -9 and SIGTERM tests)."""
    point, _, sig = os.environ.get(CRASH_ENV, "").partition(":")
    if point == name:
        os.kill(os.getpid(), signal.SIGTERM if sig == "TERM" else signal.SIGKILL)


def _resolve_backend(cfg: IngestConfig, old: Manifest | None) -> None:
    """Fill in the backend and server URL from the index (or the defaults) and validate them."""
    cfg.backend, cfg.chroma_url = resolve_backend(
        cfg.backend,
        cfg.chroma_url,
        old.backend if old else None,
        old.chroma_url if old else None,
    )


def _created_by_us(root: Path) -> Path | None:
    """The topmost folder of ``root``'s chain that does not exist yet (what this run creates)."""
    missing, p = None, root.absolute()
    while not p.exists():
        missing, p = p, p.parent
    return missing


def _remove_created(root: Path, top: Path) -> None:
    """Remove ``root`` and the empty parents this run created up to ``top``: a new index whose
    first run failed must not be left as an empty folder that looks like an index."""
    shutil.rmtree(root, ignore_errors=True)
    p = root.absolute().parent
    while top in (p, *p.parents):
        try:
            p.rmdir()  # only if empty: something else may have appeared meanwhile
        except OSError:
            break
        p = p.parent


def ingest_config(cfg: IngestConfig) -> IngestReport:
    """Run one ingest as configured (see :func:`ingest`)."""
    t0 = time.perf_counter()
    root = validate_config(cfg)
    created = _created_by_us(root)
    with ingest_lock(root):
        try:
            report = _ingest_locked(cfg, root, t0)
        except BaseException:
            # Only a folder this run created and never published into (no CURRENT also rules
            # out a concurrent first run that got there before us and finished).
            if created is not None and not (root / CURRENT).exists():
                _remove_created(root, created)
            raise
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


def _ingest_locked(cfg: IngestConfig, root: Path, t0: float) -> IngestReport:
    """The run proper, under the index's lock: plan, embed, write, publish."""
    report = IngestReport(index=cfg.label())
    clean_stale(root)  # a bad CURRENT raises here, before anything is removed or written
    gen = current_generation(root)
    old = read_manifest(gen) if gen else None
    if gen is not None:  # never build on a damaged generation (rag.storage.manifest, *Integrity*)
        check_generation(root, gen, old)
    check_sources(cfg, old, cfg.label())  # a DOCS path gone or unreadable: nothing changes
    walk = walk_sources(cfg, old)  # too many files, a folder emptied: refused, no model loaded
    _resolve_backend(cfg, old)
    encoder = EncoderHandle(cfg, old, cfg.label())
    if encoder.auto_note:  # printed by rag.ingest: a new index says which encoder auto chose
        report.notes.append(encoder.auto_note)
    requested = DEFAULT_CHUNK_TOKENS if cfg.chunk_tokens is None else cfg.chunk_tokens
    chunking = effective_chunking(requested, cfg.overlap, encoder.max_chunk_tokens, cfg.context)
    report.chunking = chunking
    if cfg.chunk_tokens is not None and chunking["chunk_tokens"] < cfg.chunk_tokens:
        report.notes.append(
            f"--chunk-tokens {cfg.chunk_tokens} is more than encoder {encoder.name!r} reads: "
            f"chunks are capped at {chunking['chunk_tokens']} tokens "
            f"(overlap {chunking['overlap']})"
        )
    engine = None
    if cfg.engine == "ray":  # chunking and embedding on Ray; everything else as below
        from rag.ingest.ray_engine import RayEngine

        engine = RayEngine(
            cfg, encoder, on_batch=lambda n: _checkpoint("mid-encode"), notes=report.notes
        )
    try:
        return _apply(cfg, root, t0, report, gen, old, encoder, chunking, engine, walk)
    finally:
        if engine is not None:
            engine.close()


def _apply(cfg, root, t0, report, gen, old, encoder, chunking, engine, walk) -> IngestReport:
    """Plan, embed, write and publish (``engine``: None = chunk and embed in this process;
    ``walk``: what the DOCS hold, :func:`rag.ingest.plan.walk_sources`)."""
    plan = plan_changes(cfg, old, chunking, encoder, report, engine=engine, walk=walk)
    report.timings["load_chunk"] = time.perf_counter() - t0
    if old is None and not report.added:  # every file failed: no empty index is published
        raise NoDocumentReadError(report, cfg.label())  # (ingest_config removes the folder)
    chunks = read_chunks(gen) if gen else {}
    if gen is not None:
        check_chunks(root, gen, old, chunks)
    drop = {i for s in plan.drop_sources for i in old.sources[s].chunk_ids} if old else set()
    new_ids = {c.id for c in plan.new_chunks}
    for cid in drop - new_ids:
        chunks.pop(cid, None)
    chunks.update({c.id: c for c in plan.new_chunks})
    sources = {k: v for k, v in (old.sources if old else {}).items() if k not in plan.drop_sources}
    sources.update(plan.entries)
    manifest = Manifest(
        encoder=encoder.identity(),
        backend=cfg.backend,
        chroma_url=cfg.chroma_url,
        collection=old.collection if old else collection_name(cfg.label()),
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
        if todo and engine is not None:
            vectors = engine.encode(todo)
            report.timings.update(engine.timings)
        elif todo:  # deletions alone need no model
            vectors = encoder.get().encode(
                [indexed_text(c, chunking["context"]) for c in todo],
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
    # a store shared by all generations drops what no kept generation names (e.g. ids only a
    # crashed run added); the previous generation's ids stay for readers still on it
    vindex.reconcile(set(chunks) | kept_chunk_ids(root) if vindex.shared_store else chunks)
    vindex.close()
    report.chunks = len(chunks)
    if note := encoder.precision_note():  # what --precision auto chose, and why
        report.notes.append(note)
    report.seconds = time.perf_counter() - t0
    return report


def _open_vectors(
    cfg: IngestConfig, root: Path, gen: Path | None, manifest: Manifest, chunks: dict[str, Chunk]
) -> tuple[VectorIndex, set[str], Path]:
    """(vector index of the next generation, chunk ids it lacks, that generation's temporary
    folder). The chunk ids lacking (after a crash, in a store every generation shares) are
    re-embedded."""
    tmp = new_generation(root)
    vindex = open_for_generation(
        manifest.backend,
        root,
        gen,
        tmp,
        manifest.encoder["dim"],
        kind=cfg.faiss_kind,
        nprobe=cfg.faiss_nprobe,
        chroma_url=cfg.chroma_url,
        collection=manifest.collection,
    )
    return vindex, vindex.missing(chunks), tmp


def _write_generation(cfg, root, tmp, manifest, chunks, vindex, todo, vectors, dropped) -> str:
    """Apply the changes to the vector store, write BM25, chunks and manifest aside, publish."""
    metas = [{"source": c.source, "start": c.start, "end": c.end} for c in todo]
    vindex.stage_changes(dropped, [c.id for c in todo], vectors, metas)
    _checkpoint("after-vectors")
    ids = sorted(chunks)
    BM25Index(ids, [chunks[i].text for i in ids]).save(tmp / "bm25")
    _checkpoint("after-bm25")
    write_chunks(tmp, chunks)
    write_json(tmp / "run.json", asdict(cfg))
    manifest.files = file_records(
        tmp
    )  # checked at every opening (rag.storage.manifest, *Integrity*)
    (tmp / MANIFEST).write_text(manifest.to_json())
    _checkpoint("before-publish")
    final = publish_generation(root, tmp, _checkpoint)
    return final.name


def ingest(
    paths: list[str | Path],
    index: str | Path = "default",
    encoder: str | None = None,
    backend: str | None = None,
    chroma_url: str | None = None,
    chunk_tokens: int | None = None,
    overlap: int = DEFAULT_OVERLAP,
    device: str = "auto",
    **kwargs: Any,
) -> IngestReport:
    """Ingest ``paths`` into ``index`` and return what happened. ``index`` is a name under
    ``$RAG_HOME/indexes`` or, as a :class:`~pathlib.Path`, an index folder anywhere. ``encoder``
    (None or ``auto``) defaults to the one the index was built with (for a new index
    :func:`rag.models.default_encoder`: ``minilm-tuned`` when trained, else ``minilm``); a
    different one raises :class:`rag.retrieval.encoder.EncoderMismatchError` naming both; ``backend``
    likewise defaults to the index's own (``faiss`` for a new one). Extra keyword arguments are
    :class:`IngestConfig` fields (``precision``, ``max_bytes``, ``follow_links``, ``progress``)."""
    where = {"index_dir": str(index)} if isinstance(index, Path) else {"index": index}
    cfg = IngestConfig(
        paths=[str(p) for p in paths],
        encoder=str(encoder) if encoder else None,
        backend=backend,
        chroma_url=chroma_url,
        chunk_tokens=chunk_tokens,
        overlap=overlap,
        device=device,
        **where,
        **kwargs,
    )
    return ingest_config(cfg)
