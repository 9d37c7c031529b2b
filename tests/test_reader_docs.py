"""The reader on documentation: raw lead sentences as spans, doc questions for training and for
the null threshold (training.data.reader_data.doc_questions,
training.finetune.reader.choose_threshold)."""

from __future__ import annotations

from pathlib import Path

import pytest
from training_support import write_tiny_squad

from rag.answer.reader import Span
from training.data import reader_data as D
from training.data.doc_markup import clean_inline, lead_sentence_raw, lead_sentences
from training.finetune.reader import ReaderConfig, choose_threshold, span_is_right, split_questions

CORPUS = Path(__file__).parent / "fixtures" / "corpus"
RST = (
    "Spooling files\n==============\n\n"
    "The :mod:`spool` module writes **large** outputs to :func:`~io.open` files. It keeps one\n"
    "buffer per writer.\n"
)


def test_lead_sentence_raw_keeps_the_markup_of_the_cleaned_lead():
    raw = lead_sentence_raw(RST, rst=True, passage_words=180)
    assert raw == "The :mod:`spool` module writes **large** outputs to :func:`~io.open` files."
    assert clean_inline(raw) == lead_sentences(RST, True, 180).split(". ")[0] + "."
    assert raw in RST  # a span of the passage, as the reader must point at it
    assert lead_sentence_raw("Title\n=====\n\n.. note:: only a directive\n", True, 180) == ""


def test_doc_questions_point_at_the_lead_inside_the_gold_passage():
    qs = D.doc_questions([CORPUS], n=40, negatives=2, seed=1)
    assert len(qs) >= 10
    for q in qs:
        assert q.kind == "doc" and len(q.distractors) == 2
        assert q.gold[q.gold_start :].startswith(q.answers[0])  # the labelled span is there
        assert q.gold not in q.distractors
    assert [q.qid for q in qs] == [q.qid for q in D.doc_questions([CORPUS], 40, 2, seed=1)]


def test_doc_calibration_questions_never_train(tmp_path):
    squad = write_tiny_squad(tmp_path / "squad.json")
    cfg = ReaderConfig(
        squad=str(squad),
        docs=[str(CORPUS)],
        doc_questions=12,
        calibration_doc_questions=6,
        calibration_questions=4,
    )
    train, cal = split_questions(cfg)
    train_docs = {q.qid for q in train if q.kind == "doc"}
    cal_docs = {q.qid for q in cal if q.kind == "doc"}
    assert len(cal_docs) == 6 and train_docs and not train_docs & cal_docs
    assert sum(q.kind == "squad" for q in cal) == 4
    with pytest.raises(ValueError, match="--docs /nonexistent"):
        split_questions(ReaderConfig(squad=str(squad), docs=["/nonexistent"]))


def _q(kind: str, answer: str) -> D.ReaderQuestion:
    return D.ReaderQuestion("q", "what?", (answer,), "gold text", ["other text"], 0, kind=kind)


def test_span_is_right_for_docs_needs_the_gold_section_and_lead_words():
    doc = _q("doc", "The spool module writes large outputs to files.")
    assert span_is_right(doc, Span(0, 0, 5, "spool module writes", 3.0, 0.0))
    assert not span_is_right(doc, Span(1, 0, 5, "spool module writes", 3.0, 0.0))  # wrong section
    assert not span_is_right(doc, Span(0, 0, 5, "thread safety of buffers", 3.0, 0.0))
    squad = _q("squad", "Denver Broncos")
    assert span_is_right(squad, Span(1, 0, 5, "the Denver Broncos", 3.0, 0.0))  # F1 >= 0.5


class ScriptedReader:
    """read() returns a fixed margin per (question, passage set): gold sets answer, others not."""

    def __init__(self, margins: dict[tuple[str, bool], tuple[float, str]]):
        self.margins = margins

    def read(self, question: str, passages: list[str]) -> list[Span]:
        margin, text = self.margins[(question, "gold text" in passages)]
        return [Span(0, 0, len(text), text, margin, 0.0)]


def test_choose_threshold_pools_both_kinds_and_reports_each():
    qs = [
        D.ReaderQuestion("a", "sq", ("Denver",), "gold text", ["x"], 0, kind="squad"),
        D.ReaderQuestion("b", "dq", ("The lead words here.",), "gold text", ["x"], 0, kind="doc"),
    ]
    reader = ScriptedReader(
        {
            ("sq", True): (5.0, "Denver"),
            ("sq", False): (1.0, "nope"),
            ("dq", True): (3.0, "unrelated stuff"),  # a wrong span in the gold section
            ("dq", False): (4.0, "junk"),  # docs distractors score high: a higher bar helps
        }
    )
    cal = choose_threshold(reader, qs)
    assert cal["threshold"] == 5.0  # answers the squad one, abstains on both distractor sets
    assert cal["squad"] == {"questions": 1, "answered_right": 100.0, "abstained_right": 100.0}
    assert cal["doc"] == {"questions": 1, "answered_right": 0.0, "abstained_right": 100.0}
