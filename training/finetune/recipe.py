"""The fine-tune recipe that :mod:`training.finetune.contrastive`, :mod:`training.finetune.rerank`
and :mod:`training.finetune.lora` share: the training-loop settings (:class:`FinetuneConfig`, so the
three CLIs name them with the same flags and defaults are written once) and a run's set-up around a
transformers / sentence-transformers Trainer (:class:`FinetuneRun`): the output folder, the
seed, the scoped torch thread count, TrainingArguments from the shared settings, the
``train_log.jsonl`` callback, the Trainer's empty output folder removed, ``loss.png`` and
``run.json`` with the hardware line.

Each fine-tune keeps what is its own: the model it builds, its data, its loss and its dev
evaluation, and the few TrainingArguments its recipe needs (a batch sampler, gradient
accumulation, bf16).
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rag.models import pick_device
from rag.models.precision import FLOAT_PRECISIONS, check_precision, resolve_precision
from rag.storage.paths import models_dir


@dataclass
class FinetuneConfig:
    """The training-loop settings of every Trainer fine-tune. A fine-tune's config inherits them
    and re-declares a field only where its recipe needs another default (its starting model, its
    learning rate, ...); the CLI flags are generated from the fields, comments become the help."""

    model: str = ""  # folder, alias or artefact name to start from
    out: str = ""  # output folder ("" = $RAG_HOME/models/<model name>-<fine-tune>)
    epochs: float = 1.0  # passes over the training data
    max_steps: int = -1  # stop after this many optimiser steps (-1 = run the epochs)
    batch_size: int = 16  # rows per forward pass
    lr: float = 2e-5  # peak learning rate (linear warmup then decay)
    warmup_ratio: float = 0.1  # fraction of steps spent warming up
    seed: int = 0  # seed for sampling, mining and training
    device: str = "auto"  # auto | cpu | cuda
    threads: int = 0  # torch CPU threads (0 = torch default)
    logging_steps: int = 10  # log the loss every this many optimiser steps


@dataclass
class FinetuneRun:
    """One fine-tuning run from :func:`finetune_run` to :meth:`finish`: where it writes, on which
    device, and its clocks; :meth:`train` fills in the Trainer's result."""

    cfg: FinetuneConfig
    out: Path
    device: str
    started: float = field(default_factory=time.time)
    result: Any = None  # transformers TrainOutput of :meth:`train`
    train_seconds: float = 0.0

    @property
    def log_path(self) -> Path:
        return self.out / "train_log.jsonl"

    def event(self, **row: Any) -> None:
        """One non-Trainer row of train_log.jsonl (the dev scores before and after)."""
        with self.log_path.open("a") as f:
            f.write(json.dumps(row) + "\n")

    def training_args(self, args_cls: type, **recipe: Any) -> Any:
        """``args_cls`` (TrainingArguments or a sentence-transformers subclass) from the shared
        settings plus the recipe's own keywords. Nothing is checkpointed: the model is saved by
        the fine-tune once, in its own loadable format."""
        return args_cls(
            output_dir=str(self.out / "checkpoints"),
            num_train_epochs=self.cfg.epochs,
            max_steps=self.cfg.max_steps,
            per_device_train_batch_size=self.cfg.batch_size,
            learning_rate=self.cfg.lr,
            # transformers 5: a float < 1 is a fraction of the steps (sentence-transformers maps
            # its deprecated warmup_ratio onto the same field)
            warmup_steps=self.cfg.warmup_ratio,
            logging_steps=self.cfg.logging_steps,
            logging_first_step=True,
            save_strategy="no",
            report_to=[],
            seed=self.cfg.seed,
            use_cpu=self.device == "cpu",
            **recipe,
        )

    def train(self, trainer_cls: type, args: Any, model: Any, train_dataset: Any, **kw: Any) -> Any:
        """Build ``trainer_cls`` with the train_log.jsonl and progress-line callbacks, train,
        and remove the Trainer's output folder (empty: nothing is saved there); returns the
        TrainOutput."""
        trainer = trainer_cls(
            model=model,
            args=args,
            train_dataset=train_dataset,
            callbacks=[jsonl_logger(self.log_path), progress_lines(f"train {self.out.name}")],
            **kw,
        )
        t = time.time()
        self.result = trainer.train()
        self.train_seconds = time.time() - t
        remove_if_empty(self.out / "checkpoints")
        return self.result

    def finish(self, title: str, summary: dict[str, Any]) -> dict[str, Any]:
        """Plot loss.png and write run.json: the config, the fine-tune's own ``summary`` keys,
        then steps, loss, timings and hardware; returns that dict."""
        plot_loss(self.log_path, self.out / "loss.png", title)
        run = {
            "config": asdict(self.cfg),
            "out": str(self.out),
            **summary,
            "steps": self.result.global_step,
            "train_loss": round(self.result.training_loss, 4),
            "train_seconds": round(self.train_seconds, 1),
            "total_seconds": round(time.time() - self.started, 1),
            "hardware": hardware(self.device),
        }
        (self.out / "run.json").write_text(json.dumps(run, indent=2))
        return run


@contextlib.contextmanager
def finetune_run(cfg: FinetuneConfig, kind: str) -> Iterator[FinetuneRun]:
    """Start a run: ``cfg.threads`` torch threads for the block, the device picked, the output
    folder (default ``$RAG_HOME/models/<model name>-<kind>``) created with an empty
    train_log.jsonl, torch seeded."""
    import torch

    with torch_threads(cfg.threads):
        started = time.time()
        device = pick_device(cfg.device)
        out = Path(cfg.out or models_dir() / f"{Path(cfg.model).name}-{kind}")
        out.mkdir(parents=True, exist_ok=True)
        (out / "train_log.jsonl").write_text("")
        torch.manual_seed(cfg.seed)
        yield FinetuneRun(cfg, out, device, started)


# ---------------------------------------------------------------------------- precision

# What a fine-tune's --precision may say: the project's vocabulary
# (rag.models.precision.PRECISION_SETTINGS) less int8, which only inference runs in.
TRAINING_PRECISIONS = ("auto", *FLOAT_PRECISIONS)


def check_training_precision(precision: str) -> str:
    """``precision`` when a fine-tune can train in it (:data:`TRAINING_PRECISIONS`); a one-line
    ValueError naming ``--precision`` otherwise. ``int8`` is in the project's vocabulary but is
    refused here: int8 Linear weights (:func:`rag.models.precision.quantize_dynamic_int8`) take
    no gradient."""
    if precision == "int8":
        raise ValueError(
            "--precision int8 is for inference only (int8 weights cannot be trained);"
            " use auto, fp32 or bf16"
        )
    return check_precision(precision)


def training_precision(precision: str, device: str) -> str:
    """The float precision a fine-tune trains in on ``device`` (a resolved ``cpu`` or
    ``cuda``): ``fp32`` or ``bf16`` as given; ``auto`` is bf16 where bf16 is fast (CUDA, or a CPU
    with bf16 units: :func:`rag.models.precision.bf16_is_fast`), else fp32."""
    return resolve_precision(check_training_precision(precision), device)


# ---------------------------------------------------------------------------- run helpers


def jsonl_logger(path: Path) -> Any:
    """A TrainerCallback appending each Trainer log (loss, learning rate) to ``path``."""
    from transformers import TrainerCallback

    class JsonlLogger(TrainerCallback):
        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs:
                with path.open("a") as f:
                    f.write(
                        json.dumps({"step": state.global_step, "epoch": state.epoch, **logs}) + "\n"
                    )

    return JsonlLogger()


def progress_lines(desc: str, **progress: Any) -> Any:
    """A TrainerCallback that reports optimiser steps through :class:`rag.cli.progress.Progress`
    (steps done/total, rate, ETA, the last logged loss) on the main process. Lines only: on a
    terminal the Trainer draws its own bar, but off one (a log, CI) that bar is carriage-return
    redraws on one line, so a long fine-tune looked hung. ``progress``: Progress's keywords
    (tests pass a clock and a stream)."""
    from transformers import TrainerCallback

    from rag.cli.progress import Progress

    class ProgressLines(TrainerCallback):
        bar: Progress | None = None

        def on_train_begin(self, args, state, control, **kwargs):
            if state.is_world_process_zero:
                total = state.max_steps if state.max_steps and state.max_steps > 0 else None
                kw = {"bar": False, "initial": state.global_step, **progress}
                self.bar = Progress(total, desc, "step", **kw)

        def on_step_end(self, args, state, control, **kwargs):
            if self.bar is not None:
                self.bar.update(state.global_step - self.bar.done)

        def on_log(self, args, state, control, logs=None, **kwargs):
            if self.bar is not None and logs and "loss" in logs:
                self.bar.set_postfix(loss=float(logs["loss"]))

        def on_train_end(self, args, state, control, **kwargs):
            if self.bar is not None:
                self.bar.close()

    return ProgressLines()


def plot_loss(log_path: Path, out_png: Path, title: str) -> None:
    """loss.png from a fine-tuning train_log.jsonl (the pretraining plotter, ranking-loss axis)."""
    from training.plots import plot_losses

    rows = [json.loads(x) for x in log_path.read_text().splitlines() if x.strip()]
    if any("loss" in r for r in rows):
        plot_losses(rows, out_png, title, ylabel="loss")


@contextlib.contextmanager
def torch_threads(n: int) -> Iterator[None]:
    """Use ``n`` torch CPU threads inside the block (0: leave as is), then restore: a caller's
    process (a test session, an experiment) keeps its own setting."""
    import torch

    prev = torch.get_num_threads()
    if n:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(prev)


def remove_if_empty(folder: Path) -> None:
    if folder.is_dir() and not any(folder.iterdir()):
        folder.rmdir()


def hardware(device: str) -> str:
    """The run.json line that says what the timings were measured on."""
    import torch

    if device == "cuda":
        return torch.cuda.get_device_name(0)
    return f"{platform.processor() or platform.machine()} CPU, {os.cpu_count()} cores, {torch.get_num_threads()} torch threads"
