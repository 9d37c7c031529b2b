"""The corpus-embedding cache (rag.retrieval.embedding_cache): a rerun reads what the first run
encoded, and a changed corpus, model, length or precision never reads a stale entry; through
evals.retrieval every retriever of one command shares one encoding and the JSON says so."""

from __future__ import annotations

import json
import os
from types import SimpleNamespace

import numpy as np
import pytest
from test_evals_qa import squad  # noqa: F401 (the fixture)
from test_evals_retrieval import write_mini_beir
from training_support import tiny_sentence_transformer

from rag.retrieval.embedding_cache import EmbeddingCache, cache_key, corpus_hash
from rag.retrieval.encoder import Encoder

TEXTS = ["reading a file line by line", "exceptions and try blocks", "zebras have stripes"]


class Counting(Encoder):
    """An Encoder that counts the documents it really encodes (queries are not cached)."""

    encoded = 0

    def encode(self, texts, kind="document", progress=False, on_batch=None):
        self.encoded += len(texts) if kind == "document" else 0
        return super().encode(texts, kind, progress, on_batch)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """Two tiny encoders with different weights (seeds 0 and 1)."""
    root = tmp_path_factory.mktemp("cache_models")
    return [tiny_sentence_transformer(root / f"s{seed}", seed) for seed in (0, 1)]


def test_a_rerun_reads_the_stored_vectors(tmp_path, models):
    enc = Counting(models[0])
    first = EmbeddingCache(tmp_path).encode(enc, TEXTS)
    again = EmbeddingCache(tmp_path)
    second = again.encode(Counting(models[0]), TEXTS)
    assert enc.encoded == 3 and np.array_equal(first, second)
    assert (again.hits, again.misses) == (1, 0)
    assert np.allclose(second, enc.encode(TEXTS))  # what the encoder gives, in input order
    assert [p.suffix for p in tmp_path.iterdir()] == [".npz"]  # no temporary file left


def test_changed_corpus_or_model_is_a_miss_never_stale(tmp_path, models):
    cache = EmbeddingCache(tmp_path)
    base = cache.encode(Encoder(models[0]), TEXTS)
    edited = [*TEXTS[:2], "zebras have no stripes"]
    other = Counting(models[1])
    for enc, texts in (
        (Counting(models[0]), edited),
        (other, TEXTS),
        (Counting(models[0]), TEXTS[::-1]),
    ):
        got = cache.encode(enc, texts)
        assert enc.encoded == len(texts)  # encoded afresh
        assert np.allclose(got, Encoder(enc.model).encode(texts))
    assert (cache.hits, cache.misses) == (0, 4)
    assert not np.allclose(cache.encode(other, TEXTS), base)  # the other model's own vectors


def test_key_covers_precision_length_prompt_and_corpus():
    def fake(**kw):
        model = SimpleNamespace(max_seq_length=kw.get("length", 32))
        return SimpleNamespace(
            fingerprint=kw.get("fp", "abc"),
            precision=kw.get("precision", "fp32"),
            backend="torch",
            model=model,
            query_prompt="",
            document_prompt=kw.get("prompt", ""),
            dim=8,
        )

    name = EmbeddingCache("/x").path
    base = name(cache_key(fake(), TEXTS))
    assert name(cache_key(fake(), list(TEXTS))) == base
    for changed in (
        cache_key(fake(fp="abd"), TEXTS),
        cache_key(fake(precision="bf16"), TEXTS),
        cache_key(fake(length=64), TEXTS),
        cache_key(fake(prompt="passage: "), TEXTS),
        cache_key(fake(), TEXTS[:2]),
        cache_key(fake(), TEXTS, kind="query"),
    ):
        assert name(changed) != base
    assert corpus_hash(["ab", "c"]) != corpus_hash(["a", "bc"])


def test_a_corrupt_or_foreign_entry_is_a_miss_and_is_rewritten(tmp_path, models):
    enc = Encoder(models[0])
    cache = EmbeddingCache(tmp_path)
    vecs = cache.encode(enc, TEXTS)
    path = cache.path(cache_key(enc, TEXTS))
    path.write_bytes(b"not an npz")
    assert np.allclose(cache.encode(enc, TEXTS), vecs) and cache.misses == 2
    np.savez(path, vectors=np.zeros((2, enc.dim), np.float32), key=np.array("{}"))
    assert cache.load(cache_key(enc, TEXTS)) is None  # another key's content: not used
    assert np.allclose(cache.encode(enc, TEXTS), vecs) and cache.misses == 3
    assert cache.hits == 0 and cache.load(cache_key(enc, TEXTS)) is not None


def test_a_failed_write_leaves_no_entry(tmp_path, models, monkeypatch):
    enc = Encoder(models[0])

    def fail(*a):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", fail)
    with pytest.raises(OSError, match="disk full"):
        EmbeddingCache(tmp_path).encode(enc, TEXTS)
    assert list(tmp_path.iterdir()) == []


def test_retrieval_eval_encodes_once_per_command_and_reuses_across_runs(
    tmp_path, models, monkeypatch
):
    from evals.retrieval import RetrievalEvalConfig, evaluate_modes

    monkeypatch.setenv("RAG_HOME", str(tmp_path / "home"))  # an empty cache to start from
    beir = write_mini_beir(tmp_path / "mini")
    cfg = RetrievalEvalConfig(dataset=str(beir), device="cpu")
    enc = Counting(models[0])
    modes = ["bm25", "dense", "hybrid"]
    first = evaluate_modes(cfg, modes, encoder=enc, fusions=["rrf", "convex"])
    assert enc.encoded == 5  # five documents, once for all four rows
    assert all(r["embedding_cache"]["hits"] == 0 for r in first)
    assert first[0]["embedding_cache"]["misses"] == 1 and len(first) == 4
    again = Counting(models[0])
    second = evaluate_modes(cfg, modes, encoder=again, fusions=["rrf", "convex"])
    assert again.encoded == 0
    assert second[0]["embedding_cache"]["hits"] == 1 and second[0]["embedding_cache"]["misses"] == 0
    assert [r["metrics"] for r in second] == [r["metrics"] for r in first]

    # the corpus changes: the next run encodes it again
    corpus = beir / "corpus.jsonl"
    rows = [json.loads(x) for x in corpus.read_text().splitlines()]
    rows[0]["text"] += " Lists also support extend."
    corpus.write_text("\n".join(json.dumps(r) for r in rows))
    third = evaluate_modes(cfg, ["dense"], encoder=Counting(models[0]))
    assert third[0]["embedding_cache"]["misses"] == 1
    off = evaluate_modes(RetrievalEvalConfig(dataset=str(beir), embedding_cache=False), ["bm25"])
    assert off[0]["embedding_cache"] is None


def test_qa_eval_in_rag_mode_reads_the_paragraph_vectors_back(
    squad,  # noqa: F811
    models,
    tmp_path,
    monkeypatch,
):
    from test_evals_qa import ScriptedGenerator

    from evals.qa import QAEvalConfig, evaluate_qa

    monkeypatch.setenv("RAG_HOME", str(tmp_path / "home"))
    cfg = QAEvalConfig.of(
        squad=str(squad), articles=["Paints", "Flags"], mode="rag", retriever="dense", k=2, limit=0
    )
    runs = [
        evaluate_qa(cfg, generator=ScriptedGenerator(), encoder=models[0], progress=False)
        for _ in range(2)
    ]
    assert [(r["embedding_cache"]["hits"], r["embedding_cache"]["misses"]) for r in runs] == [
        (0, 1),
        (1, 0),
    ]
    passages = [[p["passages"] for p in r["predictions"]] for r in runs]
    assert passages[0] == passages[1]  # the same retrieval from the stored vectors
    bm25 = evaluate_qa(
        QAEvalConfig.of(squad=str(squad), articles=["Paints"], mode="rag", k=2, limit=0),
        generator=ScriptedGenerator(),
        progress=False,
    )
    assert bm25["embedding_cache"] is None  # nothing encoded, nothing cached
