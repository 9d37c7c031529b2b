"""The shared fine-tune recipe (training/finetune/recipe.py): the three fine-tunes name the training
loop's settings once (same fields, same flags, each with its help text), and a run's set-up
writes its folder, log and run.json the same way whichever Trainer it drives."""

from __future__ import annotations

import dataclasses
import json

import pytest

from training.finetune.contrastive import ContrastiveConfig
from training.finetune.lora import LoraTrainConfig
from training.finetune.recipe import FinetuneConfig, finetune_run
from training.finetune.rerank import RerankConfig

CONFIGS = [ContrastiveConfig, LoraTrainConfig, RerankConfig]
SHARED = [f.name for f in dataclasses.fields(FinetuneConfig)]


@pytest.mark.parametrize("cls", CONFIGS, ids=lambda c: c.__name__)
def test_configs_inherit_the_shared_settings(cls):
    assert issubclass(cls, FinetuneConfig)
    assert [f.name for f in dataclasses.fields(cls)][: len(SHARED)] == SHARED
    assert {"lr", "max_steps", "warmup_ratio", "seed", "device", "threads"} <= set(SHARED)


@pytest.mark.parametrize(
    "module",
    ["training.finetune.contrastive", "training.finetune.lora", "training.finetune.rerank"],
    ids=str,
)
def test_every_flag_has_its_help_inherited_ones_too(module, capsys):
    import importlib

    main = importlib.import_module(module).main
    with pytest.raises(SystemExit) as e:
        main(["--help"])
    assert e.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    for flag, words in [("--seed", "seed for"), ("--threads", "torch CPU threads")]:
        assert f"{flag} {flag.upper()[2:]} {words}" in text, flag
    assert "--lr LR peak learning rate" in text


def test_run_writes_folder_log_and_run_json(tmp_path):
    """A fake Trainer: the run's own bookkeeping, without a model."""

    class Output:
        global_step, training_loss = 3, 0.123456

    class FakeTrainer:
        def __init__(self, model, args, train_dataset, callbacks, **kw):
            self.args, self.kw = args, kw
            self.callbacks = callbacks

        def train(self):
            class State:
                global_step, epoch = 1, 0.5

            self.callbacks[0].on_log(self.args, State(), None, logs={"loss": 2.0})
            (tmp_path / "out" / "checkpoints").mkdir(exist_ok=True)  # as the Trainer does
            return Output()

    cfg = FinetuneConfig(model="m", out=str(tmp_path / "out"), device="cpu", threads=1)
    with finetune_run(cfg, "kind") as run:
        args = run.training_args(dict, extra=1)  # any callable takes the keywords
        assert args["learning_rate"] == cfg.lr and args["warmup_steps"] == cfg.warmup_ratio
        assert args["use_cpu"] and args["extra"] == 1 and args["save_strategy"] == "no"
        run.event(event="eval_before", dev=0.5)
        run.train(FakeTrainer, args, model=None, train_dataset=[], loss="l")
        summary = run.finish("title", {"n": 7})
    out = tmp_path / "out"
    assert not (out / "checkpoints").exists()
    rows = [json.loads(x) for x in (out / "train_log.jsonl").read_text().splitlines()]
    assert rows[0] == {"event": "eval_before", "dev": 0.5} and rows[1]["loss"] == 2.0
    saved = json.loads((out / "run.json").read_text())
    assert saved == summary and saved["n"] == 7 and saved["steps"] == 3
    assert saved["train_loss"] == 0.1235 and saved["config"]["model"] == "m"
    assert (out / "loss.png").exists()


def test_default_out_is_named_after_the_model_and_the_fine_tune(tmp_path, monkeypatch):
    monkeypatch.setenv("RAG_HOME", str(tmp_path))
    with finetune_run(FinetuneConfig(model="some/dir/enc", device="cpu"), "rerank") as run:
        assert run.out == tmp_path / "models" / "enc-rerank"
        assert (run.out / "train_log.jsonl").read_text() == ""


def test_one_precision_vocabulary_and_int8_refused_in_one_line(capsys, monkeypatch):
    """The fine-tunes that choose a precision (the reader's bf16 autocast, the LoRA base
    weights) say it in rag.models.precision's words; int8 stops before anything loads."""
    import training.finetune.recipe as recipe
    from training.finetune import lora, reader

    monkeypatch.setattr(recipe, "resolve_precision", lambda p, device: {"auto": "bf16"}.get(p, p))
    assert recipe.training_precision("auto", "cuda") == "bf16"
    assert [recipe.training_precision(p, "cpu") for p in ("fp32", "bf16")] == ["fp32", "bf16"]
    with pytest.raises(ValueError, match="^--precision must be one of auto, fp32, bf16, int8"):
        recipe.check_training_precision("fp16")
    for module, data in ((reader, "--squad"), (lora, "--data")):
        with pytest.raises(SystemExit):
            module.main(["--help"])
        assert "--precision {auto,fp32,bf16,int8}" in capsys.readouterr().out
        assert module.main(["--precision", "int8", data, "missing.json"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "--precision int8 is for inference only" in err[0], err
