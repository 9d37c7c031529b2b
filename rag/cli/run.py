"""What every command line of the project shares: the parser, the run wrapper, the exit codes.

One exit-code rule for ``rag.*``, ``training.*``, ``evals.*`` and ``ui.app``:

- **0**: done.
- **2**: the command cannot run as given: a bad flag or value (argparse), a bad config file or
  setting (``ValueError``: ConfigError, IndexNameError, EncoderMismatchError, ...), a name that
  resolves to nothing (``LookupError``: ModelNotFoundError, ...), a path that cannot be read or
  written (``OSError``: IndexNotFoundError, ...), a missing optional extra (``ImportError``).
  Changing the command (or installing the extra) fixes it.
- **1**: the command ran and failed: a ``RuntimeError`` (no GPU behind ``--device cuda``, a loss
  that became NaN), anything unexpected, or a partial failure a command reports itself (an
  ingest where some files failed).
- **130** / **143**: interrupted (Ctrl-C) / terminated (SIGTERM, for the commands that clean up
  on it: :func:`sigterm_exits`).

An argument that is not valid UTF-8 (a shell's ``$'\\xff'``, a file name in another encoding)
is refused before parsing, naming it (exit 2): Python would hold its bytes as lone surrogates,
which every later print, tokenizer or JSON write fails on.

Either way the failure is one line on stderr, ``PROG: error: <reason naming the flag or value>``,
never argparse's usage block and never a traceback, so scripts and people see the one thing to
fix (``RAG_DEBUG=1`` re-raises, for developers). ``--help`` shows every flag's default.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NoReturn

from rag.storage.paths import printable

# Errors that say the command as given cannot run (exit 2); their messages are written for the
# user. RuntimeError is the usual runtime failure (exit 1), also written for the user; anything
# else is a bug or a library's surprise: still one line, with its type so it can be reported.
USAGE_ERRORS: tuple[type[BaseException], ...] = (ValueError, LookupError, OSError, ImportError)
RUNTIME_ERRORS: tuple[type[BaseException], ...] = (RuntimeError,)
EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
EXIT_INTERRUPTED, EXIT_TERMINATED = 130, 143  # 128 + SIGINT, 128 + SIGTERM, as shells report
MAX_MESSAGE = 600  # library messages (transformers' OSError) can be paragraphs long


def quiet_libraries() -> None:
    """Keep model loading off stderr: transformers' per-load "Loading weights" bars and load
    reports would otherwise stand beside (or before) the one failure line, e.g. when a loaded
    encoder then turns out not to match the index. Environment defaults only, read when
    transformers is first imported; a user's own setting wins."""
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")


def one_line(text: str) -> str:
    """``text`` with every run of whitespace (newlines included) collapsed, other control
    characters escaped (a file name in a message, :func:`rag.storage.paths.printable`), and capped."""
    flat = printable(" ".join(str(text).split()))
    return flat if len(flat) <= MAX_MESSAGE else flat[: MAX_MESSAGE - 1] + "…"


def short_prog(prog: str) -> str:
    return prog.removeprefix("python -m ")


def show_default(value: Any) -> str:
    """A default as ``--help`` prints it: none, on/off, space-separated lists, 0.3 not 0.30."""
    if value is None or value == "" or value == []:
        return "none"
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, list | tuple):
        return " ".join(show_default(v) for v in value)
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def says_default(help_text: str | None) -> bool:
    """Whether a flag's help already states its default (or that it is required)."""
    text = (help_text or "").lower()
    return "(default" in text or "(required" in text


class DefaultsFormatter(argparse.HelpFormatter):
    """Every optional flag's help ends in ``(default: X)`` unless it says so itself; flags built
    by :mod:`rag.cli.flags` already do, this covers the hand-written ones (``--json``)."""

    def _format_action(self, action: argparse.Action) -> str:
        if action.help is None and action.option_strings:  # argparse skips empty help
            action = copy.copy(action)
            action.help = ""
            action.help = self._get_help_string(action)
        return super()._format_action(action)

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if (
            action.option_strings
            and action.help is not argparse.SUPPRESS
            and action.default is not argparse.SUPPRESS
            and not isinstance(action, argparse._HelpAction | argparse._VersionAction)
            and not says_default(text)
        ):
            shown = show_default(action.default).replace("%", "%%")
            text = f"{text} (default: {shown})".strip()
        return text


class OneLineParser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line, ``PROG: error: ...`` and exit status 2
    (``--help`` still shows the usage), and whose help shows every default."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", DefaultsFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{short_prog(self.prog)}: error: {one_line(message)}\n")


def exit_code(exc: BaseException) -> int:
    """2 when ``exc`` says the command cannot run as given, else 1 (see the module docstring)."""
    return EXIT_USAGE if isinstance(exc, USAGE_ERRORS) else EXIT_FAILED


def fail(prog: str, exc: BaseException) -> int:
    """Print ``exc`` as the CLI's one failure line and return its exit status (:func:`exit_code`).

    Call it inside an ``except`` block: with ``RAG_DEBUG`` set the exception is re-raised so
    the traceback is there when a developer wants it."""
    if os.environ.get("RAG_DEBUG"):
        raise exc
    msg = one_line(str(exc)) or type(exc).__name__
    if not isinstance(exc, USAGE_ERRORS + RUNTIME_ERRORS):
        msg = f"unexpected {type(exc).__name__}: {msg} (RAG_DEBUG=1 shows the traceback)"
    print(f"{short_prog(prog)}: error: {msg}", file=sys.stderr)
    return exit_code(exc)


class Terminated(BaseException):
    """SIGTERM, raised in the main thread inside :func:`sigterm_exits`. A BaseException, like
    KeyboardInterrupt, so ``except Exception`` handlers let it through to the clean-ups."""


@contextlib.contextmanager
def sigterm_exits() -> Iterator[None]:
    """Inside, SIGTERM raises :class:`Terminated` instead of ending the process on the spot
    (Python's default action runs no ``finally`` and no ``except BaseException``), so the
    command's clean-ups run: ``rag.ingest`` removes the index folder a first run created, and
    :func:`run_cli` ends with one line and exit status 143. The previous handler comes back on
    leaving. Outside the main thread (signals cannot be handled there) it does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def terminate(signum: int, frame: Any) -> None:
        raise Terminated(signal.Signals(signum).name)

    previous = signal.signal(signal.SIGTERM, terminate)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def undecodable_argument(argv: Sequence[str]) -> str | None:
    """What is wrong with the first argument that is not valid UTF-8, naming it (its position,
    the flag it follows or belongs to, its bytes escaped), or None when every one is."""
    for i, arg in enumerate(argv, start=1):
        try:
            arg.encode("utf-8")
        except UnicodeEncodeError:
            flag, eq, _ = arg.partition("=")
            where = f" (of {flag})" if arg.startswith("-") and eq else ""
            if not where and i > 1 and argv[i - 2].startswith("-"):
                where = f" (after {argv[i - 2]})"
            return (
                f"argument {i}{where} is not valid UTF-8: '{printable(arg)}'; "
                "give text, names and paths in UTF-8"
            )
    return None


def run_cli(
    parser: argparse.ArgumentParser,
    body: Callable[[argparse.Namespace], int | None],
    argv: list[str] | None = None,
    *,
    quiet: bool = False,
) -> int:
    """The one ``main`` of every CLI: refuse an argument that is not UTF-8 and parse ``argv``
    (a bad flag exits 2 with one line, as argparse does), run ``body(args)`` and return its
    status (None = 0); an exception becomes the one failure line and exit 2 or 1 by
    :func:`exit_code`, an interrupt 130 and a SIGTERM (:func:`sigterm_exits`) 143. ``quiet``
    keeps model-loading chatter off stderr (:func:`quiet_libraries`) for the commands whose
    stderr is their report."""
    prog = short_prog(parser.prog)
    bad = undecodable_argument(sys.argv[1:] if argv is None else argv)
    if bad is not None:
        print(f"{prog}: error: {bad}", file=sys.stderr)
        return EXIT_USAGE
    args = parser.parse_args(argv)
    if quiet:
        quiet_libraries()
    try:
        code = body(args)
    except Exception as e:  # noqa: BLE001 - every failure is one line with its exit status
        return fail(parser.prog, e)
    except KeyboardInterrupt:
        print(f"{prog}: error: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Terminated:
        print(f"{prog}: error: terminated (SIGTERM); stopped cleanly", file=sys.stderr)
        return EXIT_TERMINATED
    return EXIT_OK if code is None else int(code)


def add_index_args(parser: argparse.ArgumentParser) -> None:
    """``--index NAME`` (under $RAG_HOME/indexes) or ``--index-dir PATH``, never both."""
    where = parser.add_mutually_exclusive_group()
    where.add_argument(
        "--index",
        default="default",
        help="index name under $RAG_HOME/indexes (default: %(default)s)",
    )
    where.add_argument(
        "--index-dir",
        default=None,
        metavar="PATH",
        help="an index folder elsewhere, instead of --index (default: none)",
    )
