"""Streaming pieces of the decoders (:meth:`rag.generate.chat.ChatDecoder.stream`): stop strings,
cancellation, timing.

``transformers`` stops on stop strings only inside ``generate``; what the UI needs on top is text
that never has to be taken back (a stop string split across two pieces, or the extra copies of a
loop that :func:`rag.generate.stopping.trim_repetition` will cut, must not leak out), a way to cancel from
the consumer's side, and the time to the first token. Those are the small units here. The stream
decodes token ids itself (:class:`TokenQueue` + :func:`stream_tokens`) rather than through
``TextIteratorStreamer``, because deciding what is safe to send needs the ids.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import torch

from rag.generate.stopping import DecodingRules, settled_length, trim_repetition


class Cancel:
    """A stopping criterion set from the consumer's side when a stream is abandoned."""

    def __init__(self) -> None:
        self.event = threading.Event()

    def __call__(self, input_ids: torch.LongTensor, scores: Any, **kwargs: Any) -> torch.BoolTensor:
        return torch.full((input_ids.shape[0],), self.event.is_set(), dtype=torch.bool)


class TokenQueue:
    """A ``generate`` streamer that hands each step's new token ids to the consuming thread.

    ``generate`` first pushes the prompt, which is skipped; :meth:`end` closes the iteration.
    Batch size 1 only, like ``TextIteratorStreamer``. ``ids`` keeps every new id put (the
    decoder's side: read it once decoding has ended).
    """

    def __init__(self) -> None:
        self._queue: queue.Queue[list[int] | None] = queue.Queue()
        self._prompt_seen = False
        self.ids: list[int] = []

    def put(self, value: torch.Tensor) -> None:
        if not self._prompt_seen:
            self._prompt_seen = True
            return
        ids = value.reshape(-1).tolist()
        self.ids.extend(ids)
        self._queue.put(ids)

    def end(self) -> None:
        self._queue.put(None)

    def __iter__(self) -> Iterator[list[int]]:
        while (ids := self._queue.get()) is not None:
            yield ids


class _Sender:
    """Sends a growing text as deltas whose concatenation is ``cut_at_stop(text)[0].strip()``."""

    def __init__(self, stop: Sequence[str] | None) -> None:
        self.stop = stop
        self.hold = max((len(s) for s in stop), default=1) - 1 if stop else 0
        self.sent = 0

    def update(self, text: str) -> tuple[str, bool]:
        """The delta that is safe to send for ``text`` so far, and whether a stop string ended it.

        Text that could still turn into a stop string, and trailing whitespace, is held back.
        """
        cut, stopped = cut_at_stop(text, self.stop)
        clean = cut.lstrip()
        safe = (clean if stopped else clean[: max(0, len(clean) - self.hold)]).rstrip()
        return self._advance(safe), stopped

    def finish(self, text: str) -> str:
        """The last delta, for the final ``text``."""
        return self._advance(cut_at_stop(text, self.stop)[0].strip())

    def _advance(self, safe: str) -> str:
        if len(safe) <= self.sent:
            return ""
        delta, self.sent = safe[self.sent :], len(safe)
        return delta


def stream_text(
    pieces: Iterator[str],
    stop: Sequence[str] | None,
    t0: float,
    stats: dict[str, float] | None,
) -> Iterator[str]:
    """Deltas whose concatenation is ``cut_at_stop(text).strip()``, for text arriving in pieces.
    Text that could still turn into a stop string, and trailing whitespace, is held back until it
    is decided; everything already sent is a prefix of the final answer.
    """
    sender, text = _Sender(stop), ""
    for piece in pieces:
        if stats is not None and piece and "ttft_s" not in stats:
            stats["ttft_s"] = time.perf_counter() - t0
        text += piece
        delta, stopped = sender.update(text)
        if delta:
            yield delta
        if stopped:
            return
    if delta := sender.finish(text):
        yield delta


def stream_tokens(
    chunks: Iterable[Sequence[int]],
    decode: Callable[[Sequence[int]], str],
    stop: Sequence[str] | None,
    t0: float,
    stats: dict[str, float] | None,
    rules: DecodingRules | None = None,
) -> Iterator[str]:
    """Deltas whose concatenation is ``cut_at_stop(decode(trim_repetition(ids)))[0].strip()``,
    exactly what :meth:`rag.generate.chat.ChatDecoder.generate` returns, for new token ids arriving in chunks.

    Besides what :func:`stream_text` holds back, the tokens a loop trim could still remove
    (:func:`rag.generate.stopping.settled_length`) and a trailing incomplete character wait until decided.
    Every text sent decodes a prefix of the final trimmed ids, so it is a prefix of the answer.
    """
    sender, ids = _Sender(stop), []
    for chunk in chunks:
        if stats is not None and chunk and "ttft_s" not in stats:
            stats["ttft_s"] = time.perf_counter() - t0
        ids.extend(chunk)
        delta, stopped = sender.update(decode(ids[: settled_length(ids, rules)]).rstrip("\ufffd"))
        if delta:
            yield delta
        if stopped:
            return
    if delta := sender.finish(decode(trim_repetition(ids, rules))):
        yield delta


def cut_at_stop(text: str, stop: Sequence[str] | None) -> tuple[str, bool]:
    """``text`` up to the earliest stop string, and whether one was found."""
    hits = [i for i in (text.find(s) for s in stop or ()) if i >= 0]
    return (text[: min(hits)], True) if hits else (text, False)
