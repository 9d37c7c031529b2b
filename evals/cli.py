"""The shared ``main`` of the eval CLIs (``evals.lm``, ``evals.qa``, ``evals.docqa``,
``evals.injection``).

Flags come from the config dataclass (``rag.dataclass_cli``: one kebab-case flag per field,
its comment as help, its default shown), plus ``--out FILE.json`` and ``--json``; the run goes
through :func:`rag.cli.run_cli`, so the exit codes are every CLI's: 2 for a bad flag, value or
missing file (one line naming it), 1 for a failure while evaluating. The result JSON holds every
setting.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from rag.cli import run_cli
from rag.dataclass_cli import config_from_args, dataclass_parser

T = TypeVar("T")


def add_output_args(parser: argparse.ArgumentParser) -> None:
    """``--out FILE.json`` and ``--json``, the same in every eval."""
    parser.add_argument("--out", help="also write the result JSON to this file (default: none)")
    parser.add_argument("--json", action="store_true", help="print the result JSON on stdout")


def run_eval_cli(
    prog: str,
    doc: str,
    cls: type[T],
    evaluate: Callable[[T], dict],
    summary: Callable[[T, dict], str],
    argv: list[str] | None = None,
    required: Sequence[str] = (),
) -> int:
    """Parse ``argv`` into ``cls``, run ``evaluate``, write/print the result JSON and a summary
    line on stderr. ``required`` names fields that must be given (argparse names their flags)."""
    parser = dataclass_parser(prog, doc, cls, required=required)
    add_output_args(parser)

    def body(args: argparse.Namespace) -> int:
        cfg = config_from_args(cls, args)
        result = evaluate(cfg)
        write_result(result, args.out, args.json)
        print(summary(cfg, result), file=sys.stderr)
        return 0

    return run_cli(parser, body, argv)


def write_result(result: Any, out: str | None, to_stdout: bool) -> None:
    """The result JSON into ``out`` (parents created) and/or on stdout."""
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(json.dumps(result, indent=2) + "\n")
    if to_stdout:
        print(json.dumps(result, indent=2))


def rag_config(cfg: Any, **overrides: Any) -> Any:
    """The :class:`rag.config.RAGConfig` an eval runs the pipeline with: every field the eval's
    config shares by name with RAGConfig (decoder, adapter, mode, k, device, ...) plus
    ``overrides``; the rest keep RAGConfig's defaults."""
    from dataclasses import fields

    from rag.config import RAGConfig

    shared = {f.name: getattr(cfg, f.name) for f in fields(RAGConfig) if hasattr(cfg, f.name)}
    return RAGConfig(**{**shared, **overrides})
