"""ui.app's command line and settings checks: bad values stop with a one-line reason."""

from __future__ import annotations

import json

import pytest

from rag.paths import models_dir
from ui.app import main, parse_args
from ui.state import SettingError, check_index_name, list_models


def test_defaults_are_safe():
    cfg = parse_args([])
    assert cfg.host == "127.0.0.1" and cfg.port == 7860 and cfg.max_upload_mb == 10


def test_flags_map_to_config():
    cfg = parse_args(["--index", "pydocs", "--decoder", "dec", "--k", "3", "--no-preload"])
    assert (cfg.index, cfg.decoder, cfg.k, cfg.preload) == ("pydocs", "dec", 3, False)


@pytest.mark.parametrize(
    "argv,code,msg", [(["--mode", "fuzzy"], 2, "--mode"), (["--index", "../etc"], 1, "not allowed")]
)
def test_bad_flags_exit_with_reason(argv, code, msg, capsys):
    assert main(argv) == code
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and msg in err[0]


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
