"""Progress where a person waits: a tqdm bar on a terminal, and a plain line at a steady
interval everywhere else (logs, CI, ``nohup``, a pipe), with done/total, rate and ETA::

    [progress] encode: 1,200/5,183 chunk (23%), 45.1 chunk/s, ETA 1m28s
    [progress] encode: done, 5,183 chunk in 1m55s (45.0 chunk/s)

Why not tqdm alone: off a terminal tqdm either hides itself (``disable=None``, what most loops
here used, so a long job looked hung) or writes carriage-return redraws that pile up on one log
line. :class:`Progress` keeps tqdm for the terminal and prints whole lines otherwise, at most one
per ``interval`` seconds (``$RAG_PROGRESS_INTERVAL``, default 15; ``0`` turns the lines off).
Lines are printed when the loop reports (:meth:`Progress.update`), so a single step longer than
the interval shows up when it ends. The final ``done`` line is printed only when the loop ran at
least one interval (a short loop stays quiet). ``clock`` and ``stream`` are injectable, so the
behaviour is testable without waiting.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TextIO, TypeVar

T = TypeVar("T")

INTERVAL_ENV = "RAG_PROGRESS_INTERVAL"  # seconds between progress lines off a terminal
DEFAULT_INTERVAL_S = 15.0
PREFIX = "[progress]"


def progress_interval(default: float = DEFAULT_INTERVAL_S) -> float:
    """Seconds between lines: ``$RAG_PROGRESS_INTERVAL`` when set to a number >= 0, else
    ``default``."""
    raw = os.environ.get(INTERVAL_ENV, "")
    try:
        value = float(raw)
    except ValueError:
        return default
    return value if value >= 0 else default


def format_duration(seconds: float) -> str:
    """``42s``, ``3m05s``, ``2h07m``."""
    s = max(0, round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def _count(n: float) -> str:
    return f"{n:,.0f}" if float(n).is_integer() else f"{n:,.1f}"


def _is_terminal(stream: Any) -> bool:
    isatty = getattr(stream, "isatty", None)
    try:
        return bool(isatty()) if callable(isatty) else False
    except (OSError, ValueError):  # a closed stream
        return False


class Progress:
    """Progress of one loop of ``total`` units (None: unknown, no percentage or ETA).

    ``enabled``: False shows nothing. ``bar``: on a terminal, draw a tqdm bar (False: nothing
    on a terminal, for loops whose library already draws one, such as the HF Trainer).
    ``interval``: seconds between lines off a terminal (default :func:`progress_interval`).
    ``initial``: units already done (a resumed run); the rate counts only this run's.
    """

    def __init__(
        self,
        total: int | None,
        desc: str,
        unit: str = "it",
        *,
        enabled: bool = True,
        bar: bool = True,
        interval: float | None = None,
        stream: TextIO | None = None,
        clock: Callable[[], float] = time.monotonic,
        initial: int = 0,
    ):
        self.total, self.desc, self.unit = total, desc, unit
        self.stream = stream if stream is not None else sys.stderr
        self.interval = progress_interval() if interval is None else interval
        self.clock = clock
        self.done = self.initial = initial
        self.postfix: dict[str, Any] = {}
        self.lines = 0  # progress lines printed so far
        self.started = self.last = clock()
        self._bar = None
        self.mode = "off"  # bar (tqdm draws) | lines (this class prints) | off
        if enabled and _is_terminal(self.stream):
            self.mode = "bar" if bar else "off"
        elif enabled and self.interval > 0:
            self.mode = "lines"
        if enabled:  # a disabled bar unless drawn: a hook on tqdm (Gradio's track_tqdm, the
            # UI's upload progress) still sees the loop
            from tqdm.auto import tqdm

            self._bar = tqdm(
                total=total, desc=desc, unit=unit, initial=initial, file=self.stream,
                dynamic_ncols=True, disable=self.mode != "bar",
            )  # fmt: skip
        self.closed = False

    # ---------------------------------------------------------------- reporting

    def update(self, n: float = 1, **postfix: Any) -> None:
        """``n`` more units done; ``postfix`` (e.g. ``loss=3.2``) is shown from now on."""
        self.done += n
        if postfix:
            self.set_postfix(**postfix)
        if self._bar is not None:
            self._bar.update(n)
        if self.mode == "lines":
            now = self.clock()
            if now - self.last >= self.interval:
                self.last = now
                self._print(self.line(now))

    def set_postfix(self, **postfix: Any) -> None:
        self.postfix.update(postfix)
        if self.mode == "bar" and self._bar is not None:
            self._bar.set_postfix(**{k: _fmt(v) for k, v in self.postfix.items()})

    def rate(self, now: float | None = None) -> float | None:
        """Units per second over this run (None before any time has passed)."""
        elapsed = (self.clock() if now is None else now) - self.started
        return (self.done - self.initial) / elapsed if elapsed > 0 else None

    def line(self, now: float | None = None) -> str:
        """The progress line as of ``now``: done/total (percent), rate, ETA, postfix."""
        now = self.clock() if now is None else now
        rate = self.rate(now)
        parts = [_count(self.done) + (f"/{_count(self.total)}" if self.total else "")]
        parts[0] += f" {self.unit}"
        if self.total:
            parts[0] += f" ({100 * self.done / self.total:.0f}%)"
        if rate is not None:
            parts.append(_speed(rate, self.unit))
            if self.total and rate > 0:
                parts.append(f"ETA {format_duration(max(0, self.total - self.done) / rate)}")
        parts += [f"{k} {_fmt(v)}" for k, v in self.postfix.items()]
        return f"{PREFIX} {self.desc}: " + ", ".join(parts)

    def close(self) -> None:
        """End the loop: close the bar, or print the ``done`` line when lines were due."""
        if self.closed:
            return
        self.closed = True
        if self._bar is not None:
            self._bar.close()
        if self.mode == "lines":
            now = self.clock()
            if now - self.started >= self.interval:
                rate = self.rate(now)
                speed = f" ({_speed(rate, self.unit)})" if rate else ""
                self._print(
                    f"{PREFIX} {self.desc}: done, {_count(self.done)} {self.unit} in "
                    f"{format_duration(now - self.started)}{speed}"
                )

    def _print(self, text: str) -> None:
        self.lines += 1
        print(text, file=self.stream, flush=True)

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _speed(rate: float, unit: str) -> str:
    """``45.1 chunk/s``, or ``2.5 s/step`` below one unit a second."""
    if rate <= 0:
        return f"0 {unit}/s"
    return f"{rate:,.1f} {unit}/s" if rate >= 1 else f"{1 / rate:,.1f} s/{unit}"


def _fmt(v: Any) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def track(
    items: Iterable[T], desc: str, total: int | None = None, unit: str = "it", **kw: Any
) -> Iterator[T]:
    """``items``, reporting one unit per item (``kw``: :class:`Progress`'s keywords);
    ``total`` defaults to ``len(items)`` when it has one."""
    if total is None and hasattr(items, "__len__"):
        total = len(items)  # type: ignore[arg-type]
    with Progress(total, desc, unit, **kw) as p:
        for item in items:
            yield item
            p.update(1)
