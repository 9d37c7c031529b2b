"""Tables and plots of the division-of-labour experiment, from its cached cells.

Cell names are ``<column>/<model>/s<seed>`` (see evals.division_of_labor); this module groups
them by model, averages over seeds (mean ± sample std; a single seed shows no ±) and writes
``results.json``, ``results.md``, one bar chart per metric and the pretraining loss curves.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from evals.division_of_labor.compare import (  # noqa: E402
    head_to_head,
    head_to_head_markdown,
    summary_chart,
)
from evals.division_of_labor.steps import read_log  # noqa: E402

# (column, metric key in the cell, heading, higher is better)
METRICS = [
    ("pretrain", "tokens_seen", "tokens seen", True),
    ("pretrain", "wall_time_s", "wall time (s)", False),
    ("pretrain", "final_heldout_loss", "final held-out loss (own objective)", False),
    ("pretrain", "final_heldout_clm_loss", "final held-out CLM loss (its decoder)", False),
    ("retrieval", "scifact_dev", "SciFact dev nDCG@10", True),
    ("retrieval", "squad_dev", "SQuAD dev nDCG@10", True),
    ("bpb", "wikitext_bpb", "WikiText-2 bits/byte (left to right)", False),
    ("qa", "em", "QA EM", True),
    ("qa", "f1", "QA F1", True),
    ("qa", "citation_accuracy", "QA citation accuracy", True),
    ("qa", "refusal_rate", "QA refusal rate", False),
    ("reading", "em", "reading EM", True),
    ("reading", "f1", "reading F1", True),
    ("reading", "f1_before", "F1 before the fine-tune", True),
]
TABLES = {
    "pretrain": "Pretraining (same budget per row; losses of different objectives are not comparable)",
    "retrieval": "Retrieval (identical contrastive fine-tune; pooling in brackets)",
    "bpb": "Generation: bits per byte of left-to-right prediction (lower is better)",
    "qa": "Grounded QA on SQuAD dev articles (oracle passages, identical LoRA)",
    "reading": "Reading: identical span-head fine-tune (training.finetune.reader), SQuAD dev articles, "
    "gold paragraph (clm: -causal as pretrained, -bidir converted to the encoder layout)",
}


def aggregate(cells: dict[str, dict]) -> dict[str, dict[str, dict[str, Any]]]:
    """``{column: {model: {metric: {"mean", "std", "n", "values", "by_seed"}}}}`` over seeds
    (``by_seed`` maps ``s<seed>`` to the value, for comparisons paired by seed)."""
    groups: dict[str, dict[str, dict[str, dict[str, float]]]] = {}
    for name, value in cells.items():
        parts = name.split("/")
        if len(parts) != 3 or "skipped" in value:
            continue
        column, model, seed = parts
        for col, key, _, _ in METRICS:
            if col == column and isinstance(value.get(key), (int, float)):
                by_model = groups.setdefault(column, {}).setdefault(model, {})
                by_model.setdefault(key, {})[seed] = float(value[key])
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for column, models in groups.items():
        for model, metrics in models.items():
            for key, by_seed in metrics.items():
                vals = list(by_seed.values())
                std = statistics.stdev(vals) if len(vals) > 1 else None
                out.setdefault(column, {}).setdefault(model, {})[key] = {
                    "mean": statistics.fmean(vals),
                    "std": std,
                    "n": len(vals),
                    "values": vals,
                    "by_seed": by_seed,
                }
    return out


def _fmt(cell: dict[str, Any] | None) -> str:
    if cell is None:
        return "–"
    if all(float(v).is_integer() and abs(v) >= 1000 for v in cell["values"]):
        s = f"{cell['mean']:,.0f}"  # counts (tokens seen): no decimals
        std = f" ± {cell['std']:,.0f}" if cell["std"] else ""
    else:
        s = f"{cell['mean']:.3f}"
        std = f" ± {cell['std']:.3f}" if cell["std"] is not None else ""
    return s + std + f" (n={cell['n']})"


def markdown(agg: dict, meta: dict) -> str:
    """The results as markdown tables, one per column group."""
    lines = [f"# Division of labour: preset `{meta['config']['preset']}`", ""]
    lines.append(
        f"Seeds: {meta['config']['seeds']}; device: {meta['device']} ({meta['hardware']}). "
        "Values are mean ± sample std over seeds (n = number of seeds)."
    )
    for column, title in TABLES.items():
        models = agg.get(column, {})
        if not models:
            continue
        keys = [(k, h) for c, k, h, _ in METRICS if c == column]
        lines += [
            "",
            f"## {title}",
            "",
            "| model | " + " | ".join(h for _, h in keys) + " |",
            "|---|" + "---|" * len(keys),
        ]
        for model in sorted(models):
            lines.append(
                f"| {model} | " + " | ".join(_fmt(models[model].get(k)) for k, _ in keys) + " |"
            )
    if left := meta.get("left"):
        lines += ["", "## Rows and seeds not finished", ""]
        lines += [f"- `{pair}`" for pair in left]
        lines += ["", "The same command again resumes from the finished cells."]
    skipped = meta.get("skipped") or {}
    if skipped:
        lines += ["", "## Cells not run", ""] + [
            f"- `{k}`: {v}" for k, v in sorted(skipped.items())
        ]
    return "\n".join(lines) + "\n"


def bar_charts(agg: dict, out: Path) -> list[str]:
    """One bar chart (with std error bars) per metric; returns the file names."""
    files = []
    for column, key, heading, higher in METRICS:
        if column == "pretrain":  # budgets and own-objective losses: tables and curves only
            continue
        models = {m: v[key] for m, v in agg.get(column, {}).items() if key in v}
        if not models:
            continue
        names = sorted(models)
        fig, ax = plt.subplots(figsize=(max(4, 0.9 * len(names) + 2), 3.2))
        means = [models[n]["mean"] for n in names]
        errs = [models[n]["std"] or 0.0 for n in names]
        ax.bar(names, means, yerr=errs, capsize=4, color="#4C72B0")
        ax.set_title(heading + ("" if higher else " (lower is better)"), fontsize=10)
        ax.tick_params(axis="x", rotation=30, labelsize=8)
        fig.tight_layout()
        name = f"{column}_{key}.png"
        fig.savefig(out / name, dpi=110)
        plt.close(fig)
        files.append(name)
    return files


def loss_curves(cells: dict[str, dict], out: Path) -> str | None:
    """Pretraining loss against step for every row and seed (stages laid end to end)."""
    fig, ax = plt.subplots(figsize=(6, 3.6))
    drawn = False
    for name, value in sorted(cells.items()):
        if not name.startswith("pretrain/") or "stage_dirs" not in value:
            continue
        offset, xs, ys = 0, [], []
        for d in value["stage_dirs"]:
            rows = [r for r in read_log(Path(d) / "train_log.jsonl") if "loss" in r and "step" in r]
            xs += [offset + r["step"] for r in rows]
            ys += [r["loss"] for r in rows]
            offset = xs[-1] if xs else offset
        if xs:
            ax.plot(xs, ys, label=name.removeprefix("pretrain/"), linewidth=1)
            drawn = True
    if not drawn:
        plt.close(fig)
        return None
    ax.set_xlabel("step")
    ax.set_ylabel("training loss (nats/token)")
    ax.set_title("Pretraining loss (MLM and CLM losses are not comparable)", fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "pretrain_loss.png", dpi=110)
    plt.close(fig)
    return "pretrain_loss.png"


def write_report(out: Path, cells: dict[str, dict], meta: dict) -> dict:
    """Write results.json, results.md and the plots into ``out``; returns the results dict."""
    agg = aggregate(cells)
    meta = {**meta, "skipped": {k: v["skipped"] for k, v in cells.items() if "skipped" in v}}
    plots = [p for p in (summary_chart(agg, out), loss_curves(cells, out)) if p]
    plots += bar_charts(agg, out)
    comparisons = head_to_head(agg)
    results = {**meta, "summary": agg, "head_to_head": comparisons, "cells": cells, "plots": plots}
    (out / "results.json").write_text(json.dumps(results, indent=2))
    md = markdown(agg, meta) + "\n" + head_to_head_markdown(comparisons)
    md += "\n" + "\n".join(f"![{p}]({p})" for p in results["plots"]) + "\n"
    (out / "results.md").write_text(md)
    return results
