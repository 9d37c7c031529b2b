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

import argparse
import json
import os
import platform
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from evals import dol_steps as steps
from evals.datasets import RetrievalDataset
from rag.paths import shared_data_dir

REPO = Path(__file__).resolve().parents[1]
ROWS = ("mlm15", "mlm40", "clm", "clm2mlm")
ROW_OBJECTIVE = {"mlm15": "mlm", "mlm40": "mlm", "clm": "clm", "clm2mlm": "mlm"}
ROW_MASK = {
    "mlm15": (0.15, "80-10-10"),
    "mlm40": (0.40, "mask-only"),
    "clm2mlm": (0.15, "80-10-10"),
}


@dataclass(frozen=True)
class ExperimentPreset:
    """Sizes for one scale of the experiment; every row of a preset uses the same numbers."""

    name: str
    model_preset: str  # training/config.py preset: the shared backbone
    vocab_size: int  # shared byte-level BPE tokenizer
    pretrain_steps: int  # optimiser steps per row (the token budget with batch and seq_len)
    seq_len: int  # pretraining tokens per sequence
    batch_size: int  # pretraining sequences per step
    contrastive_steps: int  # identical fine-tune for every row
    contrastive_batch: int  # in-batch negatives + 1
    contrastive_pairs: int  # pairs sampled from SciFact train + SQuAD train articles
    contrastive_lr: float
    max_seq_length: int  # encoder tokens per text in fine-tuning and retrieval eval
    eval_queries: int  # dev queries per retrieval set (0 = all)
    eval_docs: int  # corpus subsample size, relevant docs always kept (0 = whole corpus)
    bpb_tokens: int  # tokens of WikiText-2 validation scored per model
    lora_steps: int
    lora_examples: int
    qa_questions: int  # SQuAD dev questions for grounded QA
    clm_fraction: float = 0.5  # clm2mlm: share of the steps spent on CLM
    qa_k: int = 3  # passages per QA prompt (LoRA and eval); tiny uses 1 to fit its context


PRESETS = {
    # A test runs this end to end on CPU in about a minute.
    "tiny": ExperimentPreset(
        "tiny", "tiny", 2000, 12, 64, 8, 6, 8, 64, 1e-3, 64, 12, 150, 128, 3, 16, 4, qa_k=1
    ),
    # CPU: hours with 2 seeds on 2 cores (see docs/division_of_labor.md).
    "small": ExperimentPreset(
        "small", "small", 8000, 1500, 256, 16, 400, 32, 12800, 1e-4, 256, 0, 0, 8192, 200, 800, 200
    ),
    # GPU: ~10 minutes of pretraining per row on one large GPU.
    "base": ExperimentPreset(
        "base",
        "base",
        16000,
        3000,
        512,
        64,
        1000,
        64,
        64000,
        5e-5,
        256,
        0,
        0,
        32768,
        400,
        3200,
        500,
    ),
}


@dataclass
class ExperimentConfig:
    """One experiment run; saved in results.json."""

    preset: str = "tiny"  # tiny | small | base
    out: str = ""  # output folder (cells/, models/, results.*, plots)
    seeds: list[int] = field(default_factory=lambda: [0])  # one pretraining per row and seed
    rows: list[str] = field(default_factory=lambda: list(ROWS))  # subset of ROWS
    corpus: list[str] = field(default_factory=list)  # pretraining corpus (default by preset)
    scifact: str = ""  # BEIR SciFact folder (default: shared data)
    squad: str = ""  # SQuAD v1.1 JSON (default: shared data)
    wikitext: str = ""  # WikiText-2 validation tokens (default: shared data)
    baselines: bool = True  # BM25, minilm, smollm2 zero-shot and LoRA
    device: str = "auto"  # auto | cpu | cuda
    threads: int = 0  # torch CPU threads (0 = torch default)


# ---------------------------------------------------------------------------- cells


class Cells:
    """A folder of finished results: ``get(name, fn)`` runs ``fn`` only when the name is new."""

    def __init__(self, root: Path):
        self.root = root / "cells"
        self.root.mkdir(parents=True, exist_ok=True)
        self.skipped: dict[str, str] = {}

    def path(self, name: str) -> Path:
        return self.root / (name.replace("/", "__") + ".json")

    def get(self, name: str, fn: Callable[[], dict]) -> dict:
        p = self.path(name)
        if p.exists():
            return json.loads(p.read_text())
        t0 = time.perf_counter()
        try:
            value = fn()
        except steps.StepUnavailable as e:
            value = {"skipped": str(e)}  # not cached: reruns once the step exists
            self.skipped[name] = str(e)
            print(f"[{name}] skipped: {e}", file=sys.stderr)
            return value
        value["seconds"] = round(time.perf_counter() - t0, 1)
        tmp = p.with_suffix(".tmp")
        tmp.write_text(json.dumps(value, indent=2))
        os.replace(tmp, p)
        print(f"[{name}] done in {value['seconds']}s", file=sys.stderr)
        return value

    def all(self) -> dict[str, dict]:
        return {
            p.stem.replace("__", "/"): json.loads(p.read_text())
            for p in sorted(self.root.glob("*.json"))
        }


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
    """Bits per byte, left to right, on WikiText-2 validation (evals.lm)."""
    from evals.lm import bits_per_byte, load_lm, read_texts

    model, tok, objective = load_lm(str(model_dir), "auto", device)
    r = bits_per_byte(
        model, tok, read_texts([cfg.wikitext]), objective, max_tokens=p.bpb_tokens, device=device
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
                return {
                    "dir": str(out),
                    "stages": [_brief(s1), _brief(s2)],
                    "stage_dirs": [str(stage1), str(out)],
                }
            mask_rate, strategy = ROW_MASK.get(row, (0.15, "80-10-10"))
            s = steps.pretrain(
                ROW_OBJECTIVE[row],
                out,
                steps=self.p.pretrain_steps,
                mask_rate=mask_rate,
                mask_strategy=strategy,
                **kw,
            )
            return {"dir": str(out), "stages": [_brief(s)], "stage_dirs": [str(out)]}

        res = self.cells.get(f"pretrain/{row}/s{seed}", run)
        return Path(res["dir"]) if "dir" in res else None

    def retrieval(self, name: str, model_dir: Path, seed: int, pooling: str) -> dict:
        def run() -> dict:
            p = self.p
            model, summary = steps.contrastive(
                model_dir,
                self.out / "models" / f"{name}-s{seed}-ret-{pooling}",
                pooling=pooling,
                scifact=self.cfg.scifact,
                squad=self.cfg.squad,
                steps=p.contrastive_steps,
                batch_size=p.contrastive_batch,
                max_pairs=p.contrastive_pairs,
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
                    lr=2e-4,
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
    """The parts of a pretraining summary the report needs (JSON-safe)."""
    keep = ("steps", "tokens", "final_loss", "heldout_loss", "heldout_bpb", "train_seconds", "out")
    return {k: summary[k] for k in keep if k in summary} | {"out": summary.get("out")}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m evals.division_of_labor", description=__doc__.split("\n\n")[0]
    )
    p.add_argument("--preset", default="tiny", choices=list(PRESETS))
    p.add_argument(
        "--out", required=True, help="output folder (reused: finished cells are skipped)"
    )
    p.add_argument("--seeds", type=int, nargs="+", default=[0])
    p.add_argument("--rows", nargs="+", default=list(ROWS), help=f"subset of {' '.join(ROWS)}")
    p.add_argument("--corpus", nargs="+", default=[], help="pretraining corpus folders")
    p.add_argument("--scifact", default="")
    p.add_argument("--squad", default="")
    p.add_argument("--wikitext", default="")
    p.add_argument(
        "--baselines",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="minilm / smollm2 baselines (BM25 always runs)",
    )
    p.add_argument("--device", default="auto")
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--json", action="store_true", help="print results.json on stdout")
    a = p.parse_args(argv)
    cfg = ExperimentConfig(
        a.preset,
        a.out,
        a.seeds,
        a.rows,
        a.corpus,
        a.scifact,
        a.squad,
        a.wikitext,
        a.baselines,
        a.device,
        a.threads,
    )
    try:
        results = Experiment(cfg).run()
    except (OSError, ValueError, RuntimeError, LookupError) as e:
        traceback.print_exc(file=sys.stderr)
        print(f"error: {e}", file=sys.stderr)
        return 1
    if a.json:
        print(json.dumps(results, indent=2))
    print(f"wrote {Path(a.out) / 'results.md'}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
