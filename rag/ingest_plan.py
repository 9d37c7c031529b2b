"""Deciding what an ingest run must do: its checked settings, which files are new, changed,
unchanged, removed, failed or skipped, their chunks, and the encoder (loaded only when something
must be embedded).

Split from :mod:`rag.ingest`, which applies the plan and publishes the generation
(:class:`IngestConfig` and :class:`IngestReport` are re-exported there).
"""

from __future__ import annotations

import errno
import hashlib
import importlib.util
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

from tqdm.auto import tqdm

from indexes import BACKENDS
from rag.chunking import chunk_document
from rag.defaults import DEFAULT_CHUNK_TOKENS, DEFAULT_OVERLAP, DEVICES
from rag.documents import DEFAULT_MAX_BYTES, DocumentError, iter_files, load_document
from rag.encoding import (
    ENCODER_BACKENDS,
    PRECISIONS,
    Encoder,
    check_backend,
    weights_fingerprint,
)
from rag.manifest import CURRENT, Manifest, SourceEntry, index_dir
from rag.models import ModelNotFoundError, resolve_model
from rag.types import Chunk

DEFAULT_ENCODER = "minilm"
FAISS_KINDS = ("auto", "flat", "hnsw")
ENGINES = ("local", "ray")  # ray: rag.ingest_ray, the optional `ray` extra
MIN_CHUNK_TOKENS = 8  # rag.chunking refuses smaller budgets


def check_chunking(chunk_tokens: int | None, overlap: int) -> None:
    """Refuse chunk settings ``rag.chunking`` would refuse, before anything is created: a
    refused run must leave no index folder behind (the same rule, checked early)."""
    n = DEFAULT_CHUNK_TOKENS if chunk_tokens is None else chunk_tokens
    if n < MIN_CHUNK_TOKENS:
        raise ValueError(f"--chunk-tokens must be at least {MIN_CHUNK_TOKENS}, not {n}")
    if not 0 <= overlap < n // 2:
        raise ValueError(f"--overlap must be in [0, {n // 2}) for {n}-token chunks, not {overlap}")


def effective_chunking(chunk_tokens: int, overlap: int, max_tokens: int) -> dict[str, int]:
    """The chunking a run really applies, as the manifest records it.

    ``chunk_tokens`` is capped at what the encoder reads (``max_tokens``) and the overlap then
    kept proportionate, exactly as :func:`rag.chunking.chunk_document` does, so chunking with
    these values gives the same chunks. The requested values are kept beside them."""
    budget = min(chunk_tokens, max_tokens)
    eff_overlap = min(overlap, budget // 4) if budget < chunk_tokens else overlap
    return {
        "chunk_tokens": budget,
        "overlap": eff_overlap,
        "max_tokens": max_tokens,
        "requested_chunk_tokens": chunk_tokens,
        "requested_overlap": overlap,
    }


def same_chunking(old: dict[str, int], new: dict[str, int]) -> bool:
    """Whether two manifests' chunking makes the same chunks. Manifests written before the
    effective values were stored hold the requested ones (256 with minilm's 254-token limit);
    comparing effective values keeps their chunks instead of re-embedding the whole index."""
    if not old or "chunk_tokens" not in old or "overlap" not in old:
        return False

    def eff(d: dict[str, int]) -> tuple[int, int]:
        e = effective_chunking(d["chunk_tokens"], d["overlap"], d.get("max_tokens", 1 << 30))
        return e["chunk_tokens"], e["overlap"]

    return eff(old) == eff(new)


@dataclass
class IngestConfig:
    """Settings of one ingest run (saved as run.json beside the generation it writes)."""

    paths: list[str]  # files or folders to ingest
    index: str = "default"  # index name under $RAG_HOME/indexes (a name, never a path)
    index_dir: str | None = None  # an index folder elsewhere, given explicitly (wins over index)
    encoder: str | None = (
        None  # alias or folder; default: the index's recorded encoder, else minilm
    )
    backend: str | None = None  # faiss | chroma; default: the index's backend, else faiss
    chroma_url: str | None = None  # Chroma server URL; default: the index's, else embedded
    chunk_tokens: int | None = None  # chunk size in encoder tokens; None: 256 (or the encoder's
    # limit if smaller); a larger explicit value is capped, and the report says so
    overlap: int = DEFAULT_OVERLAP  # tokens shared by consecutive chunks of a section
    device: str = "auto"  # auto | cpu | cuda
    precision: str = "fp32"  # fp32 | int8 (dynamic quantisation, CPU)
    # torch | onnx: the encoder's runtime; onnx runs a cached ONNX Runtime export on CPU (with
    # precision int8: onnxruntime's dynamic int8). Same embeddings within float tolerance, so the
    # index keeps the weights' fingerprint whichever backend wrote it (docs/ingestion.md)
    encoder_backend: str = "torch"
    faiss_kind: str = "auto"  # auto (HNSW from 200k vectors) | flat (exact) | hnsw
    max_bytes: int = DEFAULT_MAX_BYTES  # larger files are reported and skipped
    follow_links: bool = False  # read links that leave the folder, walk linked folders
    progress: bool = True  # tqdm bars on stderr
    engine: str = "local"  # local (this process) | ray (Ray Data chunks, encoder actors embed)
    ray_address: str | None = None  # --engine ray: a running cluster; None = start a local one
    workers: int = 1  # --engine ray: encoder actors

    def root(self) -> Path:
        """The index folder: ``index_dir`` as given, else the checked name under $RAG_HOME."""
        return index_dir(Path(self.index_dir) if self.index_dir else self.index)

    def label(self) -> str:
        """How reports and messages name the index."""
        return self.index_dir or self.index


@dataclass
class IngestReport:
    """What one run did. File lists hold absolute paths; ``failures`` are (path, reason) of files
    that could not be ingested; ``skipped`` (path, reason) of files of other types, passed over
    without failing the run; ``notes`` say what was adjusted (a capped --chunk-tokens)."""

    index: str
    added: list[str] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    failures: list[tuple[str, str]] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    chunking: dict[str, int] = field(default_factory=dict)  # as stored in the manifest
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
            f"{len(self.failures)} failed, {len(self.skipped)} skipped files; {self.chunks} chunks "
            f"({self.chunks_embedded} embedded, {self.chunks_removed} removed) in {self.seconds:.1f}s"
        )

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["failures"] = [{"path": p, "reason": r} for p, r in self.failures]
        d["skipped"] = [{"path": p, "reason": r} for p, r in self.skipped]
        d["counts"] = {
            k: len(getattr(self, k)) for k in ("added", "updated", "unchanged", "removed")
        }
        d["counts"]["failed"] = len(self.failures)
        d["counts"]["skipped"] = len(self.skipped)
        d["summary"] = self.summary()
        return d


def validate_config(cfg: IngestConfig) -> Path:
    """Check every setting that can be checked without writing, and return the index folder.

    Runs before the folder is created, so a refused run (``--chunk-tokens 0``, a bad name, an
    unknown encoder for a new index) leaves nothing behind."""
    if not cfg.paths:
        raise ValueError("no documents given (DOCS ...)")
    check_chunking(cfg.chunk_tokens, cfg.overlap)
    if cfg.max_bytes < 1:
        raise ValueError(f"--max-bytes must be positive, not {cfg.max_bytes}")
    for flag, value, allowed in (
        ("--backend", cfg.backend, (None, *BACKENDS)),
        ("--precision", cfg.precision, PRECISIONS),
        ("--encoder-backend", cfg.encoder_backend, ENCODER_BACKENDS),
        ("--device", cfg.device, DEVICES),
        ("--faiss-kind", cfg.faiss_kind, FAISS_KINDS),
    ):
        if value not in allowed:
            choices = ", ".join(a for a in allowed if a)
            raise ValueError(f"{flag} must be one of {choices}, not {value!r}")
    if cfg.chroma_url and cfg.backend not in (None, "chroma"):
        raise ValueError("--chroma-url needs --backend chroma")
    check_backend(cfg.encoder_backend, cfg.device)
    if cfg.engine not in ENGINES:
        raise ValueError(f"--engine must be one of {', '.join(ENGINES)}, not {cfg.engine!r}")
    if cfg.engine != "ray" and (cfg.ray_address or cfg.workers != 1):
        raise ValueError("--ray-address and --workers need --engine ray")
    if cfg.workers < 1:
        raise ValueError(f"--workers must be at least 1, not {cfg.workers}")
    if cfg.engine == "ray" and importlib.util.find_spec("ray") is None:
        raise ValueError("--engine ray needs Ray: pip install -e '.[ray]'")
    root = cfg.root()  # IndexNameError for a name that is a path
    if root.exists() and not root.is_dir():
        raise ValueError(f"index folder {root} is a file")
    if cfg.encoder or not (root / CURRENT).exists():  # fails now, listing the known models
        resolve_model(cfg.encoder or DEFAULT_ENCODER)
    return root


def file_hash(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def os_reason(e: OSError, path: Path) -> str:
    """A short reason for an OS error on ``path`` (links get a clearer wording)."""
    if e.errno == errno.ELOOP:
        return "symbolic link loop"
    if e.errno == errno.ENOENT and path.is_symlink():
        return f"broken symbolic link (no such file: {os.readlink(path)})"
    return e.strerror or str(e)


def under(path: str, roots: list[Path]) -> bool:
    return any(path == str(r) or path.startswith(str(r) + os.sep) for r in roots)


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
    """Chunks new/changed files elsewhere (rag.ingest_ray); results in any order, each a list
    of chunks or a failure reason, as :func:`chunk_file` would give or raise."""

    def chunk(self, files: list[PendingFile], chunking: dict) -> dict[str, list[Chunk] | str]: ...


def chunk_file(path: Path, key: str, tokenizer: Any, chunking: dict, max_bytes: int) -> list[Chunk]:
    """Load and chunk one file, as every engine does (raises DocumentError / OSError)."""
    doc = load_document(path, max_bytes=max_bytes)
    doc.path = key
    chunks = chunk_document(
        doc, tokenizer, chunking["chunk_tokens"], chunking["overlap"], chunking["max_tokens"]
    )
    if not chunks:
        raise DocumentError(path, "no text to index after chunking")
    return chunks


def _record_failure(
    plan: Plan, report: IngestReport, sources: dict, key: str, reason: str, shown: Any = None
) -> None:
    """A file that could not be chunked: reported (as ``shown``, else ``key``); its old chunks
    go."""
    report.failures.append((key if shown is None else shown, reason))
    if key in sources:
        plan.drop_sources.append(key)


def _record_chunks(
    plan: Plan, report: IngestReport, sources: dict, f: PendingFile, chunks: list[Chunk]
) -> None:
    (report.updated if f.key in sources else report.added).append(f.key)
    if f.key in sources:
        plan.drop_sources.append(f.key)
    plan.entries[f.key] = SourceEntry(f.digest, f.size, f.mtime_ns, [c.id for c in chunks])
    plan.new_chunks.extend(chunks)
    report.bytes_embedded += f.size


def plan_changes(
    cfg: IngestConfig,
    old: Manifest | None,
    chunking: dict,
    encoder: EncoderHandle,
    report: IngestReport,
    engine: ChunkEngine | None = None,
) -> Plan:
    """Walk the inputs, classify every file and chunk the new/changed ones: here, one by one,
    or (``engine`` given) all at once by the engine, recorded in file order either way."""
    plan = Plan()
    unchanged_chunking = old is not None and same_chunking(old.chunking, chunking)
    sources = old.sources if old else {}
    roots = [Path(os.path.abspath(p)) for p in cfg.paths]
    seen: set[str] = set()
    skipped: list[DocumentError] = []
    pending: list[PendingFile] = []
    files = list(iter_files(cfg.paths, follow_links=cfg.follow_links, skipped=skipped))
    report.skipped.extend((e.path, e.reason) for e in skipped)
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
                plan.entries[key] = SourceEntry(digest, st.st_size, st.st_mtime_ns, prev.chunk_ids)
                continue
            todo = PendingFile(key, digest, st.st_size, st.st_mtime_ns)
            if engine is not None:
                pending.append(todo)
                continue
            chunks = chunk_file(path, key, encoder.get().tokenizer, chunking, cfg.max_bytes)
        except DocumentError as e:
            _record_failure(plan, report, sources, key, e.reason, shown=e.path)
            continue
        except OSError as e:
            _record_failure(plan, report, sources, key, os_reason(e, path))
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
    for key in sorted(sources):
        if key not in seen and (not os.path.lexists(key) or under(key, roots)):
            report.removed.append(key)
            plan.drop_sources.append(key)
    return plan


class EncoderHandle:
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

    @property
    def max_chunk_tokens(self) -> int:
        if self._encoder is None and self.same and "max_tokens" in self.old.chunking:
            return int(self.old.chunking["max_tokens"])
        return self.get().max_chunk_tokens

    def identity(self) -> dict[str, Any]:
        if self._encoder is None and self.same:
            return dict(self.old.encoder)
        return self.get().identity()
