"""Search an ingested index from the command line.

``python -m rag.search "query" [--index NAME] [--k 10] [--mode dense|bm25|hybrid] [--json]``

Prints ranked chunks (source, heading path, score, text preview); ``--json`` prints the hits as
JSON on stdout (logs stay on stderr).
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from rag.encoding import EncoderMismatchError
from rag.manifest import IndexNotFoundError
from rag.retrieve import MODES, Retriever
from rag.types import Hit


def format_hit(hit: Hit, width: int = 240) -> str:
    heading = " > ".join(hit.chunk.heading_path) or "-"
    preview = " ".join(hit.chunk.text.split())
    preview = preview if len(preview) <= width else preview[: width - 1] + "…"
    return f"{hit.rank:>2}. [{hit.score:.4f}] {hit.chunk.source}  ({heading})\n    {preview}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m rag.search", description=__doc__.split("\n")[0])
    p.add_argument("query")
    p.add_argument("--index", default="default", help="index name or folder; default: %(default)s")
    p.add_argument("--k", type=int, default=10, help="number of hits")
    p.add_argument("--mode", default="hybrid", choices=MODES)
    p.add_argument("--encoder", default=None, help="must match the index's encoder (default: it)")
    p.add_argument(
        "--rerank", default=None, metavar="DIR", help="cross-encoder folder to rerank with"
    )
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    p.add_argument("--json", action="store_true", help="print hits as JSON on stdout")
    args = p.parse_args(argv)
    if args.k <= 0:
        print(f"error: --k must be positive, got {args.k}", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    try:
        retriever = Retriever.open(
            args.index, encoder=args.encoder, device=args.device, reranker=args.rerank
        )
        hits = retriever.search(args.query, k=args.k, mode=args.mode)
    except (IndexNotFoundError, EncoderMismatchError, ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    seconds = time.perf_counter() - t0
    if args.json:
        out = {
            "query": args.query,
            "index": args.index,
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
            f"{len(hits)} hits from {args.index!r} ({args.mode}) in {seconds:.2f}s", file=sys.stderr
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
