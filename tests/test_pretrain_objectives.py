"""The objectives between MLM and CLM (training.pretrain.objectives): AntLM-style alternation and
prefix-LM on the encoder layout: who sees whom, which positions carry a loss, the schedule, and
the two layouts a run saves."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from training_support import tiny_pretrain_config
from transformers import AutoModelForCausalLM, AutoModelForMaskedLM, AutoTokenizer

from training.pretrain.config import ConfigError, PretrainConfig
from training.pretrain.masking import IGNORE, make_spec
from training.pretrain.model import build_model, convert_model
from training.pretrain.objectives import antlm_kind, attention_masks, next_token_labels
from training.pretrain.step import Stepper
from training.pretrain.train import PretrainError, main, pretrain

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def tok(tiny_tokenizer_dir):
    return AutoTokenizer.from_pretrained(str(tiny_tokenizer_dir))


def _ids(tok, batch: int, seq_len: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(5, len(tok), (batch, seq_len), generator=g)


def _hidden(model, ids, masks=None) -> torch.Tensor:
    with torch.no_grad():
        return model.model(input_ids=ids, attention_mask=masks).last_hidden_state


# ---------------------------------------------------------------------------- masks


def test_prefix_mask_prefix_sees_prefix_suffix_sees_its_past():
    full = attention_masks(torch.tensor([3, 1]), 6, half_window=100)["full_attention"]
    assert full.shape == (2, 1, 6, 6)
    m = full[0, 0].int().tolist()
    assert m[:3] == [[1, 1, 1, 0, 0, 0]] * 3  # each prefix position: the whole prefix, no more
    assert m[3] == [1, 1, 1, 1, 0, 0] and m[5] == [1] * 6  # suffix: prefix + its own past
    assert full[1, 0, 0].int().tolist() == [1, 0, 0, 0, 0, 0]  # a split per sequence
    sliding = attention_masks(4, 8, half_window=1)["sliding_attention"][0, 0].int()
    assert sliding[1].tolist() == [1, 1, 1, 0, 0, 0, 0, 0]  # prefix: |q - k| <= 1 inside it
    assert sliding[3].tolist() == [0, 0, 1, 1, 0, 0, 0, 0]  # never past the prefix
    assert sliding[6].tolist() == [0, 0, 0, 0, 0, 0, 1, 0]  # suffix: q - k < 1 (the decoder's)
    additive = attention_masks(4, 8, 1, additive_dtype=torch.float32)["sliding_attention"]
    assert additive[0, 0, 1, 1] == 0 and additive[0, 0, 1, 4] == torch.finfo(torch.float32).min


def test_prefix_lm_model_dependencies(tok):
    """On the tiny encoder itself: changing a prefix token changes every position, before it
    too (bidirectional prefix); changing a suffix token changes no earlier position."""
    torch.manual_seed(0)
    model = build_model("prefixlm", "tiny", len(tok), tok).eval()
    T, L = 100, 40  # T beyond the sliding window (64): the local layers are in play
    ids = _ids(tok, 1, T)
    masks = attention_masks(L, T, model.config.local_attention // 2)
    base = _hidden(model, ids, masks)

    def changed_at(pos: int) -> torch.Tensor:
        other = ids.clone()
        other[0, pos] = 5 + (other[0, pos] - 4) % (len(tok) - 5)
        diff = (_hidden(model, other, masks) - base).abs().amax(-1)[0]
        return diff > 1e-5

    in_prefix = changed_at(30)
    assert in_prefix[:30].any() and in_prefix[L:].any()  # seen before and after it
    assert in_prefix[:L].all()  # global layers: every prefix position sees the whole prefix
    in_suffix = changed_at(70)
    assert not in_suffix[:70].any() and in_suffix[70]  # only its own future
    first_suffix = changed_at(L)
    assert not first_suffix[:L].any()  # the prefix never sees the suffix


@pytest.mark.parametrize("impl", ["sdpa", "eager"])
def test_masks_at_the_ends_are_the_encoders_and_the_decoders_own(tok, impl):
    """Prefix = everything is exactly the encoder's mask; prefix = nothing is exactly the
    decoder's: the encoder layout's CLM steps train the network the exported decoder runs."""
    torch.manual_seed(0)
    enc = build_model("antlm", "tiny", len(tok), tok, attn_implementation=impl).eval()
    enc.sparse_prediction = False
    T, half = 100, enc.config.local_attention // 2
    ids = _ids(tok, 2, T)
    additive = torch.float32 if impl == "eager" else None
    bidir = attention_masks(T, T, half, additive_dtype=additive)
    assert torch.allclose(_hidden(enc, ids, bidir), _hidden(enc, ids), atol=1e-5)
    causal = attention_masks(0, T, half, additive_dtype=additive)
    dec = convert_model(enc, "clm").eval()
    with torch.no_grad():
        theirs = dec(input_ids=ids).logits
        ours = enc(input_ids=ids, attention_mask=causal).logits
    assert torch.allclose(ours, theirs, atol=1e-4)


# ---------------------------------------------------------------------------- schedule, losses


def test_antlm_schedule_switches_as_configured_and_ends_on_mlm():
    assert [antlm_kind(s, 6, 1) for s in range(6)] == ["clm", "mlm"] * 3
    assert [antlm_kind(s, 5, 1) for s in range(5)] == ["mlm", "clm", "mlm", "clm", "mlm"]
    blocks = [antlm_kind(s, 10, 3) for s in range(10)]  # counted back from the last step
    assert blocks == ["clm"] + ["mlm"] * 3 + ["clm"] * 3 + ["mlm"] * 3
    assert antlm_kind(9, 10, 100) == "mlm" and antlm_kind(0, 10, 100) == "mlm"
    with pytest.raises(ValueError):
        antlm_kind(0, 10, 0)


def test_next_token_labels_cover_only_the_targets():
    ids = torch.arange(10, 20).view(1, 10).repeat(2, 1)
    labels = next_token_labels(ids, torch.tensor([1, 4]))
    assert labels[0].tolist() == list(range(11, 20)) + [IGNORE]  # full CLM
    assert labels[1].tolist() == [IGNORE] * 3 + list(range(14, 20)) + [IGNORE]  # the suffix


def test_stepper_antlm_steps_follow_the_schedule_and_supervise_their_positions(tok):
    torch.manual_seed(0)
    model = build_model("antlm", "tiny", len(tok), tok).train()
    stepper = Stepper(model, "antlm", "cpu", make_spec(tok), 0.15, max_steps=4, alternate_every=1)
    ids = _ids(tok, 2, 32)
    kinds = [stepper.kind_at(s) for s in range(4)]
    assert kinds == ["clm", "mlm", "clm", "mlm"]
    clm_inputs, clm_labels = stepper.prepare(ids, 0)
    assert torch.equal(clm_inputs["input_ids"], ids)
    assert not clm_inputs["attention_mask"]["full_attention"][0, 0].triu(1).any()  # causal
    assert torch.equal(clm_labels, next_token_labels(ids, 1))
    mlm_inputs, mlm_labels = stepper.prepare(ids, 1)
    assert isinstance(mlm_inputs, torch.Tensor)  # a plain MLM step: the model's own masks
    supervised = mlm_labels != IGNORE
    assert 0 < supervised.float().mean() < 0.4
    assert torch.equal(mlm_labels[supervised], ids[supervised])
    assert torch.equal(mlm_inputs[~supervised], ids[~supervised])
    # the CLM step's loss is the decoder's own next-token loss on the same weights
    model.eval()
    dec = convert_model(model, "clm").eval()
    with torch.no_grad():
        ours = stepper.loss(clm_inputs, clm_labels)
        theirs = dec(input_ids=ids, labels=ids).loss
    assert float(ours) == pytest.approx(float(theirs), rel=1e-4)


def test_stepper_prefixlm_loss_is_on_the_suffix_only(tok):
    torch.manual_seed(0)
    model = build_model("prefixlm", "tiny", len(tok), tok).eval()
    model.sparse_prediction = False
    stepper = Stepper(model, "prefixlm", "cpu", seed=3)
    ids = _ids(tok, 4, 32)
    inputs, labels = stepper.prepare(ids, 7)
    full = inputs["attention_mask"]["full_attention"][:, 0]
    prefix = full[:, 0].sum(-1)  # what position 0 sees: the prefix
    assert len(set(prefix.tolist())) > 1  # sampled per sequence
    assert ((prefix >= 1) & (prefix <= 31)).all()
    for b, L in enumerate(prefix.tolist()):
        assert torch.equal(labels[b], next_token_labels(ids[b : b + 1], L)[0])
        assert (labels[b, : L - 1] == IGNORE).all() and (labels[b, L - 1 : -1] != IGNORE).all()
    again, _ = stepper.prepare(ids, 7)  # seeded by (seed, step): a resume draws the same split
    assert torch.equal(
        again["attention_mask"]["full_attention"], inputs["attention_mask"]["full_attention"]
    )
    with torch.no_grad():
        logits = model(**inputs).logits
        loss = stepper.loss(inputs, labels)
    keep = labels != IGNORE
    by_hand = torch.nn.functional.cross_entropy(logits[keep], labels[keep])
    assert float(loss) == pytest.approx(float(by_hand), rel=1e-5)


# ---------------------------------------------------------------------------- runs and layouts


def _cfg(tmp_path: Path, tokenizer_dir: Path, objective: str, **kw) -> PretrainConfig:
    six_steps = {"max_steps": 6, "eval_every": 0, "save_every": 0, **kw}
    return tiny_pretrain_config(tmp_path / objective, tokenizer_dir, objective, **six_steps)


@pytest.mark.parametrize("objective", ["antlm", "prefixlm"])
def test_run_saves_encoder_and_decoder_layouts_that_load(objective, tmp_path, tiny_tokenizer_dir):
    from sentence_transformers import SentenceTransformer

    cfg = _cfg(tmp_path, tiny_tokenizer_dir, objective, alternate_every=2)
    summary = pretrain(cfg, progress=False)
    out = Path(cfg.out)
    assert summary["layouts"] == {"encoder": str(out), "decoder": str(out / "decoder")}
    enc, info = AutoModelForMaskedLM.from_pretrained(str(out), output_loading_info=True)
    assert not info["missing_keys"] and not info["mismatched_keys"]
    ckpt = torch.load(out / "checkpoint" / "state.pt", weights_only=False)["model"]
    assert all(torch.equal(enc.state_dict()[k], v) for k, v in ckpt.items())  # trained weights
    dec, info = AutoModelForCausalLM.from_pretrained(str(out / "decoder"), output_loading_info=True)
    assert not info["missing_keys"] and not info["mismatched_keys"]
    ids = _ids(AutoTokenizer.from_pretrained(str(out)), 2, 24)
    causal = attention_masks(0, 24, enc.config.local_attention // 2)
    enc.eval(), dec.eval()
    with torch.no_grad():
        assert torch.allclose(
            dec(input_ids=ids).logits, enc(input_ids=ids, attention_mask=causal).logits, atol=1e-4
        )
    dec_tok = AutoTokenizer.from_pretrained(str(out / "decoder"))
    assert dec_tok("x").input_ids[-1] != dec_tok.eos_token_id  # the decoder's tokenizer
    assert SentenceTransformer(str(out), device="cpu").encode(["a b"]).shape == (1, 64)
    assert summary["heldout_clm_bits_per_byte"] > 0 and summary["final_heldout_clm_loss"] > 0
    rows = [json.loads(x) for x in (out / "train_log.jsonl").read_text().splitlines()]
    if objective == "antlm":  # blocks of 2 from the end of 6 steps: M M | C C | M M
        logged = {r["step"]: r for r in rows if "loss" in r}
        assert set(logged[2]) >= {"loss_mlm"} and "loss_clm" not in logged[2]
        assert "loss_clm" in logged[4] and "loss_mlm" not in logged[4]
        assert "loss_mlm" in logged[6]
    with pytest.raises(PretrainError, match="--alternate-every"):  # part of the run's identity
        pretrain(replace(cfg, resume=True, alternate_every=3), progress=False)


def test_cli_objectives_and_bad_values(tmp_path, tiny_tokenizer_dir, capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "antlm" in text and "prefixlm" in text and "--alternate-every" in text
    with pytest.raises(ConfigError, match="--alternate-every must be >= 1"):
        pretrain(_cfg(tmp_path, tiny_tokenizer_dir, "antlm", alternate_every=0), progress=False)
    with pytest.raises(SystemExit) as exit_:
        main(["--objective", "ulm", "--preset", "tiny"])
    err = capsys.readouterr().err.splitlines()
    assert exit_.value.code == 2 and len(err) == 1 and "'antlm', 'prefixlm'" in err[0]
