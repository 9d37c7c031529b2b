"""Tune the refusal gate's threshold (rag.answer.refusal) from one QA run, without re-decoding.

Run ``evals.qa`` in rag mode with ``--refusal-threshold 1.0`` on the SQuAD *train* articles:
every answer is then decoded with the refusal barred and its p(refusal | prompt) recorded. For
any threshold t, the gated answer of a question is the refusal when p >= t and that decoded
answer otherwise, so one run gives every threshold's EM, F1, citation accuracy, refusal and
false-refusal rates. The chosen threshold is the one that refuses most unanswerable questions
while keeping false refusals within the limit (the answers goal: <= 5 %).

CLI::

    python -m evals.qa --squad ../shared/data/squad/squad-v1.1-dev-part.json --split train \\
        --mode rag --retriever hybrid --k 5 --removed-articles 2 --refusal-threshold 1.0 \\
        --generator qwen2.5-coder-0.5b --adapter auto --out sweep-run.json
    python -m evals.refusal_sweep sweep-run.json --max-false-refusal 0.05
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path

from evals.qa import summarize

DEFAULT_THRESHOLDS = (0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.99)


def gated_row(row: dict, threshold: float) -> dict:
    """``row`` (decoded with the refusal barred) as the gate at ``threshold`` would answer it."""
    p = row.get("refusal_probability")
    if p is None:
        raise ValueError(
            f"question {row.get('id')!r} has no refusal_probability: run evals.qa "
            "with --refusal-threshold 1.0"
        )
    if p < threshold:
        return row
    gold = row.get("citation_correct")
    return {
        **row,
        "refused": True,
        "em": 0.0,
        "f1": 0.0,
        "cited": [],
        "citation_correct": None if gold is None else False,
    }


def sweep(rows: Sequence[dict], thresholds: Sequence[float] = DEFAULT_THRESHOLDS) -> list[dict]:
    """One summary (:func:`evals.qa.summarize`) per threshold, with the threshold in it."""
    return [{"threshold": t, **summarize([gated_row(r, t) for r in rows])} for t in thresholds]


def pick_threshold(table: Sequence[dict], max_false_refusal: float = 0.05) -> dict:
    """The row refusing most unanswerable questions with false refusals <= the limit (ties: the
    higher F1); when no threshold keeps the limit, the one with the fewest false refusals."""
    ok = [r for r in table if r.get("false_refusal_rate", 0.0) <= max_false_refusal]
    if not ok:
        return min(table, key=lambda r: (r.get("false_refusal_rate", 0.0), -r["f1"]))
    return max(ok, key=lambda r: (r.get("refusal_rate_unanswerable", 0.0), r["f1"]))


def format_table(table: Sequence[dict]) -> str:
    """A markdown table of the sweep (percentages)."""
    head = "| threshold | EM | F1 | citation | unanswerable refused | false refusals |"
    lines = [head, "|---|---|---|---|---|---|"]
    for r in table:
        lines.append(
            f"| {r['threshold']:g} | {100 * r['em']:.1f} | {100 * r['f1']:.1f} | "
            f"{100 * r['citation_accuracy']:.1f} | "
            f"{100 * r.get('refusal_rate_unanswerable', 0.0):.1f} | "
            f"{100 * r.get('false_refusal_rate', 0.0):.1f} |"
        )
    return "\n".join(lines)


def read_run(path: str | Path) -> list[dict]:
    """The per-question rows of an evals.qa JSON; a missing or foreign file names itself."""
    try:
        return json.loads(Path(path).read_text())["predictions"]
    except (OSError, KeyError, ValueError) as e:
        raise ValueError(f"{path}: not a readable evals.qa result ({e})") from e


def run(args: argparse.Namespace) -> None:
    table = sweep(read_run(args.run), args.thresholds)
    best = pick_threshold(table, args.max_false_refusal)
    print(format_table(table))
    print(f"\nchosen threshold: {best['threshold']:g}")
    if args.out:
        Path(args.out).write_text(json.dumps({"table": table, "chosen": best}, indent=2))


def main(argv: list[str] | None = None) -> int:
    from rag.cli import OneLineParser, run_cli

    p = OneLineParser(prog="python -m evals.refusal_sweep", description=__doc__.split("\n\n")[0])
    p.add_argument("run", help="evals.qa JSON made with --refusal-threshold 1.0")
    p.add_argument("--thresholds", type=float, nargs="+", default=list(DEFAULT_THRESHOLDS))
    p.add_argument("--max-false-refusal", type=float, default=0.05)
    p.add_argument("--out", default=None, help="write the table and the pick as JSON here")
    return run_cli(p, run, argv)


if __name__ == "__main__":
    raise SystemExit(main())
