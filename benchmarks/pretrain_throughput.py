"""Pretraining throughput: our training step vs a plain transformers loop, same model, same run.

    python -m benchmarks.pretrain_throughput --presets tiny small --objectives mlm clm

"ours" is ``training.pretrain.step.Stepper`` — the exact step function ``training.pretrain`` runs: dynamic
masking on the device, ModernBERT's ``sparse_prediction`` for MLM (vocabulary projection only at
masked positions), bf16 autocast + fused AdamW on CUDA, optional ``torch.compile``, no host sync
inside the step. "plain" is the textbook loop on the same freshly built model: dense logits,
``loss.backward()``, ``torch.optim.AdamW`` (foreach, not fused), bf16 autocast on GPU / fp32 on
CPU, no compile. Both get the same masked batches. The two are timed in alternating rounds so a
machine whose load changes (a shared CPU) affects both alike.

MFU = achieved model FLOPs / peak, with model FLOPs per token = 6 x parameters (output projection
included, counted dense for both paths) + 12 x layers x hidden x seq_len (attention), the PaLM
convention. Peaks are known only for listed GPUs (bf16 dense); on CPU the ratio to the plain
loop is the figure to read.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from rag.cli.flags import config_parser, run_config_cli
from training.pretrain.config import OBJECTIVES, PRESETS, get_preset
from training.pretrain.masking import make_spec
from training.pretrain.model import build_model, count_parameters
from training.pretrain.step import Stepper, autocast_for, make_optimizer, make_scheduler

PROG = "benchmarks.pretrain_throughput"
# bf16 dense tensor-core peaks (FLOP/s), from the vendors' datasheets
PEAK_BF16 = {"H200": 989e12, "H100": 989e12, "A100": 312e12, "L4": 121e12, "A10": 125e12}


@dataclass
class PretrainBenchConfig:
    """What to measure; every field is a ``--kebab-case`` flag."""

    presets: list[str] = field(default_factory=lambda: ["tiny", "small"])  # model sizes to time
    objectives: list[str] = field(default_factory=lambda: ["mlm", "clm"])  # objectives to time
    device: str = "auto"  # auto | cpu | cuda
    batch_size: int = 0  # sequences per step (0 = the preset's)
    seq_len: int = 0  # tokens per sequence (0 = the preset's)
    vocab_size: int = 0  # vocabulary (0 = 8192 for tiny and small, 16384 for base)
    steps: int = 5  # timed steps per round and path
    rounds: int = 3  # alternating rounds (ours, plain)
    warmup: int = 2  # untimed steps per path before the rounds
    threads: int = 0  # torch CPU threads (0 = torch's default)
    compile: bool = False  # torch.compile our model


def check(cfg: PretrainBenchConfig) -> None:
    """Refuse a run that cannot measure anything (exit 2, rag.cli), before building a model."""
    for name, low in (("steps", 1), ("rounds", 1), ("warmup", 0), ("batch_size", 0),
                      ("seq_len", 0), ("vocab_size", 0), ("threads", 0)):  # fmt: skip
        if getattr(cfg, name) < low:
            raise ValueError(
                f"--{name.replace('_', '-')} must be >= {low}, not {getattr(cfg, name)}"
            )


def peak_flops(device: str) -> float | None:
    if not device.startswith("cuda"):
        return None
    name = torch.cuda.get_device_name()
    return next((v for k, v in PEAK_BF16.items() if k in name), None)


def flops_per_token(model, preset, seq_len: int) -> float:
    n = count_parameters(model)["total"]
    return 6 * n + 12 * preset.num_hidden_layers * preset.hidden_size * seq_len


class PlainLoop:
    """The baseline: same model, dense logits, eager AdamW, nothing else."""

    def __init__(self, model, device: str, lr: float):
        self.model, self.device = model, device
        self.opt = torch.optim.AdamW(model.parameters(), lr=lr)

    def step(self, inputs, labels):
        with autocast_for(self.device):
            loss = self.model(input_ids=inputs, labels=labels).loss
        loss.backward()
        self.opt.step()
        self.opt.zero_grad()
        return loss


def measure(objective, preset_name, tok_vocab, tokenizer, cfg, device) -> dict:
    """Ours and plain on one (objective, preset); ``cfg`` is a :class:`PretrainBenchConfig`."""
    preset = get_preset(preset_name)
    B = cfg.batch_size or preset.batch_size
    T = cfg.seq_len or preset.seq_len
    torch.manual_seed(0)
    ours_model = build_model(objective, preset, tok_vocab, tokenizer).to(device).train()
    plain_model = build_model(objective, preset, tok_vocab, tokenizer).to(device).train()
    plain_model.load_state_dict(ours_model.state_dict())
    if objective == "mlm":
        ours_model.sparse_prediction = True
    fwd = torch.compile(ours_model) if cfg.compile else ours_model
    spec = make_spec(tokenizer)
    ours = Stepper(fwd, objective, device, spec, mask_rate=0.3)
    opt = make_optimizer(ours_model, 1e-4, 0.01, device)
    sched = make_scheduler(opt, 10, 10_000, 0.1)
    plain = PlainLoop(plain_model, device, 1e-4)
    windows = torch.randint(5, tok_vocab, (B, T))

    def run_ours(k, start):
        for i in range(k):
            ours.step(*ours.prepare(windows, start + i), opt, sched)

    def run_plain(k, start):
        for i in range(k):
            plain.step(*ours.prepare(windows, start + i))  # same masking code, dense loss

    def timed(fn, k, start) -> float:
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        t = time.perf_counter()
        fn(k, start)
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        return time.perf_counter() - t

    run_ours(cfg.warmup, 0)
    run_plain(cfg.warmup, 0)
    t_ours = t_plain = 0.0
    for r in range(cfg.rounds):
        t_ours += timed(run_ours, cfg.steps, 100 + r * cfg.steps)
        t_plain += timed(run_plain, cfg.steps, 100 + r * cfg.steps)
    tokens = B * T * cfg.steps * cfg.rounds
    fpt = flops_per_token(ours_model, preset, T)
    peak = peak_flops(device)
    row = {
        "objective": objective,
        "preset": preset_name,
        "device": device,
        "batch": B,
        "seq_len": T,
        "ours_tokens_per_s": tokens / t_ours,
        "plain_tokens_per_s": tokens / t_plain,
        "ratio": t_plain / t_ours,
        "compile": cfg.compile,
    }
    if peak:
        row["ours_mfu"] = tokens / t_ours * fpt / peak
        row["plain_mfu"] = tokens / t_plain * fpt / peak
    return row


def run(cfg: PretrainBenchConfig) -> dict[str, Any]:
    """Every (preset, objective) pair; rows are also logged to stderr as they finish."""
    from rag.models import pick_device

    device = pick_device(cfg.device)
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    rows = []
    for preset in cfg.presets:
        vocab = cfg.vocab_size or (16384 if preset == "base" else 8192)
        tokenizer = _vocab_only_tokenizer(vocab)
        for objective in cfg.objectives:
            row = measure(objective, preset, vocab, tokenizer, cfg, device)
            rows.append(row)
            mfu = (
                f", MFU {row['ours_mfu']:.1%} vs {row['plain_mfu']:.1%}"
                if "ours_mfu" in row
                else ""
            )
            print(
                f"{objective} {preset:5s} B={row['batch']} T={row['seq_len']}: ours "
                f"{row['ours_tokens_per_s']:,.0f} tok/s, plain {row['plain_tokens_per_s']:,.0f} tok/s "
                f"(x{row['ratio']:.2f}){mfu}",
                file=sys.stderr,
            )
    return {"device": device, "threads": torch.get_num_threads(), "rows": rows}


def build_parser() -> Any:
    choices = {"presets": tuple(PRESETS), "objectives": OBJECTIVES}
    return config_parser(f"python -m {PROG}", __doc__, PretrainBenchConfig, choices=choices)


def main(argv: list[str] | None = None) -> int:
    return run_config_cli(build_parser(), PretrainBenchConfig, run, argv, check=check)


class _vocab_only_tokenizer:
    """The few tokenizer attributes the models and the masker read, for a vocabulary of ``n``
    ids laid out like training.tokenizer's (5 specials first): no corpus needed to benchmark."""

    def __init__(self, n: int):
        self.n = n
        self.pad_token_id, self.unk_token_id, self.bos_token_id, self.eos_token_id = 0, 1, 2, 3
        self.mask_token_id, self.cls_token_id, self.sep_token_id = 4, 2, 3
        self.all_special_ids = [0, 1, 2, 3, 4]

    def __len__(self) -> int:
        return self.n

    def convert_ids_to_tokens(self, ids):
        return ["Ġw" if i % 3 == 0 else "x" for i in ids]


if __name__ == "__main__":
    raise SystemExit(main())
