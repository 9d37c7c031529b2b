"""The prompt side every decoder engine shares: chat template, token ids, context budget.

Both engines (:class:`rag.generate.generator.Generator` on torch and
:class:`rag.generate.ov_engine.OpenVINOGenerator` on OpenVINO GenAI) build a prompt the same way,
with the same Hugging Face tokenizer, so a question gives both the same token ids and the only
difference between them is how those ids are decoded. What lives here is that shared part: the
grounded prompt in a profile, its rendering through the chat template, the ids split into the
cacheable system prefix and the rest, and which passages fit the context window.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rag.defaults import DEFAULT_MAX_NEW_TOKENS
from rag.generate import context_budget
from rag.generate.stopping import DecodingRules, loop_cut, trim_repetition
from rag.generate.streaming import cut_at_stop
from rag.prompt import DEFAULT_STOP, build_messages

__all__ = ["DEFAULT_STOP", "FALLBACK_CHAT_TEMPLATE", "ChatDecoder"]

# ChatML without a default system turn: used only when a tokenizer ships no chat template.
FALLBACK_CHAT_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content']"
    " + '<|im_end|>' + '\n' }}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\n' }}{% endif %}"
)


class ChatDecoder:
    """A tokenizer with a chat template and the prompt rules of one decoder; engines subclass it
    and add decoding (``generate``, ``stream``, ``generate_ids``)."""

    def __init__(
        self,
        tokenizer: Any,
        *,
        profile: str = "plain",
        max_context_tokens: int | None = None,
        rules: DecodingRules | None = None,
        refusal_threshold: float | None = None,
    ) -> None:
        self.tokenizer = tokenizer
        self.profile = profile  # prompt profile of rag.prompt.build_messages
        self.max_context_tokens = max_context_tokens
        self.rules = rules or DecodingRules()  # loop guard and stop rules (rag.generate.stopping)
        # the refusal gate threshold its adapter was tuned with (rag.answer.refusal); None = greedy
        self.refusal_threshold = refusal_threshold
        if not getattr(tokenizer, "chat_template", None):
            tokenizer.chat_template = FALLBACK_CHAT_TEMPLATE

    def model_positions(self) -> int | None:
        """The model's own longest sequence, when the engine knows it."""
        return None

    @property
    def max_positions(self) -> int:
        """Longest sequence (prompt + answer) the model accepts, capped by ``max_context_tokens``."""
        n = self.model_positions()
        if not n:
            n = getattr(self.tokenizer, "model_max_length", 0)
            n = n if 0 < n < 1_000_000 else 2048
        return min(n, self.max_context_tokens) if self.max_context_tokens else n

    def messages(self, question: str, passages: Sequence[str]) -> list[dict[str, str]]:
        """The grounded prompt in this decoder's profile (:func:`rag.prompt.build_messages`)."""
        return build_messages(question, passages, self.profile)

    def count_tokens(self, text: str) -> int:
        return len(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def _render(self, messages: Sequence[dict[str, str]], generation_prompt: bool) -> str:
        return self.tokenizer.apply_chat_template(
            list(messages), tokenize=False, add_generation_prompt=generation_prompt
        )

    def prompt_ids(
        self, messages: Sequence[dict[str, str]], continuation: str = ""
    ) -> tuple[list[int], int]:
        """Token ids of the full prompt and how many leading ids are the cacheable system prefix;
        ``continuation`` is the start of the assistant's reply, already written (its ids follow
        the prompt's: decoding goes on from it).

        The prefix is every turn before the last (the system turn and any demonstration turns)
        rendered alone; it is used only when it is a textual prefix of the full rendering (true
        for ChatML-style templates), else the prefix length is 0. Building the ids as
        ``ids(prefix) + ids(rest)`` makes them the same whether or not a cache holds the prefix.
        """
        ids, prefix = self._prompt_ids(messages)
        if continuation:
            ids += list(self.tokenizer(continuation, add_special_tokens=False)["input_ids"])
        return ids, prefix

    def _prompt_ids(self, messages: Sequence[dict[str, str]]) -> tuple[list[int], int]:
        full = self._render(messages, generation_prompt=True)
        enc = self.tokenizer
        if len(messages) > 1 and messages[0].get("role") == "system":
            prefix = self._render(messages[:-1], generation_prompt=False)
            if full.startswith(prefix) and len(prefix) < len(full):
                head = enc(prefix, add_special_tokens=False)["input_ids"]
                tail = enc(full[len(prefix) :], add_special_tokens=False)["input_ids"]
                return list(head) + list(tail), len(head)
        return list(enc(full, add_special_tokens=False)["input_ids"]), 0

    def fit_passages(
        self, question: str, passages: Sequence[str], max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS
    ) -> list[str]:
        """The passages (in rank order) that fit the context budget, the last one maybe trimmed
        (:func:`rag.generate.context_budget.fit_passages`)."""
        return context_budget.fit_passages(self, question, passages, max_new_tokens)

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)

    def stop_ids(self) -> set[int]:
        """The ids that end a reply (the model's end-of-turn tokens)."""
        return set()

    def reply_text(self, new: Sequence[int], stop: Sequence[str] | None) -> str:
        """The reply the new ids ``new`` spell: trimmed to one copy of a loop, cut at the first
        stop string (``stop`` + :attr:`rules`' own), stripped; what ``generate`` returns."""
        text = self.decode(trim_repetition(list(new), self.rules))
        return cut_at_stop(text, self.rules.stops(stop))[0].strip()

    def finish_reason(
        self, new: Sequence[int], max_new_tokens: int, stop: Sequence[str] | None = None
    ) -> str:
        """Why decoding the new ids ``new`` ended, in OpenAI's words: ``"length"`` when it ran to
        ``max_new_tokens`` and nothing else ended it there (an end-of-turn id, a stop string of
        ``stop`` or of :attr:`rules`, the loop guard), else ``"stop"``. Read from the ids, so
        every engine and decode path reports alike."""
        if len(new) < max_new_tokens or (new and int(new[-1]) in self.stop_ids()):
            return "stop"
        if loop_cut(list(new), self.rules) is not None:
            return "stop"
        text = self.tokenizer.decode(list(new), skip_special_tokens=False)
        return "stop" if cut_at_stop(text, self.rules.stops(stop))[1] else "length"
