"""One request of the batched decoder (:mod:`rag.generate.batching`): its ``model.generate``
options, its ids so far, and how it picks its next token.

Why apart: exactness lives here. The logits processors are transformers' own classes, built from
the same options and in the same order as ``generate`` builds them, and the stopping criteria are
the caller's own objects, so a row decoded in a batch picks the token it would pick alone (a
greedy answer is the same token ids batched or alone in float32; tests/test_batching.py checks
Llama and Qwen2). The batch around it (padding, positions, the shared cache) is
:mod:`rag.generate.batch_prefill`'s and :mod:`rag.generate.batching`'s.
"""

from __future__ import annotations

import inspect
import threading
from collections.abc import Callable
from typing import Any

import torch
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


class Job:
    """A call the worker runs between two steps
    (:meth:`rag.generate.batching.BatchedDecoder.call`), and its outcome."""

    def __init__(self, fn: Callable[[], Any]) -> None:
        self.fn = fn
        self.result: Any = None
        self.error: BaseException | None = None
        self.done = threading.Event()
