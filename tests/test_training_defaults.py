"""Bare ``python -m training.finetune.contrastive`` / ``training.finetune.lora`` train on the demo
document set (docs/), say so, and never override data that was given; docs/ alone yields LoRA
examples."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from training.data.lora_data import training_examples
from training.defaults import default_corpus, default_docs_if_no_data


def test_no_data_means_the_demo_docs(capsys):
    cfg = SimpleNamespace(data=[], docs=[])
    assert default_docs_if_no_data(cfg, ("data", "docs"), "training.finetune.lora")
    assert cfg.docs == default_corpus() and Path(cfg.docs[0]).name == "docs"
    assert "no training data given (--data, --docs)" in capsys.readouterr().err


def test_given_data_is_kept():
    cfg = SimpleNamespace(docs=[], pairs=["p.jsonl"], scifact=None, squad=None)
    assert not default_docs_if_no_data(cfg, ("docs", "pairs", "scifact", "squad"), "x")
    assert cfg.docs == []


def test_demo_docs_alone_give_lora_examples():
    examples = training_examples([], default_corpus(), n=12, seed=0)
    assert len(examples) == 12
    assert all(e.kind == "doc" for e in examples)
