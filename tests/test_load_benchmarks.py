"""The load benchmarks in seconds. benchmarks.serve_load end to end on loopback: the real chat
UI (gradio_client) and the real HTTP API (openai client, streamed) over the real pipeline,
batching off and on, with a tiny random Llama as the decoder (tests/generate_support.py: real
``Generator`` and real ``BatchedDecoder``) and a one-passage retriever (tests/serve_support.py).
Failed requests (the pipeline raising: the UI's Error reply, the API's 500) are counted as
errors, never as answers. benchmarks.concurrent_load's decoder-only loop on the same shared
session loop (benchmarks.loadgen). benchmarks.ui_load is run in tests/test_ui_api.py.
"""

from __future__ import annotations

import json

import pytest
from generate_support import build_model, build_tokenizer, require_openvino_smollm2
from ingest_support import listed_index
from serve_support import FakeRetriever

from benchmarks.serve_load import ServeLoadConfig, SharedModels, main, markdown, run
from rag.storage.paths import indexes_dir

pytestmark = pytest.mark.server

INDEX = "bench"


@pytest.fixture(scope="module")
def generator():
    from rag.generate.generator import Generator

    tok = build_tokenizer()
    model = build_model("llama", tok, max_positions=2048)
    return Generator(model, tok, "cpu", prompt_cache_mb=16)


@pytest.fixture
def index():
    listed_index(indexes_dir() / INDEX)  # both front ends list it
    return INDEX


def config(tmp_path, **kw) -> ServeLoadConfig:
    settings = dict(
        index=INDEX, sessions=2, duration=1.0, max_new_tokens=16, max_batch=4, device="cpu",
        decoder_precision="fp32", out=str(tmp_path),
    )  # fmt: skip
    return ServeLoadConfig(**{**settings, **kw})


def test_batched_run_gets_a_prompt_cache_while_the_plain_one_is_empty(generator, tmp_path):
    """A run of batching on alone (``--modes on``) measures with the prompt cache too: an
    empty PromptCache is falsy, which once left the batched decoder without one."""
    generator.clear_prefix_cache()
    assert generator.prompts is not None and len(generator.prompts) == 0
    cfg = config(tmp_path, modes="on")
    models = SharedModels(cfg.rag_config(), retriever=FakeRetriever(), generator=generator)
    try:
        batched = models.generator(True, cfg.max_batch)
        assert batched.prompts is not None
        assert batched.prompts.max_bytes == cfg.prompt_cache_mb * 2**20
        assert batched.batcher.prompt_cache is batched.prompts
    finally:
        models.close()


@pytest.mark.slow  # test_ui_api runs the load benchmark against the app in the fast suite
def test_ui_and_api_batching_off_and_on_side_by_side(index, generator, tmp_path):
    cfg = config(tmp_path, target="both", modes="off,on")
    models = SharedModels(cfg.rag_config(), retriever=FakeRetriever(), generator=generator)
    result = run(cfg, models=models)

    runs = result["runs"]
    assert [(r["target"], r["mode"]) for r in runs] == [
        ("ui", "off"), ("ui", "on"), ("api", "off"), ("api", "on"),
    ]  # fmt: skip
    for r in runs:
        assert r["errors"] == 0, r["error_examples"]
        assert r["requests"] >= 2 and len(r["samples"]) == r["requests"]
        assert r["throughput_req_s"] > 0
        assert (
            0 < r["p50_ttft_s"] <= r["p95_latency_s"] and r["p50_latency_s"] <= r["p95_latency_s"]
        )
        assert r["cpu_s"] > 0 and r["load_avg_1m_start"] >= 0
        assert (r["mean_batch"] is None) == (r["mode"] == "off")
        # each run starts cold; the sessions repeat the built-in questions, so prompts recur
        assert 0 < r["prompt_reused"] < 1
    assert all(r["mean_batch"] >= 1 for r in runs if r["mode"] == "on")
    assert set(result["speedup"]) == {"ui", "api"}

    saved = json.loads((tmp_path / "results.json").read_text())
    assert saved["config"]["sessions"] == 2 and len(saved["runs"]) == 4
    assert (tmp_path / "serve_load.png").stat().st_size > 0
    table = markdown(result)
    for target in ("ui", "api"):
        assert f"| {target} | off | 1 |" in table and f"| {target} | on | 1 |" in table


class BrokenModels(SharedModels):
    """Every pipeline fails to build: each request must come back as an error."""

    def pipeline(self, cfg):
        raise RuntimeError("boom")


def test_failed_requests_are_counted_as_errors(index, generator, tmp_path):
    cfg = config(tmp_path, target="both", modes="on", duration=0.5)
    models = BrokenModels(cfg.rag_config(), retriever=FakeRetriever(), generator=generator)
    result = run(cfg, models=models)

    assert [r["target"] for r in result["runs"]] == ["ui", "api"]
    for r in result["runs"]:
        assert r["requests"] == 0 and r["errors"] >= 2, r
        assert r["p50_latency_s"] is None and r["error_examples"]
    ui, api = (r["error_examples"][0] for r in result["runs"])
    assert "RequestError" in ui and "internal error (RuntimeError)" in ui
    assert "InternalServerError" in api


def test_distinct_questions_from_a_file_never_repeat_across_sessions(tmp_path):
    qfile = tmp_path / "qs.txt"
    qfile.write_text("# a comment\n" + "".join(f"question {i}?\n" for i in range(12)) + "\n")
    cfg = config(tmp_path, questions=str(qfile), sessions=3)
    cfg.check()
    req = cfg.request()
    asked = [req.question(s, j) for j in range(4) for s in range(3)]
    assert sorted(asked) == sorted(f"question {i}?" for i in range(12))  # each once
    assert req.question(0, 4) == "question 0?"  # then around again
    assert config(tmp_path).request().question(1, 0) == "and how is it tested?"  # built-in


@pytest.mark.parametrize(
    "argv",
    [
        ["--questions", "/nonexistent/questions.txt"],
        ["--prompt-cache-mb", "-1"],
        ["--modes", "sideways"],
        ["--modes", "on,on"],
        ["--target", "cli"],
        ["--sessions", "0"],
        ["--target", "ui", "--max-new-tokens", "8"],  # under the UI slider's minimum
    ],
)
def test_bad_flags_exit_2_before_loading_models(argv, capsys):
    try:
        status = main(argv)
    except SystemExit as e:  # argparse refuses a bad choice itself
        status = e.code
    assert status == 2
    assert capsys.readouterr().err.startswith("benchmarks.serve_load: error:")


def test_concurrent_load_modes_share_the_session_loop(generator):
    from benchmarks.concurrent_load import LoadConfig, agreement, build_prompts, run_mode
    from rag.generate.generator import Generator

    cfg = LoadConfig(sessions=2, duration=1.0, max_new_tokens=8, prompts_per_session=2)
    batched = Generator(generator.model, generator.tokenizer, "cpu", batching=True, max_batch=4)
    prompts = build_prompts(generator, cfg)
    runs = []
    try:
        for mode, gen in (("off", generator), ("on", batched)):
            res = run_mode(gen, prompts, cfg)
            assert res["errors"] == 0 and res["requests"] >= 2, res["error_examples"]
            assert res["p50_ttft_s"] <= res["p95_latency_s"]
            runs.append({"mode": mode, **res})
    finally:
        batched.batcher.close()
    assert "mean_batch" not in runs[0] and runs[1]["mean_batch"] >= 1
    agree = agreement(runs)  # float32 greedy: the same answers batched or not
    assert agree["prompts"] >= 1 and agree["same"] == agree["prompts"]


@pytest.mark.slow  # converts and compiles the tiny decoder for OpenVINO: ~45 s on a 2-core AVX2 CPU
def test_the_openvino_engine_serves_both_modes_with_its_own_batching(index, tmp_path):
    """On OpenVINO GenAI (SmolLM2's packaged GGUF) batching on is a second engine pipeline
    scheduling ``max_batch`` sequences, off the one that runs one at a time; the API answers
    through both with no error, and the result names the engine."""
    require_openvino_smollm2()
    from rag.generate.load import load_decoder
    from rag.generate.ov_engine import OpenVINOGenerator

    cfg = config(tmp_path, target="api", modes="off,on", decoder="smollm2", engine="openvino")
    base = cfg.rag_config()
    plain = load_decoder(base.generate.replace(batching=False), "cpu", None)
    models = SharedModels(base, retriever=FakeRetriever(), generator=plain)
    batched = models.generator(True, cfg.max_batch)
    assert isinstance(batched, OpenVINOGenerator) and batched is not plain
    assert models.generator(True, cfg.max_batch) is batched  # loaded once
    result = run(cfg, models=models)
    plain.close()
    assert result["engine"] == "openvino"
    for r in result["runs"]:
        assert r["errors"] == 0, r["error_examples"]
        assert r["requests"] >= 2 and r["mean_batch"] is None  # the engine keeps its own


def test_runs_copy_factoids_with_the_decoder_the_server_would_load(tmp_path, monkeypatch):
    """Beside the default 0.5B with the 1.5B installed, each mode's pipelines get the factoid
    decoder loaded with that mode's generation settings (one unbatched, one batched engine),
    once; with another decoder, or a generator passed in, the pipeline's own copies them."""
    import rag.pipeline
    from rag.config import with_overrides
    from rag.models import registry

    loaded = []

    def fake_load(settings, device="auto"):  # resolves factoid_decoder itself, as the real one
        loaded.append((settings.factoid_decoder, settings.batching, settings.max_batch))
        return f"factoid-{len(loaded)}"

    monkeypatch.setattr(registry, "is_installed", lambda pkg: True)
    monkeypatch.setattr(rag.pipeline, "load_factoid_decoder", fake_load)
    base = config(tmp_path, decoder="qwen2.5-coder-0.5b").rag_config()
    models = SharedModels(base, retriever=FakeRetriever())
    assert models.factoid(False, 4) == models.factoid(False, 4) == "factoid-1"
    on = with_overrides(base, batching=True, max_batch=4)
    models._generators[4] = "batched-0.5b"  # the answering decoder is not what is tested here
    pipe = models.pipeline(on)
    assert pipe.factoid_generator == "factoid-2" and pipe.generator == "batched-0.5b"
    assert loaded == [("auto", False, 4), ("auto", True, 4)]
    other = SharedModels(
        config(tmp_path, decoder="smollm2").rag_config(), retriever=FakeRetriever()
    )
    given = SharedModels(base, retriever=FakeRetriever(), generator="gen")
    assert other.factoid(True, 4) is None and given.factoid(True, 4) is None
    assert len(loaded) == 2
