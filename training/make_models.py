"""``make models``: build every from-scratch artefact in order, skipping what already exists.

    python -m training.make_models --preset small --device cpu --corpus ../shared/data/corpus ../shared/data/python-docs

Steps (each a :class:`Step`; later issues append their fine-tunes to :func:`build_steps`):

1. ``$RAG_HOME/tokenizer``                   byte-level BPE shared by both models
2. ``$RAG_HOME/models/encoder-mlm-<preset>``  ModernBERT MLM encoder
3. ``$RAG_HOME/models/decoder-clm-<preset>``  ModernBERT CLM decoder (+ a generated sample)

A step whose artefact exists is skipped unless ``--overwrite``. Each pretraining step fits its
number of optimizer steps to ``--minutes-per-model`` by timing a few real steps first, so the
whole job keeps its wall-time budget on whatever machine runs it; ``--max-minutes`` is still
passed as a hard stop. After each model the held-out bits per byte is printed next to a unigram
model's on the same held-out files.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from rag.storage.paths import models_dir, rag_home, tokenizer_dir
from training.defaults import default_corpus

SAMPLE_PROMPTS = ["The following example shows how to", "To create a new branch,"]


@dataclass
class Step:
    """One artefact of ``make models``."""

    name: str  # short label printed in the log
    artefact: Path  # folder whose presence means "done"
    run: Callable[[], dict]  # builds the artefact, returns a summary (headline metrics)
    done_marker: str = "config.json"  # file inside ``artefact`` that marks it complete
    summary: dict = field(default_factory=dict)

    def exists(self) -> bool:
        return (self.artefact / self.done_marker).exists()


def calibrated_steps(cfg, minutes: float, probe_steps: int = 3) -> int:
    """Optimizer steps that fit ``minutes`` on this machine: time ``probe_steps`` real steps of
    the training path on random tokens (after one warm-up step), keep 15% for evaluation,
    checkpoints and export."""
    import torch

    from rag.models import pick_device
    from training.pretrain.masking import make_spec
    from training.pretrain.model import build_model
    from training.pretrain.step import Stepper, make_optimizer, make_scheduler
    from training.tokenizer import load_tokenizer

    cfg = cfg.resolved()
    threads = torch.get_num_threads()
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    device = pick_device(cfg.device)
    tok = load_tokenizer(Path(cfg.tokenizer))
    model = build_model(cfg.objective, cfg.preset, len(tok), tok).to(device).train()
    if cfg.objective == "mlm":
        model.sparse_prediction = cfg.sparse_prediction
    opt = make_optimizer(model, cfg.lr, cfg.weight_decay, device)
    sched = make_scheduler(opt, 1, 100, 0.1)
    stepper = Stepper(
        model, cfg.objective, device, make_spec(tok), cfg.mask_rate, cfg.mask_strategy
    )
    ids = torch.randint(5, len(tok), (cfg.batch_size, cfg.seq_len))
    stepper.step(*stepper.prepare(ids, 0), opt, sched)
    t0 = time.time()
    for i in range(probe_steps):
        float(stepper.step(*stepper.prepare(ids, i), opt, sched))
    per_step = (time.time() - t0) / probe_steps
    torch.set_num_threads(threads)
    return max(10, int(minutes * 60 * 0.85 / per_step))


def sample_generation(folder: Path, prompts: list[str], max_new_tokens: int = 40) -> list[str]:
    """Greedy continuations (KV cache on) of corpus-domain prompts by a saved decoder."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(folder))
    model = AutoModelForCausalLM.from_pretrained(str(folder)).eval()
    out = []
    for p in prompts:
        ids = tok(p, return_tensors="pt").input_ids
        gen = model.generate(
            ids,
            max_new_tokens=max_new_tokens,
            do_sample=False,
            use_cache=True,
            repetition_penalty=1.2,
            pad_token_id=tok.pad_token_id,
        )
        out.append(tok.decode(gen[0], skip_special_tokens=True))
    return out


def build_steps(args: argparse.Namespace) -> list[Step]:
    """The ordered steps; fine-tuning issues append theirs (contrastive encoder, LoRA decoder)."""
    from training.pretrain.config import PretrainConfig
    from training.pretrain.train import pretrain
    from training.tokenizer import train_tokenizer

    tok_dir = tokenizer_dir()
    vocab = args.vocab_size or (8192 if args.preset in ("tiny", "small") else 16384)

    def tokenizer_step() -> dict:
        tok = train_tokenizer(
            [Path(c) for c in args.corpus], vocab, tok_dir, max_chars=args.tokenizer_chars
        )
        return {"vocab_size": len(tok)}

    def model_step(objective: str, out: Path) -> Callable[[], dict]:
        def run() -> dict:
            cfg = PretrainConfig(
                objective=objective,
                preset=args.preset,
                corpus=[str(c) for c in args.corpus],
                out=str(out),
                tokenizer=str(tok_dir),
                device=args.device,
                seed=args.seed,
                threads=args.threads,
                max_minutes=args.minutes_per_model,
                overwrite=out.exists(),
                eval_every=0,
                save_every=50,
                log_every=5,
                seq_len=args.seq_len,
                batch_size=args.batch_size,
            )
            if args.max_steps:
                cfg.max_steps = args.max_steps
            else:  # the lr schedule follows the clock; the step count is only an upper bound
                expected = calibrated_steps(cfg, args.minutes_per_model)
                cfg.schedule, cfg.max_steps = "time", 3 * expected
                cfg.warmup_steps = max(5, expected // 20)
            cfg.eval_every = max(
                10, cfg.max_steps // 24 if cfg.schedule == "time" else cfg.max_steps // 8
            )
            print(
                f"[{objective}] {cfg.max_steps} steps planned for {args.minutes_per_model} min",
                file=sys.stderr,
            )
            s = pretrain(cfg, progress=not args.no_progress)
            result = {
                k: s[k]
                for k in (
                    "heldout_bits_per_byte",
                    "unigram_bits_per_byte",
                    "initial_heldout_loss",
                    "final_heldout_loss",
                    "steps",
                    "tokens_seen",
                    "wall_time_s",
                    "stop_reason",
                )
            }
            if objective == "clm":
                result["samples"] = sample_generation(out, SAMPLE_PROMPTS)
            return result

        return run

    enc = models_dir() / f"encoder-mlm-{args.preset}"
    dec = models_dir() / f"decoder-clm-{args.preset}"
    steps = [
        Step("tokenizer", tok_dir, tokenizer_step, done_marker="tokenizer.json"),
        Step("encoder (MLM)", enc, model_step("mlm", enc)),
        Step("decoder (CLM)", dec, model_step("clm", dec)),
    ]
    return steps + finetune_steps(args, enc)


def finetune_steps(args: argparse.Namespace, enc: Path) -> list[Step]:
    """The fine-tunes: the MLM encoder into a retriever (contrastive), the default decoder into
    the reader-first answerer (LoRA on the default decoder,
    training.finetune.lora.span_preset_config). They need ../shared/data (SciFact, SQuAD,
    python-docs)."""
    from rag.models import DEFAULT_DECODER, auto_adapter_name
    from rag.storage.paths import shared_data_dir

    data = shared_data_dir()
    if data is None:
        print(
            "== fine-tunes skipped: ../shared/data not found (set RAG_SHARED_DATA)", file=sys.stderr
        )
        return []
    ft = models_dir() / f"{enc.name}-contrastive"
    lora_out = models_dir() / auto_adapter_name(DEFAULT_DECODER)  # what adapter=auto finds

    def contrastive_step() -> dict:
        from training.finetune.contrastive import preset_config, train_contrastive

        s = train_contrastive(preset_config(enc, ft, data, args.preset, args.device, args.threads))
        for name in s["before"]:
            b, a = s["before"][name]["ndcg@10"], s["after"][name]["ndcg@10"]
            print(f"   {name} nDCG@10 {b:.4f} -> {a:.4f}", file=sys.stderr)
        return {
            "n_pairs": s["n_pairs"],
            "steps": s["steps"],
            "before": s["before"],
            "after": s["after"],
        }

    def lora_step() -> dict:
        from training.finetune.lora import span_preset_config, train_lora

        s = train_lora(
            span_preset_config(
                DEFAULT_DECODER, lora_out, data, args.preset, args.device, args.threads
            )
        )
        for key in ("span_kept", "grounded", "kept_and_grounded"):
            print(f"   held-out {key} {s['before'][key]} -> {s['after'][key]}", file=sys.stderr)
        keep = ("span_kept", "grounded", "kept_and_grounded", "mean_words", "n_span")
        return {
            "n_train_examples": s["n_train_examples"],
            "n_distilled_targets": s["n_distilled_targets"],
            "before": {k: s["before"][k] for k in keep},
            "after": {k: s["after"][k] for k in keep},
        }

    return [
        Step("encoder (contrastive)", ft, contrastive_step, done_marker="modules.json"),
        Step(f"{DEFAULT_DECODER} (LoRA)", lora_out, lora_step, done_marker="adapter_config.json"),
        *retrieval_steps(args, data),
    ]


def retrieval_steps(args: argparse.Namespace, data: Path) -> list[Step]:
    """The product's retrieval and reading models (docs/retrieval.md, docs/answering.md):
    ``minilm-tuned``, the retriever new indexes are built with when it exists, ``minilm-rerank``,
    the reranker ``rerank = auto`` uses, and ``minilm-reader``, the extractive reader ``reader =
    auto`` uses. Their recipes are the measured ones, whatever the preset."""
    from rag.answer.reader import READER_ARTEFACT
    from rag.models import TUNED_ENCODER
    from rag.retrieval.rerank import AUTO_RERANKER

    tuned, rerank = models_dir() / TUNED_ENCODER, models_dir() / AUTO_RERANKER

    def retriever_step() -> dict:
        from training.finetune.contrastive import train_contrastive, tuned_retriever_config

        s = train_contrastive(tuned_retriever_config(tuned, data, args.device, args.threads))
        return {"n_pairs": s["n_pairs"], "steps": s["steps"], "train_loss": s.get("train_loss")}

    def reranker_step() -> dict:
        from training.finetune.rerank import reranker_config, train_rerank

        s = train_rerank(reranker_config(rerank, data, args.device, args.threads))
        return {"n_rows": s["n_rows"], "steps": s["steps"], "after": s["after"]}

    def reader_step() -> dict:
        from training.finetune.reader import reader_config, train_reader

        s = train_reader(reader_config(reader, data, args.device, args.threads))
        return {"windows": s["windows"], "steps": s["steps"], "dev": s["dev"]}

    reader = models_dir() / READER_ARTEFACT
    return [
        Step(f"{TUNED_ENCODER} (retriever)", tuned, retriever_step, done_marker="modules.json"),
        Step(f"{AUTO_RERANKER} (reranker)", rerank, reranker_step),
        Step(f"{READER_ARTEFACT} (reader)", reader, reader_step, done_marker="reader.json"),
    ]


def run_steps(steps: list[Step], overwrite: bool, progress: bool = True) -> dict:
    """Run each step in order (an existing artefact is skipped unless ``overwrite``); with
    ``progress``, a line off a terminal after each step says how many are done, the rate and
    the ETA (each step's own training loop reports its steps meanwhile)."""
    from rag.cli.progress import Progress

    report = {}
    todo = [s for s in steps if overwrite or not s.exists()]
    bar = Progress(len(todo), "make models", "artefact", enabled=progress and bool(todo), bar=False)
    for step in steps:
        if step.exists() and not overwrite:
            print(
                f"== {step.name}: exists at {step.artefact} (skipped; --overwrite rebuilds)",
                file=sys.stderr,
            )
            report[step.name] = {"artefact": str(step.artefact), "skipped": True}
            continue
        print(f"== {step.name} -> {step.artefact}", file=sys.stderr)
        t0 = time.time()
        step.summary = step.run()
        step.summary.update(artefact=str(step.artefact), seconds=round(time.time() - t0, 1))
        report[step.name] = step.summary
        line = f"== {step.name} done in {step.summary['seconds']:.0f}s -> {step.artefact}"
        if "heldout_bits_per_byte" in step.summary:
            line += (
                f"; held-out {step.summary['heldout_bits_per_byte']:.3f} bits/byte"
                f" vs unigram {step.summary['unigram_bits_per_byte']:.3f}"
            )
        print(line, file=sys.stderr)
        for s in step.summary.get("samples", []):
            print(f"   sample: {s!r}", file=sys.stderr)
        bar.update(1, last=step.name)
    bar.close()
    return report


def main(argv: list[str] | None = None) -> int:
    from rag.cli import OneLineParser, run_cli
    from rag.defaults import DEVICES
    from training.pretrain.config import PRESETS

    p = OneLineParser(prog="python -m training.make_models", description=__doc__.split("\n")[0])
    p.add_argument(
        "--preset", default="small", choices=tuple(PRESETS), help="tiny, small (CPU), base (GPU)"
    )
    p.add_argument("--device", default="auto", choices=DEVICES)
    p.add_argument(
        "--corpus",
        nargs="+",
        type=Path,
        default=[Path(p) for p in default_corpus()],
        help="pretraining folders (default: the project's docs/)",
    )
    p.add_argument(
        "--vocab-size", type=int, default=0, help="tokenizer size (0: 8192 small, 16384 base)"
    )
    p.add_argument(
        "--tokenizer-chars", type=int, default=20_000_000, help="text the tokenizer trains on"
    )
    p.add_argument(
        "--minutes-per-model", type=float, default=15.0, help="wall-time budget per model"
    )
    p.add_argument(
        "--max-steps", type=int, default=0, help="fixed steps per model (0: fit the budget)"
    )
    p.add_argument("--seq-len", type=int, default=0, help="tokens per sequence (0: preset default)")
    p.add_argument(
        "--batch-size", type=int, default=0, help="sequences per step (0: preset default)"
    )
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch default)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--overwrite", action="store_true", help="rebuild artefacts that already exist")
    p.add_argument(
        "--no-progress", action="store_true", help="no progress bars (terminal) or lines (logs)"
    )
    p.add_argument("--json", action="store_true", help="print the report as JSON on stdout")
    return run_cli(p, run, argv)


def run(args: argparse.Namespace) -> int:
    """Check the corpus, run every step (a step that exists is kept unless --overwrite), and
    write the report; a bad flag or corpus exits 2, a failed step 1 (rag.cli)."""
    if missing := [str(c) for c in args.corpus if not c.exists()]:
        raise FileNotFoundError(
            f"--corpus {missing[0]}: no such directory (see ../shared/data/README.md)"
        )
    t0 = time.time()
    report = run_steps(build_steps(args), args.overwrite, progress=not args.no_progress)
    report["total_seconds"] = round(time.time() - t0, 1)
    rag_home().mkdir(parents=True, exist_ok=True)
    (rag_home() / "make_models.json").write_text(json.dumps(report, indent=2) + "\n")
    print(
        json.dumps(report)
        if args.json
        else f"done in {report['total_seconds'] / 60:.1f} min; report: "
        f"{rag_home() / 'make_models.json'}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
