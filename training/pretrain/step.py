"""One optimizer step and one loss evaluation: the hot path of pretraining.

Kept separate from the loop so that ``benchmarks/pretrain_throughput.py`` times exactly this code.
The step never synchronises with the host on its own (no ``.item()``): the loop reads the loss
only when it logs. Masks come from a generator seeded by (seed, step), so batch ``k`` is masked
identically in a resumed and an uninterrupted run.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable
from typing import Any

import torch
from torch.optim.lr_scheduler import LambdaLR

from training.pretrain.masking import MaskSpec, mask_tokens
from training.pretrain.objectives import (
    antlm_kind,
    attention_masks,
    next_token_labels,
    sample_prefix_lengths,
)

# what a step feeds the model: plain ids (mlm, clm), or ids with an attention-mask mapping
Inputs = torch.Tensor | dict[str, Any]


def autocast_for(device: str) -> contextlib.AbstractContextManager:
    """bf16 autocast on CUDA; plain fp32 elsewhere (CPU bf16 is slower than fp32 on most CPUs)."""
    if device.startswith("cuda"):
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def make_optimizer(
    model: torch.nn.Module, lr: float, weight_decay: float, device: str
) -> torch.optim.AdamW:
    """AdamW with decoupled decay on matrices only (not on norms, biases); fused on CUDA."""
    decay, no_decay, seen = [], [], set()
    for p in model.parameters():
        if not p.requires_grad or id(p) in seen:
            continue
        seen.add(id(p))
        (decay if p.dim() >= 2 else no_decay).append(p)
    groups = [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    fused = device.startswith("cuda")
    return torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.98), eps=1e-6, fused=fused)


def make_scheduler(
    optimizer,
    warmup_steps: int,
    max_steps: int,
    min_lr_ratio: float,
    time_fraction: Callable[[], float] | None = None,
) -> LambdaLR:
    """Linear warm-up to the peak lr, then cosine decay to ``peak * min_lr_ratio``. With
    ``time_fraction`` (elapsed / time budget) the decay follows steps or time, whichever is
    further along, so a time-limited run on a busy machine still ends its schedule."""

    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        progress = min(1.0, (step - warmup_steps) / max(1, max_steps - warmup_steps))
        if time_fraction is not None:
            progress = min(1.0, max(progress, time_fraction()))
        return min_lr_ratio + (1 - min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))

    return LambdaLR(optimizer, factor)


class Stepper:
    """Turns a batch of packed token windows into a training step for one objective.

    ``mlm`` / ``clm`` hand the model plain ids; ``antlm`` and ``prefixlm``
    (training.pretrain.objectives) hand the encoder-layout model a dict with an attention-mask
    mapping beside the ids, and labels already shifted for their causal part. ``max_steps`` and
    ``alternate_every`` set the antlm schedule (:meth:`kind_at`)."""

    def __init__(
        self,
        model: torch.nn.Module,
        objective: str,
        device: str,
        spec: MaskSpec | None = None,
        mask_rate: float = 0.3,
        mask_strategy: str = "80-10-10",
        whole_word: bool = False,
        seed: int = 0,
        max_steps: int = 0,
        alternate_every: int = 1,
    ):
        self.model, self.objective, self.device = model, objective, device
        self.spec, self.mask_rate, self.mask_strategy, self.whole_word = (
            spec,
            mask_rate,
            mask_strategy,
            whole_word,
        )
        self.seed = seed
        self.max_steps, self.alternate_every = max_steps, alternate_every
        self.generator = torch.Generator(device=device)

    def kind_at(self, step: int) -> str:
        """What step ``step`` trains: the objective itself, or for antlm ``mlm`` / ``clm``."""
        if self.objective == "antlm":
            return antlm_kind(step, self.max_steps, self.alternate_every)
        return self.objective

    def prepare(self, windows: torch.Tensor, step: int) -> tuple[Inputs, torch.Tensor]:
        """(inputs, labels) on the device. MLM: fresh masks seeded by (seed, step);
        CLM: labels are the inputs (the model shifts them by one); prefix-LM: a split per
        sequence from the same seeded generator."""
        ids = windows.to(self.device, non_blocking=True)
        if self.objective == "clm":
            return ids, ids
        self.generator.manual_seed(self.seed * 1_000_003 + step)
        return self.batch(ids, self.kind_at(step), self.generator)

    def batch(
        self, ids: torch.Tensor, kind: str, generator: torch.Generator
    ) -> tuple[Inputs, torch.Tensor]:
        """(inputs, labels) of one ``kind`` of step (``mlm``, ``clm``, ``prefixlm``) on ids."""
        if kind == "mlm":
            return mask_tokens(
                ids, self.spec, self.mask_rate, self.mask_strategy, self.whole_word, generator
            )
        if self.objective == "clm":  # the decoder layout shifts by itself
            return ids, ids
        B, T = ids.shape
        if kind == "clm":  # the encoder layout with the decoder's causal mask
            prefix, first_target = 0, 1
        elif kind == "prefixlm":
            prefix = sample_prefix_lengths(B, T, generator, self.device)
            first_target = prefix
        else:
            raise ValueError(f"unknown step kind {kind!r}")
        config = getattr(self.model, "module", self.model).config  # DDP wraps in .module
        eager = config._attn_implementation == "eager"
        masks = attention_masks(
            prefix,
            T,
            config.local_attention // 2,
            self.device,
            additive_dtype=torch.float32 if eager else None,
        )
        return {"input_ids": ids, "attention_mask": masks}, next_token_labels(ids, first_target)

    def loss(self, inputs: Inputs, labels: torch.Tensor) -> torch.Tensor:
        """Mean cross-entropy over supervised positions (masked tokens, or next tokens)."""
        kw = inputs if isinstance(inputs, dict) else {"input_ids": inputs}
        with autocast_for(self.device):
            return self.model(**kw, labels=labels).loss

    def step(self, inputs, labels, optimizer, scheduler, grad_clip: float = 1.0) -> torch.Tensor:
        """Forward, backward, clip, AdamW update, schedule; returns the loss tensor (no sync)."""
        loss = self.loss(inputs, labels)
        loss.backward()
        if grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), grad_clip)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        return loss.detach()

    @torch.no_grad()
    def evaluate(
        self, windows: torch.Tensor, batch_size: int, seed: int, kind: str | None = None
    ) -> float:
        """Mean held-out loss over fixed windows; MLM masks and prefix splits are fixed by
        ``seed`` so successive evaluations of one run compare like with like. ``kind`` (default:
        the objective; antlm: ``mlm``, the objective it ends on) picks the loss."""
        kind = kind or ("mlm" if self.objective == "antlm" else self.objective)
        was_training = self.model.training
        self.model.eval()
        gen = torch.Generator(device=self.device).manual_seed(seed)
        total, count = 0.0, 0
        for start in range(0, len(windows), batch_size):
            ids = windows[start : start + batch_size].to(self.device)
            inputs, labels = self.batch(ids, kind, gen)
            n = ids.numel() - ids.shape[0] if labels is ids else int((labels != -100).sum())
            if n == 0:
                continue
            total += float(self.loss(inputs, labels)) * n
            count += n
        self.model.train(was_training)
        return total / max(1, count)
