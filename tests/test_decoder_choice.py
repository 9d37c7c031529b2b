"""Which decoder, adapter, prompt profile and precision answer: the rules users rely on."""

from __future__ import annotations

import json

import pytest

from rag.answer.prompt import DEMOS, REFUSAL, SYSTEM_PROMPT, build_messages
from rag.models import (
    DECODER_ALIASES,
    DEFAULT_ADAPTER,
    DEFAULT_DECODER,
    describe_decoder,
    pick_profile,
    resolve_adapter,
    resolve_factoid_decoder,
)
from rag.models.precision import check_precision, float_precision, torch_dtype


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("RAG_HOME", str(tmp_path))
    (tmp_path / "models").mkdir()
    return tmp_path


def _adapter(home, name, profile=None):
    folder = home / "models" / name
    folder.mkdir()
    (folder / "adapter_config.json").write_text("{}")
    if profile:
        (folder / "run.json").write_text(json.dumps({"profile": profile}))
    return folder


def test_auto_adapter_is_the_one_trained_for_the_decoder_else_none(home):
    assert resolve_adapter("qwen2.5-coder-0.5b", "auto") is None
    assert "zero-shot" in describe_decoder("qwen2.5-coder-0.5b", "auto")
    # nothing needs training for the default: the line does not send the user to make models
    assert "make models" not in describe_decoder("qwen2.5-coder-0.5b", "auto")
    # a k-passage adapter from before the reader is never what auto picks
    _adapter(home, "qwen2.5-coder-0.5b-lora")
    assert resolve_adapter("qwen2.5-coder-0.5b", "auto") is None
    _adapter(home, "qwen2.5-coder-0.5b-span-lora")
    assert resolve_adapter("qwen2.5-coder-0.5b", "auto") == "qwen2.5-coder-0.5b-span-lora"
    assert "LoRA adapter qwen2.5-coder-0.5b-span-lora" in describe_decoder(
        "qwen2.5-coder-0.5b", "auto"
    )
    assert DEFAULT_ADAPTER == "auto"  # the product's default: the adapter when it was trained
    assert resolve_adapter("smollm2", "auto") is None  # another decoder's adapter is not used
    assert resolve_adapter("qwen2.5-coder-0.5b", "none") is None
    assert resolve_adapter("qwen2.5-coder-0.5b", "my-adapter") == "my-adapter"


def test_the_factoid_decoder_is_the_larger_one_only_beside_the_default_and_when_installed(
    home, monkeypatch
):
    from rag.models import registry

    installed = {"yes": True}
    monkeypatch.setattr(registry, "is_installed", lambda pkg: installed["yes"])
    assert resolve_factoid_decoder(DEFAULT_DECODER, "auto") == "qwen2.5-coder-1.5b"
    assert resolve_factoid_decoder("smollm2", "auto") == "smollm2"  # a chosen decoder stays
    assert resolve_factoid_decoder(DEFAULT_DECODER, "same") == DEFAULT_DECODER
    assert resolve_factoid_decoder(DEFAULT_DECODER, "smollm2") == "smollm2"
    installed["yes"] = False  # make setup not run (or the parts removed): the 0.5B copies them
    assert resolve_factoid_decoder(DEFAULT_DECODER, "auto") == DEFAULT_DECODER


def test_the_larger_decoder_counts_as_installed_by_its_parts_or_its_engine_folder(home):
    from rag.models.gguf import GGUF_PACKAGES, is_installed

    pkg = GGUF_PACKAGES["qwen2.5-coder-1.5b"]
    folder = home / "models" / f"{pkg.alias}-gguf"
    folder.mkdir()
    assert is_installed(pkg) == _parts_installed(pkg)
    (folder / "model.gguf").write_bytes(b"x")
    (folder / "run.json").write_text("{}")
    assert is_installed(pkg)  # built once from the parts: the parts may have gone since


def _parts_installed(pkg) -> bool:
    import importlib.util

    names = [pkg.package.format(i=i).replace("-", "_") for i in range(1, pkg.parts + 1)]
    return all(importlib.util.find_spec(n) is not None for n in names)


def test_profile_follows_the_adapter_then_the_alias_then_run_json(home):
    assert pick_profile("qwen2.5-coder-0.5b") == "fewshot"
    assert pick_profile("smollm2") == "plain"
    # an adapter was trained on one format: its own record wins, and without one it is plain
    a = _adapter(home, "qwen-lora-a", profile="plain")
    _adapter(home, "qwen-lora-b")
    assert pick_profile("qwen2.5-coder-0.5b", str(a)) == "plain"
    assert pick_profile("qwen2.5-coder-0.5b", "qwen-lora-b") == "plain"
    folder = home / "models" / "my-decoder"
    folder.mkdir()
    (folder / "run.json").write_text(json.dumps({"profile": "fewshot"}))
    assert pick_profile(str(folder)) == "fewshot"
    assert pick_profile(str(home / "nowhere")) == "plain"


def test_decoder_precision_choice():
    """The decoder's float weights for each precision: fp32 / bf16 as given, auto (and int8,
    whose prompt runs on the float weights) bf16 where bf16 is fast."""
    import torch

    assert torch_dtype(float_precision("fp32", "cpu")) is torch.float32
    assert torch_dtype(float_precision("bf16", "cpu")) is torch.bfloat16
    assert torch_dtype(float_precision("auto", "cuda")) is torch.bfloat16
    assert torch_dtype(float_precision("int8", "cuda")) is torch.bfloat16
    with pytest.raises(ValueError, match="--decoder-precision must be one of auto, fp32"):
        check_precision("fp8", "--decoder-precision")


def test_fewshot_head_is_fixed_and_demos_never_refuse():
    a = build_messages("q1?", ["p"], "fewshot")
    b = build_messages("another?", ["x", "y"], "fewshot")
    assert a[:-1] == b[:-1] and a[0]["content"] == SYSTEM_PROMPT
    assert len(a) == 2 + 2 * len(DEMOS) and a[-1]["role"] == "user"
    answers = [m["content"] for m in a[1:-1] if m["role"] == "assistant"]
    assert answers and all("[" in t and t != REFUSAL for t in answers)
    assert build_messages("q", ["p"]) == build_messages("q", ["p"], "plain")
    with pytest.raises(ValueError, match="prompt profile"):
        build_messages("q", ["p"], "chatty")


def test_the_default_decoder_is_a_known_alias():
    assert DEFAULT_DECODER in DECODER_ALIASES
