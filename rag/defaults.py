"""Values that several modules and command lines share, each defined here once.

Why a module of its own, with no imports: the retrieval modes and devices, and the
default chunk and answer sizes are read by the config (rag.config), every CLI (their flags take
``choices`` from here), ingest, retrieval, the UI, the evals and training. Written in each of them
they drifted (three mode lists, chunk size five times); imported from here they cannot, and
importing them costs nothing (no torch, no index library).

Sets of values owned by one subsystem stay beside it and are imported from there:
``indexes.BACKENDS``, ``rag.retrieval.encoder.ENCODER_BACKENDS``, ``rag.retrieval.fusion.FUSIONS``,
``rag.answer.prompt.PROFILES``, and the one precision vocabulary of every model,
``rag.models.precision.PRECISION_SETTINGS``; the settings' defaults are their sections'
(``rag.retrieval.settings``, ``rag.answer.settings``, ``rag.generate.settings``).
"""

from __future__ import annotations

MODES = ("dense", "bm25", "hybrid")  # retrieval: the encoder's vectors, BM25, or both fused
DEVICES = ("auto", "cpu", "cuda")  # auto = cuda when a GPU is visible, else cpu

DEFAULT_CHUNK_TOKENS = 256  # ingest: chunk size in encoder tokens (capped at the encoder's limit)
DEFAULT_OVERLAP = 32  # ingest: tokens shared by consecutive chunks of a section
DEFAULT_MAX_NEW_TOKENS = 256  # answer length limit in decoder tokens (rag.ask, rag.serve, evals)
# decoding: MB of recent prompts' keys and values kept per decoder (rag.generate.prompt_cache);
# about 40 prompts of ~1,000 tokens for Qwen2.5-0.5B in bf16, 20 for SmolLM2-135M
DEFAULT_PROMPT_CACHE_MB = 512
# OpenVINO engine: tokens prompt lookup decoding proposes per step (0 = off; docs/benchmarks.md)
DEFAULT_PROMPT_LOOKUP = 5
