"""The shared ``main`` of the eval CLIs (``evals.lm``, ``evals.qa``).

Flags come from the config dataclass (``rag.dataclass_cli``: one kebab-case flag per field,
its comment as help), plus ``--out FILE.json`` and ``--json``. Expected failures (a missing
file, a bad value) exit 1 with one line naming the problem; the result JSON holds every setting.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from rag.dataclass_cli import config_from_args, dataclass_parser

T = TypeVar("T")
EXPECTED_ERRORS = (OSError, ValueError, LookupError, RuntimeError, ImportError)


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
    line on stderr. ``required`` names fields that must be given (their flags are in the error)."""
    parser = dataclass_parser(prog, doc, cls)
    parser.add_argument("--out", help="also write the result JSON to this file")
    parser.add_argument("--json", action="store_true", help="print the result JSON on stdout")
    ns = parser.parse_args(argv)
    if missing := ["--" + n.replace("_", "-") for n in required if not getattr(ns, n)]:
        parser.error(f"the following arguments are required: {', '.join(missing)}")
    cfg = config_from_args(cls, ns)
    try:
        result = evaluate(cfg)
    except EXPECTED_ERRORS as e:
        print(f"{prog.removeprefix('python -m ')}: error: {e}", file=sys.stderr)
        return 1
    write_result(result, ns.out, ns.json)
    print(summary(cfg, result), file=sys.stderr)
    return 0


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
