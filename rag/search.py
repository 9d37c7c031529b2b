"""Search an ingested index from the command line.

``python -m rag.search "query" [--index NAME | --index-dir PATH] [--k 10]
[--mode dense|bm25|hybrid] [--json]``

Prints ranked chunks (path relative to the ingested folder, heading path, score, text preview);
``--json`` prints the hits as JSON on stdout (logs stay on stderr). Any failure is one line on
stderr and exit status 2 (see :mod:`rag.cli`).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from rag.cli import OneLineParser, add_index_args, fail, quiet_libraries
from rag.encoding import ENCODER_BACKENDS
from rag.retrieve import Retriever
from rag.search_engine import MODES
from rag.types import Hit

PROG = "rag.search"


def format_hit(hit: Hit, width: int = 240) -> str:
    heading = " > ".join(hit.chunk.heading_path) or "-"
    preview = " ".join(hit.chunk.text.split())
    preview = preview if len(preview) <= width else preview[: width - 1] + "…"
    return f"{hit.rank:>2}. [{hit.score:.4f}] {hit.chunk.display_path}  ({heading})\n    {preview}"


def build_parser() -> OneLineParser:
    p = OneLineParser(prog="python -m rag.search", description=__doc__.split("\n")[0])
    p.add_argument("query")
    add_index_args(p)
    p.add_argument("--k", type=int, default=10, help="number of hits")
    p.add_argument("--mode", default="hybrid", choices=MODES)
    p.add_argument("--encoder", default=None, help="must match the index's encoder (default: it)")
    p.add_argument(
        "--rerank", default=None, metavar="DIR", help="cross-encoder folder to rerank with"
    )
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    p.add_argument(
        "--encoder-backend",
        default="torch",
        choices=ENCODER_BACKENDS,
        help="query encoder runtime (onnx: ONNX Runtime on CPU, same embeddings)",
    )
    p.add_argument("--json", action="store_true", help="print hits as JSON on stdout")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    quiet_libraries()
    t0 = time.perf_counter()
    index = Path(args.index_dir) if args.index_dir else args.index
    try:
        if args.k <= 0:
            raise ValueError(f"--k must be positive, not {args.k}")
        retriever = Retriever.open(
            index,
            encoder=args.encoder,
            device=args.device,
            reranker=args.rerank,
            encoder_backend=args.encoder_backend,
        )
        hits = retriever.search(args.query, k=args.k, mode=args.mode)
    except Exception as e:  # noqa: BLE001 - every failure is one line (rag.cli.fail)
        return fail(PROG, e)
    seconds = time.perf_counter() - t0
    if args.json:
        out = {
            "query": args.query,
            "index": str(index),
            "mode": args.mode,
            "k": args.k,
            "seconds": round(seconds, 3),
            "hits": [h.to_dict() for h in hits],
        }
        print(json.dumps(out, indent=1, ensure_ascii=False))
    else:
        for hit in hits:
            print(format_hit(hit))
        print(
            f"{len(hits)} hits from {str(index)!r} ({args.mode}) in {seconds:.2f}s", file=sys.stderr
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
