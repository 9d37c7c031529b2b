"""benchmarks.decode_variants: variant specs, the greedy comparison, and one tiny end-to-end run
(tiny random Llama folder, no compile: seconds) that writes results.json, the plot and the table."""

from __future__ import annotations

import json

import pytest
from generate_support import save_tiny_llama

from benchmarks.decode_variants import first_difference, main, parse_variant
from rag.generate.speed import DecodeSpeed


def test_parse_variant():
    assert parse_variant("eager", "auto") == (DecodeSpeed(), "auto")
    assert parse_variant("int8+static", "auto") == (DecodeSpeed(int8=True, cache="static"), "auto")
    assert parse_variant("fp32+compile", "auto") == (DecodeSpeed(compile=True), "fp32")
    with pytest.raises(ValueError, match="'int4'"):
        parse_variant("int4", "auto")
    with pytest.raises(ValueError, match="--decoder-compile"):
        parse_variant("int8+compile", "auto")


def test_first_difference():
    assert first_difference([1, 2, 3], [1, 2, 3]) is None
    assert first_difference([1, 2, 3], [1, 5, 3]) == 1
    assert first_difference([1, 2], [1, 2, 3]) == 2


def test_tiny_run_writes_results_and_table(tmp_path, capsys):
    model_dir = save_tiny_llama(tmp_path / "tiny")
    out = tmp_path / "out"
    argv = [
        "--decoder", str(model_dir), "--variants", "fp32,fp32+int8,fp32+static", "--threads", "1",
        "--prompt-tokens", "400", "--short-prompt-tokens", "250", "--new-tokens", "6",
        "--repeats", "2", "--out", str(out),
    ]  # fmt: skip
    assert main(argv) == 0
    result = json.loads((out / "results.json").read_text())
    assert (out / "decode_variants.png").stat().st_size > 0
    rows = {r["variant"]: r for r in result["variants"]}
    assert result["baseline"] == "fp32" and rows["fp32"]["greedy_match"]
    assert rows["fp32+static"]["greedy_match"]  # the static cache is exact in float32
    assert rows["fp32+int8"]["options"]["int8"] is True
    assert all(r["runs"] == 2 and r["decode_tokens_per_s"] > 0 for r in rows.values())
    table = [line for line in capsys.readouterr().out.splitlines() if line.startswith("|")]
    assert len(table) == 2 + 3 and table[-1].startswith("| fp32+static | float32 |")
    assert main([*argv, "--variants", "eager,paged"]) == 2  # a bad spec: one line, exit 2
