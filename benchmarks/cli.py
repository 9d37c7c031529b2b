"""The shared command line of the benchmarks: flags from a config dataclass, ``--json``, a
``check(cfg)`` before any model loads, and :func:`rag.cli.run_cli`'s exit rule.

Why a module: seven benchmarks wrote the same parser and ``main`` by hand (``evals.cli`` does
this for the evals). A benchmark gives its config class, ``check`` and a ``body(cfg, args)``
that runs, writes and prints; ``--json`` is in ``args``.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from rag.cli import run_cli
from rag.dataclass_cli import config_from_args, dataclass_parser
from rag.paths import rag_home


def bench_parser(
    prog: str,
    doc: str | None,
    cls: type,
    required: Sequence[str] = (),
    choices: dict[str, tuple[str, ...]] | None = None,
) -> argparse.ArgumentParser:
    """``python -m PROG``'s parser: one flag per field of ``cls`` plus ``--json``."""
    kw: dict[str, Any] = {"required": list(required)}
    if choices:
        kw["choices"] = choices
    parser = dataclass_parser(f"python -m {prog}", doc, cls, **kw)
    parser.add_argument("--json", action="store_true", help="print the results as JSON on stdout")
    return parser


def bench_main(
    parser: argparse.ArgumentParser,
    cls: type,
    check: Callable[[Any], None],
    body: Callable[[Any, argparse.Namespace], int | None],
    argv: list[str] | None,
) -> int:
    """Parse ``argv``, build and ``check`` the config (a ValueError naming the flag exits 2),
    then ``body(cfg, args)``; its return value (None = 0) is the exit status."""

    def run(args: argparse.Namespace) -> int:
        cfg = config_from_args(cls, args)
        check(cfg)
        return body(cfg, args) or 0

    return run_cli(parser, run, argv)


def command(prog: str, argv: list[str] | None) -> str:
    """The command line as typed, for results.json."""
    return f"python -m {prog} " + " ".join(sys.argv[1:] if argv is None else argv)


def results_dir(out: str | None, name: str) -> Path:
    """``--out``, else ``$RAG_HOME/benchmarks/NAME``; created."""
    folder = Path(out) if out else rag_home() / "benchmarks" / name
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def save_and_show(
    result: dict, folder: Path, cmd: str, as_json: bool, markdown: Callable[[dict], str]
) -> Path:
    """``result`` (with the command) as ``folder/results.json``, then printed: JSON with
    ``--json``, else the markdown table."""
    result["command"] = cmd
    path = folder / "results.json"
    path.write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2) if as_json else markdown(result))
    return path
