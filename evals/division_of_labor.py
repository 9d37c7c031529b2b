"""The division-of-labour experiment: is MLM better for retrieval and CLM for generation?

Every row shares the backbone (a training/config.py preset), the pretraining corpus, the
tokenizer and the token budget (steps x batch x sequence length); only the objective differs:

- ``mlm15``: MLM, 15% of tokens, 80/10/10 mask/random/keep (BERT);
- ``mlm40``: MLM, 40% of tokens, mask-only (Wettig et al. 2023);
- ``clm``: CLM (next token);
- ``clm2mlm``: CLM for the first ``clm_fraction`` of the steps, then MLM 15% 80/10/10 from the
  converted CLM weights for the rest (two-stage, as AntLM).

Columns, each after the identical downstream recipe:

- retrieval: contrastive fine-tune with the same pairs and steps (mean pooling for all rows,
  last-token pooling too for CLM) -> nDCG@10 on the SciFact dev split and the SQuAD dev articles;
- generation: bits per byte of left-to-right prediction on WikiText-2 validation (MLM rows
  predict a mask appended after the prefix; see evals.lm);
- grounded QA (decoders only): identical LoRA -> EM/F1 and citation accuracy, SQuAD dev articles;
- baselines: BM25 and ``minilm`` (retrieval), ``smollm2`` zero-shot and LoRA (generation, QA).

Every cell is cached as ``DIR/cells/<name>.json``; rerunning skips finished cells, so an
interrupted run resumes where it stopped. Output: ``results.json``, ``results.md`` (mean ± std
over seeds), bar charts per column and the pretraining loss curves (see evals.dol_report).

CLI::

    python -m evals.division_of_labor --preset tiny --out artifacts/evals/dol-tiny
    python -m evals.division_of_labor --preset small --seeds 0 1 --out artifacts/evals/dol-small
"""

from __future__ import annotations

import json
import os
import platform
import sys
import time
import traceback
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from evals import dol_steps as steps
from evals.dol_cells import Cells
from evals.dol_presets import (
    PRESETS,
    ROW_MASK,
    ROW_OBJECTIVE,
    ROWS,
    ExperimentConfig,
    ExperimentPreset,
)
from rag.datasets import RetrievalDataset
from rag.paths import shared_data_dir

REPO = Path(__file__).resolve().parents[1]
# ---------------------------------------------------------------------------- data


def resolve_paths(cfg: ExperimentConfig) -> ExperimentConfig:
    """Fill data paths from ../shared/data and the corpus from the preset; errors name the flag."""
    data = shared_data_dir()
    default_corpus = (
        [str(REPO / "tests" / "fixtures" / "corpus")]
        if cfg.preset == "tiny"
        else ([str(data / "python-docs")] if data else [])
    )
    c = replace(
        cfg,
        corpus=cfg.corpus or default_corpus,
        scifact=cfg.scifact or (str(data / "scifact") if data else ""),
        squad=cfg.squad or (str(data / "squad" / "squad-v1.1-dev-part.json") if data else ""),
        wikitext=cfg.wikitext or (str(data / "wikitext-2" / "wiki.valid.tokens") if data else ""),
    )
    for flag, value in (("--scifact", c.scifact), ("--squad", c.squad), ("--wikitext", c.wikitext)):
        if not value or not Path(value).exists():
            raise FileNotFoundError(
                f"{flag} {value or '(unset)'}: not found (give the path or set RAG_SHARED_DATA)"
            )
    if not c.corpus:
        raise FileNotFoundError("--corpus: no pretraining corpus given and no shared data found")
    if unknown := [r for r in c.rows if r not in ROWS]:
        raise ValueError(f"--rows: unknown row(s) {unknown}; have {list(ROWS)}")
    return c


def subsample(ds: RetrievalDataset, n_queries: int, n_docs: int, seed: int = 0) -> RetrievalDataset:
    """At most ``n_queries`` queries and ``n_docs`` documents (every relevant one kept), seeded."""
    import random

    rng = random.Random(seed)
    qids = sorted(ds.queries)
    if n_queries and n_queries < len(qids):
        qids = sorted(rng.sample(qids, n_queries))
    small = ds.subset(qids)
    if n_docs and n_docs < len(ds.corpus):
        keep = {d for q in qids for d in ds.qrels.get(q, {})}
        rest = sorted(set(ds.corpus) - keep)
        keep |= set(rng.sample(rest, max(0, min(len(rest), n_docs - len(keep)))))
        small.corpus = {d: ds.corpus[d] for d in ds.corpus if d in keep}
    return small


def dev_sets(cfg: ExperimentConfig, p: ExperimentPreset) -> dict[str, RetrievalDataset]:
    """The two retrieval dev sets every model is scored on (fixed splits, same subsample)."""
    from evals.retrieval import load_eval_dataset

    sets = {
        "scifact_dev": load_eval_dataset(cfg.scifact, "train", "dev"),
        "squad_dev": load_eval_dataset(f"squad:{cfg.squad}", queries="dev"),
    }
    return {k: subsample(v, p.eval_queries, p.eval_docs) for k, v in sets.items()}


# ---------------------------------------------------------------------------- column recipes


def score_retrieval(encoder, sets: dict[str, RetrievalDataset], mode: str = "dense") -> dict:
    """nDCG@10 (and the other metrics) of ``encoder`` on each dev set, via evals.retrieval."""
    from evals.retrieval import RetrievalEvalConfig, evaluate

    out = {}
    for name, ds in sets.items():
        r = evaluate(RetrievalEvalConfig(dataset=name, retriever=mode), encoder=encoder, ds=ds)
        out[name] = r["metrics"]["ndcg@10"]
        out[f"{name}_metrics"] = r["metrics"]
    return out


def score_bpb(
    model_dir: Path | str, cfg: ExperimentConfig, p: ExperimentPreset, device: str
) -> dict:
    """Bits per byte, left to right, on WikiText-2 validation (evals.lm), every model with the
    same left context: the pretraining sequence length, the longest the rows were trained on."""
    from evals.lm import bits_per_byte, load_lm, read_texts

    model, tok, objective = load_lm(str(model_dir), "auto", device)
    text = read_texts([cfg.wikitext])
    r = bits_per_byte(
        model, tok, text, objective, max_tokens=p.bpb_tokens, context=p.seq_len, device=device
    )
    return {"wikitext_bpb": r["bits_per_byte"], "objective": objective, **r}


def score_qa(
    model_dir: str, adapter: Path | None, cfg: ExperimentConfig, p: ExperimentPreset, device: str
) -> dict:
    """EM/F1 and citation accuracy, oracle passages on the SQuAD dev articles (evals.qa)."""
    from evals.qa import QAEvalConfig, evaluate_qa
    from rag.generate import Generator

    gen = Generator.load(model_dir, adapter=str(adapter) if adapter else None, device=device)
    qcfg = QAEvalConfig(
        squad=cfg.squad, generator=model_dir, mode="oracle", k=p.qa_k, limit=p.qa_questions
    )
    r = evaluate_qa(qcfg, generator=gen, progress=False)
    return {**r["metrics"], "n_questions": r["n_questions"], "examples": r["predictions"][:3]}


# ---------------------------------------------------------------------------- the run


class Experiment:
    """Runs (or loads from cache) every cell of the grid, then writes the report."""

    def __init__(self, cfg: ExperimentConfig):
        from rag.models import pick_device

        if cfg.preset not in PRESETS:
            raise ValueError(
                f"--preset {cfg.preset!r} is unknown; choose one of {', '.join(PRESETS)}"
            )
        self.cfg = resolve_paths(cfg)
        self.p = PRESETS[cfg.preset]
        self.out = Path(cfg.out)
        self.device = pick_device(cfg.device)
        self.cells = Cells(self.out)
        self._sets: dict[str, RetrievalDataset] | None = None

    @property
    def sets(self) -> dict[str, RetrievalDataset]:
        if self._sets is None:
            self._sets = dev_sets(self.cfg, self.p)
        return self._sets

    def pairs(self) -> Path:
        """The shared contrastive pair file (built once, identical for every row and seed)."""
        return steps.make_pairs(
            self.out / "pairs.jsonl",
            scifact=self.cfg.scifact,
            squad=self.cfg.squad,
            max_pairs=self.p.contrastive_pairs,
        )

    def tokenizer(self) -> Path:
        return steps.train_tokenizer(self.cfg.corpus, self.p.vocab_size, self.out / "tokenizer")

    def _pretrain_kwargs(self, seed: int) -> dict[str, Any]:
        p = self.p
        return dict(
            preset=p.model_preset,
            corpus=self.cfg.corpus,
            tokenizer=self.tokenizer(),
            seq_len=p.seq_len,
            batch_size=p.batch_size,
            seed=seed,
            device=self.device,
            threads=self.cfg.threads,
        )

    def pretrain(self, row: str, seed: int) -> Path:
        """The row's pretrained folder (cell ``pretrain/<row>/s<seed>``)."""
        out = self.out / "models" / f"{row}-s{seed}"
        kw = self._pretrain_kwargs(seed)

        def run() -> dict:
            if row == "clm2mlm":
                n_clm = max(1, round(self.p.pretrain_steps * self.p.clm_fraction))
                stage1 = self.out / "models" / f"clm2mlm-stage1-s{seed}"
                s1 = steps.pretrain("clm", stage1, steps=n_clm, **kw)
                mask_rate, strategy = ROW_MASK[row]
                s2 = steps.pretrain(
                    "mlm",
                    out,
                    steps=self.p.pretrain_steps - n_clm,
                    mask_rate=mask_rate,
                    mask_strategy=strategy,
                    init_from=stage1,
                    **kw,
                )
                return _pretrain_cell(out, [_brief(s1), _brief(s2)], [stage1, out])
            mask_rate, strategy = ROW_MASK.get(row, (0.15, "80-10-10"))
            s = steps.pretrain(
                ROW_OBJECTIVE[row],
                out,
                steps=self.p.pretrain_steps,
                mask_rate=mask_rate,
                mask_strategy=strategy,
                **kw,
            )
            return _pretrain_cell(out, [_brief(s)], [out])

        res = self.cells.get(f"pretrain/{row}/s{seed}", run)
        return Path(res["dir"]) if "dir" in res else None

    def retrieval(self, name: str, model_dir: Path, seed: int, pooling: str) -> dict:
        def run() -> dict:
            p = self.p
            model, summary = steps.contrastive(
                model_dir,
                self.out / "models" / f"{name}-s{seed}-ret-{pooling}",
                pooling=pooling,
                pairs=self.pairs(),
                steps=p.contrastive_steps,
                batch_size=p.contrastive_batch,
                max_seq_length=p.max_seq_length,
                lr=p.contrastive_lr,
                seed=seed,
                device=self.device,
                threads=self.cfg.threads,
            )
            return {**score_retrieval(model, self.sets), "train_loss": summary.get("train_loss")}

        return self.cells.get(f"retrieval/{name}-{pooling}/s{seed}", run)

    def qa(self, name: str, model_dir: str, seed: int, tuned: bool = True) -> dict:
        def run() -> dict:
            adapter = None
            if tuned:
                p = self.p
                adapter = steps.lora(
                    model_dir,
                    self.out / "models" / f"{name}-s{seed}-lora",
                    squad=self.cfg.squad,
                    steps=p.lora_steps,
                    max_examples=p.lora_examples,
                    k_passages=p.qa_k,
                    lr=p.lora_lr,
                    seed=seed,
                    device=self.device,
                    threads=self.cfg.threads,
                )
            return score_qa(model_dir, adapter, self.cfg, self.p, self.device)

        return self.cells.get(f"qa/{name}{'-lora' if tuned else ''}/s{seed}", run)

    def run_rows(self) -> None:
        for seed in self.cfg.seeds:
            for row in self.cfg.rows:
                model_dir = self.pretrain(row, seed)
                if model_dir is None:
                    continue
                self.cells.get(
                    f"bpb/{row}/s{seed}",
                    lambda d=model_dir: score_bpb(d, self.cfg, self.p, self.device),
                )
                self.retrieval(row, model_dir, seed, "mean")
                if ROW_OBJECTIVE[row] == "clm":
                    self.retrieval(row, model_dir, seed, "last")
                    self.qa(row, str(model_dir), seed)

    def run_baselines(self) -> None:
        self.cells.get("retrieval/bm25/s0", lambda: score_retrieval(None, self.sets, mode="bm25"))
        if not self.cfg.baselines:
            return

        def minilm() -> dict:
            from rag.models import load_embedder

            return score_retrieval(load_embedder("minilm", device=self.device), self.sets)

        self.cells.get("retrieval/minilm/s0", minilm)
        self.cells.get(
            "bpb/smollm2/s0", lambda: score_bpb("smollm2", self.cfg, self.p, self.device)
        )
        self.qa("smollm2", "smollm2", 0, tuned=False)
        for seed in self.cfg.seeds:
            self.qa("smollm2", "smollm2", seed, tuned=True)

    def run(self) -> dict:
        import torch

        if self.cfg.threads:
            torch.set_num_threads(self.cfg.threads)
        t0 = time.perf_counter()
        self.out.mkdir(parents=True, exist_ok=True)
        (self.out / "run.json").write_text(
            json.dumps({"config": asdict(self.cfg), "preset": asdict(self.p)}, indent=2)
        )
        self.run_baselines()
        self.run_rows()
        from evals.dol_report import write_report

        cells = self.cells.all() | {k: {"skipped": v} for k, v in self.cells.skipped.items()}
        return write_report(
            self.out,
            cells,
            {
                "config": asdict(self.cfg),
                "preset": asdict(self.p),
                "device": self.device,
                "hardware": f"{platform.machine()}, {os.cpu_count()} CPUs"
                + (", CUDA" if self.device == "cuda" else ""),
                "wall_seconds_this_invocation": round(time.perf_counter() - t0, 1),
            },
        )


def _brief(summary: dict) -> dict:
    """The parts of a pretraining summary (training.pretrain's run.json) the report needs."""
    keep = (
        "steps",
        "tokens_seen",
        "wall_time_s",
        "final_train_loss",
        "final_heldout_loss",
        "heldout_bits_per_byte",
        "unigram_bits_per_byte",
        "params",
        "status",
        "init_from",
    )
    return {k: summary[k] for k in keep if k in summary}


def _pretrain_cell(out: Path, stages: list[dict], dirs: list[Path]) -> dict:
    """A pretraining cell: totals over the stages plus the last stage's held-out numbers."""
    last = stages[-1]
    return {
        "dir": str(out),
        "tokens_seen": sum(s.get("tokens_seen", 0) for s in stages),
        "wall_time_s": sum(s.get("wall_time_s", 0.0) for s in stages),
        "final_heldout_loss": last.get("final_heldout_loss"),
        "stages": stages,
        "stage_dirs": [str(d) for d in dirs],
    }


def main(argv: list[str] | None = None) -> int:
    from evals.cli import EXPECTED_ERRORS, write_result
    from rag.dataclass_cli import config_from_args, dataclass_parser

    p = dataclass_parser("python -m evals.division_of_labor", __doc__, ExperimentConfig)
    p.add_argument("--json", action="store_true", help="print results.json on stdout")
    a = p.parse_args(argv)
    if not a.out:
        p.error("the following arguments are required: --out")
    cfg = config_from_args(ExperimentConfig, a)
    try:
        results = Experiment(cfg).run()
    except EXPECTED_ERRORS as e:
        traceback.print_exc(file=sys.stderr)
        print(f"error: {e}", file=sys.stderr)
        return 1
    write_result(results, None, a.json)
    print(f"wrote {Path(a.out) / 'results.md'}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
