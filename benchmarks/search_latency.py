"""Search latency p50/p99 (query encode + search) at 10k and 100k chunks, against the raw floor
of the same work: ``SentenceTransformer.encode`` + a bare ``faiss.IndexFlatIP`` search; with
``--rerank``, also the full default query path with a cross-encoder rerank stage.

``python -m benchmarks.search_latency [--sizes 10000,100000] [--queries 200] [--k 10]
[--encoder minilm] [--text-words 180] [--rerank minilm-rerank [--rerank-depth 10 20 30]
[--rerank-max-length 256] [--rerank-precision fp32|int8]] [--json]``

Chunk vectors are synthetic (random unit vectors) so a 100k index needs no hours of encoding;
the query path is real (the encoder runs per query, one query at a time as a user asks). Our
path is :class:`rag.retrieval.engine.SearchEngine`, the code both ``Retriever`` and ``CorpusRetriever``
search with. Raw and ours alternate query by query so background load hits both alike.

``--rerank MODEL`` adds one row per ``--rerank-depth`` D, ``hybrid+rerank@D``: encode + dense +
BM25 + RRF fusion (the engine's default) + the cross-encoder over the best D fused candidates,
through the same engine with the reranker (the product's query path), timed in the same
query-by-query rotation as the other rows; ``rerank@D`` is that row's rerank stage alone.
``--rerank-precision int8`` quantises the cross-encoder as :func:`rag.models.precision.quantize_dynamic_int8`
does the bi-encoder (:class:`rag.retrieval.rerank.CrossEncoderReranker`, ``precision``).

Chunk texts: ``--text-words`` random words each (default 180), read by BM25 and the reranker
alike, so every row searches the same corpus. The length matters for the reranker: a
cross-encoder runs over query + passage, so its cost grows with the passage's tokens, and
ingested chunks run up to 256 encoder tokens (``rag.defaults.DEFAULT_CHUNK_TOKENS``, about
150-250 words). 180 of these words are ~210 MiniLM tokens (~225 per pair with a query, inside
the default ``--rerank-max-length`` 256); the 30-word texts of the first runs (~37 tokens) would
make reranking look several times cheaper than it is. BM25 over a 54-word vocabulary finds
nearly every query term in every long text, denser postings than real text has, so its share is
an upper bound (still under a millisecond per query at 20k chunks). ``--text-words 30``
reproduces the setting of the table in docs/benchmarks.md. Generating 100k texts takes ~1 s.

Results: ``$RAG_HOME/benchmarks/search_latency/`` (results.json with the command, run.json);
stdout gets the markdown table, or the JSON with ``--json``.
"""

from __future__ import annotations

import json
import os
import platform
import random
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from benchmarks.cli import (
    command,
    results_dir,
    save_result,
)
from rag.cli.flags import config_parser, run_config_cli
from rag.models.precision import PRECISION_SETTINGS, check_precision

PROG = "benchmarks.search_latency"
WARMUP = 10  # untimed queries per size before the timed ones

WORDS = [
    "file", "read", "write", "line", "open", "close", "loop", "list", "dict", "set", "tuple",
    "class", "object", "method", "function", "module", "import", "package", "error",
    "exception", "raise", "try", "except", "finally", "string", "bytes", "encode", "decode",
    "format", "print", "input", "output", "path", "directory", "process", "thread", "async",
    "await", "generator", "iterator", "yield", "return", "value", "type", "int", "float",
    "number", "sort", "key", "lambda", "map", "filter", "zip", "range",
]  # fmt: skip


@dataclass
class LatencyConfig:
    """What to measure."""

    sizes: str = "10000,100000"  # index sizes in chunks, comma-separated
    queries: int = 200  # timed queries per size (after 10 warm-up queries)
    k: int = 10  # hits per query (the rerank latency goal is stated at --k 5)
    encoder: str = "minilm"  # query encoder (alias or folder)
    threads: int = 0  # torch threads (0 = torch's default)
    out: str = ""  # results folder (default $RAG_HOME/benchmarks/search_latency)
    # words per synthetic chunk text, read by BM25 and the reranker (180 ~ 210 tokens, a chunk)
    text_words: int = 180
    # cross-encoder folder, alias or artefact (minilm-rerank) for the hybrid+rerank rows; none = no
    # rerank rows
    rerank: str | None = None
    # candidates the reranker re-scores, one hybrid+rerank row per depth
    rerank_depth: list[int] = field(default_factory=lambda: [10, 20, 30])
    rerank_max_length: int = 256  # tokens per query+passage pair given to the reranker
    # reranker weights: fp32, or int8 (dynamic quantisation of its Linear layers, CPU)
    rerank_precision: str = "fp32"


def size_list(cfg: LatencyConfig) -> list[int]:
    return [int(s) for s in cfg.sizes.split(",")]


def check(cfg: LatencyConfig) -> None:
    """Refuse a run that cannot happen as given (exit 2, rag.cli), before loading any model."""
    try:
        sizes = size_list(cfg)
    except ValueError:
        sizes = []
    if not sizes or min(sizes) < cfg.k:
        raise ValueError(f"--sizes takes comma-separated chunk counts >= --k, not {cfg.sizes!r}")
    lows = (("queries", 1), ("k", 1), ("threads", 0), ("text_words", 1), ("rerank_max_length", 1))
    for name, low in lows:
        if getattr(cfg, name) < low:
            flag = "--" + name.replace("_", "-")
            raise ValueError(f"{flag} must be >= {low}, not {getattr(cfg, name)}")
    depths = cfg.rerank_depth
    if not depths or min(depths) < 1 or len(set(depths)) < len(depths):
        raise ValueError(f"--rerank-depth takes distinct depths >= 1, not {depths}")
    check_precision(cfg.rerank_precision, "--rerank-precision")
    if cfg.rerank_precision != "fp32" and not cfg.rerank:
        raise ValueError(f"--rerank-precision {cfg.rerank_precision} needs --rerank MODEL")


def make_queries(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return [
        f"how do I {rng.choice(WORDS)} a {rng.choice(WORDS)} with {rng.choice(WORDS)} {rng.choice(WORDS)}"
        for _ in range(n)
    ]


def make_texts(n: int, words: int, seed: int) -> list[str]:
    """``n`` texts of ``words`` random words each (~1 s for 100k x 180 words)."""
    rng = random.Random(seed)
    return [" ".join(rng.choices(WORDS, k=words)) for _ in range(n)]


def percentiles(xs: list[float]) -> dict[str, float]:
    a = np.array(xs) * 1000
    return {
        "p50_ms": float(np.percentile(a, 50)),
        "p99_ms": float(np.percentile(a, 99)),
        "mean_ms": float(a.mean()),
    }


def rerank_rows(cfg: LatencyConfig) -> list[int]:
    """The depths that get a hybrid+rerank row: none without ``--rerank``."""
    return list(cfg.rerank_depth) if cfg.rerank else []


def bench_size(
    n: int, cfg: LatencyConfig, encoder: Any, queries: list[str], reranker: Any = None
) -> dict:
    """Every row at ``n`` chunks; rows take turns query by query (the first WARMUP untimed)."""
    import faiss

    from indexes.faiss_index import FaissIndex
    from rag.retrieval.bm25 import BM25Index
    from rag.retrieval.engine import SearchEngine
    from rag.retrieval.settings import RetrievalSettings

    rng = np.random.default_rng(n)
    vecs = rng.standard_normal((n, encoder.dim), dtype=np.float32)
    vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
    ids = [f"c{i}" for i in range(n)]
    texts = make_texts(n, cfg.text_words, seed=n)
    text_of = dict(zip(ids, texts)).__getitem__
    raw = faiss.IndexFlatIP(encoder.dim)
    raw.add(vecs)
    ours = FaissIndex(None, encoder.dim)
    ours.add(ids, vecs)
    t0 = time.perf_counter()
    bm25 = BM25Index(ids, texts)
    bm25_build = time.perf_counter() - t0
    engine = SearchEngine(encoder, ours, bm25, text_of)  # the product's retrieval settings
    depths = rerank_rows(cfg) if reranker is not None else []
    reranking = {  # one engine per depth over the same indexes: the product's path with a reranker
        d: SearchEngine(encoder, ours, bm25, text_of, reranker, RetrievalSettings(rerank_depth=d))
        for d in depths
    }
    st = encoder.model
    lat: dict[str, list[float]] = {"raw": [], "dense": [], "hybrid": []}
    lat.update({f"hybrid+rerank@{d}": [] for d in depths})
    lat.update({f"rerank@{d}": [] for d in depths})
    for i, q in enumerate(queries):
        took: dict[str, float] = {}
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
        took.update(raw=t1 - t0, dense=t2 - t1, hybrid=t3 - t2)
        for d, eng in reranking.items():
            stage = eng.timings["rerank_s"]
            t0 = time.perf_counter()
            eng.search_many([q], cfg.k, "hybrid")
            took[f"hybrid+rerank@{d}"] = time.perf_counter() - t0
            took[f"rerank@{d}"] = eng.timings["rerank_s"] - stage
        if i >= WARMUP:
            for name, seconds in took.items():
                lat[name].append(seconds)
    res: dict[str, Any] = {k: percentiles(v) for k, v in lat.items()}
    res["dense_overhead_p50"] = res["dense"]["p50_ms"] / res["raw"]["p50_ms"] - 1
    res["dense_overhead_p99"] = res["dense"]["p99_ms"] / res["raw"]["p99_ms"] - 1
    res["bm25_build_s"] = bm25_build
    return res


def load_reranker(cfg: LatencyConfig) -> Any:
    """The cross-encoder of ``--rerank`` on CPU (None without): loaded before the encoder, so a
    wrong name fails in seconds."""
    if not cfg.rerank:
        return None
    from rag.retrieval.rerank import CrossEncoderReranker

    return CrossEncoderReranker(
        cfg.rerank,
        device="cpu",
        max_length=cfg.rerank_max_length,
        precision=cfg.rerank_precision,
    )


def ms(row: dict[str, float]) -> str:
    return f"{row['p50_ms']:.1f} / {row['p99_ms']:.1f} ms"


def progress_line(n: int, r: dict, depths: list[int]) -> str:
    line = (
        f"{n:>7} chunks: raw {ms(r['raw'])} | dense {ms(r['dense'])} "
        f"(overhead {100 * r['dense_overhead_p50']:+.1f}%) | hybrid {ms(r['hybrid'])}"
    )
    for d in depths:
        line += f" | hybrid+rerank@{d} {ms(r[f'hybrid+rerank@{d}'])}"
    return line


def run(cfg: LatencyConfig) -> dict:
    """Every size; returns the summary (config, results per size, load, hardware)."""
    import torch

    from rag.retrieval.encoder import Encoder

    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    reranker = load_reranker(cfg)
    encoder = Encoder.load(cfg.encoder, device="cpu", precision="fp32")
    queries = make_queries(cfg.queries + WARMUP)
    depths = rerank_rows(cfg)
    results = {}
    for n in size_list(cfg):
        r = bench_size(n, cfg, encoder, queries, reranker)
        results[str(n)] = r
        print(progress_line(n, r, depths), file=sys.stderr)
    summary: dict[str, Any] = {
        "config": asdict(cfg),
        "results": results,
        "load_average": os.getloadavg(),
        "hardware": f"{platform.machine()}, {os.cpu_count()} CPUs, torch threads {torch.get_num_threads()}",
    }
    if reranker is not None:
        summary["rerank"] = {
            "model": cfg.rerank,
            "depths": depths,
            "max_length": cfg.rerank_max_length,
            "precision": cfg.rerank_precision,
        }
    return summary


def markdown(summary: dict) -> str:
    """The results as the table of docs/benchmarks.md, one column per rerank depth."""
    cfg = summary["config"]
    depths = summary.get("rerank", {}).get("depths", [])
    head = ["chunks", "raw p50 / p99", "dense p50 / p99", "dense overhead p50", "hybrid p50 / p99"]
    head += [f"hybrid+rerank@{d} p50 / p99" for d in depths]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for n, r in summary["results"].items():
        cells = [f"{int(n):,}", ms(r["raw"]), ms(r["dense"])]
        cells += [f"{100 * r['dense_overhead_p50']:+.1f} %", ms(r["hybrid"])]
        cells += [ms(r[f"hybrid+rerank@{d}"]) for d in depths]
        lines.append("| " + " | ".join(cells) + " |")
    note = f"k = {cfg['k']}, {cfg['text_words']}-word texts, {cfg['queries']} timed queries"
    if depths:
        note += (
            f"; reranker {cfg['rerank']} ({cfg['rerank_precision']}, "
            f"max_length {cfg['rerank_max_length']})"
        )
    return "\n".join([*lines, "", f"{note}; {summary['hardware']}"])


def build_parser() -> Any:
    choices = {"rerank_precision": PRECISION_SETTINGS}
    return config_parser(f"python -m {PROG}", __doc__, LatencyConfig, choices=choices)


def main(argv: list[str] | None = None) -> int:
    def measure(cfg: LatencyConfig) -> dict:
        summary = run(cfg)
        folder = results_dir(cfg.out, "search_latency")
        (folder / "run.json").write_text(json.dumps(asdict(cfg), indent=1))
        save_result(summary, folder, command(PROG, argv))
        return summary

    return run_config_cli(
        build_parser(), LatencyConfig, measure, argv, check=check, report=markdown
    )


if __name__ == "__main__":
    sys.exit(main())
