"""The decoder on OpenVINO GenAI: the maintained inference engine the answer path runs on CPUs.

What the engine does for us, and so what is not written here: continuous batching of concurrent
requests (one scheduler step serves every running answer), prefix caching (the keys and values
of a prompt another request already read are reused block by block), a paged KV cache in u8, and
the int4/int8 weight kernels for each CPU kind (AMX, AVX512, AVX2), reading the pinned GGUF
files directly (:func:`rag.gguf.package_engine_path`). The torch engine
(:class:`rag.generate.generator.Generator`) stays where training and scoring need gradients or
logits; docs/answering.md measures the two side by side.

What is ours: the prompt (:class:`rag.generate.chat.ChatDecoder`, the same token ids as torch),
the stop rules and the loop guard (:mod:`rag.generate.stopping`), streaming text that never has
to be taken back (:func:`rag.generate.streaming.stream_tokens`), and one worker thread that
steps the engine while any request runs (``ContinuousBatchingPipeline.step`` releases the GIL,
so HTTP handlers and the retriever keep running beside it).

What the engine does not offer: the log-probability of a given continuation (citation scores,
the refusal gate of :mod:`rag.answer.refusal`) and LoRA adapters trained by ``training.lora``
on the dequantised weights. A decoder with an adapter runs on torch (``engine = "auto"`` picks
it, :func:`rag.generate.engines.choose_engine`); an answer with no citation of its own is attributed by the passages'
support of its words (:func:`rag.answer.verify.attribute`), not by decoder likelihoods.
"""

from __future__ import annotations

import itertools
import queue
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from rag.defaults import DEFAULT_MAX_NEW_TOKENS
from rag.generate.chat import DEFAULT_STOP, ChatDecoder
from rag.generate.engines import EngineUnavailable, engine_gguf, engine_reason
from rag.generate.stopping import DecodingRules, loop_cut
from rag.generate.streaming import stream_tokens


def _running(handle: Any) -> bool:
    """Whether the engine is still decoding the request behind ``handle``."""
    return handle.get_status().name == "RUNNING"


class _Request:
    """One request in the engine: its handle and the queue its new token ids arrive on."""

    def __init__(self, handle: Any) -> None:
        self.handle = handle
        self.chunks: queue.Queue[list[int] | BaseException | None] = queue.Queue()
        self.ids: list[int] = []  # every id read so far (the worker's side)

    def __iter__(self) -> Iterator[list[int]]:
        while True:
            item = self.chunks.get()
            if item is None:
                return
            if isinstance(item, BaseException):
                raise item
            yield item


class _Stepper:
    """The one thread that steps the engine while requests run and hands their ids out.

    Requests are added from any thread (the engine queues them under its own lock); only this
    thread calls ``step`` and reads the handles. With ``serial`` (batching off) one request runs
    at a time, the others wait their turn in arrival order.
    """

    def __init__(self, pipe: Any, serial: bool) -> None:
        self.pipe = pipe
        self._ids = itertools.count()
        self._active: dict[int, _Request] = {}
        self._cond = threading.Condition()
        self._turn = threading.Semaphore(1) if serial else None
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="rag-ov-engine", daemon=True)
        self._thread.start()

    def submit(self, ids: Sequence[int], config: Any) -> _Request:
        import numpy as np
        import openvino as ov

        if self._turn is not None:
            self._turn.acquire()
        tensor = ov.Tensor(np.asarray([list(ids)], dtype=np.int64))
        with self._cond:
            if self._closed:
                raise RuntimeError("the decoder was closed")
            rid = next(self._ids)
            req = _Request(self.pipe.add_request(rid, tensor, config))
            self._active[rid] = req
            self._cond.notify()
        return req

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._active and not self._closed:
                    self._cond.wait()
                if self._closed:
                    return
            try:
                self.pipe.step()
            except BaseException as e:  # every running request learns it
                with self._cond:
                    done, self._active = list(self._active.values()), {}
                for req in done:
                    req.chunks.put(e)
                    self._release()
                continue
            with self._cond:
                items = list(self._active.items())
            for rid, req in items:
                handle = req.handle
                if handle.can_read():
                    for out in handle.read().values():
                        new = list(out.generated_ids)
                        if new:
                            req.ids.extend(new)
                            req.chunks.put(new)
                if not _running(handle) and not handle.can_read():
                    with self._cond:
                        self._active.pop(rid, None)
                    req.chunks.put(None)
                    self._release()

    def _release(self) -> None:
        if self._turn is not None:
            self._turn.release()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            for req in self._active.values():
                req.handle.cancel()
                req.chunks.put(None)
            self._active.clear()
            self._cond.notify_all()
        self._thread.join(timeout=30)


class OpenVINOGenerator(ChatDecoder):
    """A GGUF decoder on OpenVINO GenAI's continuous-batching pipeline, with the interface of
    :class:`rag.generate.generator.Generator` that answering uses (``generate``, ``stream``,
    ``generate_ids``, the prompt side). One instance serves every request; concurrent requests
    are batched by the engine (``batching=False``: one at a time)."""

    def __init__(
        self,
        pipe: Any,
        tokenizer: Any,
        *,
        max_positions: int | None = None,
        batching: bool = True,
        profile: str = "plain",
        max_context_tokens: int | None = None,
        rules: DecodingRules | None = None,
    ) -> None:
        super().__init__(
            tokenizer, profile=profile, max_context_tokens=max_context_tokens, rules=rules
        )
        self.pipe = pipe
        self._positions = max_positions
        self._stepper = _Stepper(pipe, serial=not batching)
        self.batcher = None  # the torch batcher's slot (benchmarks read it): the engine batches
        self._eos = self._eos_ids()

    @classmethod
    def load(
        cls,
        name: str | Path = "smollm2",
        device: str = "auto",
        *,
        profile: str = "auto",
        prompt_cache_mb: int = 512,
        batching: bool = True,
        max_batch: int = 16,
        max_prefill_tokens: int = 4096,
        max_context_tokens: int | None = None,
        rules: DecodingRules | None = None,
    ) -> OpenVINOGenerator:
        """The engine folder of ``name`` (:func:`engine_gguf`: built once from the pinned GGUF
        parts, sha256-checked) on the CPU. The scheduler holds ``max_batch`` sequences, prefills
        at most ``max_prefill_tokens`` tokens per step, and keeps a KV cache of the running
        answers plus ``prompt_cache_mb`` for prefix caching (0 = no prefix caching)."""
        import json

        import openvino_genai as og
        from transformers import AutoTokenizer

        from rag.loading import MODEL_LOAD_LOCK
        from rag.models import pick_profile

        reason = engine_reason(name, None, "cuda" if device == "cuda" else "cpu")
        if reason:
            raise EngineUnavailable(reason)
        folder = engine_gguf(name)
        run = json.loads((folder / "run.json").read_text())
        sched = og.SchedulerConfig()
        sched.enable_prefix_caching = prompt_cache_mb > 0
        sched.max_num_seqs = max_batch if batching else 1
        sched.max_num_batched_tokens = max_prefill_tokens
        # running answers (~3k tokens each at most) plus the prompts kept for reuse; the engine
        # allocates blocks on demand up to this size
        sched.cache_size = max(1, round((prompt_cache_mb + 256 * sched.max_num_seqs) / 1024))
        with MODEL_LOAD_LOCK:
            tokenizer = AutoTokenizer.from_pretrained(folder)
            pipe = og.ContinuousBatchingPipeline(str(folder / "model.gguf"), sched, "CPU")
        return cls(
            pipe,
            tokenizer,
            max_positions=run.get("max_positions"),
            batching=batching,
            profile=pick_profile(name) if profile == "auto" else profile,
            max_context_tokens=max_context_tokens,
            rules=rules,
        )

    def model_positions(self) -> int | None:
        return self._positions

    def _eos_ids(self) -> set[int]:
        tok = self.tokenizer
        ids = {tok.eos_token_id} if tok.eos_token_id is not None else set()
        for special in ("<|im_end|>", "<|endoftext|>", "<|eot_id|>"):
            i = tok.convert_tokens_to_ids(special)
            if isinstance(i, int) and i != tok.unk_token_id and i >= 0:
                ids.add(i)
        return ids

    def _config(
        self,
        max_new_tokens: int,
        temperature: float,
        top_p: float,
        stop: Sequence[str] | None,
    ) -> Any:
        import openvino_genai as og

        cfg = og.GenerationConfig()
        cfg.max_new_tokens = max_new_tokens
        cfg.apply_chat_template = False
        cfg.stop_token_ids = set(self._eos)
        if stops := self.rules.stops(stop):
            cfg.stop_strings = set(stops)
            cfg.include_stop_str_in_output = True  # cut here (cut_at_stop), as on torch
        if self.rules.repetition_penalty != 1.0:
            cfg.repetition_penalty = self.rules.repetition_penalty
        if self.rules.no_repeat_ngram_size:
            cfg.no_repeat_ngram_size = self.rules.no_repeat_ngram_size
        if temperature > 0:
            cfg.do_sample, cfg.temperature, cfg.top_p = True, temperature, top_p
        else:
            cfg.do_sample = False
        return cfg

    def _chunks(self, req: _Request) -> Iterator[list[int]]:
        """The request's new ids as they come; stops the request when the loop guard fires and
        cancels it when the consumer goes away (a closed stream, a stop string already met)."""
        seen: list[int] = []
        try:
            for chunk in req:
                seen.extend(chunk)
                yield chunk
                if self.rules.loop_guard and loop_cut(seen, self.rules) is not None:
                    req.handle.stop()
        finally:
            if _running(req.handle):
                req.handle.cancel()

    def generate_ids(
        self,
        ids: list[int],
        prefix_len: int = 0,
        *,
        max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS,
        temperature: float = 0.0,
        top_p: float = 1.0,
        stop: Sequence[str] | None = None,
        stats: dict[str, Any] | None = None,
        **_: Any,
    ) -> list[int]:
        """New token ids for a prompt given as ids (the engine stops at ``stop`` itself);
        ``stats`` as :meth:`rag.generate.generator.Generator.generate_ids` fills it."""
        t0 = time.perf_counter()
        req = self._stepper.submit(ids, self._config(max_new_tokens, temperature, top_p, stop))
        first = None
        for _chunk in self._chunks(req):
            first = first or time.perf_counter()
        self._stats(stats, ids, req, t0, max_new_tokens, stop)
        if stats is not None:
            stats["ttft_s"] = (first or time.perf_counter()) - t0
        return list(req.ids)

    def _stats(
        self,
        stats: dict[str, Any] | None,
        ids: Sequence[int],
        req: _Request,
        t0: float,
        max_new_tokens: int,
        stop: Sequence[str] | None,
    ) -> None:
        """Fill ``stats`` as the torch engine does (the engine keeps no per-request count of
        reused prompt ids, so no ``cached_prefix_tokens``; ``ttft_s`` is the caller's)."""
        if stats is not None:
            stats.update(
                prompt_tokens=len(ids),
                new_tokens=len(req.ids),
                total_s=time.perf_counter() - t0,
                finish_reason=self.finish_reason(req.ids, max_new_tokens, stop),
            )

    def stop_ids(self) -> set[int]:
        return self._eos

    def generate(
        self,
        messages: Sequence[dict[str, str]],
        max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS,
        temperature: float = 0.0,
        top_p: float = 1.0,
        stop: Sequence[str] | None = DEFAULT_STOP,
        *,
        stats: dict[str, Any] | None = None,
        continuation: str = "",
        **_: Any,
    ) -> str:
        """The assistant's reply to chat ``messages``, cut at the first stop string and trimmed
        to one copy of a loop: what the torch engine's ``generate`` returns for the same ids."""
        ids, prefix_len = self.prompt_ids(messages, continuation)
        new = self.generate_ids(
            ids,
            prefix_len,
            max_new_tokens=max_new_tokens,
            temperature=temperature,
            top_p=top_p,
            stop=stop,
            stats=stats,
        )
        return self.reply_text(new, stop)

    def stream(
        self,
        messages: Sequence[dict[str, str]],
        max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS,
        temperature: float = 0.0,
        top_p: float = 1.0,
        stop: Sequence[str] | None = DEFAULT_STOP,
        *,
        stats: dict[str, Any] | None = None,
        continuation: str = "",
        **_: Any,
    ) -> Iterator[str]:
        """Text deltas of the reply as they are decoded; joined they equal :meth:`generate`.
        Closing the iterator early cancels the request in the engine."""
        t0 = time.perf_counter()
        ids, _prefix = self.prompt_ids(messages, continuation)
        req = self._stepper.submit(ids, self._config(max_new_tokens, temperature, top_p, stop))
        chunks = self._chunks(req)
        stops = self.rules.stops(stop)
        try:
            yield from stream_tokens(chunks, self.decode, stops, t0, stats, self.rules)
        finally:
            chunks.close()  # a stop string ended the text, or the consumer left: cancel the rest
        self._stats(stats, ids, req, t0, max_new_tokens, stop)

    def close(self) -> None:
        """Cancel running requests and stop the worker thread."""
        self._stepper.close()
