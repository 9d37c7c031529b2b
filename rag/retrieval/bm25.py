"""BM25 over chunk texts, built on bm25s, with a standard tokenizer (lower-case, English stop
words, Snowball stemming via PyStemmer), as BEIR/Pyserini-style baselines use.

The one BM25 in the project: ingest persists it beside the vector index, evals build it over a
BEIR corpus, LoRA data mining uses it for distractors, contrastive training for hard negatives.

BM25 never touches an accelerator. bm25s picks JAX for its top-k whenever JAX is importable,
and its module ``bm25s.selection`` runs ``jax.lax.top_k`` at import to warm it up; on a GPU
machine that first JAX op preallocates 75% of the GPU's memory, so a process that only wanted
BM25 held 105 GiB of an H200 and the next process died "CUDA out of memory" (issue 44). So
bm25s is imported with JAX hidden (:func:`_import_without_jax`: it falls back to numpy's
``argpartition``, which is what it uses without JAX anyway), every search asks for the numpy
backend by name, and ``XLA_PYTHON_CLIENT_PREALLOCATE`` defaults to ``false`` (``rag/__init__``)
for any other library that imports JAX in our processes.
"""

from __future__ import annotations

import importlib
import json
import math
import sys
from collections.abc import Collection, Iterable, Sequence
from pathlib import Path
from types import ModuleType

import numpy as np
import Stemmer

# the modules whose import makes bm25s.selection take JAX's path
_JAX = ("jax", "jax.lax")


def _import_without_jax(name: str) -> ModuleType:
    """Import ``name`` while ``import jax`` / ``import jax.lax`` fail (a ``None`` entry in
    ``sys.modules`` makes Python raise ImportError for that name); what ``sys.modules`` held
    for them is put back, so a program's own JAX is untouched. A module of bm25s imported
    before (by the program) is taken as it is."""
    saved = {m: sys.modules[m] for m in _JAX if m in sys.modules}
    for m in _JAX:
        sys.modules[m] = None  # type: ignore[assignment]
    try:
        return importlib.import_module(name)
    finally:
        for m in _JAX:
            if m in saved:
                sys.modules[m] = saved[m]
            else:
                sys.modules.pop(m, None)


bm25s = _import_without_jax("bm25s")

_STEMMER = Stemmer.Stemmer("english")


def tokenize(texts: Sequence[str]) -> bm25s.tokenization.Tokenized:
    return bm25s.tokenize(list(texts), stopwords="en", stemmer=_STEMMER, show_progress=False)


def stem_words(words: Sequence[str]) -> list[str]:
    """Each lower-case word's stem, as BM25 indexes it (rag.retrieval.spelling looks words up by
    it)."""
    return _STEMMER.stemWords(list(words))


def terms(texts: Sequence[str], stopwords: str | Sequence[str] = "en") -> list[list[str]]:
    """The index terms of each text (lower-cased, stop words out, stemmed), as BM25 sees them;
    ``stopwords`` may be a longer list (rag.answer.answerability drops question words too)."""
    if not texts:
        return []
    return bm25s.tokenize(
        list(texts), stopwords=stopwords, stemmer=_STEMMER, show_progress=False, return_ids=False
    )


class BM25Index:
    """BM25 (Lucene variant, k1=0.9, b=0.4 as Pyserini's defaults) over ``ids``/``texts``.

    bm25s indexes are immutable, so an update rebuilds from the full text list: on CPU far
    below the cost of embedding them (docs/retrieval.md, below the modes table).
    """

    def __init__(self, ids: Sequence[str], texts: Sequence[str], k1: float = 0.9, b: float = 0.4):
        self.ids = list(ids)
        self.k1, self.b = k1, b
        self._pos: dict[str, int] | None = None  # id -> corpus row, for filtered searches
        self._model = bm25s.BM25(k1=k1, b=b, method="lucene")
        # a corpus of stop words only ("A.", "To be or not to be") has no term to index (bm25s
        # cannot build it): no query term matches any of its documents
        self._indexed = False
        if self.ids:
            tokens = tokenize(texts)
            if tokens.vocab:
                self._model.index(tokens, show_progress=False)
                self._indexed = True

    def __len__(self) -> int:
        return len(self.ids)

    def search(self, query: str, k: int = 10) -> list[tuple[str, float]]:
        """Top-``k`` (id, score) pairs, best first; documents with score 0 are left out."""
        return self.search_many([query], k)[0]

    def search_many(
        self, queries: Sequence[str], k: int = 10, allowed: Collection[str] | None = None
    ) -> list[list[tuple[str, float]]]:
        """Top-``k`` per query; ``allowed``: score only those ids (bm25s' ``weight_mask``: the
        others score 0 and are left out), with the whole corpus's IDF, so a filtered search
        ranks its documents exactly as the unfiltered one would."""
        if not self._indexed:
            return [[] for _ in queries]
        mask = None
        if allowed is not None:
            mask = np.zeros(len(self.ids), dtype=np.float32)
            pos = self._positions()
            mask[[pos[i] for i in allowed if i in pos]] = 1.0
        k = min(k, len(self.ids))
        docs, scores = self._model.retrieve(
            tokenize(queries),
            k=k,
            show_progress=False,
            weight_mask=mask,
            backend_selection="numpy",  # never JAX (module docstring)
        )
        out = []
        for row_docs, row_scores in zip(docs, scores):
            out.append(
                [(self.ids[int(d)], float(s)) for d, s in zip(row_docs, row_scores) if s > 0]
            )
        return out

    def _positions(self) -> dict[str, int]:
        """Id -> row in the bm25s corpus (built once)."""
        if self._pos is None:
            self._pos = {i: n for n, i in enumerate(self.ids)}
        return self._pos

    def doc_freq(self, words: Iterable[str]) -> dict[str, int]:
        """The number of documents that hold each term (from :func:`terms`: a stem); 0 for a
        term none holds."""
        vocab = getattr(self._model, "vocab_dict", None) or {}
        indptr = self._model.scores["indptr"] if self._indexed else None
        out = {}
        for w in words:
            i = vocab.get(w)
            out[w] = int(indptr[i + 1] - indptr[i]) if i is not None and indptr is not None else 0
        return out

    def idf(self, words: Iterable[str]) -> dict[str, float]:
        """Lucene IDF, log(1 + (N - df + 0.5) / (df + 0.5)), of each term (from :func:`terms`)
        in this corpus. A term no document holds gets the largest IDF: a query about something
        the corpus never mentions is exactly what the answerability check must notice."""
        n = len(self.ids)
        return {
            w: math.log(1 + (n - df + 0.5) / (df + 0.5)) for w, df in self.doc_freq(words).items()
        }

    def save(self, folder: str | Path) -> None:
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "bm25_ids.json").write_text(
            json.dumps({"ids": self.ids, "k1": self.k1, "b": self.b, "indexed": self._indexed})
        )
        if self._indexed:
            self._model.save(str(folder / "bm25"))

    @classmethod
    def load(cls, folder: str | Path) -> BM25Index:
        folder = Path(folder)
        meta = json.loads((folder / "bm25_ids.json").read_text())
        index = cls([], [], k1=meta["k1"], b=meta["b"])
        index.ids = meta["ids"]
        # files written before "indexed" was recorded always held a model for a non-empty list
        if index.ids and meta.get("indexed", True):
            index._model = bm25s.BM25.load(str(folder / "bm25"))
            index._indexed = True
        return index
