"""The encoder/decoder pair: one backbone, different attention masks."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoTokenizer

from training.pretrain.config import ConfigError
from training.pretrain.model import build_model, count_parameters


@pytest.fixture(autouse=True)
def _one_thread():
    """One torch thread: on a CPU shared with other jobs this is several times faster."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def tok(tiny_tokenizer_dir):
    return AutoTokenizer.from_pretrained(str(tiny_tokenizer_dir))


def _logits(model, ids):
    with torch.no_grad():
        return model(input_ids=ids).logits


@pytest.mark.parametrize("seq_len", [40, 150])  # 150 > sliding window: local layers included
def test_causal_mask_decoder_vs_encoder(tok, seq_len):
    torch.manual_seed(0)
    ids = torch.randint(5, len(tok), (2, seq_len))
    changed = ids.clone()
    cut = seq_len - 7
    changed[:, cut] = 5 + (changed[:, cut] - 4) % (len(tok) - 5)
    assert not torch.equal(ids, changed)
    dec = build_model("clm", "tiny", len(tok), tok).eval()
    a, b = _logits(dec, ids), _logits(dec, changed)
    assert torch.allclose(a[:, :cut], b[:, :cut], atol=1e-5)  # earlier positions never see it
    assert not torch.allclose(a[:, cut:], b[:, cut:], atol=1e-5)
    enc = build_model("mlm", "tiny", len(tok), tok).eval()
    a, b = _logits(enc, ids), _logits(enc, changed)
    assert not torch.allclose(a[:, : cut - 1], b[:, : cut - 1], atol=1e-5)  # bidirectional


def test_same_backbone_for_both_objectives(tok):
    enc = build_model("mlm", "tiny", len(tok), tok)
    dec = build_model("clm", "tiny", len(tok), tok)
    # same sizes everywhere (the decoder splits Wqkv into q/k/v projections: same parameter count)
    assert count_parameters(enc) == count_parameters(dec)
    for key in (
        "hidden_size",
        "num_hidden_layers",
        "num_attention_heads",
        "intermediate_size",
        "vocab_size",
        "pad_token_id",
        "bos_token_id",
        "eos_token_id",
    ):
        assert getattr(enc.config, key) == getattr(dec.config, key), key
    assert enc.config.layer_types == dec.config.layer_types


def test_vocabulary_must_fit_preset(tok):
    with pytest.raises(ConfigError, match="does not fit preset tiny"):
        build_model("mlm", "tiny", 10_000, tok)
    with pytest.raises(ConfigError, match="unknown"):
        build_model("clm", "huge", len(tok), tok)
