"""Ingest documents into a named index: load, chunk, embed, store; incremental and atomic.

``python -m rag.ingest DOCS [DOCS ...] [--index NAME | --index-dir PATH] [--encoder auto|ALIAS|DIR]
[--backend faiss|chroma] [--chroma-url URL] [--chunk-tokens N] [--overlap N] [--follow-links]
[--encoder-backend torch|onnx] [--precision fp32|bf16|int8|auto] [--engine local|ray [--ray-address ADDR]
[--workers N]] [--json]``

The command line of :mod:`rag.ingest`: flags from :class:`~rag.ingest.config.IngestConfig`, the
run itself is :func:`rag.ingest.apply.ingest_config`.
"""

from __future__ import annotations

import argparse
import json
import sys

from indexes import BACKENDS
from rag.cli import OneLineParser, add_index_args, run_cli, sigterm_exits
from rag.cli.flags import add_dataclass_args, config_from_args
from rag.defaults import DEFAULT_CHUNK_TOKENS
from rag.ingest.apply import ingest_config
from rag.ingest.config import (
    ENGINES,
    FAISS_KINDS,
    IngestConfig,
    IngestReport,
    NoDocumentReadError,
)
from rag.models.precision import PRECISION_SETTINGS
from rag.retrieval.encoder import ENCODER_BACKENDS
from rag.storage.paths import printable

PROG = "rag.ingest"

# --help text where IngestConfig's comment is written for the code, not the command line
INGEST_HELP = {
    "paths": "files or folders to ingest",
    "encoder": "alias or folder; auto = the index's encoder, and for a new index minilm-tuned "
    "when `make models` trained it, else minilm (default: auto)",
    "backend": "where the vectors live (default: the index's, else faiss)",
    "chroma_url": "Chroma server, e.g. http://127.0.0.1:8000 (default: the index's, else embedded)",
    "chunk_tokens": f"chunk size in encoder tokens (default: {DEFAULT_CHUNK_TOKENS}; capped at "
    "the encoder's limit)",
    "faiss_kind": "FAISS index: flat (exact), hnsw, ivf, or auto (flat below 200k vectors, "
    "then HNSW on CPU, IVF on a GPU) (default: the index's, else auto)",
    "faiss_nprobe": "IVF lists searched per query; more = higher recall, slower "
    "(default: the index's, else 16)",
    "precision": "encoder weights (rag.models.precision): bf16 = bfloat16 (about 3x fp32 on CPUs with "
    "AMX, and on GPUs); int8 = quantised CPU encoder; auto = bf16 where it runs fast, else fp32",
    "encoder_backend": "encoder runtime: torch, or onnx (ONNX Runtime on CPU, export cached under "
    "$RAG_HOME/onnx; with --precision int8 quantised by onnxruntime)",
    "max_bytes": "skip larger files (a .docx may expand to 5 times this in all)",
    "max_text_chars": "skip a file whose extracted text is longer (bounds chunking and embedding)",
    "max_file_tokens": "skip a file whose text holds more encoder tokens, refused as it is "
    "tokenised (bounds embedding: roughly 4 characters of prose per token)",
    "max_load_seconds": "skip a file that takes longer to load and chunk (checked between a "
    "loader's steps, inside a PDF page, and between chunking's)",
    "engine": "local: this process; ray: Ray Data chunks, --workers encoder actors embed "
    "(the `ray` extra)",
    "ray_address": "Ray cluster (default: start a local one)",
    "progress": "progress on stderr: a bar on a terminal, else a line every "
    "$RAG_PROGRESS_INTERVAL s (15) with rate and ETA",
}


def build_parser() -> argparse.ArgumentParser:
    """Flags from :class:`IngestConfig` (rag.cli.flags), ``--index``/``--index-dir`` as one
    choice (rag.cli), and ``--json``."""
    p = OneLineParser(prog="python -m rag.ingest", description=__doc__.split("\n")[0])
    add_index_args(p)
    add_dataclass_args(
        p,
        IngestConfig,
        exclude=("index", "index_dir"),
        help=INGEST_HELP,
        choices={
            "backend": BACKENDS,
            "precision": PRECISION_SETTINGS,
            "encoder_backend": ENCODER_BACKENDS,
            "faiss_kind": FAISS_KINDS,
            "engine": ENGINES,
        },
        kwargs={"paths": {"metavar": "DOCS"}},
    )
    p.add_argument("--json", action="store_true", help="print the report as JSON on stdout")
    return p


MAX_SKIPPED_LINES = 20  # a folder of images should not bury the summary; --json lists all
SKIPPED_GROUP = 3  # files skipped for one reason that are said in one line (print_files)


def print_report(report: IngestReport) -> None:
    """The per-file lines and the summary on stderr (stdout stays for --json); control
    characters in names and reasons escaped (:func:`rag.storage.paths.printable`), so a file named
    ``"x\\nfailed: y"`` is one line."""
    for note in report.notes:
        print(f"note: {printable(note)}", file=sys.stderr)
    print_files(report)
    print(report.summary(), file=sys.stderr)


def print_files(report: IngestReport) -> None:
    """The ``failed:`` and ``skipped:`` lines of :func:`print_report`. Files skipped for one
    reason, :data:`SKIPPED_GROUP` or more of them, are one line ("skipped: 14 files:
    unsupported file type '.js' (first: …/book.js)"): an HTML manual's folder holds its
    scripts, styles and fonts, whose lines buried the summary."""
    for path, reason in report.failures:
        print(f"failed: {printable(path)}: {printable(reason)}", file=sys.stderr)
    by_reason: dict[str, list[str]] = {}
    for path, reason in report.skipped:
        by_reason.setdefault(reason, []).append(path)
    lines = []
    for reason, paths in by_reason.items():
        if len(paths) >= SKIPPED_GROUP:
            lines.append(f"{len(paths)} files: {printable(reason)} (first: {printable(paths[0])})")
        else:
            lines += [f"{printable(path)}: {printable(reason)}" for path in paths]
    for line in lines[:MAX_SKIPPED_LINES]:
        print(f"skipped: {line}", file=sys.stderr)
    if len(lines) > MAX_SKIPPED_LINES:
        more = len(lines) - MAX_SKIPPED_LINES
        print(f"skipped: ... and {more} more lines (--json lists every file)", file=sys.stderr)


def run(args: argparse.Namespace) -> int:
    """Exit 0 when every file was ingested, 1 when some failed (the rest is published); a
    SIGTERM stops the run cleanly (:func:`rag.cli.sigterm_exits`: a first run's folder is
    removed, the lock released, exit 143). A new index of which no file could be read is not
    created: the per-file lines, then one error line (exit 1)."""
    with sigterm_exits():
        try:
            report = ingest_config(config_from_args(IngestConfig, args))
        except NoDocumentReadError as e:
            print_files(e.report)
            raise
    print_report(report)
    if args.json:
        print(json.dumps(report.to_dict(), indent=1))
    return 0 if report.ok else 1


def main(argv: list[str] | None = None) -> int:
    """Exit 0 when every file was ingested, 1 when some failed, 2 when the run was refused."""
    return run_cli(build_parser(), run, argv, quiet=True)
