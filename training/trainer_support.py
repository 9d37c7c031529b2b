"""What the Trainer-based fine-tunes (training.contrastive, training.rerank, training.lora) share
around a run: the ``train_log.jsonl`` callback and events, the loss plot, a scoped torch thread
count, the Trainer's empty output folder removed, and the hardware line of ``run.json``."""

from __future__ import annotations

import contextlib
import json
import platform
from pathlib import Path
from typing import Any


def jsonl_logger(path: Path):
    from transformers import TrainerCallback

    class JsonlLogger(TrainerCallback):
        """Appends each Trainer log (loss, learning rate) to train_log.jsonl."""

        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs:
                with path.open("a") as f:
                    f.write(
                        json.dumps({"step": state.global_step, "epoch": state.epoch, **logs}) + "\n"
                    )

    return JsonlLogger()


def plot_loss(log_path: Path, out_png: Path, title: str) -> None:
    """loss.png from a fine-tuning train_log.jsonl (the pretraining plotter, ranking-loss axis)."""
    from training.plots import plot_losses

    rows = [json.loads(x) for x in log_path.read_text().splitlines() if x.strip()]
    if any("loss" in r for r in rows):
        plot_losses(rows, out_png, title, ylabel="loss")


def log_event(path: Path, **row: Any) -> None:
    with path.open("a") as f:
        f.write(json.dumps(row) + "\n")


@contextlib.contextmanager
def torch_threads(n: int):
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
    import os

    import torch

    if device == "cuda":
        return torch.cuda.get_device_name(0)
    return f"{platform.processor() or platform.machine()} CPU, {os.cpu_count()} cores, {torch.get_num_threads()} torch threads"
