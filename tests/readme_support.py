"""The README's command lines, as data (for tests/test_readme_commands.py), and a driver that
parses many of them in one process.

:func:`readme_commands` reads every ``python -m MODULE ...`` (and ``torchrun ... -m MODULE``)
line of the README's ``bash`` blocks: continuation lines joined, trailing comments dropped,
shell variables of the same block (``C="..."``) expanded, ``NAME=value`` prefixes kept as
environment. A bare ``...`` stands for arguments the README leaves out: after a flag it is a
placeholder value, anywhere else it is dropped and the command is marked ``elided`` (a required
flag may then be missing without the README being wrong).

Run as a script (``python tests/readme_support.py OUT.json`` with a JSON list of
``[module, args]`` on stdin), it runs each module as ``python -m`` would, with
``ArgumentParser.parse_args`` patched to stop right after a successful parse: a flag the README
names that the parser lacks, a wrong value type or choice, or a missing required argument fails
exactly as the command line would, and nothing after the parse (loading models, training) runs.
One process for all lines, because importing the packages dominates the cost.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
ELIDED = "\x00elided\x00"  # a bare `...` in the README, before shlex splits the line


@dataclass(frozen=True)
class Command:
    """One documented command line."""

    text: str  # as written: continuation lines joined, comment dropped, spaces collapsed
    module: str
    args: tuple[str, ...]
    env: dict[str, str] = field(default_factory=dict)
    elided: bool = False  # the README writes `...` for arguments it leaves out


def _logical_lines(block: str) -> list[str]:
    out: list[str] = []
    pending = ""
    for line in block.splitlines():
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        out.append(pending + line)
        pending = ""
    if pending:
        out.append(pending)
    return out


def _expand(line: str, variables: dict[str, str]) -> str:
    return re.sub(
        r"\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?", lambda m: variables.get(m.group(1), m.group(0)), line
    )


def parse_line(line: str, variables: dict[str, str]) -> Command | None:
    """The command of one logical shell line, or None when it runs no Python module."""
    marked = re.sub(r"(?<![^\s])\.\.\.(?![^\s])", ELIDED, _expand(line, variables))
    try:
        tokens = shlex.split(marked, comments=True)
    except ValueError:
        return None
    env: dict[str, str] = {}
    while tokens and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", tokens[0]):
        name, _, value = tokens.pop(0).partition("=")
        env[name] = value
    if not tokens or tokens[0] not in ("python", "python3", "torchrun") or "-m" not in tokens:
        return None
    i = tokens.index("-m")
    module, rest = tokens[i + 1], tokens[i + 2 :]
    args: list[str] = []
    elided = False
    for tok in rest:
        if tok == ELIDED:
            elided = True
            if args and args[-1].startswith("--") and "=" not in args[-1]:
                args.append("PLACEHOLDER")  # `--out ...`: a value the README leaves out
            continue
        args.append(tok)
    text = " ".join(re.sub(r"\s#.*$", "", line).split())
    return Command(text, module, tuple(args), env, elided)


def readme_commands(readme: Path = README) -> list[Command]:
    """Every Python-module command line of the README's ``bash`` blocks, in order."""
    commands: list[Command] = []
    blocks = re.findall(r"^```(?:bash|sh|shell)\n(.*?)^```", readme.read_text(), re.M | re.S)
    for block in blocks:
        variables: dict[str, str] = {}
        for line in _logical_lines(block):
            assign = re.fullmatch(r"\s*([A-Za-z_][A-Za-z0-9_]*)=(\S.*)", line)
            if assign and " -m " not in line:
                variables[assign.group(1)] = shlex.split(assign.group(2))[0]
                continue
            cmd = parse_line(line, variables)
            if cmd is not None:
                commands.append(cmd)
    return commands


# ---------------------------------------------------------------------------- the parse driver


class _Parsed(BaseException):
    """Raised by the patched parse_args once the command line parsed; a BaseException, so no
    ``except Exception`` in a CLI's main turns it into a failure."""


def _run_module(module: str, args: list[str]) -> tuple[str, int | None, str, str]:
    """("parsed" | "exit" | "error", exit code, stdout, stderr) of ``python -m module args``
    stopped after its parse."""
    import argparse
    import contextlib
    import io
    import runpy
    import sys

    original = argparse.ArgumentParser.parse_args

    def parse_args(self, args=None, namespace=None):
        original(self, args, namespace)
        raise _Parsed

    out, err = io.StringIO(), io.StringIO()
    argv = sys.argv
    argparse.ArgumentParser.parse_args = parse_args  # type: ignore[method-assign]
    sys.argv = [module, *args]
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            runpy.run_module(module, run_name="__main__", alter_sys=True)
        return "error", None, out.getvalue(), "the command ran to its end without parsing flags"
    except _Parsed:
        return "parsed", None, out.getvalue(), err.getvalue()
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        return "exit", code, out.getvalue(), err.getvalue() or str(e.code or "")
    except BaseException as e:  # an import error, a crash before the parse
        return "error", None, out.getvalue(), f"{type(e).__name__}: {e}"
    finally:
        argparse.ArgumentParser.parse_args = original  # type: ignore[method-assign]
        sys.argv = argv


def main() -> None:
    import json
    import sys

    sys.path.insert(0, str(REPO))
    jobs = json.load(sys.stdin)
    results = []
    for module, args in jobs:
        status, code, out, err = _run_module(module, args)
        results.append(
            {"status": status, "code": code, "stdout": out[:4000], "stderr": err[-4000:]}
        )
    Path(sys.argv[1]).write_text(json.dumps(results))


if __name__ == "__main__":
    main()
