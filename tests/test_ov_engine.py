"""The OpenVINO GenAI engine (rag.generate.ov_engine) and the GGUF it reads (rag.models.gguf): which
engine a config gets, re-encoding tensor types the engine cannot read, and a real model through
the engine (SmolLM2-135M's packaged GGUF): streaming equals generating, the token limit, stop
strings, concurrent requests and cancellation, and the engine's graph saved once and read back."""

from __future__ import annotations

import json
import os
import shutil
import threading
from pathlib import Path

import numpy as np
import pytest
from generate_support import require_openvino_smollm2

from rag.generate.engines import EngineUnavailable, choose_engine


def test_auto_takes_openvino_only_where_it_can_run_the_decoder(monkeypatch):
    monkeypatch.setattr("rag.generate.engines.openvino_available", lambda: True)
    assert choose_engine("auto", "qwen2.5-coder-0.5b", None, "cpu") == "openvino"
    assert choose_engine("auto", "smollm2", None, "cpu") == "openvino"
    assert choose_engine("auto", "/models/x.gguf", None, "cpu") == "openvino"
    assert choose_engine("auto", "qwen2.5-coder-0.5b", "some-lora", "cpu") == "torch"
    assert choose_engine("auto", "decoder-clm-small", None, "cpu") == "torch"
    assert choose_engine("auto", "qwen2.5-coder-0.5b", None, "cuda") == "torch"
    assert choose_engine("torch", "qwen2.5-coder-0.5b", None, "cpu") == "torch"
    with pytest.raises(EngineUnavailable, match="--engine openvino: .*LoRA adapter some-lora"):
        choose_engine("openvino", "qwen2.5-coder-0.5b", "some-lora", "cpu")
    monkeypatch.setattr("rag.generate.engines.openvino_available", lambda: False)
    assert choose_engine("auto", "qwen2.5-coder-0.5b", None, "cpu") == "torch"
    with pytest.raises(EngineUnavailable, match="not installed"):
        choose_engine("openvino", "qwen2.5-coder-0.5b", None, "cpu")


def test_the_config_refuses_an_unknown_engine():
    from rag.config import ConfigError, RAGConfig

    with pytest.raises(ConfigError, match="engine must be one of auto, torch, openvino"):
        RAGConfig.of(engine="llama")


def test_transcode_reencodes_unreadable_types_as_q8_0_and_keeps_the_rest(tmp_path):
    gguf = pytest.importorskip("gguf")
    from gguf.quants import dequantize, quantize

    from rag.models.gguf import context_length, engine_types_ok, transcode_gguf

    Q = gguf.GGMLQuantizationType
    rng = np.random.default_rng(0)
    w = rng.standard_normal((8, 64)).astype(np.float32)
    q5 = quantize(w, Q.Q5_0)
    src = tmp_path / "tiny.gguf"
    writer = gguf.GGUFWriter(str(src), "llama")
    writer.add_context_length(4096)
    writer.add_string("tokenizer.ggml.model", "gpt2")
    writer.add_tensor("blk.0.attn_q.weight", q5, raw_shape=q5.shape, raw_dtype=Q.Q5_0)
    writer.add_tensor("output_norm.weight", np.ones(64, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    assert not engine_types_ok(src)

    dst = tmp_path / "out.gguf"
    assert transcode_gguf(src, dst) == 1
    assert engine_types_ok(dst)
    reader = gguf.GGUFReader(dst)
    types = {t.name: t.tensor_type.name for t in reader.tensors}
    assert types == {"blk.0.attn_q.weight": "Q8_0", "output_norm.weight": "F32"}
    q = next(t for t in reader.tensors if t.name == "blk.0.attn_q.weight")
    before, after = dequantize(q5, Q.Q5_0), dequantize(q.data, Q.Q8_0)
    block_max = np.abs(before.reshape(-1, 32)).max(axis=1, keepdims=True)
    assert np.all(np.abs(after - before).reshape(-1, 32) <= block_max / 127)
    assert reader.fields["tokenizer.ggml.model"].contents() == "gpt2"
    assert context_length(dst) == 4096


def test_the_engines_precision_follows_the_decoder_precision_setting():
    """auto is f32 only for an answer-writing decoder on a CPU with AMX (where the engine would
    pick bf16 and decode slower, measured there), the engine's own choice elsewhere; fp32 /
    bf16 are asked for as given."""
    from rag.generate.ov_engine import inference_precision

    assert inference_precision("auto", amx=True) == "f32"
    assert inference_precision("auto", amx=False) is None
    assert [inference_precision(s, amx=a) for s in ("fp32", "bf16") for a in (True, False)] == [
        "f32",
        "f32",
        "bf16",
        "bf16",
    ]
    assert inference_precision("int8", amx=True) is None  # the GGUF's blocks are the engine's
    # a factoid copier's replies are a few tokens: bf16's faster prefill is what counts there
    assert inference_precision("auto", amx=True, short_replies=True) is None
    assert inference_precision("fp32", amx=True, short_replies=True) == "f32"


def test_the_settings_precision_reaches_the_engine(monkeypatch):
    require_openvino_smollm2()
    import openvino_genai as og

    from rag.generate.load import load_decoder
    from rag.generate.settings import GenerationSettings

    seen = []

    class Built(Exception):
        pass

    def build(path, sched, device, props):
        seen.append(props)
        raise Built  # the properties are what is checked: no model is compiled

    monkeypatch.setattr(og, "ContinuousBatchingPipeline", build)
    for precision in ("fp32", "bf16"):
        s = GenerationSettings(decoder="smollm2", engine="openvino", decoder_precision=precision)
        with pytest.raises(Built):
            load_decoder(s, device="cpu", adapter="none")
    assert [p.get("INFERENCE_PRECISION_HINT") for p in seen] == ["f32", "bf16"]


# ---------------------------------------------------------------------------- a real model


@pytest.fixture(scope="module")
def smol():
    require_openvino_smollm2()
    from rag.generate.ov_engine import OpenVINOGenerator

    gen = OpenVINOGenerator.load(
        "smollm2", prompt_cache_mb=64, max_batch=4, prompt_lookup=0
    )  # the plain engine: prompt lookup has its own fixture below
    yield gen
    gen.close()


def messages(gen, question="What is the capital of France?"):
    return gen.messages(question, ["Paris is the capital of France.", "Berlin is in Germany."])


def ask_together(gen, questions: list[str], n: int = 4) -> dict[int, tuple[str, dict]]:
    """Request i asks questions[i % len(questions)], all ``n`` at once from threads; each
    request's (text, stats), every request answered within two minutes."""
    got: dict[int, tuple[str, dict]] = {}

    def ask(i: int) -> None:
        stats: dict = {}
        q = questions[i % len(questions)]
        got[i] = (gen.generate(messages(gen, q), max_new_tokens=24, stats=stats), stats)

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert sorted(got) == list(range(n))
    return got


def test_the_engine_streams_what_it_generates_and_reports_its_stats(smol):
    stats, streamed_stats = {}, {}
    text = smol.generate(messages(smol), max_new_tokens=40, stats=stats)
    assert "Paris" in text
    assert "".join(smol.stream(messages(smol), max_new_tokens=40, stats=streamed_stats)) == text
    assert stats["prompt_tokens"] == len(smol.prompt_ids(messages(smol))[0])
    assert 0 < stats["new_tokens"] <= 40 and stats["finish_reason"] == "stop"
    assert streamed_stats["new_tokens"] == stats["new_tokens"]


def test_a_lazy_engine_counts_tokens_unbuilt_and_builds_once_at_its_first_request(smol):
    """``rag.ask`` built the 0.5B's engine (7 s of reading its GGUF) for a factoid the 1.5B
    answered: the excerpts' token budget needs only its tokenizer. Loaded lazily, the engine
    is built at the first request (or ``ensure_loaded``, a front end's preload), once."""
    from rag.generate.ov_engine import OpenVINOGenerator

    lazy = OpenVINOGenerator.load(
        "smollm2", prompt_cache_mb=64, max_batch=4, prompt_lookup=0, lazy=True
    )
    try:
        assert lazy._stepper.pipe is None
        assert lazy.count_tokens("Paris is the capital.") == smol.count_tokens(
            "Paris is the capital."
        )
        assert lazy.prompt_ids(messages(lazy)) == smol.prompt_ids(messages(smol))
        assert lazy._stepper.pipe is None  # the tokenizer's work built nothing
        text = lazy.generate(messages(lazy), max_new_tokens=24)
        assert text == smol.generate(messages(smol), max_new_tokens=24)  # greedy: the same reply
        built = lazy._stepper.pipe
        assert built is not None and lazy.ensure_loaded() is lazy and lazy._stepper.pipe is built
    finally:
        lazy.close()


def test_the_token_limit_and_stop_strings_hold(smol):
    stats = {}
    short = smol.generate(messages(smol), max_new_tokens=3, stats=stats)
    assert stats["new_tokens"] == 3 and stats["finish_reason"] == "length"
    full = smol.generate(messages(smol), max_new_tokens=40)
    word = full.split()[2]
    cut = smol.generate(messages(smol), max_new_tokens=40, stop=[word])
    assert word not in cut and full.startswith(cut) and len(short) < len(full)


def test_concurrent_requests_each_get_their_own_answer(smol):
    # Batched steps are not bit-exact to a request alone (activations are quantised per step),
    # so greedy answers may part after a close call; what must hold is that every request
    # finishes within its limit and reads its own prompt (SmolLM2 repeats the question).
    questions = ["What is the capital of France?", "Where is Berlin?"]
    got = ask_together(smol, questions)
    for i, (text, stats) in got.items():
        assert questions[i % 2] in text and questions[1 - i % 2] not in text
        assert 0 < stats["new_tokens"] <= 24


def test_a_closed_stream_cancels_its_request_and_the_engine_serves_the_next(smol):
    stream = smol.stream(smol.messages("Tell a very long story about a dragon.", []),
                         max_new_tokens=400)  # fmt: skip
    next(stream)
    stream.close()
    stats = {}
    assert "Paris" in smol.generate(messages(smol), max_new_tokens=24, stats=stats)
    assert stats["new_tokens"] <= 24


def test_a_continuation_is_decoded_from_the_reply_already_written(smol):
    base = smol.generate(messages(smol), max_new_tokens=30)
    head = " ".join(base.split()[:3])
    rest = smol.generate(messages(smol), max_new_tokens=30, continuation=head)
    ids = smol.prompt_ids(messages(smol), head)[0]
    assert ids[: len(smol.prompt_ids(messages(smol))[0])] == smol.prompt_ids(messages(smol))[0]
    assert rest and not rest.startswith(head)  # only what follows the continuation comes back


def test_a_reply_goes_on_unbroken_after_the_engine_fails_a_step(smol):
    """The real engine, failing one step mid-reply: it is rebuilt, the reply goes on from the
    ids already given, and the reader gets the reply an undisturbed run gives (greedy), with
    its token count and finish reason."""
    want_stats: dict = {}
    want = smol.generate(messages(smol), max_new_tokens=24, stats=want_stats)
    stepper = smol._stepper
    real = stepper.pipe

    class FailsOnce:  # the engine, failing its 4th step
        def __init__(self) -> None:
            self.steps = 0

        def __getattr__(self, name):
            return getattr(real, name)

        def step(self) -> None:
            self.steps += 1
            if self.steps == 4:
                raise RuntimeError("Cannot remove more tokens than has been generated")
            real.step()

    with stepper._cond:
        stepper.pipe = FailsOnce()
    stats: dict = {}
    got = smol.generate(messages(smol), max_new_tokens=24, stats=stats)
    assert stepper.pipe is not real and not isinstance(stepper.pipe, FailsOnce)  # rebuilt
    assert got == want and stats["new_tokens"] == want_stats["new_tokens"]
    assert stats["finish_reason"] == want_stats["finish_reason"]
    assert smol.generate(messages(smol), max_new_tokens=24) == want  # and serves on


def test_the_engines_graph_is_saved_once_and_read_back_answering_the_same(
    smol, tmp_path, monkeypatch
):
    """Every process built the engine from the GGUF (15 s for the 0.5B, 23 s for the 1.5B on
    the AVX2-only EPYC, on every ``rag.ask``): the first build saves the engine's graph and its
    tokenizer beside the GGUF, stamped; a later build reads that IR and decodes the same reply,
    stop strings included (the engine's tokenizer reads them)."""
    import openvino_genai as og

    from rag.generate import ov_engine
    from rag.generate.engines import engine_gguf
    from rag.models.gguf import ENGINE_GGUF

    folder = tmp_path / "engine"
    shutil.copytree(engine_gguf("smollm2"), folder, ignore=shutil.ignore_patterns("openvino_*"))
    read: list[Path] = []
    real = og.ContinuousBatchingPipeline

    def spy(path, *args):
        read.append(Path(path))
        return real(path, *args)

    monkeypatch.setattr(og, "ContinuousBatchingPipeline", spy)

    def build():
        sched = og.SchedulerConfig()
        sched.cache_size, sched.max_num_seqs = 1, 2
        return ov_engine.build_pipeline(folder, sched, {}, smol.tokenizer)

    def reply(pipe) -> str:
        gen = ov_engine.OpenVINOGenerator(pipe, smol.tokenizer)
        try:
            return gen.generate(messages(gen), max_new_tokens=24, stop=["capital"])
        finally:
            gen.close()

    first = build()
    assert read[-1].name == ENGINE_GGUF and read[-1].parent != folder  # its link, in a scratch
    stamp = json.loads((folder / ov_engine.IR_STAMP).read_text())
    assert stamp == ov_engine._ir_stamp(folder) and not list(folder.glob(".ir-*"))
    second = build()
    assert read[-1] == folder  # the saved IR, not the GGUF
    want = reply(first)
    assert want and reply(second) == want
    stamp["engine"] = "another version"  # another engine may build another graph from the GGUF
    assert not ov_engine._ir_is_current(folder, stamp)


def test_a_damaged_or_unsavable_graph_falls_back_to_the_gguf(tmp_path, monkeypatch):
    """The engine stand-in: an IR that does not load is built again from the GGUF and saved
    anew; a save the tokenizer cannot join leaves no IR; a folder that cannot be written to
    builds from the GGUF, saving nothing."""
    import openvino_genai as og

    from rag.generate import ov_engine
    from rag.models.gguf import ENGINE_GGUF

    folder = tmp_path / "engine"
    folder.mkdir()
    (folder / ENGINE_GGUF).write_bytes(b"GGUF")
    read: list[tuple[Path, bool]] = []

    def engine(path, sched, device, props):
        path, saves = Path(path), bool(props.get("enable_save_ov_model"))
        read.append((path, saves))
        if path.is_dir() and "<graph" not in (path / "openvino_model.xml").read_text():
            raise RuntimeError("the IR does not parse")
        if saves:
            for ext in ("xml", "bin"):
                (path.parent / f"openvino_model.{ext}").write_text("<graph")
        return object()

    def tokenizer_models(tokenizer, out):
        for name in ov_engine.IR_MODELS[1:]:
            for ext in ("xml", "bin"):
                (out / f"{name}.{ext}").write_text("<graph")

    monkeypatch.setattr(og, "ContinuousBatchingPipeline", engine)
    monkeypatch.setattr(ov_engine, "_save_tokenizer", tokenizer_models)
    ov_engine.build_pipeline(folder, None, {}, None)
    assert read[-1][1] and ov_engine._ir_is_current(folder, ov_engine._ir_stamp(folder))
    ov_engine.build_pipeline(folder, None, {}, None)
    assert read[-1] == (folder, False)  # read back
    (folder / "openvino_model.xml").write_text("damaged")
    ov_engine.build_pipeline(folder, None, {}, None)
    assert read[-2] == (folder, False) and read[-1][1]  # tried, failed, built and saved anew
    assert (folder / "openvino_model.xml").read_text() == "<graph"
    for f in folder.glob("openvino_*"):
        f.unlink()

    def no_converter(tokenizer, out):
        raise ValueError("a tokenizer the converter does not read")

    monkeypatch.setattr(ov_engine, "_save_tokenizer", no_converter)
    ov_engine.build_pipeline(folder, None, {}, None)
    assert not list(folder.glob("openvino_*")) and not list(folder.glob(".ir-*"))

    def no_link(src, dst):  # a read-only folder, or one without hard links (as root, chmod is not)
        raise PermissionError(f"cannot link {dst}")

    monkeypatch.setattr(os, "link", no_link)
    ov_engine.build_pipeline(folder, None, {}, None)
    assert read[-1] == (folder / ENGINE_GGUF, False) and not list(folder.glob(".ir-*"))


@pytest.fixture(scope="module")
def smol_lookup():
    require_openvino_smollm2()
    from rag.generate.ov_engine import OpenVINOGenerator

    gen = OpenVINOGenerator.load("smollm2", prompt_cache_mb=64, max_batch=4, prompt_lookup=5)
    yield gen
    gen.close()


def test_prompt_lookup_keeps_the_limits_stops_streaming_and_sampling(smol, smol_lookup):
    """Prompt lookup decoding proposes several tokens per step; what the answer path relies on
    must hold all the same: the token limit, stop strings, streaming the same text, sampling,
    and concurrent requests reading their own prompts."""
    m = messages(smol_lookup)
    stats: dict = {}
    text = smol_lookup.generate(m, max_new_tokens=40, stats=stats)
    assert "Paris" in text and 0 < stats["new_tokens"] <= 40
    assert "".join(smol_lookup.stream(m, max_new_tokens=40)) == text
    short: dict = {}
    smol_lookup.generate(m, max_new_tokens=3, stats=short)
    assert short["new_tokens"] <= 3 and short["finish_reason"] == "length"
    word = text.split()[2]
    cut = smol_lookup.generate(m, max_new_tokens=40, stop=[word])
    assert word not in cut and text.startswith(cut)
    sampled = smol_lookup.generate(m, max_new_tokens=16, temperature=0.8, top_p=0.9)
    assert sampled.strip()
    # greedy with lookup decodes what the model would: the plain engine's answer, give or take
    # a close call between two tokens late in the reply (batched shapes are not bit-exact)
    plain = smol.generate(m, max_new_tokens=40)
    assert plain.split()[:4] == text.split()[:4]
    questions = ["What is the capital of France?", "Where is Berlin?"]
    got = ask_together(smol_lookup, questions)
    assert all(questions[i % 2] in text for i, (text, _) in got.items())


def test_prompt_lookup_is_a_bounded_generation_setting():
    from rag.generate.settings import GenerationSettings

    assert GenerationSettings().prompt_lookup == 5
    assert GenerationSettings(prompt_lookup=0).prompt_lookup == 0
    with pytest.raises(ValueError, match="--prompt-lookup"):
        GenerationSettings(prompt_lookup=-1)
    with pytest.raises(ValueError, match="--prompt-lookup"):
        GenerationSettings(prompt_lookup=64)


# ---- the worker thread: the only caller of the engine ---------------------------------------------


class FakeHandle:
    """A request handle of the fake engine: one id per step until cancelled, stopped or done."""

    def __init__(self, pipe: FakePipe, n: int) -> None:
        self.pipe, self.left, self.status, self.fresh = pipe, n, "RUNNING", []
        self.ended_by: list[tuple[str, str, bool]] = []  # (how, thread, during a step)

    def get_status(self):
        return type("Status", (), {"name": self.status})()

    def can_read(self) -> bool:
        return bool(self.fresh)

    def read(self):
        out, self.fresh = self.fresh, []
        return {0: type("Out", (), {"generated_ids": out})()}

    def _end(self, how: str, status: str) -> None:
        self.ended_by.append((how, threading.current_thread().name, self.pipe.in_step))
        self.status = status

    def stop(self) -> None:
        self._end("stop", "STOP")

    def cancel(self) -> None:
        self._end("cancel", "CANCEL")


class FakePipe:
    """Stands in for ``ContinuousBatchingPipeline``: ``step`` gives every running request one id
    (and raises at step ``fail_at``); the engine's own state is not thread-safe, so a handle ended
    while a step runs is recorded as such."""

    def __init__(self, n: int = 50, fail_at: int | None = None) -> None:
        self.n, self.fail_at, self.steps, self.in_step = n, fail_at, 0, False
        self.handles: list[FakeHandle] = []

    def add_request(self, rid, tensor, config) -> FakeHandle:
        self.handles.append(FakeHandle(self, self.n))
        self.handles[-1].added_by = (threading.current_thread().name, self.in_step)
        return self.handles[-1]

    def step(self) -> None:
        import time

        self.in_step = True
        self.steps += 1
        try:
            if self.steps == self.fail_at:
                raise RuntimeError("Cannot remove more tokens than has been generated")
            time.sleep(0.002)  # a consumer thread runs meanwhile
            for h in self.handles:
                if h.status == "RUNNING":
                    h.fresh.append(7)
                    h.left -= 1
                    if h.left == 0:
                        h.status = "FINISHED"
        finally:
            self.in_step = False


def test_requests_are_stopped_and_cancelled_only_by_the_worker_between_steps():
    """Requests were added, and cancelled or stopped (a stop string met, a closed stream, the
    loop guard), from the consumers' threads while the worker stepped the engine; with prompt
    lookup on, the engine once failed a step ('Cannot remove more tokens than has been
    generated', on the Linux dev questions) and then every later one. Now only the worker calls
    the engine, between two steps, and each request is ended exactly once."""
    pytest.importorskip("openvino")
    from rag.generate.ov_engine import _Run, _Stepper
    from rag.generate.stopping import DecodingRules

    pipe = FakePipe()
    stepper = _Stepper(pipe, serial=False)
    loops = DecodingRules(loop_min_tokens=1, loop_max_repeats=3)  # 7 7 7: a loop at id 3

    def consume(i: int) -> int:
        cfg = type("Config", (), {"max_new_tokens": 50})()
        run = _Run(stepper.submit([1, 2, 3], cfg), DecodingRules() if i % 2 else loops, stepper)
        got = 0
        for chunk in run:
            got += len(chunk)
            if i % 2 and got >= 2 + i:  # leaves early: a stop string met
                break
        run.close()
        return got

    results: dict[int, int] = {}
    threads = [
        threading.Thread(target=lambda i=i: results.__setitem__(i, consume(i))) for i in range(8)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    for _ in range(500):  # the last requests asked to end are ended at the next pause
        if not stepper._active:
            break
        threading.Event().wait(0.01)
    stepper.close()
    assert len(results) == 8
    ended = [e for h in pipe.handles for e in h.ended_by]
    assert ended and all(thread == "rag-ov-engine" and not during for _, thread, during in ended)
    assert all(h.added_by == ("rag-ov-engine", False) for h in pipe.handles)
    assert all(len(h.ended_by) == 1 for h in pipe.handles)  # each ended once, none finished
    assert {h.ended_by[0][0] for h in pipe.handles[::2]} <= {"stop", "cancel"}


def test_after_a_failed_step_the_engine_is_built_anew_and_its_requests_go_on():
    """One failed step used to leave the engine failing every request after it (the server
    down until restarted). Now the engine is rebuilt and the request it was running goes on
    there from its prompt and the ids it already gave: its consumer reads one reply of the
    asked length. A request whose retry fails too gets the error; without a way to rebuild,
    the running request gets the error and later ones are refused in one line, never hang."""
    pytest.importorskip("openvino")
    from rag.generate.ov_engine import _Run, _Stepper
    from rag.generate.stopping import DecodingRules

    class Config:
        max_new_tokens = 10

    prompts: list[int] = []

    class Recording(FakePipe):
        def add_request(self, rid, tensor, config):
            prompts.append(tensor.data.shape[1])
            handle = super().add_request(rid, tensor, config)
            handle.left = config.max_new_tokens
            return handle

    fresh: list[FakePipe] = []

    def rebuild(fail_at=None) -> FakePipe:
        fresh.append(Recording(fail_at=fail_at))
        return fresh[-1]

    stepper = _Stepper(Recording(fail_at=4), serial=False, rebuild=rebuild)
    run = _Run(stepper.submit([1, 2, 3], Config()), DecodingRules(), stepper)
    assert sum(len(c) for c in run) == 10  # 3 ids before the failure, 7 after
    assert prompts == [3, 6] and len(fresh) == 1  # the retry's prompt holds the 3 ids given
    run = _Run(stepper.submit([1], Config()), DecodingRules(), stepper)
    assert sum(len(c) for c in run) == 10  # the next request on the new engine
    stepper.close()

    stepper = _Stepper(Recording(fail_at=2), serial=False, rebuild=lambda: rebuild(fail_at=1))
    with pytest.raises(RuntimeError, match="Cannot remove more tokens"):  # failed twice
        list(_Run(stepper.submit([1], Config()), DecodingRules(), stepper))
    stepper.close()

    stepper = _Stepper(FakePipe(fail_at=1), serial=False)  # no rebuild
    with pytest.raises(RuntimeError):
        list(_Run(stepper.submit([1], Config()), DecodingRules(), stepper))
    with pytest.raises(RuntimeError, match="decoder engine failed and could not restart"):
        stepper.submit([1], Config())
    stepper.close()
