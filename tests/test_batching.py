"""Batched decoding (rag.generate.batching): a request decoded with others gives what it gives alone.

Tiny random Llama and Qwen2 decoders (tests/generate_support.py), float32. Requests of different
prompt lengths join at different steps (left padding and per-row positions are exercised); a
*scripted* model, whose greedy choice is fixed by position, makes stop strings, loops and long
answers deterministic. Holding the generator's decode lock pauses the worker, which is how a test
makes several requests join the same step.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import torch
from generate_support import build_model, build_tokenizer, messages, model_config

from rag.answer.prompt import build_messages
from rag.generate.batch_prefill import CPU_FORWARD_COST_TOKENS, plan_prefill
from rag.generate.batching import BatchedDecoder
from rag.generate.chat import DecodeOptions
from rag.generate.generator import Generator
from rag.generate.kv_append import AppendLayer
from rag.generate.stopping import DecodingRules
from rag.generate.streaming import Cancel

QUESTIONS = [
    "how do I read a file?",
    "what closes the file?",
    "why",
    "Use open and a for loop to read lines of text from a file in python?",
    "x",
]


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer()


# A prefill forward's fixed cost above any padding: all requests admitted together share one
# forward (as on an accelerator), the hardest case for exactness. The CPU default splits
# requests of very different lengths (test_default_cpu_plan_...).
ONE_FORWARD = 10**6


def pair(model: Any, tok: Any, **kw: Any) -> tuple[Generator, Generator]:
    """An unbatched and a batched generator over the same model."""
    max_batch = kw.pop("max_batch", 8)
    forward_cost = kw.pop("forward_cost", ONE_FORWARD)
    batched = Generator(model, tok, "cpu", batching=True, max_batch=max_batch, **kw)
    batched.batcher.prefill_forward_cost = forward_cost
    return Generator(model, tok, "cpu", **kw), batched


def sharp_model(arch: str, tok: Any) -> Any:
    """A tiny random ``arch`` with weights 10x the usual init: attention is peaked enough that
    a wrong position or a visible pad column changes the greedy tokens (at the default 0.02
    attention is nearly uniform, and such bugs would pass unseen)."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    cfg = model_config(arch, tok)
    cfg.initializer_range = 0.2
    return AutoModelForCausalLM.from_config(cfg).eval()


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def gens(request, tok) -> Iterator[tuple[Generator, Generator]]:
    alone, batched = pair(sharp_model(request.param, tok), tok)
    yield alone, batched
    batched.batcher.close()


def scripted_model(tok: Any, text: str, eos: bool = False) -> Any:
    """A tiny Qwen2 whose greedy choice is fixed: after the prompt of :func:`messages`, its i-th
    new token is the i-th token of ``text`` (+ eos), cycling. Reads each row's position from
    ``position_ids``, so it scripts every row of a left-padded batch."""
    from transformers import Qwen2ForCausalLM

    script = torch.tensor(
        tok(text, add_special_tokens=False)["input_ids"] + [tok.eos_token_id] * eos
    )
    prompt_len = len(Generator(None, tok).prompt_ids(messages())[0])

    class Scripted(Qwen2ForCausalLM):
        def forward(self, input_ids=None, position_ids=None, cache=None, **kwargs):
            if position_ids is None:  # the prefix cache's own forward: one row, no padding
                past = cache.get_seq_length() if cache is not None else 0
                position_ids = torch.arange(past, past + input_ids.shape[1])[None, :]
            out = super().forward(
                input_ids=input_ids, position_ids=position_ids, cache=cache, **kwargs
            )
            nxt = script[(position_ids[:, -1] + 1 - prompt_len) % len(script)]  # [B]
            logits = torch.full_like(out.logits, -1e4)
            logits[torch.arange(len(nxt)), -1, nxt] = 0.0
            out.logits = logits
            return out

    torch.manual_seed(0)
    return Scripted(model_config("qwen2", tok)).eval()


def run_all(calls: list[Callable[[], Any]], gen: Generator, every: int = 0) -> list[Any]:
    """Run ``calls`` in threads and return their results; with ``every`` > 0 each call starts
    ``every`` batch steps after the previous one (so requests join at different steps)."""
    out: list[Any] = [None] * len(calls)
    errors: list[BaseException] = []

    def work(i: int) -> None:
        try:
            out[i] = calls[i]()
        except BaseException as e:
            errors.append(e)

    threads = []
    for i in range(len(calls)):
        threads.append(threading.Thread(target=work, args=(i,)))
        threads[-1].start()
        target, t0 = gen.batcher.steps + every, time.monotonic()
        while every and gen.batcher.steps < target and time.monotonic() - t0 < 30:
            if not any(t.is_alive() for t in threads):
                break
            time.sleep(0.001)
    for t in threads:
        t.join(timeout=120)
    if errors:
        raise errors[0]
    return out


def together(gen: Generator, calls: list[Callable[[], Any]]) -> list[Any]:
    """Run ``calls`` in threads so that they join the batch together: the worker waits on the
    decode lock, held here, until every request is queued."""
    box: list[Any] = []
    errors: list[BaseException] = []

    def work() -> None:
        try:
            box.extend(run_all(calls, gen))
        except BaseException as e:
            errors.append(e)

    thread, target = threading.Thread(target=work), gen.batcher.requests + len(calls)
    with gen._decode_lock:
        thread.start()
        t0 = time.monotonic()
        while gen.batcher.requests < target and time.monotonic() - t0 < 30:
            time.sleep(0.002)
    thread.join(timeout=120)
    if errors:
        raise errors[0]
    return box


def prompts(gen: Generator) -> list[tuple[list[int], int, int]]:
    """(ids, prefix_len, max_new_tokens) of prompts of different lengths."""
    out = []
    for i, q in enumerate(QUESTIONS):
        ids, prefix = gen.prompt_ids(build_messages(q, ["Use open() and iterate."] * (i + 1)))
        out.append((ids, prefix, 20 + 5 * i))
    return out


# ---- exactness -------------------------------------------------------------------------------


@pytest.mark.parametrize("spare", [None, 3])
def test_batched_greedy_ids_equal_alone(gens, spare, monkeypatch):
    """``spare``: the batch cache's spare columns (rag.generate.kv_append), 3 so that rows
    outgrow their buffers several times mid-answer."""
    if spare is not None:
        monkeypatch.setattr(AppendLayer, "spare", spare)
    alone, batched = gens
    reqs = prompts(alone)
    assert len({len(ids) for ids, _, _ in reqs}) == len(reqs)  # padding is exercised
    expected = [alone.generate_ids(ids, p, max_new_tokens=n) for ids, p, n in reqs]
    steps = batched.batcher.steps
    calls = [lambda r=r: batched.generate_ids(r[0], r[1], max_new_tokens=r[2]) for r in reqs]
    assert run_all(calls, batched, every=3) == expected
    assert batched.batcher.max_rows >= 3
    assert batched.batcher.steps - steps < sum(len(e) for e in expected)  # rows shared steps


def test_batched_stream_and_generate_equal_alone(gens):
    alone, batched = gens
    msgs = [
        build_messages(q, ["The with statement closes it."] * (i % 3 + 1))
        for i, q in enumerate(QUESTIONS)
    ]
    expected = [alone.generate(m, max_new_tokens=24) for m in msgs]
    calls: list[Callable[[], Any]] = []
    for i, m in enumerate(msgs):
        if i % 2:
            calls.append(lambda m=m: "".join(batched.stream(m, max_new_tokens=24)))
        else:
            calls.append(lambda m=m: batched.generate(m, max_new_tokens=24))
    assert together(batched, calls) == expected


def test_sampling_rows_leave_greedy_rows_unchanged(gens):
    alone, batched = gens
    reqs = prompts(alone)[:3]
    expected = [alone.generate_ids(ids, p, max_new_tokens=n) for ids, p, n in reqs]
    calls: list[Callable[[], Any]] = []
    for ids, p, n in reqs:
        calls.append(lambda ids=ids, p=p, n=n: batched.generate_ids(ids, p, max_new_tokens=n))
        calls.append(
            lambda ids=ids, p=p: batched.generate_ids(
                ids, p, max_new_tokens=16, temperature=0.9, top_p=0.9
            )
        )
    box = together(batched, calls)
    assert box[0::2] == expected
    vocab = len(alone.tokenizer)
    assert all(0 < len(s) <= 16 and all(0 <= i < vocab for i in s) for s in box[1::2])


def test_stats_and_score_continuations_with_batching_on(gens):
    alone, batched = gens
    msgs = messages()
    stats: dict[str, float] = {}
    assert batched.generate(msgs, max_new_tokens=8, stats=stats) == alone.generate(
        msgs, max_new_tokens=8
    )
    assert 0 < stats["cached_prefix_tokens"] < stats["prompt_tokens"]
    assert 0 < stats["ttft_s"] <= stats["total_s"] and stats["new_tokens"] > 0
    conts = [" [1]", " [2]"]
    got = batched.score_continuations(msgs, "Use open().", conts)
    assert got == pytest.approx(alone.score_continuations(msgs, "Use open().", conts), abs=1e-5)


def test_calls_run_on_the_worker_between_steps_while_a_batch_decodes(tok):
    """Work on the model beside the batch (citation scores) runs on the worker at its next
    step, never waiting on the decode lock behind a running batch; errors reach their caller
    alone, and the scores equal unbatched ones."""
    model = scripted_model(tok, " Paris has the Louvre and a river called the Seine [1].")
    alone, batched = pair(model, tok, rules=DecodingRules.off())
    msgs = messages()
    long = batched.stream(msgs, max_new_tokens=250, stop=None)
    assert next(long)  # a row is decoding
    seen: dict[str, Any] = {}

    def job() -> str:
        seen.update(
            thread=threading.current_thread().name,
            inference=torch.is_inference_mode_enabled(),
            locked=batched._decode_lock.locked(),
        )
        return "ok"

    before = batched.batcher.steps
    assert batched.batcher.call(job) == "ok"
    assert batched.batcher.steps - before <= 2  # ran at the next step, not after the answer
    assert seen == {"thread": "rag-batch", "inference": True, "locked": True}

    def broken() -> None:
        raise KeyError("this call's own error")

    with pytest.raises(KeyError, match="own error"):
        batched.batcher.call(broken)
    # a call made on the worker (a job calling again) runs at once instead of waiting on itself
    assert batched.batcher.call(lambda: batched.batcher.call(job)) == "ok"
    jobs = batched.batcher.jobs
    conts = [" [1]", " [2]", " [3]"]
    got = batched.score_continuations(msgs, "Paris has the Louvre.", conts)
    assert batched.batcher.jobs == jobs + 1  # scored on the worker
    assert got == pytest.approx(
        alone.score_continuations(msgs, "Paris has the Louvre.", conts), abs=1e-5
    )
    at = batched.batcher.steps
    assert next(long)  # the stream goes on after both calls
    t0 = time.monotonic()
    while batched.batcher.steps == at and time.monotonic() - t0 < 30:
        time.sleep(0.001)
    assert batched.batcher.steps > at
    long.close()
    batched.batcher.close()
    with pytest.raises(RuntimeError, match="closed"):
        batched.batcher.call(job)


# ---- per-request stops, loop guard, cancellation ----------------------------------------------


def test_stop_strings_and_max_new_tokens_per_request(tok):
    alone, batched = pair(scripted_model(tok, " Use open() [1]\nQuestion: why"), tok)
    msgs = messages()
    ids, prefix = alone.prompt_ids(msgs)
    calls: list[Callable[[], Any]] = [
        lambda: batched.generate(msgs, max_new_tokens=50),
        lambda: batched.generate(msgs, max_new_tokens=50, stop=[" open"]),
        lambda: batched.generate_ids(ids, prefix, max_new_tokens=3),
        lambda: "".join(batched.stream(msgs, max_new_tokens=50)),
        lambda: batched.generate_ids(ids, prefix, max_new_tokens=50),
    ]
    box = together(batched, calls)
    assert box[0] == box[3] == "Use open() [1]" == alone.generate(msgs, max_new_tokens=50)
    assert box[1] == "Use"
    assert box[2] == tok(" Use open() [1]", add_special_tokens=False)["input_ids"][:3]
    assert box[4] == alone.generate_ids(ids, prefix, max_new_tokens=50)
    assert batched.batcher.max_rows >= 4
    batched.batcher.close()


def test_loop_guard_stops_a_looping_row(tok):
    phrase = " Use a for loop."
    alone, batched = pair(scripted_model(tok, phrase), tok)
    msgs = messages()
    ids, prefix = alone.prompt_ids(msgs)
    n = len(tok(phrase, add_special_tokens=False)["input_ids"])
    calls: list[Callable[[], Any]] = [
        lambda: batched.generate_ids(ids, prefix, max_new_tokens=60),
        lambda: batched.generate(msgs, max_new_tokens=60),
        lambda: "".join(batched.stream(msgs, max_new_tokens=60)),
    ]
    box = together(batched, calls)
    assert len(box[0]) == n * DecodingRules().copies_needed(n) < 60
    assert box[0] == alone.generate_ids(ids, prefix, max_new_tokens=60)
    assert box[1] == box[2] == phrase.strip()
    batched.batcher.close()


def test_cancelled_stream_frees_its_slot_and_others_finish_unchanged(tok):
    model = scripted_model(tok, " Paris has the Louvre and a river called the Seine [1].")
    alone, batched = pair(model, tok, rules=DecodingRules.off(), max_batch=2)
    msgs = messages()
    ids, prefix = alone.prompt_ids(msgs)
    expected = alone.generate_ids(ids, prefix, max_new_tokens=30)
    long = batched.stream(msgs, max_new_tokens=250, stop=None)
    assert next(long)  # decoding; holds one of the two slots
    box: list[Any] = []
    calls = [lambda: batched.generate_ids(ids, prefix, max_new_tokens=30)] * 2
    t = threading.Thread(target=lambda: box.extend(run_all(calls, batched)))
    t.start()
    time.sleep(0.05)
    long.close()  # cancels: the slot is free at the next step
    t.join(timeout=120)
    assert box == [expected, expected]
    assert batched.batcher.max_rows == 2
    assert batched.batcher.steps < 150  # the long request did not run to its 250 tokens
    batched.batcher.close()


def test_waiting_request_cancelled_without_prefill(tok):
    model = scripted_model(tok, " Paris has the Louvre and a river called the Seine [1].")
    gen = Generator(model, tok, "cpu", rules=DecodingRules.off(), batching=True, max_batch=1)
    ids, prefix = gen.prompt_ids(messages())
    long = gen.stream(messages(), max_new_tokens=250, stop=None)
    assert next(long)

    class Recorder:
        puts, ended = 0, False

        def put(self, value: torch.Tensor) -> None:
            self.puts += 1

        def end(self) -> None:
            self.ended = True

    cancel, rec = Cancel(), Recorder()
    req = gen.batcher.submit(
        {"input_ids": torch.tensor([ids]), "max_new_tokens": 5, "streamer": rec}
        | {"stopping_criteria": [cancel]}
    )
    time.sleep(0.05)
    assert not req.done.is_set() and len(gen.batcher._rows) == 1  # waiting: max_batch is 1
    cancel.event.set()
    assert req.done.wait(timeout=30)
    assert rec.puts == 0 and rec.ended and req.error is None  # never prefilled
    long.close()
    gen.batcher.close()


# ---- batched prefill: requests admitted together share one forward ----------------------------


@contextmanager
def forwards(model: Any) -> Iterator[list[tuple[int, int]]]:
    """Records the ``input_ids`` shape [rows, tokens] of every forward of ``model``; a prefill
    has more than one token per row (warm the prefix cache first: its own forward is one too)."""
    shapes: list[tuple[int, int]] = []
    forward = model.forward

    def spy(*args: Any, **kwargs: Any) -> Any:
        shapes.append(tuple(kwargs["input_ids"].shape))
        return forward(*args, **kwargs)

    model.forward = spy
    try:
        yield shapes
    finally:
        del model.forward


def prefill_shapes(shapes: list[tuple[int, int]]) -> list[tuple[int, int]]:
    return [s for s in shapes if s[1] > 1]


def warm(gen: Generator, reqs: list[tuple[list[int], int, int]]) -> None:
    """Compute the prefix caches ``reqs`` use, outside the forwards a test counts."""
    for ids, p, _ in reqs:
        gen._prefix_cache_for(ids[:p])


def prefill_together(
    alone: Generator, batched: Generator, reqs: list[tuple[list[int], int, int]]
) -> list[tuple[int, int]]:
    """Decode ``reqs`` alone, then batched and admitted together (prefix caches warmed first):
    the ids must be equal. Returns the batched prefill forwards' [rows, tokens]; the batched
    decoder is closed."""
    expected = [alone.generate_ids(ids, p, max_new_tokens=n) for ids, p, n in reqs]
    warm(batched, reqs)
    calls = [lambda r=r: batched.generate_ids(r[0], r[1], max_new_tokens=r[2]) for r in reqs]
    with forwards(batched.model) as shapes:
        assert together(batched, calls) == expected
    batched.batcher.close()
    return prefill_shapes(shapes)


def outcome(call: Callable[[], Any]) -> Callable[[], Any]:
    """``call`` returning its exception instead of raising it."""

    def run() -> Any:
        try:
            return call()
        except Exception as e:
            return e

    return run


@pytest.mark.parametrize("prefix", [True, False, "mixed"])
def test_requests_waiting_together_share_one_prefill(gens, prefix):
    """Prompts of different lengths (and, mixed, cached prefixes of different lengths: 0 or the
    system turn) admitted at once: one forward prefills them all, and each answer is the ids it
    gets unbatched."""
    alone, batched = gens
    reqs = prompts(alone)
    uses = [prefix if prefix != "mixed" else bool(i % 2) for i in range(len(reqs))]
    expected = [
        alone.generate_ids(ids, p, max_new_tokens=n, use_prefix_cache=u)
        for (ids, p, n), u in zip(reqs, uses, strict=True)
    ]
    warm(batched, reqs)
    calls = [
        lambda r=r, u=u: batched.generate_ids(r[0], r[1], max_new_tokens=r[2], use_prefix_cache=u)
        for r, u in zip(reqs, uses, strict=True)
    ]
    with forwards(batched.model) as shapes:
        assert together(batched, calls) == expected
    longest = max(len(ids) - p * u for (ids, p, _), u in zip(reqs, uses, strict=True))
    assert prefill_shapes(shapes) == [(len(reqs), longest)]  # one forward, suffixes padded


class Gate:
    """A stopping criterion that holds the worker at its row's ``at``-th new token until
    :attr:`open` is set (never stops the row): requests queued meanwhile join together."""

    def __init__(self, prompt_len: int, at: int) -> None:
        self.prompt_len, self.at = prompt_len, at
        self.reached, self.open = threading.Event(), threading.Event()

    def __call__(self, input_ids: torch.Tensor, scores: Any, **kwargs: Any) -> torch.Tensor:
        if input_ids.shape[1] - self.prompt_len == self.at:
            self.reached.set()
            self.open.wait(timeout=60)
        return torch.zeros(input_ids.shape[0], dtype=torch.bool)


@pytest.mark.parametrize("forward_cost", [ONE_FORWARD, 0])
def test_group_joining_a_running_batch_in_one_prefill(gens, forward_cost):
    """Requests that arrive together while others decode are prefilled in one forward and
    merged into the running batch; nobody's answer changes. With no fixed cost per forward,
    each prompt length gets its own forward, and the groups join the running batch in one
    merge, each right-aligned into the widest."""
    alone, batched = gens
    batched.batcher.prefill_forward_cost = forward_cost
    reqs = prompts(alone)
    expected = [alone.generate_ids(ids, p, max_new_tokens=n) for ids, p, n in reqs]
    assert min(len(e) for e in expected[3:]) > 4  # the first two still decode when the rest join
    warm(batched, reqs)
    gate = Gate(len(reqs[3][0]), at=3)
    first = []
    with forwards(batched.model) as shapes:
        with batched._decode_lock:  # the first two are admitted together
            for i, (ids, p, n) in enumerate(reqs[3:]):
                kw = batched._generate_kwargs(ids, p, DecodeOptions(max_new_tokens=n))
                if i == 0:
                    kw["stopping_criteria"].append(gate)
                first.append(batched.batcher.submit(kw))
        assert gate.reached.wait(timeout=60)  # the worker is held mid-step, lock taken
        target, joined = batched.batcher.requests + 3, [None] * 3

        def later(i: int) -> None:
            ids, p, n = reqs[i]
            joined[i] = batched.generate_ids(ids, p, max_new_tokens=n)

        threads = [threading.Thread(target=later, args=(i,)) for i in range(3)]
        for t in threads:
            t.start()
        t0 = time.monotonic()
        while batched.batcher.requests < target and time.monotonic() - t0 < 30:
            time.sleep(0.002)
        gate.open.set()
        for t in threads:
            t.join(timeout=120)
        assert all(r.done.wait(timeout=120) and r.error is None for r in first)
    assert [r.ids[0, r.prompt_len :].tolist() for r in first] == expected[3:]
    assert joined == expected[:3]
    split = [s[0] for s in prefill_shapes(shapes)]
    batched.batcher.prefill_forward_cost = ONE_FORWARD
    assert split == ([2, 3] if forward_cost else [1] * 5)
    assert max(s[0] for s in shapes if s[1] == 1) == 5  # the three joined the two decoding


def test_prefill_token_budget_splits_a_group(tok):
    model = sharp_model("llama", tok)
    alone = Generator(model, tok, "cpu")
    long = alone.prompt_ids(build_messages(QUESTIONS[0], ["Use open() and iterate."] * 12))
    reqs = [*prompts(alone), (*long, 10)]
    suffixes = sorted(len(ids) - p for ids, p, _ in reqs)
    budget = 2 * suffixes[1]  # the two shortest fit a forward; the longest alone is over it
    assert suffixes[-1] > budget
    batched = Generator(model, tok, "cpu", batching=True)
    batched.batcher.max_prefill_tokens, batched.batcher.prefill_forward_cost = budget, ONE_FORWARD
    groups = prefill_together(alone, batched, reqs)
    assert sum(k for k, _ in groups) == len(reqs) and groups[0] == (2, suffixes[1])
    assert all(k * n <= budget or k == 1 for k, n in groups)
    assert (1, suffixes[-1]) in groups  # over the budget alone: still prefilled
    with pytest.raises(ValueError, match="max_prefill_tokens"):
        BatchedDecoder(model, tok, max_prefill_tokens=0)
    with pytest.raises(ValueError, match="prefill_forward_cost"):
        BatchedDecoder(model, tok, prefill_forward_cost=-1)


def test_plan_prefill_weighs_padding_against_a_forward():
    """Forward cost 32 tokens (the CPU default): rows of like lengths share a forward, a row
    that would add more padding than a forward costs does not; a cost above any padding puts
    all that fit the budget in one forward; a single prompt over the budget goes alone. (Cost
    of the plans: forwards x cost + rows x longest, in tokens.)"""
    assert plan_prefill([100, 100, 100], 4096, 32) == [3]
    assert plan_prefill([100, 300], 4096, 32) == [1, 1]  # 200 pads > one forward
    assert plan_prefill([100, 110, 120, 300, 310], 4096, 32) == [3, 2]
    assert plan_prefill([100, 300], 4096, 4096) == [2]
    assert plan_prefill([50, 50], 4096, 0) == [2]  # a tie: fewer forwards
    sizes = plan_prefill([100] * 5, 250, ONE_FORWARD)  # two rows of 100 fit 250
    assert sum(sizes) == 5 and max(sizes) == 2 and len(sizes) == 3
    assert plan_prefill([5000], 4096, 32) == [1] and plan_prefill([], 4096, 32) == []


def test_default_cpu_plan_shares_a_forward_between_like_lengths(tok):
    model = sharp_model("qwen2", tok)
    alone = Generator(model, tok, "cpu")
    batched = Generator(model, tok, "cpu", batching=True)
    assert batched.batcher.prefill_forward_cost == CPU_FORWARD_COST_TOKENS
    reqs = prompts(alone)
    short, long = reqs[0], reqs[-1]
    assert (len(long[0]) - long[1]) - (len(short[0]) - short[1]) > CPU_FORWARD_COST_TOKENS
    reqs = [short, short, long]
    assert prefill_together(alone, batched, reqs) == [
        (2, len(short[0]) - short[1]),
        (1, len(long[0]) - long[1]),
    ]


def test_a_failing_request_fails_alone_in_a_batched_prefill(gens):
    """An id outside the vocabulary makes the group's forward raise: the group is prefilled
    again one request at a time, and only the bad request gets the error. A streamer that
    raises on its first token fails its own request only."""
    alone, batched = gens
    reqs = prompts(alone)[:3]
    expected = [alone.generate_ids(ids, p, max_new_tokens=n) for ids, p, n in reqs]
    warm(batched, reqs)
    bad = reqs[1][0][:-3] + [len(alone.tokenizer) + 1000] + reqs[1][0][-2:]

    class Broken:
        def put(self, value: torch.Tensor) -> None:
            if value.dim() == 1:  # a new token, not the prompt
                raise OSError("client went away")

        def end(self) -> None:
            pass

    kw = alone._generate_kwargs(reqs[2][0], reqs[2][1], DecodeOptions(max_new_tokens=5))
    calls = [lambda r=r: batched.generate_ids(r[0], r[1], max_new_tokens=r[2]) for r in reqs] + [
        outcome(lambda: batched.generate_ids(bad, reqs[1][1], max_new_tokens=8)),
        outcome(lambda: batched.batcher.generate(**kw, streamer=Broken())),
    ]
    with forwards(batched.model) as shapes:
        box = together(batched, calls)
    assert box[:3] == expected
    assert isinstance(box[3], IndexError)
    assert isinstance(box[4], OSError) and "went away" in str(box[4])
    groups = prefill_shapes(shapes)
    assert groups[0][0] == 5 and [k for k, _ in groups[1:]] == [1] * 5  # failed, then alone


def test_cancelled_requests_in_a_batched_prefill(tok):
    """Of four requests admitted together, one cancelled while waiting is never prefilled; one
    whose stream closes at its third token stops there; the other two, prefilled in the same
    forward as that one, are unchanged."""
    model = scripted_model(tok, " Paris has the Louvre and a river called the Seine [1].")
    alone, batched = pair(model, tok, rules=DecodingRules.off())
    msgs = messages()
    ids, prefix = alone.prompt_ids(msgs)
    expected = alone.generate_ids(ids, prefix, max_new_tokens=12)
    warm(batched, [(ids, prefix, 0)])

    class Recorder:
        def __init__(self, cancel: Cancel | None = None) -> None:
            self.puts, self.ended, self.cancel = 0, False, cancel

        def put(self, value: torch.Tensor) -> None:
            self.puts += 1  # the prompt, then each new token
            if self.cancel is not None and self.puts == 4:
                self.cancel.event.set()  # closes its stream at its third token

        def end(self) -> None:
            self.ended = True

    def request(streamer: Recorder, cancel: Cancel) -> Any:
        kw = alone._generate_kwargs(ids, prefix, DecodeOptions(max_new_tokens=200))
        kw["stopping_criteria"].append(cancel)
        return batched.batcher.submit(kw | {"streamer": streamer})

    waiting, closing = Cancel(), Cancel()
    rec_waiting, rec_closing = Recorder(), Recorder(closing)
    box: list[Any] = []

    def other() -> None:
        box.append(batched.generate_ids(ids, prefix, max_new_tokens=12))

    others = [threading.Thread(target=other) for _ in range(2)]
    with forwards(model) as shapes:
        with batched._decode_lock:  # the worker takes the queue once all four are in it
            reqs = [request(rec_waiting, waiting), request(rec_closing, closing)]
            waiting.event.set()
            for t in others:
                t.start()
            while batched.batcher.requests < 4:
                time.sleep(0.002)
        for t in others:
            t.join(timeout=120)
        assert all(r.done.wait(timeout=30) for r in reqs)
    assert box == [expected, expected]
    assert rec_waiting.puts == 0 and rec_waiting.ended and reqs[0].error is None
    assert rec_closing.ended and reqs[1].error is None
    assert reqs[1].size - reqs[1].prompt_len == 3  # left at its third token, not its 200th
    assert prefill_shapes(shapes) == [(3, len(ids) - prefix)]
    batched.batcher.close()


# ---- setup -----------------------------------------------------------------------------------


def test_unsupported_cache_stays_unbatched(tok, caplog):
    """ModernBERT-decoder's local attention layers keep a sliding-window cache: no batching."""
    model = build_model("modernbert", tok)
    assert not BatchedDecoder.supports(model)
    with caplog.at_level("WARNING", logger="rag.generate.batching"):
        gen = Generator(model, tok, "cpu", batching=True)
    assert gen.batcher is None and "stays off" in caplog.text
    assert isinstance(gen.generate(messages(), max_new_tokens=4), str)


def test_bad_requests_are_refused(tok):
    dec = BatchedDecoder(build_model("llama", tok), tok)
    ids = torch.tensor([[1, 2, 3]])
    with pytest.raises(ValueError, match="num_beams"):
        dec.submit({"input_ids": ids, "num_beams": 2})
    with pytest.raises(ValueError, match="KV cache"):
        dec.submit({"input_ids": ids, "use_cache": False})
    with pytest.raises(ValueError, match="one sequence"):
        dec.submit({"input_ids": torch.tensor([[1, 2], [3, 4]])})
    with pytest.raises(ValueError, match="max_batch"):
        BatchedDecoder(dec.model, tok, max_batch=0)
    dec.close()
    with pytest.raises(RuntimeError, match="closed"):
        dec.submit({"input_ids": ids, "max_new_tokens": 2})


def test_max_prefill_tokens_reaches_the_batched_decoder_from_the_config(tok):
    """rag.toml's ``max_prefill_tokens`` is the batched decoder's prefill budget; 0 is refused."""
    from rag.config import ConfigError, RAGConfig

    gen = Generator(build_model("llama", tok), tok, "cpu", batching=True, max_prefill_tokens=123)
    assert gen.batcher is not None and gen.batcher.max_prefill_tokens == 123
    gen.batcher.close()
    with pytest.raises(ConfigError, match="--max-prefill-tokens"):
        RAGConfig.of(max_prefill_tokens=0)
