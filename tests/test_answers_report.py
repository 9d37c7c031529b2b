"""The docs table is built from the eval JSON files, one row per decoder (+ adapter)."""

from __future__ import annotations

import json

import pytest

from evals.answers_report import main, report, row_name


def test_rows_come_from_the_files_and_name_the_adapter(tmp_path, capsys):
    qa = {
        "config": {"generator": "qwen", "adapter": "artifacts/models/qwen-lora"},
        "n_questions": 400,
        "metrics": {"em": 0.5, "f1": 0.625, "citation_accuracy": 0.9, "latency_p50_s": 2.5},
    }
    doc = {
        "config": {"decoder": "smollm2", "adapter": None},
        "predictions": [{}] * 40,
        "metrics": {"hit@k": 0.95, "keyword_rate": 0.7},
    }
    (tmp_path / "qa-qwen-lora.json").write_text(json.dumps(qa))
    (tmp_path / "docqa-smollm2.json").write_text(json.dumps(doc))
    text = report(tmp_path)
    assert "| qwen + LoRA | 400 | 50.0 | 62.5 | 90.0 | – | – | 2.50 | – |" in text
    assert "| smollm2 | 40 | 95.0 | 70.0 |" in text
    assert row_name({"generator": "smollm2", "adapter": "none"}) == "smollm2"
    assert main([str(tmp_path / "missing")]) == 2
    assert "no such folder" in capsys.readouterr().err


@pytest.mark.parametrize("adapter", [None, "none", "auto"])
def test_no_adapter_means_the_base_model(adapter):
    assert row_name({"decoder": "d", "adapter": adapter}) == "d"


def test_gated_rows_name_their_threshold():
    cfg = {"generator": "q", "adapter": "a/lora", "refusal_threshold": 0.6}
    assert row_name(cfg) == "q + LoRA, refusal gate 0.6"
    cfg["answerability_threshold"] = 0.356
    assert row_name(cfg) == "q + LoRA, refusal gate 0.6, answerability check 0.356"
    assert row_name({**cfg, "refusal_threshold": 1.0}).startswith("q + LoRA, refusal barred,")
    assert (
        row_name({**cfg, "refusal_threshold": None, "answerability_threshold": None}) == "q + LoRA"
    )


def test_reader_rows_name_the_reader_folder():
    cfg = {"generator": "q", "reader": "artifacts/models/minilm-reader-docs", "compose": "extract"}
    assert row_name(cfg) == "minilm-reader-docs alone"
    assert row_name({**cfg, "compose": "decoder"}) == "minilm-reader-docs + q"
    assert row_name({**cfg, "reader": "auto", "compose": "decoder"}) == "reader + q"
    assert row_name({**cfg, "reader": "none"}) == "q"


def test_nested_configs_name_their_rows_as_the_flat_ones():
    """Results since the evals hold a RAGConfig: the settings are under ``rag`` by section."""
    from evals.qa import QAEvalConfig

    cfg = QAEvalConfig.of(
        squad="s.json", mode="rag", generator="q", adapter="a/lora", refusal_threshold=0.6
    )
    saved = json.loads(json.dumps(cfg.to_dict()))
    assert saved["mode"] == "rag" and saved["rag"]["generate"]["decoder"] == "q"
    assert row_name(saved) == "reader + q + LoRA, refusal gate 0.6, answerability check 0.338"
    flat = {"generator": "q", "adapter": "a/lora", "refusal_threshold": 0.6, "reader": "auto"}
    assert row_name({**flat, "answerability_threshold": 0.338}) == row_name(saved)
