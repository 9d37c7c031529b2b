"""Retrieval settings: everything a search is opened with, in one dataclass whose defaults are
the only retrieval defaults in the project.

Why: the settings used to travel as about ten loose keyword arguments whose defaults disagreed
(the config said convex fusion and an ``auto`` reranker precision; ``Retriever``,
``CorpusRetriever`` and ``SearchEngine`` defaulted to RRF, ``Retriever.open`` to fp32), and one
entry point passed three of them, so the same index answered differently named
(``rag.ask --index pydocs``: convex fusion and the reranker) and given as a folder
(``--index-dir``: RRF, no reranker). Now every path builds a :class:`RetrievalSettings` (the
``retrieval`` section of :class:`rag.config.RAGConfig`, ``rag.toml``'s ``[retrieval]`` table, or
any config or parsed flags with the same field names: :meth:`RetrievalSettings.from_config`) and
opens its retriever with :meth:`rag.retrieval.retriever.Retriever.from_settings`.

The measured choices behind the defaults are in docs/retrieval.md: convex fusion at alpha 0.5,
the reranker over the first stage's best 10 at weight 0.5, bf16 reranker weights where bf16
runs fast.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any, ClassVar

from rag.defaults import DEVICES, MODES
from rag.models.precision import check_precision
from rag.retrieval.duplicates import DEFAULT_DEDUP, check_dedup
from rag.retrieval.encoder import ENCODER_BACKENDS
from rag.retrieval.filters import Where
from rag.retrieval.fusion import FUSIONS, NORMS, check_fusion, check_rerank_weight


@dataclass(frozen=True)
class RetrievalSettings:
    """How to retrieve; every field has the product's default (module docstring)."""

    mode: str = "hybrid"  # dense (encoder + vector index) | bm25 | hybrid (both, fused)
    k: int = 5  # hits a search returns when the caller does not say
    fusion: str = "convex"  # hybrid fusion: convex (normalised scores) | rrf (ranks)
    alpha: float = 0.5  # dense weight in hybrid fusion, in [0, 1]
    norm: str = "minmax"  # convex fusion's score normalisation: minmax | zscore
    depth: int = 100  # candidates each first-stage retriever contributes to fusion
    # cross-encoder of the rerank stage (rag.retrieval.rerank.resolve_reranker): auto = the
    # trained minilm-rerank when present, else none; none = no rerank; or a folder/artefact name
    rerank: str | None = "auto"
    rerank_depth: int = 10  # candidates the reranker re-scores (one forward pass each: latency)
    rerank_weight: float = 0.5  # reranker share of a reranked score, in [0, 1] (fusion.interpolate)
    rerank_precision: str = (
        "auto"  # reranker weights: auto | fp32 | bf16 | int8 (rag.models.precision)
    )
    rerank_max_length: int | None = None  # tokens per query+passage pair; None = the model's
    encoder: str | None = None  # query encoder alias/folder; None = the one the index records
    encoder_backend: str = "torch"  # query encoder runtime: torch | onnx (rag.retrieval.encoder)
    device: str = "auto"  # where the encoder and reranker run; auto = cuda when visible
    # document filter of every search that names none (rag.retrieval.filters): KEY=VALUE
    # clauses, ANDed: path=GLOB (relative path), type=pdf,md (values ORed)
    where: tuple[str, ...] = ()
    # correct a question's typos before it is searched, checked and answered: a lower-case word
    # no chunk holds becomes the index word one edit away (rag.retrieval.spelling)
    correct_typos: bool = True
    # leave out a hit whose text is a near-copy of a better hit's (the same page as .html and
    # .md, a PDF and its .docx): the share of the shorter's word trigrams the other holds at
    # or above which it is one (rag.retrieval.duplicates); none = keep every hit
    dedup: float | None = DEFAULT_DEDUP

    # The value sets of the fields that have one: checked here, argparse choices on every CLI.
    CHOICES: ClassVar[dict[str, tuple[str, ...]]] = {
        "mode": MODES,
        "fusion": FUSIONS,
        "norm": NORMS,
        "encoder_backend": ENCODER_BACKENDS,
        "device": DEVICES,
    }

    def __post_init__(self) -> None:
        # one spelling (and a checked one) for every caller: lists from TOML, strings, a Where
        object.__setattr__(self, "where", tuple(Where.parse(self.where).to_list()))
        if self.mode not in MODES:
            raise ValueError(f"--mode must be one of {', '.join(MODES)}, not {self.mode!r}")
        check_fusion(self.fusion, self.alpha, self.norm)
        check_rerank_weight(self.rerank_weight)
        check_dedup(self.dedup)
        check_precision(self.rerank_precision, "--rerank-precision")
        for name in ("k", "depth", "rerank_depth"):
            if int(getattr(self, name)) < 1:
                flag = name.replace("_", "-")
                raise ValueError(f"--{flag} must be positive, not {getattr(self, name)}")
        if self.encoder_backend not in ENCODER_BACKENDS:
            raise ValueError(
                f"--encoder-backend must be one of {', '.join(ENCODER_BACKENDS)}, "
                f"not {self.encoder_backend!r}"
            )
        if self.device not in DEVICES:
            raise ValueError(f"--device must be one of {', '.join(DEVICES)}, not {self.device!r}")

    @classmethod
    def from_config(cls, config: Any, **changes: Any) -> RetrievalSettings:
        """The settings ``config`` holds: its ``retrieval`` section when it has one (a
        :class:`rag.config.RAGConfig`), else every field of this class that ``config`` (an
        eval's config, an ``argparse.Namespace`` of the same flags) has under the same name;
        the others keep their defaults. ``changes`` win."""
        section = getattr(config, "retrieval", None)
        if isinstance(section, cls):
            return section.replace(**changes) if changes else section
        have = {f.name: getattr(config, f.name) for f in fields(cls) if hasattr(config, f.name)}
        return cls(**{**have, **changes})

    def replace(self, **changes: Any) -> RetrievalSettings:
        """A copy with ``changes`` applied (checked again)."""
        return replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


DEFAULTS = RetrievalSettings()
