"""Search latency p50/p99 (query encode + search) at 10k and 100k chunks, against the raw floor
of the same work: ``SentenceTransformer.encode`` + a bare ``faiss.IndexFlatIP`` search.

``python -m benchmarks.search_latency [--sizes 10000,100000] [--queries 200] [--encoder minilm] [--json]``

Chunk vectors are synthetic (random unit vectors) so a 100k index needs no hours of encoding;
the query path is real (the encoder runs per query, one query at a time as a user asks). Our
path is :class:`rag.search_engine.SearchEngine`, the code both ``Retriever`` and ``CorpusRetriever``
search with. Raw and ours alternate query by query so background load hits both alike.
Results: ``$RAG_HOME/benchmarks/search_latency/`` (results.json, run.json).
"""

from __future__ import annotations

import json
import os
import platform
import random
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.cli import bench_main, bench_parser
from rag.paths import rag_home

PROG = "benchmarks.search_latency"

WORDS = [
    "file",
    "read",
    "write",
    "line",
    "open",
    "close",
    "loop",
    "list",
    "dict",
    "set",
    "tuple",
    "class",
    "object",
    "method",
    "function",
    "module",
    "import",
    "package",
    "error",
    "exception",
    "raise",
    "try",
    "except",
    "finally",
    "string",
    "bytes",
    "encode",
    "decode",
    "format",
    "print",
    "input",
    "output",
    "path",
    "directory",
    "process",
    "thread",
    "async",
    "await",
    "generator",
    "iterator",
    "yield",
    "return",
    "value",
    "type",
    "int",
    "float",
    "number",
    "sort",
    "key",
    "lambda",
    "map",
    "filter",
    "zip",
    "range",
]


@dataclass
class LatencyConfig:
    """What to measure."""

    sizes: str = "10000,100000"  # index sizes in chunks, comma-separated
    queries: int = 200  # timed queries per size (after 10 warm-up queries)
    k: int = 10  # hits per query
    encoder: str = "minilm"  # query encoder (alias or folder)
    threads: int = 0  # torch threads (0 = torch's default)
    out: str = ""  # results folder (default $RAG_HOME/benchmarks/search_latency)


def size_list(cfg: LatencyConfig) -> list[int]:
    return [int(s) for s in cfg.sizes.split(",")]


def check(cfg: LatencyConfig) -> None:
    """Refuse a run that cannot happen as given (exit 2, rag.cli), before loading the encoder."""
    try:
        sizes = size_list(cfg)
    except ValueError:
        sizes = []
    if not sizes or min(sizes) < cfg.k:
        raise ValueError(f"--sizes takes comma-separated chunk counts >= --k, not {cfg.sizes!r}")
    for name, low in (("queries", 1), ("k", 1), ("threads", 0)):
        if getattr(cfg, name) < low:
            raise ValueError(f"--{name} must be >= {low}, not {getattr(cfg, name)}")


def make_queries(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return [
        f"how do I {rng.choice(WORDS)} a {rng.choice(WORDS)} with {rng.choice(WORDS)} {rng.choice(WORDS)}"
        for _ in range(n)
    ]


def percentiles(xs: list[float]) -> dict[str, float]:
    a = np.array(xs) * 1000
    return {
        "p50_ms": float(np.percentile(a, 50)),
        "p99_ms": float(np.percentile(a, 99)),
        "mean_ms": float(a.mean()),
    }


def bench_size(n: int, cfg: LatencyConfig, encoder, queries: list[str]) -> dict:
    import faiss

    from indexes.faiss_index import FaissIndex
    from rag.bm25 import BM25Index
    from rag.search_engine import SearchEngine

    rng = np.random.default_rng(n)
    vecs = rng.standard_normal((n, encoder.dim), dtype=np.float32)
    vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
    ids = [f"c{i}" for i in range(n)]
    wr = random.Random(n)
    texts = [" ".join(wr.choices(WORDS, k=30)) for _ in range(n)]
    raw = faiss.IndexFlatIP(encoder.dim)
    raw.add(vecs)
    ours = FaissIndex(None, encoder.dim)
    ours.add(ids, vecs)
    t0 = time.perf_counter()
    bm25 = BM25Index(ids, texts)
    bm25_build = time.perf_counter() - t0
    engine = SearchEngine(encoder, ours, bm25, texts.__getitem__)
    st = encoder.model
    lat = {"raw": [], "dense": [], "hybrid": []}
    for i, q in enumerate(queries):
        t0 = time.perf_counter()
        qv = st.encode(
            [q], normalize_embeddings=True, convert_to_numpy=True, show_progress_bar=False
        )
        raw.search(qv.astype(np.float32), cfg.k)
        t1 = time.perf_counter()
        engine.search_many([q], cfg.k, "dense")
        t2 = time.perf_counter()
        engine.search_many([q], cfg.k, "hybrid")
        t3 = time.perf_counter()
        if i >= 10:  # warm-up
            lat["raw"].append(t1 - t0)
            lat["dense"].append(t2 - t1)
            lat["hybrid"].append(t3 - t2)
    res = {k: percentiles(v) for k, v in lat.items()}
    res["dense_overhead_p50"] = res["dense"]["p50_ms"] / res["raw"]["p50_ms"] - 1
    res["dense_overhead_p99"] = res["dense"]["p99_ms"] / res["raw"]["p99_ms"] - 1
    res["bm25_build_s"] = bm25_build
    return res


def run(cfg: LatencyConfig) -> dict:
    """Every size; writes results.json and run.json and returns the summary."""
    import torch

    from rag.encoding import Encoder

    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    encoder = Encoder.load(cfg.encoder, device="cpu")
    queries = make_queries(cfg.queries + 10)
    results = {}
    for n in size_list(cfg):
        r = bench_size(n, cfg, encoder, queries)
        results[str(n)] = r
        print(
            f"{n:>7} chunks: raw p50 {r['raw']['p50_ms']:.1f} ms p99 {r['raw']['p99_ms']:.1f} | dense p50 "
            f"{r['dense']['p50_ms']:.1f} p99 {r['dense']['p99_ms']:.1f} (overhead {100 * r['dense_overhead_p50']:+.1f}%) | "
            f"hybrid p50 {r['hybrid']['p50_ms']:.1f} p99 {r['hybrid']['p99_ms']:.1f}",
            file=sys.stderr,
        )
    out = Path(cfg.out) if cfg.out else rag_home() / "benchmarks" / "search_latency"
    out.mkdir(parents=True, exist_ok=True)
    summary = {
        "config": asdict(cfg),
        "results": results,
        "load_average": os.getloadavg(),
        "hardware": f"{platform.machine()}, {os.cpu_count()} CPUs, torch threads {torch.get_num_threads()}",
    }
    (out / "results.json").write_text(json.dumps(summary, indent=1))
    (out / "run.json").write_text(json.dumps(asdict(cfg), indent=1))
    return summary


def build_parser() -> Any:
    return bench_parser(PROG, __doc__, LatencyConfig)


def main(argv: list[str] | None = None) -> int:
    def body(cfg: LatencyConfig, args: Any) -> None:
        summary = run(cfg)
        if args.json:
            print(json.dumps(summary, indent=1))

    return bench_main(build_parser(), LatencyConfig, check, body, argv)


if __name__ == "__main__":
    sys.exit(main())
