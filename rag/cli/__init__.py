"""What every command line shares.

- :mod:`rag.cli.run`: the parser (:class:`OneLineParser`), the run wrapper (:func:`run_cli`), the
  one-line errors and the exit-code rule;
- :mod:`rag.cli.flags`: a config dataclass → argparse flags, and the ``main`` of every config
  command (:func:`rag.cli.flags.run_config_cli`);
- :mod:`rag.cli.progress`: progress of long loops (a bar on a terminal, lines elsewhere).

:mod:`rag.cli.run`'s names are re-exported here, so ``from rag.cli import run_cli`` reads as
before; importing this package stays light (no torch).
"""

from __future__ import annotations

from rag.cli.run import (
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_TERMINATED,
    EXIT_USAGE,
    MAX_MESSAGE,
    RUNTIME_ERRORS,
    USAGE_ERRORS,
    DefaultsFormatter,
    OneLineParser,
    Terminated,
    add_index_args,
    exit_code,
    fail,
    one_line,
    quiet_libraries,
    run_cli,
    says_default,
    short_prog,
    show_default,
    sigterm_exits,
    undecodable_argument,
)

__all__ = [
    "EXIT_FAILED",
    "EXIT_INTERRUPTED",
    "EXIT_OK",
    "EXIT_TERMINATED",
    "EXIT_USAGE",
    "MAX_MESSAGE",
    "RUNTIME_ERRORS",
    "USAGE_ERRORS",
    "DefaultsFormatter",
    "OneLineParser",
    "Terminated",
    "add_index_args",
    "exit_code",
    "fail",
    "one_line",
    "quiet_libraries",
    "run_cli",
    "says_default",
    "short_prog",
    "show_default",
    "sigterm_exits",
    "undecodable_argument",
]
