"""Head-to-head comparisons and the summary chart of the division-of-labour experiment.

The question the experiment answers is a set of pairwise ones (MLM vs CLM for retrieval, CLM vs
MLM for generation, where CLM->MLM lands), so the differences are computed *paired by seed*: two
rows with the same seed share the data order, the initial weights' RNG and the fine-tuning
batches, so the per-seed difference removes the variation they share. Each comparison reports
the mean difference, its sample std over seeds and in how many seeds the first model was better.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

# (column, metric, heading, higher is better)
COMPARED_METRICS = {
    "retrieval": [
        ("scifact_dev", "SciFact dev nDCG@10", True),
        ("squad_dev", "SQuAD dev nDCG@10", True),
    ],
    "bpb": [("wikitext_bpb", "WikiText-2 bits/byte", False)],
    "reading": [("em", "reading EM", True), ("f1", "reading F1", True)],
}
# (column, first model, second model): "first vs second"
COMPARISONS = [
    ("retrieval", "mlm15-mean", "clm-mean"),
    ("retrieval", "mlm40-mean", "clm-mean"),
    ("retrieval", "mlm40-mean", "clm-last"),
    ("retrieval", "clm2mlm-mean", "clm-mean"),
    ("retrieval", "clm2mlm-mean", "mlm15-mean"),
    ("retrieval", "mlm30-mean", "mlm15-mean"),
    ("retrieval", "mlm30-mean", "clm-mean"),
    ("retrieval", "antlm-mean", "clm-mean"),
    ("retrieval", "antlm-mean", "mlm15-mean"),
    ("retrieval", "antlm-mean", "clm2mlm-mean"),
    ("retrieval", "prefixlm-mean", "clm-mean"),
    ("retrieval", "prefixlm-mean", "mlm15-mean"),
    ("bpb", "clm", "mlm15"),
    ("bpb", "clm", "mlm30"),
    ("bpb", "clm", "mlm40"),
    ("bpb", "clm2mlm", "clm"),
    ("bpb", "clm2mlm", "mlm15"),
    ("bpb", "antlm", "clm"),
    ("bpb", "antlm", "mlm15"),
    ("bpb", "prefixlm", "clm"),
    ("reading", "mlm15", "clm-causal"),
    ("reading", "mlm15", "clm-bidir"),
    ("reading", "clm-bidir", "clm-causal"),
    ("reading", "mlm30", "mlm15"),
    ("reading", "mlm40", "mlm15"),
    ("reading", "clm2mlm", "mlm15"),
    ("reading", "antlm", "mlm15"),
    ("reading", "antlm", "clm-causal"),
    ("reading", "prefixlm", "mlm15"),
    ("reading", "prefixlm", "clm-causal"),
]
ROW_COLOURS = {
    "mlm15": "#4C72B0",
    "mlm30": "#3A5F98",
    "mlm40": "#2A4D7F",
    "clm": "#DD8452",
    "clm2mlm": "#55A868",
    "antlm": "#8172B3",
    "prefixlm": "#C44E52",
}
# bars left to right: retrieval cells carry the pooling, reading cells of the CLM the attention
# it reads with, bits-per-byte cells the bare row name
_ORDER = ["mlm15", "mlm15-mean", "mlm30", "mlm30-mean", "mlm40", "mlm40-mean"]
_ORDER += ["clm", "clm-mean", "clm-last", "clm-causal", "clm-bidir"]
_ORDER += ["clm2mlm", "clm2mlm-mean", "antlm", "antlm-mean", "prefixlm", "prefixlm-mean"]
# hatched bars: a row in the configuration that is not its natural one
_HATCHED = ("-last", "-bidir")


def paired_difference(
    a: dict[str, float], b: dict[str, float], higher_is_better: bool
) -> dict[str, Any] | None:
    """How much better ``a`` is than ``b``, seed by seed (positive = ``a`` better).

    Returns mean, sample std (None for one seed), the per-seed differences and the number of
    seeds in which ``a`` was better; None when the two share no seed.
    """
    seeds = sorted(set(a) & set(b))
    if not seeds:
        return None
    sign = 1.0 if higher_is_better else -1.0
    diffs = [sign * (a[s] - b[s]) for s in seeds]
    return {
        "mean": statistics.fmean(diffs),
        "std": statistics.stdev(diffs) if len(diffs) > 1 else None,
        "per_seed": dict(zip(seeds, diffs, strict=True)),
        "first_better": sum(d > 0 for d in diffs),
        "n": len(diffs),
    }


def _by_seed(agg: dict, column: str, model: str, key: str) -> dict[str, float]:
    return agg.get(column, {}).get(model, {}).get(key, {}).get("by_seed", {})


def head_to_head(agg: dict) -> list[dict[str, Any]]:
    """Every comparison in :data:`COMPARISONS` that has data, for every metric of its column;
    ``agg`` is :func:`evals.division_of_labor.report.aggregate`'s summary (its ``by_seed``
    values)."""
    rows = []
    for column, first, second in COMPARISONS:
        for key, heading, higher in COMPARED_METRICS[column]:
            a, b = _by_seed(agg, column, first, key), _by_seed(agg, column, second, key)
            if (d := paired_difference(a, b, higher)) is not None:
                rows.append({"first": first, "second": second, "metric": heading, **d})
    return rows


def head_to_head_markdown(rows: list[dict[str, Any]]) -> str:
    """The comparisons as a markdown table (positive difference = first model better)."""
    if not rows:
        return ""
    lines = [
        "## Head to head (paired by seed; positive = first model better)",
        "",
        "| first vs second | metric | difference (mean ± std) | per seed | first better in |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        std = f" ± {r['std']:.3f}" if r["std"] is not None else ""
        seeds = ", ".join(f"{v:+.3f}" for v in r["per_seed"].values())
        lines.append(
            f"| {r['first']} vs {r['second']} | {r['metric']} | {r['mean']:+.3f}{std} | {seeds} "
            f"| {r['first_better']}/{r['n']} seeds |"
        )
    return "\n".join(lines) + "\n"


def summary_chart(agg: dict, out: Path, name: str = "division_of_labor.png") -> str | None:
    """Four panels (SciFact, SQuAD, bits per byte, reading F1): one bar per row, a dot per
    seed, baselines as dashed lines. Returns the file name, or None when there are no row
    results yet."""
    panels = [
        ("retrieval", "scifact_dev", "SciFact dev nDCG@10 ↑", ("bm25", "minilm")),
        ("retrieval", "squad_dev", "SQuAD dev nDCG@10 ↑", ("bm25", "minilm")),
        ("bpb", "wikitext_bpb", "WikiText-2 bits/byte ↓", ("smollm2",)),
        ("reading", "f1", "SQuAD dev reading F1 ↑ (gold paragraph)", ()),
    ]
    fig, axes = plt.subplots(1, 4, figsize=(14.5, 3.6))
    drawn = False
    for ax, (column, key, title, baselines) in zip(axes, panels, strict=True):
        models = agg.get(column, {})
        names = [m for m in _ORDER if m in models and key in models[m]]
        for i, m in enumerate(names):
            cell = models[m][key]
            colour = ROW_COLOURS[m.split("-")[0]]
            hatch = "//" if m.endswith(_HATCHED) else None
            ax.bar(i, cell["mean"], color=colour, hatch=hatch, alpha=0.85, edgecolor="white")
            ax.scatter([i] * len(cell["values"]), cell["values"], color="black", s=10, zorder=3)
            drawn = True
        for j, b in enumerate(baselines):
            if b in models and key in models[b]:
                ax.axhline(models[b][key]["mean"], color="grey", ls="--" if j == 0 else ":", lw=1)
                y = models[b][key]["mean"]
                ax.text(0.01, y, b, transform=ax.get_yaxis_transform(), fontsize=7, va="bottom")
        ax.set_xticks(range(len(names)), names, rotation=30, fontsize=8)
        ax.set_title(title, fontsize=10)
    if not drawn:
        plt.close(fig)
        return None
    fig.suptitle(
        "Same backbone, corpus and token budget; only the pretraining objective differs",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(out / name, dpi=110)
    plt.close(fig)
    return name
