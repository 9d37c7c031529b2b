"""Shared fixtures. Tiny models are trained once per session on a small in-repo corpus."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("ANONYMIZED_TELEMETRY", "False")

from rag.paths import shared_data_dir  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """``../shared/data``; tests that use it skip with a reason when it is absent."""
    path = shared_data_dir()
    if path is None:
        pytest.skip("../shared/data is absent (set RAG_SHARED_DATA to its location)")
    return path


@pytest.fixture(autouse=True)
def _isolated_rag_home(tmp_path_factory, monkeypatch):
    """Every test writes artefacts under a temporary RAG_HOME, never into the checkout."""
    home = tmp_path_factory.getbasetemp() / "rag_home"
    home.mkdir(exist_ok=True)
    monkeypatch.setenv("RAG_HOME", str(home))
    yield
