"""Grounded-QA examples for LoRA tuning, built from SQuAD in the pipeline's prompt format.

Each example is a question, k numbered passages and a target ``answer [i]``: the gold paragraph
plus k-1 distractors ranked by BM25 (:class:`rag.retrieval.bm25.BM25Index`, one batched search for all
questions) among other articles' and the same article's paragraphs, with the gold at a position
drawn uniformly and balanced over 1..k. A fixed fraction of examples hold *no* answer-bearing
passage (k distractors, none containing a gold answer string) and their target is
:data:`rag.answer.prompt.REFUSAL`, so the model learns to refuse rather than invent. The prompt and
target come from :mod:`rag.answer.prompt`, the one definition the pipeline uses too.

Train examples use only paragraphs of SQuAD train articles (gold *and* distractors); held-out
examples use the :data:`~rag.evaluation.datasets.SQUAD_DEV_ARTICLES` questions and are never trained on.
``--docs`` adds documentation examples mined from the user's own files
(:mod:`training.data.doc_qa_data`), mixed in at ``--doc-fraction``.

    python -m training.data.lora_data --squad ../shared/data/squad/squad-v1.1-dev-part.json \\
        --split train --n 300 --k 3 --out train.jsonl
    python -m training.data.lora_data --squad ../shared/data/squad/squad-v1.1-dev-part.json \\
        --docs ../shared/data/python-docs --n 5000 --doc-fraction 0.4 --out mix.jsonl
"""

from __future__ import annotations

import json
import random
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from rag.answer.prompt import REFUSAL, format_span_target, format_target
from rag.evaluation.datasets import SquadParagraph, load_squad_paragraphs, squad_split
from rag.retrieval.bm25 import BM25Index
from training.data.doc_qa_data import doc_examples
from training.data.qa_example import GoldPlacement, QAExample, trim_passage


def _holds_answer(text: str, answers: Sequence[str]) -> bool:
    low = text.lower()
    return any(a.strip() and a.strip().lower() in low for a in answers)


def _distractor_for(
    gold: SquadParagraph, answers: Sequence[str]
) -> Callable[[SquadParagraph], bool]:
    """Whether a paragraph may be a distractor for a question: not its gold paragraph, and no
    gold answer string in it (that would be a second right passage)."""
    return lambda p: p.id != gold.id and not _holds_answer(p.context, answers)


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
    """``n`` examples (0 = every question) from questions of ``articles``; distractors come from
    paragraphs of ``pool_articles`` (default: ``articles``), so train data never touches held-out
    text. Exactly ``round(n * refusal_fraction)`` examples are refusals; the gold positions of the
    others are balanced over 1..k (:class:`~training.data.qa_example.GoldPlacement`). BM25 runs
    once for all questions (``search_many``), so thousands of examples take seconds.
    ``passage_words`` > 0 trims each passage (the gold one around its answer)."""
    if k < 1:
        raise ValueError(f"--k-passages must be at least 1, not {k}")
    if not 0 <= refusal_fraction <= 1:
        raise ValueError(f"--refusal-fraction must be in [0, 1], not {refusal_fraction}")
    wanted, pool_set = set(articles), set(pool_articles or articles)
    pool = [p for p in paragraphs if p.title in pool_set]
    by_id = {p.id: p for p in pool}
    questions = [(p, q) for p in paragraphs if p.title in wanted for q in p.questions if q.answers]
    rng = random.Random(seed)
    rng.shuffle(questions)
    questions = questions[:n] if n > 0 else questions
    placement = GoldPlacement.draw(len(questions), k, refusal_fraction, rng)
    index = BM25Index(
        [p.id for p in pool], [f"{p.title.replace('_', ' ')} {p.context}" for p in pool]
    )
    hits = index.search_many([q.question for _, q in questions], k=3 * k + 10)
    out = []
    for i, ((para, q), row) in enumerate(zip(questions, hits)):
        usable = _distractor_for(para, q.answers)
        ranked = (by_id[j] for j, _ in row)
        docs, cited = placement.passages(i, para, ranked, pool, usable, rng)
        out.append(
            QAExample(
                id=q.id,
                question=q.question,
                passages=[trim_passage(p.context, passage_words, q.answers) for p in docs],
                cited=cited,
                answers=q.answers,
                target=format_target(q.answers[0], cited) if cited else REFUSAL,
                article=para.title,
                answerable=bool(cited),
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


# Words of the one passage in a reader-first example: about a pipeline chunk (~180 words).
SPAN_PASSAGE_WORDS = 180


def span_examples(
    path: str | Path, split: str, n: int, seed: int = 0, passage_words: int = SPAN_PASSAGE_WORDS
) -> list[QAExample]:
    """``n`` examples (0 = all) of the reader-first prompt (``kind="span"``): a question, its
    gold paragraph as the one passage (cut to ``passage_words`` around the answer, like a
    pipeline chunk), the gold answer as the reader's short answer, and as the target the
    passage's sentence holding it, cited ``[1]`` (:func:`rag.answer.reader.sentence_around`,
    what the pipeline shows when nothing is decoded; ``training.finetune.lora --span-targets
    distill`` puts the base model's own grounded reply in its place where it has one). ``split``
    train: train articles only; dev: the held-out articles."""
    from rag.answer.reader import sentence_around

    if split not in ("train", "dev"):
        raise ValueError(f"--split must be train or dev, not {split!r}")
    paragraphs = load_squad_paragraphs(path)
    train, dev = squad_split(path)
    wanted = set(train if split == "train" else dev)
    questions = [(p, q) for p in paragraphs if p.title in wanted for q in p.questions if q.answers]
    random.Random(seed).shuffle(questions)
    out: list[QAExample] = []
    for para, q in questions:
        if 0 < n <= len(out):
            break
        span = q.answers[0].strip()
        passage = trim_passage(para.context, passage_words, [span])
        at = passage.find(span)
        if not span or at < 0:  # the cut lost it (an answer longer than the window)
            continue
        sentence = sentence_around(passage, at, at + len(span))
        out.append(
            QAExample(
                id=q.id,
                question=q.question,
                passages=[passage],
                cited=[1],
                answers=q.answers,
                target=format_span_target(sentence),
                article=para.title,
                passage_ids=[para.id],
                kind="span",
            )
        )
    if split == "train":
        assert_no_heldout(out, dev, paragraphs)
    return out


def doc_span_examples(
    docs: Sequence[str | Path], n: int, seed: int = 0, passage_words: int = SPAN_PASSAGE_WORDS
) -> list[QAExample]:
    """Reader-first examples from documentation (``kind="span"``): the section-heading questions
    of :func:`training.data.doc_qa_data.doc_examples` on their section alone, the section lead's
    first sentence as the short answer (what the reader trained on docs points at) and as the target
    (a docs span is already a sentence)."""
    from rag.answer.reader import sentence_around

    out = []
    for ex in doc_examples(docs, 0, 1, 0.0, seed, passage_words):  # all, then the first n
        span = sentence_around(ex.answers[0], 0, 0)  # the lead's first sentence
        if span and span in ex.passages[0]:  # (a lead cleaned of markup is not in the passage)
            ex.answers, ex.target, ex.kind = [span], format_span_target(span), "span"
            out.append(ex)
    return out[:n] if n > 0 else out


def span_training_examples(
    data: Sequence[str | Path],
    docs: Sequence[str | Path] = (),
    n: int = 300,
    doc_fraction: float = 0.2,
    seed: int = 0,
) -> list[QAExample]:
    """The reader-first training mix: :func:`span_examples` of the SQuAD train articles in
    ``data`` plus a ``doc_fraction`` share of :func:`doc_span_examples` from ``docs``, shuffled."""
    squad = [f for f in data if str(f).endswith(".json")]
    if not squad and not docs:
        raise ValueError("--data (a SQuAD JSON) or --docs is required for --prompt-format span")
    for f in squad:
        if not Path(f).is_file():
            raise ValueError(f"--data {f}: no such file")
    n_doc = (round(n * doc_fraction) if squad else n) if docs else 0
    out: list[QAExample] = []
    for f in squad:
        if n <= 0 or n - n_doc > len(out):
            out += span_examples(f, "train", n - n_doc - len(out) if n > 0 else 0, seed)
    if docs and (n <= 0 or n_doc > 0):
        out += doc_span_examples(docs, n_doc, seed)
    random.Random(seed).shuffle(out)
    return out


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


def training_examples(
    data: Sequence[str | Path],
    docs: Sequence[str | Path] = (),
    n: int = 300,
    doc_fraction: float = 0.5,
    k: int = 3,
    refusal_fraction: float = 0.15,
    seed: int = 0,
    passage_words: int = 0,
    doc_passage_words: int = 180,
) -> list[QAExample]:
    """The LoRA training mix: ``data`` (SQuAD JSON, built on the fly from train articles only, or
    prebuilt example JSONL) plus documentation examples mined from the folders/files ``docs``
    (:func:`training.data.doc_qa_data.doc_examples`), shuffled together.

    With both, ``round(n * doc_fraction)`` examples come from ``docs`` and the rest from ``data``;
    with one source it supplies all ``n``. ``n`` = 0 takes everything each source has. Why a mix:
    SQuAD teaches short extractive answers and refusals on clean prose, the doc examples the
    user's own markup-laden chunks and longer "what does this cover" answers."""
    if not data and not docs:
        raise ValueError("--data or --docs is required (a SQuAD JSON, example JSONL or folders)")
    if not 0 <= doc_fraction <= 1:
        raise ValueError(f"--doc-fraction must be in [0, 1], not {doc_fraction}")
    n_doc = (round(n * doc_fraction) if data else n) if docs else 0
    n_data = n - n_doc
    out: list[QAExample] = []
    for f in data:
        if not Path(f).is_file():
            raise ValueError(f"--data {f}: no such file")
        if str(f).endswith(".jsonl"):
            out += read_examples(f)
        elif n <= 0 or n_data > len(out):
            left = n_data - len(out) if n > 0 else 0
            out += squad_examples(f, "train", left, k, refusal_fraction, seed, passage_words)
    out = out[:n_data] if n > 0 else out
    if docs and (n <= 0 or n_doc > 0):
        out += doc_examples(docs, n_doc, k, refusal_fraction, seed, doc_passage_words)
    random.Random(seed).shuffle(out)
    return out


@dataclass
class LoraDataConfig:
    """What ``python -m training.data.lora_data`` builds; one kebab-case flag per field."""

    squad: str | None = None  # SQuAD v1.1 JSON file (train articles for --split train)
    docs: list[str] = field(default_factory=list)  # document folders/files for doc-style examples
    split: str = "train"  # train | dev (held-out SQuAD articles; no --docs)
    n: int = 300  # number of examples (0 = all)
    doc_fraction: float = 0.5  # share of doc examples when both --squad and --docs are given
    k: int = 3  # passages per example
    refusal_fraction: float = 0.15  # share of no-answer examples (target = the refusal)
    seed: int = 0  # sampling seed
    passage_words: int = 0  # trim SQuAD passages to this many words (0 = whole paragraph)
    doc_passage_words: int = 180  # trim doc sections to this many words (0 = whole section)
    out: str = ""  # output JSONL (required)


def build_from_config(cfg: LoraDataConfig) -> list[QAExample]:
    """Examples for ``cfg``; ValueError with a one-line reason on a bad combination."""
    if not cfg.out:
        raise ValueError("--out is required")
    if cfg.split not in ("train", "dev"):
        raise ValueError(f"--split must be train or dev, not {cfg.split!r}")
    if cfg.split == "dev":
        if cfg.docs or not cfg.squad:
            raise ValueError("--split dev takes --squad only (doc examples are training data)")
        return squad_examples(cfg.squad, "dev", cfg.n, cfg.k, cfg.refusal_fraction, cfg.seed)
    return training_examples(
        [cfg.squad] if cfg.squad else [], cfg.docs, cfg.n, cfg.doc_fraction, cfg.k,
        cfg.refusal_fraction, cfg.seed, cfg.passage_words, cfg.doc_passage_words,
    )  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    import argparse

    from rag.cli import run_cli
    from rag.cli.flags import config_from_args, dataclass_parser

    def run(args: argparse.Namespace) -> int:
        cfg = config_from_args(LoraDataConfig, args)
        ex = build_from_config(cfg)
        write_examples(ex, cfg.out)
        n_doc, n_ref = sum(e.kind == "doc" for e in ex), sum(not e.answerable for e in ex)
        print(
            f"wrote {len(ex)} examples ({n_doc} from docs, {n_ref} refusals) to {cfg.out}",
            file=sys.stderr,
        )
        return 0

    parser = dataclass_parser(
        "python -m training.data.lora_data",
        __doc__,
        LoraDataConfig,
        required=("out",),
        choices={"split": ("train", "dev")},
    )
    return run_cli(parser, run, argv)


if __name__ == "__main__":
    sys.exit(main())
