"""Batched decoding: one forward step decodes every request in flight (continuous batching).

Without it, :class:`rag.generate.generator.Generator` serves one ``model.generate`` at a time under its
decode lock, so N concurrent users wait for each other's whole answers (16 UI sessions: p50
56-64 s, 0.22 req/s, docs/benchmarks.md). A decode step of a small model reads every weight once
whatever the batch, so B sequences per step cost far less than B steps. :class:`BatchedDecoder`
owns a worker thread that, per iteration, lets waiting requests join (each prompt is prefilled
alone, from the generator's prefix cache when it has one, then merged into the batch), runs one
step for all rows, and lets rows leave on eos, a stop string, the loop guard, ``max_new_tokens``
or cancellation (a closed stream) — the slot is free for the next iteration.

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
"""

from __future__ import annotations

import inspect
import logging
import threading
from collections import deque
from collections.abc import Sequence
from typing import Any

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

from rag.generate.streaming import Cancel

log = logging.getLogger("rag.generate.batching")

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
        self.cache = kw.get("cache")
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


# ---- the batch: requests joining and leaving one decode loop --------------------------------


def _pad_left(t: torch.Tensor, n: int) -> torch.Tensor:
    """``t`` [B, H, S, D] with ``n`` zero columns in front: [B, H, n + S, D]."""
    return F.pad(t, (0, 0, n, 0)) if n else t


class BatchedDecoder:
    """Decodes all requests in flight together, one token per row per step, on a worker thread.

    :meth:`generate` takes the keyword arguments of ``model.generate`` that
    :class:`rag.generate.generator.Generator` passes (``input_ids`` [1, n], ``cache`` = a private copy of
    the prefix cache, sampling options, ``stopping_criteria``, ``stop_strings``, ``streamer``)
    and returns the same ids [1, n + new]; the streamer gets the prompt, then each new id, then
    ``end()``, as from ``generate``. Each step runs under ``lock`` (the generator's decode lock),
    so unbatched calls such as ``score_continuations`` interleave between steps.
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any = None,
        *,
        device: str = "cpu",
        lock: threading.Lock | None = None,
        max_batch: int = 8,
    ) -> None:
        if max_batch < 1:
            raise ValueError("max_batch must be at least 1")
        self.model, self.tokenizer, self.device = model, tokenizer, device
        self.lock = lock or threading.Lock()
        self.max_batch = max_batch
        self.eos = eos_ids(model)
        base = model.get_base_model() if hasattr(model, "get_base_model") else model
        self._keep_logits = "logits_to_keep" in inspect.signature(base.forward).parameters
        self._stops: dict[tuple[str, ...], StopStringCriteria] = {}
        self._cv = threading.Condition()
        self._waiting: deque[BatchRequest] = deque()
        self._rows: list[BatchRequest] = []  # worker thread only
        self._cache: Any = None  # the batch's DynamicCache, [rows, heads, width, head_dim]
        self._width = 0  # columns of the cache (the longest row; shorter rows are left-padded)
        self._thread: threading.Thread | None = None
        self._closed = False
        self.requests = 0  # requests submitted (tests, benchmark)
        self.steps = 0  # batch steps run
        self.row_steps = 0  # sum of rows over steps: row_steps / steps = mean batch size
        self.max_rows = 0  # largest batch seen

    @staticmethod
    def supports(model: Any) -> bool:
        """Whether every layer of the model's cache is a plain full-attention ``DynamicLayer``."""
        cache = DynamicCache(config=model.config)
        return bool(cache.layers) and all(type(layer) is DynamicLayer for layer in cache.layers)

    @classmethod
    def attach(cls, generator: Any, max_batch: int = 8) -> BatchedDecoder | None:
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
            if self._closed:
                raise RuntimeError("the batched decoder is closed")
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="rag-batch", daemon=True)
                self._thread.start()
            self._waiting.append(req)
            self.requests += 1
            self._cv.notify()
        return req

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
                while not (self._closed or self._waiting or self._rows):
                    self._cv.wait()
                if self._closed:
                    break
                for req in [r for r in self._waiting if r.cancelled]:
                    self._waiting.remove(req)
                    self._finish(req)
                joining = []
                while self._waiting and len(self._rows) + len(joining) < self.max_batch:
                    joining.append(self._waiting.popleft())
            try:
                with self.lock, torch.inference_mode():
                    for req in joining:
                        self._admit(req)
                    self._leave([i for i, r in enumerate(self._rows) if not r.cancelled])
                    if self._rows:
                        self._step()
            except BaseException as e:  # a failed step fails every row in the batch
                log.exception("batched decoding step failed")
                for req in self._rows:
                    self._finish(req, e)
                self._rows, self._cache, self._width = [], None, 0
        error = RuntimeError("the batched decoder was closed")
        for req in [*self._waiting, *self._rows]:
            self._finish(req, error)

    def _admit(self, req: BatchRequest) -> None:
        """Prefill ``req`` alone, take its first token and merge it into the batch."""
        try:
            if req.cancelled or req.max_new <= 0:
                self._finish(req)
                return
            if req.streamer is not None:
                req.streamer.put(req.input_ids.cpu())
            cache = req.cache if req.cache is not None else DynamicCache(config=self.model.config)
            start, n = cache.get_seq_length(), req.prompt_len
            if start >= n:
                raise ValueError("the cached prefix covers the whole prompt")
            kw: dict[str, Any] = {
                "input_ids": req.input_ids[:, start:].to(self.device),  # [1, n - start]
                "attention_mask": torch.ones(1, n, dtype=torch.long, device=self.device),
                "position_ids": torch.arange(start, n, device=self.device)[None, :],
                "cache": cache,
                "use_cache": True,
            }
            if self._keep_logits:
                kw["logits_to_keep"] = 1
            out = self.model(**kw)
            req.cache = None
            cache = out["cache"] if "cache" in out else out["past_key_values"]
            logits = out["logits"][:, -1, :].float()  # [1, V]
            if self._advance(req, req.choose(logits, int(logits.argmax(dim=-1)[0]))):
                self._finish(req)
            else:
                self._merge(req, cache)
        except Exception as e:
            self._finish(req, e)

    def _merge(self, req: BatchRequest, cache: Any) -> None:
        """Add ``req``'s prefilled cache [1, H, n, D] as a row, left-padding the shorter side."""
        n = req.size - 1
        if not self._rows:
            self._cache, self._width = cache, n
        else:
            width = max(self._width, n)
            grow = width - self._width
            for mine, theirs in zip(self._cache.layers, cache.layers, strict=True):
                # [B, H, width, D] + [1, H, width, D] -> [B + 1, H, width, D]
                mine.keys = torch.cat(
                    [_pad_left(mine.keys, grow), _pad_left(theirs.keys, width - n)]
                )
                mine.values = torch.cat(
                    [_pad_left(mine.values, grow), _pad_left(theirs.values, width - n)]
                )
            self._width = width
        self._rows.append(req)

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
                self._finish(req)
            else:
                keep.append(b)
        self._leave(keep)

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
