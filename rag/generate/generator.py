"""Answer generation: a causal LM with the KV cache on, a reusable prefix cache and streaming.

Decoding itself is ``transformers``' ``model.generate`` (greedy or nucleus sampling, stop strings,
KV cache), with :mod:`rag.generate.stopping`'s loop guard and stop rules; what is ours here is the *prefix
cache*. Every grounded prompt starts with the same system turn
(:data:`rag.answer.prompt.SYSTEM_PROMPT` rendered through the chat template), so its keys and values are
computed once per generator and a deep copy of that ``DynamicCache`` is handed to ``generate`` for
each question, which then only encodes the passages and the question. To make the reuse exact,
a prompt's token ids are built as ``ids(prefix) + ids(rest)``, so the same ids are decoded with
or without the cache (a test checks the greedy outputs are equal).

Works for any ``AutoModelForCausalLM`` folder: ``smollm2`` (Llama) and our from-scratch
``ModernBertDecoderForCausalLM``. A tokenizer without a chat template gets a plain ChatML one.
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

from rag.generate import scoring
from rag.generate.batch_prefill import DEFAULT_MAX_PREFILL_TOKENS
from rag.generate.batch_request import eos_ids
from rag.generate.batching import BatchedDecoder
from rag.generate.chat import DEFAULT_STOP, FALLBACK_CHAT_TEMPLATE, ChatDecoder, DecodeOptions
from rag.generate.kv_append import appending
from rag.generate.prompt_cache import PromptCache
from rag.generate.speed import DecodeSpeed
from rag.generate.stopping import DecodingRules
from rag.generate.streaming import Cancel, TokenQueue

__all__ = ["DEFAULT_STOP", "FALLBACK_CHAT_TEMPLATE", "Generator"]
_MAX_PREFIXES = 4  # distinct system prompts whose KV cache is kept


class Generator(ChatDecoder):
    """A causal LM + tokenizer that answers chat messages on torch, with the KV and prefix caches.

    One instance is shared by every request (the UI's sessions included): decoding runs under a
    lock, so concurrent callers queue instead of fighting for the same CPU cores, or, opt-in
    (``batching=True``), share the steps of one :class:`rag.generate.batching.BatchedDecoder`.
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        device: str = "cpu",
        *,
        prefix_cache: bool = True,
        max_context_tokens: int | None = None,
        profile: str = "plain",
        rules: DecodingRules | None = None,
        batching: bool = False,
        max_batch: int = 8,
        max_prefill_tokens: int = DEFAULT_MAX_PREFILL_TOKENS,
        refusal_threshold: float | None = None,
        speed: DecodeSpeed | None = None,
        prompt_cache_mb: int = 0,
    ) -> None:
        super().__init__(
            tokenizer,
            profile=profile,
            max_context_tokens=max_context_tokens,
            rules=rules,
            refusal_threshold=refusal_threshold,
        )
        # decoder speed options (rag.generate.speed); the model comes with them already applied
        self.speed = speed or DecodeSpeed()
        self.speed.check(batching=batching)
        self.model = model
        self.device = device
        self.prefix_cache = prefix_cache
        self._prefixes: dict[tuple[int, ...], Any] = {}
        self._prefix_lock = threading.Lock()
        self._decode_lock = threading.Lock()
        # keys and values of recent prompts, reused by their longest shared token prefix
        # (rag.generate.prompt_cache); None when off or the model's cache cannot be cut
        self.prompts = (
            PromptCache(model.config, prompt_cache_mb * 2**20)
            if prompt_cache_mb > 0 and PromptCache.supports(model)
            else None
        )
        self.batcher = (
            BatchedDecoder.attach(self, max_batch, max_prefill_tokens) if batching else None
        )

    @classmethod
    def load(
        cls,
        name: str | Path = "smollm2",
        adapter: str | Path | None = None,
        device: str = "auto",
        *,
        precision: str = "auto",
        profile: str = "auto",
        speed: DecodeSpeed | None = None,
        **kwargs: Any,
    ) -> Generator:
        """Load an alias/folder (plus optional LoRA adapter) via :func:`rag.generate.torch_load.load_generator`;
        ``profile="auto"`` picks the prompt profile for the model (:func:`rag.models.pick_profile`);
        ``precision`` (:mod:`rag.models.precision`): ``auto`` = bf16 where the hardware has bf16 units
        (the pipeline's default), ``int8`` = int8 decode steps over those weights;
        ``speed``: int8 / compile / static cache (:mod:`rag.generate.speed`, off by default)."""
        from rag.generate.torch_load import load_generator
        from rag.models import pick_device, pick_profile, pick_refusal_threshold, resolve_adapter

        dev = pick_device(device)
        adapter = resolve_adapter(name, adapter)
        speed = (speed or DecodeSpeed()).with_precision(precision)
        speed.check(batching=kwargs.get("batching", False))  # before minutes of loading
        model, tokenizer = load_generator(name, adapter, dev, precision, speed)
        profile = pick_profile(name, adapter) if profile == "auto" else profile
        kwargs.update(profile=profile, refusal_threshold=pick_refusal_threshold(adapter))
        return cls(model, tokenizer, dev, speed=speed, **kwargs)

    def model_positions(self) -> int | None:
        return getattr(getattr(self.model, "config", None), "max_position_embeddings", None)

    # ---- caches --------------------------------------------------------------------------------

    def _prefix_cache_for(self, prefix: Sequence[int]) -> Any:
        """A private deep copy of the KV cache for ``prefix`` (computed once, then reused)."""
        key = tuple(prefix)
        with self._prefix_lock:
            cache = self._prefixes.get(key)
            if cache is None:
                from transformers import DynamicCache

                ids = torch.tensor([key], device=self.device)
                with torch.inference_mode():
                    out = self.model(
                        input_ids=ids, cache=DynamicCache(config=self.model.config), use_cache=True
                    )
                cache = out["cache"] if "cache" in out else out["past_key_values"]
                if len(self._prefixes) >= _MAX_PREFIXES:
                    self._prefixes.pop(next(iter(self._prefixes)))
                self._prefixes[key] = cache
            return copy.deepcopy(cache)

    def clear_prefix_cache(self) -> None:
        """Forget the cached system prefixes and the prompt cache."""
        with self._prefix_lock:
            self._prefixes.clear()
        if self.prompts is not None:
            self.prompts.clear()

    def _start_cache(self, ids: Sequence[int], prefix_len: int) -> Any:
        """The cache a prompt's prefill starts from: the stored prompt sharing the most ids with
        it (:mod:`rag.generate.prompt_cache`) when that beats the system prefix, else the
        system prefix's, else (prompt cache on) an empty one the prompt's keys and values are
        kept from, else None."""
        system = prefix_len if 0 < prefix_len < len(ids) else 0
        if self.prompts is not None:
            cache, _ = self.prompts.lookup(ids, at_least=system)
            if cache is not None:
                return cache
        if system:
            return self._prefix_cache_for(ids[:prefix_len])
        if self.prompts is not None:
            from transformers import DynamicCache

            return DynamicCache(config=self.model.config)
        return None

    def _remember(self, ids: Sequence[int], cache: Any) -> None:
        """Keep the keys and values of ``ids`` (prompt + answer, as ``generate`` returned them)
        that ``cache`` holds (the decode cache after an unbatched ``generate``: all but the last
        id) in the prompt cache: the prompt for a later request sharing it, and the answer for
        the citation scores asked right after it (:mod:`rag.generate.scoring`)."""
        from transformers import DynamicCache

        if self.prompts is None or type(cache) is not DynamicCache:
            return
        n = min(len(ids), int(cache.get_seq_length()))
        if n:
            self.prompts.store(ids[:n], [(layer.keys, layer.values) for layer in cache.layers])

    # ---- decoding ------------------------------------------------------------------------------

    def _generate_kwargs(
        self, ids: list[int], prefix_len: int, options: DecodeOptions
    ) -> dict[str, Any]:
        """The ``model.generate`` keywords that decode the prompt ``ids`` with ``options``."""
        input_ids = torch.tensor([ids], device=self.device)
        kw: dict[str, Any] = {
            "input_ids": input_ids,
            "attention_mask": torch.ones_like(input_ids),
            "max_new_tokens": options.max_new_tokens,
            "use_cache": options.use_cache,
            "pad_token_id": self.tokenizer.pad_token_id,
        }
        if options.min_new_tokens:
            kw["min_new_tokens"] = options.min_new_tokens
        if options.temperature > 0:
            kw.update(do_sample=True, temperature=options.temperature, top_p=options.top_p, top_k=0)
        else:
            kw.update(do_sample=False, temperature=None, top_p=None, top_k=None)
        kw.update(self.rules.generate_kwargs(len(ids), options.stop, self.tokenizer))
        if options.ban:
            kw["bad_words_ids"] = [list(b) for b in options.ban]
        use_cache = options.use_cache
        use_prefix = (
            self.prefix_cache if options.use_prefix_cache is None else options.use_prefix_cache
        )
        cache = None
        if use_cache and options.prompt_cache is not None:
            cache = options.prompt_cache  # e.g. scoring.refusal_logprob's, all ids but the last
        elif use_cache and use_prefix:
            cache = self._start_cache(ids, prefix_len)
        if use_cache:  # the dynamic cache as is, or a static one holding it (rag.generate.speed)
            total = len(ids) + options.max_new_tokens
            kw.update(self.speed.generate_kwargs(self.model, cache, total))
        return kw

    def _run_generate(self, kw: dict[str, Any], streamer: Any) -> torch.Tensor:
        """``model.generate`` under the decode lock, or a row of the batched decoder when on."""
        if self.batcher is not None and kw["use_cache"]:
            return self.batcher.generate(**kw, streamer=streamer)  # it keeps prompt + answer KV
        if kw.get("cache") is not None:  # steps append in place, not by torch.cat (kv_append)
            appending(kw["cache"])
        with self._decode_lock, torch.inference_mode():
            out = self.model.generate(**kw, streamer=streamer)
        if "cache" in kw:  # the cache now holds prompt + answer but its last id
            self._remember(out[0].tolist(), kw["cache"])
        return out

    def _start(self, ids: list[int], prefix_len: int, options: DecodeOptions) -> _Run:
        return _Run(self, self._generate_kwargs(ids, prefix_len, options))

    def stop_ids(self) -> set[int]:
        return set(eos_ids(self.model))

    def score_continuations(
        self, messages: Sequence[dict[str, str]], answer: str, continuations: Sequence[str]
    ) -> list[float]:
        """Log-probability of each continuation after the prompt and the assistant's ``answer``
        (:func:`rag.generate.scoring.score_continuations`): which passage marker it would write next."""
        return scoring.score_continuations(self, messages, answer, continuations)

    def refusal_logprob(self, messages: Sequence[dict[str, str]]) -> tuple[float, Any]:
        """log p(REFUSAL | prompt) and a KV cache to decode the answer from
        (:func:`rag.generate.scoring.refusal_logprob`; the refusal gate of :mod:`rag.answer.refusal`)."""
        return scoring.refusal_logprob(self, messages)


class _Run:
    """One ``model.generate`` (or batched-decoder row) on a worker thread: the torch engine's
    :class:`rag.generate.chat.Decoding`. Its new ids arrive through a :class:`TokenQueue`;
    :meth:`close` sets the :class:`Cancel` criterion and waits for the thread; an error in
    decoding ends the chunks and waits in :attr:`error`."""

    def __init__(self, gen: Generator, kw: dict[str, Any]) -> None:
        self.queue, self.cancel = TokenQueue(), Cancel()
        kw["stopping_criteria"].append(self.cancel)
        self.cached: int | None = int(kw["cache"].get_seq_length()) if "cache" in kw else 0
        self.error: BaseException | None = None
        self._thread = threading.Thread(
            target=self._work, args=(gen, kw), name="rag-generate", daemon=True
        )
        self._thread.start()

    def _work(self, gen: Generator, kw: dict[str, Any]) -> None:
        try:
            gen._run_generate(kw, self.queue)
        except BaseException as e:  # surfaced in the consumer's thread (error)
            self.error = e
            self.queue.end()

    def __iter__(self) -> Iterator[list[int]]:
        return iter(self.queue)

    @property
    def ids(self) -> list[int]:
        """Every new id decoded (read once iteration has ended)."""
        return self.queue.ids

    def close(self) -> None:
        self.cancel.event.set()
        self._thread.join()
