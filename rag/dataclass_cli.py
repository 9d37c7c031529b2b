"""Config dataclass <-> argparse: each field becomes a kebab-case flag with its comment as help.

Why hand-written: ``transformers.HfArgumentParser`` does this but drags its own conventions
(``--no_x`` flags, underscores); twenty lines keep the fine-tuning and eval CLIs uniform and
readable. It lives in ``rag`` because both ``training`` (training.cli) and ``evals`` (evals.cli)
build their command lines with it, and neither may import the other's CLI helpers for it.
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import json
import types
import typing
from typing import Any

T = typing.TypeVar("T")


def _base_type(tp: Any) -> tuple[Any, bool, bool]:
    """(scalar type, is_list, is_optional) of a field annotation like ``list[str] | None``."""
    optional = False
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        optional, tp = True, args[0]
        origin = typing.get_origin(tp)
    if origin is list:
        return typing.get_args(tp)[0], True, optional
    return tp, False, optional


def add_dataclass_args(
    parser: argparse.ArgumentParser, cls: type, help_: dict[str, str] | None = None
) -> None:
    """One flag per field of ``cls``; ``help_`` maps field name -> help text."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        flag = "--" + f.name.replace("_", "-")
        tp, is_list, _ = _base_type(hints[f.name])
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]
        text = (help_ or {}).get(f.name, "")
        if tp is bool:
            parser.add_argument(
                flag, action=argparse.BooleanOptionalAction, default=default, help=text
            )
        elif is_list:
            parser.add_argument(flag, type=tp, nargs="+", action="extend", default=None, help=text)
        else:
            parser.add_argument(flag, type=tp, default=default, help=f"{text} (default: {default})")


def config_from_args(cls: type[T], ns: argparse.Namespace) -> T:
    kwargs = {}
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        value = getattr(ns, f.name)
        if value is None and f.default is dataclasses.MISSING:
            value = f.default_factory()  # type: ignore[misc]
        kwargs[f.name] = value
    return cls(**kwargs)


def field_help(source: str) -> dict[str, str]:
    """Field -> trailing ``# comment`` text, parsed from the dataclass source (help = comments)."""
    out = {}
    for line in source.splitlines():
        name, sep, rest = line.strip().partition(":")
        if sep and name.isidentifier() and "#" in rest:
            out[name] = rest.split("#", 1)[1].strip()
    return out


def to_json(obj: Any) -> str:
    return json.dumps(
        dataclasses.asdict(obj) if dataclasses.is_dataclass(obj) else obj, indent=2, default=str
    )


def dataclass_parser(prog: str, doc: str, cls: type) -> argparse.ArgumentParser:
    """A parser with one flag per field of ``cls`` (help = the field's comment); the
    description is the first paragraph of ``doc``."""
    parser = argparse.ArgumentParser(prog=prog, description=doc.split("\n\n")[0])
    bases = [c for c in reversed(cls.__mro__) if dataclasses.is_dataclass(c)]  # inherited help
    add_dataclass_args(parser, cls, field_help("".join(inspect.getsource(c) for c in bases)))
    return parser
