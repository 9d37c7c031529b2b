"""Retrieval: dense (encoder + vector index), BM25, and hybrid by a convex fusion of normalised
scores or reciprocal rank fusion (:mod:`rag.retrieval.fusion`), with an optional cross-encoder
rerank stage, as a :class:`~rag.retrieval.settings.RetrievalSettings` says.

Two faces over the same engine (:class:`rag.retrieval.engine.SearchEngine`):

- :class:`Retriever` opens an index written by ``rag.ingest`` and returns :class:`Hit` objects
  with their chunks (what ``rag.search``, the answer pipeline, the UI and ``rag.serve`` use); it
  follows the index's published generation (see :class:`Retriever`);
- :class:`CorpusRetriever` indexes ``ids``/``texts`` in memory and returns (id, score) lists
  (what the retrieval and QA evals use), so evals measure the code the system runs.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from indexes import VectorIndex, load_generation, scratch_index
from rag.documents import document_type
from rag.retrieval.bm25 import BM25Index
from rag.retrieval.embedding_cache import EmbeddingCache
from rag.retrieval.encoder import Encoder, EncoderMismatchError
from rag.retrieval.engine import SearchEngine
from rag.retrieval.filters import Where
from rag.retrieval.mentions import CorpusText
from rag.retrieval.query import check_query
from rag.retrieval.rerank import Reranker, load_reranker
from rag.retrieval.settings import DEFAULTS, RetrievalSettings
from rag.retrieval.spelling import Corrected
from rag.storage.manifest import (
    IndexIntegrityError,
    Manifest,
    check_chunks,
    current_generation,
    open_generation,
    read_chunks,
)
from rag.storage.paths import display_names, display_source
from rag.types import Chunk, Hit


@dataclass(frozen=True)
class FusedHit(Hit):
    """A hit with its component scores (None where that retriever did not return it), so the
    answer pipeline can judge relevance of a fused list by the dense or BM25 score, and the
    index generation it was found in (``gen-000007``; "" outside an ingested index), so an
    answer can say which published index it came from (replicas switch generations live)."""

    dense_score: float | None = None
    bm25_score: float | None = None
    generation: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            **super().to_dict(),
            "dense_score": self.dense_score,
            "bm25_score": self.bm25_score,
            "generation": self.generation,
        }


class CorpusRetriever:
    """In-memory retrieval over ``ids``/``texts`` with the same engine as :class:`Retriever`.

    ``encoder``: a SentenceTransformer, an alias/folder, an :class:`Encoder`, or None (BM25 only).
    ``settings``: as :class:`~rag.retrieval.engine.SearchEngine` (``mode`` decides which indexes
    are built: ``hybrid`` builds both; ``device`` where a named encoder loads); ``reranker``: a
    loaded rerank stage (:func:`rag.retrieval.rerank.load_reranker` builds the settings' one).
    ``embeddings``: an :class:`~rag.retrieval.embedding_cache.EmbeddingCache` the corpus vectors
    are read from (or written to, on a miss); None encodes afresh (the benchmarks, which time it).
    ``timings`` records corpus encoding and index building; ``engine.timings`` the searches.
    """

    def __init__(
        self,
        ids: list[str],
        texts: list[str],
        encoder: Any = None,
        settings: RetrievalSettings = DEFAULTS,
        *,
        reranker: Reranker | None = None,
        backend: str = "faiss",
        progress: bool = False,
        embeddings: EmbeddingCache | None = None,
    ):
        if len(ids) != len(texts) or len(set(ids)) != len(ids):
            raise ValueError("ids and texts must have the same length and ids must be unique")
        self.ids, self.mode, self.settings = list(ids), settings.mode, settings
        self._text = dict(zip(ids, texts))
        self._corpus = CorpusText(self._text.values)
        self.timings: dict[str, float] = {}
        enc = Encoder.wrap(encoder, device=settings.device) if encoder is not None else None
        vectors = bm25 = None
        if self.mode in ("dense", "hybrid"):
            if enc is None:
                raise ValueError(f"mode {self.mode!r} needs an encoder")
            t0 = time.perf_counter()
            if embeddings is None:
                vecs = enc.encode(list(texts), kind="document", progress=progress)
            else:
                vecs = embeddings.encode(
                    enc, texts, encode=lambda xs: enc.encode(xs, progress=progress)
                )
            t1 = time.perf_counter()
            vectors = scratch_index(backend, enc.dim)  # its storage goes with the retriever
            vectors.add(self.ids, vecs)
            self.timings.update(corpus_encode_s=t1 - t0, index_build_s=time.perf_counter() - t1)
        if self.mode in ("bm25", "hybrid"):
            t0 = time.perf_counter()
            bm25 = BM25Index(self.ids, list(texts))
            self.timings["bm25_build_s"] = time.perf_counter() - t0
        self.engine = SearchEngine(enc, vectors, bm25, self._text.__getitem__, reranker, settings)

    @property
    def encoder(self) -> Encoder | None:
        return self.engine._encoder if isinstance(self.engine._encoder, Encoder) else None

    def search_many(
        self,
        queries: list[str],
        k: int | None = None,
        mode: str | None = None,
        *,
        settings: RetrievalSettings | None = None,
        rerank: bool = True,
    ) -> list[list[tuple[str, float]]]:
        """(id, score) lists, best first, one per query (``k``, ``mode``: the settings' when
        None); ``settings`` (this call's, whole) and ``rerank`` as
        :meth:`rag.retrieval.engine.SearchEngine.search_many`."""
        rows = self.engine.search_many(queries, k, mode, settings=settings, rerank=rerank)
        return [[(r.id, r.score) for r in row] for row in rows]

    def search(
        self,
        query: str,
        k: int | None = None,
        mode: str | None = None,
        *,
        settings: RetrievalSettings | None = None,
        rerank: bool = True,
    ) -> list[tuple[str, float]]:
        return self.search_many([query], k, mode, settings=settings, rerank=rerank)[0]

    def coverage(self, query: str, ids: Sequence[str]) -> float | None:
        """Share of the query's IDF weight the best of ``ids`` holds (rag.answer.answerability)."""
        return self.engine.coverage(query, [self._text[i] for i in ids])

    def correct_typos(self, query: str) -> Corrected:
        """``query`` with its typos corrected against this corpus (rag.retrieval.spelling)."""
        return self.engine.correct_typos(query)

    def mentions(self, phrases: Sequence[str]) -> list[bool]:
        """Whether any text holds each phrase (rag.retrieval.mentions)."""
        return self._corpus.mentions(phrases)


FILTER_CACHE = 32  # document filters whose allowed ids a snapshot keeps
RELOAD_TRIES = 5  # reads of CURRENT before a generation that keeps vanishing is an error


def generation_vectors(root: Path, gen: Path, manifest: Manifest) -> VectorIndex:
    """The vector store of generation ``gen`` of the index at ``root``, opened for search from
    wherever its manifest says the vectors live (a FAISS file in ``gen``, a Chroma server)."""
    return load_generation(
        manifest.backend,
        root,
        gen,
        manifest.encoder["dim"],
        chroma_url=manifest.chroma_url,
        collection=manifest.collection,
    )


@dataclass
class Snapshot:
    """One published generation as loaded for search. A query takes the retriever's snapshot
    once and uses nothing else, so its chunks, BM25 index, vector filter and display paths all
    come from one generation even when a new one is swapped in meanwhile."""

    root: Path
    gen: Path
    manifest: Manifest
    chunks: dict[str, Chunk]
    engine: SearchEngine
    paths: dict[str, str] = field(default_factory=dict)  # source -> display path (a cache)
    filtered: dict[Where, frozenset[str]] = field(default_factory=dict)  # a small cache
    # every chunk's text, searchable for literal phrases; built on its first look-up
    text: CorpusText = field(init=False)

    def __post_init__(self) -> None:
        self.text = CorpusText(lambda: (c.text for c in self.chunks.values()))

    def display(self, source: str) -> str:
        """The path of ``source`` relative to the folder it was ingested from (the manifest's
        roots), so results and citations never show the machine's absolute path; distinct
        for every document of the generation (:func:`rag.storage.paths.display_names`: two folders'
        ``same.md`` are ``dupA/same.md`` and ``dupB/same.md``), computed once for all."""
        if not self.paths and self.manifest.sources:
            self.paths = display_names(self.manifest.sources, self.manifest.roots)
        path = self.paths.get(source)
        if path is None:
            path = self.paths[source] = display_source(source, self.manifest.roots)
        return path

    def shown(self, chunk: Chunk) -> Chunk:
        """``chunk`` with its display path (:meth:`display`)."""
        return replace(chunk, path=self.display(chunk.source))

    def allowed(self, where: Where) -> frozenset[str] | None:
        """The chunk ids of this generation's documents that ``where`` lets through, matched
        once per document (its relative path and type, :mod:`rag.retrieval.filters`); None for
        no filter, or one that lets every document through (searched as unfiltered: no id list
        to send to a vector store). Cached per filter (at most :data:`FILTER_CACHE` of them)."""
        if not where:
            return None
        ids = self.filtered.get(where)
        if ids is None:
            ids = frozenset(
                i
                for source, entry in self.manifest.sources.items()
                if where.matches(self.display(source), document_type(source))
                for i in entry.chunk_ids
                if i in self.chunks
            )
            if len(self.filtered) >= FILTER_CACHE:  # filters come from requests: stay bounded
                self.filtered.clear()
            self.filtered[where] = ids
        return None if len(ids) == len(self.chunks) else ids


class Retriever:
    """Search an index written by ``rag.ingest``; returns :class:`Hit` objects with chunks.

    Follows the published generation without a restart, for a long-lived process (the UI, each
    ``rag.serve`` replica): before every search it reads the index's ``CURRENT`` pointer (one
    small file read), and when an ingest or a removal has published a new generation one
    thread loads it while the searches that started after the publication wait for it
    (read-after-write: what an ingest or removal that returned published is what every later
    question sees), then the new :class:`Snapshot` replaces the old in one assignment.
    Queries already running finish on the snapshot they took: the old generation stays
    searchable meanwhile because ingest keeps the previous generation's folder and its
    vectors (``rag.storage.manifest.publish_generation``, ``VectorIndex.reconcile``).

    ``settings`` (:class:`~rag.retrieval.settings.RetrievalSettings`) say how to search, as for
    :class:`~rag.retrieval.engine.SearchEngine`, and which query encoder to use (``encoder``,
    ``encoder_backend``, ``device``); an ``encoder`` object given here wins over the settings'
    name (tests, evals holding a loaded model). ``reranker``: a loaded rerank stage; open with
    :meth:`from_settings` to get the one the settings name.
    """

    def __init__(
        self,
        index: str | Path,
        settings: RetrievalSettings = DEFAULTS,
        *,
        encoder: Any = None,
        reranker: Reranker | None = None,
    ):
        self.index, self.settings, self.reranker = index, settings, reranker
        self.device, self.encoder_backend = settings.device, settings.encoder_backend
        self._given = encoder if encoder is not None else settings.encoder
        self._where = Where.parse(settings.where)  # the settings' filter, when a search names none
        self._encoder: Encoder | None = None
        self._reload = threading.Lock()  # one thread loads a new generation at a time
        self._state = self._read()
        if self._given is not None:  # an explicit encoder is checked now, not at the first query
            self._get_encoder()

    @classmethod
    def from_settings(
        cls, index: str | Path, settings: RetrievalSettings = DEFAULTS, *, encoder: Any = None
    ) -> Retriever:
        """Open ``index`` as ``settings`` say, with the rerank stage they name
        (:func:`rag.retrieval.rerank.load_reranker`): how every caller opens an index (the
        pipeline, ``rag.ask --index`` or ``--index-dir``, ``rag.search``, ``rag.serve``, the UI,
        the evals), so a name and a folder of the same index answer alike. ``index``: a name
        under ``$RAG_HOME/indexes``, or an index folder given as a :class:`~pathlib.Path`; a
        string that is not a plain name raises :class:`rag.storage.paths.IndexNameError`. An encoder
        other than the index's own must have the same weights fingerprint, else
        :class:`EncoderMismatchError` names both."""
        return cls(index, settings, encoder=encoder, reranker=load_reranker(settings))

    # ---- the loaded generation ---------------------------------------------------------------

    @property
    def snapshot(self) -> Snapshot:
        """The generation loaded now (a new query may replace it: take it once and keep it)."""
        return self._state

    root = property(lambda self: self._state.root, doc="The index folder.")
    gen = property(lambda self: self._state.gen, doc="The loaded generation's folder.")
    manifest = property(lambda self: self._state.manifest, doc="The loaded generation's manifest.")
    chunks = property(lambda self: self._state.chunks, doc="The loaded generation's chunks by id.")
    engine = property(lambda self: self._state.engine, doc="The loaded generation's engine.")

    @property
    def generation(self) -> str:
        """Name of the loaded generation (``gen-000007``)."""
        return self._state.gen.name

    def _read(self) -> Snapshot:
        """Load the generation ``CURRENT`` names. A generation removed between reading the
        pointer and reading its files (two ingests published meanwhile) is retried with the
        pointer read again."""
        for _ in range(RELOAD_TRIES - 1):
            try:
                return self._read_once()
            except FileNotFoundError:
                continue
        return self._read_once()

    def _read_once(self) -> Snapshot:
        """Load the live generation, checked (:mod:`rag.storage.manifest`, *Integrity*): its files'
        sizes, its chunk store against the manifest, and a store of its own holding exactly
        its chunks' vectors, so a lost or foreign vector file is an error naming it rather
        than a dense search that quietly finds nothing (hybrid silently BM25 only)."""
        root, gen, m = open_generation(self.index)
        chunks: dict[str, Chunk] = read_chunks(gen)
        check_chunks(root, gen, m, chunks)
        vectors = generation_vectors(root, gen, m)
        if not vectors.shared_store and set(vectors.ids()) != set(chunks):
            where, n = vectors.location(), vectors.count()
            vectors.close()
            raise IndexIntegrityError(
                f"index {root}: {where}: its {n} vectors are not those of the generation's "
                f"{len(chunks)} chunks (lost, or taken from another index)"
            )
        try:
            bm25 = BM25Index.load(gen / "bm25")
        except FileNotFoundError:
            if not gen.is_dir():
                raise
            raise IndexIntegrityError(f"index {root}: {gen / 'bm25'}: files missing") from None
        except (ValueError, KeyError, TypeError, OSError) as e:
            raise IndexIntegrityError(f"index {root}: {gen / 'bm25'}: unreadable ({e})") from None
        # a store every generation shares may hold ids this generation does not name
        keep = chunks.__contains__ if vectors.shared_store else None
        engine = SearchEngine(
            self._get_encoder,
            vectors,
            bm25,
            lambda i: chunks[i].text,
            self.reranker,
            self.settings,
            keep,
        )
        return Snapshot(root, gen, m, chunks, engine)

    def _swap(self, new: Snapshot) -> None:
        """Make ``new`` the loaded generation. A loaded encoder is kept if the new manifest
        records the same one (ingest refuses another on an existing index); an index rebuilt
        with another encoder gets its own recorded encoder on the next dense query, while an
        encoder given explicitly is checked and refused as at start-up."""
        if self._encoder is not None:
            try:
                self._encoder.check_matches(new.manifest.encoder, str(self.index))
            except EncoderMismatchError:
                if self._given is not None:
                    raise
                self._encoder = None
        self._state = new

    def _current(self) -> Snapshot:
        """The snapshot a new query should use: the loaded one while ``CURRENT`` still names
        it, else the newly published generation, loaded here or, when another thread is
        already loading it, waited for. So a question that starts after a publication has
        returned (``rag.ingest``, ``rag.docs remove``, ``DELETE /v1/documents``) is answered
        from it, never from the generation before: answering from the loaded one while another
        thread loaded the new one let questions sent just after a ``DELETE``'s 200 answer from
        the old generation (docs/security.md, case 3). Queries already running finish on the
        snapshot they took."""
        state = self._state
        if current_generation(state.root) == state.gen:
            return state
        with self._reload:  # one thread loads; the others wait for it, then check again
            now = self._state
            if current_generation(now.root) != now.gen or not now.gen.is_dir():
                self._swap(self._read())
            return self._state

    def _get_encoder(self) -> Encoder:
        if self._encoder is None:
            rec = self.manifest.encoder
            # queries are encoded in fp32 whatever precision the index was built in: one query
            # is cheap, and the scores stay those every measurement in docs/ was taken with
            opts = {"device": self.device, "backend": self.encoder_backend, "precision": "fp32"}
            if self._given is not None:
                enc = (
                    Encoder.load(self._given, **opts)
                    if isinstance(self._given, (str, Path))
                    else Encoder.wrap(self._given, device=self.device)
                )
            else:
                name = rec["name"]
                try:
                    enc = Encoder.load(name, **opts)
                except Exception:  # the alias/folder moved: fall back to the recorded path
                    if not rec.get("path"):
                        raise
                    enc = Encoder.load(rec["path"], **opts)
                    enc.name = name
            enc.check_matches(rec, str(self.index))
            self._encoder = enc
        return self._encoder

    @property
    def encoder(self) -> Encoder:
        return self._get_encoder()

    def refresh(self) -> bool:
        """Load the published generation if it is not the loaded one; True when it was not."""
        before = self._state
        return self._current() is not before

    def search(
        self,
        query: str,
        k: int | None = None,
        mode: str | None = None,
        where: Any = None,
        *,
        settings: RetrievalSettings | None = None,
        rerank: bool = True,
    ) -> list[Hit]:
        """Top-``k`` hits for ``query``, best first (``k``, ``mode``: dense, bm25 or hybrid, the
        settings' when None; ``where``: a document filter, :meth:`Where.parse
        <rag.retrieval.filters.Where.parse>`'s input, None = the settings' own, ``[]`` = none;
        ``settings`` (this call's, whole) and ``rerank`` as
        :meth:`rag.retrieval.engine.SearchEngine.search_many`). A query without a word is
        refused (:func:`rag.retrieval.query.check_query`): its hits would be arbitrary."""
        return self.search_many(
            [check_query(query)], k, mode, where, settings=settings, rerank=rerank
        )[0]

    def search_many(
        self,
        queries: list[str],
        k: int | None = None,
        mode: str | None = None,
        where: Any = None,
        *,
        settings: RetrievalSettings | None = None,
        rerank: bool = True,
    ) -> list[list[Hit]]:
        """Hits per query, all from one generation (the one published when the call began);
        a filter (``where``) is searched inside every stage, so ``k`` hits come from the
        documents it lets through whenever they hold ``k``."""
        state = self._current()
        filt = self._where if where is None else Where.parse(where)
        allowed = state.allowed(filt)
        rows = state.engine.search_many(
            queries, k, mode, settings=settings, rerank=rerank, allowed=allowed
        )
        return [
            [
                FusedHit(
                    state.shown(state.chunks[r.id]),
                    r.score,
                    rank=rank,
                    mode=r.mode,
                    dense_score=r.dense,
                    bm25_score=r.bm25,
                    generation=state.gen.name,
                )
                for rank, r in enumerate((r for r in row if r.id in state.chunks), start=1)
            ]
            for row in rows
        ]

    def coverage(self, query: str, hits: Sequence[Hit]) -> float | None:
        """Share of the query's IDF weight the best of ``hits`` holds (rag.answer.answerability); the
        hits' own texts, so a generation swapped in since the search cannot lose them."""
        return self.engine.coverage(query, [h.chunk.text for h in hits])

    def correct_typos(self, query: str) -> Corrected:
        """``query`` with its typos corrected against the published generation's words
        (rag.retrieval.spelling): what a question is searched, checked and answered with."""
        return self._current().engine.correct_typos(query)

    def mentions(self, phrases: Sequence[str]) -> list[bool]:
        """Whether any chunk of the published generation holds each phrase, case and spacing
        aside (rag.retrieval.mentions: the answerability check's literal terms)."""
        return self._current().text.mentions(phrases)

    def __len__(self) -> int:
        return len(self._state.chunks)
