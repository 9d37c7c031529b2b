"""The pretraining commands as typed: ``python -m training.pretrain --objective mlm`` with no
corpus, out or tokenizer picks them (docs/, $RAG_HOME/models/..., a tokenizer trained for the
corpus and reused after), says so in its first lines, and leaves Hugging Face-loadable models."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoModelForMaskedLM

import training.tokenizer as tokenizer_mod
from training.defaults import corpus_key
from training.pretrain.config import get_preset
from training.pretrain.corpus import list_files
from training.pretrain.train import build_parser, main
from training.tokenizer import choose_tokenizer

REPO = Path(__file__).resolve().parents[1]
FIXTURE_CORPUS = REPO / "tests" / "fixtures" / "corpus"
TINY = ["--preset", "tiny", "--max-steps", "3", "--no-progress"]


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh $RAG_HOME (a fresh clone has none), the repo root as cwd, one torch thread."""
    monkeypatch.setenv("RAG_HOME", str(tmp_path / "home"))
    monkeypatch.chdir(REPO)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield tmp_path / "home"
    torch.set_num_threads(threads)


def _run(argv: list[str], capsys: pytest.CaptureFixture) -> tuple[int, list[str], str]:
    capsys.readouterr()  # drop what earlier steps printed
    rc = main(argv)
    cap = capsys.readouterr()
    return rc, cap.err.splitlines(), cap.out


def _no_missing_keys(cls, folder: Path) -> None:
    model, info = cls.from_pretrained(str(folder), output_loading_info=True)
    assert not info["missing_keys"] and not info["mismatched_keys"], info
    assert model.config.vocab_size > 0


def test_bare_runs_choose_everything_and_reuse_the_tokenizer(home, capsys, monkeypatch):
    docs = REPO / "docs"
    files = list_files([str(docs)])
    tok_dir = home / f"tokenizer-{corpus_key(files)}-{get_preset('tiny').tokenizer_vocab}"
    enc, dec = home / "models" / "encoder-mlm-tiny", home / "models" / "decoder-clm-tiny"

    rc, err, out = _run(["--objective", "mlm", *TINY], capsys)
    assert rc == 0, err
    assert err[0] == f"corpus:    {docs} (default: the project's docs/), {len(files)} files"
    assert err[1].startswith("tokenizer: training byte-level BPE (up to 8192 tokens)")
    assert err[2].startswith(f"tokenizer: trained {tok_dir} for these files")
    assert err[3] == f"out:       {enc} (default)"
    assert err[4] == "preset:    tiny (2 layers x 64), seq 128 x batch 8, peak lr 0.003"
    assert err[5].startswith("device:    ")
    assert err[6].startswith("steps:     3 ")
    assert out.strip().startswith("complete: 3 steps") and out.strip().endswith(str(enc))
    run = json.loads((enc / "run.json").read_text())["config"]
    assert run["corpus"] == [str(docs)] and run["tokenizer"] == str(tok_dir)
    _no_missing_keys(AutoModelForMaskedLM, enc)

    # the second objective reuses the corpus tokenizer: training one again would fail here
    def no_training(*a, **k):
        raise AssertionError("the tokenizer was trained again")

    monkeypatch.setattr(tokenizer_mod, "train_tokenizer", no_training)
    stamp = (tok_dir / "tokenizer.json").stat().st_mtime_ns
    rc, err, out = _run(["--objective", "clm", *TINY], capsys)
    assert rc == 0, err
    assert err[1].startswith(f"tokenizer: reused {tok_dir} (trained earlier for these files)")
    assert err[2] == f"out:       {dec} (default)"
    assert (tok_dir / "tokenizer.json").stat().st_mtime_ns == stamp
    _no_missing_keys(AutoModelForCausalLM, dec)

    # the default out is protected like any other: one line, exit 2, nothing trained
    rc, err, _ = _run(["--objective", "mlm", *TINY], capsys)
    assert rc == 2
    assert err == [
        f"training.pretrain: error: --out {enc} already holds files; pass --resume to continue "
        "or --overwrite to replace it"
    ]


def test_explicit_corpus_uses_the_shared_tokenizer(home, capsys):
    """$RAG_HOME/tokenizer (what `training.tokenizer` writes) wins over a corpus tokenizer."""
    tokenizer_mod.train_tokenizer([FIXTURE_CORPUS], 400, home / "tokenizer")
    argv = ["--objective", "clm", "--corpus", str(FIXTURE_CORPUS), *TINY, "--eval-batches", "1"]
    rc, err, _ = _run(argv, capsys)
    assert rc == 0, err
    assert err[0] == f"corpus:    {FIXTURE_CORPUS}, 5 files"
    assert err[1].startswith(f"tokenizer: reused {home / 'tokenizer'} ($RAG_HOME/tokenizer)")
    _no_missing_keys(AutoModelForCausalLM, home / "models" / "decoder-clm-tiny")
    assert not list(home.glob("tokenizer-*"))


def test_a_shared_tokenizer_too_large_for_the_preset_is_passed_over(home):
    tokenizer_mod.train_tokenizer([FIXTURE_CORPUS], 400, home / "tokenizer")
    files = list_files([str(FIXTURE_CORPUS)])
    small_vocab = replace(get_preset("tiny"), max_vocab=300)
    choice = choose_tokenizer("", files, small_vocab)
    assert choice.how == "train" and choice.path.name.startswith("tokenizer-")
    assert "passed over" in choice.note
    assert choose_tokenizer("/some/dir", files, small_vocab).how == "given"


def test_every_pretraining_flag_shows_its_default(capsys):
    for action in build_parser("x")._actions:
        if action.dest != "help":
            assert "(default:" in action.help or "(required)" in action.help, action.dest
    with pytest.raises(SystemExit):
        tokenizer_mod.main(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert text.count("(default:") == 6  # every flag but --help


def test_pretraining_compiles_on_cuda_by_default():
    """Issue 44: unset, a run compiles on CUDA only; either flag overrides it everywhere."""
    from rag.cli.flags import config_from_args
    from training.pretrain.config import PretrainConfig

    def parse(*flags: str) -> PretrainConfig:
        args = build_parser("").parse_args(["--objective", "mlm", *flags])
        return config_from_args(PretrainConfig, args)

    cfg = parse()
    assert cfg.compile is None
    assert cfg.compiles("cuda") and cfg.compiles("cuda:1") and not cfg.compiles("cpu")
    assert parse("--no-compile").compile is False and not parse("--no-compile").compiles("cuda")
    assert parse("--compile").compiles("cpu")


def test_the_loop_compiles_what_the_config_says(home, capsys, monkeypatch):
    """The training loop asks the config (a CPU run: unset does not compile, --compile does) and
    records the choice in run.json."""
    compiled = []

    def fake_compile(model, *a, **k):
        compiled.append(type(model).__name__)
        return model

    monkeypatch.setattr(torch, "compile", fake_compile)
    base = ["--objective", "clm", "--corpus", str(FIXTURE_CORPUS), *TINY, "--eval-batches", "1"]
    out = home / "runs"
    rc, err, _ = _run([*base, "--out", str(out / "a"), "--device", "cpu"], capsys)
    assert rc == 0, err
    assert compiled == [] and json.loads((out / "a" / "run.json").read_text())["compiled"] is False
    rc, err, _ = _run([*base, "--out", str(out / "b"), "--device", "cpu", "--compile"], capsys)
    assert rc == 0, err
    assert len(compiled) == 1 and json.loads((out / "b" / "run.json").read_text())["compiled"]
