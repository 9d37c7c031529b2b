"""ui.app's command line and settings checks: bad values stop with a one-line reason."""

from __future__ import annotations

import json

import pytest

from rag.paths import models_dir
from ui.app import AppConfig, main, parse_args
from ui.state import SettingError, check_index_name, list_models


def test_defaults_are_safe():
    cfg = parse_args([])
    assert cfg.host == "127.0.0.1" and cfg.port == 7860 and cfg.max_upload_mb == 10


def test_flags_map_to_config():
    cfg = parse_args(["--index", "pydocs", "--decoder", "dec", "--k", "3", "--no-preload"])
    assert (cfg.rag.index, cfg.rag.decoder, cfg.rag.k, cfg.preload) == ("pydocs", "dec", 3, False)


@pytest.mark.parametrize(
    "argv,msg",
    [
        (["--mode", "fuzzy"], "--mode"),
        (["--index", "../etc"], "not allowed"),
        (["--k", "0"], "k must be >= 1"),
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
    assert (cfg.rag.mode, cfg.rag.encoder, cfg.rag.adapter) == ("bm25", None, "auto")
    assert (cfg.rag.index, cfg.rag.max_new_tokens) == ("docs", 128)  # the UI's own defaults
    assert AppConfig.of(index="x", k=3, port=1).rag.k == 3


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
