"""Streaming pieces of :class:`rag.generate.Generator`: stop strings, cancellation, timing.

``transformers`` streams decoded text through ``TextIteratorStreamer`` and stops on stop strings
only inside ``generate``; what the UI needs on top is text that never has to be taken back (a
stop string split across two pieces must not leak out), a way to cancel from the consumer's side,
and the time to the first token. Those are the small units here.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

import torch


class FirstTokenClock:
    """A streamer that only notes when the first new token arrives (time to first token)."""

    def __init__(self) -> None:
        self.calls = 0
        self.first: float | None = None
        self.new_tokens = 0

    def put(self, value: torch.Tensor) -> None:
        self.calls += 1
        if self.calls == 1:  # generate() first pushes the prompt
            return
        if self.first is None:
            self.first = time.perf_counter()
        self.new_tokens += int(value.numel())

    def end(self) -> None:
        pass


class Cancel:
    """A stopping criterion set from the consumer's side when a stream is abandoned."""

    def __init__(self) -> None:
        self.event = threading.Event()

    def __call__(self, input_ids: torch.LongTensor, scores: Any, **kwargs: Any) -> torch.BoolTensor:
        return torch.full((input_ids.shape[0],), self.event.is_set(), dtype=torch.bool)


def stream_text(
    pieces: Iterator[str],
    stop: Sequence[str] | None,
    t0: float,
    stats: dict[str, float] | None,
) -> Iterator[str]:
    """Deltas whose concatenation is ``cut_at_stop(text).strip()``, as :meth:`Generator.generate`
    returns. Text that could still turn into a stop string, and trailing whitespace, is held back
    until it is decided; everything already sent is a prefix of the final answer.
    """
    hold = max((len(s) for s in stop), default=1) - 1 if stop else 0
    text, sent = "", 0
    for piece in pieces:
        if stats is not None and piece and "ttft_s" not in stats:
            stats["ttft_s"] = time.perf_counter() - t0
        text += piece
        cut, stopped = cut_at_stop(text, stop)
        clean = cut.lstrip()
        safe = (clean if stopped else clean[: max(0, len(clean) - hold)]).rstrip()
        if len(safe) > sent:
            yield safe[sent:]
            sent = len(safe)
        if stopped:
            return
    final = cut_at_stop(text, stop)[0].strip()
    if len(final) > sent:
        yield final[sent:]


def cut_at_stop(text: str, stop: Sequence[str] | None) -> tuple[str, bool]:
    """``text`` up to the earliest stop string, and whether one was found."""
    hits = [i for i in (text.find(s) for s in stop or ()) if i >= 0]
    return (text[: min(hits)], True) if hits else (text, False)
