"""Batched decoding: one forward step decodes every request in flight (continuous batching).

Without it, :class:`rag.generate.generator.Generator` serves one ``model.generate`` at a time under
its decode lock, so N concurrent users wait for each other's whole answers (16 UI sessions: p50
56-64 s, 0.22 req/s, docs/benchmarks.md). A decode step of a small model reads every weight once
whatever the batch, so B sequences per step cost far less than B steps. :class:`BatchedDecoder`
owns a worker thread that, per iteration, admits the requests waiting (all of them, up to
``max_batch`` rows in all: prefilled *together*, one padded forward per group of at most
``max_prefill_tokens`` tokens, each row from the generator's prefix cache when it has one, the
groups then merged into the batch in one copy), runs one step for all rows, and lets rows leave on
eos, a stop string, the loop guard, ``max_new_tokens`` or cancellation (a closed stream) — the slot
is free for the next iteration.

Why not a library. ``model.generate`` decodes a fixed batch handed over at once; nothing joins
or leaves mid-way. transformers 5.24 does ship continuous batching (``model.generate_batch``,
``init_continuous_batching`` → ``ContinuousBatchingManager`` with ``add_request`` /
``cancel_request`` / streaming), checked and not used because: it switches the *shared* model to
a paged attention implementation for as long as the manager runs (``switch_to_cb_friendly_attn``),
while ``score_continuations`` and unbatched calls use the same model with a ``DynamicCache``; its
block-allocated ``PagedAttentionCache`` cannot start from our cached system prefix; a request
stops only on eos or ``max_new_tokens`` (no ``StoppingCriteria``, so no stop strings, loop guard
or cancel-on-close); per request it offers temperature/top-k/top-p only (no repetition penalty,
no-repeat n-grams, ``min_new_tokens``); and it is tuned for accelerators (CUDA graphs, paged or
flash kernels). What is ours is therefore small: a loop over the model's own ``forward`` with a
left-padded ``DynamicCache``.

Exactness. Rows are left-padded to the longest one; the 2D attention mask hides the padding and
explicit ``position_ids`` give each row its real positions (rotary embeddings see the same
angles as alone; transformers builds the causal mask in cache-column space, from the cache
length, so left padding is valid). Logits processors and stopping criteria are transformers' own
classes applied per row, with the same options ``generate`` gets, so a greedy answer is the same
token ids batched or alone (float32; tests/test_batching.py checks Llama and Qwen2). Only caches
whose layers are all full-attention ``DynamicLayer`` are supported (not sliding-window layers such
as ModernBERT-decoder's local attention): :meth:`BatchedDecoder.supports`.

Batched prefill. Requests admitted together are prefilled together, one forward per group (which
ones share a forward: below): each row's cache (the prefix cache the generator handed it, or
nothing) is left-padded to the longest, and each row's *suffix* (the prompt ids its cache does not
hold) is left-padded to the longest suffix. So the pads sit in the middle, between a row's cached
prefix and its suffix; the 2D mask hides them, ``position_ids`` give the suffix tokens their real
positions (after the row's own prefix), and causality keeps the leading pads out of every real
token's view. Left padding of the suffix (rather than right) puts every row's last real token in
the last column, so ``logits_to_keep=1`` gives each row its next-token logits; right padding would
need the logits of every position (or the model's hidden states) to find them. Pads that see no
real column at all (a row without a cache, shorter than the longest suffix) are fully masked rows,
which torch's SDPA returns as zeros and eager attention as a finite average; their outputs are
never read. After the forward each row's columns are moved right-aligned (one gather per layer; pad
columns zeroed), which is the decode batch's own layout, and the admission's groups join the
batch by one copy. Why not keep the middle padding while decoding: with every row right-aligned, a
step's mask and positions follow from the row lengths alone, and rows leaving trim the padding all
rows share with a slice. The token budget bounds a prefill forward's activations (rows x longest
suffix). Which requests share a forward is a cost estimate (:func:`plan_prefill`): on CPU prefill
is compute-bound, a pad token costs as much as a real one, and batching saves only each forward's
fixed cost (reading every weight once, ~33 tokens' worth for SmolLM2 in float32), so requests of
like lengths share a forward and very different ones do not; on an accelerator all that fit the
budget share one. If a group's forward raises, its requests are prefilled again one at a time, so
an error reaches only the request that causes it.
"""

from __future__ import annotations

import inspect
import logging
import threading
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import torch
import torch.nn.functional as F
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer
from transformers.generation.logits_process import (
    LogitsProcessorList,
    MinNewTokensLengthLogitsProcessor,
    NoBadWordsLogitsProcessor,
    NoRepeatNGramLogitsProcessor,
    RepetitionPenaltyLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)
from transformers.generation.stopping_criteria import StopStringCriteria

from rag.generate.kv_append import appending
from rag.generate.streaming import Cancel

log = logging.getLogger("rag.generate.batching")
T = TypeVar("T")

# ---- one request: its options, its ids so far, its next token ---------------------------------
#
# Exactness lives here: the logits processors are transformers' own classes, built from the same
# options and in the same order as ``generate`` builds them, and the stopping criteria are the
# caller's own objects, so a row decoded in a batch picks the token it would pick alone.

# The ``model.generate`` options a request may carry (what Generator._generate_kwargs builds).
OPTIONS = frozenset(
    "input_ids attention_mask max_new_tokens min_new_tokens use_cache pad_token_id do_sample"  # noqa: SIM905
    " temperature top_p top_k repetition_penalty no_repeat_ngram_size stopping_criteria"
    " stop_strings tokenizer cache streamer bad_words_ids".split()
)


def eos_ids(model: Any) -> set[int]:
    """The ids that end a sequence, as ``generate`` reads them (generation config, else config)."""
    eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if eos is None:
        eos = getattr(model.config, "eos_token_id", None)
    if eos is None:
        return set()
    return {int(eos)} if isinstance(eos, int) else {int(e) for e in eos}


def takes_logits_to_keep(model: Any) -> bool:
    """Whether ``model``'s forward (a PEFT wrapper's: its base model's) takes ``logits_to_keep``,
    so a prompt's forward can project only its last position onto the vocabulary."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    try:
        return "logits_to_keep" in inspect.signature(base.forward).parameters
    except (TypeError, ValueError):
        return False


class BatchRequest:
    """One ``generate`` call: its options, the ids so far, and how it reports back."""

    def __init__(self, kw: dict[str, Any], eos: set[int], stops: StopStringCriteria | None):
        unknown = set(kw) - OPTIONS
        if unknown:
            raise ValueError(f"the batched decoder does not support {sorted(unknown)}")
        if not kw.get("use_cache", True):
            raise ValueError("the batched decoder always uses the KV cache")
        input_ids: torch.Tensor = kw["input_ids"]  # [1, n]
        if input_ids.shape[0] != 1:
            raise ValueError("one sequence per request")
        self.input_ids = input_ids
        self.prompt_len = n = input_ids.shape[1]
        self.max_new = int(kw.get("max_new_tokens") or 0)
        # prompt + new ids, as the stopping criteria and processors see them: [1, n + max_new]
        self.buf = torch.zeros(1, n + self.max_new, dtype=torch.long)
        self.buf[:, :n] = input_ids.cpu()
        self.size = n  # ids in buf; all but the last are in the KV cache once decoding started
        self.start = 0  # prompt ids the handed-in cache holds (set at admission)
        self.cache = kw.get("cache")
        # keep the prompt's keys and values in the prompt cache: it came with a cache to start
        # from (an empty one when nothing was cached), i.e. the caller used its caches
        self.remember = self.cache is not None
        self.streamer = kw.get("streamer")
        self.sample = bool(kw.get("do_sample"))
        self.criteria = list(kw.get("stopping_criteria") or ())
        if stops is not None:
            self.criteria.append(stops)
        self.processors = self._processors(kw, eos)
        self.done = threading.Event()
        self.error: BaseException | None = None

    def _processors(self, kw: dict[str, Any], eos: set[int]) -> LogitsProcessorList:
        """The processors ``generate`` builds for these options, in its order. Sampling options
        that only a model's ``generation_config`` sets (``min_p``, ``typical_p``, ...) are not
        applied: Generator passes every option it uses explicitly."""
        procs = LogitsProcessorList()
        penalty = kw.get("repetition_penalty")
        if penalty is not None and penalty != 1.0:
            procs.append(RepetitionPenaltyLogitsProcessor(penalty=penalty))
        if kw.get("no_repeat_ngram_size"):
            procs.append(NoRepeatNGramLogitsProcessor(kw["no_repeat_ngram_size"]))
        if kw.get("bad_words_ids"):
            procs.append(NoBadWordsLogitsProcessor(kw["bad_words_ids"], eos_token_id=sorted(eos)))
        if kw.get("min_new_tokens") and eos:
            procs.append(
                MinNewTokensLengthLogitsProcessor(
                    self.prompt_len, kw["min_new_tokens"], torch.tensor(sorted(eos))
                )
            )
        if self.sample:
            if kw.get("temperature") is not None and kw["temperature"] != 1.0:
                procs.append(TemperatureLogitsWarper(kw["temperature"]))
            if kw.get("top_k"):
                procs.append(TopKLogitsWarper(top_k=kw["top_k"]))
            if kw.get("top_p") is not None and kw["top_p"] < 1.0:
                procs.append(TopPLogitsWarper(top_p=kw["top_p"]))
        return procs

    @property
    def ids(self) -> torch.Tensor:
        """Prompt + new ids so far: [1, size] (a view)."""
        return self.buf[:, : self.size]

    @property
    def cancelled(self) -> bool:
        return any(isinstance(c, Cancel) and c.event.is_set() for c in self.criteria)

    def choose(self, logits: torch.Tensor, greedy: int) -> int:
        """The next id from this row's logits [1, V]; ``greedy`` is their argmax."""
        if not self.processors and not self.sample:
            return greedy
        scores = self.processors(self.ids.to(logits.device), logits)
        if self.sample:
            return int(torch.multinomial(torch.softmax(scores, dim=-1), num_samples=1)[0, 0])
        return int(scores.argmax(dim=-1)[0])


# A prefilled group ready to join the batch: its requests, their right-aligned cache
# [k, H, width, D] and that width (BatchedDecoder._prefill -> BatchedDecoder._merge).
Part = tuple[list["BatchRequest"], Any, int]


class Job:
    """A call the worker runs between two steps (:meth:`BatchedDecoder.call`), and its outcome."""

    def __init__(self, fn: Callable[[], Any]) -> None:
        self.fn = fn
        self.result: Any = None
        self.error: BaseException | None = None
        self.done = threading.Event()


# ---- the batch: requests joining and leaving one decode loop --------------------------------

# Padded prompt tokens (rows x longest suffix) one batched prefill forward may compute; requests
# beyond it go to another forward of the same admission. Bounds the prefill's activations
# (SmolLM2: 576 wide, so a few hundred MB in float32 at this size); a single longer prompt is
# still prefilled, alone.
DEFAULT_MAX_PREFILL_TOKENS = 4096
# A forward's fixed cost on CPU in prompt tokens' worth: every forward streams all the weights
# from memory whatever its size. Measured on the 2-core AVX2-only AMD EPYC VM, beside a running
# chat UI that used about half a core, so a rough figure (SmolLM2-135M, float32, 2 threads, one
# prefill forward of k = 1, 4, 16 rows x L = 1-256 suffix tokens after the cached system
# prefix): about 80 ms + 2.4 ms x k x L, so a row joining a forward saves ~33 tokens of
# time and each pad token costs one. On an accelerator the fixed cost (kernel launches) dwarfs a
# token's; there the whole budget is used: every request that fits shares the forward.
CPU_FORWARD_COST_TOKENS = 32


def plan_prefill(lengths: Sequence[int], budget: int, forward_cost: int) -> list[int]:
    """Split requests of suffix ``lengths`` (sorted ascending) into consecutive groups, one
    prefill forward each, minimising the estimated time ``forward_cost`` + rows x longest per
    forward, with rows x longest <= ``budget`` unless a group is one request. Returns the group
    sizes. Sorted lengths make consecutive groups optimal (a group's cost is set by its
    longest), so a dynamic programme over the split points finds the best plan."""
    n = len(lengths)
    best: list[tuple[int, int]] = [(0, 0)] + [(0, 0)] * n  # (cost, forwards) of the first j
    first = [0] * (n + 1)  # where the last group of the best plan for the first j starts
    for j in range(1, n + 1):
        longest, options = lengths[j - 1], []
        for i in range(j - 1, -1, -1):  # the last group is i..j-1
            rows = j - i
            if rows > 1 and rows * longest > budget:
                break  # more rows only grow it
            cost, forwards = best[i]
            options.append((cost + forward_cost + rows * longest, forwards + 1, i))
        cost, forwards, first[j] = min(options)  # ties: fewer forwards, then longer last group
        best[j] = (cost, forwards)
    sizes = []
    j = n
    while j:
        sizes.append(j - first[j])
        j = first[j]
    return sizes[::-1]


def _pad_left(t: torch.Tensor, n: int) -> torch.Tensor:
    """``t`` [B, H, S, D] with ``n`` zero columns in front: [B, H, n + S, D]."""
    return F.pad(t, (0, 0, n, 0)) if n else t


class BatchedDecoder:
    """Decodes all requests in flight together, one token per row per step, on a worker thread.

    :meth:`generate` takes the keyword arguments of ``model.generate`` that
    :class:`rag.generate.generator.Generator` passes (``input_ids`` [1, n], ``cache`` = a private copy of
    the prefix cache, sampling options, ``stopping_criteria``, ``stop_strings``, ``streamer``)
    and returns the same ids [1, n + new]; the streamer gets the prompt, then each new id, then
    ``end()``, as from ``generate``. Each step runs under ``lock`` (the generator's decode lock).
    Other work on the model (``score_continuations``) goes through :meth:`call`, which runs it
    on the worker between two steps.

    ``max_batch`` bounds the rows decoded per step; ``max_prefill_tokens`` the padded tokens (rows
    x longest uncached suffix) of one prefill forward (:data:`DEFAULT_MAX_PREFILL_TOKENS`).
    Requests admitted together are split, shortest suffix first, into the prefill forwards that
    :func:`plan_prefill` estimates fastest, a forward's fixed cost being ``prefill_forward_cost``
    tokens (None: :data:`CPU_FORWARD_COST_TOKENS` on CPU, elsewhere the whole budget, so all
    that fit share one forward).
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any = None,
        *,
        device: str = "cpu",
        lock: threading.Lock | None = None,
        max_batch: int = 8,
        max_prefill_tokens: int = DEFAULT_MAX_PREFILL_TOKENS,
        prefill_forward_cost: int | None = None,
        prompt_cache: Any = None,
    ) -> None:
        if max_batch < 1:
            raise ValueError("max_batch must be at least 1")
        if max_prefill_tokens < 1:
            raise ValueError(f"max_prefill_tokens must be at least 1, got {max_prefill_tokens}")
        self.model, self.tokenizer, self.device = model, tokenizer, device
        self.lock = lock or threading.Lock()
        self.max_batch = max_batch
        self.max_prefill_tokens = max_prefill_tokens
        if prefill_forward_cost is None:
            cpu = torch.device(device).type == "cpu"
            prefill_forward_cost = CPU_FORWARD_COST_TOKENS if cpu else max_prefill_tokens
        if prefill_forward_cost < 0:
            raise ValueError(f"prefill_forward_cost must be >= 0, got {prefill_forward_cost}")
        self.prefill_forward_cost = prefill_forward_cost
        # where prefilled prompts' keys and values are kept (rag.generate.prompt_cache), or None
        self.prompt_cache = prompt_cache
        self.eos = eos_ids(model)
        self._keep_logits = takes_logits_to_keep(model)
        self._stops: dict[tuple[str, ...], StopStringCriteria] = {}
        self._cv = threading.Condition()
        self._waiting: deque[BatchRequest] = deque()
        self._jobs: deque[Job] = deque()  # calls to run before the next step (call)
        self._rows: list[BatchRequest] = []  # worker thread only
        self._cache: Any = None  # the batch's DynamicCache, [rows, heads, width, head_dim]
        self._width = 0  # columns of the cache (the longest row; shorter rows are left-padded)
        self._thread: threading.Thread | None = None
        self._closed = False
        self.requests = 0  # requests submitted (tests, benchmark)
        self.steps = 0  # batch steps run
        self.row_steps = 0  # sum of rows over steps: row_steps / steps = mean batch size
        self.max_rows = 0  # largest batch seen
        self.prefills = 0  # prefill forwards run (batched or alone)
        self.prefill_rows = 0  # requests over them: prefill_rows / prefills = mean prefill batch
        self.jobs = 0  # calls run between steps

    @staticmethod
    def supports(model: Any) -> bool:
        """Whether every layer of the model's cache is a plain full-attention ``DynamicLayer``."""
        cache = DynamicCache(config=model.config)
        return bool(cache.layers) and all(type(layer) is DynamicLayer for layer in cache.layers)

    @classmethod
    def attach(
        cls,
        generator: Any,
        max_batch: int = 8,
        max_prefill_tokens: int = DEFAULT_MAX_PREFILL_TOKENS,
        prefill_forward_cost: int | None = None,
    ) -> BatchedDecoder | None:
        """A decoder for ``generator``'s model under its decode lock, or None (with a warning)
        when the model's cache is not supported, so the generator stays unbatched."""
        if not cls.supports(generator.model):
            log.warning("batched decoding needs full-attention DynamicCache layers; it stays off")
            return None
        return cls(
            generator.model,
            generator.tokenizer,
            device=generator.device,
            lock=generator._decode_lock,
            max_batch=max_batch,
            max_prefill_tokens=max_prefill_tokens,
            prefill_forward_cost=prefill_forward_cost,
            prompt_cache=getattr(generator, "prompts", None),
        )

    # ---- callers' side -------------------------------------------------------------------------

    def generate(self, **kw: Any) -> torch.Tensor:
        """Like ``model.generate(**kw)`` for one sequence: blocks until this request is done."""
        req = self.submit(kw)
        req.done.wait()
        if req.error is not None:
            raise req.error
        return req.ids.clone()

    def submit(self, kw: dict[str, Any]) -> BatchRequest:
        """Queue a request (``model.generate`` keyword arguments); it joins at the next step."""
        stops = None
        if kw.get("stop_strings"):
            key = tuple(kw["stop_strings"])
            stops = self._stops.get(key)
            if stops is None:
                stops = self._stops[key] = StopStringCriteria(kw["tokenizer"], list(key))
        req = BatchRequest(kw, self.eos, stops)
        with self._cv:
            self._wake()
            self._waiting.append(req)
            self.requests += 1
        return req

    def call(self, fn: Callable[[], T]) -> T:
        """``fn()`` with the model to itself: run by the worker before its next step (so at most
        one step later), under ``lock`` and ``torch.inference_mode``; returns what it returns or
        raises what it raises. Calls queued meanwhile run in the order they came.

        Why not take ``lock`` on the caller's thread, as before: the worker takes it again the
        moment a step ends, and a Python lock is not fair, so a caller could wait many steps.
        Measured at 16 API sessions (SmolLM2, the AVX2 EPYC): citation scores waited 12 s on
        average for the lock, by which time the answer they score had left the prompt cache, so
        each then ran its whole prompt again (2.5 s, no decode step meanwhile).

        Called on the worker itself (from a streamer callback or a job), ``fn`` runs at once: the
        worker already holds ``lock``, and queueing would wait on itself."""
        if self._thread is not None and threading.current_thread() is self._thread:
            return fn()
        job = Job(fn)
        with self._cv:
            self._wake()
            self._jobs.append(job)
        job.done.wait()
        if job.error is not None:
            raise job.error
        return job.result

    def _wake(self) -> None:
        """Under ``_cv``: refuse when closed, start the worker once, wake it for new work."""
        if self._closed:
            raise RuntimeError("the batched decoder is closed")
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="rag-batch", daemon=True)
            self._thread.start()
        self._cv.notify()

    def close(self) -> None:
        """Stop the worker; requests still waiting or decoding fail with RuntimeError."""
        with self._cv:
            self._closed = True
            self._cv.notify()
        if self._thread is not None:
            self._thread.join()

    # ---- worker --------------------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            with self._cv:
                while not (self._closed or self._waiting or self._rows or self._jobs):
                    self._cv.wait()
                if self._closed:
                    break
            joining: list[BatchRequest] = []
            try:
                # the waiting requests are taken once the lock is held, so all that queued while
                # an unbatched call (or a test) held it are admitted, and prefilled, together
                with self.lock, torch.inference_mode():
                    self._run_jobs()
                    joining = self._take()
                    self._admit(joining)
                    self._leave([i for i, r in enumerate(self._rows) if not r.cancelled])
                    if self._rows:
                        self._step()
            except BaseException as e:  # a failed step fails every row in the batch
                log.exception("batched decoding step failed")
                for req in [*self._rows, *joining]:
                    if not req.done.is_set():
                        self._finish(req, e)
                self._rows, self._cache, self._width = [], None, 0
        error = RuntimeError("the batched decoder was closed")
        for req in [*self._waiting, *self._rows]:
            self._finish(req, error)
        with self._cv:
            jobs, self._jobs = list(self._jobs), deque()
        for job in jobs:
            job.error = error
            job.done.set()

    def _run_jobs(self) -> None:
        """Run the calls queued so far (:meth:`call`), each delivering its own result or error."""
        while True:
            with self._cv:
                if not self._jobs:
                    return
                job = self._jobs.popleft()
            try:
                job.result = job.fn()
            except BaseException as e:  # the caller raises it; the batch goes on
                job.error = e
            self.jobs += 1
            job.done.set()

    def _take(self) -> list[BatchRequest]:
        """The waiting requests that fit the batch (cancelled ones finish without a prefill)."""
        with self._cv:
            for req in [r for r in self._waiting if r.cancelled]:
                self._waiting.remove(req)
                self._finish(req)
            joining = []
            while self._waiting and len(self._rows) + len(joining) < self.max_batch:
                joining.append(self._waiting.popleft())
        return joining

    def _admit(self, joining: Sequence[BatchRequest]) -> None:
        """Prefill ``joining`` in the groups :func:`plan_prefill` picks (shortest suffix first,
        at most ``max_prefill_tokens`` padded tokens each) and merge each into the batch."""
        ready = sorted(
            (req for req in joining if self._prepare(req)), key=lambda r: r.prompt_len - r.start
        )
        lengths = [r.prompt_len - r.start for r in ready]
        done, parts = 0, []
        for size in plan_prefill(lengths, self.max_prefill_tokens, self.prefill_forward_cost):
            parts += self._prefill(ready[done : done + size])
            done += size
        if parts:
            self._merge(parts)

    def _prepare(self, req: BatchRequest) -> bool:
        """Check ``req`` before its prefill and stream its prompt; False when it is finished
        already (cancelled, nothing to decode, or an error delivered to it)."""
        try:
            if req.cancelled or req.max_new <= 0:
                self._finish(req)
                return False
            req.start = req.cache.get_seq_length() if req.cache is not None else 0
            if req.start >= req.prompt_len:
                raise ValueError("the cached prefix covers the whole prompt")
            if req.streamer is not None:
                req.streamer.put(req.input_ids.cpu())
            return True
        except Exception as e:
            self._finish(req, e)
            return False

    def _prefill(self, group: list[BatchRequest]) -> list[Part]:
        """One forward for ``group`` and its first tokens; returns the rows that go on, with
        their right-aligned cache and its width, for :meth:`_merge`. A failed forward of several
        requests is retried one request at a time."""
        try:
            cache, logits = self._forward(group)
        except Exception as e:
            if len(group) == 1:
                self._finish(group[0], e)
                return []
            log.warning("batched prefill of %d requests failed (%s): one at a time", len(group), e)
            return [part for req in group for part in self._prefill([req])]
        self.prefills += 1
        self.prefill_rows += len(group)
        greedy = logits.argmax(dim=-1).tolist()
        keep = []
        for b, req in enumerate(group):
            req.cache = None
            try:
                done = self._advance(req, req.choose(logits[b : b + 1], greedy[b]))
            except Exception as e:  # this row's processors, criteria or streamer
                self._finish(req, e)
                continue
            if done:
                self._finish(req)
            else:
                keep.append(b)
        if not keep:
            return []
        rows = [group[b] for b in keep]
        cache, width = self._right_align(group, cache, keep)
        self._remember(rows, cache, width)
        return [(rows, cache, width)]

    def _remember(self, rows: Sequence[BatchRequest], cache: Any, width: int) -> None:
        """Keep each row's prompt keys and values (its last ``prompt_len`` columns of the
        right-aligned ``cache`` [k, H, width, D]) in the prompt cache, when there is one."""
        for j, req in enumerate(rows):
            if req.remember:
                self._keep(req.input_ids[0].tolist(), cache, j, width)

    def _keep(self, ids: list[int], cache: Any, row: int, width: int) -> None:
        """Store ``ids``' keys and values, the last ``len(ids)`` columns of ``row`` of the
        right-aligned ``cache`` of ``width`` columns, in the prompt cache (when there is one and
        the request used its caches)."""
        if self.prompt_cache is None:
            return
        a = width - len(ids)
        layers = [
            (layer.keys[row : row + 1, :, a:width], layer.values[row : row + 1, :, a:width])
            for layer in cache.layers
        ]
        try:
            self.prompt_cache.store(ids, layers)
        except Exception as e:  # a cache is an optimisation: the answer goes on without it
            log.warning("prompt cache: could not keep a prompt (%s)", e)

    def _forward(self, group: Sequence[BatchRequest]) -> tuple[Any, torch.Tensor]:
        """Prefill ``group`` in one forward: each row's cache (its prefix, or nothing) left-padded
        to the longest, each row's suffix left-padded to the longest suffix, so the pads sit
        before the cache and between cache and suffix (the mask hides them). Returns the cache
        [k, H, width + longest, D] and each row's next-token logits [k, V] (float32)."""
        k = len(group)
        starts = torch.tensor([r.start for r in group])  # [k] cached ids per row
        lens = torch.tensor([r.prompt_len - r.start for r in group])  # [k] suffix ids per row
        width, longest = int(starts.max()), int(lens.max())
        if k == 1:  # alone: the request's own cache, no padding
            req = group[0]
            cache = req.cache if req.cache is not None else DynamicCache(config=self.model.config)
        else:
            cache = self._stack(group, width)
        ids = torch.zeros(k, longest, dtype=torch.long)  # pad id 0: any valid id, masked
        for b, req in enumerate(group):
            ids[b, longest - int(lens[b]) :] = req.input_ids[0, req.start :].cpu()
        cols = torch.arange(width + longest)
        mask = ((cols >= width - starts[:, None]) & (cols < width)) | (
            cols >= width + longest - lens[:, None]
        )  # [k, width + longest]: the row's cached columns and its suffix
        # suffix tokens at their real positions (after the row's prefix); pads at 0..
        pos = (torch.arange(longest) - (longest - lens)[:, None] + starts[:, None]).clamp(min=0)
        kw: dict[str, Any] = {
            "input_ids": ids.to(self.device),
            "attention_mask": mask.long().to(self.device),
            "position_ids": pos.to(self.device),
            "cache": cache,
            "use_cache": True,
        }
        if self._keep_logits:
            kw["logits_to_keep"] = 1
        out = self.model(**kw)
        cache = out["cache"] if "cache" in out else out["past_key_values"]
        return cache, out["logits"][:, -1, :].float()

    def _stack(self, group: Sequence[BatchRequest], width: int) -> Any:
        """A new cache holding each request's cache as a row, left-padded to ``width`` columns
        (zeros for a request without one). The requests' own caches are not changed."""
        stacked = DynamicCache(config=self.model.config)
        if width == 0:
            return stacked
        first = next(r.cache for r in group if r.start)
        for i, layer in enumerate(stacked.layers):
            keys, values = [], []
            for req in group:
                if req.start:
                    theirs = req.cache.layers[i]  # [1, H, start, D]
                    keys.append(_pad_left(theirs.keys, width - req.start))
                    values.append(_pad_left(theirs.values, width - req.start))
                else:
                    k, v = first.layers[i].keys, first.layers[i].values
                    keys.append(k.new_zeros(1, k.shape[1], width, k.shape[3]))
                    values.append(v.new_zeros(1, v.shape[1], width, v.shape[3]))
            layer.update(torch.cat(keys), torch.cat(values))
        return stacked

    def _right_align(
        self, group: Sequence[BatchRequest], cache: Any, keep: Sequence[int]
    ) -> tuple[Any, int]:
        """Rows ``keep`` of a prefilled ``cache`` in the batch's layout: each row's prompt in its
        last columns, zero padding before it (the middle pads moved to the front). Returns the
        cache and its width (the longest prompt kept)."""
        # the forward's columns: the longest cache (width) + the longest suffix, of all the group
        width = max(r.start for r in group)
        total = width + max(r.prompt_len - r.start for r in group)
        if len(keep) < len(group):
            cache.batch_select_indices(torch.tensor(list(keep), device=self.device))
        rows = [group[b] for b in keep]
        starts = torch.tensor([r.start for r in rows])[:, None]  # [k, 1]
        lens = torch.tensor([r.prompt_len - r.start for r in rows])[:, None]
        prompts = starts + lens  # [k, 1] prompt lengths
        new = int(prompts.max())
        t = torch.arange(new)[None, :]  # target column
        pad = new - prompts  # [k, 1] leading pads in the target
        src = torch.where(
            t < pad + starts,
            width - starts + (t - pad),  # the row's cached prefix
            total - lens + (t - pad - starts),  # the row's suffix
        )  # [k, new] source column of each target column
        real = t >= pad
        if torch.equal(src[real], (t + total - new).expand_as(src)[real]):
            trim = total - new  # right-aligned already (no caches, or one suffix length)
            for layer in cache.layers if trim else ():
                layer.keys = layer.keys[:, :, trim:, :]
                layer.values = layer.values[:, :, trim:, :]
        else:
            src = torch.where(real, src, 0)[:, None, :, None].to(self.device)  # [k, 1, new, 1]
            for layer in cache.layers:
                layer.keys = layer.keys.gather(
                    2, src.expand(-1, layer.keys.shape[1], -1, layer.keys.shape[3])
                )
                layer.values = layer.values.gather(
                    2, src.expand(-1, layer.values.shape[1], -1, layer.values.shape[3])
                )
        if not bool(real.all()):  # the pads' keys and values (of pad ids) as zeros, as in a merge
            hide = (~real)[:, None, :, None].to(self.device)
            for layer in cache.layers:
                layer.keys = layer.keys.masked_fill(hide, 0)
                layer.values = layer.values.masked_fill(hide, 0)
        return cache, new

    def _merge(self, parts: Sequence[Part]) -> None:
        """Add the prefilled groups of one admission to the batch: each part's rows and cache
        [k, H, width, D] (right-aligned), every side left-padded with zeros to the widest.

        One copy per layer for all of them (the batch's rows first, then each part's), not one
        concatenation per group: the batch's cache was copied again for every group that
        joined (7 groups of 16 distinct questions: ~1 s of a 14 s burst, SmolLM2 bf16 on the
        2-core Xeon)."""
        if not self._rows and len(parts) == 1:
            rows, cache, width = parts[0]
            # decode steps append into spare columns instead of copying the cache (kv_append)
            self._cache, self._width = appending(cache), width
            self._rows.extend(rows)
            return
        sources = [(self._cache, self._width)] if self._rows else []
        sources += [(cache, width) for _, cache, width in parts]
        new = max(width for _, width in sources)
        total = sum(int(cache.layers[0].keys.shape[0]) for cache, _ in sources)
        target = self._cache if self._rows else parts[0][1]  # whose layers take the result
        for i, layer in enumerate(target.layers):
            for name in ("keys", "values"):
                first = getattr(sources[0][0].layers[i], name)  # [B, H, width, D]
                out = first.new_zeros(total, first.shape[1], new, first.shape[3])
                at = 0
                for cache, width in sources:
                    t = getattr(cache.layers[i], name)
                    out[at : at + t.shape[0], :, new - width :] = t  # right-aligned
                    at += t.shape[0]
                setattr(layer, name, out)
        if not self._rows:
            self._cache = appending(target)
        self._width = new
        for rows, _, _ in parts:
            self._rows.extend(rows)

    def _step(self) -> None:
        """One token for every row: input [B, 1], mask [B, width + 1], positions [B, 1]."""
        rows, width = self._rows, self._width
        cached = torch.tensor([r.size - 1 for r in rows], device=self.device)  # [B] real lengths
        tokens = torch.tensor([[int(r.buf[0, r.size - 1])] for r in rows], device=self.device)
        cols = torch.arange(width + 1, device=self.device)
        mask = (cols[None, :] >= (width - cached)[:, None]).long()  # left padding = 0
        out = self.model(
            input_ids=tokens,
            attention_mask=mask,
            position_ids=cached[:, None],
            cache=self._cache,
            use_cache=True,
        )
        self._width += 1
        self.steps += 1
        self.row_steps += len(rows)
        self.max_rows = max(self.max_rows, len(rows))
        logits = out["logits"][:, -1, :].float()  # [B, V]
        greedy = logits.argmax(dim=-1).tolist()
        keep = []
        for b, req in enumerate(rows):
            if self._advance(req, req.choose(logits[b : b + 1], greedy[b])):
                self._remember_answer(b, req)  # before the caller wakes to score citations
                self._finish(req)
            else:
                keep.append(b)
        self._leave(keep)

    def _remember_answer(self, b: int, req: BatchRequest) -> None:
        """Keep row ``b``'s prompt + answer keys and values (every id but the one just chosen)
        in the prompt cache, so the citation scores asked right after the answer run none of
        it again."""
        if req.remember:
            self._keep(req.buf[0, : req.size - 1].tolist(), self._cache, b, self._width)

    def _advance(self, req: BatchRequest, token: int) -> bool:
        """Append ``token`` to ``req``, stream it; whether ``req`` is finished (as in generate:
        eos, ``max_new_tokens``, or any stopping criterion on the ids so far)."""
        req.buf[0, req.size] = token
        req.size += 1
        if req.streamer is not None:
            req.streamer.put(torch.tensor([token]))
        if token in self.eos or req.size - req.prompt_len >= req.max_new:
            return True
        return any(bool(c(req.ids, None).any()) for c in req.criteria)

    def _leave(self, keep: Sequence[int]) -> None:
        """Keep only rows ``keep`` (others finished or were cancelled) and drop the padding
        columns every remaining row has."""
        if len(keep) == len(self._rows):
            return
        for b, req in enumerate(self._rows):
            if b not in keep and not req.done.is_set():
                self._finish(req)
        if not keep:
            self._rows, self._cache, self._width = [], None, 0
            return
        self._rows = [self._rows[b] for b in keep]
        self._cache.batch_select_indices(torch.tensor(list(keep), device=self.device))
        trim = self._width - max(r.size - 1 for r in self._rows)
        if trim:
            for layer in self._cache.layers:
                layer.keys = layer.keys[:, :, trim:, :]  # [B, H, width - trim, D]
                layer.values = layer.values[:, :, trim:, :]
            self._width -= trim

    def _finish(self, req: BatchRequest, error: BaseException | None = None) -> None:
        req.error = error
        req.cache = None
        if error is None and req.streamer is not None:
            req.streamer.end()  # on error the caller ends its stream, as after generate raising
        req.done.set()
