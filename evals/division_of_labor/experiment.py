"""The grid of the division-of-labour experiment: every (row, seed) cell is run, or loaded from
its cache file, then the report is written (see the package docstring for rows and columns)."""

from __future__ import annotations

import json
import os
import platform
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from evals.division_of_labor import steps
from evals.division_of_labor.cells import Cells
from evals.division_of_labor.columns import score_bpb, score_qa, score_reading, score_retrieval
from evals.division_of_labor.data import dev_sets, reading_squad, resolve_paths
from evals.division_of_labor.presets import PRESETS, ROW_MASK, ROW_OBJECTIVE, ExperimentConfig
from rag.evaluation.datasets import RetrievalDataset


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
                alternate_every=self.p.antlm_block,
                **kw,
            )
            return _pretrain_cell(out, [_brief(s)], [out])

        name = f"pretrain/{row}/s{seed}"
        cached = self.cells.peek(name)
        if cached is not None and "dir" in cached and not Path(cached["dir"]).exists():
            # its cells came from another machine (benchmarks/gpu_run.sh), not its weights: the
            # row's unfinished cells need them, so it is pretrained again
            self.cells.drop(name)
        res = self.cells.get(name, run)
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

    def reading(self, name: str, model_dir: Path, seed: int) -> dict:
        """The reading cell ``reading/<name>/s<seed>``: the identical span-head fine-tune, then
        EM/F1 on the SQuAD dev articles' gold paragraphs."""

        def run() -> dict:
            p = self.p
            summary = steps.reader(
                model_dir,
                self.out / "models" / f"{name}-s{seed}-reader",
                squad=reading_squad(
                    self.cfg.squad, self.out / "squad-reading.json", p.reading_articles
                ),
                steps=p.reading_steps,
                batch_size=p.reading_batch,
                max_questions=p.reading_questions,
                calibration_questions=p.reading_calibration,
                eval_questions=p.reading_eval_questions,
                max_length=p.seq_len,
                seed=seed,
                device=self.device,
                threads=self.cfg.threads,
            )
            return score_reading(summary)

        return self.cells.get(f"reading/{name}/s{seed}", run)

    def todo(self) -> list[tuple[str, int]]:
        """The (row, seed) pairs not finished yet, seed by seed: a finished pair has its
        ``done/<row>/s<seed>`` cell, written once every cell of it is."""
        return [
            (row, seed)
            for seed in self.cfg.seeds
            for row in self.cfg.rows
            if not self.cells.has(f"done/{row}/s{seed}")
        ]

    def run_pair(self, row: str, seed: int) -> None:
        """Every cell of one row and seed, then its ``done`` cell (not when a step was skipped:
        the next run tries it again)."""
        skipped = len(self.cells.skipped)
        model_dir = self.pretrain(row, seed)
        if model_dir is None:
            return
        decoder = steps.decoder_folder(model_dir)
        columns = self.cfg.columns
        if "generation" in columns:
            # left-to-right prediction from the decoder layout where the row has one
            self.cells.get(
                f"bpb/{row}/s{seed}",
                lambda d=decoder or model_dir: score_bpb(d, self.cfg, self.p, self.device),
            )
        if "retrieval" in columns:
            self.retrieval(row, model_dir, seed, "mean")
            if ROW_OBJECTIVE[row] == "clm":
                self.retrieval(row, model_dir, seed, "last")
        if "qa" in columns and decoder is not None:
            self.qa(row, str(decoder), seed)
        if "reading" in columns:
            if ROW_OBJECTIVE[row] != "clm":  # an encoder layout: it reads bidirectionally
                self.reading(row, model_dir, seed)
            else:  # the CLM reads as pretrained (causal) and converted to the encoder layout
                self.reading(f"{row}-causal", model_dir, seed)
                bidir = steps.encoder_copy(
                    model_dir, self.out / "models" / f"{row}-s{seed}-as-encoder", self.p.seq_len
                )
                self.reading(f"{row}-bidir", bidir, seed)
        if len(self.cells.skipped) == skipped:
            self.cells.get(f"done/{row}/s{seed}", lambda: {"row": row, "seed": seed})

    def shared(self) -> None:
        """The steps every pair reads, made once before parallel workers start: the tokenizer,
        the contrastive pairs and the reading column's SQuAD file."""
        if not self.cfg.rows:
            return
        self.tokenizer()
        if "retrieval" in self.cfg.columns:
            self.pairs()
        if "reading" in self.cfg.columns:
            reading_squad(self.cfg.squad, self.out / "squad-reading.json", self.p.reading_articles)

    def run_parallel(self, todo: list[tuple[str, int]]) -> list[str]:
        """Each pair of ``todo`` in a worker process of its own (this command with that one row
        and seed, no baselines, no report), ``jobs`` at a time; their output goes to
        ``logs/<row>-s<seed>.log`` and, each line prefixed with the pair, to stderr. Returns the
        pairs whose worker failed.

        Why processes: one pair's stages (pretraining, the contrastive and reading fine-tunes)
        leave most of a large GPU idle, and torch in one process runs them one after another."""
        import subprocess
        import sys
        import threading
        from concurrent.futures import ThreadPoolExecutor
        from dataclasses import replace

        from rag.cli.flags import config_argv

        logs = self.out / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        lock = threading.Lock()

        def work(pair: tuple[str, int]) -> str | None:
            row, seed = pair
            cfg = replace(self.cfg, rows=[row], seeds=[seed], jobs=1, report=False, baselines=False)
            cmd = [sys.executable, "-m", "evals.division_of_labor", *config_argv(cfg)]
            tag = f"[{row}/s{seed}]"
            with lock:
                print(f"{tag} started", file=sys.stderr, flush=True)
            with open(logs / f"{row}-s{seed}.log", "w") as log:
                proc = subprocess.Popen(
                    cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1
                )
                for line in proc.stdout:
                    log.write(line)
                    with lock:
                        print(f"{tag} {line}", end="", file=sys.stderr, flush=True)
                code = proc.wait()
            with lock:
                print(f"{tag} ended, exit {code}", file=sys.stderr, flush=True)
            return None if code == 0 else f"{row}/s{seed}"

        with ThreadPoolExecutor(max_workers=self.cfg.jobs) as pool:
            return [f for f in pool.map(work, todo) if f]

    def run_baselines(self) -> None:
        columns = self.cfg.columns
        if "retrieval" in columns:
            self.cells.get(
                "retrieval/bm25/s0", lambda: score_retrieval(None, self.sets, mode="bm25")
            )
        if not self.cfg.baselines:
            return

        def minilm() -> dict:
            from rag.models import load_embedder

            return score_retrieval(load_embedder("minilm", device=self.device), self.sets)

        if "retrieval" in columns:
            self.cells.get("retrieval/minilm/s0", minilm)
        if "generation" in columns:
            self.cells.get(
                "bpb/smollm2/s0", lambda: score_bpb("smollm2", self.cfg, self.p, self.device)
            )
        if "qa" in columns:
            self.qa("smollm2", "smollm2", 0, tuned=False)
            for seed in self.cfg.seeds:
                self.qa("smollm2", "smollm2", seed, tuned=True)

    def run(self) -> dict:
        import torch

        if self.cfg.threads:
            torch.set_num_threads(self.cfg.threads)
        t0 = time.perf_counter()
        self.out.mkdir(parents=True, exist_ok=True)
        if self.cfg.report:
            (self.out / "run.json").write_text(
                json.dumps({"config": asdict(self.cfg), "preset": asdict(self.p)}, indent=2)
            )
            self.run_baselines()
        failed: list[str] = []
        todo = self.todo()
        if self.cfg.jobs > 1 and len(todo) > 1:
            self.shared()
            failed = self.run_parallel(todo)
        else:
            for row, seed in todo:
                self.run_pair(row, seed)
        left = [f"{row}/s{seed}" for row, seed in self.todo()]
        if not self.cfg.report:
            return {"rows": self.cfg.rows, "seeds": self.cfg.seeds, "left": left}
        from evals.division_of_labor.report import write_report

        cells = self.cells.all() | {k: {"skipped": v} for k, v in self.cells.skipped.items()}
        results = write_report(
            self.out,
            cells,
            {
                "config": asdict(self.cfg),
                "preset": asdict(self.p),
                "device": self.device,
                "hardware": f"{platform.machine()}, {os.cpu_count()} CPUs"
                + (", CUDA" if self.device == "cuda" else ""),
                "wall_seconds_this_invocation": round(time.perf_counter() - t0, 1),
                "left": left,
            },
        )
        if failed:
            raise RuntimeError(
                f"{len(failed)} of {len(todo)} workers failed ({', '.join(failed)}); their "
                f"output is in {self.out / 'logs'}; the report holds the finished cells"
            )
        return results


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
        "final_heldout_clm_loss",
        "heldout_clm_bits_per_byte",
    )
    brief = {k: summary[k] for k in keep if k in summary}
    if summary.get("config", {}).get("objective") == "clm":  # its own loss is the CLM loss
        brief["final_heldout_clm_loss"] = summary.get("final_heldout_loss")
    return brief


def _pretrain_cell(out: Path, stages: list[dict], dirs: list[Path]) -> dict:
    """A pretraining cell: totals over the stages plus the last stage's held-out numbers."""
    last = stages[-1]
    return {
        "dir": str(out),
        "tokens_seen": sum(s.get("tokens_seen", 0) for s in stages),
        "wall_time_s": sum(s.get("wall_time_s", 0.0) for s in stages),
        "final_heldout_loss": last.get("final_heldout_loss"),
        # held-out CLM loss of the row's decoder (clm, antlm, prefixlm): one quantity, one split
        "final_heldout_clm_loss": last.get("final_heldout_clm_loss"),
        "stages": stages,
        "stage_dirs": [str(d) for d in dirs],
    }
