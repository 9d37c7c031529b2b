"""``make models`` writes the retrieval artefacts exactly where the product looks for them: the
tuned retriever new indexes are built with, and the reranker ``rerank = auto`` picks up."""

from __future__ import annotations

import argparse
from pathlib import Path

from rag.answer.reader import READER_ARTEFACT, resolve_reader
from rag.models import TUNED_ENCODER, default_encoder
from rag.retrieval.rerank import AUTO_RERANKER, resolve_reranker
from rag.storage.paths import models_dir
from training.finetune.contrastive import tuned_retriever_config
from training.finetune.rerank import reranker_config
from training.make_models import retrieval_steps


def test_steps_write_what_auto_resolution_reads(tmp_path, monkeypatch):
    monkeypatch.setenv("RAG_HOME", str(tmp_path / "home"))
    args = argparse.Namespace(device="cpu", threads=1)
    retriever, reranker, reader = retrieval_steps(args, tmp_path / "data")
    assert retriever.artefact == models_dir() / TUNED_ENCODER
    assert reranker.artefact == models_dir() / AUTO_RERANKER
    assert reader.artefact == models_dir() / READER_ARTEFACT
    assert not retriever.exists() and not reranker.exists() and not reader.exists()
    # before make models: the base encoder, no reranker, no reader
    assert default_encoder() == "minilm" and resolve_reranker("auto") is None
    assert resolve_reader("auto") is None
    (reader.artefact).mkdir(parents=True)
    (reader.artefact / "reader.json").write_text("{}")
    assert reader.exists() and resolve_reader("auto") == reader.artefact  # what auto reads


def test_recipes_train_on_train_splits_and_the_docs(tmp_path):
    data = tmp_path / "data"
    r = tuned_retriever_config(tmp_path / "out", data)
    assert r.scifact == str(data / "scifact") and r.hard_negatives == "mined" and not r.eval
    c = reranker_config(tmp_path / "out", data)
    assert c.squad == str(data / "squad" / "squad-v1.1-dev-part.json")
    assert c.random_negatives > 0 and c.negatives > 0  # the recipe that took off
    assert Path(c.docs[0]).name == "docs" and (Path(c.docs[0]) / "retrieval.md").exists()


def test_steps_run_the_recipes_and_report_their_summaries(tmp_path, monkeypatch):
    import training.finetune.contrastive as C
    import training.finetune.rerank as RR

    monkeypatch.setenv("RAG_HOME", str(tmp_path / "home"))
    seen = {}

    def fake_contrastive(cfg):
        seen["retriever"] = cfg
        return {"n_pairs": 727, "steps": 66, "train_loss": 0.56}

    def fake_rerank(cfg):
        seen["reranker"] = cfg
        return {"n_rows": 14673, "steps": 1400, "after": {"scifact-dev": {"ndcg@10": 0.7}}}

    monkeypatch.setattr(C, "train_contrastive", fake_contrastive)
    monkeypatch.setattr(RR, "train_rerank", fake_rerank)
    args = argparse.Namespace(device="cpu", threads=2)
    retriever, reranker, reader = retrieval_steps(args, tmp_path / "data")
    assert retriever.run() == {"n_pairs": 727, "steps": 66, "train_loss": 0.56}
    assert reranker.run()["n_rows"] == 14673
    assert seen["retriever"].out == str(models_dir() / TUNED_ENCODER)
    assert seen["reranker"].out == str(models_dir() / AUTO_RERANKER)
    assert seen["reranker"].threads == 2 and seen["retriever"].device == "cpu"
