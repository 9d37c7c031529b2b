"""Grounded-QA examples for LoRA tuning, built from SQuAD in the pipeline's prompt format.

Each example is a question, k numbered passages and a target ``answer [i]``: the gold paragraph
plus k-1 distractors ranked by BM25 (:class:`rag.bm25.BM25Index`) for the question among other
articles' and the same article's paragraphs, shuffled so the gold number is uniform. A fraction
of examples hold *no* answer-bearing passage (k distractors, none containing a gold answer
string) and their target is :data:`rag.prompt.REFUSAL`, so the model learns to refuse rather
than invent. The prompt and target come from :mod:`rag.prompt`, the one definition the pipeline
uses too.

Train examples use only paragraphs of SQuAD train articles (gold *and* distractors); held-out
examples use the :data:`~evals.datasets.SQUAD_DEV_ARTICLES` questions and are never trained on.

    python -m training.lora_data --squad ../shared/data/squad/squad-v1.1-dev-part.json \\
        --split train --n 300 --k 3 --out train.jsonl
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from evals.datasets import SquadParagraph, load_squad_paragraphs, squad_split
from rag.bm25 import BM25Index
from rag.prompt import REFUSAL, format_target


@dataclass
class QAExample:
    """One grounded-QA example; ``cited`` are 1-based passage numbers (empty: refusal)."""

    id: str
    question: str
    passages: list[str]
    cited: list[int]
    answers: list[str]  # gold answers (for EM/F1); the first is the training answer
    target: str
    article: str
    answerable: bool = True
    passage_ids: list[str] = field(default_factory=list)


def _holds_answer(text: str, answers: Sequence[str]) -> bool:
    low = text.lower()
    return any(a.strip() and a.strip().lower() in low for a in answers)


def trim_passage(text: str, max_words: int, answers: Sequence[str] = ()) -> str:
    """At most ``max_words`` words of ``text``: a window around the first gold answer found,
    else the opening words. 0 keeps the whole text. Shorter prompts make CPU training cheaper and
    match the pipeline, whose passages are chunks rather than whole paragraphs."""
    words = text.split()
    if not max_words or len(words) <= max_words:
        return text
    start = 0
    for a in answers:
        pos = text.lower().find(a.strip().lower()) if a.strip() else -1
        if pos >= 0:
            first = len(text[:pos].split())
            last = first + len(a.split())
            start = max(0, min(first - (max_words - (last - first)) // 2, len(words) - max_words))
            break
    return " ".join(words[start : start + max_words])


def build_examples(
    paragraphs: Sequence[SquadParagraph],
    articles: Sequence[str],
    n: int,
    k: int = 3,
    refusal_fraction: float = 0.15,
    seed: int = 0,
    pool_articles: Sequence[str] | None = None,
    passage_words: int = 0,
) -> list[QAExample]:
    """``n`` examples from questions of ``articles``; distractors come from paragraphs of
    ``pool_articles`` (default: ``articles``), so train data never touches held-out text.
    ``passage_words`` > 0 trims each passage (the gold one around its answer)."""
    if k < 1:
        raise ValueError(f"--k-passages must be at least 1, not {k}")
    wanted, pool_set = set(articles), set(pool_articles or articles)
    pool = [p for p in paragraphs if p.title in pool_set]
    by_id = {p.id: p for p in pool}
    questions = [(p, q) for p in paragraphs if p.title in wanted for q in p.questions if q.answers]
    rng = random.Random(seed)
    rng.shuffle(questions)
    questions = questions[:n]
    index = BM25Index(
        [p.id for p in pool], [f"{p.title.replace('_', ' ')} {p.context}" for p in pool]
    )
    hits = index.search_many([q.question for _, q in questions], k=3 * k + 10)
    out = []
    for (para, q), row in zip(questions, hits):
        refuse = k > 0 and rng.random() < refusal_fraction
        cands = [
            by_id[i]
            for i, _ in row
            if i != para.id and not _holds_answer(by_id[i].context, q.answers)
        ]
        need = k if refuse else k - 1
        if len(cands) < need:  # BM25 found too few: fill with random pool paragraphs
            have = {p.id for p in cands} | {para.id}
            for p in rng.sample(pool, len(pool)):
                if len(cands) >= need:
                    break
                if p.id not in have and not _holds_answer(p.context, q.answers):
                    cands.append(p)
                    have.add(p.id)
        chosen = rng.sample(cands[: 2 * need], min(need, len(cands))) if need else []
        docs = chosen if refuse else chosen + [para]
        rng.shuffle(docs)
        cited = [] if refuse else [docs.index(para) + 1]
        out.append(
            QAExample(
                id=q.id,
                question=q.question,
                passages=[trim_passage(p.context, passage_words, q.answers) for p in docs],
                cited=cited,
                answers=q.answers,
                target=format_target(q.answers[0], cited) if cited else REFUSAL,
                article=para.title,
                answerable=not refuse,
                passage_ids=[p.id for p in docs],
            )
        )
    return out


def squad_examples(
    path: str | Path,
    split: str,
    n: int,
    k: int = 3,
    refusal_fraction: float = 0.15,
    seed: int = 0,
    passage_words: int = 0,
) -> list[QAExample]:
    """Train examples (train articles only) or held-out ones (dev articles; distractors from the
    whole file, which is fine as nothing held-out is trained on)."""
    paragraphs = load_squad_paragraphs(path)
    train, dev = squad_split(path)
    if split == "train":
        ex = build_examples(
            paragraphs, train, n, k, refusal_fraction, seed, passage_words=passage_words
        )
        assert_no_heldout(ex, dev, paragraphs)
        return ex
    if split == "dev":
        return build_examples(
            paragraphs, dev, n, k, refusal_fraction, seed, pool_articles=train + dev
        )
    raise ValueError(f"--split must be train or dev, not {split!r}")


def assert_no_heldout(
    examples: Sequence[QAExample], dev_articles: Sequence[str], paragraphs
) -> None:
    """Raise if any example's question or passage comes from a held-out article."""
    dev = set(dev_articles)
    dev_text = {p.context for p in paragraphs if p.title in dev}
    for ex in examples:
        if ex.article in dev or any(pid.split("/")[0] in dev for pid in ex.passage_ids):
            raise AssertionError(f"example {ex.id} uses held-out article {ex.article!r}")
        if any(p in d for p in ex.passages for d in dev_text):
            raise AssertionError(f"example {ex.id} has a held-out passage")


def write_examples(examples: Sequence[QAExample], path: str | Path) -> None:
    with Path(path).open("w", encoding="utf-8") as f:
        for ex in examples:
            f.write(json.dumps(asdict(ex), ensure_ascii=False) + "\n")


def read_examples(path: str | Path) -> list[QAExample]:
    """JSONL of examples as written by :func:`write_examples` (``question``, ``passages``,
    ``target`` required; the rest optional)."""
    out = []
    path = Path(path)
    for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        row = json.loads(line)
        missing = [f for f in ("question", "passages", "target") if f not in row]
        if missing:
            raise ValueError(f"{path}:{lineno}: missing field(s) {', '.join(missing)}")
        row.setdefault("id", f"{path.name}:{lineno}")
        row.setdefault("cited", [])
        row.setdefault("answers", [])
        row.setdefault("article", "")
        out.append(QAExample(**row))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m training.lora_data", description=__doc__.split("\n\n")[0]
    )
    ap.add_argument("--squad", required=True, help="SQuAD v1.1 JSON file")
    ap.add_argument(
        "--split", default="train", choices=["train", "dev"], help="train or held-out articles"
    )
    ap.add_argument("--n", type=int, default=300, help="number of examples")
    ap.add_argument("--k", type=int, default=3, help="passages per example")
    ap.add_argument(
        "--refusal-fraction", type=float, default=0.15, help="share of no-answer examples"
    )
    ap.add_argument("--seed", type=int, default=0, help="sampling seed")
    ap.add_argument(
        "--passage-words", type=int, default=0, help="trim passages to this many words (0 = whole)"
    )
    ap.add_argument("--out", required=True, help="output JSONL")
    a = ap.parse_args(argv)
    try:
        ex = squad_examples(a.squad, a.split, a.n, a.k, a.refusal_fraction, a.seed, a.passage_words)
    except (ValueError, OSError) as e:
        print(f"training.lora_data: error: {e}", file=sys.stderr)
        return 2
    write_examples(ex, a.out)
    print(
        f"wrote {len(ex)} examples ({sum(not e.answerable for e in ex)} refusals) to {a.out}",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
