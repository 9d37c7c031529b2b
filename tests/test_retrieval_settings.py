"""One RetrievalSettings for every path: its defaults are the config's and the retrievers', and
the same index named (``--index NAME``) and given as a folder (``--index-dir PATH``) retrieves,
fuses and reranks alike. The bug this guards: ``rag.ask --index pydocs`` searched with convex
fusion and the reranker, ``rag.ask --index-dir .../pydocs`` with RRF and none."""

from __future__ import annotations

import dataclasses
import inspect
import json

import pytest
from ingest_support import write_docs
from test_pipeline import FakeGenerator
from training_support import save_tiny_cross_encoder

import rag.pipeline
from rag import ask, search
from rag.config import ConfigError, RAGConfig
from rag.ingest import ingest
from rag.retrieval.engine import SearchEngine
from rag.retrieval.rerank import AUTO_RERANKER
from rag.retrieval.retriever import CorpusRetriever, Retriever
from rag.retrieval.settings import DEFAULTS, RetrievalSettings
from rag.storage.paths import index_path, models_dir

QUESTION = "how do I read a file line by line"


@pytest.fixture
def home(tmp_path, monkeypatch):
    """A RAG_HOME of this test's own, with a trained reranker (what `make models` leaves) and
    an index "docs" built with the tiny encoder."""
    monkeypatch.setenv("RAG_HOME", str(tmp_path / "home"))
    models_dir().mkdir(parents=True)
    save_tiny_cross_encoder(models_dir() / AUTO_RERANKER)
    return tmp_path / "home"


@pytest.fixture
def docs_index(home, tmp_path, tiny_mlm_dir):
    ingest([write_docs(tmp_path / "docs")], index="docs", encoder=str(tiny_mlm_dir), progress=False)
    return "docs"


def test_the_defaults_are_defined_once():
    """RAGConfig's retrieval section is RetrievalSettings with its defaults (no copy of its
    fields in the config), and no retriever or engine takes a loose retrieval keyword."""
    cfg = RAGConfig()
    assert cfg.retrieval == DEFAULTS
    assert not [f.name for f in dataclasses.fields(RetrievalSettings) if hasattr(cfg, f.name)][1:]
    assert (DEFAULTS.fusion, DEFAULTS.rerank, DEFAULTS.rerank_precision) == (
        "convex",
        "auto",
        "auto",
    )
    loose = {
        "fusion",
        "alpha",
        "norm",
        "depth",
        "rerank_depth",
        "rerank_weight",
        "rerank_precision",
    }
    for fn in (
        Retriever,
        Retriever.from_settings,
        CorpusRetriever,
        SearchEngine,
        SearchEngine.search_many,
        SearchEngine.first_stage,
        Retriever.search,
        Retriever.search_many,
    ):
        assert not loose & set(inspect.signature(fn).parameters), fn


def test_settings_from_any_config_and_checked():
    args = type("Args", (), {"fusion": "rrf", "k": 3, "unrelated": 1})()
    assert RetrievalSettings.from_config(args) == DEFAULTS.replace(fusion="rrf", k=3)
    assert RetrievalSettings.from_config(RAGConfig.of(alpha=0.3), mode="bm25").alpha == 0.3
    for bad, flag in (
        ({"fusion": "max"}, "--fusion"),
        ({"alpha": 2.0}, "--alpha"),
        ({"rerank_weight": -1}, "--rerank-weight"),
        ({"rerank_precision": "fp16"}, "--rerank-precision"),
        ({"rerank_depth": 0}, "--rerank-depth"),
        ({"mode": "fuzzy"}, "--mode"),
    ):
        with pytest.raises(ValueError, match=flag):
            RetrievalSettings(**bad)
    with pytest.raises(ConfigError, match="--rerank-precision"):
        RAGConfig.of(rerank_precision="fp16")


def test_named_and_folder_pipelines_retrieve_alike(docs_index):
    """The pipeline's retriever for the name and rag.ask's for the folder: same settings, same
    reranker, same hits and scores."""
    cfg = RAGConfig.of(index=docs_index)
    named = rag.pipeline.RAGPipeline(cfg).retriever
    args = ask.build_parser().parse_args([QUESTION, "--index-dir", str(index_path(docs_index))])
    folder = ask.open_retriever(args, cfg)
    assert folder.settings == named.settings == cfg.retrieval
    assert named.reranker.name == folder.reranker.name == AUTO_RERANKER
    got = [(h.chunk.id, h.score, h.mode) for h in named.search(QUESTION)]
    assert got == [(h.chunk.id, h.score, h.mode) for h in folder.search(QUESTION)]
    assert {mode for _, _, mode in got} == {"rerank"}


def named_and_folder(main, index: str, capsys) -> tuple[dict, dict]:
    """The ``--json`` output of a command run with ``--index NAME``, then ``--index-dir PATH``."""
    outs = []
    for where in (["--index", index], ["--index-dir", str(index_path(index))]):
        assert main([QUESTION, *where, "--json"]) == 0
        outs.append(json.loads(capsys.readouterr().out))
    return outs[0], outs[1]


def ranked(hits: list[dict]) -> list[tuple[str, float, str]]:
    return [(h["id"], h["score"], h["mode"]) for h in hits]


def test_ask_named_and_folder_answer_alike(docs_index, monkeypatch, capsys):
    """rag.ask --index NAME and --index-dir PATH end to end (a scripted decoder): the same
    passages with the same scores, reranked by the same cross-encoder."""
    real = rag.pipeline.RAGPipeline

    def factory(cfg, **kw):
        return real(cfg, generator=FakeGenerator("Loop over the file [1]."), **kw)

    monkeypatch.setattr(rag.pipeline, "RAGPipeline", factory)
    named, folder = named_and_folder(ask.main, docs_index, capsys)
    assert named["reranker"] == folder["reranker"] == AUTO_RERANKER
    assert ranked(named["passages"]) == ranked(folder["passages"]) != []
    assert named["text"] == folder["text"]


def test_search_named_and_folder_alike(docs_index, capsys):
    named, folder = named_and_folder(search.main, docs_index, capsys)
    assert named["reranker"] == folder["reranker"] == AUTO_RERANKER
    assert ranked(named["hits"]) == ranked(folder["hits"]) != []
