"""RAG configuration: one dataclass shared by ``rag.ask``, the pipeline and the UI.

Values come from three layers, later ones winning: the dataclass defaults, a ``rag.toml`` in the
working directory (or ``--config PATH``), then CLI flags. The TOML file holds the same field names
as the dataclass (snake_case or kebab-case), either at the top level or under a ``[rag]`` table::

    index = "pydocs"
    decoder = "smollm2"
    k = 5
    mode = "hybrid"

An unknown key is an error that names the key and the file, so a typo never silently falls back
to a default.
"""

from __future__ import annotations

import argparse
import typing
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, ClassVar

import tomllib

from rag.answer.answerability import DEFAULT_MODEL
from rag.answer.reader import COMPOSE, DEFAULT_READER, describe_reader, resolve_reader
from rag.dataclass_cli import add_dataclass_args, field_type
from rag.defaults import (
    DEFAULT_EVIDENCE_PASSAGES,
    DEFAULT_EVIDENCE_TOKENS,
    DEFAULT_MAX_NEW_TOKENS,
    DEFAULT_PROMPT_CACHE_MB,
    DEVICES,
    MODES,
)
from rag.generate.engines import ENGINES
from rag.generate.speed import CACHE_IMPLEMENTATIONS, DecodeSpeed, DecodeSpeedError
from rag.models import (
    DECODER_ALIASES,
    DEFAULT_ADAPTER,
    DEFAULT_DECODER,
    ENCODER_ALIASES,
    ModelNotFoundError,
    describe_decoder,
    resolve_adapter,
    resolve_model,
)
from rag.precision import PRECISION_SETTINGS
from rag.prompt import PROFILES
from rag.retrieval.encoder import ENCODER_BACKENDS
from rag.retrieval.fusion import FUSIONS
from rag.retrieval.rerank import describe_reranker, resolve_reranker
from rag.retrieval.settings import DEFAULTS as RETRIEVAL
from rag.retrieval.settings import RetrievalSettings

DEFAULT_CONFIG_FILE = "rag.toml"
# Keys older rag.toml files may hold that answering never read: they are rag.ingest flags.
INGEST_KEYS = {"backend", "chroma_url", "chunk_tokens", "overlap"}


class ConfigError(ValueError):
    """A bad config file, key or value; the message names the file/flag and the value."""


@dataclass
class RAGConfig:
    """Everything needed to answer a question from an index.

    The retrieval fields (``k``, ``mode``, ``fusion``, ``alpha``, ``rerank*``, ``encoder``,
    ``encoder_backend``, ``device``) are :class:`~rag.retrieval.settings.RetrievalSettings`'s,
    with its defaults (the only retrieval defaults); :attr:`retrieval` builds the settings.
    """

    index: str = "default"  # index name under $RAG_HOME/indexes (or a folder path)
    # query encoder alias/folder; None = the one the index was built with
    encoder: str | None = RETRIEVAL.encoder
    decoder: str = DEFAULT_DECODER  # causal LM alias or folder that writes the answer
    # peft LoRA adapter for the decoder: auto = <decoder>-span-lora under $RAG_HOME/models, the
    # reader-first adapter `make models` trains (the base model alone when absent); none = the
    # base model alone; or a folder/name (docs/answering.md)
    adapter: str | None = DEFAULT_ADAPTER
    k: int = RETRIEVAL.k  # passages retrieved and given to the decoder
    # cross-encoder reranking the first stage's best (rag.retrieval.rerank.resolve_reranker):
    # auto = minilm-rerank under $RAG_HOME/models when `make models` trained it, else no rerank;
    # none = no rerank; or a cross-encoder folder/artefact name
    rerank: str | None = RETRIEVAL.rerank
    # candidates the reranker re-scores (one forward pass each: latency)
    rerank_depth: int = RETRIEVAL.rerank_depth
    # tokens per query+passage pair; None = the length the reranker was trained and saved with
    rerank_max_length: int | None = RETRIEVAL.rerank_max_length
    # reranker's share of a reranked passage's score: w * norm(rerank) + (1 - w) * norm(first
    # stage), in [0, 1]; 1 = reranker order only, 0 = first-stage order
    # (rag.retrieval.fusion.interpolate)
    rerank_weight: float = RETRIEVAL.rerank_weight
    # the reranker's weights (rag.precision): auto = bf16 on CUDA or a CPU with bf16 units (AMX),
    # else fp32 | fp32 | bf16 | int8 (CPU); same ranking quality, measured in docs/retrieval.md
    rerank_precision: str = RETRIEVAL.rerank_precision
    # hybrid fusion: convex (min-max normalised scores) or rrf (ranks; rag.retrieval.fusion).
    # convex with alpha 0.5 is the best measured (docs/retrieval.md: SciFact dev ties RRF, SQuAD
    # dev +0.03)
    fusion: str = RETRIEVAL.fusion  # hybrid fusion: convex (normalised scores) | rrf (ranks)
    # dense weight in hybrid fusion (chosen on train queries: 0.5 / 0.4)
    alpha: float = RETRIEVAL.alpha
    mode: str = RETRIEVAL.mode  # retrieval mode
    # document filter (rag.retrieval.filters): path=GLOB on the relative path, type=pdf,md;
    # several clauses are ANDed (values within one ORed)
    where: list[str] = field(default_factory=lambda: list(RETRIEVAL.where))
    temperature: float = 0.0  # 0 = greedy decoding (deterministic); > 0 samples
    top_p: float = 1.0  # nucleus sampling mass when temperature > 0
    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS  # answer length limit in decoder tokens
    max_context_tokens: int | None = 2048  # prompt+answer cap below the decoder's max positions
    min_score: float | None = None  # relevance threshold on hit scores; None = per-mode default
    prefix_cache: bool = True  # reuse the KV cache of the fixed system prompt across questions
    # keys and values of recent prompts kept per decoder and reused by their longest shared token
    # prefix (passages another request already read: rag.generate.prompt_cache); MB, 0 = off
    prompt_cache_mb: int = DEFAULT_PROMPT_CACHE_MB
    batching: bool = (
        True  # decode concurrent requests together (rag.generate.batching; 3.2x req/s measured)
    )
    max_batch: int = 16  # rows per decode step when batching is on
    # requests that arrive together are prefilled in padded forwards of at most this many tokens
    # (rows x longest suffix; rag.generate.batching.plan_prefill): bounds the memory of one forward
    max_prefill_tokens: int = 4096
    # check each cited sentence against the passage it names; re-attribute or flag (rag.answer.verify)
    verify_citations: bool = True
    # when the answer cites nothing (and is no refusal), append the passage marker [i] the decoder
    # itself scores likeliest after its answer; Answer.citations_completed records it
    complete_citations: bool = True
    # refusal gate (rag.answer.refusal): refuse only when p(refusal | prompt) >= this, else decode the
    # answer with the refusal barred; None = the adapter's tuned threshold (its run.json), and
    # without one the decoder's greedy choice stands
    refusal_threshold: float | None = None
    # answerability check (rag.answer.answerability): refuse without decoding when p(unanswerable),
    # from the best passage's cosine and the query's IDF coverage, is >= this; none = off
    answerability_threshold: float | None = DEFAULT_MODEL.threshold
    # extractive reader (rag.answer.reader) that finds the answer span before anything is
    # decoded: auto = minilm-reader under $RAG_HOME/models when `make models` trained it, else
    # none; none = off (the decoder answers over every passage); or a reader folder/artefact
    reader: str | None = DEFAULT_READER
    # the reader answers when its best span beats "not in this passage" by this margin; None =
    # the threshold its training run chose on train questions (reader.json)
    reader_threshold: float | None = None
    # who writes the answer around the reader's span: decoder (one to three sentences from the
    # span's passage alone) | extract (that passage's own sentence; nothing decoded: fastest)
    compose: str = "decoder"
    # decoder tokens of excerpts the encoder keeps from the retrieved passages for the decoder
    # to answer from (rag.answer.evidence: the sentences that answer, a fraction of the
    # passages' length); 0 = the whole passages (the k-passage prompt)
    evidence_tokens: int = DEFAULT_EVIDENCE_TOKENS
    # passages retrieved for the encoder to read when excerpts are on (k when larger): it reads
    # more than a prompt of whole passages could hold, so the answer is found further down
    evidence_passages: int = DEFAULT_EVIDENCE_PASSAGES
    # the decoder's inference engine (rag.generate.ov_engine): auto = OpenVINO GenAI where it
    # runs the decoder (a GGUF decoder on the CPU, no LoRA adapter), else torch | torch |
    # openvino
    engine: str = "auto"
    device: str = RETRIEVAL.device  # where the models run; auto = cuda when a GPU is visible
    # query encoder runtime: onnx = ONNX Runtime on CPU, same embeddings (rag.retrieval.encoder)
    encoder_backend: str = RETRIEVAL.encoder_backend
    # decoder weights (rag.precision): auto = bf16 on CUDA or a CPU with bf16 units (AMX), else
    # fp32 | fp32 | bf16 | int8 = decode steps through int8 copies of the linear layers (CPU;
    # the prompt runs on the auto float weights; measured by benchmarks.decode_variants)
    decoder_precision: str = "auto"
    # prompt format (rag.prompt.PROFILES): auto = the decoder's measured best (rag.models)
    profile: str = "auto"
    # decoder speed (rag.generate.speed; measured by benchmarks.decode_variants), off by default:
    # torch.compile the decoder's forward (dynamic cache) or generate's decode step (static cache)
    decoder_compile: bool = False
    # KV cache: dynamic (grows per token) | static (preallocated; needs --no-batching)
    cache_implementation: str = "dynamic"
    # Hook (not from TOML/CLI): turns (question, history) into a standalone retrieval query.
    rewrite_query: Callable[[str, list[tuple[str, str]]], str] | None = field(
        default=None, repr=False, compare=False
    )

    # The value sets of the fields that have one: validate() checks them (values from TOML or
    # code) and the CLIs take them as argparse choices (rag.dataclass_cli).
    CHOICES: ClassVar[dict[str, tuple[str, ...]]] = {
        "mode": MODES,
        "compose": COMPOSE,
        "fusion": FUSIONS,
        "device": DEVICES,
        "encoder_backend": ENCODER_BACKENDS,
        "rerank_precision": PRECISION_SETTINGS,
        "decoder_precision": PRECISION_SETTINGS,
        "profile": ("auto", *PROFILES),
        "cache_implementation": CACHE_IMPLEMENTATIONS,
        "engine": ENGINES,
    }

    def __post_init__(self) -> None:
        validate(self)

    @property
    def retrieval(self) -> RetrievalSettings:
        """The retrieval settings of this config: how every path opens its index."""
        return RetrievalSettings.from_config(self)

    def to_dict(self) -> dict[str, Any]:
        """Plain values for ``run.json`` / ``--json`` (the rewrite hook is shown by name)."""
        d = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "rewrite_query"}
        hook = self.rewrite_query
        d["rewrite_query"] = getattr(hook, "__qualname__", repr(hook)) if hook else None
        return d


def validate(cfg: RAGConfig) -> None:
    """Reject values that would only fail later, deep inside retrieval or decoding."""
    for name, values in RAGConfig.CHOICES.items():
        if getattr(cfg, name) not in values:
            raise ConfigError(
                f"{name} must be one of {', '.join(values)}, not {getattr(cfg, name)!r}"
            )
    for name in (
        "k",
        "max_new_tokens",
        "max_batch",
        "max_prefill_tokens",
        "rerank_depth",
        "evidence_passages",
    ):
        if int(getattr(cfg, name)) < 1:
            raise ConfigError(f"{name} must be >= 1, not {getattr(cfg, name)!r}")
    if not 0 <= cfg.alpha <= 1:
        raise ConfigError(f"alpha must be in [0, 1], not {cfg.alpha}")
    if not 0 <= cfg.rerank_weight <= 1:
        raise ConfigError(f"rerank_weight must be in [0, 1], not {cfg.rerank_weight}")
    t = cfg.refusal_threshold
    if t is not None and not 0 < t <= 1:
        raise ConfigError(f"refusal_threshold must be in (0, 1] or none, not {t}")
    t = cfg.answerability_threshold
    if t is not None and not 0 < t <= 1:
        raise ConfigError(f"answerability_threshold must be in (0, 1] or none, not {t}")
    if cfg.temperature < 0:
        raise ConfigError(f"temperature must be >= 0, not {cfg.temperature}")
    if cfg.evidence_tokens < 0:
        raise ConfigError(
            f"evidence_tokens must be >= 0 (0 = whole passages), not {cfg.evidence_tokens}"
        )
    if cfg.prompt_cache_mb < 0:
        raise ConfigError(f"prompt_cache_mb must be >= 0 (0 = off), not {cfg.prompt_cache_mb}")
    if not 0 < cfg.top_p <= 1:
        raise ConfigError(f"top_p must be in (0, 1], not {cfg.top_p}")
    try:
        DecodeSpeed.from_config(cfg).check(device=cfg.device, batching=cfg.batching)
    except DecodeSpeedError as e:
        raise ConfigError(str(e)) from e
    try:
        cfg.retrieval  # noqa: B018 - the retrieval settings' own checks
    except ValueError as e:
        raise ConfigError(str(e)) from e


def settings() -> dict[str, tuple[type, bool]]:
    """Field -> (type, accepts None) for every setting (the rewrite hook is code, not a setting)."""
    hints = typing.get_type_hints(RAGConfig)
    out = {}
    for f in fields(RAGConfig):
        tp, _, optional = field_type(hints[f.name])
        if tp in (str, int, float, bool):
            out[f.name] = (tp, optional)
    return out


def _coerce(name: str, value: Any, source: str) -> Any:
    """Check a TOML value against the field's annotated type (TOML has no null: use "none");
    a list field takes a list of its type, or one value."""
    tp, optional = settings()[name]
    if field_type(typing.get_type_hints(RAGConfig)[name])[1]:
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
    """Field values from a TOML file (top level or ``[rag]``); unknown keys are an error."""
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
    known = settings()
    out: dict[str, Any] = {}
    for key, value in data.items():
        name = key.replace("-", "_")
        if name in INGEST_KEYS:
            raise ConfigError(
                f"{path}: {key!r} is an ingest setting, not read when answering: pass "
                f"--{name.replace('_', '-')} to python -m rag.ingest instead"
            )
        if name not in known:
            raise ConfigError(f"{path}: unknown key {key!r} (known: {', '.join(sorted(known))})")
        out[name] = _coerce(name, value, str(path))
    return out


def _layers(path: str | Path | None, given: dict[str, Any]) -> RAGConfig:
    """Defaults ← ``path`` (or ``./rag.toml`` when present) ← ``given`` (every value wins)."""
    values: dict[str, Any] = {}
    if path is not None:
        if not Path(path).is_file():
            raise ConfigError(f"--config {path}: no such file")
        values.update(read_toml(path))
    elif Path(DEFAULT_CONFIG_FILE).is_file():
        values.update(read_toml(DEFAULT_CONFIG_FILE))
    known = set(settings()) | {"rewrite_query"}
    for key, value in given.items():
        name = key.replace("-", "_")
        if name not in known:
            raise ConfigError(f"unknown config override {key!r}")
        values[name] = value
    return RAGConfig(**values)


def load_config(
    path: str | Path | None = None, overrides: dict[str, Any] | None = None
) -> RAGConfig:
    """Defaults ← ``path`` (or ``./rag.toml`` when present) ← ``overrides`` (None values skipped).

    An explicit ``path`` that does not exist is an error; a missing ``./rag.toml`` is not.
    """
    return _layers(path, {k: v for k, v in (overrides or {}).items() if v is not None})


# What --help says for fields whose comment is written for the code rather than the command line.
CLI_HELP = {
    "index": "index name under $RAG_HOME/indexes",
    "encoder": "query encoder alias/folder; none = the one the index was built with",
    "rerank": "cross-encoder reranking the retrieved candidates: auto = minilm-rerank when "
    "`make models` trained it (else no rerank); none = off; or a folder/artefact name",
    "rerank_depth": "candidates the reranker re-scores (one forward pass each: latency)",
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
    names: Sequence[str] | None = None,
    **options: Any,
) -> list[str]:
    """``--kebab-case`` flags for RAGConfig fields (all, or ``names``), built like every flag of
    the project (rag.dataclass_cli) but layered: a flag not given stays out of the namespace,
    so the TOML value or the dataclass default stays in force (``--help`` shows the default)."""
    kwargs = {**FLAG_KWARGS, **options.pop("kwargs", {})}
    options = {"help": {**CLI_HELP, **options.pop("help", {})}, "kwargs": kwargs, **options}
    return add_dataclass_args(parser, RAGConfig, only=names, layered=True, **options)


def config_from_args(args: argparse.Namespace, config_path: str | Path | None = None) -> RAGConfig:
    """RAGConfig from the flags given over the TOML file over the defaults; a flag given as
    ``none`` overrides the file too."""
    return _layers(config_path, {n: getattr(args, n) for n in settings() if hasattr(args, n)})


def with_overrides(cfg: RAGConfig, **kwargs: Any) -> RAGConfig:
    """A copy of ``cfg`` with the non-None ``kwargs`` applied (validated)."""
    return replace(cfg, **{k: v for k, v in kwargs.items() if v is not None})


# ---- the models a config names ------------------------------------------------------------------


def check_models(cfg: RAGConfig) -> None:
    """Fail now, naming the flag, on a model name that is no alias, folder or artefact (or a
    ``--rerank`` that is no cross-encoder): the decoder is loaded only when something relevant
    was retrieved, so a typo in ``--decoder`` would otherwise pass unnoticed on a question the
    documents do not answer. Every front end (rag.ask, rag.serve, the UI) checks through here."""
    aliases = {*ENCODER_ALIASES, *DECODER_ALIASES}
    for flag, name in (
        ("--encoder", cfg.encoder),
        ("--decoder", cfg.decoder),
        ("--adapter", cfg.adapter),
    ):
        if not name or name in aliases or name in ("auto", "none"):
            continue
        if Path(name).expanduser().exists():
            continue
        try:
            resolve_model(name)
        except ModelNotFoundError as e:
            raise ModelNotFoundError(f"{flag}: {e}") from None
    try:  # auto and none never fail; an explicit cross-encoder must exist and be one
        resolve_reranker(cfg.rerank)
    except ModelNotFoundError as e:
        raise ModelNotFoundError(f"--rerank: {e}") from None
    except ValueError as e:
        raise ValueError(f"--rerank: {e}") from None
    resolve_reader(cfg.reader)  # auto and none never fail; a missing one names --reader
    if cfg.engine == "openvino":  # where it cannot run the decoder: one line saying why
        engine_for(cfg, "cuda" if cfg.device == "cuda" else "cpu")


def engine_for(cfg: RAGConfig, device: str | None = None) -> str:
    """The engine the decoder runs on (``torch`` or ``openvino``): ``cfg.engine`` resolved for
    its decoder, adapter and ``device`` (None: the config's, ``auto`` resolved, which imports
    torch) by :func:`rag.generate.engines.choose_engine`."""
    from rag.generate.engines import choose_engine

    if device is None:
        from rag.models import pick_device

        device = pick_device(cfg.device)
    return choose_engine(cfg.engine, cfg.decoder, resolve_adapter(cfg.decoder, cfg.adapter), device)


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
    rerank = resolve_reranker(cfg.rerank)
    adapter = resolve_adapter(cfg.decoder, cfg.adapter)
    engine = "OpenVINO GenAI" if engine_for(cfg) == "openvino" else "torch"
    return ResolvedModels(
        replace(cfg, adapter=adapter, rerank=rerank),
        describe_decoder(cfg.decoder, cfg.adapter).replace(
            str(cfg.decoder), f"{cfg.decoder} on {engine}", 1
        ),
        describe_reranker(cfg.rerank, rerank),
        describe_reader(cfg.reader),
    )
