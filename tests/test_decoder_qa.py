"""The causal span head (training.finetune.decoder_qa): a CLM folder opens in
AutoModelForQuestionAnswering with its own weights and its causal mask, and training.finetune.reader
trains and saves a reader on it."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file
from training_support import write_tiny_squad
from transformers import AutoModelForQuestionAnswering, AutoTokenizer

from training.finetune.decoder_qa import ModernBertDecoderForQuestionAnswering, register

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_clm_folder_loads_as_a_causal_span_model(tiny_clm_dir):
    register()
    model = AutoModelForQuestionAnswering.from_pretrained(str(tiny_clm_dir)).eval()
    assert isinstance(model, ModernBertDecoderForQuestionAnswering)
    saved = load_file(str(tiny_clm_dir / "model.safetensors"))
    state = model.state_dict()
    for name in ("model.layers.1.attn.q_proj.weight", "lm_head.dense.weight"):
        assert torch.equal(state[name], saved[name]), name  # the CLM's backbone and head
    tok = AutoTokenizer.from_pretrained(str(tiny_clm_dir))
    enc = tok("what is it?", "the thing is a b-tree index", return_tensors="pt")
    ids = enc["input_ids"]
    other = ids.clone()
    other[0, -2] = 5 + (other[0, -2] - 4) % (len(tok) - 5)
    with torch.no_grad():
        a, b = model(input_ids=ids), model(input_ids=other)
        loss = model(
            input_ids=ids, start_positions=torch.tensor([3]), end_positions=torch.tensor([4])
        ).loss
    assert torch.allclose(a.start_logits[0, :-2], b.start_logits[0, :-2], atol=1e-5)  # causal
    assert not torch.allclose(a.end_logits[0, -2:], b.end_logits[0, -2:], atol=1e-5)
    assert loss is not None and float(loss) > 0


def test_reader_trains_and_saves_on_a_clm_folder(tiny_clm_dir, tmp_path):
    from rag.answer.reader import SpanReader
    from training.finetune.reader import ReaderConfig, train_reader

    register()
    out = tmp_path / "reader"
    cfg = ReaderConfig(
        model=str(tiny_clm_dir),
        squad=str(write_tiny_squad(tmp_path / "squad.json")),
        out=str(out),
        max_steps=2,
        batch_size=4,
        calibration_questions=4,
        max_length=64,
        stride=16,
        precision="fp32",
        device="cpu",
    )
    summary = train_reader(cfg)
    assert summary["steps"] == 2 and summary["dev"]["questions"] == 6
    reloaded = AutoModelForQuestionAnswering.from_pretrained(str(out))
    assert isinstance(reloaded, ModernBertDecoderForQuestionAnswering)
    (span,) = SpanReader.load(out).read("What is it?", ["It is a b-tree index."])
    assert span.text and span.text in "It is a b-tree index."


def test_reader_cli_trains_on_a_clm_folder_in_a_fresh_process(tiny_clm_dir, tmp_path):
    """`python -m training.finetune.reader --model <CLM folder>` as typed: the causal span class is
    registered by training.finetune.reader itself, not only by the experiment (it raised before)."""
    import os
    import subprocess
    import sys

    out = tmp_path / "reader-cli"
    squad = write_tiny_squad(tmp_path / "squad.json")
    args = ["--model", str(tiny_clm_dir), "--squad", str(squad), "--out", str(out),
            "--max-steps", "1", "--batch-size", "4", "--calibration-questions", "4",
            "--max-length", "64", "--stride", "16", "--precision", "fp32",
            "--device", "cpu"]  # fmt: skip
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    r = subprocess.run(
        [sys.executable, "-m", "training.finetune.reader", *args],
        capture_output=True, text=True, timeout=300, env=env,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-2000:]
    assert (out / "config.json").exists()
    register()
    assert isinstance(
        AutoModelForQuestionAnswering.from_pretrained(str(out)),
        ModernBertDecoderForQuestionAnswering,
    )
