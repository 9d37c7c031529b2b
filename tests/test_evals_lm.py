"""Bits per byte: exact on a uniform model, each token scored once, windows agree with one pass."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from transformers import BertConfig, BertForMaskedLM, GPT2Config, GPT2LMHeadModel

from evals.lm import bits_per_byte, clm_nll, detect_objective, main
from training.tokenizer import train_tokenizer

FIXTURES = Path(__file__).parent / "fixtures" / "corpus"
TEXT = "The quick brown fox jumps over the lazy dog. Ünïcode bytes count double. " * 6


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    return train_tokenizer([FIXTURES], vocab_size=300, out=tmp_path_factory.mktemp("tok"))


def _gpt2(tok, zero=False):
    torch.manual_seed(0)
    cfg = GPT2Config(vocab_size=len(tok), n_positions=64, n_embd=32, n_layer=2, n_head=2)
    model = GPT2LMHeadModel(cfg).eval()
    if zero:  # tied embeddings: zero them and every logit is 0 -> uniform prediction
        with torch.no_grad():
            model.transformer.wte.weight.zero_()
    return model


def _bert(tok, zero=False):
    torch.manual_seed(0)
    cfg = BertConfig(
        vocab_size=len(tok),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=64,
    )
    model = BertForMaskedLM(cfg).eval()
    if zero:
        with torch.no_grad():
            model.cls.predictions.decoder.weight.zero_()
            model.cls.predictions.bias.zero_()
            model.cls.predictions.decoder.bias.zero_()
    return model


@pytest.mark.parametrize(("build", "objective"), [(_gpt2, "clm"), (_bert, "mlm")])
def test_uniform_model_gives_log2_vocab_bits_per_token(tok, build, objective):
    out = bits_per_byte(build(tok, zero=True), tok, TEXT, objective, max_tokens=100)
    n_tokens = len(tok(TEXT, add_special_tokens=False)["input_ids"][:100])
    assert out["tokens_scored"] == n_tokens  # <s> in front: every token is scored exactly once
    assert out["nats_per_token"] == pytest.approx(math.log(len(tok)), rel=1e-5)
    assert out["bits_per_byte"] == pytest.approx(
        n_tokens * math.log2(len(tok)) / out["bytes"], rel=1e-5
    )


def test_bytes_are_utf8_bytes_of_the_scored_span(tok):
    out = bits_per_byte(_gpt2(tok), tok, TEXT, "clm", max_tokens=10_000)
    assert out["bytes"] == len(TEXT.encode("utf-8")) > len(TEXT)


def test_sliding_windows_match_a_single_pass_when_the_text_fits(tok):
    model = _gpt2(tok)
    ids = tok(TEXT, add_special_tokens=False)["input_ids"][:40]
    full, n_full = clm_nll(model, ids, tok.bos_token_id, context=64, device="cpu")
    windowed, n_win = clm_nll(model, ids, tok.bos_token_id, context=16, device="cpu")
    assert n_full == n_win == len(ids)
    with torch.no_grad():
        seq = torch.tensor([[tok.bos_token_id] + ids])
        ref = torch.nn.functional.cross_entropy(
            model(seq).logits[0, :-1], seq[0, 1:], reduction="sum"
        )
    assert full == pytest.approx(ref.item(), rel=1e-5)
    assert windowed != pytest.approx(full, rel=1e-9)  # shorter context changes the numbers


def test_detect_objective():
    assert detect_objective(GPT2Config(architectures=["GPT2LMHeadModel"])) == "clm"
    assert detect_objective(BertConfig(architectures=["BertForMaskedLM"])) == "mlm"


def test_cli_on_a_saved_model_and_missing_file(tok, tmp_path, capsys):
    folder = tmp_path / "bert"
    model = _bert(tok)
    model.config.architectures = ["BertForMaskedLM"]
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    text = tmp_path / "t.txt"
    text.write_text(TEXT)
    assert main(["--model", str(folder), "--text", str(text), "--max-tokens", "20", "--json"]) == 0
    assert '"objective": "mlm"' in capsys.readouterr().out
    assert main(["--model", str(folder), "--text", str(tmp_path / "none.txt")]) == 2
    assert "none.txt: no such file" in capsys.readouterr().err


def test_modernbert_scored_only_at_the_mask_equals_the_dense_head():
    from transformers import ModernBertConfig, ModernBertForMaskedLM

    from evals.lm import _logits_at

    torch.manual_seed(0)
    cfg = ModernBertConfig(
        vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=2, max_position_embeddings=64, pad_token_id=0,
    )  # fmt: skip
    model = ModernBertForMaskedLM(cfg).eval()
    ids = torch.randint(3, 96, (3, 10))
    attention = torch.ones_like(ids)
    attention[2, 7:] = 0  # a padded row
    at = [9, 4, 6]
    with torch.no_grad():
        sparse = _logits_at(model, ids, attention, at)
        dense = model(input_ids=ids, attention_mask=attention).logits[torch.arange(3), at]
    assert sparse.shape == (3, 96)
    assert torch.allclose(sparse, dense, atol=1e-5)
    assert model.sparse_prediction == cfg.sparse_prediction  # the flag is restored
