"""The division-of-labour experiment: helpers, and the whole tiny preset end to end."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch
from transformers import (
    ModernBertConfig,
    ModernBertDecoderConfig,
    ModernBertDecoderForCausalLM,
    ModernBertForMaskedLM,
)

from evals.division_of_labor.cells import Cells
from evals.division_of_labor.compare import head_to_head, paired_difference, summary_chart
from evals.division_of_labor.data import subsample
from evals.division_of_labor.presets import ROW_MASK, ROW_OBJECTIVE, ROWS
from evals.division_of_labor.report import aggregate, markdown
from evals.division_of_labor.run import main
from rag.evaluation.datasets import RetrievalDataset
from training.pretrain.init_from import clm_to_mlm_state_dict, mlm_to_clm_state_dict

KW = dict(
    vocab_size=128,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=2,
    max_position_embeddings=64,
    local_attention=16,
    global_attn_every_n_layers=2,
    pad_token_id=0,
    bos_token_id=2,
    eos_token_id=3,
    cls_token_id=2,
    sep_token_id=3,
)


def test_clm_weights_convert_into_an_mlm_exactly():
    torch.manual_seed(0)
    clm = ModernBertDecoderForCausalLM(ModernBertDecoderConfig(**KW)).state_dict()
    mlm = ModernBertForMaskedLM(ModernBertConfig(**KW))
    converted = clm_to_mlm_state_dict(clm)
    mlm.load_state_dict(converted, strict=True)  # every tensor present, none extra
    attn = "model.layers.1.attn."
    qkv = torch.cat(
        [clm[attn + "q_proj.weight"], clm[attn + "k_proj.weight"], clm[attn + "v_proj.weight"]]
    )
    assert torch.equal(mlm.state_dict()[attn + "Wqkv.weight"], qkv)
    assert torch.equal(mlm.state_dict()["head.dense.weight"], clm["lm_head.dense.weight"])
    back = mlm_to_clm_state_dict(mlm.state_dict())  # and back again, bit for bit
    assert set(back) == set(clm) and all(torch.equal(back[k], clm[k]) for k in clm)


def test_cells_run_once_then_come_from_cache(tmp_path):
    cells, calls = Cells(tmp_path), []
    fn = lambda: calls.append(1) or {"x": 1.0}  # noqa: E731
    assert cells.get("bpb/a/s0", fn)["x"] == 1.0
    assert Cells(tmp_path).get("bpb/a/s0", fn)["x"] == 1.0
    assert calls == [1]
    assert set(Cells(tmp_path).all()) == {"bpb/a/s0"}


def test_aggregate_mean_and_sample_std_over_seeds():
    cells = {
        "retrieval/clm-mean/s0": {"scifact_dev": 0.2, "squad_dev": 0.5},
        "retrieval/clm-mean/s1": {"scifact_dev": 0.4, "squad_dev": 0.5},
        "bpb/clm/s0": {"wikitext_bpb": 2.0},
        "qa/x/s0": {"skipped": "no lora"},
    }
    agg = aggregate(cells)
    sf = agg["retrieval"]["clm-mean"]["scifact_dev"]
    assert (
        sf["mean"] == pytest.approx(0.3)
        and sf["std"] == pytest.approx(0.1414, abs=1e-4)
        and sf["n"] == 2
    )
    assert agg["bpb"]["clm"]["wikitext_bpb"]["std"] is None
    assert "qa" not in agg
    md = markdown(
        agg, {"config": {"preset": "tiny", "seeds": [0, 1]}, "device": "cpu", "hardware": "x"}
    )
    assert "| clm-mean | 0.300 ± 0.141 (n=2) | 0.500 ± 0.000 (n=2) |" in md


def test_paired_difference_by_seed_and_direction():
    a, b = {"s0": 0.30, "s1": 0.50, "s2": 0.20}, {"s0": 0.10, "s1": 0.20, "s2": 0.25}
    d = paired_difference(a, b, higher_is_better=True)
    assert d["per_seed"] == pytest.approx({"s0": 0.2, "s1": 0.3, "s2": -0.05})
    assert d["mean"] == pytest.approx(0.15) and d["std"] == pytest.approx(0.1803, abs=1e-4)
    assert d["first_better"] == 2 and d["n"] == 3
    lower = paired_difference({"s0": 2.0}, {"s0": 3.5, "s1": 9.0}, higher_is_better=False)
    assert lower["mean"] == pytest.approx(1.5) and lower["std"] is None and lower["n"] == 1
    assert paired_difference({"s0": 1.0}, {"s1": 1.0}, True) is None


def test_head_to_head_table_and_summary_chart(tmp_path):
    cells = {
        "retrieval/mlm15-mean/s0": {"scifact_dev": 0.4, "squad_dev": 0.5},
        "retrieval/mlm15-mean/s1": {"scifact_dev": 0.5, "squad_dev": 0.6},
        "retrieval/clm-mean/s0": {"scifact_dev": 0.2, "squad_dev": 0.3},
        "retrieval/clm-mean/s1": {"scifact_dev": 0.3, "squad_dev": 0.3},
        "retrieval/bm25/s0": {"scifact_dev": 0.7, "squad_dev": 0.8},
        "bpb/clm/s0": {"wikitext_bpb": 2.0},
        "bpb/mlm15/s0": {"wikitext_bpb": 5.0},
    }
    rows = {(r["first"], r["second"], r["metric"]): r for r in head_to_head(aggregate(cells))}
    sf = rows[("mlm15-mean", "clm-mean", "SciFact dev nDCG@10")]
    assert sf["mean"] == pytest.approx(0.2) and sf["first_better"] == 2
    assert rows[("clm", "mlm15", "WikiText-2 bits/byte")]["mean"] == pytest.approx(3.0)
    assert ("mlm40-mean", "clm-mean", "SciFact dev nDCG@10") not in rows  # no data, no row
    assert summary_chart(aggregate(cells), tmp_path) == "division_of_labor.png"
    assert (tmp_path / "division_of_labor.png").stat().st_size > 10_000
    assert summary_chart({}, tmp_path, "empty.png") is None


def test_rows_name_their_objectives_and_masks():
    from training.pretrain.config import OBJECTIVES

    assert {"mlm30", "antlm", "prefixlm"} <= set(ROWS)
    assert all(ROW_OBJECTIVE[r] in OBJECTIVES for r in ROWS)
    assert ROW_MASK["mlm30"] == (0.30, "mask-only")
    assert ROW_MASK["antlm"] == ROW_MASK["clm2mlm"]  # they differ only in the schedule


def test_decoder_folder_of_each_layout(tmp_path):
    from evals.division_of_labor.steps import decoder_folder

    enc, dec = tmp_path / "enc", tmp_path / "dec"
    ModernBertForMaskedLM(ModernBertConfig(**KW)).save_pretrained(enc)
    ModernBertDecoderForCausalLM(ModernBertDecoderConfig(**KW)).save_pretrained(dec)
    assert decoder_folder(enc) is None and decoder_folder(dec) == dec
    ModernBertDecoderForCausalLM(ModernBertDecoderConfig(**KW)).save_pretrained(enc / "decoder")
    assert decoder_folder(enc) == enc / "decoder"  # antlm / prefixlm: both layouts


def test_reading_squad_keeps_every_dev_article_and_the_split(tmp_path):
    from training_support import write_tiny_squad

    from evals.division_of_labor.data import reading_squad
    from rag.evaluation.datasets import squad_split

    full = write_tiny_squad(tmp_path / "squad.json")
    assert reading_squad(str(full), tmp_path / "r.json", 0) == str(full)
    small = reading_squad(str(full), tmp_path / "r.json", 2)
    train, dev = squad_split(small)
    assert dev == squad_split(full)[1] and len(train) == 2
    assert set(train) <= set(squad_split(full)[0])


def test_reading_column_in_the_head_to_head():
    cells = {
        "reading/mlm15/s0": {"em": 0.5, "f1": 0.6},
        "reading/mlm15/s1": {"em": 0.4, "f1": 0.5},
        "reading/clm-causal/s0": {"em": 0.1, "f1": 0.2},
        "reading/clm-causal/s1": {"em": 0.2, "f1": 0.2},
    }
    rows = {(r["first"], r["second"], r["metric"]): r for r in head_to_head(aggregate(cells))}
    f1 = rows[("mlm15", "clm-causal", "reading F1")]
    assert f1["mean"] == pytest.approx(0.35) and f1["first_better"] == 2


def test_subsample_keeps_relevant_docs():
    ds = RetrievalDataset(
        "t",
        {f"d{i}": {"title": "", "text": str(i)} for i in range(50)},
        {f"q{i}": "x" for i in range(10)},
        {f"q{i}": {f"d{i}": 1} for i in range(10)},
    )
    small = subsample(ds, 3, 8)
    assert len(small.queries) == 3 and len(small.corpus) == 8
    assert all(d in small.corpus for q in small.queries for d in small.qrels[q])


def test_columns_choose_the_cells_a_run_computes(tmp_path, monkeypatch):
    """--columns reading pretrains every row and reads it (the CLM both ways), nothing else."""
    from evals.division_of_labor import experiment as exp_mod
    from evals.division_of_labor.experiment import Experiment
    from evals.division_of_labor.presets import ExperimentConfig

    for name in ("scifact", "squad.json", "wiki.tokens"):
        (tmp_path / name).touch()
    cfg = ExperimentConfig(
        preset="tiny", out=str(tmp_path / "dol"), rows=["mlm40", "clm"], columns=["reading"],
        scifact=str(tmp_path / "scifact"), squad=str(tmp_path / "squad.json"),
        wikitext=str(tmp_path / "wiki.tokens"), device="cpu",
    )  # fmt: skip
    exp, calls = Experiment(cfg), []
    monkeypatch.setattr(exp, "pretrain", lambda row, seed: tmp_path / row)
    monkeypatch.setattr(exp_mod.steps, "decoder_folder", lambda d: None)
    monkeypatch.setattr(exp_mod.steps, "encoder_copy", lambda d, out, n: out)
    monkeypatch.setattr(exp.cells, "get", lambda name, fn: calls.append(name))
    for column in ("retrieval", "qa"):
        monkeypatch.setattr(exp, column, lambda *a, c=column, **k: calls.append(c))
    monkeypatch.setattr(exp, "reading", lambda name, d, seed: calls.append(f"reading/{name}"))
    exp.run_baselines()
    for row, seed in exp.todo():
        exp.run_pair(row, seed)
    assert calls == [
        "reading/mlm40", "done/mlm40/s0", "reading/clm-causal", "reading/clm-bidir", "done/clm/s0"
    ]  # fmt: skip
    with pytest.raises(ValueError, match="--columns: unknown column"):
        Experiment(replace(cfg, columns=["speed"]))


@pytest.mark.data
@pytest.mark.slow  # ~155 s of CPU (2-core box): over this area's share of the default suite
def test_tiny_preset_runs_whole_experiment_and_resumes(shared_data, tmp_path):
    out = tmp_path / "dol"
    # every row with code of its own (mlm30 and mlm40 are mlm15 with other mask settings)
    rows = ["mlm15", "clm", "clm2mlm", "antlm", "prefixlm"]
    args = ["--preset", "tiny", "--out", str(out), "--no-baselines", "--threads", "2"]
    args += ["--rows", *rows]
    assert main(args) == 0
    results = json.loads((out / "results.json").read_text())
    summary = results["summary"]
    assert set(summary["bpb"]) == set(rows)
    assert {f"{r}-mean" for r in rows} | {"clm-last", "bm25"} <= set(summary["retrieval"])
    for model in summary["retrieval"].values():
        assert 0.0 <= model["scifact_dev"]["mean"] <= 1.0
    for model in summary["bpb"].values():
        assert 0.5 < model["wikitext_bpb"]["mean"] < 20  # a barely trained model: a few bits/byte
    assert {"clm-lora", "antlm-lora", "prefixlm-lora"} <= set(summary.get("qa", {})) or any(
        k.startswith("qa/") for k in results["skipped"]
    )
    readers = {r for r in rows if r != "clm"} | {"clm-causal", "clm-bidir"}
    assert set(summary["reading"]) == readers  # every row reads, the CLM both ways
    for model in summary["reading"].values():
        assert 0.0 <= model["em"]["mean"] <= model["f1"]["mean"] <= 1.0
    cells = results["cells"]
    assert cells["bpb/antlm/s0"]["objective"] == "clm"  # scored through its decoder layout
    assert cells["bpb/mlm15/s0"]["objective"] == "mlm"
    assert cells["pretrain/prefixlm/s0"]["final_heldout_clm_loss"] > 0
    assert (out / "results.md").read_text().count("| mlm15") >= 3
    assert (out / "retrieval_scifact_dev.png").exists() and (out / "pretrain_loss.png").exists()
    assert (out / "division_of_labor.png").exists()
    assert "| mlm15-mean vs clm-mean | SciFact dev nDCG@10 |" in (out / "results.md").read_text()
    # A second run finds every cell cached and recomputes nothing.
    before = {p.name: p.stat().st_mtime_ns for p in (out / "cells").iterdir()}
    assert main(args) == 0
    assert {p.name: p.stat().st_mtime_ns for p in (out / "cells").iterdir()} == before


def test_base_preset_reads_the_debian_corpus_about_twice(tmp_path, monkeypatch):
    """Issue 44: the base preset pretrains on the Debian documentation corpus beside the shared
    one (found in the shared data, where the GPU pack unpacks it, or in $RAG_HOME), with a
    budget of at most two passes over the ~43M training tokens measured for it; without the
    corpus the error says how to build it."""
    from evals.division_of_labor.data import default_corpus
    from evals.division_of_labor.presets import PRESETS

    data, home = tmp_path / "data", tmp_path / "home"
    monkeypatch.setenv("RAG_HOME", str(home))
    with pytest.raises(FileNotFoundError, match="training.data.debian_corpus"):
        default_corpus("base", data)
    assert default_corpus("small", data) == [str(data / "python-docs")]
    (home / "corpus-debian").mkdir(parents=True)
    (home / "corpus-debian" / "MANIFEST.json").write_text("{}")
    assert default_corpus("base", data)[0] == str(home / "corpus-debian")
    (data / "corpus-debian").mkdir(parents=True)
    (data / "corpus-debian" / "MANIFEST.json").write_text("{}")
    base = default_corpus("base", data)
    assert base == [str(data / d) for d in ("corpus-debian", "corpus", "python-docs")]
    p = PRESETS["base"]
    assert p.pretrain_steps * p.batch_size * p.seq_len <= 2 * 43e6


def _experiment(tmp_path, **kw):
    from evals.division_of_labor.experiment import Experiment
    from evals.division_of_labor.presets import ExperimentConfig

    for name in ("scifact", "squad.json", "wiki.tokens"):
        (tmp_path / name).touch()
    cfg = ExperimentConfig(
        preset="tiny", out=str(tmp_path / "dol"), scifact=str(tmp_path / "scifact"),
        squad=str(tmp_path / "squad.json"), wikitext=str(tmp_path / "wiki.tokens"),
        device="cpu", **kw,
    )  # fmt: skip
    return Experiment(cfg)


def test_a_pair_whose_weights_stayed_on_another_machine_is_pretrained_again(tmp_path, monkeypatch):
    """Issue 44: cells come back from the GPU machine, its weights do not. A pretraining cell
    whose folder is missing here is run again (its row's other cells need the weights); one
    whose folder is here is not; a finished pair (its done cell) is not run at all."""
    from evals.division_of_labor import experiment as exp_mod

    exp, runs = _experiment(tmp_path, rows=["mlm15", "clm"], seeds=[0, 1]), []
    monkeypatch.setattr(exp_mod.steps, "train_tokenizer", lambda *a: tmp_path / "tok")

    def fake_pretrain(objective, out, **kw):
        runs.append(out.name)
        out.mkdir(parents=True, exist_ok=True)
        return {"steps": 1, "tokens_seen": 8, "wall_time_s": 0.1}

    monkeypatch.setattr(exp_mod.steps, "pretrain", fake_pretrain)
    exp.cells.get("pretrain/mlm15/s0", lambda: {"dir": str(tmp_path / "elsewhere")})
    assert exp.pretrain("mlm15", 0) == exp.out / "models" / "mlm15-s0"
    assert runs == ["mlm15-s0"]
    assert exp.pretrain("mlm15", 0) == exp.out / "models" / "mlm15-s0"  # here now: cached
    assert runs == ["mlm15-s0"]
    exp.cells.get("done/clm/s0", lambda: {})
    assert exp.todo() == [("mlm15", 0), ("mlm15", 1), ("clm", 1)]


def test_the_report_says_which_pairs_are_left_and_a_failed_worker_fails_the_run(
    tmp_path, monkeypatch
):
    exp = _experiment(tmp_path, rows=["mlm15", "clm"], jobs=2, baselines=False, columns=["qa"])
    monkeypatch.setattr(exp, "shared", lambda: None)
    monkeypatch.setattr(exp, "run_baselines", lambda: None)
    started = []

    def one_fails(todo):
        started.extend(todo)
        exp.cells.get("done/mlm15/s0", lambda: {})  # the other worker finished
        return ["clm/s0"]

    monkeypatch.setattr(exp, "run_parallel", one_fails)
    with pytest.raises(RuntimeError, match=r"1 of 2 workers failed \(clm/s0\)"):
        exp.run()
    assert started == [("mlm15", 0), ("clm", 0)]
    md = (exp.out / "results.md").read_text()
    assert "## Rows and seeds not finished" in md and "- `clm/s0`" in md
    assert "mlm15/s0" not in md.split("not finished")[1]


@pytest.mark.data
def test_pairs_run_as_parallel_workers_and_resume(shared_data, tmp_path, capsys):
    """--jobs 2: the tokenizer once here, each (row, seed) in a worker process of its own, its
    output in logs/ and prefixed on stderr; the report of both; a second run starts no worker."""
    out = tmp_path / "dol"
    args = ["--preset", "tiny", "--out", str(out), "--rows", "mlm15", "clm", "--columns"]
    args += ["generation", "--no-baselines", "--threads", "1", "--jobs", "2"]
    assert main(args) == 0
    err = capsys.readouterr().err
    assert "[clm/s0] ended, exit 0" in err and "[mlm15/s0] [bpb/mlm15/s0] done" in err
    results = json.loads((out / "results.json").read_text())
    assert set(results["summary"]["bpb"]) == {"mlm15", "clm"} and results["left"] == []
    assert "[bpb/clm/s0] done" in (out / "logs" / "clm-s0.log").read_text()
    assert len(list((out / "tokenizer").glob("tokenizer.json"))) == 1
    before = {p.name: p.stat().st_mtime_ns for p in (out / "cells").iterdir()}
    assert main(args) == 0
    assert "started" not in capsys.readouterr().err
    assert {p.name: p.stat().st_mtime_ns for p in (out / "cells").iterdir()} == before


def test_the_shared_tokenizer_is_renamed_into_place_and_a_race_loses_quietly(tmp_path, monkeypatch):
    """Two processes that start together (one per seed) both train the shared tokenizer: each
    in a folder of its own, the first rename wins, the second's copy goes; neither ever reads
    a half-written folder, and no scratch folder is left."""
    import training.tokenizer
    from evals.division_of_labor import steps

    out = tmp_path / "tokenizer"

    def fake_train(corpus, vocab_size, out):
        out.mkdir(parents=True)
        (out / "tokenizer.json").write_text(json.dumps({"by": out.name}))

    monkeypatch.setattr(training.tokenizer, "train_tokenizer", fake_train)
    assert steps.train_tokenizer(["c"], 64, out) == out
    first = (out / "tokenizer.json").read_text()
    assert json.loads(first)["by"].startswith(".tokenizer-")  # trained aside, then renamed

    def loses_the_race(corpus, vocab_size, out):
        fake_train(corpus, vocab_size, out)
        (tmp_path / "tokenizer").mkdir(exist_ok=True)  # the other process got there first
        (tmp_path / "tokenizer" / "tokenizer.json").write_text('{"by": "other"}')

    (out / "tokenizer.json").unlink()
    monkeypatch.setattr(training.tokenizer, "train_tokenizer", loses_the_race)
    assert steps.train_tokenizer(["c"], 64, out) == out
    assert json.loads((out / "tokenizer.json").read_text()) == {"by": "other"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tokenizer"]
