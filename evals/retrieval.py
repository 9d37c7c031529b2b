"""Retrieval evaluation on a BEIR folder or a SQuAD file, through the project's own retriever.

The retriever is ``rag.retrieve.CorpusRetriever`` (the code the RAG system searches with, not a
copy), metrics come from ``pytrec_eval`` via :mod:`evals.metrics`. BEIR conventions: documents are
title + text, ids are strings, a document whose id equals the query id is not counted (BEIR's
``ignore_identical_ids``), 100 results per query.

Query sets: ``--queries dev`` is SciFact's fixed dev split (20% of the train claims, by seed) for a
BEIR folder, and the fixed held-out articles for SQuAD; ``train`` is the rest; ``all`` everything.
The corpus is always the whole corpus.

CLI::

    python -m evals.retrieval --dataset ../shared/data/scifact --split train --queries dev \\
        --retriever hybrid --encoder minilm --out scifact-dev-hybrid.json
    python -m evals.retrieval --dataset squad:../shared/data/squad/squad-v1.1-dev-part.json \\
        --queries dev --retriever bm25
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from evals.datasets import (
    DatasetError,
    RetrievalDataset,
    load_beir,
    load_squad,
    scifact_split,
    squad_split,
)
from evals.metrics import exclude_self_hits, retrieval_metrics


@dataclass
class RetrievalEvalConfig:
    """One retrieval evaluation; every field is written to the output JSON."""

    dataset: str = ""  # BEIR folder, or squad:FILE (a .json path also means SQuAD)
    split: str = "test"  # BEIR qrels split (qrels/<split>.tsv); ignored for SQuAD
    queries: str = "all"  # dev | train | all (fixed splits, see module docstring)
    retriever: str = "bm25"  # bm25 | dense | hybrid (reciprocal rank fusion of the two)
    encoder: str = "minilm"  # alias, folder or SentenceTransformer for dense / hybrid
    rerank: str | None = None  # cross-encoder folder for rag's optional rerank stage
    k: int = 100  # results per query (Recall@100 / MAP@100 need 100)
    limit: int = 0  # evaluate only the first N queries (0 = all), for quick checks
    device: str = "auto"  # auto | cpu | cuda


def load_eval_dataset(spec: str, split: str = "test", queries: str = "all") -> RetrievalDataset:
    """The dataset with its query set chosen by ``queries`` (dev | train | all)."""
    if queries not in ("dev", "train", "all"):
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


MODES = ("bm25", "dense", "hybrid")


def _build_mode(modes: list[str]) -> str:
    """The CorpusRetriever mode that can serve every one of ``modes`` from one index."""
    return modes[0] if len(set(modes)) == 1 else "hybrid"


def make_retriever(
    ds: RetrievalDataset, cfg: RetrievalEvalConfig, encoder=None, mode: str | None = None
):
    """``rag.retrieve.CorpusRetriever`` over the whole corpus (title + text per document).

    ``encoder`` may be an already loaded SentenceTransformer (the experiment passes its fine-tuned
    models); otherwise ``cfg.encoder`` is loaded by rag for dense and hybrid modes. ``mode``
    (default ``cfg.retriever``) decides which indexes are built; ``hybrid`` builds both.
    """
    from rag.models import load_embedder
    from rag.retrieve import CorpusRetriever

    mode = mode or cfg.retriever
    ids = list(ds.corpus)
    texts = [ds.doc_text(i) for i in ids]
    enc = None
    if mode != "bm25":
        enc = encoder if encoder is not None else load_embedder(cfg.encoder, device=cfg.device)
    reranker = None
    if cfg.rerank:
        from rag.retrieve import CrossEncoderReranker

        reranker = CrossEncoderReranker(cfg.rerank, device=cfg.device)
    return CorpusRetriever(
        ids, texts, enc, mode, reranker=reranker, device=cfg.device, depth=max(cfg.k, 100)
    )


def run_retrieval(
    ds: RetrievalDataset, retriever, k: int = 100, mode: str | None = None
) -> dict[str, dict[str, float]]:
    """``{query_id: {doc_id: score}}`` for every query, self-hits removed."""
    qids = list(ds.queries)
    results = retriever.search_many([ds.queries[q] for q in qids], k, mode)
    run = {q: {d: float(s) for d, s in hits} for q, hits in zip(qids, results)}
    return exclude_self_hits(run)


def evaluate_modes(
    cfg: RetrievalEvalConfig, modes: list[str], encoder=None, ds: RetrievalDataset | None = None
) -> list[dict]:
    """Score several retrieval modes over ONE index build (the corpus is encoded once), one
    result dict per mode; ``cfg.retriever`` is ignored."""
    if bad := [m for m in modes if m not in MODES]:
        raise ValueError(f"--retriever must be bm25, dense or hybrid, not {bad[0]!r}")
    if ds is None:
        ds = load_eval_dataset(cfg.dataset, cfg.split, cfg.queries)
    if cfg.limit:
        ds = ds.subset(list(ds.queries)[: cfg.limit])
    if not ds.queries:
        raise DatasetError(f"{cfg.dataset}: no queries with relevance judgements to evaluate")
    t0 = time.perf_counter()
    retriever = make_retriever(ds, cfg, encoder, _build_mode(modes))
    t_index = time.perf_counter() - t0
    out = []
    for mode in modes:
        t1 = time.perf_counter()
        run = run_retrieval(ds, retriever, cfg.k, mode)
        t_search = time.perf_counter() - t1
        metrics = retrieval_metrics(ds.qrels, run)
        out.append(
            {
                "config": {**asdict(cfg), "retriever": mode},
                "dataset": ds.name,
                "n_queries": len(ds.queries),
                "n_docs": len(ds.corpus),
                "metrics": {m: round(v, 4) for m, v in metrics.items()},
                "corpus_encode_s": round(t_index, 2),
                "index_shared_by": list(modes) if len(modes) > 1 else None,
                "search_s": round(t_search, 2),
                "search_ms_per_query": round(1000 * t_search / len(ds.queries), 2),
                "retriever_timings": {
                    k: round(v, 3)
                    for k, v in retriever.timings.items()
                    if isinstance(v, (int, float))
                },
                "hardware": f"{platform.machine()}, {os.cpu_count()} CPUs",
            }
        )
    return out


def evaluate(cfg: RetrievalEvalConfig, encoder=None, ds: RetrievalDataset | None = None) -> dict:
    """Load, index, search, score one mode (``cfg.retriever``): settings, metrics, timings."""
    return evaluate_modes(cfg, [cfg.retriever], encoder, ds)[0]


def _line(r: dict) -> str:
    m, c = r["metrics"], r["config"]
    return (
        f"{r['dataset']} {c['retriever']}"
        + (f" ({c['encoder']})" if c["retriever"] != "bm25" else "")
        + f": nDCG@10 {m['ndcg@10']:.4f}  R@10 {m['recall@10']:.4f}  R@100 {m['recall@100']:.4f}"
        f"  MRR@10 {m['mrr@10']:.4f}  MAP@100 {m['map@100']:.4f}  ({r['n_queries']} queries,"
        f" {r['n_docs']} docs, index {r['corpus_encode_s']}s, search {r['search_s']}s)"
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m evals.retrieval", description=__doc__.split("\n\n")[0]
    )
    p.add_argument("--dataset", required=True, help="BEIR folder, or squad:FILE")
    p.add_argument("--split", default="test", help="BEIR qrels split (default: test)")
    p.add_argument("--queries", default="all", choices=["dev", "train", "all"])
    p.add_argument(
        "--retriever",
        nargs="+",
        default=["bm25"],
        choices=MODES,
        help="one or more modes; several share one index build (one JSON list in --out)",
    )
    p.add_argument("--encoder", default="minilm", help="encoder alias or folder (dense, hybrid)")
    p.add_argument("--rerank", default=None, help="cross-encoder folder to rerank with")
    p.add_argument("--k", type=int, default=100)
    p.add_argument("--limit", type=int, default=0, help="only the first N queries")
    p.add_argument("--device", default="auto")
    p.add_argument("--out", help="write the result JSON to this file")
    p.add_argument("--json", action="store_true", help="print the result JSON on stdout")
    a = p.parse_args(argv)
    cfg = RetrievalEvalConfig(
        a.dataset, a.split, a.queries, a.retriever[0], a.encoder, a.rerank, a.k, a.limit, a.device
    )
    try:
        results = evaluate_modes(cfg, a.retriever)
    except (OSError, ValueError, LookupError, RuntimeError, ImportError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    payload = results[0] if len(results) == 1 else results
    if a.out:
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.out).write_text(json.dumps(payload, indent=2) + "\n")
    if a.json:
        print(json.dumps(payload, indent=2))
    for r in results:
        print(_line(r), file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
