"""Fine-tune an encoder into an extractive reader (a span head: start/end logits per token).

    python -m training.finetune.reader --model minilm \\
        --squad ../shared/data/squad/squad-v1.1-dev-part.json \\
        --out artifacts/models/minilm-reader --epochs 2 --threads 2

The recipe is transformers' question-answering fine-tune (``AutoModelForQuestionAnswering``:
cross-entropy on the gold start and end token, stride windows for long passages) on the SQuAD
*train* articles, with the SQuAD 2.0 null-span addition: retrieved distractor paragraphs are
labelled with the ``[CLS]`` position, so the reader learns to say "not in this passage"
(data: :mod:`training.data.reader_data`). Any encoder starts it: ``minilm`` (all-MiniLM-L6-v2, a
sentence embedder: whether its token-level skill survived the sentence fine-tune is what the
dev EM/F1 before/after says), a plain HF encoder or our MLM / CLM folders (the
division-of-labour reading column).

After training, the null threshold is chosen on held-out *train* questions (never dev): each
question is read over its gold paragraph plus distractors (it should answer) and over the
distractors alone (it should abstain), and the margin that gets most of both right is saved in
``reader.json``. Then EM/F1 on the dev articles' gold paragraphs (the reading score) and the
calibration accuracies go to run.json. The folder loads with ``AutoModelForQuestionAnswering``
and ``pipeline("question-answering")``; the product reads it with
:class:`rag.answer.reader.SpanReader`.
"""

from __future__ import annotations

import json
import logging
import random
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from rag.answer.reader import Span, SpanReader, pick
from rag.cli.flags import config_parser, run_config_cli
from rag.evaluation.metrics import exact_match, f1_score, normalize_answer
from rag.models import lm_objective, resolve_model
from training.data import reader_data as D
from training.finetune.recipe import (
    FinetuneConfig,
    check_training_precision,
    finetune_run,
    training_precision,
)

log = logging.getLogger("training.finetune.reader")


@dataclass
class ReaderConfig(FinetuneConfig):
    """Everything a reader run depends on (the training loop's settings:
    :class:`~training.finetune.recipe.FinetuneConfig`); saved as run.json beside the model."""

    model: str = "minilm"  # encoder to start from: alias, HF folder or our MLM/CLM folder
    squad: str = ""  # SQuAD v1.1 JSON: train articles for training, dev articles for the score
    epochs: float = 2.0  # passes over the training windows
    lr: float = 1e-4  # peak learning rate (small encoders like a higher rate than BERT's 3e-5)
    batch_size: int = 32  # windows per optimiser step
    negatives: int = 2  # retrieved distractor paragraphs per question (null-span examples)
    max_questions: int = 0  # cap on training questions, sampled by seed (0 = all)
    calibration_questions: int = 300  # train questions kept out to choose the null threshold
    calibration_negatives: int = 4  # distractors per calibration question (k = 5 passages)
    # documentation folders whose section-heading questions
    # (training.data.reader_data.doc_questions: answer = the section's lead sentence) join training
    # and calibration: SQuAD alone is encyclopaedia prose, the product reads reST/markdown. Never
    # the documents you evaluate on.
    docs: list[str] = field(default_factory=list)
    doc_questions: int = 2000  # documentation questions trained on (with --docs)
    calibration_doc_questions: int = 300  # more kept out of training for the null threshold
    # only re-choose the null threshold of the reader already in --out (no training): rewrites
    # reader.json and adds the calibration to run.json
    calibrate_only: bool = False
    max_length: int = 384  # tokens per window (question + passage)
    stride: int = 128  # overlap between windows of a long passage
    max_answer_tokens: int = 30  # longest span the reader may return
    # auto | fp32 | bf16 (rag.models.precision's words; int8 is refused): bf16 autocast in
    # training, auto = on CUDA or a CPU with bf16 units
    precision: str = "auto"
    eval_max_questions: int = 0  # dev questions scored before/after (0 = all)
    # dropout on the attention probabilities; 0 by default: with it on, torch's CPU attention
    # leaves its fused kernel, several times slower per step (docs/training.md, the reader)
    attention_dropout: float = 0.0


# ---------------------------------------------------------------------------- model


def build_model(name: str, attention_dropout: float | None = None) -> tuple[Any, Any]:
    """(AutoModelForQuestionAnswering, fast tokenizer) on ``name``'s weights: a QA folder keeps
    its span head; any other encoder (or decoder) gets a fresh one. ``attention_dropout`` (None =
    the model's own) is set on whichever field the architecture names it by."""
    from transformers import AutoConfig, AutoModelForQuestionAnswering, AutoTokenizer

    path = resolve_model(name)
    tok = AutoTokenizer.from_pretrained(str(path))
    if not getattr(tok, "is_fast", False):
        raise ValueError(f"--model {name}: a reader needs a fast tokenizer (character offsets)")
    cfg = AutoConfig.from_pretrained(str(path))
    if lm_objective(cfg) == "clm":
        log.info("%s is a causal LM: its span head reads with the causal mask", name)
    from training.finetune.decoder_qa import register

    register()  # AutoModelForQuestionAnswering opens ModernBERT decoder folders too (CLM rows)
    kw = {}
    if attention_dropout is not None:
        kw = {
            f: attention_dropout
            for f in ("attention_probs_dropout_prob", "attention_dropout")
            if hasattr(cfg, f)
        }
    model = AutoModelForQuestionAnswering.from_pretrained(str(path), **kw)
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token or tok.unk_token
        model.config.pad_token_id = tok.pad_token_id
    return model, tok


# ---------------------------------------------------------------------------- scores


def gold_scores(reader: SpanReader, qs: list[D.ReaderQuestion]) -> dict[str, float]:
    """EM / F1 (0-100) of the best span over each question's gold paragraph alone."""
    em = f1 = 0.0
    for q in qs:
        spans = reader.read(q.question, [q.gold])
        text = spans[0].text if spans else ""
        em += exact_match(text, q.answers)
        f1 += f1_score(text, q.answers)
    n = max(len(qs), 1)
    return {"em": round(100 * em / n, 2), "f1": round(100 * f1 / n, 2), "questions": len(qs)}


def span_is_right(q: D.ReaderQuestion, span: Span) -> bool:
    """Whether the reader's pick over ``[q.gold, *q.distractors]`` answers ``q``: for SQuAD, F1 >=
    0.5 against a gold answer; for a documentation question (whose gold is the section's lead),
    a span inside the gold section with at least half of its words in the lead."""
    if q.kind != "doc":
        return f1_score(span.text, q.answers) >= 0.5
    words = normalize_answer(span.text).split()
    lead = set(normalize_answer(q.answers[0]).split())
    return span.passage == 0 and bool(words) and sum(w in lead for w in words) >= len(words) / 2


def choose_threshold(reader: SpanReader, qs: list[D.ReaderQuestion]) -> dict[str, float]:
    """The null threshold on calibration questions: read each over gold + distractors (right if
    :func:`span_is_right`) and over distractors alone (right if it abstains); the margin that
    maximises right answers + right abstentions over every question wins (ties: the lowest).
    Per-kind accuracies (squad, doc) are reported at the chosen threshold."""
    answerable, unanswerable = [], []  # (best margin, picked span is right, kind); (margin, kind)
    for q in qs:
        spans = reader.read(q.question, [q.gold, *q.distractors])
        top = pick(spans, float("-inf"))
        answerable.append((top.margin, span_is_right(q, top), q.kind) if top else None)
        if q.distractors:
            top = pick(reader.read(q.question, q.distractors), float("-inf"))
            unanswerable.append((top.margin if top else float("-inf"), q.kind))
    answerable = [a for a in answerable if a is not None]
    candidates = sorted({m for m, _, _ in answerable} | {m for m, _ in unanswerable} | {0.0})

    def right(t: float, kind: str | None = None) -> tuple[int, int]:
        a = sum(ok and m >= t for m, ok, k in answerable if kind in (None, k))
        return a, sum(m < t for m, k in unanswerable if kind in (None, k))

    def pct(n: int, rows: list, kind: str | None = None) -> float:
        total = sum(kind in (None, row[-1]) for row in rows)
        return round(100 * n / max(total, 1), 2)

    best = max(candidates, key=lambda t: (sum(right(t)), -t))
    a, u = right(best)
    out = {
        "threshold": round(float(best), 4),
        "answered_right": pct(a, answerable),
        "abstained_right": pct(u, unanswerable),
        "questions": len(qs),
    }
    for kind in sorted({q.kind for q in qs}):
        ka, ku = right(best, kind)
        out[kind] = {
            "questions": sum(q.kind == kind for q in qs),
            "answered_right": pct(ka, answerable, kind),
            "abstained_right": pct(ku, unanswerable, kind),
        }
    return out


def split_questions(cfg: ReaderConfig) -> tuple[list[D.ReaderQuestion], list[D.ReaderQuestion]]:
    """(train, calibration) questions: the SQuAD train-article questions with
    ``max(negatives, calibration_negatives)`` distractors, ``calibration_questions`` of them drawn
    by seed and kept out of training; with ``docs``, documentation questions split the same way
    (``calibration_doc_questions`` kept out). No SQuAD dev article is ever in either."""
    for path in cfg.docs:
        if not Path(path).exists():
            raise ValueError(f"--docs {path}: no such file or folder")
    all_qs = D.questions(
        D.squad_articles(cfg.squad, "train"),
        negatives=max(cfg.negatives, cfg.calibration_negatives),
    )
    train_qs, cal_qs = D.split_calibration(all_qs, cfg.calibration_questions, cfg.seed)
    D.assert_train_only(train_qs + cal_qs, cfg.squad)
    if cfg.docs:
        doc_qs = D.doc_questions(
            cfg.docs,
            cfg.doc_questions + cfg.calibration_doc_questions,
            max(cfg.negatives, cfg.calibration_negatives),
            cfg.seed,
        )
        doc_train, doc_cal = D.split_calibration(doc_qs, cfg.calibration_doc_questions, cfg.seed)
        train_qs, cal_qs = train_qs + doc_train, cal_qs + doc_cal
    return train_qs, cal_qs


def recalibrate(cfg: ReaderConfig) -> dict[str, Any]:
    """Choose the null threshold of the trained reader in ``cfg.out`` again (no training) on
    :func:`split_questions`; rewrites its reader.json, records it in run.json."""
    out = Path(cfg.out)
    if not (out / "reader.json").is_file():
        raise ValueError(f"--out {out}: no trained reader there (reader.json missing)")
    reader = SpanReader.load(out, precision="fp32")  # calibrated as it was trained
    t = time.time()
    calibration = choose_threshold(reader, split_questions(cfg)[1])
    calibration["seconds"] = round(time.time() - t, 1)
    settings = json.loads((out / "reader.json").read_text())
    settings["threshold"] = calibration["threshold"]
    settings["docs"] = [str(p) for p in cfg.docs]
    (out / "reader.json").write_text(json.dumps(settings, indent=2) + "\n")
    run_path = out / "run.json"
    run = json.loads(run_path.read_text()) if run_path.is_file() else {}
    run.setdefault("recalibrations", []).append(calibration)
    run_path.write_text(json.dumps(run, indent=2) + "\n")
    log.info("recalibrated %s: %s", out, calibration)
    return {"out": str(out), "calibration": calibration}


# ---------------------------------------------------------------------------- run


def train_reader(cfg: ReaderConfig) -> dict[str, Any]:
    """Train, calibrate, score and save a reader; returns the run summary (also run.json).
    ``calibrate_only``: only choose the threshold of the reader in ``out`` again
    (:func:`recalibrate`)."""
    if not cfg.squad:
        raise ValueError("--squad is required (a SQuAD v1.1 JSON file)")
    if not Path(cfg.squad).is_file():
        raise ValueError(f"--squad {cfg.squad}: no such file")
    if cfg.calibrate_only:
        return recalibrate(cfg)
    from datasets import Dataset
    from transformers import DataCollatorWithPadding, Trainer, TrainingArguments

    cfg.model = cfg.model or "minilm"
    with finetune_run(cfg, "reader") as run:
        train_qs, cal_qs = split_questions(cfg)
        if cfg.max_questions:
            train_qs = random.Random(cfg.seed).sample(
                train_qs, min(cfg.max_questions, len(train_qs))
            )
        train_qs = [replace(q, distractors=q.distractors[: cfg.negatives]) for q in train_qs]
        dev_qs = D.questions(D.squad_articles(cfg.squad, "dev"), negatives=0)
        if cfg.eval_max_questions:
            dev_qs = random.Random(cfg.seed).sample(
                dev_qs, min(cfg.eval_max_questions, len(dev_qs))
            )

        model, tok = build_model(cfg.model, cfg.attention_dropout)
        exs = D.examples(train_qs)
        feats = D.windows(exs, tok, cfg.max_length, cfg.stride)
        n_null = sum(s == 0 for s in feats["start_positions"])
        log.info(
            "%d questions -> %d examples -> %d windows (%d labelled null)",
            len(train_qs),
            len(exs),
            len(feats["input_ids"]),
            n_null,
        )
        dataset = Dataset.from_dict(feats).shuffle(seed=cfg.seed)
        use_bf16 = training_precision(cfg.precision, run.device) == "bf16"
        args = run.training_args(
            TrainingArguments,
            bf16=use_bf16,
            weight_decay=0.01,
            train_sampling_strategy="group_by_length",  # windows of like length: less padding
        )
        reader = SpanReader(model, tok, cfg.max_length, cfg.stride, cfg.max_answer_tokens)
        model.to(run.device).eval()
        t = time.time()
        before = gold_scores(reader, dev_qs[:200])
        log.info("dev (200 questions, gold paragraph) before: %s (%.0f s)", before, time.time() - t)
        run.event(phase="before", **before)
        run.train(
            Trainer,
            args,
            model,
            dataset,
            data_collator=DataCollatorWithPadding(tok, pad_to_multiple_of=64),
        )
        model.eval()
        calibration = choose_threshold(reader, cal_qs)
        dev = gold_scores(reader, dev_qs)
        log.info("calibration: %s; dev after: %s", calibration, dev)
        run.event(phase="after", calibration=calibration, **dev)
        model.save_pretrained(str(run.out))
        tok.save_pretrained(str(run.out))
        settings = {
            "max_length": cfg.max_length,
            "stride": cfg.stride,
            "max_answer_tokens": cfg.max_answer_tokens,
            "threshold": calibration["threshold"],
            "base_model": cfg.model,
            "docs": [str(p) for p in cfg.docs],
        }
        (run.out / "reader.json").write_text(json.dumps(settings, indent=2) + "\n")
        return run.finish(
            f"reader from {cfg.model}",
            {
                "questions": len(train_qs),
                "doc_questions": sum(q.kind == "doc" for q in train_qs),
                "windows": len(feats["input_ids"]),
                "null_windows": n_null,
                "bf16": use_bf16,
                "dev_before_200": before,
                "dev": dev,
                "calibration": calibration,
            },
        )


def reader_config(
    out: str | Path, data: Path, device: str = "auto", threads: int = 0
) -> ReaderConfig:
    """The ``make models`` recipe of ``minilm-reader``, the measured one (docs/training.md, with
    its timings; docs/answering.md): MiniLM with a fresh span head on the 6,342 SQuAD
    train-article questions plus 1,735 section-heading questions of linux-doc (300 more of each
    kept to choose the null threshold), each on its gold passage and on 2 BM25 distractors
    (25,653 windows), 2 epochs of 32 windows at 1e-4, bf16 where the CPU has bf16 units."""
    return ReaderConfig(
        model="minilm",
        out=str(out),
        squad=str(data / "squad" / "squad-v1.1-dev-part.json"),
        docs=[str(data / "corpus" / "linux-doc")],
        device=device,
        threads=threads,
    )


def _report(summary: dict[str, Any]) -> str:
    if "dev" not in summary:  # --calibrate-only
        cal = summary["calibration"]
        return f"reader {summary['out']}: null threshold {cal['threshold']} ({json.dumps(cal)})"
    dev, cal = summary["dev"], summary["calibration"]
    return (
        f"reader -> {summary['out']}: dev gold-paragraph EM {dev['em']} / F1 {dev['f1']} "
        f"({dev['questions']} questions; before {summary['dev_before_200']['f1']} F1), "
        f"null threshold {cal['threshold']} (calibration: {cal['answered_right']}% answered right, "
        f"{cal['abstained_right']}% abstained right), {summary['train_seconds']} s"
    )


def main(argv: list[str] | None = None) -> int:
    parser = config_parser("python -m training.finetune.reader", __doc__, ReaderConfig)
    return run_config_cli(
        parser,
        ReaderConfig,
        train_reader,
        argv,
        check=lambda cfg: check_training_precision(cfg.precision),
        report=_report,
        logs_to_stderr=True,
    )


if __name__ == "__main__":
    sys.exit(main())
