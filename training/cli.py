"""The shared ``main`` of the fine-tuning CLIs (``training.contrastive``, ``training.lora``,
``training.rerank``): flags from the config dataclass (:mod:`rag.dataclass_cli`) plus ``--json``,
run through :func:`rag.cli.run_cli`, so the exit codes are every CLI's (0 ok, 2 a bad flag,
value or path, 1 a failure while training) and a failure is one line.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import sys
import typing
from collections.abc import Callable

from rag.cli import run_cli
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
    """Parse ``argv`` into ``cls`` and run ``train``. Logs and the Trainer's own prints go to
    stderr, so stdout holds only the summary (JSON with ``--json``, else ``report(summary)``)."""
    parser = dataclass_parser(prog, doc, cls)
    parser.add_argument(
        "--json", action="store_true", help="print the run summary as JSON on stdout"
    )

    def body(args: argparse.Namespace) -> int:
        logging.basicConfig(
            level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(name)s: %(message)s"
        )
        with contextlib.redirect_stdout(sys.stderr):
            summary = train(config_from_args(cls, args))
        if args.json:
            print(json.dumps(summary, indent=2))
        else:
            report(summary)
        return 0

    return run_cli(parser, body, argv)
