"""Corpus embeddings computed once: a disk cache of :meth:`Encoder.encode` results under
``$RAG_HOME/cache/embeddings/``, for the evals that index the same corpus with the same encoder
again and again (``evals.retrieval`` rows and reruns, ``evals.qa``, ``evals.answerability``, the
division-of-labour experiment's baselines).

An entry is one ``.npz`` file (the vectors and the key they were computed under) named by a hash
of that key: the encoder's weights fingerprint, its modules' configuration (pooling,
normalisation, maximum length), precision, backend and prompt, and the corpus's content hash
(every text, in order). Any change to the model or the corpus gives another name, so a stale
entry is never read; an entry whose stored key or shape does not match, or that cannot be read,
counts as a miss and is rewritten. Writes go to a temporary file in the same folder and are
renamed into place, so a crash or a concurrent writer never leaves half an entry.

Why not ``sentence_transformers``' or the Hub's caches: those cache model files, not the
embeddings of a corpus, and an index built by ``rag.ingest`` is the product's own store (this
cache serves the in-memory :class:`rag.retrieval.retriever.CorpusRetriever` only).
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import time
import zipfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from rag.storage.paths import cache_dir

if TYPE_CHECKING:
    from rag.retrieval.encoder import Encoder

FORMAT = 1  # bump when the entry layout or what the key covers changes


def embeddings_dir() -> Path:
    """Where the entries live: ``$RAG_HOME/cache/embeddings``."""
    return cache_dir() / "embeddings"


def corpus_hash(texts: Sequence[str]) -> str:
    """sha256 over every text in order, each prefixed by its byte length (so ``["ab", "c"]``
    and ``["a", "bc"]`` differ)."""
    h = hashlib.sha256()
    for t in texts:
        b = t.encode("utf-8")
        h.update(len(b).to_bytes(8, "little"))
        h.update(b)
    return h.hexdigest()


def _modules(model: Any) -> list[Any]:
    """Each module's class and configuration (pooling mode, normalisation, maximum length,
    lower-casing): what turns the same weights into different vectors."""
    out = []
    for m in model if hasattr(model, "__iter__") else [model]:
        get = getattr(m, "get_config_dict", None)
        out.append([type(m).__name__, get() if callable(get) else {}])
    return out


def cache_key(encoder: Encoder, texts: Sequence[str], kind: str = "document") -> dict[str, Any]:
    """What the vectors of ``texts`` depend on (JSON-serialisable); its hash names the entry."""
    prompt = encoder.query_prompt if kind == "query" else encoder.document_prompt
    return {
        "format": FORMAT,
        "fingerprint": encoder.fingerprint,
        "precision": encoder.precision,
        "backend": encoder.backend,
        "max_seq_length": int(encoder.model.max_seq_length),
        "modules": _modules(encoder.model),
        "kind": kind,
        "prompt": prompt,
        "dim": encoder.dim,
        "corpus": corpus_hash(texts),
        "n": len(texts),
    }


def _key_name(key: dict[str, Any]) -> str:
    blob = json.dumps(key, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:32]


class EmbeddingCache:
    """The embeddings of whole corpora on disk, shared by every retriever of a command and by
    later runs. ``hits`` and ``misses`` count this object's lookups; :meth:`stats` is what the
    evals write into their JSON output."""

    def __init__(self, root: str | Path | None = None):
        self.root = Path(root) if root is not None else embeddings_dir()
        self.hits = self.misses = 0
        self.entries: list[dict[str, Any]] = []

    def path(self, key: dict[str, Any]) -> Path:
        return self.root / f"{_key_name(key)}.npz"

    def load(self, key: dict[str, Any]) -> np.ndarray | None:
        """The stored vectors for ``key``, or None when absent, unreadable or not this key's."""
        path = self.path(key)
        try:
            with np.load(path, allow_pickle=False) as z:
                stored = json.loads(str(z["key"]))
                vectors = np.asarray(z["vectors"], dtype=np.float32)
        except (FileNotFoundError, OSError, KeyError, ValueError, zipfile.BadZipFile):
            return None
        if stored != json.loads(json.dumps(key, default=str)):
            return None
        if vectors.shape != (key["n"], key["dim"]):
            return None
        return vectors

    def store(self, key: dict[str, Any], vectors: np.ndarray) -> Path:
        """Write the entry atomically (temporary file in the same folder, then a rename)."""
        path = self.path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.stem}-", suffix=".tmp", dir=path.parent)
        try:
            with os.fdopen(fd, "wb") as f:
                np.savez(
                    f,
                    vectors=np.asarray(vectors, dtype=np.float32),
                    key=np.array(json.dumps(key, default=str)),
                )
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return path

    def encode(
        self,
        encoder: Encoder,
        texts: Sequence[str],
        kind: str = "document",
        encode: Callable[[list[str]], np.ndarray] | None = None,
    ) -> np.ndarray:
        """``encoder.encode(texts, kind)``, from the cache when the same encoder has embedded the
        same texts before; ``encode`` (default: that call) computes a miss."""
        t0 = time.perf_counter()
        key = cache_key(encoder, texts, kind)
        vectors = self.load(key)
        hit = vectors is not None
        if vectors is None:
            vectors = (encode or (lambda xs: encoder.encode(xs, kind=kind)))(list(texts))
            self.store(key, vectors)
        self.hits += hit
        self.misses += not hit
        self.entries.append(
            {
                "entry": self.path(key).name,
                "hit": hit,
                "texts": len(texts),
                "seconds": round(time.perf_counter() - t0, 3),
            }
        )
        return vectors

    def stats(self) -> dict[str, Any]:
        """``{"hits", "misses", "dir", "entries"}`` of this object's lookups."""
        return {
            "hits": self.hits,
            "misses": self.misses,
            "dir": str(self.root),
            "entries": list(self.entries),
        }


def cache_stats(cache: EmbeddingCache | None) -> dict[str, Any] | None:
    """:meth:`EmbeddingCache.stats`, or None when the eval ran without a cache."""
    return cache.stats() if cache is not None else None
