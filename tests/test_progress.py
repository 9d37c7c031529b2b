"""rag.cli.progress: lines at a steady interval with done/total, rate and ETA off a terminal (fake
clock, pure), a bar or nothing on one, the Trainer callback, and a real non-tty run (the
pretraining CLI in a subprocess) that prints its progress lines."""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
from types import SimpleNamespace

import pytest

from rag.cli.progress import INTERVAL_ENV, Progress, format_duration, progress_interval, track

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class Clock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def lines(stream: io.StringIO) -> list[str]:
    return stream.getvalue().splitlines()


def test_lines_come_at_the_interval_with_rate_and_eta():
    clock, out = Clock(), io.StringIO()
    p = Progress(100, "encode", "chunk", interval=10, stream=out, clock=clock)
    assert p.mode == "lines"
    clock.t += 5
    p.update(10)
    assert lines(out) == []  # not yet one interval
    clock.t += 5
    p.update(10)  # t = 10 s, 20 done
    clock.t += 4
    p.update(10)  # t = 14 s: within the interval of the last line
    clock.t += 7
    p.update(12, loss=2.5)  # t = 21 s, 42 done
    assert lines(out) == [
        "[progress] encode: 20/100 chunk (20%), 2.0 chunk/s, ETA 40s",
        "[progress] encode: 42/100 chunk (42%), 2.0 chunk/s, ETA 29s, loss 2.5",
    ]
    clock.t += 129
    p.update(58)
    p.close()
    p.close()  # once only
    assert lines(out)[-2:] == [
        "[progress] encode: 100/100 chunk (100%), 1.5 s/chunk, ETA 0s, loss 2.5",
        "[progress] encode: done, 100 chunk in 2m30s (1.5 s/chunk)",
    ]


def test_slow_steps_read_as_seconds_per_unit_and_unknown_totals_have_no_eta():
    clock, out = Clock(), io.StringIO()
    p = Progress(None, "ray chunk+embed", "step", interval=1, stream=out, clock=clock)
    clock.t += 30
    p.update(12)
    clock.t += 30
    p.update(1)
    assert lines(out) == [
        "[progress] ray chunk+embed: 12 step, 2.5 s/step",
        "[progress] ray chunk+embed: 13 step, 4.6 s/step",
    ]


def test_a_resumed_run_rates_only_its_own_steps():
    clock, out = Clock(), io.StringIO()
    p = Progress(1000, "mlm tiny", "step", interval=1, stream=out, clock=clock, initial=600)
    clock.t += 100
    p.update(100)
    assert lines(out) == ["[progress] mlm tiny: 700/1,000 step (70%), 1.0 step/s, ETA 5m00s"]


def test_short_loops_disabled_runs_and_interval_zero_stay_quiet():
    clock, out = Clock(), io.StringIO()
    with Progress(3, "qa", interval=10, stream=out, clock=clock) as p:
        clock.t += 9
        p.update(3)
    assert out.getvalue() == ""  # finished within one interval: no done line either
    for kw in ({"enabled": False}, {"interval": 0}):
        q = Progress(3, "qa", stream=out, clock=clock, **kw)
        clock.t += 100
        q.update(3)
        q.close()
        assert q.mode == "off" and out.getvalue() == ""


def test_on_a_terminal_a_bar_or_nothing():
    term = Terminal()
    with Progress(4, "load+chunk", "file", stream=term) as p:
        p.update(4)
    assert (
        p.mode == "bar" and "load+chunk" in term.getvalue() and "[progress]" not in term.getvalue()
    )
    quiet = Terminal()
    with Progress(4, "train", bar=False, interval=0.0001, stream=quiet) as q:
        q.update(4)
    assert q.mode == "off" and quiet.getvalue() == ""  # the library's own bar shows there


def test_track_yields_every_item_and_counts_them():
    clock, out = Clock(), io.StringIO()

    def items():
        for i in range(5):
            clock.t += 2
            yield i

    got = list(
        track(items(), "docqa", total=5, unit="question", interval=3, stream=out, clock=clock)
    )
    assert got == [0, 1, 2, 3, 4]
    assert lines(out)[0] == "[progress] docqa: 2/5 question (40%), 2.0 s/question, ETA 6s"
    assert lines(out)[-1] == "[progress] docqa: done, 5 question in 10s (2.0 s/question)"
    assert list(track([1, 2], "x", enabled=False)) == [1, 2]


def test_interval_from_the_environment(monkeypatch):
    monkeypatch.setenv(INTERVAL_ENV, "30")
    assert progress_interval() == 30.0 and Progress(1, "x", stream=io.StringIO()).interval == 30
    for bad in ("soon", "-1"):
        monkeypatch.setenv(INTERVAL_ENV, bad)
        assert progress_interval() == 15.0
    monkeypatch.setenv(INTERVAL_ENV, "0")
    assert Progress(1, "x", stream=io.StringIO()).mode == "off"


def test_format_duration():
    assert [format_duration(s) for s in (0, 42.4, 185, 7620)] == ["0s", "42s", "3m05s", "2h07m"]


def test_trainer_callback_reports_steps_and_the_last_loss():
    from training.finetune.recipe import progress_lines

    clock, out = Clock(), io.StringIO()
    cb = progress_lines("train minilm-reader", interval=10, stream=out, clock=clock)
    state = SimpleNamespace(is_world_process_zero=True, max_steps=50, global_step=0)
    cb.on_train_begin(None, state, None)
    for step in range(1, 51):
        clock.t += 1
        state.global_step = step
        cb.on_step_end(None, state, None)
        if step % 10 == 0:
            cb.on_log(None, state, None, logs={"loss": 1.0 / step, "learning_rate": 1e-4})
    cb.on_train_end(None, state, None)
    got = lines(out)
    assert got[0] == "[progress] train minilm-reader: 10/50 step (20%), 1.0 step/s, ETA 40s"
    assert got[1].endswith("ETA 30s, loss 0.1")  # the loss logged at step 10
    assert got[-1] == "[progress] train minilm-reader: done, 50 step in 50s (1.0 step/s)"
    other = progress_lines("x", interval=0.001, stream=out, clock=clock)
    worker = SimpleNamespace(is_world_process_zero=False, max_steps=5, global_step=0)
    other.on_train_begin(None, worker, None)
    other.on_step_end(None, worker, None)
    assert other.bar is None  # only the main process reports


@pytest.mark.slow  # a real pretraining run (~10 s on AVX2); the lines themselves are tested above
def test_a_pretraining_run_in_a_log_prints_progress_lines(tmp_path, tiny_tokenizer_dir):
    """The CLI with stderr in a pipe (not a terminal): lines, not tqdm's redraws."""
    env = {
        **os.environ,
        INTERVAL_ENV: "0.000001",
        "RAG_HOME": str(tmp_path / "home"),
        "PYTHONPATH": REPO,
    }
    cmd = [
        sys.executable, "-m", "training.pretrain", "--objective", "mlm", "--preset", "tiny",
        "--corpus", os.path.join(REPO, "tests", "fixtures", "corpus"),
        "--tokenizer", str(tiny_tokenizer_dir), "--out", str(tmp_path / "m"),
        "--max-steps", "4", "--seq-len", "32", "--batch-size", "2", "--eval-every", "0",
        "--save-every", "0", "--log-every", "2", "--threads", "1",
    ]  # fmt: skip
    run = subprocess.run(cmd, env=env, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    got = [x for x in run.stderr.splitlines() if x.startswith("[progress] mlm tiny:")]
    steps = [int(m.group(1)) for x in got if (m := re.match(r".*: (\d)/4 step \(", x))]
    assert steps == [1, 2, 3, 4], run.stderr[-2000:]
    assert all(re.search(r"step/s|s/step", x) and "ETA" in x for x in got[:4])
    assert "loss" in got[3] and got[-1].startswith("[progress] mlm tiny: done, 4 step in")
    assert "\r" not in run.stderr  # no carriage-return redraws in the log
