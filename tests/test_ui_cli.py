"""ui.app's command line and settings checks: bad values stop with a one-line reason."""

from __future__ import annotations

import json

import pytest

from rag.storage.paths import CURRENT, indexes_dir, models_dir
from ui.app import AppConfig, main, parse_args
from ui.state import SettingError, check_index_name, list_models


def test_defaults_are_safe():
    cfg = parse_args([])
    assert cfg.host == "127.0.0.1" and cfg.port == 7860 and cfg.max_upload_mb == 10


def test_flags_map_to_config():
    cfg = parse_args(["--index", "pydocs", "--decoder", "dec", "--k", "3", "--no-preload"])
    rag = cfg.rag
    assert (rag.index, rag.generate.decoder, rag.retrieval.k) == ("pydocs", "dec", 3)
    assert cfg.preload is False


@pytest.mark.parametrize(
    "argv,msg",
    [
        (["--mode", "fuzzy"], "--mode"),
        (["--index", "../etc"], "not allowed"),
        (["--k", "0"], "--k must be positive"),
    ],
)
def test_bad_flags_exit_2_with_reason(argv, msg, capsys):
    """A bad flag value (argparse), index name or setting: exit 2, one line (rag.cli)."""
    try:
        code = main(argv)
    except SystemExit as e:  # argparse's own refusal
        code = e.code
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and msg in err[0] and err[0].startswith("ui.app: error:")


def test_app_config_embeds_rag_config():
    cfg = parse_args(["--mode", "bm25", "--encoder", "none", "--adapter", "auto"])
    ret, gen = cfg.rag.retrieval, cfg.rag.generate
    assert (ret.mode, ret.encoder, gen.adapter) == ("bm25", None, "auto")
    assert (cfg.rag.index, gen.max_new_tokens) == ("docs", 128)  # the UI's own defaults
    app = AppConfig.of(index="x", k=3, decoder="d", port=1)  # flat names go to their sections
    assert (app.rag.retrieval.k, app.rag.generate.decoder, app.port) == (3, "d", 1)


def test_every_setting_is_a_flag(tmp_path, monkeypatch):
    """The settings flags come from rag.add_config_args (none excluded); the app reads no
    rag.toml, only its flags over its own defaults."""
    from rag.config import field_sections
    from ui.config import EXCLUDED, build_parser

    flags = {a.dest for a in build_parser()._actions}
    assert set(field_sections()) - set(EXCLUDED) <= flags
    assert all(reason.strip() for reason in EXCLUDED.values())
    monkeypatch.chdir(tmp_path)
    (tmp_path / "rag.toml").write_text("index = 'elsewhere'\n[retrieval]\nk = 9\n")
    cfg = parse_args(["--where", "type=pdf", "--where", "path=a/*", "--temperature", "0.5"])
    assert (cfg.rag.index, cfg.rag.retrieval.k) == ("docs", 5)
    assert cfg.rag.retrieval.where == ("type=pdf", "path=a/*")
    assert cfg.rag.generate.temperature == 0.5


@pytest.mark.parametrize("name", ["../x", "/etc", "a/b", ".hidden", "", "a..b"])
def test_index_names_are_names_not_paths(name):
    with pytest.raises(SettingError):
        check_index_name(name)


def test_model_lists_split_by_kind(tmp_path, monkeypatch):
    monkeypatch.setenv("RAG_HOME", str(tmp_path))
    root = models_dir()
    for name, files in {
        "my-decoder": {"config.json": {"architectures": ["ModernBertDecoderForCausalLM"]}},
        "my-encoder": {"config.json": {"architectures": ["ModernBertModel"]}},
        "my-adapter": {"adapter_config.json": {}},
    }.items():
        (root / name).mkdir(parents=True, exist_ok=True)
        for fname, data in files.items():
            (root / name / fname).write_text(json.dumps(data))
    m = list_models()
    assert "my-decoder" in m["decoders"] and "smollm2" in m["decoders"]
    assert "my-encoder" in m["encoders"] and "minilm" in m["encoders"]
    assert "my-adapter" in m["adapters"] and "my-decoder" not in m["encoders"]


def test_sessions_share_the_pipeline_of_the_same_models(tmp_path, monkeypatch):
    """The app keeps its pipelines in the server's cache (rag.Pipelines), keyed by the whole
    config: the page's models over the app's config. The per-request settings never enter it,
    so the same models share one pipeline; another rerank depth or decoder is another one."""
    from ui.handlers import ChatApp

    monkeypatch.setenv("RAG_HOME", str(tmp_path))
    (indexes_dir() / "docs").mkdir(parents=True)
    (indexes_dir() / "docs" / CURRENT).write_text("g1")
    built = []
    app = ChatApp(AppConfig.of(rerank="none", adapter="none"), lambda c: built.append(c) or c)
    page = ("docs", "(index default)", "smollm2", "(none)")
    first = app._pipeline(*page)
    assert app._pipeline(*page) is first and app._pipeline(*page, "(off)", 10) is first
    app._pipeline(*page, "(off)", 25)
    app._pipeline("docs", "(index default)", "qwen2.5-coder-0.5b", "(none)")
    got = [(c.generate.decoder, c.retrieval.rerank, c.retrieval.rerank_depth) for c in built]
    assert got == [("smollm2", None, 10), ("smollm2", None, 25), ("qwen2.5-coder-0.5b", None, 10)]
    assert all(c.rewrite_query is not None for c in built)  # a conversation's config
