"""What the benchmarks' command lines share besides :func:`rag.cli.flags.run_config_cli`
(the one ``main`` of every config command: flags, ``--json``, ``check(cfg)`` before any model
loads, the exit rule): the command as typed, the results folder, and ``results.json``.

A benchmark's ``main`` is ``run_config_cli(build_parser(), Config, run, argv, check=check,
report=markdown)``; its ``run`` measures, writes and returns the result that ``--json`` prints.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from rag.storage.paths import rag_home


def command(prog: str, argv: list[str] | None) -> str:
    """The command line as typed, for results.json."""
    return f"python -m {prog} " + " ".join(sys.argv[1:] if argv is None else argv)


def results_dir(out: str | None, name: str) -> Path:
    """``--out``, else ``$RAG_HOME/benchmarks/NAME``; created."""
    folder = Path(out) if out else rag_home() / "benchmarks" / name
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def save_result(result: dict, folder: Path, cmd: str) -> Path:
    """``result`` (with the command) as ``folder/results.json``; returns that path."""
    result["command"] = cmd
    path = folder / "results.json"
    path.write_text(json.dumps(result, indent=2))
    return path
