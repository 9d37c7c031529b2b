"""Retrieval: plain RRF, the three modes, rerank, CorpusRetriever == Retriever."""

from __future__ import annotations

import numpy as np
import pytest
from ingest_support import write_docs

from rag.defaults import MODES
from rag.ingest import ingest
from rag.retrieval.encoder import Encoder
from rag.retrieval.fusion import weighted_rrf
from rag.retrieval.retriever import CorpusRetriever, FusedHit, Retriever
from rag.retrieval.settings import RetrievalSettings

CORPUS = {
    "d1": "reading a file line by line with a for loop over the file object",
    "d2": "exceptions are handled with try and except clauses",
    "d3": "zebras have black and white stripes",
    "d4": "the with statement closes a file automatically",
    "d5": "lists, tuples and dictionaries are built-in containers",
}


@pytest.fixture(scope="module")
def tiny_encoder(tiny_mlm_dir):
    return Encoder.load(tiny_mlm_dir, device="cpu", precision="fp32")  # as the index queries


def rrf(rankings: list[list[str]], k: int = 60) -> list[tuple[str, float]]:
    """Plain reciprocal rank fusion of id lists: weighted_rrf with every weight 1."""
    return weighted_rrf([[(d, 0.0) for d in ranking] for ranking in rankings], k=k)


def test_rrf_pure_function():
    assert rrf([]) == []
    fused = rrf([["a", "b", "c"], ["b", "c", "d"]], k=60)
    assert [d for d, _ in fused][:2] == ["b", "c"]  # in both lists, high in both
    assert dict(fused)["a"] == pytest.approx(1 / 61)
    assert dict(fused)["b"] == pytest.approx(1 / 62 + 1 / 61)
    assert rrf([["x", "y"]]) == [("x", 1 / 61), ("y", 1 / 62)]
    assert rrf([["a", "b"], ["b", "a"]]) == rrf([["a", "b"], ["b", "a"]])  # deterministic
    assert [d for d, _ in rrf([["a", "b"], ["b", "a"]])] == ["a", "b"]  # ties keep first seen


def test_corpus_retriever_modes(tiny_encoder):
    ids, texts = list(CORPUS), list(CORPUS.values())
    bm25 = CorpusRetriever(ids, texts, None, RetrievalSettings(mode="bm25"))
    assert bm25.search("zebras stripes", k=2)[0][0] == "d3"
    with pytest.raises(ValueError, match="needs an encoder"):
        CorpusRetriever(ids, texts, None, RetrievalSettings(mode="dense"))
    hybrid = CorpusRetriever(ids, texts, tiny_encoder, RetrievalSettings(mode="hybrid"))
    for mode in MODES:
        rows = hybrid.search_many(["file line loop", "zebras stripes"], k=3, mode=mode)
        assert len(rows) == 2
        assert all(
            len(r) == 3 if mode != "bm25" else 1 <= len(r) <= 3 for r in rows
        )  # bm25 drops 0
        for row in rows:
            scores = [s for _, s in row]
            assert scores == sorted(scores, reverse=True) and len({d for d, _ in row}) == len(row)
    # every document is its own nearest neighbour under the dense encoder
    dense = hybrid.search_many(texts, k=1, mode="dense")
    assert [r[0][0] for r in dense] == ids
    assert hybrid.timings["corpus_encode_s"] >= 0 and hybrid.engine.timings["queries"] > 0
    with pytest.raises(ValueError, match="mode"):
        hybrid.search("x", mode="sparse")


def test_reranker_reorders(tiny_encoder):
    class ByLength:
        def score(self, query, texts):
            return [-len(t) for t in texts]

    ids, texts = list(CORPUS), list(CORPUS.values())
    r = CorpusRetriever(
        ids, texts, None, RetrievalSettings(mode="bm25", rerank_weight=1.0), reranker=ByLength()
    )
    got = r.search("file", k=2)
    shortest = sorted((len(CORPUS[i]), i) for i in ("d1", "d4"))[0][1]
    assert got[0][0] == shortest and got[0][1] == -len(CORPUS[shortest])


def test_index_retriever_matches_corpus_retriever(tmp_path, tiny_mlm_dir, tiny_encoder):
    docs = tmp_path / "docs"
    write_docs(docs, {f"{k}.txt": v for k, v in CORPUS.items()})
    ingest([docs], index="ret", encoder=str(tiny_mlm_dir), progress=False)
    r = Retriever.from_settings("ret")
    ids = sorted(r.chunks)
    corpus = CorpusRetriever(
        ids, [r.chunks[i].text for i in ids], tiny_encoder, RetrievalSettings(mode="hybrid")
    )
    for mode in MODES:
        hits = r.search("closing a file with the with statement", k=4, mode=mode)
        assert [h.rank for h in hits] == list(range(1, len(hits) + 1))
        assert len(hits) == 4 or (mode == "bm25" and hits)
        assert all(isinstance(h, FusedHit) and h.mode == mode for h in hits)
        expected = corpus.search("closing a file with the with statement", k=4, mode=mode)
        assert [h.chunk.id for h in hits] == [i for i, _ in expected]
        assert [h.score for h in hits] == pytest.approx([s for _, s in expected], abs=1e-5)
    fused = r.search("zebras", k=5, mode="hybrid")
    assert fused[0].chunk.source.endswith("d3.txt")
    assert fused[0].bm25_score is not None and fused[0].dense_score is not None
    assert "dense_score" in fused[0].to_dict()


def test_retriever_sees_new_generation(tmp_path, tiny_mlm_dir):
    docs = write_docs(tmp_path / "docs")
    ingest([docs], index="live", encoder=str(tiny_mlm_dir), progress=False)
    r = Retriever.from_settings("live")
    assert not r.search("okapi", k=3, mode="bm25")
    (docs / "okapi.md").write_text("# Okapi\n\nThe okapi is a forest giraffe.\n", encoding="utf-8")
    ingest([docs], index="live", progress=False)
    hits = r.search("okapi", k=3, mode="bm25")
    assert hits and hits[0].chunk.source.endswith("okapi.md")


def test_missing_index_is_a_clear_error():
    from rag.storage.manifest import IndexNotFoundError

    with pytest.raises(IndexNotFoundError, match="rag.ingest"):
        Retriever.from_settings("does-not-exist")


def test_encoder_batches_and_int8(tiny_mlm_dir, tiny_encoder):
    texts = ["short", "a somewhat longer text about files " * 3, "mid length text here", "x " * 40]
    batches = tiny_encoder.batches(texts)
    assert sorted(i for b in batches for i in b) == list(range(len(texts)))
    assert batches[0][0] == 3  # longest first
    fp32 = tiny_encoder.encode(texts)
    assert fp32.shape == (4, tiny_encoder.dim)
    assert np.allclose(np.linalg.norm(fp32, axis=1), 1, atol=1e-5)
    int8 = Encoder.load(tiny_mlm_dir, device="cpu", precision="int8")
    q = int8.encode(texts)
    assert np.all(np.sum(fp32 * q, axis=1) > 0.9)  # close to fp32, not identical
    assert int8.fingerprint == tiny_encoder.fingerprint  # same weights, same index identity
    with pytest.raises(ValueError, match="precision"):
        Encoder(tiny_encoder.model, precision="fp8")


def test_encoder_bf16_is_fp32_within_tolerance(tiny_mlm_dir, tiny_encoder):
    """--precision bf16 casts the weights (every parameter bfloat16), returns float32 unit vectors
    (re-normalised in fp32) within cosine 0.995 of fp32, and keeps the index identity."""
    import torch

    texts = ["open a file", "read a line from it " * 4, "x " * 40]
    bf16 = Encoder.load(tiny_mlm_dir, device="cpu", precision="bf16")
    assert {p.dtype for p in bf16.model.parameters()} == {torch.bfloat16}
    got, ref = bf16.encode(texts), tiny_encoder.encode(texts)
    assert got.dtype == np.float32
    assert np.allclose(np.linalg.norm(got, axis=1), 1, atol=1e-5)
    assert np.all(np.sum(ref * got, axis=1) > 0.995)
    assert bf16.fingerprint == tiny_encoder.fingerprint
    assert bf16.identity()["precision"] == "bf16"


def test_a_corpus_of_stop_words_only_is_indexed_and_matches_nothing(tmp_path, tiny_mlm_dir):
    """bm25s cannot build an index with no term ("A.", "To be or not to be."): ingest and every
    search still work, BM25 matches nothing, dense search still finds the document, and the
    saved index loads again (it once failed: max() of an empty sequence)."""
    from rag.retrieval.bm25 import BM25Index

    empty = BM25Index(["a", "b"], ["A.", "To be or not to be."])
    assert empty.search("be") == [] and empty.idf(["apples"])["apples"] > 0
    empty.save(tmp_path / "bm")
    assert BM25Index.load(tmp_path / "bm").search_many(["apples", "be"]) == [[], []]
    docs = write_docs(tmp_path / "docs", {"hamlet.md": "To be or not to be.\n"})
    ingest([docs], index="stop", encoder=str(tiny_mlm_dir), progress=False)
    r = Retriever.from_settings("stop", RetrievalSettings(rerank="none"))
    assert r.search("who speaks", k=3, mode="bm25") == []
    assert [h.chunk.source.endswith("hamlet.md") for h in r.search("be", k=3, mode="dense")] == [
        True
    ]
    assert len(r.search("be", k=3, mode="hybrid")) == 1
