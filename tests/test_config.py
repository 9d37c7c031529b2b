"""RAGConfig and rag.toml: sections, layering, the old flat form, and errors that name key and
file."""

from __future__ import annotations

import argparse
import logging

import pytest

from rag.answer.settings import AnswerSettings
from rag.config import (
    ConfigError,
    RAGConfig,
    add_config_args,
    build_config,
    config_from_args,
    field_sections,
    load_config,
    section_fields,
    with_overrides,
)
from rag.generate.settings import GenerationSettings
from rag.retrieval.settings import RetrievalSettings


def test_defaults_are_the_sections_defaults():
    from rag.models import DEFAULT_DECODER

    cfg = RAGConfig()
    assert cfg.retrieval == RetrievalSettings()
    assert cfg.answer == AnswerSettings() and cfg.generate == GenerationSettings()
    assert (cfg.generate.decoder, cfg.retrieval.k, cfg.retrieval.mode) == (
        DEFAULT_DECODER,
        5,
        "hybrid",
    )
    assert (cfg.generate.adapter, cfg.generate.decoder_precision) == ("auto", "auto")
    assert (cfg.answer.reader, cfg.answer.reader_threshold, cfg.answer.compose) == (
        "auto",
        None,
        "decoder",
    )


def test_flat_names_are_unique_and_route_to_their_section():
    where = field_sections()
    assert where["k"] == "retrieval" and where["fusion"] == "retrieval"
    assert where["reader"] == "answer" and where["decoder"] == "generate"
    assert where["index"] is None and where["device"] is None
    assert "device" not in section_fields("retrieval")  # the config's own, one for every model
    cfg = RAGConfig.of(index="x", k=3, decoder="smollm2", reader="none", norm="zscore", depth=50)
    assert (cfg.retrieval.k, cfg.retrieval.norm, cfg.retrieval.depth) == (3, "zscore", 50)
    assert (cfg.generate.decoder, cfg.answer.reader) == ("smollm2", "none")


def test_the_config_device_is_the_retrieval_device():
    assert RAGConfig.of(device="cpu").retrieval.device == "cpu"
    cfg = RAGConfig(device="cpu", retrieval=RetrievalSettings(device="cuda"))
    assert cfg.retrieval.device == "cpu"


def test_toml_then_overrides(tmp_path):
    path = tmp_path / "rag.toml"
    path.write_text(
        'index = "pydocs"\n[retrieval]\nk = 3\nencoder = "none"\n[generate]\nmax-new-tokens = 64\n'
    )
    cfg = load_config(path, {"k": 7, "mode": None})
    assert cfg.index == "pydocs"
    assert cfg.retrieval.k == 7  # flag wins over file
    assert cfg.retrieval.mode == "hybrid"  # None override = not given
    assert cfg.generate.max_new_tokens == 64
    assert cfg.retrieval.encoder is None


def test_flat_and_sectioned_toml_load_to_equal_configs(tmp_path, caplog):
    """The old flat rag.toml still loads, to the same config as the sectioned one, with one
    note naming where each key lives now."""
    flat = tmp_path / "flat.toml"
    flat.write_text(
        'index = "pydocs"\nk = 3\nfusion = "rrf"\nalpha = 0.3\nwhere = ["type=md"]\n'
        'reader = "none"\nevidence-tokens = 200\ndecoder = "smollm2"\ntemperature = 0\n'
        'device = "cpu"\n'
    )
    sectioned = tmp_path / "sectioned.toml"
    sectioned.write_text(
        'index = "pydocs"\ndevice = "cpu"\n'
        '[retrieval]\nk = 3\nfusion = "rrf"\nalpha = 0.3\nwhere = ["type=md"]\n'
        '[answer]\nreader = "none"\nevidence-tokens = 200\n'
        '[generate]\ndecoder = "smollm2"\ntemperature = 0\n'
    )
    with caplog.at_level(logging.WARNING, logger="rag.config"):
        old = load_config(flat)
    notes = [r.getMessage() for r in caplog.records]
    assert (
        len(notes) == 1 and "k -> [retrieval]" in notes[0] and "decoder -> [generate]" in notes[0]
    )
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="rag.config"):
        new = load_config(sectioned)
    assert not caplog.records  # the sectioned form says nothing
    assert old == new
    assert new.retrieval.fusion == "rrf" and new.answer.evidence_tokens == 200
    assert RAGConfig.of(**old.flat()) == old  # flat names round-trip


def test_rag_table_with_sections_and_cwd_file(tmp_path, monkeypatch):
    (tmp_path / "rag.toml").write_text('[rag]\nindex = "x"\n[rag.generate]\ndecoder = "my-clm"\n')
    monkeypatch.chdir(tmp_path)
    cfg = load_config()
    assert cfg.index == "x" and cfg.generate.decoder == "my-clm"


def test_unknown_key_names_key_and_file(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text("[retrieval]\nk = 3\ntop_k = 9\n")
    with pytest.raises(ConfigError) as e:
        load_config(path)
    assert "top_k" in str(e.value) and str(path) in str(e.value)


def test_key_in_the_wrong_table_names_its_table(tmp_path):
    path = tmp_path / "rag.toml"
    path.write_text('[answer]\ndecoder = "smollm2"\n')
    with pytest.raises(ConfigError, match=r"'decoder' belongs to \[generate\], not \[answer\]"):
        load_config(path)


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ('[retrieval]\nk = "five"', "k must be int"),
        ('[retrieval]\nmode = "fuzzy"', "mode must be one of"),
        ("[retrieval]\nk = 0", "k must be positive"),
        ("[generate]\nmax_new_tokens = 0", "max-new-tokens must be >= 1"),
        ('[answer]\ncompose = "poem"', "compose must be one of"),
        ("[answer]\nreader_threshold = nan", "reader threshold must be a finite number"),
        ("k = [", "invalid TOML"),
        ("overlap = 999", "overlap"),
        ("retrieval = 3", "must be a table"),
        ('device = "tpu"', "device must be one of"),
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


def test_cli_flags_map_to_sections():
    parser = argparse.ArgumentParser()
    add_config_args(parser)
    args = parser.parse_args(
        ["--max-new-tokens", "32", "--no-prefix-cache", "--mode", "bm25", "--norm", "zscore"]
    )
    cfg = config_from_args(args, None)
    assert (cfg.generate.max_new_tokens, cfg.generate.prefix_cache) == (32, False)
    assert (cfg.retrieval.mode, cfg.retrieval.norm) == ("bm25", "zscore")
    assert cfg.to_dict()["generate"]["max_new_tokens"] == 32


def test_base_sits_under_the_file_and_the_flags(tmp_path):
    path = tmp_path / "rag.toml"
    path.write_text('[retrieval]\nmode = "bm25"\n')
    parser = argparse.ArgumentParser()
    add_config_args(parser)
    cfg = config_from_args(parser.parse_args([]), path, base={"k": 10, "mode": "dense"})
    assert (cfg.retrieval.k, cfg.retrieval.mode) == (10, "bm25")
    cfg = config_from_args(parser.parse_args(["--k", "2"]), path, base={"k": 10})
    assert cfg.retrieval.k == 2


def test_with_overrides_validates_and_keeps_the_rest():
    base = RAGConfig.of(index="a", decoder="smollm2")
    cfg = with_overrides(base, k=2, mode=None)
    assert cfg.retrieval.k == 2 and cfg.retrieval.mode == "hybrid"
    assert cfg.index == "a" and cfg.generate == base.generate  # untouched sections stay whole
    with pytest.raises(ConfigError):
        with_overrides(cfg, mode="nope")
    with pytest.raises(ConfigError, match="unknown setting"):
        build_config({"top_k": 3})


def test_static_cache_with_batching_is_refused_at_config_time():
    with pytest.raises(ConfigError, match="--no-batching"):
        RAGConfig.of(cache_implementation="static")
    assert RAGConfig.of(cache_implementation="static", batching=False).generate.batching is False


@pytest.mark.parametrize("key", ["backend", "chroma_url", "chunk-tokens", "overlap"])
def test_ingest_settings_point_to_rag_ingest(tmp_path, key):
    """Answering never read these (the index records its own backend and chunking): an old
    rag.toml holding one is told where the setting went, not silently ignored."""
    path = tmp_path / "rag.toml"
    path.write_text(f"{key} = 1\n")
    with pytest.raises(ConfigError, match="python -m rag.ingest"):
        load_config(path)


def test_flags_are_built_from_the_sections():
    """add_config_args is the one builder (rag.cli.flags) in layered mode: flags not given
    stay out of the namespace; choices and defaults come from the sections."""
    parser = argparse.ArgumentParser()
    add_config_args(parser, dict.fromkeys(set(field_sections()) - {"mode", "k", "encoder"}, "x"))
    assert vars(parser.parse_args([])) == {}
    assert vars(parser.parse_args(["--encoder", "none"])) == {"encoder": None}
    help_text = " ".join(parser.format_help().split())
    assert "{dense,bm25,hybrid}" in help_text and "(default: 5)" in help_text
    assert "--decoder" not in help_text
    with pytest.raises(SystemExit):
        parser.parse_args(["--mode", "fuzzy"])


def test_excluding_a_setting_that_does_not_exist_is_a_bug():
    with pytest.raises(AssertionError, match="top_k"):
        add_config_args(argparse.ArgumentParser(), {"top_k": "no such"})
