"""List and remove the documents of an index.

``python -m rag.docs list [--index NAME | --index-dir PATH] [--json]``
``python -m rag.docs remove [--index NAME | --index-dir PATH] [--json] PATH [PATH ...]``

``python -m rag.docs remove [--index NAME | --index-dir PATH] --all``

``list`` prints one line per document: its path relative to the ingested folder, type, chunks,
bytes, when it was ingested and its content hash. ``remove`` takes documents (as ``list`` shows
them) or folders of them (``library/``), never an absolute path, a backslash path that reads as
one, nor the whole index (``/``, ``\\``, ``.``: :func:`rag.ingest.manage.check_document_path`),
and publishes the index without them as one new generation (atomic, like ``rag.ingest``: a
kill -9 leaves the previous one loadable). A path that names no document is one line on stderr
naming it, exit status 2, and nothing changes; so is a removal that would leave the index
without a document, unless ``--all`` is given (which alone removes every document). A removed file that is still in its folder comes back at the next ``rag.ingest`` of
that folder (docs/ingestion.md). The library calls: :func:`rag.ingest.list_documents`,
:func:`rag.ingest.remove_documents`.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path

from rag.cli import OneLineParser, add_index_args, run_cli
from rag.cli.flags import add_dataclass_args, config_from_args
from rag.ingest.manage import IndexDocuments, iso_time, list_documents, remove_documents
from rag.storage.paths import printable

PROG = "rag.docs"
REINGEST_NOTE = (
    "note: a removed file still in its folder comes back at the next rag.ingest of that folder"
)


@dataclass
class RemoveOptions:
    """What ``remove`` takes besides its paths."""

    # remove every document (with no PATH), or allow the PATHs to name every one: a removal
    # that would leave the index without documents is refused without it
    all: bool = False


def build_parser() -> OneLineParser:
    p = OneLineParser(prog="python -m rag.docs", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="command", required=True, metavar="{list,remove}")
    for name, text in (
        ("list", "list the documents of an index"),
        ("remove", "remove documents (or every document under a folder) from an index"),
    ):
        cmd = sub.add_parser(name, help=text, description=text)
        add_index_args(cmd)
        cmd.add_argument("--json", action="store_true", help="print JSON on stdout")
        if name == "remove":
            add_dataclass_args(cmd, RemoveOptions)
            cmd.add_argument(
                "paths",
                nargs="*",
                metavar="PATH",
                help="a document as `list` shows it, or a folder of them (relative)",
            )
    return p


def format_table(docs: IndexDocuments) -> str:
    """One aligned line per document (path first: what `remove` takes; control characters
    escaped, :func:`rag.storage.paths.printable`)."""
    rows = [("PATH", "TYPE", "CHUNKS", "BYTES", "INGESTED", "SHA256")]
    rows += [
        (
            printable(d.path),
            d.type,
            str(d.chunks),
            str(d.bytes),
            iso_time(d.ingested) or "unknown",
            d.hash[:12],
        )
        for d in docs.documents
    ]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows)


def run(args: argparse.Namespace) -> int:
    index = Path(args.index_dir) if args.index_dir else args.index
    if args.command == "list":
        docs = list_documents(index)
        if args.json:
            print(json.dumps(docs.to_dict(include_source=True), indent=1, ensure_ascii=False))
        else:
            print(format_table(docs))
        encoder = docs.documents[0].encoder if docs.documents else "-"
        print(
            f"{docs.index}: {len(docs.documents)} documents, {docs.chunks} chunks "
            f"({docs.generation}, encoder {encoder})",
            file=sys.stderr,
        )
        return 0
    options = config_from_args(RemoveOptions, args)
    if not args.paths and not options.all:
        raise ValueError("remove needs PATH ... (documents or folders), or --all")
    report = remove_documents(index, args.paths, everything=options.all)
    for d in report.removed:
        print(f"removed: {printable(d.path)} ({d.chunks} chunks)", file=sys.stderr)
    print(REINGEST_NOTE, file=sys.stderr)
    print(report.summary(), file=sys.stderr)
    if args.json:
        print(json.dumps(report.to_dict(include_source=True), indent=1, ensure_ascii=False))
    return 0


def main(argv: list[str] | None = None) -> int:
    """Exit 0 when done, 2 for a bad flag, index or path (nothing changed), 1 when it failed."""
    return run_cli(build_parser(), run, argv)


if __name__ == "__main__":
    sys.exit(main())
