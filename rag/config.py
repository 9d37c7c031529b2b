"""RAG configuration: the index, the device and one settings section per concern.

:class:`RAGConfig` is ``(index, device, retrieval, answer, generate)``; each section is owned by
its subpackage and passed whole to the code it configures:

- ``retrieval``: :class:`rag.retrieval.settings.RetrievalSettings` (mode, k, fusion, rerank, ...);
- ``answer``: :class:`rag.answer.settings.AnswerSettings` (reader, excerpts, thresholds, citations);
- ``generate``: :class:`rag.generate.settings.GenerationSettings` (decoder, adapter, engine,
  precision, sampling, token limits, caches, batching).

Values come from three layers, later ones winning: the sections' defaults, a ``rag.toml`` in the
working directory (or ``--config PATH``), then CLI flags. The TOML file has a table per section,
with ``index`` and ``device`` at the top (or all of it under a ``[rag]`` table)::

    index = "pydocs"

    [retrieval]
    k = 5
    mode = "hybrid"

    [generate]
    decoder = "qwen2.5-coder-1.5b"

The flat form of older files (``k = 5`` at the top) still loads, with a one-line note naming the
new place of each key. Every field name is unique across the sections, so a flag is the field's
name (``--k``, ``--decoder``, ``--fusion``) and every entry point builds its flags from the
sections with :func:`add_config_args`; an entry point leaves a field out only with a stated
reason. An unknown key is an error that names the key and the file, so a typo never silently
falls back to a default.
"""

from __future__ import annotations

import argparse
import functools
import logging
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any, ClassVar

import tomllib

from rag.answer.reader import describe_reader, resolve_reader
from rag.answer.settings import AnswerSettings
from rag.cli.flags import add_dataclass_args, field_type
from rag.defaults import DEVICES
from rag.generate.settings import GenerationSettings
from rag.models import (
    DECODER_ALIASES,
    ENCODER_ALIASES,
    ModelNotFoundError,
    describe_decoder,
    resolve_adapter,
    resolve_factoid_decoder,
    resolve_model,
)
from rag.retrieval.rerank import describe_reranker, resolve_reranker
from rag.retrieval.settings import RetrievalSettings

log = logging.getLogger(__name__)

DEFAULT_CONFIG_FILE = "rag.toml"
# Keys older rag.toml files may hold that answering never read: they are rag.ingest flags.
INGEST_KEYS = {"backend", "chroma_url", "chunk_tokens", "overlap"}


class ConfigError(ValueError):
    """A bad config file, key or value; the message names the file/flag and the value."""


@dataclass
class RAGConfig:
    """Everything needed to answer a question from an index: where, on what device, and one
    settings section per concern (module docstring)."""

    index: str = "default"  # index name under $RAG_HOME/indexes (or a folder path)
    device: str = "auto"  # where the models run; auto = cuda when a GPU is visible
    retrieval: RetrievalSettings = field(default_factory=RetrievalSettings)
    answer: AnswerSettings = field(default_factory=AnswerSettings)
    generate: GenerationSettings = field(default_factory=GenerationSettings)
    # Hook (not from TOML/CLI): turns (question, history) into a standalone retrieval query.
    rewrite_query: Callable[[str, list[tuple[str, str]]], str] | None = field(
        default=None, repr=False, compare=False
    )

    CHOICES: ClassVar[dict[str, tuple[str, ...]]] = {"device": DEVICES}
    # section attribute -> its settings class, in the order flags and tables are listed
    SECTIONS: ClassVar[dict[str, type]] = {
        "retrieval": RetrievalSettings,
        "answer": AnswerSettings,
        "generate": GenerationSettings,
    }

    def __post_init__(self) -> None:
        for name, cls in self.SECTIONS.items():
            if not isinstance(getattr(self, name), cls):
                raise ConfigError(f"RAGConfig.{name} must be a {cls.__name__}")
        if self.device not in DEVICES:
            raise ConfigError(f"device must be one of {', '.join(DEVICES)}, not {self.device!r}")
        if self.retrieval.device != self.device:  # one device for every model of the config
            self.retrieval = self.retrieval.replace(device=self.device)
        if self.device == "cuda":
            try:
                self.generate.check_device("cuda")
            except ValueError as e:
                raise ConfigError(str(e)) from e

    @classmethod
    def of(cls, **values: Any) -> RAGConfig:
        """A config from flat field names (``RAGConfig.of(index="docs", k=3, decoder="x")``), as
        flags and old flat rag.toml files name them: each goes to its section."""
        return build_config(values)

    def to_dict(self) -> dict[str, Any]:
        """Plain values for ``run.json`` / ``--json``: the sections as tables (the rewrite hook is
        shown by name)."""
        d: dict[str, Any] = {"index": self.index, "device": self.device}
        for name in self.SECTIONS:
            d[name] = getattr(self, name).to_dict()
        d["retrieval"]["where"] = list(d["retrieval"]["where"])
        hook = self.rewrite_query
        d["rewrite_query"] = getattr(hook, "__qualname__", repr(hook)) if hook else None
        return d

    def flat(self) -> dict[str, Any]:
        """Every setting by its flat name (the flag's), section by section."""
        out: dict[str, Any] = {"index": self.index, "device": self.device}
        for name in self.SECTIONS:
            section = getattr(self, name)
            out.update({n: getattr(section, n) for n in section_fields(name)})
        return out


TOP_FIELDS = ("index", "device")
# Fields of a section that a config sets elsewhere: the retrieval section's device is the
# config's own (one device for every model).
SET_ELSEWHERE = {"retrieval": {"device": "RAGConfig.device"}}


def section_fields(section: str) -> tuple[str, ...]:
    """The fields of ``section`` that are settings (flags, TOML keys) of a RAGConfig."""
    cls = RAGConfig.SECTIONS[section]
    skip = SET_ELSEWHERE.get(section, {})
    return tuple(f.name for f in fields(cls) if f.init and f.name not in skip)


@functools.cache
def field_sections() -> Mapping[str, str | None]:
    """Flat setting name -> its section (None: a top-level field of RAGConfig); read-only, built
    once (every config, flag and TOML key is checked against it)."""
    out: dict[str, str | None] = dict.fromkeys(TOP_FIELDS)
    for section in RAGConfig.SECTIONS:
        for name in section_fields(section):
            if name in out:  # the flat names (flags) must stay unambiguous
                raise AssertionError(f"setting {name!r} is in two sections")
            out[name] = section
    return MappingProxyType(out)


def build_config(values: Mapping[str, Any], base: RAGConfig | None = None) -> RAGConfig:
    """``base`` (else the defaults) with ``values`` applied: flat setting names (``k``,
    ``decoder``), ``rewrite_query``, or whole sections (``retrieval=RetrievalSettings(...)``).
    A bad name or value raises :class:`ConfigError` naming it."""
    where = field_sections()
    top: dict[str, Any] = {}
    per: dict[str, dict[str, Any]] = {s: {} for s in RAGConfig.SECTIONS}
    for key, value in values.items():
        name = key.replace("-", "_")
        if name == "rewrite_query" or name in RAGConfig.SECTIONS:
            top[name] = value
        elif name not in where:
            raise ConfigError(f"unknown setting {key!r}")
        elif where[name] is None:
            top[name] = value
        else:
            per[where[name]][name] = value
    base = base or RAGConfig()
    try:
        for section, changes in per.items():
            current = top.get(section, getattr(base, section))
            if changes:
                top[section] = replace(current, **changes)
            elif section not in top:
                top[section] = current
        return replace(base, **top)
    except ConfigError:
        raise
    except (TypeError, ValueError) as e:
        raise ConfigError(str(e)) from e


def with_overrides(cfg: RAGConfig, **kwargs: Any) -> RAGConfig:
    """A copy of ``cfg`` with the non-None ``kwargs`` (flat names) applied (validated)."""
    return build_config({k: v for k, v in kwargs.items() if v is not None}, cfg)


@functools.cache
def _hints(section: str | None) -> Mapping[str, Any]:
    """The field annotations of ``section`` (None: RAGConfig's own), resolved once."""
    hints = typing.get_type_hints(RAGConfig if section is None else RAGConfig.SECTIONS[section])
    return MappingProxyType(hints)


def settings() -> dict[str, tuple[type, bool]]:
    """Flat name -> (type, accepts None) for every setting (the rewrite hook is code)."""
    out = {}
    for name, section in field_sections().items():
        tp, _, optional = field_type(_hints(section)[name])
        out[name] = (tp, optional)
    return out


def _coerce(name: str, section: str | None, value: Any, source: str) -> Any:
    """Check a TOML value against the field's annotated type (TOML has no null: use "none");
    a list field takes a list of its type, or one value."""
    tp, is_list, optional = field_type(_hints(section)[name])
    if is_list:
        items = [value] if isinstance(value, tp) else value
        if not isinstance(items, list) or not all(isinstance(v, tp) for v in items):
            raise ConfigError(f"{source}: {name} must be a list of {tp.__name__}, not {value!r}")
        return list(items)
    if optional and isinstance(value, str) and value.lower() == "none":
        return None
    is_number = isinstance(value, int | float) and not isinstance(value, bool)
    ok = {
        int: isinstance(value, int) and not isinstance(value, bool),
        float: is_number,
        str: isinstance(value, str),
        bool: isinstance(value, bool),
    }[tp]
    if not ok:
        raise ConfigError(f"{source}: {name} must be {tp.__name__}, not {value!r}")
    return float(value) if tp is float else value


def read_toml(path: str | Path) -> dict[str, Any]:
    """Setting values (flat names) from a TOML file: ``index``/``device`` and the section tables
    ``[retrieval]``, ``[answer]``, ``[generate]`` (at the top or under ``[rag]``); a flat key of
    an older file is read too, with a one-line note naming its table. Unknown keys, and a key in
    the wrong table, are errors."""
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise ConfigError(f"cannot read config file {path}: {e.strerror or e}") from e
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path}: invalid TOML: {e}") from e
    if isinstance(data.get("rag"), dict):
        extra = sorted(k for k in data if k != "rag")
        if extra:
            raise ConfigError(f"{path}: unknown key {extra[0]!r} beside the [rag] table")
        data = data["rag"]
    where = field_sections()
    out: dict[str, Any] = {}
    moved: list[str] = []

    def take(key: str, value: Any, table: str | None) -> None:
        name = key.replace("-", "_")
        if name in INGEST_KEYS:
            raise ConfigError(
                f"{path}: {key!r} is an ingest setting, not read when answering: pass "
                f"--{name.replace('_', '-')} to python -m rag.ingest instead"
            )
        if name not in where:
            known = ", ".join(sorted(where)) if table is None else ", ".join(section_fields(table))
            place = f"[{table}] " if table else ""
            raise ConfigError(f"{path}: unknown key {place}{key!r} (known: {known})")
        home = where[name]
        if table is not None and home != table:
            raise ConfigError(
                f"{path}: {key!r} belongs to "
                + (f"[{home}]" if home else "the top level")
                + f", not [{table}]"
            )
        if table is None and home is not None:
            moved.append(f"{key} -> [{home}]")
        if name in out:
            raise ConfigError(f"{path}: {key!r} is set twice")
        out[name] = _coerce(name, home, value, str(path))

    for key, value in data.items():
        if key in RAGConfig.SECTIONS:
            if not isinstance(value, dict):
                raise ConfigError(f"{path}: {key} must be a table ([{key}]), not {value!r}")
            for sub, v in value.items():
                take(sub, v, key)
        else:
            take(key, value, None)
    if moved:
        log.warning(
            "%s: flat keys still read; they now live in section tables: %s", path, ", ".join(moved)
        )
    return out


def _layers(
    path: str | Path | None,
    given: Mapping[str, Any],
    base: Mapping[str, Any],
    read_file: bool = True,
) -> RAGConfig:
    """Defaults ← ``base`` ← ``path`` (or ``./rag.toml`` when present) ← ``given``;
    ``read_file=False`` reads no file at all (an eval's settings come from its flags alone)."""
    values: dict[str, Any] = dict(base)
    if read_file and path is not None:
        if not Path(path).is_file():
            raise ConfigError(f"--config {path}: no such file")
        values.update(read_toml(path))
    elif read_file and Path(DEFAULT_CONFIG_FILE).is_file():
        values.update(read_toml(DEFAULT_CONFIG_FILE))
    for key, value in given.items():
        name = key.replace("-", "_")
        if name not in field_sections() and name != "rewrite_query":
            raise ConfigError(f"unknown config override {key!r}")
        values[name] = value
    return build_config(values)


def load_config(
    path: str | Path | None = None, overrides: Mapping[str, Any] | None = None
) -> RAGConfig:
    """Defaults ← ``path`` (or ``./rag.toml`` when present) ← ``overrides`` (flat names; None
    values skipped). An explicit ``path`` that does not exist is an error; a missing
    ``./rag.toml`` is not."""
    return _layers(path, {k: v for k, v in (overrides or {}).items() if v is not None}, {})


# What --help says for fields whose comment is written for the code rather than the command line.
CLI_HELP = {
    "index": "index name under $RAG_HOME/indexes",
    "encoder": "query encoder alias/folder; none = the one the index was built with",
    "rerank": "cross-encoder reranking the retrieved candidates: auto = minilm-rerank when "
    "`make models` trained it (else no rerank); none = off; or a folder/artefact name",
    "rerank_weight": "reranker's share of a reranked passage's score, in [0, 1]: 1 = the "
    "reranker's order, 0 = the first stage's",
    "rerank_precision": "reranker weights: auto = bf16 on CUDA or a CPU with bf16 units, else "
    "fp32; or fp32, bf16, int8 (CPU)",
    "where": "document filter, repeatable (clauses ANDed): path=GLOB on the relative path "
    "(library/* or a folder), type=pdf,md (values ORed) (default: none)",
    "refusal_threshold": "refuse only when p(refusal) >= this, in (0, 1], else answer with the "
    "refusal barred; none = the decoder's own choice (rag.answer.refusal)",
}

# ``--where`` takes one clause per flag, repeated (a list flag's ``nargs="+"`` would swallow the
# question or query that may follow it on the command line)
FLAG_KWARGS = {"where": {"nargs": None, "action": "append", "metavar": "KEY=VALUE"}}


def add_config_args(
    parser: argparse.ArgumentParser | argparse._ArgumentGroup,
    exclude: Mapping[str, str] | None = None,
    *,
    help: Mapping[str, str] | None = None,  # noqa: A002 - argparse's own word
    defaults: Mapping[str, Any] | None = None,
    kwargs: Mapping[str, Mapping[str, Any]] | None = None,
) -> list[str]:
    """A ``--kebab-case`` flag for every setting of every section (:func:`field_sections`),
    except the ``exclude`` ones (setting -> the reason this entry point has no such flag). Built
    by the project's one builder (rag.cli.flags), layered: a flag not given stays out of the
    namespace, so the TOML value or the section's default stays in force (``--help`` shows the
    default, or ``defaults``' value where the entry point starts elsewhere)."""
    skip = dict(exclude or {})
    unknown = sorted(set(skip) - set(field_sections()))
    if unknown:
        raise AssertionError(f"excluded settings that do not exist: {', '.join(unknown)}")
    texts = {**CLI_HELP, **(help or {})}
    extra = {**FLAG_KWARGS, **(kwargs or {})}
    added = add_dataclass_args(
        parser,
        RAGConfig,
        only=[n for n in TOP_FIELDS if n not in skip],
        help=texts,
        defaults=defaults,
        layered=True,
        kwargs=extra,
    )
    for section in RAGConfig.SECTIONS:
        names = [n for n in section_fields(section) if n not in skip]
        added += add_dataclass_args(
            parser,
            RAGConfig.SECTIONS[section],
            only=names,
            help=texts,
            defaults=defaults,
            layered=True,
            kwargs=extra,
        )
    return added


def config_from_args(
    args: argparse.Namespace,
    config_path: str | Path | None = None,
    *,
    base: Mapping[str, Any] | None = None,
    read_file: bool = True,
) -> RAGConfig:
    """RAGConfig from the flags given over the TOML file over ``base`` (an entry point's own
    starting values, flat names) over the defaults; a flag given as ``none`` overrides the file
    too. ``read_file=False``: no TOML layer, not even ``./rag.toml`` (the evals: a result JSON
    then says everything that produced it)."""
    given = {n: getattr(args, n) for n in field_sections() if hasattr(args, n)}
    return _layers(config_path, given, base or {}, read_file)


# ---- the models a config names ------------------------------------------------------------------


def check_models(cfg: RAGConfig) -> None:
    """Fail now, naming the flag, on a model name that is no alias, folder or artefact (or a
    ``--rerank`` that is no cross-encoder): the decoder is loaded only when something relevant
    was retrieved, so a typo in ``--decoder`` would otherwise pass unnoticed on a question the
    documents do not answer. Every front end (rag.ask, rag.serve, the UI) checks through here."""
    aliases = {*ENCODER_ALIASES, *DECODER_ALIASES}
    for flag, name in (
        ("--encoder", cfg.retrieval.encoder),
        ("--decoder", cfg.generate.decoder),
        ("--adapter", cfg.generate.adapter),
        ("--factoid-decoder", cfg.generate.factoid_decoder),
    ):
        if not name or name in aliases or name in ("auto", "none", "same"):
            continue
        if Path(name).expanduser().exists():
            continue
        try:
            resolve_model(name)
        except ModelNotFoundError as e:
            raise ModelNotFoundError(f"{flag}: {e}") from None
    try:  # auto and none never fail; an explicit cross-encoder must exist and be one
        resolve_reranker(cfg.retrieval.rerank)
    except ModelNotFoundError as e:
        raise ModelNotFoundError(f"--rerank: {e}") from None
    except ValueError as e:
        raise ValueError(f"--rerank: {e}") from None
    resolve_reader(cfg.answer.reader)  # auto and none never fail; a missing one names --reader
    if cfg.generate.engine == "openvino":  # where it cannot run the decoder: one line saying why
        engine_for(cfg, "cuda" if cfg.device == "cuda" else "cpu")


def engine_for(cfg: RAGConfig, device: str | None = None) -> str:
    """The engine the decoder runs on (``torch`` or ``openvino``): the generation settings'
    ``engine`` resolved for their decoder and adapter on ``device`` (None: the config's,
    ``auto`` resolved, which imports torch) by :func:`rag.generate.engines.choose_engine`."""
    from rag.generate.engines import choose_engine

    if device is None:
        from rag.models import pick_device

        device = pick_device(cfg.device)
    gen = cfg.generate
    return choose_engine(gen.engine, gen.decoder, resolve_adapter(gen.decoder, gen.adapter), device)


@dataclass(frozen=True)
class ResolvedModels:
    """What a config's ``auto`` / ``none`` model settings came to, for a front end to show."""

    config: RAGConfig  # adapter and rerank resolved to a name or None
    decoder_line: str  # the decoder and its adapter, for people (rag.models.describe_decoder)
    reranker_line: str  # the reranker, or that reranking is off and why
    reader_line: str  # the extractive reader, or that it is off and why


def resolve_models(cfg: RAGConfig) -> ResolvedModels:
    """``cfg`` with its adapter and reranker settings resolved (``auto`` → the trained artefact
    when present, else none; rag.models.resolve_adapter, rag.retrieval.rerank.resolve_reranker),
    and one line on each for people, so the server and the UI say which models answer."""
    gen, ret = cfg.generate, cfg.retrieval
    rerank = resolve_reranker(ret.rerank)
    adapter = resolve_adapter(gen.decoder, gen.adapter)
    engine = "OpenVINO GenAI" if engine_for(cfg) == "openvino" else "torch"
    factoid = resolve_factoid_decoder(gen.decoder, gen.factoid_decoder)
    line = describe_decoder(gen.decoder, gen.adapter).replace(
        str(gen.decoder), f"{gen.decoder} on {engine}", 1
    )
    if factoid != str(gen.decoder):
        line += f"; {factoid} copies factoids' short answers"
    return ResolvedModels(
        replace(
            cfg,
            generate=gen.replace(adapter=adapter, factoid_decoder=factoid),
            retrieval=ret.replace(rerank=rerank),
        ),
        line,
        describe_reranker(ret.rerank, rerank),
        describe_reader(cfg.answer.reader),
    )
