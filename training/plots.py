"""loss.png: training and held-out loss against step (matplotlib, Agg backend)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def plot_losses(
    log: list[dict], out: Path, title: str, ylabel: str = "cross-entropy (nats/token)"
) -> Path:
    """Plot ``loss`` and ``heldout_loss`` entries of a train log; returns the png path."""
    train = [(r["step"], r["loss"]) for r in log if "loss" in r]
    held = [(r["step"], r["heldout_loss"]) for r in log if "heldout_loss" in r]
    fig, ax = plt.subplots(figsize=(7, 4))
    if train:
        ax.plot(*zip(*train, strict=True), label="train loss", lw=1)
    if held:
        ax.plot(*zip(*held, strict=True), "o-", label="held-out loss", lw=1.5, ms=3)
    ax.set_xlabel("step")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    path = Path(out)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
