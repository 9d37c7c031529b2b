"""langchain-core adapters: our encoder as ``Embeddings``, our retriever as a ``BaseRetriever``.

They let a LangChain user plug this project's pieces into their own chains (LCEL runnables,
vector stores) without our pipeline::

    from rag.langchain import EncoderEmbeddings, IndexRetriever
    retriever = IndexRetriever.from_index("pydocs", k=4)
    chain = retriever | format_docs | my_llm

Only ``langchain-core`` is needed. Scores, ids and heading paths travel in ``Document.metadata``.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from langchain_core.callbacks import CallbackManagerForRetrieverRun
from langchain_core.documents import Document
from langchain_core.embeddings import Embeddings
from langchain_core.retrievers import BaseRetriever
from pydantic import ConfigDict

from rag.retrieval.settings import DEFAULTS, RetrievalSettings
from rag.types import Hit


class EncoderEmbeddings(Embeddings):
    """A SentenceTransformer (or an alias/folder loaded through :func:`rag.models.load_embedder`)
    as a langchain-core ``Embeddings``; vectors are L2-normalised, as our indexes store them."""

    def __init__(
        self,
        model: Any = "minilm",
        *,
        device: str = "auto",
        batch_size: int = 32,
        normalize: bool = True,
    ) -> None:
        if isinstance(model, str | Path):
            from rag.models import load_embedder

            model = load_embedder(model, device=device)
        self.model = model
        self.batch_size = batch_size
        self.normalize = normalize

    def _encode(self, texts: Sequence[str]) -> list[list[float]]:
        vecs = self.model.encode(
            list(texts),
            batch_size=self.batch_size,
            normalize_embeddings=self.normalize,
            convert_to_numpy=True,
            show_progress_bar=False,
        )
        return vecs.tolist()

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        return self._encode(texts)

    def embed_query(self, text: str) -> list[float]:
        return self._encode([text])[0]


def hit_to_document(hit: Hit) -> Document:
    """A langchain ``Document`` with the chunk text and its provenance in ``metadata``."""
    c = hit.chunk
    return Document(
        page_content=c.text,
        id=c.id,
        metadata={
            "id": c.id,
            "source": c.source,
            "heading_path": list(c.heading_path),
            "heading": " › ".join(c.heading_path),
            "start": c.start,
            "end": c.end,
            "score": float(hit.score),
            "rank": hit.rank,
            "mode": hit.mode,
        },
    )


class IndexRetriever(BaseRetriever):
    """A langchain-core retriever over :class:`rag.retrieval.retriever.Retriever` (or anything with
    ``search(query, k=, mode=) -> list[Hit]``)."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    retriever: Any
    """The underlying search object."""
    k: int = 5
    """Documents returned per query."""
    mode: str = "hybrid"
    """dense | bm25 | hybrid."""

    @classmethod
    def from_index(
        cls, index: str, settings: RetrievalSettings | None = None, **kwargs: Any
    ) -> IndexRetriever:
        """Open an index built by ``rag.ingest`` with ``settings`` (default: the product's,
        :class:`~rag.retrieval.settings.RetrievalSettings`: the index's own encoder, convex
        fusion, the trained reranker when there is one)."""
        from rag.retrieval.retriever import Retriever

        return cls(retriever=Retriever.from_settings(index, settings or DEFAULTS), **kwargs)

    def _get_relevant_documents(
        self, query: str, *, run_manager: CallbackManagerForRetrieverRun
    ) -> list[Document]:
        hits = self.retriever.search(query, k=self.k, mode=self.mode)
        return [hit_to_document(h) for h in hits]


def format_docs(docs: Sequence[Document]) -> str:
    """Number documents ``[1] …`` the way :mod:`rag.answer.prompt` numbers passages."""
    from rag.answer.prompt import format_passages

    return format_passages([d.page_content for d in docs])
