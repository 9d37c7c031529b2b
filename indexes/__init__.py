"""Vector index backends behind one interface (:class:`indexes.base.VectorIndex`).

Callers name a backend only as a string the user chose (``--backend``) or a manifest recorded;
everything that depends on which backend it is (where a generation's vectors live, how the next
generation is opened for writing, what happens after it is published, how a published one is
loaded for search) is decided here and in the backend classes, so ``rag/`` never branches on it.

- :func:`open_index` opens (or creates) one index at a path (the contract tests, tools);
- :func:`scratch_index` an index that lives only as long as the object (in-memory evals);
- :func:`open_for_generation` / :func:`load_generation` the index of one ingest generation;
- :func:`resolve_backend` fills in and checks ``--backend`` / ``--chroma-url``.

Backend modules (faiss, chromadb) are imported only when an index of theirs is opened, so
checking settings stays cheap.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from indexes.base import VectorIndex, VectorIndexError


@dataclass(frozen=True)
class _Backend:
    """Where a backend's class lives, and whether it can address a server by URL."""

    module: str
    cls: str
    takes_url: bool


_REGISTRY: dict[str, _Backend] = {
    "faiss": _Backend("indexes.faiss_index", "FaissIndex", takes_url=False),
    "chroma": _Backend("indexes.chroma_index", "ChromaIndex", takes_url=True),
}
BACKENDS = tuple(_REGISTRY)
DEFAULT_BACKEND = BACKENDS[0]  # a new index without a server URL
URL_BACKEND = next(name for name, b in _REGISTRY.items() if b.takes_url)  # the --chroma-url one
DEFAULT_COLLECTION = "rag"

__all__ = [
    "BACKENDS",
    "DEFAULT_BACKEND",
    "VectorIndex",
    "VectorIndexError",
    "index_class",
    "load_generation",
    "open_for_generation",
    "open_index",
    "resolve_backend",
    "scratch_index",
]


def _spec(backend: str) -> _Backend:
    try:
        return _REGISTRY[backend]
    except KeyError:
        raise VectorIndexError(
            f"unknown index backend {backend!r} (choose from: {', '.join(BACKENDS)})"
        ) from None


def index_class(backend: str) -> type[VectorIndex]:
    """The :class:`VectorIndex` subclass of ``backend`` (imports its module on first use)."""
    spec = _spec(backend)
    return getattr(importlib.import_module(spec.module), spec.cls)


def resolve_backend(
    backend: str | None,
    url: str | None,
    recorded: str | None = None,
    recorded_url: str | None = None,
) -> tuple[str, str | None]:
    """(backend, server URL) a run uses: ``backend`` as given, else the index's ``recorded`` one,
    else the URL backend when a URL is given, else :data:`DEFAULT_BACKEND`; ``url`` as given,
    else the recorded one when the backend takes a URL. ValueError for a URL given to a backend
    that takes none."""
    if backend is None:
        backend = recorded if recorded else (URL_BACKEND if url else DEFAULT_BACKEND)
    takes_url = _spec(backend).takes_url
    if url is None and recorded is not None and takes_url:
        url = recorded_url
    if url and not takes_url:
        raise ValueError(f"--chroma-url needs --backend {URL_BACKEND}")
    return backend, url


def open_index(
    backend: str,
    path: str | Path | None,
    dim: int,
    *,
    chroma_url: str | None = None,
    collection: str = DEFAULT_COLLECTION,
    **opts: Any,
) -> VectorIndex:
    """Open (or create) an index at ``path``. ``opts`` go to the backend (FAISS: ``kind``,
    ``gpu``, ...); ``chroma_url`` and ``collection`` only to a backend that uses them."""
    cls = index_class(backend)
    if _spec(backend).takes_url:
        return cls(path, dim, chroma_url=chroma_url, collection=collection, **opts)
    return cls(path, dim, **opts)


def scratch_index(backend: str, dim: int) -> VectorIndex:
    """An empty index whose storage (if any) is removed when the object goes (``close``)."""
    return index_class(backend).scratch(dim)


def open_for_generation(
    backend: str, root: Path, live: Path | None, staging: Path, dim: int, **options: Any
) -> VectorIndex:
    """The index the generation being built in ``staging`` will hold, starting from the
    ``live`` generation's (None for a new index). Write it with ``stage_changes``, then publish
    the generation (:func:`rag.storage.manifest.publish_generation`), then call ``reconcile``.
    ``options`` (``kind``, ``chroma_url``, ``collection``): a backend ignores those it lacks."""
    return index_class(backend).open_for_generation(root, live, staging, dim, **options)


def load_generation(backend: str, root: Path, gen: Path, dim: int, **options: Any) -> VectorIndex:
    """The index of the published generation ``gen`` under ``root``, opened for search."""
    return index_class(backend).load_generation(root, gen, dim, **options)
