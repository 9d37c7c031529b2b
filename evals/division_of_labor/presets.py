"""Rows, presets and the run configuration of the division-of-labour experiment
(evals.division_of_labor): the numbers that must be identical across rows live here."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

ROWS = ("mlm15", "mlm30", "mlm40", "clm", "clm2mlm", "antlm", "prefixlm")
# the downstream columns, each scored after its identical recipe (package docstring)
COLUMNS = ("retrieval", "generation", "qa", "reading")
# training.pretrain --objective of each row (clm2mlm: of its second stage, after a clm stage)
ROW_OBJECTIVE = {
    "mlm15": "mlm",
    "mlm30": "mlm",
    "mlm40": "mlm",
    "clm": "clm",
    "clm2mlm": "mlm",
    "antlm": "antlm",
    "prefixlm": "prefixlm",
}
# (mask rate, strategy) of the row's MLM steps; antlm's are clm2mlm's, so the two differ only in
# how CLM and MLM steps are scheduled (two stages vs alternation)
ROW_MASK = {
    "mlm15": (0.15, "80-10-10"),
    "mlm30": (0.30, "mask-only"),
    "mlm40": (0.40, "mask-only"),
    "clm2mlm": (0.15, "80-10-10"),
    "antlm": (0.15, "80-10-10"),
}


@dataclass(frozen=True)
class ExperimentPreset:
    """Sizes for one scale of the experiment; every row of a preset uses the same numbers."""

    name: str
    model_preset: str  # training/pretrain/config.py preset: the shared backbone
    vocab_size: int  # shared byte-level BPE tokenizer
    pretrain_steps: int  # optimiser steps per row (the token budget with batch and seq_len)
    seq_len: int  # pretraining tokens per sequence
    batch_size: int  # pretraining sequences per step
    contrastive_steps: int  # identical fine-tune for every row
    contrastive_batch: int  # in-batch negatives + 1
    contrastive_pairs: int  # pairs sampled from SciFact train + SQuAD train articles
    contrastive_lr: float  # peak learning rate of the contrastive fine-tune
    max_seq_length: int  # encoder tokens per text in fine-tuning and retrieval eval
    eval_queries: int  # dev queries per retrieval set (0 = all)
    eval_docs: int  # corpus subsample size, relevant docs always kept (0 = whole corpus)
    bpb_tokens: int  # tokens of WikiText-2 validation scored per model
    lora_steps: int  # identical LoRA for every decoder
    lora_examples: int  # SQuAD train-article examples the LoRA draws from
    qa_questions: int  # SQuAD dev questions for grounded QA
    reading_steps: int  # identical span-head fine-tune (training.finetune.reader) for every row
    reading_questions: int  # SQuAD train-article questions it draws from (0 = all)
    reading_eval_questions: int  # SQuAD dev questions scored on their gold paragraph (0 = all)
    clm_fraction: float = 0.5  # clm2mlm: share of the steps spent on CLM
    qa_k: int = 3  # passages per QA prompt (LoRA and eval); tiny uses 1 to fit its context
    lora_lr: float = 2e-4  # peak learning rate of the LoRA fine-tune
    reading_batch: int = 32  # windows per reader step (training.finetune.reader's default)
    reading_calibration: int = 300  # train questions kept to choose the null threshold
    reading_articles: int = 0  # SQuAD train articles the reader draws from (0 = all 30)
    antlm_block: int = 1  # antlm: steps per CLM / MLM block (1 = switch every step)


def _preset(name: str, **kw: Any) -> ExperimentPreset:
    return ExperimentPreset(name=name, model_preset=name, **kw)


# One preset per block reads better than one argument per line.
# fmt: off
PRESETS = {
    # A test runs this end to end on CPU in about a minute.
    "tiny": _preset(
        "tiny", vocab_size=2000, pretrain_steps=12, seq_len=64, batch_size=8,
        contrastive_steps=6, contrastive_batch=8, contrastive_pairs=64, contrastive_lr=1e-3,
        max_seq_length=64, eval_queries=12, eval_docs=150, bpb_tokens=128,
        lora_steps=3, lora_examples=16, qa_questions=4, qa_k=1,
        reading_steps=3, reading_questions=12, reading_eval_questions=4, reading_batch=8,
        reading_calibration=2, reading_articles=1,
    ),
    # CPU: the four original rows, two seeds (one process per seed, one thread each) plus the
    # baselines, took 1 h 47 min on 2 cores (docs/division_of_labor.md); the three newer rows and
    # the reading column have not been timed at this preset yet.
    "small": _preset(
        "small", vocab_size=8000, pretrain_steps=400, seq_len=256, batch_size=16,
        contrastive_steps=200, contrastive_batch=32, contrastive_pairs=6400, contrastive_lr=2e-4,
        max_seq_length=128, eval_queries=0, eval_docs=0, bpb_tokens=4096,
        lora_steps=50, lora_examples=400, qa_questions=100, lora_lr=1e-3,
        reading_steps=200, reading_questions=2000, reading_eval_questions=0,
    ),
    # GPU (one H200). 2,500 steps x 64 x 512 = 81.9M tokens: 1.9 passes over the ~43M training
    # tokens of its default corpus (data.default_corpus; 3,000 steps over the shared corpus and
    # the Python docs, ~15M tokens, were 6.5 passes, and the model memorised them: issue 44).
    "base": _preset(
        "base", vocab_size=16000, pretrain_steps=2500, seq_len=512, batch_size=64,
        contrastive_steps=1000, contrastive_batch=64, contrastive_pairs=64000, contrastive_lr=5e-5,
        max_seq_length=256, eval_queries=0, eval_docs=0, bpb_tokens=32768,
        lora_steps=400, lora_examples=3200, qa_questions=500, lora_lr=5e-4,
        reading_steps=1000, reading_questions=0, reading_eval_questions=0, reading_batch=64,
    ),
}
# fmt: on


@dataclass
class ExperimentConfig:
    """One experiment run; saved in results.json."""

    preset: str = "tiny"  # tiny | small | base
    out: str = ""  # output folder (cells, models, results, plots); finished cells are kept
    seeds: list[int] = field(default_factory=lambda: [0])  # one pretraining per row and seed
    rows: list[str] = field(default_factory=lambda: list(ROWS))  # subset of the rows (ROWS)
    # subset of the columns (COLUMNS): a row is pretrained whenever one of them needs it
    columns: list[str] = field(default_factory=lambda: list(COLUMNS))
    corpus: list[str] = field(default_factory=list)  # pretraining corpus (default by preset)
    scifact: str = ""  # BEIR SciFact folder (default: shared data)
    squad: str = ""  # SQuAD v1.1 JSON (default: shared data)
    wikitext: str = ""  # WikiText-2 validation tokens (default: shared data)
    baselines: bool = True  # minilm, smollm2 zero-shot and LoRA (BM25 always runs)
    device: str = "auto"  # auto | cpu | cuda
    threads: int = 0  # torch CPU threads (0 = torch default)
    # (row, seed) pairs run at once, each in a process of its own on the one device (the shared
    # tokenizer, pairs and baselines first, here); 1 = one after another in this process
    jobs: int = 1
    # write run.json, the results and the plots at the end (the workers of --jobs do not: the
    # process that started them writes them once every worker has ended)
    report: bool = True

    # value sets: argparse choices of python -m evals.division_of_labor (rag.cli.flags)
    CHOICES: ClassVar[dict[str, tuple[str, ...]]] = {
        "preset": tuple(PRESETS),
        "rows": ROWS,
        "columns": COLUMNS,
    }
