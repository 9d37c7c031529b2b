"""The division-of-labour experiment's only contact with the training code.

Every training step the experiment needs (tokenizer, pretraining, CLM->MLM continuation,
contrastive fine-tune, LoRA) goes through one function here, so a change in a training module's
signature is fixed in one place and the experiment's cells stay readable. Each function takes
plain values and returns what the next cell needs (a folder, a model, a summary dict).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


class StepUnavailable(RuntimeError):
    """A training function the experiment needs is not available in this checkout."""


def train_tokenizer(corpus: list[str], vocab_size: int, out: Path) -> Path:
    """One byte-level BPE tokenizer shared by every row (training.tokenizer). Trained in a
    folder of this process's own and renamed into place, so two processes that start together
    (one per seed, side by side) never read each other's half-written files: the first rename
    wins, the other's copy (the same tokenizer: training is deterministic) is dropped."""
    import os
    import shutil

    from training.tokenizer import train_tokenizer as train

    if not (out / "tokenizer.json").exists():
        tmp = out.with_name(f".{out.name}-{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        train([Path(c) for c in corpus], vocab_size=vocab_size, out=tmp)
        if out.is_dir() and not any(out.iterdir()):
            out.rmdir()  # an empty folder left by an older run: renamed over below
        try:
            os.rename(tmp, out)
        except OSError:  # another process put its tokenizer there first
            shutil.rmtree(tmp, ignore_errors=True)
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
    alternate_every: int = 1,
    init_from: Path | None = None,
    total_steps: int | None = None,
    eval_every: int = 0,
    threads: int = 0,
) -> dict[str, Any]:
    """One pretraining run via ``training.pretrain.train.pretrain``; returns its summary (run.json).

    ``init_from`` starts from another run's weights (the CLM->MLM row): training.pretrain
    converts the CLM decoder's weights into the encoder's layout (training.pretrain.init_from) and
    training continues with the MLM objective. ``alternate_every``: the antlm row's block.
    """
    from training.pretrain.config import PretrainConfig
    from training.pretrain.train import pretrain as run

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
        alternate_every=alternate_every,
        seed=seed,
        device=device,
        eval_every=eval_every,
        save_every=0,
        log_every=max(1, steps // 50),  # enough points for the loss curves at every scale
        threads=threads,
        init_from=str(init_from) if init_from else "",
        overwrite=True,
    )
    summary = run(cfg)
    if init_from is not None:
        summary["init_from"] = str(init_from)
    return summary


def make_pairs(out: Path, *, scifact: str, squad: str, max_pairs: int, seed: int = 0) -> Path:
    """The one pair file every row is fine-tuned on: SciFact train claims -> abstracts and SQuAD
    train-article questions -> paragraphs (dev splits filtered out by training.finetune.contrastive),
    shuffled by ``seed`` and capped at ``max_pairs``. Written once, so rows share it exactly."""
    from training.data.pairs import write_pairs
    from training.finetune.contrastive import ContrastiveConfig, collect_pairs

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
    """Identical contrastive recipe for every row (training.finetune.contrastive); returns the tuned
    SentenceTransformer (also saved in ``out``)."""
    from sentence_transformers import SentenceTransformer

    from training.finetune.contrastive import ContrastiveConfig, train_contrastive

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
    """Identical LoRA recipe for every decoder (training.finetune.lora); returns the adapter folder."""
    try:
        from training.finetune.lora import LoraTrainConfig, train_lora
    except ImportError as e:
        raise StepUnavailable(f"training.finetune.lora is not available ({e})") from None
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


def decoder_folder(model_dir: Path) -> Path | None:
    """The decoder layout of a pretrained row: the folder itself for a CLM, ``<dir>/decoder`` for
    the objectives that save both layouts (antlm, prefixlm), None for an encoder only."""
    from transformers import AutoConfig

    from rag.models import lm_objective
    from training.pretrain.config import DECODER_SUBDIR

    if (Path(model_dir) / DECODER_SUBDIR / "config.json").exists():
        return Path(model_dir) / DECODER_SUBDIR
    return Path(model_dir) if lm_objective(AutoConfig.from_pretrained(model_dir)) == "clm" else None


def encoder_copy(clm_dir: Path, out: Path, max_seq_length: int) -> Path:
    """A CLM's weights in the encoder layout (training.pretrain.init_from's exact conversion), saved once
    in ``out``: the CLM row read with bidirectional attention (the ``clm-bidir`` reading cell)."""
    from training.pretrain.export import save_converted_folder

    if not (out / "config.json").exists():
        save_converted_folder(clm_dir, out, "mlm", max_seq_length)
    return out


def reader(
    model_dir: Path,
    out: Path,
    *,
    squad: str,
    steps: int,
    batch_size: int,
    max_questions: int,
    calibration_questions: int,
    eval_questions: int,
    max_length: int,
    seed: int,
    device: str,
    threads: int = 0,
) -> dict[str, Any]:
    """Identical span-head recipe for every row (training.finetune.reader, its defaults but the sizes):
    ``max_length`` tokens per window (the pretraining length, the longest the rows have seen),
    stride a quarter of it. A decoder folder reads with its causal backbone
    (training.finetune.decoder_qa). Returns the reader's run summary."""
    from training.finetune.reader import ReaderConfig, train_reader

    cfg = ReaderConfig(
        model=str(model_dir),
        out=str(out),
        squad=squad,
        epochs=1000.0,  # max_steps decides
        max_steps=steps,
        batch_size=batch_size,
        max_questions=max_questions,
        calibration_questions=calibration_questions,
        eval_max_questions=eval_questions,
        max_length=max_length,
        stride=max(8, max_length // 4),
        seed=seed,
        device=device,
        threads=threads,
        logging_steps=max(1, steps // 10),
    )
    return train_reader(cfg)
