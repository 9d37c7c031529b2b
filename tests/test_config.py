"""RAGConfig and rag.toml: layering, kebab/snake keys, and errors that name key and file."""

from __future__ import annotations

import argparse

import pytest

from rag.config import (
    ConfigError,
    RAGConfig,
    add_config_args,
    config_from_args,
    load_config,
    with_overrides,
)


def test_defaults():
    from rag.models import DEFAULT_DECODER

    cfg = RAGConfig()
    assert (cfg.decoder, cfg.k, cfg.mode, cfg.encoder) == (DEFAULT_DECODER, 5, "hybrid", None)
    assert (cfg.adapter, cfg.decoder_precision, cfg.profile) == ("auto", "auto", "auto")
    assert (cfg.reader, cfg.reader_threshold, cfg.compose) == ("auto", None, "decoder")


def test_toml_then_overrides(tmp_path):
    path = tmp_path / "rag.toml"
    path.write_text('index = "pydocs"\nk = 3\nmax-new-tokens = 64\nencoder = "none"\n')
    cfg = load_config(path, {"k": 7, "mode": None})
    assert cfg.index == "pydocs"
    assert cfg.k == 7  # flag wins over file
    assert cfg.mode == "hybrid"  # None override = not given
    assert cfg.max_new_tokens == 64
    assert cfg.encoder is None


def test_rag_table_and_cwd_file(tmp_path, monkeypatch):
    (tmp_path / "rag.toml").write_text('[rag]\ndecoder = "my-clm"\ntemperature = 0\n')
    monkeypatch.chdir(tmp_path)
    cfg = load_config()
    assert cfg.decoder == "my-clm"
    assert cfg.temperature == 0.0 and isinstance(cfg.temperature, float)


def test_unknown_key_names_key_and_file(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text("k = 3\ntop_k = 9\n")
    with pytest.raises(ConfigError) as e:
        load_config(path)
    assert "top_k" in str(e.value) and str(path) in str(e.value)


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ('k = "five"', "k must be int"),
        ('mode = "fuzzy"', "mode must be one of"),
        ("k = 0", "k must be >= 1"),
        ("k = [", "invalid TOML"),
        ("overlap = 999", "overlap"),
    ],
)
def test_bad_values_are_errors(tmp_path, text, needle):
    path = tmp_path / "rag.toml"
    path.write_text(text + "\n")
    with pytest.raises(ConfigError, match=needle):
        load_config(path)


def test_missing_explicit_file_is_an_error(tmp_path):
    with pytest.raises(ConfigError, match="no such file"):
        load_config(tmp_path / "nope.toml")


def test_cli_flags_map_to_fields(tmp_path):
    parser = argparse.ArgumentParser()
    add_config_args(parser)
    args = parser.parse_args(["--max-new-tokens", "32", "--no-prefix-cache", "--mode", "bm25"])
    cfg = config_from_args(args, None)
    assert (cfg.max_new_tokens, cfg.prefix_cache, cfg.mode) == (32, False, "bm25")
    assert cfg.to_dict()["max_new_tokens"] == 32


def test_with_overrides_validates():
    cfg = with_overrides(RAGConfig(), k=2, mode=None)
    assert cfg.k == 2 and cfg.mode == "hybrid"
    with pytest.raises(ConfigError):
        with_overrides(cfg, mode="nope")


@pytest.mark.parametrize("key", ["backend", "chroma_url", "chunk-tokens", "overlap"])
def test_ingest_settings_point_to_rag_ingest(tmp_path, key):
    """Answering never read these (the index records its own backend and chunking): an old
    rag.toml holding one is told where the setting went, not silently ignored."""
    path = tmp_path / "rag.toml"
    path.write_text(f"{key} = 1\n")
    with pytest.raises(ConfigError, match="python -m rag.ingest"):
        load_config(path)


def test_flags_are_built_from_the_dataclass():
    """add_config_args is the one builder (rag.dataclass_cli) in layered mode: flags not given
    stay out of the namespace; choices and defaults come from RAGConfig."""
    parser = argparse.ArgumentParser()
    add_config_args(parser, ["mode", "k", "encoder"])
    assert vars(parser.parse_args([])) == {}
    assert vars(parser.parse_args(["--encoder", "none"])) == {"encoder": None}
    help_text = " ".join(parser.format_help().split())
    assert "{dense,bm25,hybrid}" in help_text and "(default: 5)" in help_text
    with pytest.raises(SystemExit):
        parser.parse_args(["--mode", "fuzzy"])
