"""The trained models are used when `make models` wrote them and the baselines when not:
``rerank = auto`` (rag.retrieval.rerank.resolve_reranker) and ``rag.ingest --encoder auto``
(rag.models.default_encoder). Each test points RAG_HOME at its own tmp_path, so an artefact one
test saves never leaks into another; every model is tiny and built here (nothing downloads)."""

from __future__ import annotations

import json
import logging
import shutil

import pytest
from ingest_support import listed_index, write_docs
from test_pipeline import FakeGenerator
from training_support import save_tiny_cross_encoder

from rag import ask, search
from rag.config import RAGConfig, config_from_args, load_config
from rag.ingest import ingest
from rag.ingest import main as ingest_main
from rag.models import BASE_ENCODER, TUNED_ENCODER, ModelNotFoundError, default_encoder
from rag.retrieval.rerank import AUTO_RERANKER, describe_reranker, resolve_reranker
from rag.retrieval.settings import DEFAULTS
from rag.storage.manifest import open_generation
from rag.storage.paths import indexes_dir, models_dir


@pytest.fixture
def home(tmp_path, monkeypatch):
    """A RAG_HOME of this test's own (conftest's is shared by the whole session)."""
    monkeypatch.setenv("RAG_HOME", str(tmp_path / "home"))
    models_dir().mkdir(parents=True)
    return tmp_path / "home"


@pytest.fixture
def trained_reranker(home):
    """What `make models` leaves for the reranker: a CrossEncoder folder named minilm-rerank."""
    return save_tiny_cross_encoder(models_dir() / AUTO_RERANKER)


def recorded_encoder(index: str) -> str:
    return open_generation(index)[2].encoder["name"]


# ---------------------------------------------------------------------------- reranker: resolution


def test_auto_is_the_default_and_finds_nothing_without_the_artefact(home, caplog):
    assert RAGConfig().retrieval.rerank == "auto"
    with caplog.at_level(logging.INFO, logger="rag.retrieval.rerank"):
        assert resolve_reranker("auto") is None
    assert "auto found no minilm-rerank" in caplog.text
    assert "make models" in describe_reranker("auto", None)


def test_auto_finds_the_trained_cross_encoder(trained_reranker, caplog):
    with caplog.at_level(logging.INFO, logger="rag.retrieval.rerank"):
        assert resolve_reranker("auto") == AUTO_RERANKER
    assert "reranker: minilm-rerank (auto" in caplog.text
    assert describe_reranker("auto", AUTO_RERANKER) == "minilm-rerank (auto)"


def test_auto_passes_over_a_folder_that_is_no_cross_encoder(home, caplog):
    folder = models_dir() / AUTO_RERANKER  # e.g. a training run cut short
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"architectures": ["BertModel"]}))
    with caplog.at_level(logging.INFO, logger="rag.retrieval.rerank"):
        assert resolve_reranker("auto") is None
    assert "no valid cross-encoder" in caplog.text


@pytest.mark.parametrize("setting", [None, "", "none", "None"])
def test_none_turns_reranking_off(trained_reranker, setting):
    assert resolve_reranker(setting) is None
    assert describe_reranker(setting, None) == "off"


def test_none_from_toml_is_off(trained_reranker, tmp_path):
    path = tmp_path / "rag.toml"
    path.write_text('rerank = "none"\nrerank-depth = 12\n')
    cfg = load_config(path)
    assert (cfg.retrieval.rerank, cfg.retrieval.rerank_depth) == (None, 12)


def test_an_explicit_reranker_must_exist_and_the_error_names_it(home):
    with pytest.raises(ModelNotFoundError, match="no-such-reranker"):
        resolve_reranker("no-such-reranker")


def test_an_explicit_reranker_is_used_as_named(trained_reranker, tmp_path):
    other = save_tiny_cross_encoder(tmp_path / "my-ce", seed=1)
    assert resolve_reranker(str(other)) == str(other)
    assert resolve_reranker(AUTO_RERANKER) == AUTO_RERANKER


def test_an_explicit_folder_that_is_no_cross_encoder_is_refused(home, tmp_path):
    folder = tmp_path / "bi-encoder"
    folder.mkdir()
    (folder / "modules.json").write_text("[]")
    with pytest.raises(ValueError, match="not a cross-encoder"):
        resolve_reranker(str(folder))


def test_rerank_depth_must_be_positive(home):
    with pytest.raises(ValueError, match="--rerank-depth"):
        RAGConfig.of(rerank_depth=0)


# ---------------------------------------------------------------------------- reranker: the CLIs


def test_ask_parses_the_rerank_flags(home):
    argv = ["q", "--rerank", "none", "--rerank-depth", "10", "--rerank-weight", "0.5"]
    cfg = config_from_args(ask.build_parser().parse_args(argv))
    got = cfg.retrieval
    assert (got.rerank, got.rerank_depth, got.rerank_weight) == (None, 10, 0.5)
    assert config_from_args(ask.build_parser().parse_args(["q"])).retrieval.rerank == "auto"


def test_serve_and_ui_take_the_same_flags(home):
    from rag.serve.app import build_parser as serve_parser
    from ui.config import parse_args

    argv = ["--rerank", "none", "--rerank-depth", "10", "--rerank-weight", "0.5"]
    cfg = config_from_args(serve_parser().parse_args(argv)).retrieval
    assert (cfg.rerank, cfg.rerank_depth, cfg.rerank_weight) == (None, 10, 0.5)
    ui = parse_args(argv).rag.retrieval
    assert (ui.rerank, ui.rerank_depth, ui.rerank_weight) == (None, 10, 0.5)


def test_ask_names_a_missing_reranker_before_loading_anything(home, capsys):
    assert ask.main(["q", "--index", "x", "--rerank", "no-such-reranker"]) == 2
    err = capsys.readouterr().err
    assert "--rerank" in err and "no-such-reranker" in err


# ---------------------------------------------------------------------------- reranker: in use


@pytest.fixture
def tiny_index(home, tmp_path, tiny_mlm_dir):
    """Index "docs" built with the tiny encoder (given explicitly)."""
    ingest([write_docs(tmp_path / "docs")], index="docs", encoder=str(tiny_mlm_dir), progress=False)
    return "docs"


def test_pipeline_reranks_with_the_trained_model_and_names_it(trained_reranker, tiny_index):
    from rag.pipeline import RAGPipeline

    pipe = RAGPipeline(RAGConfig.of(index=tiny_index), generator=FakeGenerator("Loop [1]."))
    answer = pipe.answer("how do I read a file line by line")
    assert pipe.retriever.reranker.name == AUTO_RERANKER
    assert answer.reranker == AUTO_RERANKER and answer.to_dict()["reranker"] == AUTO_RERANKER
    assert all(h.mode == "rerank" for h in pipe.retrieve("read a file", k=3))

    assert f"(passages reranked by {AUTO_RERANKER})" in ask.format_sources(answer)

    off = RAGPipeline(RAGConfig.of(index=tiny_index, rerank="none"), generator=FakeGenerator("x"))
    assert off.answer("how do I read a file").reranker is None
    assert off.retriever.reranker is None


def test_search_reports_the_reranker(trained_reranker, tiny_index, capsys):
    assert search.main(["read a file", "--index", tiny_index, "--k", "2", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["reranker"] == AUTO_RERANKER and {h["mode"] for h in out["hits"]} == {"rerank"}
    argv = ["read a file", "--index", tiny_index, "--rerank", "none", "--json"]
    assert search.main(argv) == 0
    assert json.loads(capsys.readouterr().out)["reranker"] is None


def test_health_names_the_reranker(trained_reranker):
    from fastapi.testclient import TestClient

    from rag.serve.app import create_app

    app = create_app(RAGConfig.of(index="docs"), lambda cfg: None)
    assert TestClient(app).get("/health").json()["reranker"] == AUTO_RERANKER
    app = create_app(RAGConfig.of(index="docs", rerank=None), lambda cfg: None)
    assert TestClient(app).get("/health").json()["reranker"] is None


def test_ui_shows_the_active_reranker_and_can_turn_it_off(trained_reranker):
    from ui.config import AppConfig
    from ui.handlers import ChatApp
    from ui.state import NO_RERANKER

    listed_index(indexes_dir() / "docs")
    built = []
    app = ChatApp(AppConfig.of(index="docs"), lambda cfg: built.append(cfg) or cfg)
    assert (
        app.config.rag.retrieval.rerank == AUTO_RERANKER
        and "minilm-rerank (auto)" in app.reranker_line
    )
    models = app.models()
    assert models["rerankers"][0] == NO_RERANKER and AUTO_RERANKER in models["rerankers"]
    assert AUTO_RERANKER not in models["encoders"]  # a cross-encoder is no bi-encoder
    base = ("docs", "(index default)", "smollm2", "(none)")
    app._pipeline(*base)  # a /chat client that predates the setting: the app's reranker
    app._pipeline(*base, NO_RERANKER, 25.0)
    want = [(AUTO_RERANKER, DEFAULTS.rerank_depth), (None, 25)]
    assert [(c.retrieval.rerank, c.retrieval.rerank_depth) for c in built] == want


def test_ui_page_has_the_reranker_setting(trained_reranker):
    from ui.app import build_app
    from ui.config import AppConfig

    demo = build_app(AppConfig.of(index="docs"), lambda cfg: None)
    props = [c.get("props", {}) for c in demo.config["components"]]
    (dropdown,) = [p for p in props if p.get("label") == "Reranker"]
    assert dropdown["value"] == AUTO_RERANKER
    assert any(str(p.get("label", "")).startswith("Rerank depth") for p in props)
    assert any("reranker: minilm-rerank (auto)" in str(p.get("value", "")) for p in props)


# ---------------------------------------------------------------------------- encoder: auto


def test_default_encoder_is_the_baseline_without_the_tuned_artefact(home):
    assert default_encoder() == BASE_ENCODER == "minilm"


def test_a_new_index_gets_the_tuned_encoder(home, tmp_path, tiny_mlm_dir, capsys):
    shutil.copytree(tiny_mlm_dir, models_dir() / TUNED_ENCODER)  # a SentenceTransformer folder
    assert default_encoder() == TUNED_ENCODER
    docs = write_docs(tmp_path / "docs")
    assert ingest_main([str(docs), "--index", "fresh", "--encoder", "auto", "--no-progress"]) == 0
    assert recorded_encoder("fresh") == TUNED_ENCODER
    assert f"encoder {TUNED_ENCODER} (--encoder auto)" in capsys.readouterr().err


def test_an_existing_index_keeps_its_encoder(home, tmp_path, tiny_mlm_dir):
    """Built before the tuned encoder existed; re-ingest (changed files, so something is
    embedded) neither switches it nor fails, given no encoder or auto."""
    shutil.copytree(tiny_mlm_dir, models_dir() / "base-enc")
    docs = write_docs(tmp_path / "docs")
    ingest([docs], index="old", encoder="base-enc", progress=False)
    shutil.copytree(tiny_mlm_dir, models_dir() / TUNED_ENCODER)
    for i, encoder in enumerate((None, "auto")):
        (docs / "files.md").write_text(f"# Files\n\nEdition {i}: read a file line by line.\n")
        report = ingest([docs], index="old", encoder=encoder, progress=False)
        # no note about the encoder (the precision note says what auto chose, as on every ingest)
        notes = [n for n in report.notes if not n.startswith("--precision auto:")]
        assert report.ok and report.chunks_embedded > 0 and not notes
        assert recorded_encoder("old") == "base-enc"
