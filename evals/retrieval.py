"""Retrieval evaluation on a BEIR folder or a SQuAD file, through the project's own retriever.

The retriever is ``rag.retrieval.retriever.CorpusRetriever`` (the code the RAG system searches with, not a
copy), metrics come from ``pytrec_eval`` via :mod:`rag.evaluation.metrics`. BEIR conventions: documents are
title + text, ids are strings, a document whose id equals the query id is not counted (BEIR's
``ignore_identical_ids``), 100 results per query.

Query sets: ``--queries dev`` is SciFact's fixed dev split (20% of the train claims, by seed) for a
BEIR folder, and the fixed held-out articles for SQuAD; ``train`` is the rest; ``all`` everything.
The corpus is always the whole corpus.

Rows: each ``--retriever`` mode; ``hybrid`` once per ``--fusion`` (``rrf``: reciprocal rank
fusion, plain at the default weight; ``convex``: normalised scores, weight chosen on the train
queries); with ``--rerank`` each row (or those named by ``--rerank-on``) again with the
cross-encoder on top, once per ``--rerank-weight`` (the reranker's share of the interpolated
score, :func:`rag.retrieval.fusion.interpolate`; ``default``: chosen on the train queries, as ``alpha``).
``--latency`` searches one query at a time and reports p50/p90 latency.

The corpus is encoded once per command (every row searches one index build) and its vectors are
kept in ``$RAG_HOME/cache/embeddings`` (:mod:`rag.retrieval.embedding_cache`), so a later run with
the same encoder and corpus encodes nothing; each row's ``embedding_cache`` says hits and misses
(``--no-embedding-cache`` encodes afresh, as a timing run should).

CLI::

    python -m evals.retrieval --dataset ../shared/data/scifact --split train --queries dev \\
        --retriever hybrid --encoder minilm --out scifact-dev-hybrid.json
    python -m evals.retrieval --dataset squad:../shared/data/squad/squad-v1.1-dev-part.json \\
        --queries dev --retriever bm25
    python -m evals.retrieval --dataset ../shared/data/scifact --split train --queries dev \\
        --retriever bm25 dense hybrid --fusion rrf convex --rerank minilm-rerank \\
        --rerank-on hybrid --rerank-depth 50 --rerank-weight 1 default --latency \\
        --out scifact-dev-table.json
"""

from __future__ import annotations

import argparse
import functools
import os
import platform
import random
import sys
import time
from dataclasses import asdict, dataclass, replace
from typing import ClassVar

import numpy as np

from evals.retrieval_rows import (
    choose_alphas,
    choose_rerank_weights,
    parse_alpha,
    parse_rerank_weight,
    table_rows,
)
from rag.cli import run_cli
from rag.cli.flags import add_result_args, config_from_args, dataclass_parser, write_result
from rag.defaults import MODES
from rag.evaluation.datasets import (
    DatasetError,
    RetrievalDataset,
    load_beir,
    load_squad,
    scifact_split,
    squad_split,
)
from rag.evaluation.metrics import exclude_self_hits, mean_per_query, per_query_retrieval
from rag.models.precision import PRECISION_SETTINGS
from rag.retrieval.embedding_cache import EmbeddingCache, cache_stats
from rag.retrieval.fusion import FUSIONS, NORMS

QUERY_SETS = ("dev", "train", "all")  # fixed splits, see the module docstring


@dataclass
class RetrievalEvalConfig:
    """One retrieval evaluation; every field is written to the output JSON."""

    dataset: str = ""  # BEIR folder, or squad:FILE (a .json path also means SQuAD)
    split: str = "test"  # BEIR qrels split (qrels/<split>.tsv); ignored for SQuAD
    queries: str = "all"  # dev | train | all (fixed splits, see module docstring)
    retriever: str = "bm25"  # bm25 | dense | hybrid (reciprocal rank fusion of the two)
    encoder: str = "minilm"  # alias, folder or SentenceTransformer for dense / hybrid
    # encoder weights (rag.models.precision): fp32 | bf16 | int8 | auto (bf16 on CUDA, and on a CPU
    # only where a cached probe measured it faster; the default); each row records the one that ran
    precision: str = "auto"
    rerank: str | None = None  # cross-encoder folder or artefact name (e.g. minilm-rerank)
    k: int = 100  # results per query (Recall@100 / MAP@100 need 100)
    limit: int = 0  # evaluate only the first N queries (0 = all), for quick checks
    device: str = "auto"  # auto | cpu | cuda
    fusion: str = "rrf"  # hybrid fusion: rrf | convex (rag.retrieval.fusion); the CLI takes several
    alpha: str = "default"  # dense weight in [0, 1] | auto | default (rrf 0.5, convex auto)
    norm: str = "minmax"  # convex fusion's score normalisation: minmax | zscore
    tune_queries: str = "train"  # query set alpha is chosen on (auto): never the reported one
    tune_limit: int = 500  # at most this many tuning queries (fixed sample; 0 = all)
    rerank_depth: int = 100  # candidates the cross-encoder re-scores (sets query latency)
    rerank_max_length: int | None = None  # tokens per query+passage pair (None: the model's)
    rerank_precision: str = (
        "fp32"  # cross-encoder weights (rag.models.precision): auto|fp32|bf16|int8
    )
    rerank_on: list[str] | None = None  # rows to rerank (bm25, dense, hybrid, hybrid-convex)
    # reranker's share of a reranked row's score in [0, 1] (1 = reranker only, 0 = first stage)
    # | default (chosen on --tune-queries, as alpha); the CLI takes several (one row each)
    rerank_weight: str = "1.0"
    latency: bool = False  # search one query at a time and report p50/p90 latency
    # corpus vectors from / into $RAG_HOME/cache/embeddings (rag.retrieval.embedding_cache), keyed
    # by the encoder's weights, modules, precision and the corpus text: a rerun encodes nothing
    embedding_cache: bool = True

    # value sets (argparse choices, rag.cli.flags); the CLI takes several modes and fusions
    CHOICES: ClassVar[dict[str, tuple[str, ...]]] = {
        "queries": QUERY_SETS,
        "tune_queries": QUERY_SETS,
        "retriever": MODES,
        "fusion": FUSIONS,
        "norm": NORMS,
        "rerank_precision": PRECISION_SETTINGS,
        "precision": PRECISION_SETTINGS,
    }


def load_eval_dataset(spec: str, split: str = "test", queries: str = "all") -> RetrievalDataset:
    """The dataset with its query set chosen by ``queries`` (dev | train | all)."""
    if queries not in QUERY_SETS:
        raise DatasetError(f"--queries must be dev, train or all, not {queries!r}")
    is_squad = spec.startswith("squad:") or spec.endswith(".json")
    if is_squad:
        path = spec.removeprefix("squad:")
        if queries == "all":
            return load_squad(path)
        train, dev = squad_split(path)
        ds = load_squad(path, articles=dev if queries == "dev" else train)
        ds.name = f"{ds.name}-{queries}"
        return ds
    ds = load_beir(spec, split)
    if queries == "all":
        return ds
    train, dev = scifact_split(ds)
    return ds.subset(dev if queries == "dev" else train, name=f"{ds.name}-{queries}")


def _build_mode(modes: list[str]) -> str:
    """The CorpusRetriever mode that can serve every one of ``modes`` from one index."""
    return modes[0] if len(set(modes)) == 1 else "hybrid"


def make_retriever(
    ds: RetrievalDataset,
    cfg: RetrievalEvalConfig,
    encoder=None,
    mode: str | None = None,
    embeddings: EmbeddingCache | None = None,
):
    """``rag.retrieval.retriever.CorpusRetriever`` over the whole corpus (title + text per document).

    ``encoder`` may be an already loaded SentenceTransformer (the experiment passes its fine-tuned
    models), run as it is; otherwise ``cfg.encoder`` is loaded by rag for dense and hybrid modes,
    in ``cfg.precision``. ``mode``
    (default ``cfg.retriever``) decides which indexes are built; ``hybrid`` builds both.
    ``embeddings``: the command's corpus-embedding cache (None: encode afresh).
    """
    from rag.retrieval.encoder import Encoder
    from rag.retrieval.rerank import load_reranker
    from rag.retrieval.retriever import CorpusRetriever
    from rag.retrieval.settings import RetrievalSettings

    mode = mode or cfg.retriever
    ids = list(ds.corpus)
    texts = [ds.doc_text(i) for i in ids]
    enc = None
    if mode != "bm25":  # a model passed in runs as given; cfg.precision is for cfg.encoder
        enc = encoder
        if enc is None:
            enc = Encoder.load(cfg.encoder, device=cfg.device, precision=cfg.precision)
    # every row passes its own fusion, alpha and rerank weight to the search (evaluate_modes),
    # so those two (strings here: "default", "auto") only need a valid placeholder
    settings = RetrievalSettings.from_config(
        cfg, mode=mode, alpha=0.5, rerank_weight=0.5, depth=max(cfg.k, 100)
    )
    return CorpusRetriever(
        ids,
        texts,
        enc,
        settings,
        reranker=load_reranker(settings),
        progress=True,  # a bar on a terminal, else a line every $RAG_PROGRESS_INTERVAL s
        embeddings=embeddings,
    )


def run_retrieval(
    ds: RetrievalDataset, retriever, k: int = 100, mode: str | None = None, **options
) -> dict[str, dict[str, float]]:
    """``{query_id: {doc_id: score}}`` for every query, self-hits removed (``options``:
    ``settings`` (this row's, whole) and ``rerank`` for :meth:`CorpusRetriever.search_many`)."""
    return timed_retrieval(ds, retriever, k, mode, per_query=False, **options)[0]


def timed_retrieval(
    ds: RetrievalDataset, retriever, k: int, mode: str | None, per_query: bool, **options
) -> tuple[dict[str, dict[str, float]], list[float]]:
    """:func:`run_retrieval` plus per-query latencies in ms (``per_query``: one query at a time,
    as a user searches; else one batch, and no latencies)."""
    qids = list(ds.queries)
    texts = [ds.queries[q] for q in qids]
    latencies: list[float] = []
    if per_query:
        results = []
        for text in texts:
            t0 = time.perf_counter()
            results += retriever.search_many([text], k, mode, **options)
            latencies.append(1000 * (time.perf_counter() - t0))
    else:
        results = retriever.search_many(texts, k, mode, **options)
    run = {q: {d: float(s) for d, s in hits} for q, hits in zip(qids, results)}
    return exclude_self_hits(run), latencies


def evaluate_modes(
    cfg: RetrievalEvalConfig,
    modes: list[str],
    encoder=None,
    ds: RetrievalDataset | None = None,
    fusions: list[str] | None = None,
    rerank_weights: list[str] | None = None,
    embeddings: EmbeddingCache | None = None,
) -> list[dict]:
    """Score several retrieval modes over ONE index build (the corpus is encoded once, or read
    from the embedding cache), one result dict per :class:`Row` (hybrid once per fusion, plus
    reranked rows when ``cfg.rerank``, once per rerank weight); ``cfg.retriever``, ``cfg.fusion``
    and ``cfg.rerank_weight`` stand for the first of ``modes``, ``fusions``, ``rerank_weights``.
    ``embeddings``: a cache shared with the caller's other evaluations (default: a new one on
    ``$RAG_HOME/cache/embeddings`` when ``cfg.embedding_cache``); its hits and misses are each
    row's ``embedding_cache``."""
    fusions = fusions or [cfg.fusion]
    rows = table_rows(cfg, modes, fusions, rerank_weights)
    if ds is None:
        ds = load_eval_dataset(cfg.dataset, cfg.split, cfg.queries)
    if cfg.limit:
        ds = ds.subset(list(ds.queries)[: cfg.limit])
    if not ds.queries:
        raise DatasetError(f"{cfg.dataset}: no queries with relevance judgements to evaluate")
    if embeddings is None and cfg.embedding_cache:
        embeddings = EmbeddingCache()
    t0 = time.perf_counter()
    retriever = make_retriever(ds, cfg, encoder, _build_mode(modes), embeddings)
    t_index = time.perf_counter() - t0
    hybrid_fusions = sorted({r.fusion for r in rows if r.fusion}, key=fusions.index)
    load_tune = functools.cache(lambda: _tuning_set(cfg))  # loaded once, if any weight is tuned
    alphas = {}
    if hybrid_fusions:
        alphas = choose_alphas(cfg, hybrid_fusions, retriever, ds, load_tune)
    tuned = choose_rerank_weights(cfg, rows, alphas, retriever, ds, load_tune)
    weights = {
        r: tuned[(r.mode, r.fusion)]["rerank_weight"] if r.weight == "default" else float(r.weight)
        for r in rows
        if r.rerank
    }
    names = [r.name(weights.get(r)) for r in rows]
    seen_targets = functools.cache(lambda: queries_with_train_targets(cfg, ds))
    out = []
    for row, name in zip(rows, names):
        settings = retriever.engine.settings
        if row.fusion:
            settings = settings.replace(fusion=row.fusion, alpha=alphas[row.fusion]["alpha"])
        if row.rerank:
            settings = settings.replace(rerank_weight=weights[row])
        options = {"rerank": row.rerank, "settings": settings}
        t1, spent = time.perf_counter(), dict(retriever.engine.timings)
        run, lat = timed_retrieval(ds, retriever, cfg.k, row.mode, cfg.latency, **options)
        t_search = time.perf_counter() - t1
        spent = {k: round(v - spent[k], 3) for k, v in retriever.engine.timings.items()}
        by_query = per_query_retrieval(ds.qrels, run)
        metrics, per_query = mean_per_query(by_query), by_query["ndcg@10"]
        config = {**asdict(cfg), "retriever": row.mode, "fusion": row.fusion}
        config |= {"alpha": alphas[row.fusion]["alpha"] if row.fusion else None}
        config |= {"rerank": cfg.rerank if row.rerank else None}
        config |= {"rerank_weight": weights.get(row)}
        out.append(
            {
                "row": name,
                "config": config,
                "fusion_tuning": alphas.get(row.fusion) if row.fusion else None,
                "rerank_tuning": tuned[(row.mode, row.fusion)] if row.weight == "default" else None,
                "dataset": ds.name,
                "n_queries": len(ds.queries),
                "n_docs": len(ds.corpus),
                "metrics": {m: round(v, 4) for m, v in metrics.items()},
                "ndcg@10_by_target": by_target(per_query, seen_targets()),
                "per_query_ndcg@10": {q: round(v, 4) for q, v in per_query.items()},
                "corpus_encode_s": round(t_index, 2),
                "index_shared_by": names if len(rows) > 1 else None,
                "embedding_cache": cache_stats(embeddings),
                "search_s": round(t_search, 2),
                "search_ms_per_query": round(1000 * t_search / len(ds.queries), 2),
                "latency_ms_p50": round(float(np.percentile(lat, 50)), 1) if lat else None,
                "latency_ms_p90": round(float(np.percentile(lat, 90)), 1) if lat else None,
                "encoder_precision": _precision(retriever),
                "retriever_timings": {
                    k: round(v, 3)
                    for k, v in retriever.timings.items()
                    if isinstance(v, (int, float))
                },
                "search_timings": spent,
                "hardware": f"{platform.machine()}, {os.cpu_count()} CPUs",
            }
        )
    return out


def _precision(retriever) -> dict | None:
    """The precision the encoder ran in and, for ``auto``, why (None without an encoder)."""
    enc = retriever.encoder
    return None if enc is None else {"ran": enc.precision, "auto_reason": enc.auto_reason or None}


def queries_with_train_targets(cfg: RetrievalEvalConfig, ds: RetrievalDataset) -> set[str] | None:
    """Reported queries with a relevant document that a *train* query of the same dataset also
    has (None unless the dev queries are reported). In SciFact most dev claims cite an abstract
    that train claims cite too, so a model trained on train claims can gain on those by learning
    which abstracts are targets; :func:`by_target` reports both groups apart."""
    if cfg.queries != "dev":
        return None
    train = load_eval_dataset(cfg.dataset, cfg.split, "train")
    targets = {d for docs in train.qrels.values() for d, g in docs.items() if g > 0}
    return {q for q in ds.queries if targets & {d for d, g in ds.qrels[q].items() if g > 0}}


def by_target(per_query: dict[str, float], seen: set[str] | None) -> dict | None:
    """Mean nDCG@10 over the queries whose relevant document is also a train query's (``seen``)
    and over the rest (``unseen``), with their counts; None when ``seen`` is None."""
    if seen is None:
        return None
    out = {}
    for group, qids in (
        ("seen", [q for q in per_query if q in seen]),
        ("unseen", [q for q in per_query if q not in seen]),
    ):
        vals = [per_query[q] for q in qids]
        out[group] = {"ndcg@10": round(sum(vals) / len(vals), 4) if vals else None, "n": len(vals)}
    return out


def _tuning_set(cfg: RetrievalEvalConfig) -> RetrievalDataset:
    """The queries a fusion or rerank weight is chosen on (``--tune-queries``, at most
    ``--tune-limit``, a fixed sample)."""
    tune = load_eval_dataset(cfg.dataset, cfg.split, cfg.tune_queries)
    if cfg.tune_limit and len(tune.queries) > cfg.tune_limit:
        keep = random.Random(0).sample(sorted(tune.queries), cfg.tune_limit)
        tune = tune.subset(sorted(keep), name=tune.name)
    return tune


def evaluate(
    cfg: RetrievalEvalConfig,
    encoder=None,
    ds: RetrievalDataset | None = None,
    embeddings: EmbeddingCache | None = None,
) -> dict:
    """Load, index, search, score one mode (``cfg.retriever``): settings, metrics, timings."""
    return evaluate_modes(cfg, [cfg.retriever], encoder, ds, embeddings=embeddings)[0]


def _line(r: dict) -> str:
    m, c = r["metrics"], r["config"]
    lat = f", p50 {r['latency_ms_p50']} ms/query" if r.get("latency_ms_p50") is not None else ""
    weighted = c.get("fusion") and (c["fusion"] == "convex" or c["alpha"] != 0.5)
    alpha = f" alpha={c['alpha']:g}" if weighted else ""
    return (
        f"{r['dataset']} {r.get('row', c['retriever'])}{alpha}"
        + (f" ({c['encoder']})" if c["retriever"] != "bm25" else "")
        + f": nDCG@10 {m['ndcg@10']:.4f}  R@10 {m['recall@10']:.4f}  R@100 {m['recall@100']:.4f}"
        f"  MRR@10 {m['mrr@10']:.4f}  MAP@100 {m['map@100']:.4f}  ({r['n_queries']} queries,"
        f" {r['n_docs']} docs, index {r['corpus_encode_s']}s{_cache_note(r)},"
        f" search {r['search_s']}s{lat})" + _target_note(r.get("ndcg@10_by_target"))
    )


def _cache_note(r: dict) -> str:
    """Where a dense or hybrid row's corpus vectors came from (the cache, or encoded and stored)."""
    c = r.get("embedding_cache")
    if not c or not c["hits"] + c["misses"] or r["config"]["retriever"] == "bm25":
        return ""
    return " (embeddings from cache)" if c["hits"] and not c["misses"] else " (embeddings stored)"


def _target_note(groups: dict | None) -> str:
    if not groups or not groups["seen"]["n"]:
        return ""
    seen, unseen = groups["seen"], groups["unseen"]
    return (
        f"  [nDCG@10 {seen['ndcg@10']:.4f} on {seen['n']} queries whose target a train query"
        f" shares, {unseen['ndcg@10'] or 0:.4f} on the other {unseen['n']}]"
    )


# --help where the field's comment is written for the config rather than the command line
CLI_HELP = {
    "retriever": "one or more modes; several share one index build (one JSON list in --out)",
    "encoder": "encoder alias or folder (dense, hybrid)",
    "precision": "encoder weights: fp32, bf16, int8 or auto (bf16 on CUDA, and on a CPU only "
    "where a short probe, cached per machine, measured it faster)",
    "fusion": "hybrid fusion(s): rrf (rank-based; alpha 0.5 = plain RRF) and/or convex "
    "(normalised scores); one row each",
    "alpha": "dense weight in [0, 1], 'auto' (chosen on --tune-queries), or 'default' "
    "(rrf: 0.5, convex: auto)",
    "rerank": "cross-encoder folder or artefact name (minilm-rerank): adds reranked rows",
    "rerank_on": "rows to rerank: bm25 dense hybrid hybrid-convex (default: all)",
    "rerank_weight": "reranker's share of the reranked score in [0, 1] (1 = reranker order, 0 = "
    "first-stage order), or 'default' (chosen on --tune-queries); several: one row each",
    "limit": "only the first N queries (0 = all)",
}


def build_parser() -> argparse.ArgumentParser:
    """RetrievalEvalConfig's flags (rag.cli.flags); ``--retriever`` and ``--fusion`` take
    several values (one row each), the config holds the row being evaluated."""
    p = dataclass_parser(
        "python -m evals.retrieval",
        __doc__,
        RetrievalEvalConfig,
        help=CLI_HELP,
        required=("dataset",),
        kwargs={
            "retriever": {"nargs": "+", "default": ["bm25"]},
            "fusion": {"nargs": "+", "default": ["rrf"]},
            "rerank": {"metavar": "DIR|NAME"},
            "rerank_on": {"metavar": "ROW"},
            "rerank_weight": {"nargs": "+", "default": ["1.0"], "metavar": "W|default"},
        },
    )
    add_result_args(p, out_file=True)
    return p


def run(a: argparse.Namespace) -> int:
    modes, fusions = a.retriever, a.fusion
    weights = [parse_rerank_weight(w) for w in a.rerank_weight]
    cfg = config_from_args(RetrievalEvalConfig, a)
    cfg = replace(cfg, retriever=modes[0], fusion=fusions[0], alpha=parse_alpha(a.alpha))
    cfg = replace(cfg, rerank_weight=weights[0])
    results = evaluate_modes(cfg, modes, fusions=fusions, rerank_weights=weights)
    payload = results[0] if len(results) == 1 else results
    write_result(payload, a.result_file, a.json)
    for r in results:
        print(_line(r), file=sys.stderr)
    return 0


def main(argv: list[str] | None = None) -> int:
    return run_cli(build_parser(), run, argv)


if __name__ == "__main__":
    raise SystemExit(main())
