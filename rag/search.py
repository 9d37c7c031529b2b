"""Search an ingested index from the command line.

``python -m rag.search "query" [--index NAME | --index-dir PATH] [--k 10]
[--mode dense|bm25|hybrid] [--where path=GLOB|type=T ...] [--rerank auto|none|DIR]
[--rerank-depth N] [--verify] [--json]``

Prints ranked chunks (path relative to the ingested folder, heading path, score, text preview;
control characters escaped, :func:`rag.storage.paths.printable`); a query's typos are corrected
against the index's words first, as ``rag.ask`` corrects a question's (``--no-correct-typos``:
as typed; :mod:`rag.retrieval.spelling`), and the query searched is said on stderr (``query``
and ``typed`` in ``--json``); a query without a word (empty,
punctuation only) is refused, one line and exit status 2, as ``rag.ask`` refuses one;
``--json`` prints the hits as JSON on stdout (logs stay on stderr). Any failure is one line on
stderr; exit status 2 for a bad flag, name or path (see :mod:`rag.cli`) and for a damaged index:
every opening checks the index's pointer, its files' sizes and its chunk and vector stores, and
``--verify`` also every file's SHA-256 against the one recorded at publication
(:func:`rag.storage.manifest.verify_generation`), before searching. The flags are the config's
retrieval section and device (:func:`rag.config.add_config_args`: the names, help and value sets
of ``rag.ask``), read over ``--config`` or ./rag.toml as ``rag.ask`` reads them, so both retrieve
alike; 10 hits by default.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from rag.cli import OneLineParser, run_cli
from rag.config import add_config_args, config_from_args, section_fields
from rag.retrieval.query import check_query
from rag.storage.paths import printable
from rag.types import Hit, page_label

if TYPE_CHECKING:
    from rag.retrieval.settings import RetrievalSettings

PROG = "rag.search"
# Where rag.search starts from other values than rag.ask: more hits to look through.
SEARCH_DEFAULTS = {"k": 10}
# The settings rag.search has no flag for, and why (tests/test_config_flags.py).
EXCLUDED = dict.fromkeys(
    [*section_fields("answer"), *section_fields("generate")],
    "rag.search retrieves only: nothing is read or decoded",
)


def format_hit(hit: Hit, width: int = 240) -> str:
    heading = " > ".join(hit.chunk.heading_path) or "-"
    preview = printable(" ".join(hit.chunk.text.split()))
    preview = preview if len(preview) <= width else preview[: width - 1] + "…"
    path = printable(hit.chunk.display_path)  # a file name cannot forge a line or colour
    path += page_label(hit.chunk.page)
    return f"{hit.rank:>2}. [{hit.score:.4f}] {path}  ({printable(heading)})\n    {preview}"


def build_parser() -> OneLineParser:
    p = OneLineParser(prog="python -m rag.search", description=__doc__.split("\n")[0])
    p.add_argument("query", help="what to search for")
    p.add_argument(
        "--config", default=None, help="TOML config file (default: ./rag.toml if present)"
    )
    add_config_args(
        p,
        EXCLUDED,
        defaults=SEARCH_DEFAULTS,
        help={
            "k": "number of hits",
            "encoder": "query encoder; must match the index's (none = the index's own)",
        },
        kwargs={
            "rerank": {"metavar": "auto|none|DIR"},
            "rerank_depth": {"metavar": "N"},
            "rerank_weight": {"metavar": "W"},
        },
    )
    p.add_argument(
        "--index-dir",
        default=None,
        metavar="PATH",
        help="an index folder elsewhere, instead of --index (default: none)",
    )
    p.add_argument(
        "--verify",
        action="store_true",
        help="first check every file of the index against the SHA-256 recorded when it was "
        "published (a mismatch: one line naming the file, exit 2)",
    )
    p.add_argument("--json", action="store_true", help="print hits as JSON on stdout")
    return p


def search_settings(args: argparse.Namespace) -> tuple[str | Path, RetrievalSettings]:
    """(the index, the retrieval settings) the flags, ``--config`` (or ./rag.toml) and
    :data:`SEARCH_DEFAULTS` give: the index and settings ``rag.ask`` would retrieve with;
    ``--index-dir`` names a folder instead of the config's index (not both)."""
    cfg = config_from_args(args, args.config, base=SEARCH_DEFAULTS)
    if args.index_dir is None:
        return cfg.index, cfg.retrieval
    if getattr(args, "index", None) is not None:
        raise ValueError("give --index NAME or --index-dir PATH, not both")
    return Path(args.index_dir), cfg.retrieval


def run(args: argparse.Namespace) -> int:
    from rag.retrieval.retriever import Retriever
    from rag.retrieval.spelling import searched

    check_query(args.query)  # before anything loads: no word, no meaningful hits
    t0 = time.perf_counter()
    index, settings = search_settings(args)
    if args.verify:
        from rag.storage.manifest import verify_generation

        _, gen, n = verify_generation(index)
        print(f"verified {n} files of {str(index)!r} ({gen.name})", file=sys.stderr)
    retriever = Retriever.from_settings(index, settings)
    query = searched(retriever, args.query, settings.correct_typos)  # as rag.ask searches
    hits = retriever.search(query)
    seconds = time.perf_counter() - t0
    reranker = getattr(retriever.reranker, "name", None)
    if args.json:
        out = {
            "query": query,
            "typed": args.query,
            "index": str(index),
            "mode": settings.mode,
            "k": settings.k,
            "where": list(settings.where),
            "reranker": reranker,
            "seconds": round(seconds, 3),
            "hits": [h.to_dict() for h in hits],
        }
        print(json.dumps(out, indent=1, ensure_ascii=False))
    else:
        for hit in hits:
            print(format_hit(hit))
        how = settings.mode + (f", reranked by {reranker}" if reranker else "")
        if query != args.query:
            print(f"searched for: {printable(query)}", file=sys.stderr)
        print(f"{len(hits)} hits from {str(index)!r} ({how}) in {seconds:.2f}s", file=sys.stderr)
    return 0


def main(argv: list[str] | None = None) -> int:
    return run_cli(build_parser(), run, argv, quiet=True)


if __name__ == "__main__":
    sys.exit(main())
