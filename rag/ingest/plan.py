"""Deciding what an ingest run must do: which files are new, changed, unchanged, removed,
failed or skipped, their chunks, and the encoder (loaded only when something must be embedded).

Split from :mod:`rag.ingest.apply`, which applies the plan and publishes the generation; the
run's settings, their checks and its report are :mod:`rag.ingest.config`.
"""

from __future__ import annotations

import errno
import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from rag.cli.progress import track
from rag.documents import (
    SOURCE_OF_PAGE,
    Deadline,
    DocumentError,
    Limits,
    UnreadableFolderError,
    failure_reason,
    iter_files,
    load_document,
    sources_of_pages,
)
from rag.documents.chunking import chunk_document
from rag.documents.loaders import PASSED_OVER
from rag.ingest.config import (
    IngestConfig,
    IngestReport,
    check_found,
    failed_files,
    rechunk_reason,
    same_chunking,
    under,
)
from rag.models import ModelNotFoundError, default_encoder, resolve_model
from rag.retrieval.encoder import Encoder, weights_fingerprint
from rag.storage.manifest import Manifest, SourceEntry, file_hash
from rag.types import Chunk

log = logging.getLogger("rag.ingest")


def os_reason(e: OSError, path: Path) -> str:
    """A short reason for an OS error on ``path`` (links get a clearer wording)."""
    if e.errno == errno.ELOOP:
        return "symbolic link loop"
    if e.errno == errno.ENOENT and path.is_symlink():
        return f"broken symbolic link (no such file: {os.readlink(path)})"
    return e.strerror or str(e)


@dataclass
class PendingFile:
    """A new or changed file whose chunking an engine does (``--engine ray``): what the
    manifest entry needs besides the chunk ids."""

    key: str  # absolute path, the manifest key
    digest: str
    size: int
    mtime_ns: int


@dataclass
class Plan:
    """Which files to (re)embed and which chunks go."""

    new_chunks: list[Chunk] = field(default_factory=list)
    entries: dict[str, SourceEntry] = field(default_factory=dict)  # changed files' new entries
    drop_sources: list[str] = field(default_factory=list)  # manifest sources whose chunks go


class ChunkEngine(Protocol):
    """Chunks new/changed files elsewhere (rag.ingest.ray_engine); results in any order, each a list
    of chunks or a failure reason, as :func:`chunk_file` would give or raise."""

    def chunk(self, files: list[PendingFile], chunking: dict) -> dict[str, list[Chunk] | str]: ...


def chunk_file(path: Path, key: str, tokenizer: Any, chunking: dict, limits: Limits) -> list[Chunk]:
    """Load and chunk one file within ``limits``, as every engine does: one deadline
    (``--max-load-seconds``) covers both, and a text of more than ``limits.max_file_tokens`` tokens
    is refused as it is tokenised (``--max-file-tokens``: what its embedding would cost). Raises DocumentError (whatever went wrong, a
    parser's or the chunker's own exception included) or OSError."""
    deadline = Deadline(path, limits.max_seconds)
    doc = load_document(path, limits=limits, deadline=deadline)
    doc.path = key
    try:
        chunks = chunk_document(
            doc,
            tokenizer,
            chunking["chunk_tokens"],
            chunking["overlap"],
            chunking["max_tokens"],
            deadline=deadline.check,
            max_file_tokens=limits.max_file_tokens,
        )
    except DocumentError:
        raise
    except Exception as e:  # noqa: BLE001 - one file's failure, never the run's
        raise DocumentError(path, f"could not be chunked ({failure_reason(e)})") from None
    if not chunks:
        raise DocumentError(path, "no text to index after chunking")
    return chunks


KEPT = "kept the previous version"  # said in the failure line of a stored document kept


def _record_failure(
    plan: Plan, report: IngestReport, sources: dict, key: str, reason: str, shown: Any = None
) -> None:
    """A file that could not be loaded or chunked: reported (as ``shown``, else ``key``).

    A document the index already holds keeps its previous version (its chunks and manifest
    entry, so the index still answers from it), and its line says so (:data:`KEPT`): it is
    counted as failed, neither as updated nor as removed. A good ``doc.pdf`` overwritten by a
    hostile one used to lose its chunks while the summary said 0 removed. The manifest keeps
    the old size and mtime, so the next run tries the file again. A file gone from disk
    meanwhile (deleted during the run) goes, as a deleted file does. A file read without error
    that holds no text, or an HTML page that asks not to be indexed
    (:data:`rag.documents.loaders.PASSED_OVER`), is no failure: it is skipped, and a version
    the index holds is removed, as the file now says nothing to index."""
    if reason in PASSED_OVER:  # no text, or a page that asks not to be indexed: passed over
        report.skipped.append((key if shown is None else shown, reason))
        if key in sources:  # its earlier text is gone from the file, and from the index
            plan.drop_sources.append(key)
            report.removed.append(key)
        return
    if key in sources and os.path.lexists(key):
        reason = f"{reason}; {KEPT}"
    elif key in sources:
        plan.drop_sources.append(key)
    report.failures.append((key if shown is None else shown, reason))


def _record_chunks(
    plan: Plan, report: IngestReport, sources: dict, f: PendingFile, chunks: list[Chunk]
) -> None:
    (report.updated if f.key in sources else report.added).append(f.key)
    if f.key in sources:
        plan.drop_sources.append(f.key)
    ids = [c.id for c in chunks]
    plan.entries[f.key] = SourceEntry(f.digest, f.size, f.mtime_ns, ids, ingested=time.time())
    plan.new_chunks.extend(chunks)
    report.bytes_embedded += f.size


def plan_changes(
    cfg: IngestConfig,
    old: Manifest | None,
    chunking: dict,
    encoder: EncoderHandle,
    report: IngestReport,
    engine: ChunkEngine | None = None,
    walk: Walk | None = None,
) -> Plan:
    """Walk the inputs, classify every file and chunk the new/changed ones: here, one by one,
    or (``engine`` given) all at once by the engine, recorded in file order either way.

    Any exception one file raises (a loader's, the chunker's, an encoding error) is that
    file's failure; the run goes on, and a document the index holds keeps its previous
    version (:func:`_record_failure`). A run into an existing index in which every file
    failed changes nothing (no removal either) unless ``--allow-empty``. Before any file is read the walk is checked: more than
    ``--max-files`` is refused, and so is a DOCS folder now empty where the index holds
    documents from it (:func:`rag.ingest.config.check_found`). Documents under a folder that
    could not be listed, and under an earlier DOCS path that is gone altogether (an unmounted
    disk) are kept unless ``--allow-empty``. ``walk``: the DOCS as :func:`walk_sources` found
    them (default: walked now)."""
    plan = Plan()
    unchanged_chunking = old is not None and same_chunking(old.chunking, chunking)
    if old is not None and old.sources and not unchanged_chunking:  # why a folder re-embeds
        report.notes.append(rechunk_reason(old.chunking, chunking))
    sources = old.sources if old else {}
    roots = [Path(os.path.abspath(p)) for p in cfg.paths]
    seen: set[str] = set()
    pending: list[PendingFile] = []
    walk = walk or walk_sources(cfg, old)
    files = walk.files
    report.skipped.extend((e.path, e.reason) for e in walk.skipped)
    keep_under = [e.path for e in files if isinstance(e, UnreadableFolderError)]
    if old is not None and not cfg.allow_empty:  # a folder of an earlier run that is gone
        given = {str(r) for r in roots}
        for r in old.roots:
            if r in sources:  # a file given on its own: deleted, it goes as any file does
                continue
            if r not in given and not under(r, roots) and not os.path.lexists(r):
                keep_under.append(r)
                if n := sum(1 for k in sources if under(k, [r])):
                    report.notes.append(
                        f"{r} (ingested earlier) is missing: its {n} document(s) are kept "
                        "(ingest it with --allow-empty to remove them)"
                    )
    for item in track(files, "load+chunk", unit="file", enabled=cfg.progress):
        # Refused by the walk: a stored document so refused is not kept (a link out of the
        # folder, read by an earlier run with --follow-links, leaves the index without it).
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
                and unchanged_chunking
                and prev.size == st.st_size
                and prev.mtime_ns == st.st_mtime_ns
            ):
                report.unchanged.append(key)
                continue
            if st.st_size > cfg.max_bytes:
                raise DocumentError(
                    path, f"too large ({st.st_size:,} bytes > limit {cfg.max_bytes:,})"
                )
            digest = file_hash(path) if path.is_file() else ""
            if prev and unchanged_chunking and prev.hash == digest:
                report.unchanged.append(key)  # touched, same content: nothing to embed
                plan.entries[key] = SourceEntry(
                    digest, st.st_size, st.st_mtime_ns, prev.chunk_ids, prev.ingested
                )
                continue
            todo = PendingFile(key, digest, st.st_size, st.st_mtime_ns)
            if engine is not None:
                pending.append(todo)
                continue
            chunks = chunk_file(path, key, encoder.get().tokenizer, chunking, cfg.limits())
        except DocumentError as e:
            _record_failure(plan, report, sources, key, e.reason, shown=e.path)
            continue
        except OSError as e:
            _record_failure(plan, report, sources, key, os_reason(e, path))
            continue
        except Exception as e:  # noqa: BLE001 - one file's failure, never the run's
            _record_failure(plan, report, sources, key, failure_reason(e))
            continue
        _record_chunks(plan, report, sources, todo, chunks)
    if pending:
        results = engine.chunk(pending, chunking)
        for f in pending:
            got = results.get(f.key, "no result from the ingest engine")
            if isinstance(got, str):
                _record_failure(plan, report, sources, f.key, got)
            else:
                _record_chunks(plan, report, sources, f, got)
    if (
        old is not None
        and report.failures
        and not (report.added or report.updated or report.unchanged)
        and not cfg.allow_empty
    ):  # every file failed: change nothing, as for a folder found empty (check_found)
        report.notes.append(
            f"no document could be read ({failed_files(len(report.failures))}): index "
            f"{cfg.label()!r} was not changed (documents deleted from its folders are removed "
            "by the next run that reads one, or with --allow-empty)"
        )
        return Plan()
    for key in sorted(sources):
        if key in seen or under(key, keep_under):
            continue
        if not os.path.lexists(key) or under(key, roots):
            report.removed.append(key)
            plan.drop_sources.append(key)
    return plan


@dataclass
class Walk:
    """What the DOCS hold: the files to load (or a failure found by the walk) in order, the
    files of other types, and how many files each DOCS path (as given) held."""

    files: list[Path | DocumentError]
    skipped: list[DocumentError]
    found: dict[str, int]


def walk_sources(cfg: IngestConfig, old: Manifest | None) -> Walk:
    """Walk the run's DOCS before anything is read (or a model loaded): more than
    ``--max-files`` is refused (ValueError, exit 2), and so is a DOCS folder now empty where
    the index holds documents from it (:func:`rag.ingest.config.check_found`)."""
    walk = Walk([], [], {})
    for given in cfg.paths:
        before = len(walk.files)
        for item in iter_files([given], follow_links=cfg.follow_links, skipped=walk.skipped):
            walk.files.append(item)
            if len(walk.files) > cfg.max_files:
                raise ValueError(
                    f"the DOCS hold more than {cfg.max_files:,} files (--max-files); nothing "
                    "was changed: raise --max-files to ingest them all"
                )
        walk.found[given] = sum(
            1 for f in walk.files[before:] if not isinstance(f, UnreadableFolderError)
        )
    check_found(cfg, old, cfg.label(), walk.found)
    if cfg.skip_sources and (copies := sources_of_pages(walk.files)):
        walk.files = [f for f in walk.files if f not in copies]
        walk.skipped.extend(DocumentError(f, SOURCE_OF_PAGE) for f in sorted(copies))
    return walk


class EncoderHandle:
    """The run's encoder, loaded only when something must be chunked or embedded: a re-run over
    an unchanged corpus compares the weights fingerprint with the manifest and never loads (or
    even imports) the model, which keeps it a small fraction of the first ingest."""

    def __init__(self, cfg: IngestConfig, old: Manifest | None, index_name: str):
        self.cfg, self.old, self.index_name = cfg, old, index_name
        wanted = cfg.requested_encoder()
        self.name = wanted or (old.encoder["name"] if old else default_encoder())
        self.auto_note = ""  # said once in the report: which encoder auto gave a new index
        if old is None and not wanted:
            self.auto_note = f"new index {index_name!r}: encoder {self.name} (--encoder auto)"
            log.info(self.auto_note)
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
            enc = Encoder.load(
                self.name,
                device=self.cfg.device,
                precision=self.cfg.precision,
                backend=self.cfg.encoder_backend,
            )
            if self.old is not None:
                enc.check_matches(self.old.encoder, self.index_name)
            self._encoder = enc
        return self._encoder

    def precision_note(self) -> str:
        """The report's line on what ``--precision auto`` chose ("" when the encoder never
        loaded, e.g. an unchanged corpus, or the precision was given)."""
        if self.cfg.precision != "auto" or self._encoder is None:
            return ""
        return (
            f"--precision auto: encoder in {self._encoder.precision} ({self._encoder.auto_reason})"
        )

    @property
    def max_chunk_tokens(self) -> int:
        if self._encoder is None and self.same and "max_tokens" in self.old.chunking:
            return int(self.old.chunking["max_tokens"])
        return self.get().max_chunk_tokens

    def identity(self) -> dict[str, Any]:
        if self._encoder is None and self.same:
            return dict(self.old.encoder)
        return self.get().identity()
