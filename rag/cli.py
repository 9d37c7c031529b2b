"""What the ``rag.ingest`` / ``rag.search`` / ``rag.ask`` command lines share: one-line failures.

Every failure of these CLIs is one line on stderr, ``rag.NAME: error: <reason naming the
value>``, and exit status 2; never argparse's usage block, never a traceback. Scripts and the
people running them then see the one thing to fix (``RAG_DEBUG=1`` re-raises, for developers).
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import NoReturn

# Errors whose message is written for the user (ConfigError, IndexNameError, IndexNotFoundError,
# EncoderMismatchError, ModelNotFoundError, OSError from a bad path, ...). Anything else is a
# bug or a library's surprise: still one line, but with its type so it can be reported.
EXPECTED_ERRORS: tuple[type[BaseException], ...] = (ValueError, LookupError, OSError, RuntimeError)
MAX_MESSAGE = 600  # library messages (transformers' OSError) can be paragraphs long


def quiet_libraries() -> None:
    """Keep model loading off stderr: transformers' per-load "Loading weights" bars and load
    reports would otherwise stand beside (or before) the one failure line, e.g. when a loaded
    encoder then turns out not to match the index. Environment defaults only, read when
    transformers is first imported; a user's own setting wins."""
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")


def one_line(text: str) -> str:
    """``text`` with every run of whitespace (newlines included) collapsed, and capped."""
    flat = " ".join(str(text).split())
    return flat if len(flat) <= MAX_MESSAGE else flat[: MAX_MESSAGE - 1] + "…"


def short_prog(prog: str) -> str:
    return prog.removeprefix("python -m ")


class OneLineParser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line (``--help`` still shows the usage)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{short_prog(self.prog)}: error: {one_line(message)}\n")


def fail(prog: str, exc: BaseException) -> int:
    """Print ``exc`` as the CLI's one failure line and return exit status 2.

    Call it inside an ``except`` block: with ``RAG_DEBUG`` set the exception is re-raised so
    the traceback is there when a developer wants it."""
    if os.environ.get("RAG_DEBUG"):
        raise exc
    msg = one_line(str(exc)) or type(exc).__name__
    if not isinstance(exc, EXPECTED_ERRORS):
        msg = f"unexpected {type(exc).__name__}: {msg} (RAG_DEBUG=1 shows the traceback)"
    print(f"{short_prog(prog)}: error: {msg}", file=sys.stderr)
    return 2


def add_index_args(parser: argparse.ArgumentParser) -> None:
    """``--index NAME`` (under $RAG_HOME/indexes) or ``--index-dir PATH``, never both."""
    where = parser.add_mutually_exclusive_group()
    where.add_argument(
        "--index",
        default="default",
        help="index name under $RAG_HOME/indexes; default: %(default)s",
    )
    where.add_argument(
        "--index-dir", default=None, metavar="PATH", help="an index folder elsewhere"
    )
