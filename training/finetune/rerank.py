"""Train a cross-encoder reranker on SciFact and SQuAD train queries with mined hard negatives.

    python -m training.finetune.rerank --model minilm --out artifacts/models/minilm-rerank \\
        --scifact ../shared/data/scifact --squad ../shared/data/squad/squad-v1.1-dev-part.json \\
        --max-steps 600 --batch-size 16 --max-length 256 --threads 2

Why a cross-encoder: a bi-encoder embeds query and passage apart and compares two vectors; a
cross-encoder reads them together (every query token attends to every passage token), which ranks
better but costs one forward pass per candidate, so it re-scores only the first stage's top
``rerank_depth`` (the latency setting). The model is a sentence-transformers ``CrossEncoder``
(a sequence-classification head with one logit) initialised from any encoder: the MiniLM weights
(``minilm``), our own MLM encoder folder, or an existing CrossEncoder folder to continue from.

Data and the held-out guard: :mod:`training.data.rerank_data`. Loss: ``bce`` (pointwise binary
cross-entropy, positives up-weighted by the number of negatives per query, the recipe of
sentence-transformers' MS MARCO rerankers) or ``mnrl`` / ``cached-mnrl`` (the positive against
its hard negatives plus in-batch ones). Before and after training the model reranks the first
stage's candidates for sampled dev queries (``CrossEncoderRerankingEvaluator``; indicative: the
reported numbers come from ``python -m evals.retrieval --rerank``). The output folder loads with
``CrossEncoder(dir)`` and holds run.json, train_log.jsonl and loss.png.
"""

from __future__ import annotations

import json
import logging
import random
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rag.cli.flags import config_parser, run_config_cli
from rag.models import lm_objective, resolve_model
from training.data import pairs as P
from training.data import rerank_data as R
from training.finetune.recipe import FinetuneConfig, finetune_run

log = logging.getLogger("training.finetune.rerank")
LOSSES = ("bce", "mnrl", "cached-mnrl")
MINERS = ("bm25", "dense")


@dataclass
class RerankConfig(FinetuneConfig):
    """Everything a reranker run depends on (the training loop's settings:
    :class:`~training.finetune.recipe.FinetuneConfig`); saved as run.json beside the model."""

    model: str = "minilm"  # encoder to start from: alias, our MLM encoder folder, or a CrossEncoder
    scifact: str | None = None  # BEIR SciFact folder: train claims (the dev fifth is never used)
    squad: str | None = None  # SQuAD v1.1 JSON: questions of the train articles only
    docs: list[str] = field(default_factory=list)  # your documents: inverse-cloze/heading pairs
    pairs: list[str] = field(default_factory=list)  # JSONL {"anchor","positive"[,"negative"]}
    max_doc_pairs: int = 2000  # cap on pairs mined from --docs
    max_queries: int = 0  # cap per source, sampled by seed (0 = all)
    negatives: int = 4  # hard negatives per query
    random_negatives: int = 0  # extra random (easy) negatives per query, never a positive
    mine: list[str] = field(default_factory=lambda: list(MINERS))  # miners: bm25 and/or dense
    mine_encoder: str = "minilm"  # bi-encoder of the dense miner (and of the dev first stage)
    mine_depth: int = 30  # candidates per miner that negatives are drawn from
    mine_skip: int = 0  # skip each miner's top N (they may be unlabelled positives)
    loss: str = "bce"  # bce | mnrl | cached-mnrl
    mini_batch_size: int = 16  # cached-mnrl: forward chunk size (memory), not the batch size
    max_length: int = 256  # tokens per (query, passage) pair, training and inference (saved)
    rerank_depth: int = 50  # first-stage candidates reranked in the dev eval (latency setting)
    batch_size: int = 16  # rows per batch: (query, passage) pairs for bce, queries for mnrl
    eval: bool = True  # rerank dev candidates before and after training
    eval_max_queries: int = 50  # dev queries per set for that eval (0 = all)
    eval_batch_size: int = 32  # pairs per forward pass in evaluation


# ---------------------------------------------------------------------------- model


def build_model(name: str, max_length: int = 256, device: str = "cpu") -> Any:
    """A one-logit CrossEncoder: an existing CrossEncoder folder is loaded as it is; any encoder
    (a SentenceTransformer folder such as ``minilm``, a plain HF or our MLM folder) gets a fresh
    sequence-classification head on its weights. A causal LM is refused: sentence-transformers
    would score it by yes/no token logits, which our tokenizers do not have."""
    from sentence_transformers import CrossEncoder
    from transformers import AutoConfig

    path = resolve_model(name)
    st_cfg = path / "config_sentence_transformers.json"
    is_ce = st_cfg.is_file() and json.loads(st_cfg.read_text()).get("model_type") == "CrossEncoder"
    if not is_ce and lm_objective(AutoConfig.from_pretrained(str(path))) == "clm":
        raise ValueError(f"--model {name}: a causal LM; a reranker starts from an encoder")
    kw = {} if is_ce else {"num_labels": 1}
    model = CrossEncoder(
        str(path), device=device, local_files_only=True, max_length=max_length, **kw
    )
    model.max_seq_length = max_length
    tok = model.tokenizer
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token or tok.unk_token
    return model


# ---------------------------------------------------------------------------- data


def _pools(cfg: RerankConfig, held: R.Heldout) -> list[R.Pool]:
    pools = []
    if cfg.scifact:
        pools.append(R.scifact_pool(cfg.scifact, held, cfg.max_queries, cfg.seed))
    if cfg.squad:
        pools.append(R.squad_pool(cfg.squad, held, cfg.max_queries, cfg.seed))
    if cfg.docs:
        docs = P.load_doc_sources(cfg.docs)
        if not docs:
            raise ValueError(f"--docs {' '.join(cfg.docs)}: no loadable documents")
        mined = P.unsupervised_pairs(
            docs, seed=cfg.seed, kinds=("ict", "heading"), max_pairs=cfg.max_doc_pairs or None
        )
        pools.append(R.pairs_pool(mined, "docs", held))
    if cfg.pairs:
        pools.append(R.pairs_pool([p for f in cfg.pairs for p in P.read_pairs(f)], "pairs", held))
    pools = [p for p in pools if p.queries]
    if not pools:
        raise ValueError("no training queries: give --scifact, --squad, --docs and/or --pairs")
    return pools


def collect_examples(
    cfg: RerankConfig, encoder: Any = None
) -> tuple[list[R.RerankExample], dict[str, Any]]:
    """Every source's examples with mined negatives, shuffled, checked against the dev splits;
    also {pool kind: (retriever, corpus)} (the dev eval's first stage reuses them)."""
    from rag.retrieval.retriever import CorpusRetriever
    from rag.retrieval.settings import RetrievalSettings

    if bad := [m for m in cfg.mine if m not in MINERS]:
        raise ValueError(f"--mine must be among {', '.join(MINERS)}, not {bad[0]!r}")
    held = R.heldout(cfg.scifact, cfg.squad)
    examples: list[R.RerankExample] = []
    retrievers: dict[str, Any] = {}
    for pool in _pools(cfg, held):
        ids = list(pool.corpus)
        mode = "hybrid" if "dense" in cfg.mine else "bm25"
        enc = encoder if mode == "hybrid" else None
        settings = RetrievalSettings(mode=mode, fusion="rrf", rerank=None)  # as first measured
        retriever = CorpusRetriever(ids, [pool.corpus[i] for i in ids], enc, settings)
        retrievers[pool.kind] = (retriever, pool.corpus)
        examples += R.mine_pool(
            pool,
            lambda qs, k, m, r=retriever: r.search_many(qs, k, m),
            cfg.mine,
            cfg.negatives,
            cfg.mine_depth,
            cfg.mine_skip,
            cfg.seed,
            cfg.random_negatives,
        )
    R.assert_no_heldout(examples, held)
    random.Random(cfg.seed).shuffle(examples)
    return examples, retrievers


def dev_evaluators(cfg: RerankConfig, retrievers: dict[str, Any]) -> list:
    """Rerank evaluators over the first stage's top ``rerank_depth`` for sampled dev queries
    (SciFact dev claims, SQuAD dev-article questions), never trained on."""
    from sentence_transformers.cross_encoder.evaluation import CrossEncoderRerankingEvaluator

    from rag.evaluation.datasets import load_beir, load_squad, scifact_split, squad_split

    sets = []
    if cfg.scifact and "scifact" in retrievers:
        ds = load_beir(cfg.scifact, "train")
        sets.append(("scifact-dev", ds, scifact_split(ds)[1], *retrievers["scifact"]))
    if cfg.squad and "squad" in retrievers:
        ds = load_squad(cfg.squad, articles=squad_split(cfg.squad)[1])
        sets.append(("squad-dev", ds, sorted(ds.queries), *retrievers["squad"]))
    out = []
    for name, ds, qids, retriever, corpus in sets:
        if cfg.eval_max_queries and len(qids) > cfg.eval_max_queries:
            qids = sorted(random.Random(cfg.seed).sample(qids, cfg.eval_max_queries))
        rows = retriever.search_many([ds.queries[q] for q in qids], cfg.rerank_depth)
        samples = [
            {
                "query": ds.queries[q],
                "positive": [ds.doc_text(d) for d in ds.qrels[q]],
                "documents": [corpus[d] for d, _ in row],
            }
            for q, row in zip(qids, rows)
        ]
        out.append(
            CrossEncoderRerankingEvaluator(
                samples,
                at_k=10,
                always_rerank_positives=False,
                name=name,
                batch_size=cfg.eval_batch_size,
                write_csv=False,
            )
        )
    return out


def evaluate(model: Any, evaluators: list) -> dict[str, dict[str, float]]:
    """{set: {ndcg@10, mrr@10, base_ndcg@10, base_mrr@10, n_queries}} per dev evaluator."""
    out = {}
    for ev in evaluators:
        res = ev(model)
        keys = ("ndcg@10", "mrr@10", "base_ndcg@10", "base_mrr@10")
        out[ev.name] = {k: round(float(res[f"{ev.name}_{k}"]), 4) for k in keys}
        out[ev.name]["n_queries"] = len(ev.samples)
    return out


# ---------------------------------------------------------------------------- training


def train_rerank(cfg: RerankConfig) -> dict[str, Any]:
    """Mine, evaluate, train, save, evaluate again; returns the run summary (run.json)."""
    return fit(cfg)[1]


def fit(cfg: RerankConfig) -> tuple[Any, dict[str, Any]]:
    """:func:`train_rerank`, also returning the trained CrossEncoder (tests compare it with what
    loads from disk)."""
    from sentence_transformers.base.sampler import BatchSamplers
    from sentence_transformers.cross_encoder import (
        CrossEncoderTrainer,
        CrossEncoderTrainingArguments,
    )

    from rag.models import load_embedder

    if cfg.loss not in LOSSES:
        raise ValueError(f"--loss must be one of {', '.join(LOSSES)}, not {cfg.loss!r}")
    if cfg.negatives < 1 or cfg.max_length < 8 or cfg.rerank_depth < 1:
        raise ValueError("--negatives and --rerank-depth must be positive, --max-length >= 8")
    with finetune_run(cfg, "rerank") as run:
        model = build_model(cfg.model, cfg.max_length, run.device)
        dense = "dense" in cfg.mine
        encoder = load_embedder(cfg.mine_encoder, device=run.device) if dense else None
        examples, retrievers = collect_examples(cfg, encoder)
        kinds: dict[str, int] = {}
        for ex in examples:
            kinds[ex.kind] = kinds.get(ex.kind, 0) + 1
        train_ds = R.to_dataset(examples, "bce" if cfg.loss == "bce" else "mnrl", cfg.seed)
        log.info("%d queries %s, %d training rows", len(examples), kinds, len(train_ds))
        t_data = time.time() - run.started

        evaluators = dev_evaluators(cfg, retrievers) if cfg.eval else []
        before = evaluate(model, evaluators)
        run.event(event="eval_before", **{k: v["ndcg@10"] for k, v in before.items()})

        pointwise = cfg.loss == "bce"  # rows are (query, passage, label): duplicates are fine
        args = run.training_args(
            CrossEncoderTrainingArguments,
            batch_sampler=BatchSamplers.BATCH_SAMPLER if pointwise else BatchSamplers.NO_DUPLICATES,
            dataloader_drop_last=not pointwise,
        )
        run.train(CrossEncoderTrainer, args, model, train_ds, loss=_loss(cfg, model))
        model.save(str(run.out))

        after = evaluate(model, evaluators)
        run.event(event="eval_after", **{k: v["ndcg@10"] for k, v in after.items()})
        summary = run.finish(
            f"reranker {Path(cfg.model).name} ({cfg.loss})",
            {
                "n_queries": len(examples),
                "query_kinds": kinds,
                "n_rows": len(train_ds),
                "settings": {"max_length": cfg.max_length, "rerank_depth": cfg.rerank_depth},
                "before": before,
                "after": after,
                "data_seconds": round(t_data, 1),
            },
        )
    return model, summary


def _loss(cfg: RerankConfig, model: Any) -> Any:
    import torch
    from sentence_transformers.cross_encoder import losses

    if cfg.loss == "bce":  # one positive per `negatives` negatives: weigh positives up to match
        n_neg = cfg.negatives + cfg.random_negatives
        return losses.BinaryCrossEntropyLoss(model, pos_weight=torch.tensor(float(n_neg)))
    if cfg.loss == "mnrl":
        return losses.MultipleNegativesRankingLoss(model)
    return losses.CachedMultipleNegativesRankingLoss(model, mini_batch_size=cfg.mini_batch_size)


def reranker_config(
    out: str | Path, data: Path, device: str = "auto", threads: int = 0
) -> RerankConfig:
    """The ``make models`` recipe of ``minilm-rerank``, the measured one (docs/retrieval.md,
    with its timing and the history behind it): MiniLM with a fresh one-logit head on SciFact
    train claims, 2,000 SQuAD train-article questions and 300 pairs from the project's docs/;
    per query 2 hard negatives (BM25 and MiniLM, interleaved) and 2 random ones (without them
    the fresh head did not learn); 1,400 steps of 16 pairs at 7e-5, 192 tokens per pair."""
    return RerankConfig(
        model="minilm",
        out=str(out),
        scifact=str(data / "scifact"),
        squad=str(data / "squad" / "squad-v1.1-dev-part.json"),
        docs=[str(Path(__file__).resolve().parents[2] / "docs")],  # the project's docs/
        max_doc_pairs=300,
        max_queries=2000,
        negatives=2,
        random_negatives=2,
        max_steps=1400,
        batch_size=16,
        lr=7e-5,
        max_length=192,
        rerank_depth=20,
        eval_max_queries=40,
        device=device,
        threads=threads,
    )


# ---------------------------------------------------------------------------- CLI


def _report(summary: dict) -> str:
    lines = []
    for name in summary["before"]:
        b, a = summary["before"][name], summary["after"][name]
        lines.append(
            f"{name}: rerank nDCG@10 {b['ndcg@10']:.4f} -> {a['ndcg@10']:.4f}"
            f" (first stage {a['base_ndcg@10']:.4f})"
        )
    lines.append(
        f"saved {summary['out']} ({summary['n_queries']} queries, {summary['n_rows']} rows,"
        f" {summary['steps']} steps)"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = config_parser("python -m training.finetune.rerank", __doc__, RerankConfig)
    return run_config_cli(
        parser, RerankConfig, train_rerank, argv, report=_report, logs_to_stderr=True
    )


if __name__ == "__main__":
    sys.exit(main())
