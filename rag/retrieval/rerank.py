"""The rerank stage's models: anything with ``score(query, texts)``, and a sentence-transformers
``CrossEncoder`` loaded from a local folder, alias or artefact name (nothing downloads).

Also the one meaning of the ``rerank`` setting (:func:`resolve_reranker`): ``auto`` (the
default) = the ``minilm-rerank`` artefact ``make models`` trains, when it is there; ``none`` =
no rerank stage; anything else = that cross-encoder. The CLIs, the pipeline, the server and the
UI all resolve through it, so they agree on what runs and can name it.

Kept apart from :mod:`rag.retrieval.retriever` so that module stays about searching;
``sentence_transformers`` is imported only when a cross-encoder is loaded. :func:`load_reranker`
builds the stage a :class:`~rag.retrieval.settings.RetrievalSettings` asks for.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Protocol

import numpy as np

from rag.models import ModelNotFoundError, check_cross_encoder, is_cross_encoder, resolve_model
from rag.models.loading import MODEL_LOAD_LOCK
from rag.models.precision import check_precision, quantize_dynamic_int8, resolve_precision, to_bf16
from rag.retrieval.settings import RetrievalSettings
from rag.storage.paths import models_dir

log = logging.getLogger("rag.retrieval.rerank")

# ``auto`` (the default ``rerank`` setting, rag.retrieval.settings) finds AUTO_RERANKER, the
# cross-encoder `make models` writes (python -m training.finetune.rerank) under $RAG_HOME/models.
AUTO = "auto"
AUTO_RERANKER = "minilm-rerank"


class Reranker(Protocol):
    """Anything that scores (query, passage) pairs; higher is more relevant."""

    def score(self, query: str, texts: list[str]) -> list[float]: ...


class CrossEncoderReranker:
    """A sentence-transformers ``CrossEncoder`` from a local folder, alias or artefact name
    (``minilm-rerank`` = ``$RAG_HOME/models/minilm-rerank``, what ``python -m training.finetune.rerank``
    writes); nothing downloads. ``max_length`` truncates each (query, passage) pair (None: the
    length the folder was saved with). Scores are raw logits: the order is the model's, and
    unlike its sigmoid they never saturate into ties. ``precision`` ``int8`` quantises the
    transformer's Linear layers with the bi-encoder's recipe
    (:func:`rag.models.precision.quantize_dynamic_int8`; the scoring head stays fp32) and runs on CPU, so
    ``device`` ``auto`` means CPU there; ``bf16`` casts the whole model to bfloat16
    (:func:`rag.models.precision.to_bf16`); ``auto`` is bf16 where it runs fast, else fp32."""

    def __init__(
        self,
        model: str | Path,
        device: str = "auto",
        batch_size: int = 32,
        max_length: int | None = None,
        precision: str = "auto",
    ):
        from sentence_transformers import CrossEncoder

        from rag.models import pick_device

        if check_precision(precision, "--rerank-precision") == "auto":
            precision = resolve_precision(precision, pick_device(device))
        if precision == "int8":
            if device == "cuda":
                raise ValueError("an int8 reranker runs on CPU only; use --device cpu")
            device = "cpu"

        try:
            path = resolve_model(model)
        except ModelNotFoundError as e:
            raise ModelNotFoundError(
                f"{e}; a reranker is trained with `python -m training.finetune.rerank`"
            ) from None
        check_cross_encoder(path)
        with MODEL_LOAD_LOCK:
            self.model = CrossEncoder(
                str(path), device=pick_device(device), local_files_only=True, max_length=max_length
            )
        if precision == "int8":  # the transformer only: the head is a few fp32 multiply-adds
            quantize_dynamic_int8(self.model.model.base_model)
        elif precision == "bf16":
            to_bf16(self.model.model)
        self.name, self.batch_size, self.precision = str(model), batch_size, precision

    def score(self, query: str, texts: list[str]) -> list[float]:
        if not texts:
            return []
        import torch

        scores = self.model.predict(
            [(query, t) for t in texts],
            batch_size=self.batch_size,
            show_progress_bar=False,
            activation_fn=torch.nn.Identity(),
        )
        return [float(s) for s in np.asarray(scores).reshape(len(texts), -1)[:, -1]]


def load_reranker(settings: RetrievalSettings) -> CrossEncoderReranker | None:
    """The rerank stage ``settings`` ask for: the cross-encoder :func:`resolve_reranker` names
    for ``settings.rerank``, loaded with the settings' device, pair length and precision; None
    when reranking is off (``none``, or ``auto`` with no trained reranker)."""
    name = resolve_reranker(settings.rerank)
    if name is None:
        return None
    return CrossEncoderReranker(
        name,
        device=settings.device,
        max_length=settings.rerank_max_length,
        precision=settings.rerank_precision,
    )


def is_off(setting: str | Path | None) -> bool:
    """Whether a rerank setting turns the stage off: None (code), "" or ``none`` (CLI, TOML)."""
    return setting is None or str(setting).strip().lower() in ("", "none")


def auto_reranker() -> str | None:
    """:data:`AUTO_RERANKER` when that artefact is under ``$RAG_HOME/models`` and is a valid
    cross-encoder, else None. A folder that is there but no cross-encoder (an interrupted
    training run) is passed over with a warning: ``auto`` means "when present", never an error."""
    path = models_dir() / AUTO_RERANKER
    if not path.is_dir():
        return None
    if not is_cross_encoder(path):
        log.warning("reranker auto: %s is no valid cross-encoder; reranking off", path)
        return None
    return AUTO_RERANKER


def resolve_reranker(setting: str | Path | None) -> str | None:
    """The cross-encoder the rerank stage loads for a ``rerank`` setting, or None for none.

    ``auto`` → :func:`auto_reranker` (the trained ``minilm-rerank`` when present, else None);
    None / ``none`` → None; anything else is returned as given once it resolves to a
    cross-encoder: an unknown name raises :class:`~rag.models.ModelNotFoundError` naming it,
    a folder that is no cross-encoder ValueError (an explicit choice that cannot run is an
    error, not a silent fallback). Every caller (rag.ask, rag.search, rag.serve, the UI, the
    pipeline) goes through here, so what ``auto`` means, and the name answers show, is the
    same everywhere; the choice is logged at INFO."""
    if is_off(setting):
        log.info("reranker: none (no rerank stage)")
        return None
    name = str(setting).strip()
    if name == AUTO:
        found = auto_reranker()
        if found:
            log.info("reranker: %s (auto: found under %s)", found, models_dir())
        else:
            log.info(
                "reranker: auto found no %s under %s; no rerank stage", AUTO_RERANKER, models_dir()
            )
        return found
    try:
        path = resolve_model(name)
    except ModelNotFoundError as e:
        what = str(e).replace("unknown model", "unknown reranker", 1)
        raise ModelNotFoundError(
            f"{what}; a reranker is trained with `python -m training.finetune.rerank` (or use auto / none)"
        ) from None
    check_cross_encoder(path)
    log.info("reranker: %s", name)
    return name


def describe_reranker(setting: str | Path | None, resolved: str | None) -> str:
    """One line for people: which cross-encoder reranks (``resolved``, from
    :func:`resolve_reranker`) and whether ``auto`` chose it, or that reranking is off."""
    auto = not is_off(setting) and str(setting).strip() == AUTO
    if resolved:
        return f"{resolved} (auto)" if auto else resolved
    return f"off (auto: no {AUTO_RERANKER} trained yet: `make models`)" if auto else "off"
