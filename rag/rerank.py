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
    unlike its sigmoid they never saturate into ties."""

    def __init__(
        self,
        model: str | Path,
        device: str = "auto",
        batch_size: int = 32,
        max_length: int | None = None,
    ):
        from sentence_transformers import CrossEncoder

        from rag.models import ModelNotFoundError, pick_device, resolve_model

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
        self.name, self.batch_size = str(model), batch_size

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
