"""Shared helpers for the UI tests (test_ui_browser.py, test_ui_api.py): a tiny corpus and
index built through ``rag.ingest``, a scripted decoder, and an app served on a free loopback port.

Only the decoder is scripted: a tiny random decoder never writes a citation marker, so
:class:`ScriptedGenerator` stands in for ``rag.generate.generator.Generator`` through
``RAGPipeline(generator=...)`` (the pipeline's documented injection point), injected into the app
through ``build_app(pipeline_factory=...)``. It always answers "... [1]", i.e. it cites whatever
the real retriever ranked first; retrieval, citation parsing, rendering and the browser are real.
"""

from __future__ import annotations

import contextlib
import socket
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

CORPUS = {
    "files.md": (
        "# Python files\n\n## Opening a file\n\n"
        "Call open(path, mode) to open a file; it returns a file object. The mode 'r' reads text, "
        "'w' truncates and writes, 'a' appends and 'b' selects binary mode.\n\n"
        "## Closing a file\n\n"
        "Call close() on the file object, or use a with statement so the file is closed "
        "automatically when the block ends, even after an exception.\n"
    ),
    "git.md": (
        "# Git branches\n\n## Creating a branch\n\n"
        "git switch -c NAME creates a branch and switches to it. git branch lists branches.\n\n"
        "## Deleting a branch\n\n"
        "git branch -d NAME deletes a merged branch; -D forces deletion of an unmerged one.\n"
    ),
}
ANSWER_PIECES = ("According ", "to the ", "documents, ", "see ", "passage ", "[1]", ".")


class ScriptedGenerator:
    """Test-only stand-in for ``rag.generate.generator.Generator``: same methods, fixed reply citing [1]."""

    def __init__(self, pieces: Sequence[str] = ANSWER_PIECES, delay: float = 0.05):
        self.pieces = list(pieces)
        self.delay = delay  # between pieces, so the browser sees a real stream
        self.prompts: list[list[dict[str, str]]] = []

    def fit_passages(
        self, question: str, passages: Sequence[str], max_new_tokens: int = 256
    ) -> list[str]:
        return list(passages)

    def stream(
        self, messages: Sequence[dict[str, str]], *args: Any, stats: dict | None = None, **kw: Any
    ) -> Iterator[str]:
        self.prompts.append(list(messages))
        for piece in self.pieces:
            time.sleep(self.delay)
            yield piece

    def generate(self, messages: Sequence[dict[str, str]], *args: Any, **kw: Any) -> str:
        self.prompts.append(list(messages))
        return "".join(self.pieces)


def write_corpus(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in CORPUS.items():
        (folder / name).write_text(text, encoding="utf-8")
    return folder


def build_index(folder: Path, name: str, encoder: str) -> Any:
    """Ingest the tiny corpus into index ``name`` the same way ``python -m rag.ingest`` does."""
    from rag.ingest import ingest

    return ingest([write_corpus(folder)], index=name, encoder=encoder)


def scripted_factory(generator: ScriptedGenerator):
    """A ``pipeline_factory`` building the real RAGPipeline with the scripted decoder."""
    from rag.pipeline import RAGPipeline

    def factory(cfg):
        return RAGPipeline(cfg, generator=generator)

    return factory


@contextlib.contextmanager
def module_rag_home(tmp_path_factory) -> Iterator[Path]:
    """RAG_HOME for module-scoped fixtures: they run before conftest's autouse per-test patch,
    so point at the same temp folder that patch uses (never the checkout's artifacts/)."""
    import pytest

    home = tmp_path_factory.getbasetemp() / "rag_home"
    home.mkdir(exist_ok=True)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RAG_HOME", str(home))
        yield home


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def serve(index: str, factory, **overrides: Any) -> Iterator[tuple[str, Any]]:
    """Run ``ui.app`` on a free loopback port in this process; yields (url, demo)."""
    from ui.app import AppConfig, build_app, launch

    cfg = AppConfig.of(index=index, port=free_port(), preload=False, **overrides)
    demo = build_app(cfg, pipeline_factory=factory)
    launch(demo, cfg, prevent_thread_lock=True, quiet=True)
    try:
        yield f"http://127.0.0.1:{cfg.port}/", demo
    finally:
        demo.close()
