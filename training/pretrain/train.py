"""Pretrain the MLM encoder or the CLM decoder from scratch on a folder of documents.

    python -m training.pretrain --objective mlm        # docs/, a tokenizer trained for it, tiny
    python -m training.pretrain --objective clm --preset small --corpus ../shared/data/python-docs
    python -m training.pretrain --objective antlm --alternate-every 10 --mask-rate 0.15
    python -m training.pretrain --objective prefixlm

``antlm`` (CLM and MLM steps alternating on one set of weights, ending on MLM) and ``prefixlm``
(bidirectional prefix, causal suffix, loss on the suffix) train the encoder layout with the
masks of training.pretrain.objectives and save it twice: the encoder in ``--out`` and the same
weights as a decoder in ``--out``/decoder.

Defaults (training/defaults.py): corpus = the project's docs/, out =
$RAG_HOME/models/<encoder|decoder>-<objective>-<preset>, tokenizer = $RAG_HOME/tokenizer or one
trained for the corpus on the first run and reused after; the first lines printed say which.

Top to bottom: tokenizer and corpus (file-level split, packed windows) → model from the preset →
AdamW + warm-up/cosine → loop (dynamic masks, periodic held-out loss and bits per byte,
checkpoints) → HF folder + run.json + train_log.jsonl + loss.png. ``--resume`` continues from the
last checkpoint and ends where an uninterrupted run would. Under ``torchrun`` each process
trains on its own slice of every batch (DDP), with no code change.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from rag.cli import run_cli
from rag.cli.flags import config_from_args, dataclass_parser
from rag.cli.progress import Progress
from rag.models import pick_device
from training.defaults import DEFAULT_HELP
from training.plots import plot_losses
from training.pretrain.checkpoint import has_checkpoint, load_checkpoint, save_checkpoint
from training.pretrain.config import (
    DECODER_SUBDIR,
    LAYOUT,
    WITH_DECODER,
    PretrainConfig,
    get_preset,
)
from training.pretrain.corpus import (
    PackedBatches,
    eval_windows,
    list_files,
    load_corpus,
    unigram_bits_per_byte,
)
from training.pretrain.export import save_decoder_copy, save_model_folder
from training.pretrain.init_from import load_initial_weights
from training.pretrain.masking import make_spec
from training.pretrain.model import build_model, count_parameters
from training.pretrain.step import Stepper, make_optimizer, make_scheduler
from training.tokenizer import (
    TokenizerChoice,
    choose_tokenizer,
    load_tokenizer,
    tokenizer_line,
    train_for_corpus,
)

LOG, RUN = "train_log.jsonl", "run.json"
# config fields that must match for --resume (the rest, e.g. --max-minutes, may change)
RESUME_KEYS = (
    "objective",
    "preset",
    "seq_len",
    "batch_size",
    "lr",
    "max_steps",
    "seed",
    "mask_rate",
    "mask_strategy",
    "whole_word_mask",
    "alternate_every",
    "corpus",
    "tokenizer",
    "heldout_fraction",
)


class PretrainError(ValueError):
    """A run that cannot start as given (exit 2, rag.cli); the message names the flag or path."""


# ---------------------------------------------------------------------------- setup


def distributed() -> tuple[int, int, int]:
    """(rank, world size, local rank); initialises torch.distributed under torchrun."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world == 1:
        return 0, 1, 0
    import torch.distributed as dist

    if not dist.is_initialized():
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    return dist.get_rank(), world, int(os.environ.get("LOCAL_RANK", "0"))


def prepare_out(cfg: PretrainConfig, rank: int) -> None:
    """Refuse to clobber a previous run unless --resume or --overwrite says what to do."""
    out = Path(cfg.out)
    holds_run = out.exists() and any(out.iterdir())
    if cfg.resume:
        if not has_checkpoint(out):
            raise PretrainError(
                f"--resume: {out} holds no checkpoint (checkpoint/state.pt) to resume"
            )
        saved = json.loads((out / RUN).read_text())["config"]
        changed = [k for k in RESUME_KEYS if saved.get(k) != asdict(cfg)[k]]
        if changed:
            k = changed[0]
            raise PretrainError(
                f"--resume: --{k.replace('_', '-')} is {asdict(cfg)[k]!r} but the run in {out} used {saved.get(k)!r}"
            )
        return
    if holds_run and not cfg.overwrite:
        raise PretrainError(
            f"--out {out} already holds files; pass --resume to continue or --overwrite to replace it"
        )
    if holds_run and rank == 0:
        if not ((out / RUN).exists() or (out / "config.json").exists() or has_checkpoint(out)):
            raise PretrainError(
                f"--overwrite: {out} does not look like a pretraining run; refusing to delete it"
            )
        shutil.rmtree(out)


def read_log(out: Path, upto_step: int) -> list[dict]:
    """Log lines up to ``upto_step`` (later ones were written after the checkpoint we resume)."""
    path = out / LOG
    if not path.exists():
        return []
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [r for r in rows if r["step"] <= upto_step]


def bits_per_byte(loss: float, tokens_per_byte: float) -> float:
    return loss * tokens_per_byte / math.log(2)


# ---------------------------------------------------------------------------- the run


def header_lines(
    cfg: PretrainConfig, given: PretrainConfig, n_files: int, device: str, world: int
) -> dict[str, str]:
    """The run's choices besides the tokenizer, keyed by what they describe. ``cfg`` is the
    resolved config, ``given`` the one the caller passed (empty fields were defaulted)."""
    p = get_preset(cfg.preset)
    default = " (default: the project's docs/)" if not given.corpus else ""
    steps = f"{cfg.max_steps} (the cosine lr schedule spans them)"
    if cfg.schedule == "time":
        steps = f"up to {cfg.max_steps} (the lr schedule follows the clock)"
    if cfg.max_minutes:
        steps += f", stop after {cfg.max_minutes:g} min"
    return {
        "corpus": f"corpus:    {' '.join(cfg.corpus)}{default}, {n_files} files",
        "out": f"out:       {cfg.out}{' (default)' if not given.out else ''}",
        "preset": f"preset:    {p.name} ({p.num_hidden_layers} layers x {p.hidden_size}), "
        f"seq {cfg.seq_len} x batch {cfg.batch_size}, peak lr {cfg.lr:g}",
        "device": f"device:    {device}" + (f" x {world} processes" if world > 1 else ""),
        "steps": f"steps:     {steps}",
        "objective": f"objective: {objective_line(cfg)}",
    }


def objective_line(cfg: PretrainConfig) -> str:
    """What each step trains and which layouts the run saves, in words."""
    mlm = f"MLM ({cfg.mask_rate:.0%}, {cfg.mask_strategy})"
    if cfg.objective == "mlm":
        return f"{mlm}; saves the encoder"
    if cfg.objective == "clm":
        return "CLM (next token); saves the decoder"
    both = (
        f"saves the encoder, and the same weights as a decoder in {Path(cfg.out) / DECODER_SUBDIR}"
    )
    if cfg.objective == "antlm":
        every = f"every {cfg.alternate_every} steps" if cfg.alternate_every > 1 else "every step"
        return f"CLM and {mlm} alternating {every}, ending on MLM; {both}"
    return f"prefix-LM (bidirectional prefix, causal suffix, loss on the suffix); {both}"


def say(line: str, rank: int = 0) -> None:
    """Header lines go to stderr (stdout stays the summary, JSON with --json); rank 0 only."""
    if rank == 0:
        print(line, file=sys.stderr, flush=True)


def announce(
    cfg: PretrainConfig,
    given: PretrainConfig,
    choice: TokenizerChoice,
    n_files: int,
    device: str,
    world: int,
    rank: int,
):
    """Print what the run chose (corpus, tokenizer, out, preset, device, steps), training the
    corpus tokenizer first when ``choice`` asks for it; returns the loaded tokenizer."""
    lines = header_lines(cfg, given, n_files, device, world)
    if choice.how != "train":
        tokenizer = load_tokenizer(choice.path)  # a missing --tokenizer fails before any output
    say(lines["corpus"], rank)
    seconds = None
    if choice.how == "train":
        vocab = get_preset(cfg.preset).tokenizer_vocab
        say(f"tokenizer: training byte-level BPE (up to {vocab} tokens) on these files ...", rank)
        seconds = train_for_corpus(choice, cfg.corpus, vocab)
        tokenizer = load_tokenizer(choice.path)
    say(tokenizer_line(choice, len(tokenizer), seconds), rank)
    if choice.note:
        say(f"           ({choice.note})", rank)
    for key in ("out", "preset", "device", "steps", "objective"):
        say(lines[key], rank)
    return tokenizer


def pretrain(cfg: PretrainConfig, progress: bool = True) -> dict[str, Any]:
    """Run (or resume) one pretraining job; return the run summary also written to run.json."""
    given, cfg = cfg, cfg.resolved()
    threads = torch.get_num_threads()
    try:
        return _pretrain(cfg, given, progress)
    finally:
        torch.set_num_threads(threads)  # --threads must not leak into the caller's process


def _pretrain(cfg: PretrainConfig, given: PretrainConfig, progress: bool) -> dict[str, Any]:
    rank, world, local_rank = distributed()
    device = pick_device(cfg.device)
    if device == "cuda" and world > 1:
        device = f"cuda:{local_rank}"
        torch.cuda.set_device(local_rank)
    if cfg.threads > 0:
        torch.set_num_threads(cfg.threads)
    out = Path(cfg.out)
    preset = get_preset(cfg.preset)
    files = list_files(cfg.corpus)
    choice = choose_tokenizer(cfg.tokenizer, files, preset)
    cfg.tokenizer = str(choice.path)  # run.json and --resume record the folder actually used
    prepare_out(cfg, rank)
    tokenizer = announce(cfg, given, choice, len(files), device, world, rank)
    train, held = load_corpus(cfg.corpus, tokenizer, cfg.heldout_fraction, cfg.seed)
    batches = PackedBatches(train.ids, cfg.seq_len, cfg.batch_size, cfg.seed, rank, world)
    heldout = eval_windows(held.ids, cfg.seq_len, cfg.eval_batches * cfg.batch_size)

    torch.manual_seed(cfg.seed)
    layout = LAYOUT[cfg.objective]  # the model class the objective trains
    model = build_model(cfg.objective, preset, len(tokenizer), tokenizer)
    if cfg.init_from and not cfg.resume:  # a resumed run's checkpoint holds the weights
        load_initial_weights(model, cfg.init_from, layout)
    model = model.to(device)
    model.train()
    if layout == "mlm":  # an instance flag: the saved config stays dense for inference
        model.sparse_prediction = cfg.sparse_prediction
    optimizer = make_optimizer(model, cfg.lr, cfg.weight_decay, device)
    clock = {"t0": time.time()}  # set to the (resumed) start time below
    time_fraction = None
    if cfg.schedule == "time":
        time_fraction = lambda: (time.time() - clock["t0"]) / (cfg.max_minutes * 60)  # noqa: E731
    scheduler = make_scheduler(
        optimizer, cfg.warmup_steps, cfg.max_steps, cfg.min_lr_ratio, time_fraction
    )
    spec = make_spec(tokenizer) if cfg.objective in ("mlm", "antlm") else None
    forward_model = torch.compile(model) if cfg.compiles(device) else model
    if world > 1:
        from torch.nn.parallel import DistributedDataParallel

        forward_model = DistributedDataParallel(
            forward_model, device_ids=[local_rank] if "cuda" in device else None
        )

    def make_stepper(m):  # the same masking and objective for training and evaluation
        args = (cfg.mask_rate, cfg.mask_strategy, cfg.whole_word_mask, cfg.seed)
        schedule = dict(max_steps=cfg.max_steps, alternate_every=cfg.alternate_every)
        return Stepper(m, cfg.objective, device, spec, *args, **schedule)

    stepper = make_stepper(forward_model)  # DDP-wrapped when distributed
    evaluator = make_stepper(model)

    state = {"step": 0, "tokens": 0, "elapsed_s": 0.0, "initial_heldout_loss": None}
    if cfg.resume:
        state = load_checkpoint(out, model, optimizer, scheduler, device)
    log = read_log(out, state["step"])
    out.mkdir(parents=True, exist_ok=True)
    summary = {
        "status": "running",
        "config": asdict(cfg),
        "device": device,
        "compiled": cfg.compiles(device),
        "world_size": world,
        "params": count_parameters(model),
        "vocab_size": len(tokenizer),
        "train_tokens": len(train.ids),
        "heldout_tokens": len(held.ids),
        "train_files": len(train.files),
        "heldout_files": len(held.files),
        "heldout_tokens_per_byte": held.tokens_per_byte,
        "unigram_bits_per_byte": unigram_bits_per_byte(train, held, len(tokenizer)),
    }
    if rank == 0:
        (out / RUN).write_text(json.dumps(summary, indent=2) + "\n")
        with open(out / LOG, "w") as f:  # rewrite: drop lines logged after the checkpoint
            f.writelines(json.dumps(r) + "\n" for r in log)

    def evaluate(step: int) -> float:
        loss = evaluator.evaluate(heldout, cfg.batch_size, seed=cfg.seed + 12345)
        row = {
            "step": step,
            "tokens": state["tokens"],
            "heldout_loss": loss,
            "heldout_bits_per_byte": bits_per_byte(loss, held.tokens_per_byte),
        }
        if cfg.objective in WITH_DECODER:  # the exported decoder's own loss: fully causal
            clm = evaluator.evaluate(heldout, cfg.batch_size, seed=cfg.seed + 12345, kind="clm")
            row["heldout_clm_loss"] = clm
            row["heldout_clm_bits_per_byte"] = bits_per_byte(clm, held.tokens_per_byte)
        append_log(out, row, rank)
        log.append(row)
        return loss

    if state["step"] == 0 and state["initial_heldout_loss"] is None:
        state["initial_heldout_loss"] = evaluate(0)

    bar = Progress(  # a bar on a terminal, a line every $RAG_PROGRESS_INTERVAL s elsewhere
        cfg.max_steps,
        f"{cfg.objective} {cfg.preset}",
        "step",
        initial=state["step"],
        enabled=progress and rank == 0,
    )
    t_start, stop_reason = time.time() - state["elapsed_s"], "max-steps"
    clock["t0"] = t_start
    loss_acc, n_acc, t_log, tok_log = (
        torch.zeros((), device=device),
        0,
        time.time(),
        state["tokens"],
    )
    by_kind: dict[str, list] = {}  # antlm: the CLM and the MLM losses of the interval apart
    last_loss = math.nan
    while state["step"] < cfg.max_steps:
        step = state["step"]
        inputs, labels = stepper.prepare(batches.batch(step), step)
        loss = stepper.step(inputs, labels, optimizer, scheduler, cfg.grad_clip)
        loss_acc += loss
        n_acc += 1
        if cfg.objective == "antlm":
            by_kind.setdefault(stepper.kind_at(step), []).append(loss)
        state["step"] = step + 1
        state["tokens"] += cfg.batch_size * cfg.seq_len * world
        state["elapsed_s"] = time.time() - t_start
        bar.update(1)
        done = state["step"] == cfg.max_steps
        if state["step"] % cfg.log_every == 0 or done:
            last_loss = float(loss_acc) / n_acc
            if not math.isfinite(last_loss):
                raise RuntimeError(  # a failure while running: exit 1 (rag.cli)
                    f"loss became {last_loss} at step {state['step']}; lower --lr ({cfg.lr})"
                )
            now = time.time()
            tps = (state["tokens"] - tok_log) / max(1e-9, now - t_log)
            row = {
                "step": state["step"],
                "tokens": state["tokens"],
                "loss": last_loss,
                "lr": scheduler.get_last_lr()[0],
                "tokens_per_s": tps,
                "epoch": batches.epoch_of(step),
            }
            row.update({f"loss_{k}": float(torch.stack(v).mean()) for k, v in by_kind.items()})
            by_kind = {}
            append_log(out, row, rank)
            log.append(row)
            bar.set_postfix(loss=f"{last_loss:.3f}", tok_s=f"{tps:,.0f}")
            loss_acc, n_acc, t_log, tok_log = (
                torch.zeros((), device=device),
                0,
                now,
                state["tokens"],
            )
        if cfg.eval_every and state["step"] % cfg.eval_every == 0 and not done:
            evaluate(state["step"])
        if cfg.save_every and state["step"] % cfg.save_every == 0 and not done and rank == 0:
            save_checkpoint(out, model, optimizer, scheduler, dict(state))
        if cfg.max_minutes and time_is_up(state["elapsed_s"], cfg.max_minutes, device, world):
            stop_reason = "max-minutes"
            break
    bar.close()

    final = evaluate(state["step"])
    if rank == 0:
        save_checkpoint(out, model, optimizer, scheduler, dict(state))
        save_model_folder(model, tokenizer, layout, out, max_seq_length=cfg.seq_len)
        if cfg.objective in WITH_DECODER:
            save_decoder_copy(model, tokenizer, out, max_seq_length=cfg.seq_len)
        plot_losses(log, out / "loss.png", f"{cfg.objective.upper()} {cfg.preset} ({out.name})")
    train_losses = [r["loss"] for r in log if "loss" in r]
    summary.update(
        status="complete" if stop_reason == "max-steps" or cfg.schedule == "time" else "stopped",
        stop_reason=stop_reason,
        steps=state["step"],
        tokens_seen=state["tokens"],
        # how many times the run read its training split: above ~2 a model this size memorises
        passes=state["tokens"] / max(1, len(train.ids)),
        wall_time_s=state["elapsed_s"],
        tokens_per_s=state["tokens"] / max(1e-9, state["elapsed_s"]),
        initial_heldout_loss=state["initial_heldout_loss"],
        final_heldout_loss=final,
        final_train_loss=train_losses[-1] if train_losses else None,
        heldout_bits_per_byte=bits_per_byte(final, held.tokens_per_byte),
        layouts=saved_layouts(cfg),
    )
    if cfg.objective in WITH_DECODER:
        summary["final_heldout_clm_loss"] = log[-1]["heldout_clm_loss"]
        summary["heldout_clm_bits_per_byte"] = log[-1]["heldout_clm_bits_per_byte"]
    if rank == 0:
        (out / RUN).write_text(json.dumps(summary, indent=2) + "\n")
    return summary


def saved_layouts(cfg: PretrainConfig) -> dict[str, str]:
    """``{"encoder": folder, "decoder": folder}``: where the run saved each layout it has."""
    out = Path(cfg.out)
    if cfg.objective == "clm":
        return {"decoder": str(out)}
    if cfg.objective in WITH_DECODER:
        return {"encoder": str(out), "decoder": str(out / DECODER_SUBDIR)}
    return {"encoder": str(out)}


def append_log(out: Path, row: dict, rank: int) -> None:
    if rank == 0:
        with open(out / LOG, "a") as f:
            f.write(json.dumps(row) + "\n")


def time_is_up(elapsed_s: float, max_minutes: float, device: str, world: int) -> bool:
    """Every process must stop at the same step under DDP: rank 0's clock decides."""
    up = elapsed_s >= max_minutes * 60
    if world == 1:
        return up
    import torch.distributed as dist

    flag = torch.tensor(float(up), device=device)
    dist.broadcast(flag, src=0)
    return bool(flag.item())


# ---------------------------------------------------------------------------- CLI


def build_parser(description: str) -> argparse.ArgumentParser:
    """One flag per PretrainConfig field (rag.cli.flags: help from the field comments, each
    ending in its default, so ``--help`` says what a bare run will do; the "choose for me"
    defaults are :data:`training.defaults.DEFAULT_HELP`), plus ``--json`` and ``--no-progress``.
    ``--objective`` is required: encoder or decoder is the one choice a run cannot guess."""
    p = dataclass_parser(
        "python -m training.pretrain",
        description,
        PretrainConfig,
        shown=DEFAULT_HELP,
        required=("objective",),
    )
    p.add_argument(
        "--json", action="store_true", help="print the run summary as JSON on stdout (default: off)"
    )
    p.add_argument(
        "--no-progress",
        action="store_true",
        help="no progress bar (terminal) or progress lines (logs) (default: off)",
    )
    return p


def run(args: argparse.Namespace) -> int:
    summary = pretrain(config_from_args(PretrainConfig, args), progress=not args.no_progress)
    if os.environ.get("RANK", "0") != "0":
        return 0  # under torchrun only rank 0 reports
    if args.json:
        print(json.dumps(summary))
    else:
        print(
            f"{summary['status']}: {summary['steps']} steps, {summary['tokens_seen']:,} tokens in "
            f"{summary['wall_time_s']:.0f}s; held-out loss {summary['initial_heldout_loss']:.3f} -> "
            f"{summary['final_heldout_loss']:.3f}, {summary['heldout_bits_per_byte']:.3f} bits/byte "
            f"(unigram {summary['unigram_bits_per_byte']:.3f}) -> {summary['config']['out']}"
        )
    return 0


def main(argv: list[str] | None = None) -> int:
    """Exit 2 for a bad flag, value, corpus, tokenizer or --out (one line), 1 when training
    fails (a loss that became NaN): rag.cli's rule."""
    return run_cli(build_parser(__doc__.split("\n")[0]), run, argv)


if __name__ == "__main__":
    raise SystemExit(main())
