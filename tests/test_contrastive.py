"""Contrastive fine-tuning with tiny models: the loss falls, saved == loaded (trained weights kept),
plain encoder and decoder folders are wrapped, dev splits never reach training."""

from __future__ import annotations

import json

import pytest
import torch
from training_support import (
    save_tiny_decoder,
    save_tiny_encoder,
    write_pairs_file,
    write_tiny_squad,
)

from training.finetune.contrastive import ContrastiveConfig, collect_pairs, fit, main


@pytest.fixture(scope="module")
def tiny_encoder(tmp_path_factory):
    return save_tiny_encoder(tmp_path_factory.mktemp("enc"))


def _cfg(model, out, pairs, **kw) -> ContrastiveConfig:
    base = dict(
        model=str(model),
        out=str(out),
        pairs=[str(pairs)],
        eval=False,
        batch_size=16,
        lr=1e-3,
        max_steps=12,
        logging_steps=1,
        max_seq_length=32,
        device="cpu",
        warmup_ratio=0.0,
        threads=1,
    )
    return ContrastiveConfig(**{**base, **kw})


def _losses(out) -> list[float]:
    rows = [json.loads(x) for x in (out / "train_log.jsonl").read_text().splitlines()]
    return [r["loss"] for r in rows if "loss" in r]


def test_loss_falls_and_saved_equals_loaded(tiny_encoder, tmp_path):
    from sentence_transformers import SentenceTransformer
    from transformers import AutoModel

    pairs = write_pairs_file(tmp_path / "pairs.jsonl", n=64)
    out = tmp_path / "ft"
    model, summary = fit(_cfg(tiny_encoder, out, pairs, epochs=4, max_steps=-1))
    losses = _losses(out)
    assert len(losses) >= 8
    assert sum(losses[-3:]) / 3 < sum(losses[:3]) / 3
    assert summary["steps"] == 16 and (out / "run.json").exists() and (out / "loss.png").exists()

    loaded = SentenceTransformer(str(out), device="cpu")
    trained = model.state_dict()
    for name, value in loaded.state_dict().items():
        assert torch.equal(value, trained[name]), name
    base = AutoModel.from_pretrained(tiny_encoder).state_dict()
    first = "embeddings.word_embeddings.weight"
    assert not torch.equal(base[first], loaded[0].auto_model.state_dict()[first])
    texts = ["open a file", "socket server"]
    assert torch.allclose(
        model.encode(texts, convert_to_tensor=True), loaded.encode(texts, convert_to_tensor=True)
    )
    modules = [m["type"] for m in json.loads((out / "modules.json").read_text())]
    assert modules[-1].endswith("Normalize") and "Pooling" in modules[1]


def test_decoder_with_last_token_pooling(tmp_path):
    from sentence_transformers import SentenceTransformer

    dec = save_tiny_decoder(tmp_path / "dec")
    pairs = write_pairs_file(tmp_path / "pairs.jsonl", n=32)
    out = tmp_path / "ft"
    model, _ = fit(_cfg(dec, out, pairs, pooling="last", max_steps=3, hard_negatives="bm25"))
    pooling = json.loads((out / "1_Pooling" / "config.json").read_text())
    assert pooling["pooling_mode"] == "lasttoken"
    loaded = SentenceTransformer(str(out), device="cpu")
    trained = model.state_dict()
    assert all(torch.equal(v, trained[k]) for k, v in loaded.state_dict().items())


def test_collect_pairs_drops_squad_dev_articles(tmp_path):
    squad = write_tiny_squad(tmp_path / "squad.json")
    pairs = collect_pairs(ContrastiveConfig(squad=str(squad)))
    assert pairs and all("Normans" not in p.source for p in pairs)
    assert not any("Normans" in p.positive for p in pairs)


def test_cli_reports_bad_flag_value(tmp_path, capsys):
    pairs = write_pairs_file(tmp_path / "pairs.jsonl", n=8)
    rc = main(["--model", str(tmp_path / "missing"), "--pairs", str(pairs), "--no-eval"])
    assert rc == 2
    assert "missing" in capsys.readouterr().err


def test_cached_loss_runs_with_evaluation(tiny_encoder, tmp_path):
    """The cached (GradCache) loss and the dev evaluation path, on the tiny SQuAD file."""
    squad = write_tiny_squad(tmp_path / "squad.json")
    cfg = _cfg(
        tiny_encoder,
        tmp_path / "ft",
        write_pairs_file(tmp_path / "p.jsonl", 32),
        loss="cached-mnrl",
        mini_batch_size=4,
        max_steps=2,
        eval=True,
        eval_squad=str(squad),
        eval_scifact=str(tmp_path / "none"),
    )
    _, summary = fit(cfg)
    assert (
        set(summary["before"]) == {"squad-dev"} and summary["before"]["squad-dev"]["n_queries"] == 6
    )
    assert 0.0 <= summary["after"]["squad-dev"]["ndcg@10"] <= 1.0


def test_our_pretrained_folders_mlm_and_clm(tiny_mlm_dir, tiny_clm_dir, tmp_path):
    """The from-scratch artefacts: the MLM folder (a ST folder with mean pooling) gains Normalize;
    the CLM folder with --pooling last gets last-token pooling; both reload with their weights."""
    from sentence_transformers import SentenceTransformer

    pairs = write_pairs_file(tmp_path / "pairs.jsonl", n=16)
    for src, pooling, want in ((tiny_mlm_dir, "auto", "mean"), (tiny_clm_dir, "last", "lasttoken")):
        out = tmp_path / f"ft-{want}"
        model, _ = fit(_cfg(src, out, pairs, pooling=pooling, max_steps=2, batch_size=8))
        assert json.loads((out / "1_Pooling" / "config.json").read_text())["pooling_mode"] == want
        assert json.loads((out / "modules.json").read_text())[-1]["type"].endswith("Normalize")
        loaded = SentenceTransformer(str(out), device="cpu")
        trained = model.state_dict()
        assert all(torch.equal(v, trained[k]) for k, v in loaded.state_dict().items())


def test_precision_bf16_on_cuda_fp32_on_a_cpu_unless_asked(tiny_encoder, tmp_path, capsys):
    """Issue 44: auto trains in bf16 on CUDA (not fp32 matmuls on an H200) and stays fp32 on a
    CPU (bf16 there not measured); bf16 asked for on a CPU is honoured; int8 is refused."""
    from training.finetune.contrastive import contrastive_precision

    assert contrastive_precision("auto", "cuda") == "bf16"
    assert contrastive_precision("auto", "cpu") == "fp32"
    assert contrastive_precision("bf16", "cpu") == "bf16"
    assert contrastive_precision("fp32", "cuda") == "fp32"
    pairs = write_pairs_file(tmp_path / "pairs.jsonl", n=16)
    _, summary = fit(_cfg(tiny_encoder, tmp_path / "ft", pairs, max_steps=2, precision="bf16"))
    assert summary["config"]["precision"] == "bf16" and summary["steps"] == 2
    rc = main(["--pairs", str(pairs), "--no-eval", "--precision", "int8"])
    assert rc == 2 and "--precision int8 is for inference only" in capsys.readouterr().err
