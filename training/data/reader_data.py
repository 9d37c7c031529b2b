"""Training data of the extractive reader: SQuAD questions on their gold paragraph, plus retrieved
distractor paragraphs as "not in this passage" examples, cut into stride windows.

- **Answerable**: each train-article question with its gold paragraph and the first gold
  answer's character span.
- **Unanswerable** (the SQuAD 2.0 null-span recipe): the question with the top BM25 paragraphs
  of the train articles that are not its gold paragraph and contain none of its gold answers
  (a retrieved paragraph that does hold the answer string would teach the reader to miss it).
  They are the passages a retriever really puts beside the gold one, so the null score learns to
  say "not here" where the pipeline needs it.
- **Windows** (transformers' question-answering recipe, ``prepare_train_features``): a long
  passage is read in ``max_length`` windows overlapping by ``stride`` tokens; a window that does
  not hold the whole answer is labelled with the ``[CLS]`` position, as a distractor is.

The dev articles (:func:`rag.evaluation.datasets.squad_split`) are never read here; :func:`assert_train_only`
checks it. A slice of the train questions is kept out of training for choosing the null
threshold (:func:`split_calibration`), so no threshold is ever chosen on dev.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rag.evaluation.datasets import SquadParagraph, load_squad_paragraphs, squad_split
from rag.evaluation.metrics import normalize_answer
from rag.retrieval.bm25 import BM25Index


@dataclass(frozen=True)
class ReaderExample:
    """One (question, passage) pair; ``answer_start`` None = the passage does not answer it."""

    qid: str
    question: str
    context: str
    answers: tuple[str, ...]  # every gold answer text of the question (for scoring)
    answer_start: int | None = None  # character offset of answers[0] in context
    paragraph: str = ""  # SQuAD paragraph id ("<title>/<index>")


@dataclass
class ReaderQuestion:
    """A question with its gold paragraph and its retrieved distractors (calibration, eval)."""

    qid: str
    question: str
    answers: tuple[str, ...]
    gold: str  # gold paragraph text
    distractors: list[str]
    gold_start: int | None = None  # character offset of answers[0] in gold (SQuAD's own)
    # squad: answers are SQuAD's gold spans (right = F1 >= 0.5); doc: answers[0] is the gold
    # section's lead sentence(s) (right = a span in the gold section, mostly made of lead words)
    kind: str = "squad"


def squad_articles(path: str | Path, split: str) -> list[SquadParagraph]:
    """The paragraphs of the ``train`` or ``dev`` articles of a SQuAD file."""
    train, dev = squad_split(path)
    keep = set(train if split == "train" else dev)
    return [p for p in load_squad_paragraphs(path) if p.title in keep]


def _holds_answer(text: str, answers: Sequence[str]) -> bool:
    norm = normalize_answer(text)
    return any(normalize_answer(a) and normalize_answer(a) in norm for a in answers)


def questions(
    paragraphs: Sequence[SquadParagraph], negatives: int = 1, depth: int = 10
) -> list[ReaderQuestion]:
    """Every answerable question of ``paragraphs`` with up to ``negatives`` BM25 distractors from
    the same paragraphs (never the gold one, never one holding a gold answer)."""
    bm25 = BM25Index([p.id for p in paragraphs], [p.context for p in paragraphs])
    by_id = {p.id: p for p in paragraphs}
    qs = [(p, q) for p in paragraphs for q in p.questions if q.answers]
    ranked = bm25.search_many([q.question for _, q in qs], k=depth) if negatives else []
    out = []
    for n, (p, q) in enumerate(qs):
        distractors = []
        for pid, _ in ranked[n] if negatives else []:
            text = by_id[pid].context
            if pid != p.id and not _holds_answer(text, q.answers):
                distractors.append(text)
            if len(distractors) == negatives:
                break
        start = q.answer_starts[0] if q.answer_starts and q.answer_starts[0] >= 0 else None
        if start is None or p.context[start : start + len(q.answers[0])] != q.answers[0]:
            start = answer_start(p.context, q.answers[0])
        out.append(
            ReaderQuestion(q.id, q.question, tuple(q.answers), p.context, distractors, start)
        )
    return out


def answer_start(context: str, answer: str) -> int | None:
    """Character offset of ``answer``'s first occurrence in ``context`` (where SQuAD's own offset
    is missing or does not point at the answer text)."""
    i = context.find(answer)
    return i if i >= 0 else None


def examples(qs: Sequence[ReaderQuestion]) -> list[ReaderExample]:
    """Gold (answerable) and distractor (unanswerable) examples of ``qs``."""
    out = []
    for q in qs:
        start = q.gold_start
        if start is not None:
            out.append(ReaderExample(q.qid, q.question, q.gold, q.answers, start))
        out += [ReaderExample(q.qid, q.question, d, q.answers, None) for d in q.distractors]
    return out


def doc_questions(
    paths: Sequence[str | Path], n: int, negatives: int = 4, seed: int = 0
) -> list[ReaderQuestion]:
    """Up to ``n`` documentation questions (the section-heading questions of
    :func:`training.data.doc_qa_data.doc_examples`), each with its gold section cut as the
    pipeline's chunk and ``negatives`` BM25 distractor sections of other files; the answer is the
    raw first sentence of the section's lead (:func:`training.data.doc_markup.lead_sentence_raw`),
    located in the passage (questions whose sentence cannot be located, or is longer than 40 words,
    are dropped). SQuAD is encyclopaedia prose: these teach the reader, and calibrate its threshold
    on, the reST/markdown passages the product serves. Never the documents you evaluate on."""
    from training.data.doc_markup import lead_sentence_raw
    from training.data.doc_qa_data import DOC_PASSAGE_WORDS, load_sections, section_examples

    loaded = load_sections(paths)  # loaded once: for the examples and for the raw leads
    sections = {s.id: s for s in loaded}
    out = []
    for ex in section_examples(loaded, n, k=negatives + 1, refusal_fraction=0.0, seed=seed):
        gold = ex.cited[0] - 1
        passage = ex.passages[gold]
        sec = sections[ex.passage_ids[gold]]
        raw = lead_sentence_raw(sec.text, sec.rst, DOC_PASSAGE_WORDS)
        start = passage.find(raw) if raw else -1
        if start < 0 and raw:
            raw = " ".join(raw.split())
            start = passage.find(raw)
        if start < 0 or len(raw.split()) > 40:
            continue
        others = [p for i, p in enumerate(ex.passages) if i != gold]
        out.append(ReaderQuestion(ex.id, ex.question, (raw,), passage, others, start, kind="doc"))
    return out


def split_calibration(
    qs: Sequence[ReaderQuestion], n: int, seed: int = 0
) -> tuple[list[ReaderQuestion], list[ReaderQuestion]]:
    """(train, calibration): ``n`` questions drawn by ``seed`` are kept for the null threshold."""
    order = list(range(len(qs)))
    random.Random(seed).shuffle(order)
    cal = set(order[:n])
    return [q for i, q in enumerate(qs) if i not in cal], [q for i, q in enumerate(qs) if i in cal]


def assert_train_only(qs: Sequence[ReaderQuestion], path: str | Path) -> None:
    """Raise if any question or gold paragraph comes from the dev articles."""
    dev = squad_articles(path, "dev")
    dev_q = {q.id for p in dev for q in p.questions}
    dev_ctx = {p.context for p in dev}
    bad = [q.qid for q in qs if q.qid in dev_q or q.gold in dev_ctx]
    if bad:
        raise AssertionError(f"{len(bad)} reader training questions come from dev articles")


def windows(
    exs: Sequence[ReaderExample], tokenizer: Any, max_length: int = 384, stride: int = 128
) -> dict[str, list]:
    """Tokenised stride windows with ``start_positions`` / ``end_positions`` labels (the ``[CLS]``
    index 0 where the window does not hold the answer). Unpadded: the collator pads per batch."""
    enc = tokenizer(
        [e.question for e in exs],
        [e.context for e in exs],
        truncation="only_second",
        max_length=max_length,
        stride=stride,
        return_overflowing_tokens=True,
        return_offsets_mapping=True,
    )
    starts, ends = [], []
    for w, ex_i in enumerate(enc["overflow_to_sample_mapping"]):
        ex = exs[ex_i]
        seq = enc.sequence_ids(w)
        offsets = enc["offset_mapping"][w]
        s_tok = e_tok = 0
        if ex.answer_start is not None:
            a = ex.answer_start
            z = a + len(ex.answers[0])
            ctx = [i for i, sid in enumerate(seq) if sid == 1]
            if ctx and offsets[ctx[0]][0] <= a and offsets[ctx[-1]][1] >= z:
                s_tok = next(i for i in ctx if offsets[i][1] > a)
                e_tok = next(i for i in reversed(ctx) if offsets[i][0] < z)
        starts.append(s_tok)
        ends.append(e_tok)
    keep = [k for k in enc if k not in ("offset_mapping", "overflow_to_sample_mapping")]
    out = {k: list(enc[k]) for k in keep}
    out["start_positions"] = starts
    out["end_positions"] = ends
    return out
