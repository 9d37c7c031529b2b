"""The extractive reader: span decoding over several passages (pure), the SpanReader on a real
(tiny) QA model against transformers' own pipeline, and a tiny training run whose folder loads in
the plain ecosystem."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from training_support import build_tokenizer, tiny_bert_config, write_tiny_squad

from rag.answer.reader import Span, SpanReader, best_span, pick

# ---------------------------------------------------------------------------- pure decoding


def test_best_span_stays_in_passage_and_in_order():
    start = np.array([9.0, 8.0, 0.0, 1.0, 5.0, 0.0])
    end = np.array([9.0, 0.0, 7.0, 0.0, 2.0, 6.0])
    context = np.array([False, False, True, True, True, True])  # [CLS] and the question are out
    i, j, score = best_span(start, end, context, max_answer_tokens=30)
    assert (i, j) == (4, 5) and score == 11.0  # not 1 -> 2 (question), not end before start


def test_best_span_respects_max_answer_tokens():
    start = np.array([0.0, 5.0, 0.0, 0.0, 0.0])
    end = np.array([0.0, 0.0, 1.0, 0.0, 6.0])
    context = np.ones(5, dtype=bool)
    assert best_span(start, end, context, max_answer_tokens=2)[:2] == (1, 2)
    assert best_span(start, end, context, max_answer_tokens=4)[:2] == (1, 4)
    assert best_span(start, end, np.zeros(5, dtype=bool)) is None


def test_pick_takes_the_best_margin_across_passages_and_abstains_below_threshold():
    loud_but_unsure = Span(0, 0, 3, "abc", score=20.0, null_score=19.0)  # margin 1
    quiet_but_sure = Span(1, 4, 9, "right", score=6.0, null_score=-2.0)  # margin 8
    assert pick([loud_but_unsure, quiet_but_sure], threshold=0.0) is quiet_but_sure
    assert pick([loud_but_unsure, quiet_but_sure], threshold=9.0) is None  # all say "not here"
    assert pick([], threshold=-1e9) is None


# ---------------------------------------------------------------------------- the model


@pytest.fixture(scope="module")
def tiny_qa_dir(tmp_path_factory):
    from transformers import BertForQuestionAnswering

    path = tmp_path_factory.mktemp("tiny-qa")
    tok = build_tokenizer()
    torch.manual_seed(0)
    BertForQuestionAnswering(tiny_bert_config(tok, initializer_range=0.5)).save_pretrained(path)
    tok.save_pretrained(path)
    return path


def test_span_offsets_point_into_each_source_passage(tiny_qa_dir):
    reader = SpanReader.load(tiny_qa_dir)
    passages = ["The cat sat on the mat in the sun.", "Paris is the capital of France. " * 30]
    spans = reader.read("Where did the cat sit?", passages)
    assert {s.passage for s in spans} == {0, 1}  # the long passage read in windows, one best
    for s in spans:
        assert passages[s.passage][s.start : s.end] == s.text and s.text


def test_span_matches_a_brute_force_decode_of_the_plain_qa_model(tiny_qa_dir):
    """transformers 5 removed ``pipeline("question-answering")`` (KeyError: "The task
    question-answering has been removed"), so the reference is the plain
    AutoModelForQuestionAnswering's logits searched over every (start, end) pair by hand."""
    from transformers import AutoModelForQuestionAnswering, AutoTokenizer

    context = "The old lighthouse on the northern cape was built in 1874 by local fishermen."
    question = "When was the lighthouse built?"
    reader = SpanReader.load(tiny_qa_dir)
    (span,) = reader.read(question, [context])
    tok = AutoTokenizer.from_pretrained(str(tiny_qa_dir))
    model = AutoModelForQuestionAnswering.from_pretrained(str(tiny_qa_dir)).eval()
    enc = tok(question, context, return_offsets_mapping=True, return_tensors="pt")
    offsets = enc.pop("offset_mapping")[0].tolist()
    ctx = [i for i, sid in enumerate(enc.sequence_ids(0)) if sid == 1]
    with torch.no_grad():
        out = model(**enc)
    s, e = out.start_logits[0].tolist(), out.end_logits[0].tolist()
    pairs = [(i, j) for i in ctx for j in ctx if 0 <= j - i < reader.max_answer_tokens]
    i, j = max(pairs, key=lambda p: s[p[0]] + e[p[1]])
    assert (span.start, span.end) == (offsets[i][0], offsets[j][1])
    assert span.null_score == pytest.approx(s[0] + e[0], abs=1e-4)


# ---------------------------------------------------------------------------- training


def test_reader_training_run_saves_a_plain_qa_folder(tmp_path, tiny_qa_dir):
    from transformers import AutoModelForQuestionAnswering

    from training.finetune.reader import ReaderConfig, train_reader

    squad = write_tiny_squad(tmp_path / "squad.json")
    out = tmp_path / "reader"
    cfg = ReaderConfig(
        model=str(tiny_qa_dir),
        squad=str(squad),
        out=str(out),
        max_steps=3,
        batch_size=4,
        calibration_questions=4,
        max_length=64,
        stride=16,
        precision="fp32",
    )
    summary = train_reader(cfg)
    assert summary["steps"] == 3 and summary["dev"]["questions"] == 6  # the Normans article
    saved = json.loads((out / "reader.json").read_text())
    assert saved["max_length"] == 64 and "threshold" in saved
    model = AutoModelForQuestionAnswering.from_pretrained(str(out))
    reloaded = SpanReader.load(out)
    assert reloaded.max_length == 64  # reader.json read back
    assert reloaded.threshold == saved["threshold"]  # the threshold the product uses
    trained = dict(model.named_parameters())["qa_outputs.weight"]
    start = dict(
        AutoModelForQuestionAnswering.from_pretrained(str(tiny_qa_dir)).named_parameters()
    )["qa_outputs.weight"]
    assert not torch.equal(trained, start)  # the span head was trained and saved


def test_reader_data_never_reads_dev_articles(tmp_path):
    from training.data import reader_data as D

    squad = write_tiny_squad(tmp_path / "squad.json")
    qs = D.questions(D.squad_articles(squad, "train"), negatives=2)
    assert qs and not any(q.qid.startswith("0-") for q in qs)  # article 0 = Normans (dev)
    D.assert_train_only(qs, squad)
    for q in qs:
        assert q.gold not in q.distractors
        assert all(q.answers[0] not in d for d in q.distractors)
    dev = D.questions(D.squad_articles(squad, "dev"), negatives=0)
    with pytest.raises(AssertionError, match="dev articles"):
        D.assert_train_only(dev, squad)


def test_reader_windows_label_the_answer_tokens_or_cls():
    from training.data import reader_data as D

    tok = build_tokenizer()
    ctx = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron"
    ex = D.ReaderExample("q", "which one?", ctx, ("kappa",), ctx.index("kappa"))
    null = D.ReaderExample("q", "which one?", ctx, ("kappa",), None)
    feats = D.windows([ex, null], tok, max_length=24, stride=8)
    enc = tok("which one?", ctx, truncation="only_second", max_length=24, stride=8,
              return_overflowing_tokens=True, return_offsets_mapping=True)  # fmt: skip
    n_first = sum(1 for m in enc["overflow_to_sample_mapping"] if m == 0)
    labelled = [
        (s, e) for s, e in zip(feats["start_positions"][:n_first], feats["end_positions"][:n_first])
    ]
    hits = [(w, s, e) for w, (s, e) in enumerate(labelled) if s]
    assert hits, "some window holds the whole answer"
    for w, s, e in hits:
        a, z = enc["offset_mapping"][w][s][0], enc["offset_mapping"][w][e][1]
        assert ctx[a:z].strip() == "kappa"
    assert all(
        s == 0 and e == 0
        for s, e in zip(feats["start_positions"][n_first:], feats["end_positions"][n_first:])
    )
