"""The refusal gate: refuse only when the decoder is sure the passages hold no answer.

A LoRA-tuned decoder learns to write :data:`rag.answer.prompt.REFUSAL` when no passage answers, but
greedy decoding turns any refusal that is the single likeliest opening into a refusal, however
unsure the model is. Measured on SQuAD (docs/answering.md), the adapter refused a third of the
questions it could answer, and where it did answer it was right far more often than the
zero-shot model. The gate separates the two decisions:

1. score log p(REFUSAL | prompt) by teacher forcing (:func:`rag.generate.scoring.refusal_logprob`, one
   forward pass whose KV cache the answer then reuses);
2. refuse when p >= ``threshold``; otherwise decode the answer with the refusal's opening
   barred (``bad_words_ids``), so the model gives its best answer instead.

The threshold is tuned on SQuAD *train* articles (``python -m evals.refusal_sweep``) and never
on the questions it is reported on. Off (``None``) the model's greedy choice stands.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from rag.generate.scoring import refusal_ids

BARRED_PREFIX_TOKENS = 2  # "The documents": long enough to spare answers that start with "The"


@dataclass
class RefusalDecision:
    """What the gate decided for one prompt."""

    probability: float  # p(REFUSAL | prompt), teacher-forced
    refuse: bool  # probability >= threshold: answer with the refusal, decode nothing
    # keyword arguments for Generator.generate/stream when not refusing: the prompt's KV cache
    # (all ids but the last) and the barred refusal opening
    generate_kwargs: dict[str, Any] = field(default_factory=dict)


def barred_refusal(tokenizer: Any, n_tokens: int = BARRED_PREFIX_TOKENS) -> list[list[int]]:
    """``bad_words_ids`` that stop the decoder from opening its reply with the refusal."""
    ids = refusal_ids(tokenizer)
    return [ids[: max(1, min(n_tokens, len(ids)))]]


def supports_gate(generator: Any) -> bool:
    """Whether ``generator`` can score the refusal (a real decoder; test fakes need not)."""
    return hasattr(generator, "refusal_logprob") and hasattr(generator, "tokenizer")


def decide(generator: Any, messages: Sequence[dict[str, str]], threshold: float) -> RefusalDecision:
    """Score the refusal for ``messages`` and decide; see the module docstring."""
    if not 0 < threshold <= 1:
        raise ValueError(f"refusal threshold must be in (0, 1], not {threshold}")
    logp, cache = generator.refusal_logprob(messages)
    p = math.exp(logp)
    if p >= threshold:
        return RefusalDecision(p, True)
    kwargs = {"prompt_cache": cache, "ban": barred_refusal(generator.tokenizer)}
    return RefusalDecision(p, False, kwargs)
