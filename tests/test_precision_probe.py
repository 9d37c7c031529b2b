"""The encoder's precision ``auto`` (rag.models.precision): bf16 only where a short probe, cached per
machine, measured it faster. The decision logic with an injected timer (pure), the cache, the
choice by device, and ingest's report of what auto chose."""

from __future__ import annotations

import json

import pytest

from rag.models import precision as P


class FakeRun:
    """A workload whose calls cost ``cost[precision]`` seconds on a fake clock."""

    def __init__(self, cost: dict[str, float]):
        self.cost, self.t, self.calls = cost, 0.0, []

    def timer(self) -> float:
        return self.t

    def __call__(self, precision: str) -> None:
        self.calls.append(precision)
        self.t += self.cost[precision]


def test_times_are_medians_after_a_warm_up_in_alternating_order():
    run = FakeRun({"fp32": 1.0, "bf16": 0.4})
    seconds = P.time_precisions(run, repeats=3, timer=run.timer)
    assert seconds == pytest.approx({"fp32": 1.0, "bf16": 0.4})
    assert run.calls == ["fp32", "bf16"] + ["fp32", "bf16"] * 3


def test_bf16_only_when_clearly_faster():
    assert P.choose_by_speed({"fp32": 1.0, "bf16": 0.5}) == "bf16"
    assert P.choose_by_speed({"fp32": 1.0, "bf16": 0.9}) == "bf16"  # 1.11x
    assert P.choose_by_speed({"fp32": 1.0, "bf16": 0.95}) == "fp32"  # a small win: not worth it
    assert P.choose_by_speed({"fp32": 1.0, "bf16": 1.0}) == "fp32"
    assert P.choose_by_speed({"fp32": 1.0, "bf16": 3.0}) == "fp32"  # emulated bf16
    assert P.choose_by_speed({"fp32": 1.0, "bf16": 0.95}, min_speedup=1.0) == "bf16"


KEY = {"format": 1, "cpu": "Test CPU", "bf16_units": ["avx512_bf16"], "threads": 2}


def test_the_probe_runs_once_per_machine_and_is_cached(tmp_path):
    slow = FakeRun({"fp32": 1.0, "bf16": 2.5})
    first = P.bf16_probe(slow, slow.timer, key=KEY, folder=tmp_path)
    assert first["choice"] == "fp32" and first["speedup"] == 0.4 and not first["cached"]
    again = P.bf16_probe(FakeRun({"fp32": 1.0, "bf16": 0.1}), key=KEY, folder=tmp_path)
    assert again["choice"] == "fp32" and again["cached"]  # measured once, not again
    fast = FakeRun({"fp32": 1.0, "bf16": 0.3})
    other = P.bf16_probe(fast, fast.timer, key={**KEY, "threads": 16}, folder=tmp_path)
    assert other["choice"] == "bf16" and fast.calls  # another machine (or thread count)
    (path,) = [
        p for p in tmp_path.glob("bf16-probe-*.json") if json.loads(p.read_text())["key"] == KEY
    ]
    path.write_text("{broken")
    redo = FakeRun({"fp32": 1.0, "bf16": 0.5})
    assert P.bf16_probe(redo, redo.timer, key=KEY, folder=tmp_path)["choice"] == "bf16"
    assert redo.calls and not list(tmp_path.glob(".*"))  # re-measured; no temporary file left


def test_auto_by_device_and_cpu(monkeypatch):
    probed = []

    def probe():
        probed.append(1)
        return {"choice": "bf16", "speedup": 1.8}

    assert P.encoder_auto_precision("cuda", probe) == ("bf16", "CUDA")
    monkeypatch.setattr(P, "cpu_has_bf16", lambda: False)
    assert P.encoder_auto_precision("cpu", probe)[0] == "fp32" and not probed
    monkeypatch.setattr(P, "cpu_has_bf16", lambda: True)
    choice, why = P.encoder_auto_precision("cpu", probe)
    assert choice == "bf16" and "1.8x" in why and probed


def test_the_real_probe_measures_this_machine(tmp_path):
    run = P.encoder_layer_workload(tokens=16, batch=2)
    r = P.bf16_probe(run, key=P.probe_key(), folder=tmp_path)
    assert r["choice"] in ("fp32", "bf16") and r["seconds"]["fp32"] > 0 and r["seconds"]["bf16"] > 0
    assert r["choice"] == P.choose_by_speed(r["seconds"])


@pytest.fixture
def probe_says(monkeypatch):
    """Make the encoder's auto return ``(choice, reason)`` without measuring."""

    def set_(choice: str):
        import rag.retrieval.encoder as E

        reason = f"probe on this CPU: bf16 {'2.0' if choice == 'bf16' else '0.6'}x fp32's speed"
        monkeypatch.setattr(E, "encoder_auto_precision", lambda device: (choice, reason))

    return set_


def test_ingest_with_precision_auto_runs_and_reports_the_choice(tmp_path, tiny_mlm_dir, probe_says):
    from ingest_support import write_docs

    from rag.ingest import ingest
    from rag.storage.manifest import open_generation

    probe_says("fp32")
    docs = write_docs(tmp_path / "docs")
    report = ingest([docs], index="auto-prec", encoder=str(tiny_mlm_dir), device="cpu",
                    precision="auto", progress=False)  # fmt: skip
    note = [n for n in report.notes if n.startswith("--precision auto")]
    assert note == ["--precision auto: encoder in fp32 (probe on this CPU: bf16 0.6x fp32's speed)"]
    _, _, manifest = open_generation("auto-prec")
    assert manifest.encoder["precision"] == "fp32"
    again = ingest([docs], index="auto-prec", precision="auto", progress=False)
    assert not [n for n in again.notes if n.startswith("--precision")]  # nothing was encoded


def test_retrieval_eval_records_the_precision_that_ran(tmp_path, probe_says, tiny_mlm_dir):
    from test_evals_retrieval import write_mini_beir

    from evals.retrieval import RetrievalEvalConfig, evaluate

    probe_says("fp32")
    beir = write_mini_beir(tmp_path / "mini")
    cfg = RetrievalEvalConfig(
        dataset=str(beir), retriever="dense", encoder=str(tiny_mlm_dir), precision="auto",
        device="cpu", embedding_cache=False,
    )  # fmt: skip
    out = evaluate(cfg)
    assert out["encoder_precision"]["ran"] == "fp32"
    assert out["encoder_precision"]["auto_reason"].startswith("probe on this CPU")
    assert out["config"]["precision"] == "auto"


def test_the_library_default_is_auto(tiny_mlm_dir, probe_says):
    """Encoder.load without a precision takes auto, as every config does: the probe's choice;
    a model object wrapped as it is keeps its weights (fp32, no cast)."""
    from rag.retrieval.encoder import Encoder

    for choice in ("bf16", "fp32"):
        probe_says(choice)
        enc = Encoder.load(tiny_mlm_dir, device="cpu")
        assert enc.precision == choice and enc.auto_reason.startswith("probe on this CPU")
    assert Encoder.wrap(enc.model).precision == "fp32"
