"""The division-of-labour experiment's only contact with the training code.

Every training step the experiment needs (tokenizer, pretraining, CLM->MLM continuation,
contrastive fine-tune, LoRA) goes through one function here, so a change in a training module's
signature is fixed in one place and the experiment's cells stay readable. Each function takes
plain values and returns what the next cell needs (a folder, a model, a summary dict).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch


class StepUnavailable(RuntimeError):
    """A training function the experiment needs is not available in this checkout."""


def train_tokenizer(corpus: list[str], vocab_size: int, out: Path) -> Path:
    """One byte-level BPE tokenizer shared by every row (training.tokenizer)."""
    from training.tokenizer import train_tokenizer as train

    if not (out / "tokenizer.json").exists():
        train([Path(c) for c in corpus], vocab_size=vocab_size, out=out)
    return out


def pretrain(
    objective: str,
    out: Path,
    *,
    preset: str,
    corpus: list[str],
    tokenizer: Path,
    steps: int,
    seq_len: int,
    batch_size: int,
    seed: int,
    device: str,
    mask_rate: float = 0.15,
    mask_strategy: str = "80-10-10",
    init_from: Path | None = None,
    total_steps: int | None = None,
    eval_every: int = 0,
    threads: int = 0,
) -> dict[str, Any]:
    """One pretraining run via ``training.pretrain.pretrain``; returns its summary (run.json).

    ``init_from`` starts from another run's weights (the CLM->MLM row): the CLM decoder's
    weights are converted into an encoder's (:func:`clm_to_mlm_state_dict`) and training
    continues with the MLM objective.
    """
    from training.config import PretrainConfig
    from training.pretrain import pretrain as run

    fields = {f.name for f in dataclasses.fields(PretrainConfig)}
    cfg = PretrainConfig(
        objective=objective,
        preset=preset,
        corpus=list(corpus),
        out=str(out),
        tokenizer=str(tokenizer),
        max_steps=steps,
        seq_len=seq_len,
        batch_size=batch_size,
        mask_rate=mask_rate,
        mask_strategy=mask_strategy,
        seed=seed,
        device=device,
        eval_every=eval_every,
        save_every=0,
        log_every=max(1, steps // 50),  # enough points for the loss curves at every scale
        threads=threads,
        overwrite=True,
    )
    if init_from is None:
        return run(cfg)
    if "init_from" in fields:  # the training code grew the option: use it
        cfg.init_from = str(init_from)
        return run(cfg)
    with _start_from(init_from):
        summary = run(cfg)
    summary["init_from"] = str(init_from)
    return summary


@contextmanager
def _start_from(weights_dir: Path) -> Iterator[None]:
    """Make ``training.pretrain`` start from ``weights_dir`` instead of a fresh init.

    ``training.pretrain`` has no init-from option, so for the duration of one call its
    ``build_model`` is wrapped: the fresh model is built as usual (same preset, same tokenizer),
    then the saved weights are loaded into it, converted from decoder to encoder layout when the
    objectives differ. Every weight must be matched; a missing or extra tensor is an error.
    """
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForMaskedLM

    import training.pretrain as tp

    original = tp.build_model

    def build(objective: str, *args: Any, **kwargs: Any):
        model = original(objective, *args, **kwargs)
        src_cfg = AutoConfig.from_pretrained(weights_dir)
        is_clm = any(a.endswith("ForCausalLM") for a in (src_cfg.architectures or []))
        cls = AutoModelForCausalLM if is_clm else AutoModelForMaskedLM
        state = cls.from_pretrained(weights_dir, dtype=torch.float32).state_dict()
        if is_clm and objective == "mlm":
            state = clm_to_mlm_state_dict(state)
        missing, unexpected = model.load_state_dict(state, strict=False)
        if missing or unexpected:
            raise RuntimeError(
                f"--init-from {weights_dir}: missing {missing}, unexpected {unexpected}"
            )
        return model

    tp.build_model = build
    try:
        yield
    finally:
        tp.build_model = original


def clm_to_mlm_state_dict(clm: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """ModernBertDecoderForCausalLM weights renamed into ModernBertForMaskedLM's layout: the
    separate q/k/v projections are stacked into ``Wqkv`` and ``lm_head`` becomes ``head``."""
    out: dict[str, torch.Tensor] = {}
    for name, t in clm.items():
        if ".attn.q_proj." in name:
            base = name.replace(".q_proj.", ".Wqkv.")
            k = clm[name.replace(".q_proj.", ".k_proj.")]
            v = clm[name.replace(".q_proj.", ".v_proj.")]
            out[base] = torch.cat([t, k, v], dim=0)
        elif ".attn.k_proj." in name or ".attn.v_proj." in name:
            continue
        elif name.startswith("lm_head."):
            out["head." + name.removeprefix("lm_head.")] = t
        else:
            out[name] = t
    return out


def make_pairs(out: Path, *, scifact: str, squad: str, max_pairs: int, seed: int = 0) -> Path:
    """The one pair file every row is fine-tuned on: SciFact train claims -> abstracts and SQuAD
    train-article questions -> paragraphs (dev splits filtered out by training.contrastive),
    shuffled by ``seed`` and capped at ``max_pairs``. Written once, so rows share it exactly."""
    from training.contrastive import ContrastiveConfig, collect_pairs
    from training.pairs import write_pairs

    if not out.exists():
        cfg = ContrastiveConfig(scifact=scifact, squad=squad, max_pairs=max_pairs, seed=seed)
        tmp = out.with_suffix(".tmp")
        write_pairs(collect_pairs(cfg), tmp)
        tmp.replace(out)
    return out


def contrastive(
    model_dir: Path,
    out: Path,
    *,
    pooling: str,
    pairs: Path,
    steps: int,
    batch_size: int,
    max_seq_length: int,
    lr: float,
    seed: int,
    device: str,
    threads: int = 0,
):
    """Identical contrastive recipe for every row (training.contrastive); returns the tuned
    SentenceTransformer (also saved in ``out``)."""
    from sentence_transformers import SentenceTransformer

    from training.contrastive import ContrastiveConfig, train_contrastive

    cfg = ContrastiveConfig(
        model=str(model_dir),
        out=str(out),
        pairs=[str(pairs)],
        max_steps=steps,
        epochs=1000.0,  # max_steps decides
        batch_size=batch_size,
        lr=lr,
        pooling=pooling,
        max_seq_length=max_seq_length,
        eval=False,
        seed=seed,
        device=device,
        threads=threads,
        logging_steps=max(1, steps // 10),
    )
    summary = train_contrastive(cfg)
    model = SentenceTransformer(str(out), device=device, local_files_only=True)
    return model, summary


def lora(
    model_dir: str | Path,
    out: Path,
    *,
    squad: str,
    steps: int,
    max_examples: int,
    k_passages: int,
    lr: float,
    seed: int,
    device: str,
    threads: int = 0,
) -> Path:
    """Identical LoRA recipe for every decoder (training.lora); returns the adapter folder."""
    try:
        from training.lora import LoraTrainConfig, train_lora
    except ImportError as e:
        raise StepUnavailable(f"training.lora is not available ({e})") from None
    cfg = LoraTrainConfig(
        model=str(model_dir),
        out=str(out),
        data=[squad],
        max_steps=steps,
        epochs=1000.0,  # max_steps decides
        max_examples=max_examples,
        k_passages=k_passages,
        lr=lr,
        eval=False,  # the experiment scores every model with evals.qa instead
        seed=seed,
        device=device,
        threads=threads,
    )
    train_lora(cfg)
    return out


def read_log(path: Path) -> list[dict]:
    """Rows of a ``train_log.jsonl`` (missing file: none)."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
