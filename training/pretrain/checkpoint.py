"""Checkpoints that let ``--resume`` end exactly where an uninterrupted run would.

A checkpoint holds the model, optimizer and scheduler states, the step (which is also the data
position: batch k is a pure function of seed and k), tokens seen, wall time so far and the RNG
states. It is written to a temporary file and renamed, so a ``kill -9`` during the write leaves
the previous checkpoint intact.
"""

from __future__ import annotations

import os
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch

CHECKPOINT = "checkpoint/state.pt"


def rng_state() -> dict[str, Any]:
    state = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_checkpoint(out: Path, model, optimizer, scheduler, progress: dict[str, Any]) -> Path:
    """Atomically write ``out/checkpoint/state.pt``."""
    path = Path(out) / CHECKPOINT
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "scheduler": scheduler.state_dict(),
        "progress": progress,
        "rng": rng_state(),
    }
    tmp = path.with_name(f".state.pt.tmp-{os.getpid()}")
    torch.save(payload, tmp)
    os.replace(tmp, path)
    return path


def load_checkpoint(out: Path, model, optimizer, scheduler, device: str) -> dict[str, Any]:
    """Restore states in place; return the saved progress dict."""
    payload = torch.load(Path(out) / CHECKPOINT, map_location=device, weights_only=False)
    model.load_state_dict(payload["model"])
    optimizer.load_state_dict(payload["optimizer"])
    scheduler.load_state_dict(payload["scheduler"])
    set_rng_state(payload["rng"])
    return payload["progress"]


def has_checkpoint(out: Path) -> bool:
    return (Path(out) / CHECKPOINT).exists()
