"""The rerank stage's models: anything with ``score(query, texts)``, and a sentence-transformers
``CrossEncoder`` loaded from a local folder, alias or artefact name (nothing downloads).

Kept apart from :mod:`rag.retrieve` (which re-exports these names) so that module stays about
searching; ``sentence_transformers`` is imported only when a cross-encoder is loaded.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Protocol

import numpy as np

from rag.loading import MODEL_LOAD_LOCK


class Reranker(Protocol):
    """Anything that scores (query, passage) pairs; higher is more relevant."""

    def score(self, query: str, texts: list[str]) -> list[float]: ...


class CrossEncoderReranker:
    """A sentence-transformers ``CrossEncoder`` from a local folder, alias or artefact name
    (``minilm-rerank`` = ``$RAG_HOME/models/minilm-rerank``, what ``python -m training.rerank``
    writes); nothing downloads. ``max_length`` truncates each (query, passage) pair (None: the
    length the folder was saved with). Scores are raw logits: the order is the model's, and
    unlike its sigmoid they never saturate into ties. ``precision`` ``int8`` quantises the
    transformer's Linear layers with the bi-encoder's recipe (:func:`rag.encoding.quantize_int8`;
    the scoring head stays fp32) and runs on CPU, so ``device`` ``auto`` means CPU there."""

    def __init__(
        self,
        model: str | Path,
        device: str = "auto",
        batch_size: int = 32,
        max_length: int | None = None,
        precision: str = "fp32",
    ):
        from sentence_transformers import CrossEncoder

        from rag.encoding import PRECISIONS, quantize_int8
        from rag.models import ModelNotFoundError, pick_device, resolve_model

        if precision not in PRECISIONS:
            raise ValueError(
                f"reranker precision must be one of {', '.join(PRECISIONS)}, not {precision!r}"
            )
        if precision == "int8":
            if device == "cuda":
                raise ValueError("an int8 reranker runs on CPU only; use --device cpu")
            device = "cpu"

        try:
            path = resolve_model(model)
        except ModelNotFoundError as e:
            raise ModelNotFoundError(
                f"{e}; a reranker is trained with `python -m training.rerank`"
            ) from None
        check_cross_encoder(path)
        with MODEL_LOAD_LOCK:
            self.model = CrossEncoder(
                str(path), device=pick_device(device), local_files_only=True, max_length=max_length
            )
        if precision == "int8":  # the transformer only: the head is a few fp32 multiply-adds
            quantize_int8(self.model.model.base_model)
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


def check_cross_encoder(path: Path) -> None:
    """Refuse a folder that is not a cross-encoder (a bi-encoder such as ``minilm`` would load
    with a random scoring head and rerank at random): it must be saved as a sentence-transformers
    CrossEncoder or be a Hugging Face sequence-classification model."""
    st_cfg = path / "config_sentence_transformers.json"
    if st_cfg.is_file() and json.loads(st_cfg.read_text()).get("model_type") == "CrossEncoder":
        return
    hf_cfg = path / "config.json"
    archs = (json.loads(hf_cfg.read_text()).get("architectures") or []) if hf_cfg.is_file() else []
    if not (path / "modules.json").exists() and any(
        a.endswith("ForSequenceClassification") for a in archs
    ):
        return
    raise ValueError(
        f"{path} is not a cross-encoder (no CrossEncoder config, no sequence-classification "
        "head); train one with `python -m training.rerank`"
    )
