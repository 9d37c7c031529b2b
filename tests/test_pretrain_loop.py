"""The pretraining loop: outputs, resume equality, learning, and clear errors on bad input."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from training_support import tiny_pretrain_config
from transformers import AutoTokenizer

import training.pretrain.train as pretrain_mod
from training.pretrain.config import ConfigError, PretrainConfig
from training.pretrain.corpus import CorpusError
from training.pretrain.masking import make_spec
from training.pretrain.model import build_model
from training.pretrain.step import Stepper, make_optimizer, make_scheduler
from training.pretrain.train import PretrainError, main, pretrain

CORPUS = Path(__file__).parent / "fixtures" / "corpus"


@pytest.fixture(autouse=True)
def _one_thread():
    """One torch thread: on a CPU shared with other jobs this is several times faster."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _cfg(tmp_path: Path, tokenizer_dir: Path, objective: str = "mlm", **kw) -> PretrainConfig:
    return tiny_pretrain_config(tmp_path / "run", tokenizer_dir, objective, **kw)


def test_fixture_runs_learn_and_write_outputs(tiny_mlm_dir, tiny_clm_dir):
    for folder in (tiny_mlm_dir, tiny_clm_dir):
        run = json.loads((folder / "run.json").read_text())
        assert run["final_heldout_loss"] < run["initial_heldout_loss"]
        assert run["heldout_bits_per_byte"] > 0 and run["tokens_seen"] == 40 * 8 * 64
        assert run["config"]["seq_len"] == 64
        rows = [json.loads(x) for x in (folder / "train_log.jsonl").read_text().splitlines()]
        train_rows = [r for r in rows if "loss" in r]
        assert {"step", "tokens", "loss", "lr", "tokens_per_s"} <= set(train_rows[0])
        assert any("heldout_loss" in r for r in rows)
        assert (folder / "loss.png").stat().st_size > 1000


class _Interrupted(Exception):
    pass


@pytest.mark.parametrize("objective", ["mlm"])  # mlm: the case with per-step random masks
def test_resume_matches_uninterrupted(objective, tmp_path, tiny_tokenizer_dir, monkeypatch):
    full = pretrain(_cfg(tmp_path / "a", tiny_tokenizer_dir, objective), progress=False)

    class Crashing(Stepper):  # dies inside step 8: the last checkpoint is the one at step 4
        calls = 0

        def step(self, *a, **k):
            Crashing.calls += 1
            if Crashing.calls == 8:
                raise _Interrupted
            return super().step(*a, **k)

    cfg = _cfg(tmp_path / "b", tiny_tokenizer_dir, objective)
    with monkeypatch.context() as m:
        m.setattr(pretrain_mod, "Stepper", Crashing)
        with pytest.raises(_Interrupted):
            pretrain(cfg, progress=False)
    saved = torch.load(Path(cfg.out) / "checkpoint" / "state.pt", weights_only=False)
    assert saved["progress"]["step"] == 4
    resumed = pretrain(replace(cfg, resume=True), progress=False)
    assert resumed["steps"] == full["steps"] == 12
    assert resumed["tokens_seen"] == full["tokens_seen"]
    assert resumed["final_heldout_loss"] == pytest.approx(full["final_heldout_loss"], rel=1e-5)
    a = load_file(str(tmp_path / "a" / "run" / "model.safetensors"))
    b = load_file(str(tmp_path / "b" / "run" / "model.safetensors"))
    for k in a:
        assert torch.allclose(a[k], b[k], atol=1e-6), k
    steps = [
        json.loads(x)["step"] for x in (Path(cfg.out) / "train_log.jsonl").read_text().splitlines()
    ]
    assert steps == sorted(steps)  # lines logged after the checkpoint were dropped, not duplicated


@pytest.mark.parametrize("objective", ["mlm", "clm"])
def test_overfits_one_batch(objective, tiny_tokenizer_dir):
    torch.manual_seed(0)
    tok = AutoTokenizer.from_pretrained(str(tiny_tokenizer_dir))
    model = build_model(objective, "tiny", len(tok), tok).train()
    opt = make_optimizer(model, 3e-3, 0.0, "cpu")
    sched = make_scheduler(opt, 1, 1000, 1.0)
    stepper = Stepper(model, objective, "cpu", make_spec(tok), mask_rate=0.3)
    ids = torch.randint(5, len(tok), (4, 32))
    inputs, labels = stepper.prepare(ids, 0)  # same masks every step
    with torch.no_grad():
        first = float(stepper.loss(inputs, labels))
    for _ in range(40):
        stepper.step(inputs, labels, opt, sched)
    with torch.no_grad():
        assert float(stepper.loss(inputs, labels)) < 0.5 * first


def test_bad_inputs(tmp_path, tiny_tokenizer_dir):
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(CorpusError, match="no .txt/.md/.rst/.html"):
        pretrain(_cfg(tmp_path, tiny_tokenizer_dir, corpus=[str(empty)]), progress=False)
    with pytest.raises(CorpusError, match="no such file"):
        pretrain(
            _cfg(tmp_path, tiny_tokenizer_dir, corpus=[str(tmp_path / "nope")]), progress=False
        )
    with pytest.raises(ConfigError, match="--preset 'giant' is unknown"):
        pretrain(_cfg(tmp_path, tiny_tokenizer_dir, preset="giant"), progress=False)
    for rate in (0.0, 1.0, 1.5):
        with pytest.raises(ConfigError, match="--mask-rate"):
            pretrain(_cfg(tmp_path, tiny_tokenizer_dir, mask_rate=rate), progress=False)
    with pytest.raises(Exception, match="no tokenizer.json"):
        pretrain(_cfg(tmp_path, tmp_path / "no-tokenizer"), progress=False)
    with pytest.raises(PretrainError, match="no checkpoint"):
        pretrain(_cfg(tmp_path, tiny_tokenizer_dir, resume=True), progress=False)


def test_out_holding_a_run_is_protected(tmp_path, tiny_tokenizer_dir, capsys):
    cfg = _cfg(tmp_path, tiny_tokenizer_dir, max_steps=2, eval_every=0, save_every=0)
    pretrain(cfg, progress=False)
    with pytest.raises(PretrainError, match="already holds files"):
        pretrain(cfg, progress=False)
    again = pretrain(replace(cfg, overwrite=True), progress=False)  # --overwrite replaces it
    assert again["status"] == "complete"
    other = tmp_path / "precious"
    other.mkdir()
    (other / "notes.txt").write_text("mine")
    with pytest.raises(PretrainError, match="does not look like a pretraining run"):
        pretrain(replace(cfg, out=str(other), overwrite=True), progress=False)
    assert (other / "notes.txt").exists()
    capsys.readouterr()
    # the CLI turns errors into one line and exit code 2
    argv = [
        "--objective",
        "mlm",
        "--corpus",
        str(CORPUS),
        "--out",
        cfg.out,
        "--tokenizer",
        cfg.tokenizer,
        "--preset",
        "tiny",
        "--mask-rate",
        "1.2",
    ]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["training.pretrain: error: --mask-rate must be in (0, 1), got 1.2"]


def test_init_from_starts_from_the_converted_weights(tmp_path, tiny_tokenizer_dir, tiny_clm_dir):
    """CLM -> MLM (two-stage): with a vanishing learning rate the MLM run ends where it started,
    on the decoder's weights in the encoder's layout."""
    from training.pretrain.init_from import clm_to_mlm_state_dict

    cfg = _cfg(
        tmp_path, tiny_tokenizer_dir, "mlm", max_steps=1, lr=1e-12, init_from=str(tiny_clm_dir)
    )
    summary = pretrain(cfg, progress=False)
    assert summary["config"]["init_from"] == str(tiny_clm_dir)
    clm = load_file(str(tiny_clm_dir / "model.safetensors"))
    mlm = load_file(str(Path(cfg.out) / "model.safetensors"))
    expected = clm_to_mlm_state_dict(clm)
    for k in mlm:
        assert torch.allclose(mlm[k], expected[k], atol=1e-6), k
    scratch = pretrain(
        _cfg(tmp_path / "s", tiny_tokenizer_dir, "mlm", max_steps=1, lr=1e-12), False
    )
    assert summary["initial_heldout_loss"] < scratch["initial_heldout_loss"]  # trained start


def test_init_from_a_model_of_another_size_is_refused(tmp_path, tiny_tokenizer_dir, tiny_clm_dir):
    with pytest.raises(ConfigError, match="--init-from .* does not fit this mlm model"):
        pretrain(
            _cfg(tmp_path, tiny_tokenizer_dir, preset="small", init_from=str(tiny_clm_dir)),
            progress=False,
        )
    with pytest.raises(ConfigError, match="--init-from .*: no such folder"):
        pretrain(_cfg(tmp_path, tiny_tokenizer_dir, init_from=str(tmp_path / "nope")), False)
