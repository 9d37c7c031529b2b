"""rag.cli.flags, the one dataclass -> argparse builder: its conventions on a small config."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

import pytest

from rag.cli.flags import (
    add_dataclass_args,
    config_argv,
    config_from_args,
    dataclass_parser,
    field_help,
)


@dataclass
class Demo:
    """A config with one field of each kind the builder knows."""

    paths: list[str]  # positional: no default
    name: str = "x"  # a plain string
    count: int = 3  # an int, 100% of the time
    # a comment block above the field is its help
    ratio: float | None = 0.5
    wrapped: str | None = None  # a field the formatter wrapped over three lines keeps its comment
    flag: bool = True  # on by default
    tags: list[str] = field(default_factory=lambda: ["a"])  # several values
    mode: str = "fast"  # one of MODES
    device: str = "auto"  # gets rag.defaults.DEVICES without saying so
    hook: object = None  # not a scalar: no flag

    CHOICES: ClassVar[dict[str, tuple[str, ...]]] = {"mode": ("fast", "slow")}


def test_comments_become_help():
    helps = field_help(Demo)
    assert helps["ratio"] == "a comment block above the field is its help"
    assert helps["wrapped"].startswith("a field the formatter wrapped")
    assert helps["count"] == "an int, 100% of the time"


@dataclass
class Child(Demo):
    extra: int = 1  # the child's own field
    count: int = 4  # redeclared: the child's comment wins


def test_inherited_fields_keep_their_parents_help():
    helps = field_help(Child)  # walks Child.__mro__, base first
    assert helps["ratio"] == "a comment block above the field is its help"
    assert helps["extra"] == "the child's own field"
    assert helps["count"] == "redeclared: the child's comment wins"


def test_flags_follow_the_conventions(capsys):
    p = dataclass_parser("python -m demo", "Demo.\n\nMore.", Demo)
    cfg = config_from_args(Demo, p.parse_args(["d1", "d2"]))
    assert cfg == Demo(paths=["d1", "d2"])
    argv = ["d", "--no-flag", "--ratio", "none", "--tags", "b", "c", "--tags", "d", "--count", "7"]
    cfg = config_from_args(Demo, p.parse_args(argv))
    assert (cfg.flag, cfg.ratio, cfg.tags, cfg.count) == (False, None, ["b", "c", "d"], 7)
    assert Demo(paths=[]).tags == ["a"]  # the default list was not extended in place
    text = " ".join(p.format_help().split())
    for shown in ("(default: 3)", "(default: on)", "(default: a)", "(default: none)", "100%"):
        assert shown in text
    assert "--hook" not in text and "{fast,slow}" in text and "{auto,cpu,cuda}" in text
    for bad in (["d", "--mode", "medium"], ["d", "--device", "tpu"], ["d", "--count", "x"]):
        with pytest.raises(SystemExit) as e:
            p.parse_args(bad)
        assert e.value.code == 2
        err = capsys.readouterr().err
        assert err.startswith("demo: error: argument --") and err.count("\n") == 1


def test_config_argv_gives_the_config_back():
    """A child process started with config_argv(cfg) parses the parent's config exactly
    (evals.division_of_labor --jobs): every kind of field, None, False, a list, positionals."""
    parser = dataclass_parser("demo", "", Demo)
    for cfg in (
        Demo(paths=["a b", "c"]),
        Demo(["p"], name="", count=-2, ratio=None, wrapped="w", flag=False, tags=["x", "y"]),
        Demo(["p"], mode="slow", device="cpu", tags=[]),  # an empty list: the default back
    ):
        back = config_from_args(Demo, parser.parse_args(config_argv(cfg)))
        assert back == (cfg if cfg.tags else Demo(["p"], mode="slow", device="cpu"))
    assert "--hook" not in config_argv(Demo(["p"]))  # no flag, not passed


def test_layered_required_defaults_and_shown():
    import argparse

    p = argparse.ArgumentParser()
    add_dataclass_args(p, Demo, only=("name", "count"), layered=True)
    assert vars(p.parse_args([])) == {}  # not given: the file's value (or the default) stays
    p = dataclass_parser(
        "demo", "", Demo, exclude=("paths",), required=("name",), defaults={"count": 9},
        shown={"mode": "chosen at run time"},
    )  # fmt: skip
    text = " ".join(p.format_help().split())
    assert (
        "(required)" in text and "(default: 9)" in text and "(default: chosen at run time)" in text
    )
    ns = p.parse_args(["--name", "n"])
    assert config_from_args(Demo, ns, {"paths": []}).count == 9


@dataclass
class Job:
    """A config command's config: what run_config_cli parses."""

    n: int = 2  # how many
    fail: str = ""  # raise this kind of error while running: value | runtime


def _job(cfg: Job) -> dict:
    print("library chatter")  # a Trainer's own print: stderr under logs_to_stderr
    if cfg.fail == "value":
        raise ValueError("--fail value: refused")
    if cfg.fail == "runtime":
        raise RuntimeError("no GPU")
    return {"n": cfg.n}


def _check(cfg: Job) -> None:
    if cfg.n < 1:
        raise ValueError(f"--n must be >= 1, not {cfg.n}")


def _run_job(argv: list[str], **kwargs) -> int:
    from rag.cli.flags import config_parser, run_config_cli

    parser = config_parser("python -m demo", "Demo job.", Job, out_file=True)
    return run_config_cli(parser, Job, _job, argv, check=_check, **kwargs)


def test_config_command_writes_result_report_and_note(tmp_path, capsys):
    """One main for training, evals, benchmarks: --json on stdout (nothing else there), the report
    instead without it, the note on stderr either way, --out FILE.json, the run's prints kept
    off stdout with logs_to_stderr."""
    import json

    out = tmp_path / "sub" / "r.json"
    shown = {"report": lambda r: f"n = {r['n']}", "note": lambda c, r: f"note {c.n}"}
    assert _run_job(["--n", "3", "--json", "--out", str(out)], **shown, logs_to_stderr=True) == 0
    cap = capsys.readouterr()
    assert json.loads(cap.out) == {"n": 3} and json.loads(out.read_text()) == {"n": 3}
    assert "library chatter" in cap.err and cap.err.rstrip().endswith("note 3")
    assert _run_job(["--n", "4"], **shown) == 0
    cap = capsys.readouterr()
    assert cap.out == "library chatter\nn = 4\n" and cap.err == "note 4\n"


@pytest.mark.parametrize(
    "argv,code,line",
    [
        (["--n", "0"], 2, "demo: error: --n must be >= 1, not 0"),  # check(), before the run
        (["--fail", "value"], 2, "demo: error: --fail value: refused"),
        (["--fail", "runtime"], 1, "demo: error: no GPU"),
    ],
)
def test_config_command_exit_codes(argv, code, line, capsys):
    assert _run_job(argv, logs_to_stderr=True) == code
    cap = capsys.readouterr()
    assert cap.out == "" and cap.err.strip().splitlines()[-1] == line
