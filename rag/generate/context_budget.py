"""Which retrieved passages fit the decoder's context window, for
:meth:`rag.generate.generator.Generator.fit_passages`.

Budget = the model's positions − ``max_new_tokens`` − the prompt without passages. Passages are
taken best-first, so the lowest-ranked are the ones trimmed or dropped; a passage that would be
cut to fewer than :data:`MIN_TRIMMED_PASSAGE_TOKENS` tokens is dropped instead. It lives apart
from the generator because it only needs the tokenizer and the prompt builder, not decoding.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rag.defaults import DEFAULT_MAX_NEW_TOKENS

MIN_TRIMMED_PASSAGE_TOKENS = 32  # a passage cut shorter than this is dropped instead


class QuestionTooLongError(ValueError):
    """The question alone does not fit the decoder's context (rag.serve answers it with a 400)."""


def space_left(generator: Any, bare: Sequence[dict[str, str]], max_new_tokens: int) -> int:
    """Tokens left for passages (or excerpts) beside the prompt ``bare`` (the prompt without
    any) and ``max_new_tokens``; :class:`QuestionTooLongError` when the question alone does not
    fit."""
    budget = generator.max_positions - max_new_tokens
    overhead = len(generator.prompt_ids(bare)[0])
    if overhead > budget:
        raise QuestionTooLongError(
            f"the question alone takes {overhead} tokens, over the budget of {budget} "
            f"({generator.max_positions} positions - {max_new_tokens} new tokens)"
        )
    return budget - overhead


def fit_passages(
    generator: Any,
    question: str,
    passages: Sequence[str],
    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS,
) -> list[str]:
    """The passages (in rank order) that fit ``generator``'s context budget, the last one maybe
    trimmed; :class:`QuestionTooLongError` when the question alone does not fit."""
    budget = generator.max_positions - max_new_tokens
    left = space_left(generator, generator.messages(question, []), max_new_tokens)
    kept: list[str] = []
    for i, text in enumerate(passages, start=1):
        text = " ".join(text.split())
        cost = generator.count_tokens(f"[{i}] {text}\n\n") + 1
        if cost <= left:
            kept.append(text)
            left -= cost
            continue
        room = left - generator.count_tokens(f"[{i}] \n\n") - 2
        if room >= MIN_TRIMMED_PASSAGE_TOKENS:
            kept.append(truncate(generator.tokenizer, text, room))
        break
    # Token counts of pieces are not exactly additive: check the real prompt and shrink.
    while kept and len(generator.prompt_ids(generator.messages(question, kept))[0]) > budget:
        last = kept.pop()
        room = generator.count_tokens(last) - 16
        if room >= MIN_TRIMMED_PASSAGE_TOKENS:
            kept.append(truncate(generator.tokenizer, last, room))
    return kept


def truncate(tokenizer: Any, text: str, n_tokens: int) -> str:
    """``text`` cut to its first ``n_tokens`` tokens, with an ellipsis saying so."""
    ids = tokenizer(text, add_special_tokens=False)["input_ids"][:n_tokens]
    return tokenizer.decode(ids, skip_special_tokens=True).strip() + " …"
