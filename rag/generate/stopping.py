"""Decoding rules for :class:`rag.generate.generator.Generator`: stop strings and a loop guard.

Small models (SmolLM2-135M, Qwen2.5-0.5B) sometimes fall into a loop and repeat one phrase until
the token limit. ``transformers`` offers two knobs against that, and neither serves a grounded
answer well:

- ``repetition_penalty`` divides the logit of *every* token already seen, prompt included, so it
  also penalises the tokens an answer must repeat: names, numbers and terms copied from the
  passages, and the citation markers;
- ``no_repeat_ngram_size`` forbids any n-gram from occurring twice, which breaks legitimate
  repeats ("line by line", a list of similar items) and still lets the model loop on a phrase
  whose n-grams it varies slightly.

Both stay available in :class:`DecodingRules` (off by default). What is ours is the *loop guard*:
:class:`LoopGuard` stops a sequence only when its generated tail is several back-to-back copies of
the same token block, which legitimate text almost never is, and :func:`trim_repetition` then cuts
the answer back to the end of the first copy, so the user sees the phrase once. Streaming holds
back only the tokens such a trim could still remove (:func:`settled_length`), so a stream joins to
exactly the text ``generate`` returns.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
from transformers import StoppingCriteria, StoppingCriteriaList

T = TypeVar("T")

# Text that means the model has finished its turn or started writing the prompt's structure
# (a new chat turn, or the ``Passages:``/``Question:`` labels of rag.answer.prompt.user_message).
DEFAULT_STOP_STRINGS: tuple[str, ...] = (
    "<|im_end|>",
    "<|endoftext|>",
    "<|im_start|>",
    "\nQuestion:",
    "\nPassages:",
)


@dataclass(frozen=True)
class DecodingRules:
    """How :class:`rag.generate.generator.Generator` keeps decoding from looping or running on."""

    repetition_penalty: float = 1.0
    """``transformers``' penalty on every token already seen (1.0 = off). Off by default: it also
    penalises names and numbers that a grounded answer must copy from the passages. Always passed
    explicitly, so a model's ``generation_config`` (Qwen2.5-Instruct's says 1.1) cannot turn it
    on unseen."""

    no_repeat_ngram_size: int = 0
    """``transformers``' ban on any n-gram occurring twice (0 = off). Off by default: it breaks
    legitimate repeats such as "line by line" or a list of similar items."""

    loop_min_period: int = 1
    """Shortest repeated block (tokens) the loop guard looks for; 1 catches "\\n\\n\\n..."."""

    loop_max_period: int = 32
    """Longest repeated block (tokens) the loop guard looks for: about one long sentence."""

    loop_max_repeats: int = 3
    """Back-to-back copies of a block that count as a loop (0 turns the guard off). A phrase said
    twice in a row can be emphasis; three times in a row it is a small model's loop."""

    loop_min_tokens: int = 16
    """Fewest tokens a loop must span, so short blocks need more copies (a 1-token block needs 16,
    a 4-token one 4): "very very very" or "0, 0, 0" in code is not cut, "!!!!!..." is."""

    stop_strings: tuple[str, ...] = DEFAULT_STOP_STRINGS
    """Stop strings added to the caller's ``stop`` (and the model's eos): the model ending its
    turn or hallucinating the prompt's structure. The text from the first one on is dropped."""

    def __post_init__(self) -> None:
        if not 1 <= self.loop_min_period <= self.loop_max_period:
            raise ValueError("need 1 <= loop_min_period <= loop_max_period")
        if self.loop_max_repeats == 1 or self.loop_max_repeats < 0:
            raise ValueError("loop_max_repeats must be 0 (off) or at least 2")
        if self.repetition_penalty <= 0 or self.no_repeat_ngram_size < 0:
            raise ValueError("repetition_penalty must be > 0 and no_repeat_ngram_size >= 0")

    @classmethod
    def off(cls) -> DecodingRules:
        """Rules that add nothing: no loop guard, no penalty, only the caller's stop strings."""
        return cls(loop_max_repeats=0, stop_strings=())

    @property
    def loop_guard(self) -> bool:
        return self.loop_max_repeats > 0

    def copies_needed(self, period: int) -> int:
        """Back-to-back copies of a ``period``-token block that make a loop."""
        return max(self.loop_max_repeats, math.ceil(self.loop_min_tokens / period))

    @property
    def loop_window(self) -> int:
        """The longest tail (tokens) the loop guard has to look at."""
        periods = range(self.loop_min_period, self.loop_max_period + 1)
        return max(p * self.copies_needed(p) for p in periods)

    def stops(self, stop: Sequence[str] | None) -> tuple[str, ...]:
        """The caller's ``stop`` strings followed by the rules' own, without duplicates."""
        return tuple(dict.fromkeys([*(stop or ()), *self.stop_strings]))

    def generate_kwargs(
        self, prompt_len: int, stop: Sequence[str] | None, tokenizer: Any
    ) -> dict[str, Any]:
        """The ``model.generate`` options these rules set for a prompt of ``prompt_len`` tokens
        and the caller's ``stop`` strings. ``stopping_criteria`` is always a (maybe empty) list,
        so a caller can append its own criteria."""
        criteria = [LoopGuard(prompt_len, self)] if self.loop_guard else []
        kw: dict[str, Any] = {
            "repetition_penalty": self.repetition_penalty,
            "no_repeat_ngram_size": self.no_repeat_ngram_size,
            "stopping_criteria": StoppingCriteriaList(criteria),
        }
        if stops := self.stops(stop):
            kw.update(stop_strings=list(stops), tokenizer=tokenizer)
        return kw


def _run_start(ids: Sequence[Any], period: int) -> int:
    """Start of the longest suffix of ``ids`` that repeats with ``period`` (``ids[i] ==
    ids[i - period]`` for every i past its first block)."""
    i = len(ids) - 1
    while i >= period and ids[i] == ids[i - period]:
        i -= 1
    return max(0, i - period + 1)


def _periods(rules: DecodingRules, n: int) -> range:
    return range(rules.loop_min_period, min(rules.loop_max_period, n - 1) + 1)


def is_looping(ids: Sequence[Any], rules: DecodingRules | None = None) -> bool:
    """Whether ``ids`` ends in a loop: ``copies_needed`` back-to-back copies of one block."""
    rules = rules or DecodingRules()
    if not rules.loop_guard:
        return False
    n = len(ids)
    for p in _periods(rules, n):
        need = p * rules.copies_needed(p)
        if need <= n and all(ids[i] == ids[i - p] for i in range(n - 1, n - need + p - 1, -1)):
            return True
    return False


def loop_cut(ids: Sequence[Any], rules: DecodingRules | None = None) -> int | None:
    """Length of ``ids`` cut back to the end of the first copy of the loop it ends in, or None
    when it ends in no loop. Of several qualifying block lengths the earliest cut wins."""
    rules = rules or DecodingRules()
    if not rules.loop_guard:
        return None
    cuts = []
    for p in _periods(rules, len(ids)):
        start = _run_start(ids, p)
        if len(ids) - start >= p * rules.copies_needed(p):
            cuts.append(start + p)
    return min(cuts, default=None)


def trim_repetition(ids: Sequence[T], rules: DecodingRules | None = None) -> list[T]:
    """``ids`` without the extra copies of the loop it ends in (unchanged when there is none).

    Pure: works on any sequence (token ids, or words in a test). Used on a reply's new tokens
    after the :class:`LoopGuard` stopped it, or after the token limit cut a loop short.
    """
    cut = loop_cut(ids, rules)
    return list(ids if cut is None else ids[:cut])


def settled_length(ids: Sequence[Any], rules: DecodingRules | None = None) -> int:
    """How many leading ``ids`` no later :func:`trim_repetition` can remove, however decoding
    goes on: everything before the second copy of any block that is repeating right now.

    A stream may send the text of these tokens; the rest waits until the repeat breaks (usually
    one token: "very very good") or turns into a loop and is trimmed.
    """
    rules = rules or DecodingRules()
    if not rules.loop_guard:
        return len(ids)
    settled = len(ids)
    for p in _periods(rules, len(ids)):
        start = _run_start(ids, p)
        if len(ids) - start > p:  # at least one token repeats the one p back
            settled = min(settled, start + p)
    return settled


class LoopGuard(StoppingCriteria):
    """Stops a sequence whose *generated* tail is a loop (see :func:`is_looping`).

    Unlike ``repetition_penalty`` and ``no_repeat_ngram_size`` it never changes which token is
    chosen, so names and figures copied from the passages, and repeated markers, are free to
    recur; it only ends true loops, and :func:`trim_repetition` cuts the extra copies.
    """

    def __init__(self, prompt_len: int, rules: DecodingRules | None = None) -> None:
        self.prompt_len = prompt_len
        self.rules = rules or DecodingRules()
        self._window = self.rules.loop_window

    def __call__(self, input_ids: torch.LongTensor, scores: Any, **kwargs: Any) -> torch.BoolTensor:
        start = max(self.prompt_len, input_ids.shape[1] - self._window)
        tails = input_ids[:, start:].tolist()
        done = [is_looping(tail, self.rules) for tail in tails]
        return torch.tensor(done, dtype=torch.bool, device=input_ids.device)
