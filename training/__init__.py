"""Pretraining and fine-tuning. Its modules import :mod:`rag` first, which keeps JAX (if another
library imports it) from preallocating a GPU (rag/__init__)."""

import rag  # noqa: F401
