"""Batched decoding: one forward step decodes every request in flight (continuous batching).

Without it, :class:`rag.generate.generator.Generator` serves one ``model.generate`` at a time under
its decode lock, so N concurrent users wait for each other's whole answers (docs/benchmarks.md,
*Chat UI load*). A decode step of a small model reads every weight once whatever the batch, so B
sequences per step cost far less than B steps. :class:`BatchedDecoder` owns a worker thread that,
per iteration, admits the requests waiting (all of them, up to ``max_batch`` rows in all:
prefilled *together*, one padded forward per group of at most ``max_prefill_tokens`` tokens, each
row from the generator's prefix cache when it has one, the groups then merged into the batch in
one copy: :mod:`rag.generate.batch_prefill`), runs one step for all rows, and lets rows leave on
eos, a stop string, the loop guard, ``max_new_tokens`` or cancellation (a closed stream): the
slot is free for the next iteration. If a group's prefill forward raises, its requests are prefilled
again one at a time, so an error reaches only the request that causes it.

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
length, so left padding is valid). Each row picks its token as ``generate`` would alone
(:mod:`rag.generate.batch_request`), so a greedy answer is the same token ids batched or alone.
Only caches whose layers are all full-attention ``DynamicLayer`` are supported (not
sliding-window layers such as ModernBERT-decoder's local attention):
:meth:`BatchedDecoder.supports`.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer
from transformers.generation.stopping_criteria import StopStringCriteria

from rag.generate.batch_prefill import (
    CPU_FORWARD_COST_TOKENS,
    DEFAULT_MAX_PREFILL_TOKENS,
    Part,
    merge_caches,
    plan_prefill,
    prefill_forward,
    right_align,
)
from rag.generate.batch_request import BatchRequest, Job, eos_ids, takes_logits_to_keep
from rag.generate.kv_append import appending

log = logging.getLogger("rag.generate.batching")
T = TypeVar("T")


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
        moment a step ends, and a Python lock is not fair, so a caller could wait many steps, by
        which time the answer a citation score reads has left the prompt cache and its whole
        prompt runs again (docs/benchmarks.md, *Chat UI load*, commit 99bad7a).

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
            cache, logits = prefill_forward(self.model, self.device, group, self._keep_logits)
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
        cache, width = right_align(group, cache, keep, self.device)
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

    def _merge(self, parts: Sequence[Part]) -> None:
        """Add the prefilled groups of one admission to the batch: each part's rows and cache
        [k, H, width, D] (right-aligned), in one copy per layer for all of them, the batch's rows
        first (:func:`rag.generate.batch_prefill.merge_caches`)."""
        if not self._rows and len(parts) == 1:
            rows, cache, width = parts[0]
            # decode steps append into spare columns instead of copying the cache (kv_append)
            self._cache, self._width = appending(cache), width
            self._rows.extend(rows)
            return
        sources = [(self._cache, self._width)] if self._rows else []
        sources += [(cache, width) for _, cache, width in parts]
        target = self._cache if self._rows else parts[0][1]  # whose layers take the result
        new = merge_caches(sources, target)
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
