"""Models: aliases, resolution, kinds and loading, for every CLI, the UI, training and evals.

- :mod:`rag.models.registry`: the aliases, :func:`resolve_model`, what kind a folder holds, the
  decoder and adapter policy (profiles, refusal thresholds), devices, :func:`load_embedder`;
- :mod:`rag.models.gguf`: GGUF part packages (joined, sha256-checked, converted once) and the GGUF
  folder the OpenVINO engine reads;
- :mod:`rag.models.zip_parts`: zip part packages (mpnet);
- :mod:`rag.models.precision`: the one precision vocabulary (fp32 | bf16 | int8 | auto);
- :mod:`rag.models.loading`: the process-wide model load lock.

Loading a decoder (:func:`rag.generate.load.load_generator`) is in :mod:`rag.generate`, which
imports this package, never the reverse. The registry's names are re-exported here, so
``from rag.models import resolve_model`` reads as before.
"""

from __future__ import annotations

from rag.models.registry import (
    BASE_ENCODER,
    DECODER_ALIASES,
    DECODER_PROFILES,
    DEFAULT_ADAPTER,
    DEFAULT_DECODER,
    ENCODER_ALIASES,
    FACTOID_DECODER,
    GGUF_PACKAGES,
    SMOLLM2_GGUF,
    TUNED_ENCODER,
    ZIP_PACKAGES,
    ModelNotFoundError,
    auto_adapter_name,
    check_cross_encoder,
    default_encoder,
    describe_decoder,
    is_cross_encoder,
    is_decoder,
    is_sentence_transformer,
    list_artifacts,
    list_models,
    lm_objective,
    load_embedder,
    minilm_path,
    pick_device,
    pick_profile,
    pick_refusal_threshold,
    resolve_adapter,
    resolve_factoid_decoder,
    resolve_model,
    smollm2_gguf_path,
    smollm2_path,
    span_only_adapter,
)

__all__ = [
    "BASE_ENCODER",
    "DECODER_ALIASES",
    "DECODER_PROFILES",
    "DEFAULT_ADAPTER",
    "DEFAULT_DECODER",
    "ENCODER_ALIASES",
    "FACTOID_DECODER",
    "GGUF_PACKAGES",
    "SMOLLM2_GGUF",
    "TUNED_ENCODER",
    "ZIP_PACKAGES",
    "ModelNotFoundError",
    "auto_adapter_name",
    "check_cross_encoder",
    "default_encoder",
    "describe_decoder",
    "is_cross_encoder",
    "is_decoder",
    "is_sentence_transformer",
    "list_artifacts",
    "list_models",
    "lm_objective",
    "load_embedder",
    "minilm_path",
    "pick_device",
    "pick_profile",
    "pick_refusal_threshold",
    "resolve_adapter",
    "resolve_factoid_decoder",
    "resolve_model",
    "smollm2_gguf_path",
    "smollm2_path",
    "span_only_adapter",
]
