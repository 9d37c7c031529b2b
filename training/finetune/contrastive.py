"""Contrastive fine-tuning of an encoder (or decoder) into a retriever, on sentence-transformers.

    python -m training.finetune.contrastive --model minilm --out artifacts/models/minilm-ft \\
        --docs ../shared/data/python-docs ../shared/data/scifact/corpus.jsonl \\
        --scifact ../shared/data/scifact --squad ../shared/data/squad/squad-v1.1-dev-part.json

Recipe: in-batch negatives with MultipleNegativesRankingLoss (or its cached, GradCache variant
for large batches on little memory), a no-duplicates batch sampler so a text never appears twice
in one batch (it would be a false negative), pairs from :mod:`training.data.pairs`. The model is
evaluated with ``InformationRetrievalEvaluator`` on the SciFact dev split and the SQuAD dev
articles before and after training (nDCG@10), both logged to ``train_log.jsonl`` and ``run.json``.

Any model folder works: a SentenceTransformer folder keeps its modules; a plain HF encoder or
decoder folder is wrapped as Transformer -> Pooling(mean|cls|last) -> Normalize, so the
division-of-labour experiment can tune an MLM and a CLM with the identical recipe.
"""

from __future__ import annotations

import logging
import random
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rag.cli.flags import config_parser, run_config_cli
from rag.models import is_sentence_transformer, resolve_model
from rag.storage.paths import shared_data_dir
from training.data import pairs as P
from training.defaults import default_docs_if_no_data
from training.finetune.recipe import (
    FinetuneConfig,
    check_training_precision,
    finetune_run,
    training_precision,
)

log = logging.getLogger("training.finetune.contrastive")
POOLING = {"mean": "mean", "cls": "cls", "last": "lasttoken"}


@dataclass
class ContrastiveConfig(FinetuneConfig):
    """Everything a contrastive run depends on (the training loop's settings:
    :class:`~training.finetune.recipe.FinetuneConfig`); saved as run.json beside the model."""

    model: str = "minilm"  # folder, alias (minilm) or artefact name to start from
    docs: list[str] = field(default_factory=list)  # folders/files/BEIR corpus.jsonl: mined pairs
    pairs: list[str] = field(default_factory=list)  # JSONL files of {"anchor", "positive"} pairs
    scifact: str | None = None  # BEIR SciFact folder: supervised train claims -> abstracts
    squad: str | None = None  # SQuAD v1.1 JSON: supervised train questions -> paragraphs
    max_unsupervised: int = 6000  # cap on mined pairs (balanced across crop/ict/heading)
    max_pairs: int = 0  # cap on all pairs after mixing (0 = no cap)
    batch_size: int = 32  # pairs per batch = in-batch negatives + 1
    mini_batch_size: int = 16  # cached-mnrl: forward chunk size (memory), not the batch size
    lr: float = 3e-5  # peak learning rate (linear warmup then decay)
    loss: str = "mnrl"  # mnrl | cached-mnrl
    pooling: str = "auto"  # auto | mean | cls | last (auto: a ST folder's own, else mean)
    hard_negatives: str = "none"  # none | bm25 | self | mined (see to_dataset / mined_dataset)
    negatives: int = 1  # mined: hard negatives per query (BM25 and the starting model, interleaved)
    max_queries: int = 0  # mined: cap on queries per source, sampled by seed (0 = all)
    mine_depth: int = 30  # mined: candidates per miner that negatives are drawn from
    mine_skip: int = 0  # mined: skip each miner's top N (they may be unlabelled positives)
    max_seq_length: int = 256  # tokens per text, training and evaluation
    # auto | fp32 | bf16 (rag.models.precision's words; int8 is refused): bf16 autocast in
    # training; auto = bf16 on CUDA (the base preset's contrastive stage had run its matmuls in
    # fp32 on an H200), fp32 on a CPU (bf16 contrastive training was not measured on the CPUs
    # with bf16 units)
    precision: str = "auto"
    scale: float = 20.0  # similarity scale (inverse temperature) of the ranking loss
    eval: bool = True  # evaluate before and after on SciFact dev + SQuAD dev articles
    eval_scifact: str | None = None  # BEIR folder for the dev eval (--scifact or shared data)
    eval_squad: str | None = None  # SQuAD JSON for the dev eval (default: --squad or shared data)
    eval_max_queries: int = 0  # sample this many dev queries per set (0 = all), full corpus kept
    eval_max_docs: int = 0  # sub-corpus: relevant docs + random others up to this size (0 = all)
    eval_batch_size: int = 64  # encoding batch size for evaluation


# ---------------------------------------------------------------------------- model


def build_model(name: str, pooling: str = "auto", max_seq_length: int = 256, device: str = "cpu"):
    """A SentenceTransformer ending in Normalize (cosine = dot product on the outputs).

    A SentenceTransformer folder keeps its modules, except that an explicit ``pooling`` replaces
    its Pooling module; a plain HF encoder or decoder folder is wrapped as Transformer -> Pooling
    (``auto`` = mean) -> Normalize."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Normalize, Pooling, Transformer

    if pooling not in POOLING and pooling != "auto":
        raise ValueError(f"--pooling must be auto or one of {', '.join(POOLING)}, not {pooling!r}")
    path = resolve_model(name)
    if is_sentence_transformer(path):
        st = SentenceTransformer(str(path), device=device, local_files_only=True)
        modules = list(st)
        if pooling != "auto":
            modules = [m for m in modules if not isinstance(m, (Pooling, Normalize))]
            modules.insert(
                1, Pooling(modules[0].get_embedding_dimension(), pooling_mode=POOLING[pooling])
            )
        if not isinstance(modules[-1], Normalize):
            modules.append(Normalize())
        model = SentenceTransformer(modules=modules, device=device) if modules != list(st) else st
    else:
        tr = Transformer(str(path), max_seq_length=max_seq_length)
        pool = Pooling(tr.get_embedding_dimension(), pooling_mode=POOLING.get(pooling, "mean"))
        model = SentenceTransformer(modules=[tr, pool, Normalize()], device=device)
    tok = model[0].tokenizer
    if tok.pad_token is None:  # decoders often have no pad token; pooling masks it anyway
        tok.pad_token = tok.eos_token or tok.unk_token
    model.max_seq_length = max_seq_length
    return model


# ---------------------------------------------------------------------------- data


def collect_pairs(cfg: ContrastiveConfig) -> list[P.Pair]:
    """Mix every pair source of ``cfg``; the SQuAD dev articles are filtered from all of them."""
    out: list[P.Pair] = []
    if cfg.docs:
        docs = P.load_doc_sources(cfg.docs)
        if not docs:
            raise ValueError(f"--docs {' '.join(cfg.docs)}: no loadable documents")
        out += P.unsupervised_pairs(docs, seed=cfg.seed, max_pairs=cfg.max_unsupervised or None)
    for f in cfg.pairs:
        out += P.read_pairs(f)
    if cfg.scifact:
        out += P.scifact_pairs(cfg.scifact)
    if cfg.squad:
        out += P.squad_pairs(cfg.squad)
        dev = P.squad_dev_texts(cfg.squad)
        out = [p for p in out if p.anchor not in dev and p.positive not in dev]
        P.assert_no_dev(out, dev_texts=dev)
    if not out:
        raise ValueError("no training pairs: give --docs, --pairs, --scifact and/or --squad")
    rng = random.Random(cfg.seed)
    rng.shuffle(out)
    return out[: cfg.max_pairs] if cfg.max_pairs else out


def to_dataset(pairs: list[P.Pair], hard_negatives: str, model: Any, seed: int):
    """A datasets.Dataset with anchor/positive(/negative) columns, as the losses expect."""
    from datasets import Dataset

    if hard_negatives == "bm25":
        P.add_bm25_negatives(pairs, seed=seed)
    data = {"anchor": [p.anchor for p in pairs], "positive": [p.positive for p in pairs]}
    if hard_negatives == "bm25":
        data["negative"] = [p.negative or "" for p in pairs]
    ds = Dataset.from_dict(data)
    if hard_negatives == "self":
        from sentence_transformers.util import mine_hard_negatives

        # Skip the 2 nearest texts: in mined pairs they are often unlabelled positives.
        ds = mine_hard_negatives(
            ds, model, range_min=2, range_max=30, num_negatives=1, verbose=False
        )
    elif hard_negatives not in ("none", "bm25"):
        raise ValueError(
            f"--hard-negatives must be none, bm25, self or mined, not {hard_negatives!r}"
        )
    return ds


def mined_dataset(cfg: ContrastiveConfig, model: Any) -> tuple[Any, dict[str, int]]:
    """(query, positive, negative_1..n) rows with negatives mined over each source's *whole*
    corpus (all 5,183 SciFact abstracts, every SQuAD train-article paragraph) by BM25 and by the
    starting model, interleaved: the reranker's miner (:mod:`training.data.rerank_data`), so both
    fine-tunes share one held-out guard (dev queries dropped, dev passages never candidates,
    asserted). ``bm25``/``self`` mine only among the pairs' own positives."""
    from training.data import rerank_data as R
    from training.finetune.rerank import RerankConfig, collect_examples

    rcfg = RerankConfig(
        model=cfg.model,
        scifact=cfg.scifact,
        squad=cfg.squad,
        docs=list(cfg.docs),
        pairs=list(cfg.pairs),
        max_doc_pairs=cfg.max_unsupervised,
        max_queries=cfg.max_queries,
        negatives=cfg.negatives,
        mine_depth=cfg.mine_depth,
        mine_skip=cfg.mine_skip,
        seed=cfg.seed,
    )
    examples, _ = collect_examples(rcfg, encoder=model)
    kinds: dict[str, int] = {}
    for ex in examples:
        kinds[ex.kind] = kinds.get(ex.kind, 0) + 1
    return R.to_dataset(examples, "mnrl", cfg.seed), kinds


# ---------------------------------------------------------------------------- evaluation


def dev_evaluators(cfg: ContrastiveConfig) -> list:
    """InformationRetrievalEvaluators on the fixed dev splits (never trained on)."""
    from sentence_transformers.sentence_transformer.evaluation import InformationRetrievalEvaluator

    from rag.evaluation.datasets import load_beir, load_squad, scifact_split, squad_split

    shared = shared_data_dir()
    scifact = cfg.eval_scifact or cfg.scifact or (shared and shared / "scifact")
    squad = (
        cfg.eval_squad or cfg.squad or (shared and shared / "squad" / "squad-v1.1-dev-part.json")
    )
    sets = []
    if scifact and Path(scifact).is_dir():
        ds = load_beir(scifact, "train")
        sets.append(("scifact-dev", ds, scifact_split(ds)[1]))
    if squad and Path(squad).is_file():
        dev_articles = squad_split(squad)[1]
        ds = load_squad(squad, articles=dev_articles)
        sets.append(("squad-dev", ds, sorted(ds.queries)))
    out = []
    for name, ds, qids in sets:
        if cfg.eval_max_queries and len(qids) > cfg.eval_max_queries:
            qids = sorted(random.Random(cfg.seed).sample(qids, cfg.eval_max_queries))
        doc_ids = sorted(ds.corpus)
        if cfg.eval_max_docs and len(doc_ids) > cfg.eval_max_docs:
            relevant = {d for q in qids for d in ds.qrels[q]}
            others = [d for d in doc_ids if d not in relevant]
            n_more = max(0, cfg.eval_max_docs - len(relevant))
            doc_ids = sorted(relevant | set(random.Random(cfg.seed).sample(others, n_more)))
        out.append(
            InformationRetrievalEvaluator(
                queries={q: ds.queries[q] for q in qids},
                corpus={d: ds.doc_text(d) for d in doc_ids},
                relevant_docs={q: set(ds.qrels[q]) for q in qids},
                name=name,
                ndcg_at_k=[10],
                mrr_at_k=[10],
                accuracy_at_k=[1, 10],
                precision_recall_at_k=[10, 100],
                map_at_k=[100],
                batch_size=cfg.eval_batch_size,
                show_progress_bar=True,
                write_csv=False,
            )
        )
    return out


def evaluate(model: Any, evaluators: list) -> dict[str, dict[str, float]]:
    """{set: {ndcg@10, recall@100, mrr@10, n_queries}} for each dev evaluator."""
    out = {}
    for ev in evaluators:
        res = ev(model)
        pick = {k.split("_")[-1]: v for k, v in res.items() if "_cosine_" in k}
        out[ev.name] = {
            "ndcg@10": round(pick["ndcg@10"], 4),
            "recall@100": round(pick["recall@100"], 4),
            "mrr@10": round(pick["mrr@10"], 4),
            "n_queries": len(ev.queries),
            "n_docs": len(ev.corpus),
        }
    return out


# ---------------------------------------------------------------------------- training


def train_contrastive(cfg: ContrastiveConfig) -> dict[str, Any]:
    """Mine pairs, evaluate, train, save, evaluate again; returns the run summary (run.json)."""
    default_docs_if_no_data(
        cfg, ("docs", "pairs", "scifact", "squad"), "training.finetune.contrastive"
    )
    return fit(cfg)[1]


def fit(cfg: ContrastiveConfig) -> tuple[Any, dict[str, Any]]:
    """:func:`train_contrastive`, also returning the trained SentenceTransformer (tests compare
    it with what loads from disk)."""
    from sentence_transformers import (
        SentenceTransformerTrainer,
        SentenceTransformerTrainingArguments,
    )
    from sentence_transformers.base.sampler import BatchSamplers
    from sentence_transformers.sentence_transformer import losses

    if cfg.loss not in ("mnrl", "cached-mnrl"):
        raise ValueError(f"--loss must be mnrl or cached-mnrl, not {cfg.loss!r}")
    with finetune_run(cfg, "contrastive") as run:
        model = build_model(cfg.model, cfg.pooling, cfg.max_seq_length, run.device)
        if cfg.hard_negatives == "mined":
            train_ds, kinds = mined_dataset(cfg, model)
        else:
            pairs = collect_pairs(cfg)
            kinds = {}
            for p in pairs:
                kinds[p.kind] = kinds.get(p.kind, 0) + 1
            train_ds = to_dataset(pairs, cfg.hard_negatives, model, cfg.seed)
        log.info("%d training rows %s", len(train_ds), kinds)

        evaluators = dev_evaluators(cfg) if cfg.eval else []
        before = evaluate(model, evaluators)
        run.event(event="eval_before", **{k: v["ndcg@10"] for k, v in before.items()})
        log.info("before: %s", before)

        if cfg.loss == "mnrl":
            loss = losses.MultipleNegativesRankingLoss(model, scale=cfg.scale)
        else:
            loss = losses.CachedMultipleNegativesRankingLoss(
                model, scale=cfg.scale, mini_batch_size=cfg.mini_batch_size
            )
        args = run.training_args(
            SentenceTransformerTrainingArguments,
            bf16=contrastive_precision(cfg.precision, run.device) == "bf16",
            batch_sampler=BatchSamplers.NO_DUPLICATES,  # a repeated text = a false negative
            dataloader_drop_last=True,
            disable_tqdm=False,
        )
        run.train(SentenceTransformerTrainer, args, model, train_ds, loss=loss)
        model.save(str(run.out))

        after = evaluate(model, evaluators)
        run.event(event="eval_after", **{k: v["ndcg@10"] for k, v in after.items()})
        log.info("after: %s", after)
        summary = run.finish(
            f"contrastive {Path(cfg.model).name} ({cfg.loss})",
            {"n_pairs": len(train_ds), "pair_kinds": kinds, "before": before, "after": after},
        )
    return model, summary


def contrastive_precision(precision: str, device: str) -> str:
    """``fp32`` or ``bf16``: what a contrastive fine-tune trains in on ``device`` (resolved:
    ``cpu`` or ``cuda``). ``auto`` is bf16 on CUDA only (ContrastiveConfig.precision says why);
    ``int8`` is refused (one line naming ``--precision``)."""
    if precision == "auto" and device == "cpu":
        return "fp32"
    return training_precision(precision, device)


def preset_config(
    model: str | Path, out: str | Path, data: Path, preset: str, device: str, threads: int = 0
):
    """The ``make models`` recipe: unsupervised pairs from python-docs + SciFact abstracts plus
    supervised SciFact/SQuAD train pairs; CPU presets (tiny/small) use a short budget and sampled
    dev sets, ``base`` (GPU) the full dev sets, a cached loss and a large batch."""
    cpu = preset in ("tiny", "small")
    return ContrastiveConfig(
        model=str(model),
        out=str(out),
        docs=[str(data / "python-docs"), str(data / "scifact" / "corpus.jsonl")],
        scifact=str(data / "scifact"),
        squad=str(data / "squad" / "squad-v1.1-dev-part.json"),
        max_unsupervised=2000 if cpu else 20000,
        max_steps=60 if cpu else 1500,
        batch_size=32 if cpu else 256,
        loss="mnrl" if cpu else "cached-mnrl",
        mini_batch_size=32,
        lr=2e-4,
        max_seq_length=128 if cpu else 256,
        eval_max_queries=200 if cpu else 0,
        eval_max_docs=1000 if cpu else 0,
        device=device,
        threads=threads,
    )


def tuned_retriever_config(
    out: str | Path, data: Path, device: str = "auto", threads: int = 0
) -> ContrastiveConfig:
    """The ``make models`` recipe of ``minilm-tuned``, the measured one (docs/retrieval.md, with
    its timing): all-MiniLM-L6-v2 on the SciFact train claims, one hard negative each mined over
    the whole corpus by BM25 and by MiniLM itself, in-batch negatives (MNRL, batch 32), 3 epochs
    at 5e-5 (66 steps). No dev eval in the run: ``evals.retrieval`` measures the artefact on the
    full dev sets."""
    return ContrastiveConfig(
        model="minilm",
        out=str(out),
        scifact=str(data / "scifact"),
        hard_negatives="mined",
        negatives=1,
        loss="mnrl",
        batch_size=32,
        lr=5e-5,
        epochs=3.0,
        max_seq_length=256,
        eval=False,
        device=device,
        threads=threads,
    )


# ---------------------------------------------------------------------------- CLI


def _report(summary: dict) -> str:
    lines = []
    for name in summary["before"]:
        b, a = summary["before"][name]["ndcg@10"], summary["after"][name]["ndcg@10"]
        lines.append(f"{name}: nDCG@10 {b:.4f} -> {a:.4f}")
    lines.append(f"saved {summary['out']} ({summary['n_pairs']} pairs, {summary['steps']} steps)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = config_parser("python -m training.finetune.contrastive", __doc__, ContrastiveConfig)
    return run_config_cli(
        parser,
        ContrastiveConfig,
        train_contrastive,
        argv,
        check=lambda cfg: check_training_precision(cfg.precision),
        report=_report,
        logs_to_stderr=True,
    )


if __name__ == "__main__":
    sys.exit(main())
