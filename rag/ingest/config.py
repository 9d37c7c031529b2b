"""The settings of one ingest run and what it reports: :class:`IngestConfig` (saved as
run.json beside the generation it writes), the checks made before anything is written
(:func:`validate_config`, :func:`check_chunking`), the chunking a run really applies
(:func:`effective_chunking`, compared across runs by :func:`same_chunking`), and
:class:`IngestReport`.

Apart from :mod:`rag.ingest.plan` (which files change, their chunks), :mod:`rag.ingest.apply`
(applying the plan, publishing) and :mod:`rag.ingest.cli`: the planning, the local apply and
the Ray engine (:mod:`rag.ingest.ray_engine`) all read these settings, and import nothing else
of the package.
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from indexes import BACKENDS, resolve_backend
from rag.defaults import DEFAULT_CHUNK_TOKENS, DEFAULT_OVERLAP, DEVICES
from rag.documents import (
    DEFAULT_MAX_BYTES,
    DEFAULT_MAX_FILE_TOKENS,
    DEFAULT_MAX_PAGES,
    DEFAULT_MAX_SECONDS,
    DEFAULT_MAX_TEXT_CHARS,
    Limits,
    iter_files,
)
from rag.models import default_encoder, resolve_model
from rag.models.precision import PRECISION_SETTINGS
from rag.retrieval.encoder import ENCODER_BACKENDS, check_backend
from rag.storage.manifest import CURRENT, Manifest, index_dir
from rag.storage.paths import printable

AUTO_ENCODER = "auto"  # --encoder auto (= not given): the index's own, else default_encoder()
# = indexes.faiss_index.KINDS, repeated so that checking settings does not import faiss
FAISS_KINDS = ("auto", "flat", "hnsw", "ivf")
ENGINES = ("local", "ray")  # ray: rag.ingest.ray_engine, the optional `ray` extra
MIN_CHUNK_TOKENS = 8  # rag.documents.chunking refuses smaller budgets
# Files one run may find under its DOCS: 20,000 tiny files took 196 s; more is refused before
# anything is read (--max-files raises it), so `rag.ingest ~` is one line, not an hour.
DEFAULT_MAX_FILES = 50_000


class SourceRootError(ValueError):
    """A DOCS path that is missing, cannot be read, or is now empty where the index holds
    documents from it (an unmounted disk, a renamed folder, a typo): the run is refused before
    anything is written, so the index keeps every document (``--allow-empty`` goes on)."""


class NoDocumentReadError(RuntimeError):
    """A run into a new index that read no document at all (every file it found failed: a
    hostile PDF, a name that is not UTF-8, a symbolic link loop; or held no text): nothing is
    created, where such a run used to publish an empty index that then appeared as a model and
    in the UI.
    ``report`` holds the failures (``rag.ingest`` prints them before its one line, exit 1)."""

    def __init__(self, report: IngestReport, label: str) -> None:
        n = len(report.failures)
        why = failed_files(n) if n else "no file holds text"
        super().__init__(
            f"no document could be read ({why}); nothing was ingested and index "
            f"{label!r} was not created"
        )
        self.report = report


def failed_files(n: int) -> str:
    """``1 file failed`` / ``3 files failed``."""
    return f"{n} file{'' if n == 1 else 's'} failed"


def under(path: str, roots: list[str] | list[Path]) -> bool:
    """Whether the absolute ``path`` is one of ``roots`` or lies under one."""
    return any(path == str(r) or path.startswith(str(r).rstrip(os.sep) + os.sep) for r in roots)


def held_from(old: Manifest | None, root: str) -> int:
    """How many documents of ``old`` come from the DOCS path ``root`` (absolute)."""
    return sum(1 for key in old.sources if under(key, [root])) if old else 0


def unreadable(path: str) -> str | None:
    """Why the folder ``path`` cannot be listed (permission denied), or None."""
    if not os.path.isdir(path):
        return None
    try:
        with os.scandir(path) as it:
            next(it, None)
    except OSError as e:
        return f"folder cannot be read ({e.strerror or e})"
    return None


def check_sources(cfg: IngestConfig, old: Manifest | None, label: str) -> None:
    """Refuse the run (:class:`SourceRootError`, exit 2, nothing written) when a DOCS path is
    missing or cannot be listed. An unmounted disk or a renamed folder used to be reported as
    one failure while every document from it was removed and the emptied index published (and
    a typo created an empty index). With ``allow_empty`` an existing index goes on: the
    documents of a missing path go, those of an unreadable folder stay; a new index is refused
    either way (there is nothing to create it from)."""
    for given in cfg.paths:
        path = os.path.abspath(given)
        reason = unreadable(path) if os.path.lexists(path) else "no such file or directory"
        if reason is None:
            continue
        shown = printable(given)
        if old is None:
            raise SourceRootError(
                f"{shown}: {reason}; nothing was ingested and index {label!r} was not created"
            )
        if cfg.allow_empty:
            continue
        held = held_from(old, path)
        holds = f", but index {label!r} holds {held} document(s) from it" if held else ""
        hint = (
            " (an unmounted disk or a renamed folder? --allow-empty removes them)"
            if held and reason.startswith("no such")
            else ""
        )
        raise SourceRootError(f"{shown}: {reason}{holds}; nothing was changed{hint}")


def check_found(cfg: IngestConfig, old: Manifest | None, label: str, found: dict[str, int]) -> None:
    """After the walk, before anything is read: refuse (:class:`SourceRootError`) a DOCS folder
    that now holds no supported file where the index holds documents from it (its files
    deleted or moved: ``--allow-empty`` removes them), and a new index whose DOCS hold no
    supported file at all (it would publish an empty index). ``found``: supported files (and
    files that failed the walk) per DOCS path as given."""
    for given in cfg.paths:
        if found.get(given, 0):
            continue
        shown = printable(given)
        held = held_from(old, os.path.abspath(given))
        if held and not cfg.allow_empty:
            raise SourceRootError(
                f"{shown}: holds no supported file now, but index {label!r} holds {held} "
                "document(s) from it; nothing was changed (--allow-empty removes them)"
            )
    if old is None and not any(found.values()):
        names = ", ".join(printable(p) for p in cfg.paths)
        raise SourceRootError(
            f"{names}: no supported file to ingest; nothing was ingested and index {label!r} "
            "was not created"
        )


def check_chunking(chunk_tokens: int | None, overlap: int) -> None:
    """Refuse chunk settings ``rag.documents.chunking`` would refuse, before anything is created: a
    refused run must leave no index folder behind (the same rule, checked early)."""
    n = DEFAULT_CHUNK_TOKENS if chunk_tokens is None else chunk_tokens
    if n < MIN_CHUNK_TOKENS:
        raise ValueError(f"--chunk-tokens must be at least {MIN_CHUNK_TOKENS}, not {n}")
    if not 0 <= overlap < n // 2:
        raise ValueError(f"--overlap must be in [0, {n // 2}) for {n}-token chunks, not {overlap}")


def effective_chunking(
    chunk_tokens: int, overlap: int, max_tokens: int, context: bool = False
) -> dict[str, int]:
    """The chunking a run really applies, as the manifest records it.

    ``chunk_tokens`` is capped at what the encoder reads (``max_tokens``) and the overlap then
    kept proportionate, exactly as :func:`rag.documents.chunking.chunk_document` does, so chunking with
    these values gives the same chunks. The requested values are kept beside them. ``context``:
    whether the indexed text carries the chunk's file and headings (``indexed_text``)."""
    budget = min(chunk_tokens, max_tokens)
    eff_overlap = min(overlap, budget // 4) if budget < chunk_tokens else overlap
    return {
        "chunk_tokens": budget,
        "overlap": eff_overlap,
        "max_tokens": max_tokens,
        "requested_chunk_tokens": chunk_tokens,
        "requested_overlap": overlap,
        "context": int(context),
    }


def same_chunking(old: dict[str, int], new: dict[str, int]) -> bool:
    """Whether two manifests' chunking makes the same chunks. Manifests written before the
    effective values were stored hold the requested ones (256 with minilm's 254-token limit);
    comparing effective values keeps their chunks instead of re-embedding the whole index.
    A manifest without ``context`` was indexed without it; a run that changes it re-embeds all."""
    if not old or "chunk_tokens" not in old or "overlap" not in old:
        return False
    if old.get("context", 0) != new.get("context", 0):
        return False

    def eff(d: dict[str, int]) -> tuple[int, int]:
        e = effective_chunking(d["chunk_tokens"], d["overlap"], d.get("max_tokens", 1 << 30))
        return e["chunk_tokens"], e["overlap"]

    return eff(old) == eff(new)


def rechunk_reason(old: dict[str, int], new: dict[str, int]) -> str:
    """The note of a run that re-chunks and re-embeds every document of an index: which
    chunking setting differs from the one the index was written with."""
    if old.get("context", 0) != new.get("context", 0):
        was = "with" if old.get("context", 0) else "without"
        return (
            f"re-embedding every document: the index was written {was} the line naming each "
            "chunk's file and headings (--context)"
        )
    return "re-embedding every document: the chunk size or overlap differs from the index's"


@dataclass
class IngestConfig:
    """Settings of one ingest run (saved as run.json beside the generation it writes)."""

    paths: list[str]  # files or folders to ingest
    index: str = "default"  # index name under $RAG_HOME/indexes (a name, never a path)
    index_dir: str | None = None  # an index folder elsewhere, given explicitly (wins over index)
    # alias or folder; None / auto: the index's recorded encoder, else for a new index
    # minilm-tuned when `make models` trained it, else minilm (rag.models.default_encoder)
    encoder: str | None = None
    backend: str | None = None  # faiss | chroma; default: the index's backend, else faiss
    chroma_url: str | None = None  # Chroma server URL; default: the index's, else embedded
    chunk_tokens: int | None = None  # chunk size in encoder tokens; None: 256 (or the encoder's
    # limit if smaller); a larger explicit value is capped, and the report says so
    overlap: int = DEFAULT_OVERLAP  # tokens shared by consecutive chunks of a section
    # embed each chunk under a line naming its file and its heading path
    # (rag.documents.chunking.indexed_text; off by default: better pages, fewer answers with the
    # key terms on the dev questions, docs/retrieval.md); BM25 and the shown text: the chunk alone
    context: bool = False
    device: str = "auto"  # auto | cpu | cuda
    # encoder weights (rag.models.precision): auto (the default: bf16 on CUDA and on a CPU where
    # a cached probe measured it faster, docs/scaling.md; else fp32; the manifest records the
    # one chosen) | fp32 | bf16 (weights cast) | int8 (CPU)
    precision: str = "auto"
    # torch | onnx: the encoder's runtime; onnx runs a cached ONNX Runtime export on CPU (with
    # precision int8: onnxruntime's dynamic int8). Same embeddings within float tolerance, so the
    # index keeps the weights' fingerprint whichever backend wrote it (docs/ingestion.md)
    encoder_backend: str = "torch"
    # auto (flat below 200k vectors, then HNSW on CPU, IVF on a GPU) | flat (exact) | hnsw | ivf;
    # None: the index's recorded kind, else auto (indexes/faiss_index.py)
    faiss_kind: str | None = None
    faiss_nprobe: int | None = None  # IVF lists searched per query; None: the index's, else 16
    max_bytes: int = DEFAULT_MAX_BYTES  # larger files are reported and skipped
    # a file whose extracted text is longer is reported and skipped: bounds chunking and
    # embedding (a 160 KB .docx can expand to 21M characters, an hour of embedding)
    max_text_chars: int = DEFAULT_MAX_TEXT_CHARS
    # a file that takes longer to load (parse + extract text) and chunk is reported and
    # skipped; checked between a loader's steps (HTML slices, .docx paragraphs, every few
    # hundred operators of a PDF page) and chunking's
    max_load_seconds: float = DEFAULT_MAX_SECONDS
    max_pages: int = DEFAULT_MAX_PAGES  # a PDF with more pages is reported and skipped
    # a file whose text holds more encoder tokens is reported and skipped as it is tokenised,
    # before it is chunked or embedded: embedding costs what the tokens cost
    max_file_tokens: int = DEFAULT_MAX_FILE_TOKENS
    max_files: int = DEFAULT_MAX_FILES  # a run whose DOCS hold more files is refused
    # pass over (as skipped) an HTML page whose head says <meta name="robots" content="noindex">:
    # mdBook's print.html repeats the whole book in one page, its toc.html is navigation only
    skip_noindex: bool = True
    # pass over (as skipped) a text file whose rendered HTML page is among the DOCS too: a Sphinx
    # build's _sources/*.rst.txt, Node's api/*.md beside api/*.html (the page is read and cited)
    skip_sources: bool = True
    # go on although a DOCS path is missing, unreadable or now empty where the index holds
    # documents from it (refused by default, the index untouched): the documents of a missing
    # or emptied path are removed, those of an unreadable folder kept
    allow_empty: bool = False
    follow_links: bool = False  # read links that leave the folder, walk linked folders
    progress: bool = True  # progress on stderr (rag.cli.progress: a bar on a terminal, else lines)
    engine: str = "local"  # local (this process) | ray (Ray Data chunks, encoder actors embed)
    ray_address: str | None = None  # --engine ray: a running cluster; None = start a local one
    workers: int = 1  # --engine ray: encoder actors

    def root(self) -> Path:
        """The index folder: ``index_dir`` as given, else the checked name under $RAG_HOME."""
        return index_dir(Path(self.index_dir) if self.index_dir else self.index)

    def limits(self) -> Limits:
        """What loading one file may cost (rag.documents.Limits)."""
        return Limits(
            self.max_bytes,
            self.max_text_chars,
            self.max_load_seconds,
            self.max_pages,
            self.max_file_tokens,
            self.skip_noindex,
        )

    def label(self) -> str:
        """How reports and messages name the index."""
        return self.index_dir or self.index

    def requested_encoder(self) -> str | None:
        """The encoder asked for, or None when the run leaves it to the index (``auto``)."""
        return None if self.encoder in (None, "", AUTO_ENCODER) else self.encoder


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
    for flag, value in (
        ("--max-bytes", cfg.max_bytes),
        ("--max-text-chars", cfg.max_text_chars),
        ("--max-load-seconds", cfg.max_load_seconds),
        ("--max-pages", cfg.max_pages),
        ("--max-file-tokens", cfg.max_file_tokens),
        ("--max-files", cfg.max_files),
    ):
        if not value > 0:
            raise ValueError(f"{flag} must be positive, not {value}")
    for flag, value, allowed in (
        ("--backend", cfg.backend, (None, *BACKENDS)),
        ("--precision", cfg.precision, PRECISION_SETTINGS),
        ("--encoder-backend", cfg.encoder_backend, ENCODER_BACKENDS),
        ("--device", cfg.device, DEVICES),
        ("--faiss-kind", cfg.faiss_kind, (None, *FAISS_KINDS)),
    ):
        if value not in allowed:
            choices = ", ".join(a for a in allowed if a)
            raise ValueError(f"{flag} must be one of {choices}, not {value!r}")
    if cfg.faiss_nprobe is not None and cfg.faiss_nprobe < 1:
        raise ValueError(f"--faiss-nprobe must be at least 1, not {cfg.faiss_nprobe}")
    resolve_backend(cfg.backend, cfg.chroma_url)  # a --chroma-url the backend cannot take
    check_backend(cfg.encoder_backend, cfg.device, cfg.precision)
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
    if not (root / CURRENT).exists():  # a new index: a missing DOCS path creates nothing
        check_sources(cfg, None, cfg.label())
        if next(iter_files(cfg.paths, follow_links=cfg.follow_links), None) is None:
            check_found(cfg, None, cfg.label(), {})  # nothing to ingest: refused, no model loaded
    wanted = cfg.requested_encoder()
    if wanted or not (root / CURRENT).exists():  # fails now, listing the known models
        resolve_model(wanted or default_encoder())
    return root
