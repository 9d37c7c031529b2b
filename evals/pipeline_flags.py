"""The pipeline settings of an eval: one :class:`rag.config.RAGConfig`, its flags the sections'.

An eval that runs rag's pipeline (``evals.docqa``, ``evals.qa``, ``evals.injection``) or its
retrieval (``evals.answerability``) holds its own fields (questions, split, limit, ...) plus one
``rag: RAGConfig``, and no copies of the sections' fields. Its command line has a flag for every
setting of every section (:func:`rag.config.add_config_args`: the same names, help and value sets
as ``rag.ask``) except the settings the eval fixes itself, each named with the reason in its
module's ``EXCLUDED``; the flags start from the eval's own values, its module's
``EVAL_DEFAULTS`` (flat setting names over the sections' defaults). A few flags keep an older
name of this eval beside the setting's own (``evals.qa --generator`` is ``--decoder``):
``ALIASES``.

The settings come from those defaults and the flags only, never from a ``rag.toml`` in the
working directory (``read_file=False``), so a result JSON, which records every setting
(:meth:`EvalConfig.to_dict`), says everything that produced it.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, NamedTuple, TypeVar

from rag.cli.flags import config_from_args as own_from_args
from rag.cli.flags import config_parser, none_or
from rag.cli.run import show_default
from rag.config import (
    ConfigError,
    RAGConfig,
    add_config_args,
    build_config,
    config_from_args,
    field_sections,
    settings,
)

E = TypeVar("E", bound="EvalConfig")


def squad_search_excluded(fixed_search: str) -> dict[str, str]:
    """The retrieval settings an eval over SQuAD paragraphs fixes itself (``evals.qa``'s rag
    mode, ``evals.answerability``): its corpus is the paragraphs, searched by
    ``evals.qa.ParagraphRetriever`` with fixed fusion and no rerank (``fixed_search`` says why)."""
    return {
        "index": "the corpus is the --squad file's paragraphs, not an index",
        **dict.fromkeys(
            (
                "fusion",
                "alpha",
                "norm",
                "depth",
                "rerank",
                "rerank_depth",
                "rerank_weight",
                "rerank_precision",
                "rerank_max_length",
            ),
            fixed_search,
        ),
        "encoder_backend": "the paragraphs' encoder is loaded with sentence-transformers "
        "(rag.models.load_embedder)",
        "where": "SQuAD paragraphs have no document paths or types to filter",
    }


class Alias(NamedTuple):
    """An older flag name of an eval for one setting (a second flag beside the setting's own)."""

    setting: str
    help: str
    choices: Sequence[str] | None = None


@dataclass(frozen=True)
class PipelineFlags:
    """An eval's pipeline settings: what it fixes, where it starts, its older flag names."""

    excluded: Mapping[str, str]  # setting -> why the eval has no flag for it
    defaults: Mapping[str, Any]  # the eval's starting values (flat names)
    aliases: Mapping[str, Alias] = field(default_factory=dict)  # older flag name -> its setting
    # setting -> what its flag means in this eval, where that differs from rag.ask's help
    help: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        known = field_sections()
        named = (("excluded", self.excluded), ("defaults", self.defaults), ("help", self.help))
        for what, names in named:
            unknown = sorted(set(names) - set(known))
            if unknown:
                raise AssertionError(f"{what}: no such setting: {', '.join(unknown)}")
        if bad := sorted(n for n, why in self.excluded.items() if not str(why).strip()):
            raise AssertionError(f"excluded without a reason: {', '.join(bad)}")
        for alias, spec in self.aliases.items():
            if spec.setting not in known or alias in known:
                raise AssertionError(f"alias --{alias} must name a setting and not be one")

    def flags(self) -> list[str]:
        """The settings that are flags of the eval (every one not excluded)."""
        return [n for n in field_sections() if n not in self.excluded]

    def config(self, **values: Any) -> RAGConfig:
        """The eval's RAGConfig: :attr:`defaults` with ``values`` (flat names or aliases)
        applied; a setting the eval fixes itself is refused (ConfigError naming the reason)."""
        fixed = sorted(set(values) & set(self.excluded))  # an alias may set one (qa's mode)
        if fixed:
            raise ConfigError(f"{fixed[0]}: fixed by this eval ({self.excluded[fixed[0]]})")
        return build_config({**self.defaults, **self._resolve(values)})

    def _resolve(self, values: Mapping[str, Any]) -> dict[str, Any]:
        """``values`` with aliases turned into their settings (both given: ConfigError)."""
        out = {k: v for k, v in values.items() if k not in self.aliases}
        for alias, spec in self.aliases.items():
            if alias in values:
                if spec.setting in out:
                    flag = "--" + spec.setting.replace("_", "-")
                    raise ConfigError(f"--{alias} and {flag} set the same setting: give one")
                out[spec.setting] = values[alias]
        return out

    def add_args(self, parser: argparse.ArgumentParser) -> None:
        """The settings' flags (layered: absent from the namespace unless given), in a group."""
        group = parser.add_argument_group(
            "pipeline settings",
            "rag.config's sections, as rag.ask names them; this eval starts from its own values "
            "(shown as defaults) and never reads a rag.toml",
        )
        add_config_args(group, self.excluded, help=self.help, defaults=self.defaults)
        types = settings()
        defaults = build_config(self.defaults).flat()
        for alias, spec in self.aliases.items():
            tp, optional = types[spec.setting]
            default = show_default(defaults[spec.setting])
            group.add_argument(
                "--" + alias.replace("_", "-"),
                dest=alias,
                type=none_or(tp) if optional else tp,
                choices=spec.choices,
                default=argparse.SUPPRESS,
                metavar=None if spec.choices else spec.setting.upper(),
                help=f"{spec.help} (default: {default})".replace("%", "%%"),
            )

    def from_args(self, args: argparse.Namespace) -> RAGConfig:
        """The RAGConfig the parsed flags ask for: :attr:`defaults` <- the flags given (no
        rag.toml). Only this eval's pipeline flags are read, so an eval field that shares a
        setting's name (``evals.qa --mode``) never reaches the pipeline."""
        names = [*self.flags(), *self.aliases]
        given = self._resolve({n: getattr(args, n) for n in names if hasattr(args, n)})
        ns = argparse.Namespace(**given)
        return config_from_args(ns, None, base=self.defaults, read_file=False)


class EvalConfig:
    """Base of an eval's config dataclass: its own fields plus ``rag`` (a RAGConfig whose
    default is ``PIPELINE.config()``); ``PIPELINE`` is the eval's :class:`PipelineFlags`."""

    PIPELINE: ClassVar[PipelineFlags]

    @classmethod
    def own_fields(cls) -> list[str]:
        return [f.name for f in dataclasses.fields(cls) if f.name != "rag"]  # type: ignore[arg-type]

    @classmethod
    def of(cls: type[E], **values: Any) -> E:
        """A config from flat names, as the flags name them: the eval's own fields, and the
        pipeline's settings (or their aliases) over ``EVAL_DEFAULTS``."""
        own = set(cls.own_fields())
        mine = {k: v for k, v in values.items() if k in own}
        rag = cls.PIPELINE.config(**{k: v for k, v in values.items() if k not in own})
        return cls(rag=rag, **mine)  # type: ignore[call-arg]

    @classmethod
    def from_args(cls: type[E], args: argparse.Namespace) -> E:
        """The config of a parsed command line (:meth:`parser`)."""
        own = own_from_args(cls, args)
        return dataclasses.replace(own, rag=cls.PIPELINE.from_args(args))  # type: ignore[type-var]

    @classmethod
    def parser(cls, prog: str, doc: str | None, **options: Any) -> argparse.ArgumentParser:
        """The eval's own flags, ``--out`` / ``--json``, then the pipeline settings' flags."""
        clash = sorted(set(cls.own_fields()) & set(cls.PIPELINE.flags()))
        if clash:  # one namespace: an eval field may share only an excluded setting's name
            raise AssertionError(f"{cls.__name__} fields that are pipeline flags: {clash}")
        parser = config_parser(prog, doc, cls, out_file=True, **options)
        cls.PIPELINE.add_args(parser)
        return parser

    def to_dict(self) -> dict[str, Any]:
        """The result JSON's ``config``: the eval's fields, and ``rag``, every setting by
        section (:meth:`rag.config.RAGConfig.to_dict`)."""
        own = {n: getattr(self, n) for n in self.own_fields()}
        return {**own, "rag": self.rag.to_dict()}  # type: ignore[attr-defined]
