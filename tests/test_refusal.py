"""The refusal gate (rag.answer.refusal): its score equals a plain forward pass, its KV cache decodes
the same answer as a fresh prompt, the barred opening is never decoded, the pipeline refuses
exactly when p >= threshold, and the threshold sweep over one recorded run."""

from __future__ import annotations

import json
import math

import pytest
import torch
from generate_support import messages
from test_generate import tiny_decoder_dirs, tiny_generator  # noqa: F401, F811  (session fixtures)
from test_pipeline import FakeGenerator, FakeRetriever, hit

from evals.refusal_sweep import gated_row, pick_threshold, sweep
from rag.answer.prompt import REFUSAL
from rag.answer.refusal import barred_refusal, decide
from rag.config import ConfigError, RAGConfig
from rag.generate.scoring import refusal_ids
from rag.pipeline import RAGPipeline


def test_refusal_logprob_equals_uncached_forward(tiny_generator):  # noqa: F811
    gen = tiny_generator
    msgs = messages()
    ids = gen.prompt_ids(msgs)[0]
    ref = refusal_ids(gen.tokenizer)
    with torch.inference_mode():
        logits = gen.model(input_ids=torch.tensor([ids + ref]))["logits"][0]
    logp = torch.log_softmax(logits.float(), dim=-1)
    expected = sum(float(logp[len(ids) + j - 1, t]) for j, t in enumerate(ref))
    for prefix_cache in (True, False):
        gen.prefix_cache = prefix_cache
        got, cache = gen.refusal_logprob(msgs)
        assert got == pytest.approx(expected, abs=1e-4)
        assert cache.get_seq_length() == len(ids) - 1
        assert got == pytest.approx(gen.score_continuations(msgs, "", [REFUSAL])[0], abs=1e-4)
    gen.prefix_cache = True


def test_gate_cache_decodes_the_same_answer(tiny_generator):  # noqa: F811
    """Decoding from the gate's cropped prompt cache = decoding the prompt from scratch."""
    gen = tiny_generator
    msgs = messages("what closes the file?")
    plain = gen.generate(msgs, max_new_tokens=16, use_prefix_cache=False)
    _, cache = gen.refusal_logprob(msgs)
    stats: dict[str, float] = {}
    gated = gen.generate(msgs, max_new_tokens=16, prompt_cache=cache, stats=stats)
    assert gated == plain
    assert stats["cached_prefix_tokens"] == stats["prompt_tokens"] - 1


def test_barred_opening_is_never_decoded(tiny_generator):  # noqa: F811
    gen = tiny_generator
    msgs = messages()
    ids, prefix_len = gen.prompt_ids(msgs)
    free = gen.generate_ids(ids, prefix_len, max_new_tokens=6, stop=())
    assert free, "the tiny model decoded nothing"
    barred = gen.generate_ids(ids, prefix_len, max_new_tokens=6, stop=(), ban=[free[:1]])
    assert barred[:1] != free[:1]
    assert barred_refusal(gen.tokenizer) == [refusal_ids(gen.tokenizer)[:2]]


class GatedFake(FakeGenerator):
    """A fake decoder whose p(refusal) is fixed."""

    tokenizer = None

    def __init__(self, reply: str, p_refusal: float):
        super().__init__(reply)
        self.logp = math.log(p_refusal)
        self.kwargs: list[dict] = []

    def refusal_logprob(self, msgs):
        return self.logp, "cache"

    def generate(self, msgs, **kw):
        self.kwargs.append(kw)
        return super().generate(msgs, **kw)


@pytest.fixture
def no_tokenizer_ban(monkeypatch):
    monkeypatch.setattr("rag.answer.refusal.barred_refusal", lambda tok: [[7, 8]])


@pytest.mark.parametrize("p, refused", [(0.9, True), (0.5, True), (0.3, False)])
def test_pipeline_refuses_exactly_above_threshold(p, refused, no_tokenizer_ban):
    gen = GatedFake("Use open() [1].", p)
    pipe = RAGPipeline(
        RAGConfig.of(refusal_threshold=0.5, k=2),
        retriever=FakeRetriever([hit(1), hit(2)]),
        generator=gen,
    )
    ans = pipe.answer("how?")
    assert ans.refused is refused
    assert ans.refusal_probability == pytest.approx(p)
    assert len(ans.passages) == 2  # the refusal still shows what was retrieved
    assert len(gen.calls) == (0 if refused else 1)
    if not refused:
        assert gen.kwargs[0]["ban"] == [[7, 8]] and gen.kwargs[0]["prompt_cache"] == "cache"
        assert [c.number for c in ans.citations] == [1]
    streamed = list(pipe.stream("how?"))
    assert streamed[-1].refused is refused
    assert ("".join(streamed[:-1]) == REFUSAL) is refused


def test_gate_off_by_default_and_threshold_validated(no_tokenizer_ban):
    gen = GatedFake("It is X [1].", 0.99)
    pipe = RAGPipeline(RAGConfig.of(k=1), retriever=FakeRetriever([hit(1)]), generator=gen)
    ans = pipe.answer("q?")
    assert not ans.refused and ans.refusal_probability is None
    for bad in (0.0, 1.5, -0.1):
        with pytest.raises(ConfigError, match="--refusal-threshold"):
            RAGConfig.of(refusal_threshold=bad)
    with pytest.raises(ValueError, match="threshold"):
        decide(gen, [], 0.0)


def test_adapter_threshold_gives_way_to_the_answerability_check(no_tokenizer_ban):
    """With the answerability check deciding, the adapter's own threshold (0.6) is replaced by
    1.0: the decoder answers with its refusal barred; without the check the adapter's holds."""
    from test_answerability import CoverageRetriever

    def ask(**cfg):
        gen = GatedFake("Lists are mutable [1].", 0.9)
        gen.refusal_threshold = 0.6  # as Generator.load sets it from the adapter's run.json
        pipe = RAGPipeline(
            RAGConfig.of(k=2, **cfg), retriever=CoverageRetriever(0.7), generator=gen
        )
        return pipe.answer("Are Python lists mutable?"), gen

    ans, gen = ask()
    assert not ans.refused and ans.refusal_probability == pytest.approx(0.9)
    assert gen.kwargs[0]["ban"] == [[7, 8]]  # decoded with the refusal barred
    ans, gen = ask(answerability_threshold=None)
    assert ans.refused and not gen.calls  # the adapter's 0.6 decides alone
    ans, gen = ask(refusal_threshold=0.95)
    assert not ans.refused  # an explicit threshold always wins


def row(p, answerable=True, em=1.0, gold=True):
    return {
        "id": str(p),
        "refusal_probability": p,
        "answerable": answerable,
        "refused": False,
        "em": em,
        "f1": em,
        "cited": [1],
        "citation_correct": True if gold else None,
        "invalid_citations": [],
        "seconds": 1.0,
    }


def test_sweep_gates_rows_and_picks_within_false_refusal_limit():
    rows = [
        row(0.1),
        row(0.2),
        row(0.6),
        row(0.7, answerable=False, em=0.0, gold=False),
        row(0.9, answerable=False, em=0.0, gold=False),
    ]
    g = gated_row(rows[2], 0.5)
    assert g["refused"] and g["em"] == 0 and g["citation_correct"] is False
    assert gated_row(rows[0], 0.5) is rows[0]
    table = sweep(rows, [0.15, 0.5, 0.8, 0.95])
    by_t = {r["threshold"]: r for r in table}
    assert by_t[0.5]["refusal_rate_unanswerable"] == 1.0
    assert by_t[0.5]["false_refusal_rate"] == pytest.approx(1 / 3)
    assert by_t[0.8]["false_refusal_rate"] == 0.0 and by_t[0.8]["refusal_rate_unanswerable"] == 0.5
    assert pick_threshold(table, 0.05)["threshold"] == 0.8
    assert pick_threshold(table, 0.5)["threshold"] == 0.5
    with pytest.raises(ValueError, match="refusal_probability"):
        gated_row({"id": "x"}, 0.5)


def test_adapter_threshold_from_run_json(tmp_path, monkeypatch):
    from rag.models import pick_refusal_threshold

    adapter = tmp_path / "lora"
    adapter.mkdir()
    assert pick_refusal_threshold(adapter) is None  # no run.json
    (adapter / "run.json").write_text('{"refusal_threshold": 0.6}')
    assert pick_refusal_threshold(adapter) == 0.6
    (adapter / "run.json").write_text('{"refusal_threshold": 7}')
    assert pick_refusal_threshold(adapter) is None  # out of range: ignored, never a crash
    assert pick_refusal_threshold(None) is None


@pytest.mark.parametrize("configured, refused", [(None, True), (0.9, False)])
def test_pipeline_uses_the_adapters_threshold_unless_configured(
    configured, refused, no_tokenizer_ban
):
    gen = GatedFake("It is X [1].", 0.7)
    gen.refusal_threshold = 0.6  # what Generator.load reads from the adapter's run.json
    pipe = RAGPipeline(
        RAGConfig.of(k=1, refusal_threshold=configured),
        retriever=FakeRetriever([hit(1)]),
        generator=gen,
    )
    assert pipe.answer("q?").refused is refused


def test_sweep_cli_writes_the_pick_and_names_a_bad_file(tmp_path, capsys):
    from evals.refusal_sweep import main

    run = tmp_path / "run.json"
    run.write_text(json.dumps({"predictions": [row(0.1), row(0.9, answerable=False, gold=False)]}))
    out = tmp_path / "table.json"
    assert main([str(run), "--thresholds", "0.5", "0.95", "--out", str(out)]) == 0
    assert json.loads(out.read_text())["chosen"]["threshold"] == 0.5
    assert main([str(tmp_path / "missing.json")]) == 2
    err = capsys.readouterr().err.strip()
    assert "missing.json" in err and len(err.splitlines()) == 1
