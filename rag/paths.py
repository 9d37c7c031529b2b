"""Where generated artefacts live: ``$RAG_HOME`` or ``artifacts/`` at the project root.

Layout (see docs/architecture.md)::

    artifacts/tokenizer/          AutoTokenizer folder
    artifacts/models/<name>/      HF folder + run.json + train_log.jsonl + loss.png
    artifacts/indexes/<name>/     manifest, vectors, BM25, chunks
    artifacts/evals/<run>/        results.json, tables, plots
"""

from __future__ import annotations

import os
from pathlib import Path

_PROJECT_ROOT = Path(__file__).resolve().parents[1]


def rag_home() -> Path:
    """The artefact root: ``$RAG_HOME`` if set, else ``artifacts/`` beside pyproject.toml
    (or under the working directory when the package is installed elsewhere)."""
    env = os.environ.get("RAG_HOME")
    if env:
        return Path(env).expanduser()
    if (_PROJECT_ROOT / "pyproject.toml").exists():
        return _PROJECT_ROOT / "artifacts"
    return Path.cwd() / "artifacts"


def models_dir() -> Path:
    return rag_home() / "models"


def indexes_dir() -> Path:
    return rag_home() / "indexes"


def evals_dir() -> Path:
    return rag_home() / "evals"


def tokenizer_dir() -> Path:
    return rag_home() / "tokenizer"


def shared_data_dir() -> Path | None:
    """``../shared/data`` beside the checkout (or ``$RAG_SHARED_DATA``), if it exists."""
    env = os.environ.get("RAG_SHARED_DATA")
    candidates = [Path(env)] if env else []
    candidates += [_PROJECT_ROOT.parent / "shared" / "data", Path.cwd().parent / "shared" / "data"]
    for c in candidates:
        if c.is_dir():
            return c
    return None
