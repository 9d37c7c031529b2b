"""The shared ``main`` of the fine-tuning CLIs (``training.contrastive``, ``training.lora``,
``training.rerank``): flags from the config dataclass (:mod:`rag.dataclass_cli`) plus ``--json``.
"""

from __future__ import annotations

import json
import typing
from collections.abc import Callable

from rag.dataclass_cli import config_from_args, dataclass_parser

T = typing.TypeVar("T")


def run_training_cli(
    prog: str,
    doc: str,
    cls: type[T],
    train: Callable[[T], dict],
    report: Callable[[dict], None],
    argv: list[str] | None = None,
) -> int:
    """The shared ``main`` of the fine-tuning CLIs: flags from the config dataclass plus
    ``--json``; logs and the Trainer's own prints go to stderr, so stdout holds only the summary
    (JSON with ``--json``, else ``report(summary)``). Expected failures exit 2 with one line."""
    import contextlib
    import logging
    import sys

    parser = dataclass_parser(prog, doc, cls)
    parser.add_argument(
        "--json", action="store_true", help="print the run summary as JSON on stdout"
    )
    ns = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(name)s: %(message)s"
    )
    cfg = config_from_args(cls, ns)
    try:
        with contextlib.redirect_stdout(sys.stderr):
            summary = train(cfg)
    except (ValueError, OSError, LookupError, RuntimeError) as e:
        print(f"{prog.removeprefix('python -m ')}: error: {e}", file=sys.stderr)
        return 2
    if ns.json:
        print(json.dumps(summary, indent=2))
    else:
        report(summary)
    return 0
