"""Config dataclass -> argparse: the one way the project's command lines get their flags.

Every field of a config dataclass becomes a ``--kebab-case`` flag whose help is the field's
comment and ends in its default, so the dataclass is the one place a setting is named,
defaulted and explained, and ``--help`` says what a bare run does. The conventions are the
same in every CLI (rag.*, training.*, evals.*, ui.app):

- ``bool`` -> ``--x`` / ``--no-x``;
- ``X | None`` also takes ``none`` (None; TOML has no null either, rag.config reads "none" too);
- ``list[X]`` -> one flag taking one or more values (repeating the flag adds more);
- a field with a fixed set of values gets argparse ``choices`` from the constant that defines the
  set: the dataclass's ``CHOICES`` (e.g. ``rag.config.RAGConfig.CHOICES``), a ``choices=``
  mapping, and for ``device`` everywhere :data:`rag.defaults.DEVICES`, for ``precision`` /
  ``rerank_precision`` / ``decoder_precision`` :data:`rag.models.precision.PRECISION_SETTINGS`
  (``cache_implementation``: :mod:`rag.generate.speed`'s set).
  A typo then stops at parse time, naming the flag and the allowed values (exit 2, rag.cli);
- a field without a default is positional.

:func:`run_config_cli` is the one ``main`` of the commands that are a config dataclass and a
function of it (``training.finetune.contrastive``/``lora``/``rerank``, the ``evals``, the ``benchmarks``):
parse, check, run, then ``--json`` / ``--out`` / the human report, through :func:`rag.cli.run_cli`.

``layered=True`` leaves a flag out of the namespace unless it is given: for configs whose values
come from the dataclass, then a TOML file, then flags (rag.config), where "not given" must not
overwrite the file. ``--help`` still shows the dataclass default.

Why hand-written: ``transformers.HfArgumentParser`` does this but drags its own conventions
(``--no_x`` flags, underscores) and a heavy import; ~200 lines keep every CLI uniform. It lives
in ``rag`` because ``training``, ``evals`` and ``ui`` all build their command lines with it and
may import ``rag`` but not each other.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import dataclasses
import inspect
import io
import json
import logging
import sys
import textwrap
import tokenize
import types
import typing
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from rag.cli.run import OneLineParser, run_cli, says_default, show_default
from rag.defaults import DEVICES
from rag.generate.speed import CACHE_IMPLEMENTATIONS
from rag.models.precision import PRECISION_SETTINGS

T = typing.TypeVar("T")
# Sets of values a field of this name has in every config of the project (applied only when the
# field's default is one of them, so an unrelated field of the same name keeps its own values).
COMMON_CHOICES: dict[str, Sequence[str]] = {
    "device": DEVICES,
    "precision": PRECISION_SETTINGS,
    "rerank_precision": PRECISION_SETTINGS,
    "decoder_precision": PRECISION_SETTINGS,
    "cache_implementation": CACHE_IMPLEMENTATIONS,
}
SCALARS = (str, int, float, bool)


class BoolFlag(argparse.BooleanOptionalAction):
    """``--x`` / ``--no-x``, without the ``(default: True)`` Python < 3.14 appends to the help:
    the builder writes ``(default: on)`` itself, as for every other flag."""

    def __init__(self, *args: Any, help: str | None = None, **kwargs: Any) -> None:  # noqa: A002
        super().__init__(*args, help=help, **kwargs)
        self.help = help


def field_type(annotation: Any) -> tuple[Any, bool, bool]:
    """(scalar type, is_list, is_optional) of an annotation like ``list[str] | None`` (a
    ``tuple[str, ...]`` of a frozen settings class counts as a list)."""
    optional = False
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        optional = len(args) < len(typing.get_args(annotation))
        annotation = args[0] if len(args) == 1 else Any
        origin = typing.get_origin(annotation)
    if origin is list:
        return typing.get_args(annotation)[0], True, optional
    if origin is tuple and typing.get_args(annotation)[1:] == (Ellipsis,):  # tuple[X, ...]
        return typing.get_args(annotation)[0], True, optional
    return annotation, False, optional


def none_or(conv: Callable[[str], Any]) -> Callable[[str], Any]:
    """``conv`` that also reads ``none`` (any case) as None; keeps ``conv``'s name, so argparse
    still says "invalid int value: 'ten'"."""

    def parse(text: str) -> Any:
        return None if text.strip().lower() == "none" else conv(text)

    parse.__name__ = getattr(conv, "__name__", "value")
    return parse


def field_help(cls: type) -> dict[str, str]:
    """Field -> its comment: the ``# ...`` on the field's own lines, else the comment block just
    above it (read with ``tokenize``, so fields the formatter wrapped over lines still work).
    Fields inherited from parent dataclasses keep their parents' comments (``cls.__mro__``,
    base first, so a subclass that redeclares a field with its own comment wins)."""
    out: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if dataclasses.is_dataclass(klass):
            out.update(_own_field_help(klass))
    return out


def _own_field_help(cls: type) -> dict[str, str]:
    """The comments of the fields written in ``cls``'s own class body."""
    try:
        src = textwrap.dedent(inspect.getsource(cls))
    except (OSError, TypeError):  # defined in a REPL or generated
        return {}
    comments = {
        tok.start[0]: tok.string.lstrip("#").strip()
        for tok in tokenize.generate_tokens(io.StringIO(src).readline)
        if tok.type == tokenize.COMMENT
    }
    body = ast.parse(src).body[0].body  # type: ignore[attr-defined]
    out, prev_end = {}, 0
    for stmt in body:
        if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
            lines = range(stmt.lineno, (stmt.end_lineno or stmt.lineno) + 1)
            own = [comments[n] for n in lines if n in comments]
            above, n = [], stmt.lineno - 1
            while n > prev_end and n in comments:
                above.insert(0, comments[n])
                n -= 1
            if text := " ".join(own or above):
                out[stmt.target.id] = text
        prev_end = stmt.end_lineno or stmt.lineno
    return out


def _default(f: dataclasses.Field, defaults: Mapping[str, Any]) -> Any:
    if f.name in defaults:
        return defaults[f.name]
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return dataclasses.MISSING


def add_dataclass_args(
    parser: argparse.ArgumentParser | argparse._ArgumentGroup,
    cls: type,
    *,
    only: Iterable[str] | None = None,
    exclude: Iterable[str] = (),
    help: Mapping[str, str] | None = None,  # noqa: A002 - argparse's own word
    choices: Mapping[str, Sequence[Any]] | None = None,
    defaults: Mapping[str, Any] | None = None,
    shown: Mapping[str, str] | None = None,
    required: Iterable[str] = (),
    layered: bool = False,
    kwargs: Mapping[str, Mapping[str, Any]] | None = None,
) -> list[str]:
    """Add one flag per field of ``cls`` (see the module docstring); returns the field names.

    ``only``/``exclude`` pick fields; ``help`` replaces a field's comment; ``choices`` adds value
    sets; ``defaults`` replaces dataclass defaults (the UI's shorter answers); ``shown`` is the
    text ``--help`` gives as a default that is decided at run time ("$RAG_HOME/tokenizer ...");
    ``required`` fields must be given; ``kwargs`` are extra ``add_argument`` keywords per field
    (``nargs`` for a CLI that takes several values of a one-value field). Fields whose type is no
    scalar or list of scalars (a callable hook) get no flag."""
    hints = typing.get_type_hints(cls)
    texts = {**field_help(cls), **(help or {})}
    sets = {**getattr(cls, "CHOICES", {}), **(choices or {})}
    defaults, shown, required = defaults or {}, shown or {}, set(required)
    wanted = None if only is None else set(only)
    added = []
    for f in dataclasses.fields(cls):
        if not f.init or (wanted is not None and f.name not in wanted) or f.name in exclude:
            continue
        tp, is_list, optional = field_type(hints[f.name])
        if tp not in SCALARS:
            continue
        default = _default(f, defaults)
        values = sets.get(f.name)
        common = COMMON_CHOICES.get(f.name)
        if values is None and common is not None and default in common:
            values = common
        conv = none_or(tp) if optional else tp
        text = texts.get(f.name, "").replace("%", "%%")
        if f.name in required:
            text += " (required)"
        elif not says_default(text) and default is not dataclasses.MISSING:
            text += f" (default: {shown.get(f.name, show_default(default))})".replace("%", "%%")
        spec: dict[str, Any] = {"help": text.strip()}
        if default is dataclasses.MISSING:  # positional
            args = [f.name]
            spec.update(type=conv, nargs="+" if is_list else None, choices=values)
        else:
            args = ["--" + f.name.replace("_", "-")]
            unset = argparse.SUPPRESS if layered else None
            spec["dest"] = f.name
            if f.name in required:
                spec["required"] = True
            if tp is bool and not is_list:
                spec.update(action=BoolFlag, default=unset if layered else default)
            elif is_list:
                spec.update(type=conv, nargs="+", action="extend", default=unset, choices=values)
            else:
                spec.update(type=conv, choices=values, default=unset if layered else default)
        spec.update((kwargs or {}).get(f.name, {}))
        parser.add_argument(*args, **spec)
        added.append(f.name)
    return added


def config_from_args(
    cls: type[T], ns: argparse.Namespace, defaults: Mapping[str, Any] | None = None
) -> T:
    """``cls`` from the parsed flags: a field the namespace lacks (a layered flag not given, a
    field without a flag) keeps ``defaults`` or the dataclass default; a list flag not given
    keeps the field's default list."""
    defaults = defaults or {}
    values: dict[str, Any] = {}
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        if not f.init:
            continue
        if hasattr(ns, f.name):
            value = getattr(ns, f.name)
            if value is None and f.default is dataclasses.MISSING:  # list flag not given
                value = _default(f, defaults)
            if value is not dataclasses.MISSING:
                values[f.name] = value
        elif f.name in defaults:
            values[f.name] = defaults[f.name]
    return cls(**values)


def config_argv(cfg: Any) -> list[str]:
    """The flags that give ``cfg`` back through :func:`add_dataclass_args`'s parser: one per field
    with a flag (``--x`` / ``--no-x`` for a bool, a list's values after its flag, ``none`` for
    None); an empty list is left out (the parser cannot say "no values"), so it comes back as
    the field's default; a positional field's values come bare. For a command that runs parts
    of itself as child processes (``evals.division_of_labor --jobs``): the child gets the
    parent's config exactly."""
    hints = typing.get_type_hints(type(cfg))
    argv: list[str] = []
    for f in dataclasses.fields(cfg):
        if not f.init:
            continue
        tp, is_list, _ = field_type(hints[f.name])
        if tp not in SCALARS:
            continue
        name, value = f.name.replace("_", "-"), getattr(cfg, f.name)
        flag = "--" + name
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            argv += [str(v) for v in value] if is_list else [str(value)]  # positional
        elif tp is bool and not is_list:
            argv.append(flag if value else "--no-" + name)
        elif is_list:
            if value:
                argv += [flag, *(str(v) for v in value)]
        else:
            argv += [flag, "none" if value is None else str(value)]
    return argv


def dataclass_parser(prog: str, doc: str, cls: type, **options: Any) -> OneLineParser:
    """A one-line-error parser (rag.cli) with a flag per field of ``cls``; the description is
    the first paragraph of ``doc``; ``options`` go to :func:`add_dataclass_args`."""
    parser = OneLineParser(prog=prog, description=(doc or "").split("\n\n")[0])
    add_dataclass_args(parser, cls, **options)
    return parser


# ---------------------------------------------------------------------------- config commands


def add_result_args(parser: argparse.ArgumentParser, *, out_file: bool = False) -> None:
    """``--json`` (the result as JSON on stdout) and, with ``out_file``, ``--out FILE.json``
    (namespace ``result_file``, so it never meets a config field named ``out``)."""
    if out_file:
        parser.add_argument(
            "--out",
            dest="result_file",
            metavar="FILE.json",
            help="also write the result JSON to this file (default: none)",
        )
    parser.add_argument("--json", action="store_true", help="print the result as JSON on stdout")


def write_result(result: Any, path: str | None, to_stdout: bool) -> None:
    """The result JSON into ``path`` (parents created) and/or on stdout. ``default=str``: paths
    and the like print as text instead of failing after the run."""
    text = json.dumps(result, indent=2, default=str)
    if path:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(text + "\n")
    if to_stdout:
        print(text)


def config_parser(
    prog: str, doc: str | None, cls: type, *, out_file: bool = False, **options: Any
) -> OneLineParser:
    """:func:`dataclass_parser` (``options``: ``required``, ``choices``, ``shown``, ...) plus
    :func:`add_result_args`: the parser :func:`run_config_cli` reads."""
    parser = dataclass_parser(prog, doc or "", cls, **options)
    add_result_args(parser, out_file=out_file)
    return parser


def run_config_cli(
    parser: argparse.ArgumentParser,
    cls: type[T],
    run: Callable[[T], Any],
    argv: list[str] | None = None,
    *,
    check: Callable[[T], None] | None = None,
    report: Callable[[Any], str] | None = None,
    note: Callable[[T, Any], str] | None = None,
    logs_to_stderr: bool = False,
    build: Callable[[argparse.Namespace], T] | None = None,
) -> int:
    """The one ``main`` of a command that is a config dataclass ``cls`` and ``run(cfg)``.

    Parses ``argv`` with ``parser`` (from :func:`config_parser`) into ``cls``, calls
    ``check(cfg)`` before anything loads, then ``result = run(cfg)``; ``logs_to_stderr`` sends
    logging (INFO) and whatever the run prints to stderr, so stdout holds only the result.
    Then the result: written to ``--out FILE.json`` when the parser has it and it was given;
    with ``--json``, printed as JSON on stdout, else ``report(result)`` (its human form, e.g. a
    markdown table; if any) is; ``note(cfg, result)`` (if any) is a line on stderr either way. Exit codes are
    :func:`rag.cli.run_cli`'s: 0 done, 2 a bad flag, value or path (a ``ValueError`` from
    ``check`` or ``run`` naming the flag), 1 a failure while running; failures are one line.
    ``build(args)`` makes the config where :func:`config_from_args` cannot (an eval's nested
    ``rag.config.RAGConfig``)."""

    def body(args: argparse.Namespace) -> int:
        cfg = build(args) if build is not None else config_from_args(cls, args)
        if check is not None:
            check(cfg)
        if logs_to_stderr:
            logging.basicConfig(
                level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(name)s: %(message)s"
            )
            with contextlib.redirect_stdout(sys.stderr):
                result = run(cfg)
        else:
            result = run(cfg)
        write_result(result, getattr(args, "result_file", None), args.json)
        if report is not None and not args.json:
            print(report(result))
        if note is not None:
            print(note(cfg, result), file=sys.stderr)
        return 0

    return run_cli(parser, body, argv)
