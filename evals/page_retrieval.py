"""Where the answering page ranks: hit@k and MRR of documentation questions over an index.

Retrieval alone, no decoder: each question of ``--questions`` (JSONL rows with ``id``,
``question``, ``pages`` and optionally ``split``: the docqa files, keywords unused) is searched
through the index's own :class:`rag.retrieval.retriever.Retriever`, once per ``--modes``, and
the first hit from one of its pages is its rank (:func:`evals.docqa.hit_rank`). Questions
without pages (out of the manual) are skipped. Seconds per index, so a change to what is
indexed (rag.documents.chunking.indexed_text) is judged on ~50 questions per manual instead of
the 20 of an answer run.

CLI::

    python -m evals.page_retrieval --index gitdocs --questions evals/data/gitdocs_qa.jsonl \\
        evals/data/gitdocs_dev2_qa.jsonl --split dev --out git-pages.json
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from evals.docqa import hit_rank, resolve_questions_path
from rag.cli.flags import config_parser, run_config_cli
from rag.cli.progress import track

MODES = ("dense", "bm25", "hybrid")


@dataclass
class PageRetrievalConfig:
    """One run: an index, its question files, the modes compared (all saved in the output)."""

    index: str = ""  # index name under $RAG_HOME/indexes
    questions: list[str] = field(default_factory=list)  # JSONL files (rows with pages)
    split: str = "dev"  # all | dev | test (rows without a split count as test)
    modes: list[str] = field(default_factory=lambda: list(MODES))  # retrieval modes compared
    k: int = 10  # ranks counted (the pipeline reads its best 10 passages)


def load_page_questions(paths: list[str], split: str) -> list[dict[str, Any]]:
    """Rows of ``paths`` with at least one page, of ``split``; errors name the file and line."""
    rows = []
    for path in paths:
        p = resolve_questions_path(path)
        for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                question, pages = str(row["question"]), list(row["pages"])
            except (json.JSONDecodeError, KeyError, TypeError) as e:
                raise ValueError(f"{path}:{n}: not a question row with pages ({e})") from None
            if pages and split in ("all", row.get("split", "test")):
                rows.append(
                    {
                        "id": str(row.get("id", f"{p.name}:{n}")),
                        "question": question,
                        "pages": pages,
                    }
                )
    if not rows:
        raise ValueError(f"--questions: no question with pages in split {split!r}")
    return rows


def evaluate(cfg: PageRetrievalConfig) -> dict[str, Any]:
    """hit@k and MRR@k per mode, and each question's rank per mode."""
    from rag.retrieval.retriever import Retriever

    for mode in cfg.modes:
        if mode not in MODES:
            raise ValueError(f"--modes: {mode!r} is not one of {', '.join(MODES)}")
    questions = load_page_questions(cfg.questions, cfg.split)
    retriever = Retriever.from_settings(cfg.index)
    metrics, ranks = {}, {q["id"]: {} for q in questions}
    for mode in cfg.modes:
        found = []
        for q in track(questions, f"{mode} search", unit="question"):
            hits = retriever.search(q["question"], k=cfg.k, mode=mode)
            rank = hit_rank([h.chunk.source for h in hits], q["pages"])
            ranks[q["id"]][mode] = rank
            found.append(rank)
        n = len(found)
        metrics[mode] = {
            f"hit@{cfg.k}": sum(r is not None for r in found) / n,
            f"mrr@{cfg.k}": sum(1 / r for r in found if r) / n,
        }
    return {
        "config": asdict(cfg),
        "n_questions": len(questions),
        "metrics": metrics,
        "ranks": ranks,
    }


def _summary(cfg: PageRetrievalConfig, result: dict[str, Any]) -> str:
    parts = [
        f"{mode} hit@{cfg.k} {m[f'hit@{cfg.k}']:.3f} mrr {m[f'mrr@{cfg.k}']:.3f}"
        for mode, m in result["metrics"].items()
    ]
    return f"{cfg.index}, {result['n_questions']} questions: " + "; ".join(parts)


def main(argv: list[str] | None = None) -> int:
    parser = config_parser(
        "python -m evals.page_retrieval",
        __doc__,
        PageRetrievalConfig,
        out_file=True,
        required=("index", "questions"),
        choices={"split": ("all", "dev", "test")},
    )
    return run_config_cli(parser, PageRetrievalConfig, evaluate, argv, note=_summary)


if __name__ == "__main__":
    raise SystemExit(main())
