"""The grounded-answer table of docs/answering.md, from the JSON files the evals wrote.

    python -m evals.answers_report artifacts/evals/answers

Reads every ``qa-*.json`` (:mod:`evals.qa`, RAG mode) and ``docqa-*.json`` (:mod:`evals.docqa`)
in the folder and prints one markdown table per kind, a row per decoder (+ adapter), so the
numbers in the docs come from files a person can open, never from copying by hand.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

QA_COLUMNS = (
    ("EM", "em", 100),
    ("F1", "f1", 100),
    ("citation acc.", "citation_accuracy", 100),
    ("refused (unanswerable)", "refusal_rate_unanswerable", 100),
    ("false refusals", "false_refusal_rate", 100),
    ("s/answer (p50)", "latency_p50_s", 1),
    ("s/answer (p90)", "latency_p90_s", 1),
    ("tokens/s", "tokens_per_s", 1),
)
DOCQA_COLUMNS = (
    ("hit@5 (page)", "hit@k", 100),
    ("keywords", "keyword_rate", 100),
    ("right-page citation", "right_page_citation_rate", 100),
    ("own markers", "self_citation_rate", 100),
    ("refusals", "refusal_rate", 100),
    ("s/answer (p50)", "seconds_p50", 1),
    ("s/answer (p90)", "seconds_p90", 1),
    ("tokens/s", "new_tokens_per_s", 1),
)


def flat_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """An eval's saved config with its pipeline settings by flat name: newer files hold them
    under ``rag`` by section (evals.pipeline_flags), older ones at the top."""
    rag = config.get("rag")
    if not isinstance(rag, Mapping):
        return dict(config)
    settings = {k: v for k, v in rag.items() if not isinstance(v, Mapping)}
    for section in rag.values():
        if isinstance(section, Mapping):
            settings.update(section)
    own = {k: v for k, v in config.items() if k != "rag"}
    return {**settings, **own}  # an eval's own field wins (evals.qa's mode: oracle | rag)


def row_name(config: Mapping[str, Any]) -> str:
    """``decoder`` or ``decoder + LoRA`` (and the refusal gate's and the answerability check's
    thresholds when set) from an eval's saved config."""
    config = flat_config(config)
    decoder = config.get("generator") or config.get("decoder") or "?"
    adapter = config.get("adapter")
    name = f"{decoder} + LoRA" if adapter and adapter not in ("none", "auto") else f"{decoder}"
    reader = config.get("reader")  # runs before the reader existed have no key: no reader
    if reader and reader != "none":
        label = "reader" if reader == "auto" else Path(str(reader)).name
        name = f"{label} alone" if config.get("compose") == "extract" else f"{label} + {name}"
    gate = config.get("refusal_threshold")
    if gate is not None:  # 1.0: decoded with the refusal barred, never refused by the decoder
        name = f"{name}, refusal barred" if gate >= 1 else f"{name}, refusal gate {gate:g}"
    # runs before the answerability check existed have no key: the check was off
    check = config.get("answerability_threshold")
    return f"{name}, answerability check {check:g}" if check is not None else name


def cell(value: Any, scale: float) -> str:
    if value is None:
        return "–"
    return f"{value * scale:.1f}" if scale != 1 else f"{value:.2f}"


def table(results: list[dict], columns: tuple[tuple[str, str, float], ...], count: str) -> str:
    """A markdown table: one row per result, the question count, then the columns."""
    head = "| decoder | questions | " + " | ".join(c[0] for c in columns) + " |"
    lines = [head, "|" + "---|" * (len(columns) + 2)]
    for r in results:
        m = r["metrics"]
        cells = " | ".join(cell(m.get(key), scale) for _, key, scale in columns)
        lines.append(f"| {row_name(r['config'])} | {r.get(count, '?')} | {cells} |")
    return "\n".join(lines)


def report(folder: str | Path) -> str:
    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"{folder}: no such folder (run the evals first)")
    qa = [json.loads(p.read_text()) for p in sorted(folder.glob("qa-*.json"))]
    docqa = [json.loads(p.read_text()) for p in sorted(folder.glob("docqa-*.json"))]
    for r in qa:  # answerable + unanswerable questions asked
        r["n"] = r["n_questions"]
    for r in docqa:
        r["n"] = len(r.get("predictions", []))
    parts = []
    if qa:
        parts += ["SQuAD dev articles, RAG mode", "", table(qa, QA_COLUMNS, "n"), ""]
    if docqa:
        parts += ["Python docs questions", "", table(docqa, DOCQA_COLUMNS, "n"), ""]
    return "\n".join(parts) or f"{folder}: no qa-*.json or docqa-*.json files"


def main(argv: list[str] | None = None) -> int:
    from rag.cli import OneLineParser, run_cli

    p = OneLineParser(prog="python -m evals.answers_report", description=__doc__.split("\n")[0])
    p.add_argument(
        "folder",
        nargs="?",
        default="artifacts/evals/answers",
        help="folder of qa-*.json / docqa-*.json results (default: %(default)s)",
    )
    return run_cli(p, lambda args: print(report(args.folder)), argv)


if __name__ == "__main__":
    raise SystemExit(main())
