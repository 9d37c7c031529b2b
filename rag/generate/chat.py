"""What every decoder engine shares: the prompt side (chat template, token ids, context budget)
and the decoding interface (``generate``, ``stream``, ``generate_ids``).

Both engines (:class:`rag.generate.generator.Generator` on torch and
:class:`rag.generate.ov_engine.OpenVINOGenerator` on OpenVINO GenAI) build a prompt the same way,
with the same Hugging Face tokenizer, so a question gives both the same token ids and the only
difference between them is how those ids are decoded. What lives here is that shared part: the
grounded prompt in a profile, its rendering through the chat template, the ids split into the
cacheable system prefix and the rest, and which passages fit the context window.

Decoding's public face lives here too, once for both engines: :meth:`ChatDecoder.generate`,
:meth:`ChatDecoder.stream` and :meth:`ChatDecoder.generate_ids`, with one signature, one set of
parameter docs, and one body each over the engine's single decode path
(:meth:`ChatDecoder._start`, a :class:`Decoding`). An engine only says how a prompt's ids are
decoded; the reply text, the streamed deltas and the stats are made here, so both engines report
alike and a stream joins to exactly what ``generate`` returns.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from rag.answer.prompt import DEFAULT_STOP, build_messages
from rag.defaults import DEFAULT_MAX_NEW_TOKENS
from rag.generate import context_budget
from rag.generate.stopping import DecodingRules, loop_cut, trim_repetition
from rag.generate.streaming import cut_at_stop, stream_tokens

__all__ = ["DEFAULT_STOP", "FALLBACK_CHAT_TEMPLATE", "ChatDecoder", "DecodeOptions", "Decoding"]

# ChatML without a default system turn: used only when a tokenizer ships no chat template.
FALLBACK_CHAT_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content']"
    " + '<|im_end|>' + '\n' }}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\n' }}{% endif %}"
)


@dataclass(frozen=True)
class DecodeOptions:
    """How one reply is decoded: the options :meth:`ChatDecoder.generate`,
    :meth:`ChatDecoder.stream` and :meth:`ChatDecoder.generate_ids` take (documented there), as an
    engine's :meth:`ChatDecoder._start` receives them."""

    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS
    temperature: float = 0.0
    top_p: float = 1.0
    stop: Sequence[str] | None = None
    use_cache: bool = True
    use_prefix_cache: bool | None = None
    min_new_tokens: int = 0
    prompt_cache: Any = None
    ban: Sequence[Sequence[int]] | None = None


class Decoding(Protocol):
    """One prompt being decoded by an engine (what :meth:`ChatDecoder._start` returns).

    Iterating it gives the new token ids in chunks as they are decoded; ``ids`` is every new id
    the engine decoded (read once iteration has ended: a stream that stopped reading at a stop
    string may leave a few the engine decoded meanwhile); ``cached`` the prompt ids it started
    from a cache for (None: the engine does not say); ``close`` cancels what is left and waits
    for the engine to let go; ``error`` is what decoding raised when the engine hands errors
    over only once it has stopped (else they are raised while iterating)."""

    cached: int | None
    error: BaseException | None

    @property
    def ids(self) -> Sequence[int]: ...

    def __iter__(self) -> Iterator[list[int]]: ...

    def close(self) -> None: ...


class ChatDecoder:
    """A tokenizer with a chat template and the prompt rules of one decoder; engines subclass it
    and add their one decode path (:meth:`_start`); :meth:`generate`, :meth:`stream` and
    :meth:`generate_ids` are defined here, the same for every engine."""

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
        self.profile = profile  # prompt profile of rag.answer.prompt.build_messages
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
        """The grounded prompt in this decoder's profile (:func:`rag.answer.prompt.build_messages`)."""
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

    # ---- decoding: one signature and one body for every engine ---------------------------------

    def _start(self, ids: list[int], prefix_len: int, options: DecodeOptions) -> Decoding:
        """Start decoding the prompt ``ids`` (its first ``prefix_len`` the cacheable system
        prefix) with ``options``: the engine's one decode path."""
        raise NotImplementedError

    def generate(
        self,
        messages: Sequence[dict[str, str]],
        max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS,
        temperature: float = 0.0,
        top_p: float = 1.0,
        stop: Sequence[str] | None = DEFAULT_STOP,
        *,
        use_prefix_cache: bool | None = None,
        stats: dict[str, Any] | None = None,
        prompt_cache: Any = None,
        ban: Sequence[Sequence[int]] | None = None,
        continuation: str = "",
    ) -> str:
        """The assistant's reply to chat ``messages``: decoded greedily when ``temperature`` is 0
        (else nucleus sampling with ``top_p``), at most ``max_new_tokens`` new tokens, cut at the
        first stop string (``stop`` + :attr:`rules`' own) and trimmed to one copy of a loop
        (:meth:`reply_text`). :meth:`stream` takes the same arguments and sends the same text.

        ``continuation``: the start of the reply, already written (:meth:`prompt_ids`).
        ``stats``, when given, is filled once the reply is complete with prompt_tokens,
        new_tokens (every id decoded: a stop string's and a trimmed loop's too), ttft_s, total_s,
        finish_reason (:meth:`finish_reason`) and, where the engine says, cached_prefix_tokens.
        Torch only, ignored by the OpenVINO engine (which keeps its own prefix cache):
        ``use_prefix_cache`` (None: the generator's setting) starts from the cached system
        prefix; ``prompt_cache`` is a KV cache of a prefix of the prompt to start from instead
        (the refusal gate's, :func:`rag.generate.scoring.refusal_logprob`); ``ban`` lists id
        sequences never to decode (``bad_words_ids``)."""
        ids, prefix_len = self.prompt_ids(messages, continuation)
        options = DecodeOptions(
            max_new_tokens,
            temperature,
            top_p,
            stop,
            use_prefix_cache=use_prefix_cache,
            prompt_cache=prompt_cache,
            ban=ban,
        )
        return self.reply_text(self._decode_ids(ids, prefix_len, options, stats), stop)

    def stream(
        self,
        messages: Sequence[dict[str, str]],
        max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS,
        temperature: float = 0.0,
        top_p: float = 1.0,
        stop: Sequence[str] | None = DEFAULT_STOP,
        *,
        use_prefix_cache: bool | None = None,
        stats: dict[str, Any] | None = None,
        prompt_cache: Any = None,
        ban: Sequence[Sequence[int]] | None = None,
        continuation: str = "",
    ) -> Iterator[str]:
        """Text deltas of the reply as they are decoded; joined they equal :meth:`generate`'s
        text for the same arguments (documented there). Text that a stop string or a loop trim
        could still take back is held until decided (:func:`rag.generate.streaming.stream_tokens`);
        ``stats`` is filled once the reply is complete (ttft_s when the first text came).
        Closing the iterator early (e.g. a UI "stop" button) cancels decoding."""
        t0 = time.perf_counter()
        ids, prefix_len = self.prompt_ids(messages, continuation)
        options = DecodeOptions(
            max_new_tokens,
            temperature,
            top_p,
            stop,
            use_prefix_cache=use_prefix_cache,
            prompt_cache=prompt_cache,
            ban=ban,
        )
        run = self._start(ids, prefix_len, options)
        try:
            yield from stream_tokens(
                run, self.decode, self.rules.stops(stop), t0, stats, self.rules
            )
        finally:
            run.close()  # a stop string ended the text, or the consumer left: cancel the rest
        if run.error is not None:
            raise run.error
        self._fill_stats(stats, ids, run, options, t0)

    def generate_ids(
        self,
        ids: list[int],
        prefix_len: int = 0,
        *,
        max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS,
        temperature: float = 0.0,
        top_p: float = 1.0,
        stop: Sequence[str] | None = None,
        use_cache: bool = True,
        use_prefix_cache: bool | None = None,
        min_new_tokens: int = 0,
        stats: dict[str, Any] | None = None,
        prompt_cache: Any = None,
        ban: Sequence[Sequence[int]] | None = None,
    ) -> list[int]:
        """New token ids for a prompt given as ids (``prefix_len``: how many lead ids are the
        cacheable system prefix), as decoded: a loop the guard stopped is not trimmed here but in
        :meth:`generate`. The benchmarks' entry point; the options as for :meth:`generate`, plus
        (torch only) ``use_cache`` (False: no KV cache at all) and ``min_new_tokens`` (forces at
        least that many: runs of equal length)."""
        options = DecodeOptions(
            max_new_tokens,
            temperature,
            top_p,
            stop,
            use_cache,
            use_prefix_cache,
            min_new_tokens,
            prompt_cache,
            ban,
        )
        return self._decode_ids(ids, prefix_len, options, stats)

    def _decode_ids(
        self,
        ids: list[int],
        prefix_len: int,
        options: DecodeOptions,
        stats: dict[str, Any] | None,
    ) -> list[int]:
        """Every new id of the prompt ``ids``, decoded to the end; fills ``stats``."""
        t0 = time.perf_counter()
        run = self._start(ids, prefix_len, options)
        first = None
        try:
            for chunk in run:
                if first is None and chunk:
                    first = time.perf_counter()
        finally:
            run.close()
        if run.error is not None:
            raise run.error
        self._fill_stats(stats, ids, run, options, t0)
        if stats is not None:
            stats["ttft_s"] = (first or time.perf_counter()) - t0
        return list(run.ids)

    def _fill_stats(
        self,
        stats: dict[str, Any] | None,
        ids: Sequence[int],
        run: Decoding,
        options: DecodeOptions,
        t0: float,
    ) -> None:
        """``stats`` of a finished decode (:meth:`generate` lists them; ``ttft_s`` is the
        caller's)."""
        if stats is None:
            return
        stats.update(prompt_tokens=len(ids))
        if run.cached is not None:
            stats.update(cached_prefix_tokens=run.cached)
        stats.update(
            new_tokens=len(run.ids),
            total_s=time.perf_counter() - t0,
            finish_reason=self.finish_reason(run.ids, options.max_new_tokens, options.stop),
        )
