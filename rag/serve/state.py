"""Process state behind :mod:`rag.serve`: the pipelines per index (sharing one decoder), the
slots that bound answers in flight, and one generation's run with its clean-up. The chat UI keeps
its pipelines in the same :class:`Pipelines`, keyed by whole configs (its settings panel picks
the models per request).

Why the clean-up lives here: a client that disconnects mid-answer must stop its decoding and
give its slot back, whatever path the request left by (finished, failed, cancelled). A
:class:`Run` is the one owner of both, closed exactly once.
"""

from __future__ import annotations

import json
import logging
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any

import anyio

from rag.config import RAGConfig
from rag.serve.api import ApiError

log = logging.getLogger("rag.serve")

PipelineFactory = Callable[[RAGConfig], Any]
END = object()  # the pipeline's stream ended (StopIteration cannot cross a thread boundary)


class SharedDecoder:
    """One decoder for every index's pipeline, loaded on first use.

    Each index needs its own retriever, but the decoder is the same for all of them (the model
    name picks the index only), and a second copy would double the largest memory cost. This
    stands in for the generator: attribute access loads the host pipeline's generator once.
    :meth:`fallback` and :meth:`factoid` stand in the same way for the host's
    ``fallback_generator`` (the decoder without a span-only adapter) and ``factoid_generator``
    (the decoder that copies factoids' short answers; rag.pipeline).
    """

    def __init__(self, config: RAGConfig | None, *, host: Any = None, role: str = "generator"):
        from rag.pipeline import RAGPipeline

        self._host = host if host is not None else RAGPipeline(config)
        self._role = role

    def fallback(self) -> SharedDecoder:
        """The stand-in for the host's k-passage decoder (the same model when the adapter
        serves both prompts)."""
        return SharedDecoder(None, host=self._host, role="fallback_generator")

    def factoid(self) -> SharedDecoder:
        """The stand-in for the host's factoid decoder (the k-passage one unless another is
        configured and installed)."""
        return SharedDecoder(None, host=self._host, role="factoid_generator")

    def ensure_loaded(self) -> Any:
        """The decoder this stands in for, loaded now (:meth:`rag.pipeline.RAGPipeline.load_models`:
        a front end's preload), an engine that builds lazily built too."""
        from rag.generate.load import ensure_loaded

        return ensure_loaded(getattr(self._host, self._role))

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return getattr(getattr(self._host, self._role), name)


def decoder_sharing_factory(keep: int = 2) -> PipelineFactory:
    """Pipelines for any configs (the server: the request's model picks the index; the chat UI:
    its settings panel picks the index and the models per request) that share their decoders
    with every other pipeline whose config asks for the same ones (device and generation
    settings): switching the index loads no second copy of a decoder (each pipeline with its
    own was 2.8 GB, with the 1.5B factoid decoder 6 GB). The ``keep`` most recently used
    decoder sets are kept for new pipelines; a pipeline still kept holds its own."""
    from rag.pipeline import RAGPipeline

    hosts: OrderedDict[str, SharedDecoder] = OrderedDict()
    lock = threading.Lock()

    def build(cfg: RAGConfig) -> Any:
        key = json.dumps({"device": cfg.device, **cfg.generate.to_dict()}, sort_keys=True)
        with lock:
            shared = hosts.pop(key, None) or SharedDecoder(cfg)
            hosts[key] = shared
            while len(hosts) > keep:
                hosts.popitem(last=False)
        return RAGPipeline(
            cfg,
            generator=shared,
            fallback_generator=shared.fallback(),
            factoid_generator=shared.factoid(),
        )

    return build


def config_key(config: RAGConfig) -> str:
    """What tells two configs' pipelines apart: every setting's value (and the rewrite hook's
    name), as one string."""
    return json.dumps(config.to_dict(), sort_keys=True, default=str)


class Pipelines:
    """Built pipelines by config, the most recently used ``size`` kept; built under a lock so
    concurrent first requests for one config load it once. :meth:`get` takes an index name (the
    base config on that index: the server) or a whole config (the UI)."""

    def __init__(self, base: RAGConfig, factory: PipelineFactory, size: int = 4) -> None:
        self.base, self.factory, self.size = base, factory, size
        self._items: OrderedDict[str, tuple[str, Any]] = OrderedDict()  # key -> (index, pipeline)
        self._view: dict[str, tuple[str, Any]] = {}  # a copy for readers that must not wait
        self._lock = threading.Lock()

    def get(self, config: str | RAGConfig) -> Any:
        """The pipeline for ``config`` (an index name: the base config on that index), built on
        first use; equal settings share one pipeline."""
        cfg = replace(self.base, index=config) if isinstance(config, str) else config
        key = config_key(cfg)
        with self._lock:
            if key in self._items:
                self._items.move_to_end(key)
                return self._items[key][1]
            log.info("loading pipeline for index %s", cfg.index)
            pipe = self.factory(cfg)
            self._items[key] = (cfg.index, pipe)
            while len(self._items) > self.size:
                self._items.popitem(last=False)
            self._view = dict(self._items)
            return pipe

    def generations(self) -> dict[str, str]:
        """The index generation each built pipeline has loaded (``/health``), without taking
        the lock a pipeline load holds: a probe must answer while an index loads."""
        found = {name: getattr(pipe, "generation", None) for name, pipe in self._view.values()}
        return {name: gen for name, gen in found.items() if isinstance(gen, str) and gen}


class Slots:
    """Chat completions in flight. Only touched from the event loop, so a plain counter."""

    def __init__(self, size: int) -> None:
        self.size, self.used = size, 0

    def take(self) -> None:
        if self.used >= self.size:
            raise ApiError(
                429,
                f"the server is busy ({self.size} answers in progress); retry shortly",
                type="rate_limit_error",
                code="server_busy",
                headers={"Retry-After": "1"},
            )
        self.used += 1

    def give(self) -> None:
        self.used = max(0, self.used - 1)


def next_item(items: Iterator[Any]) -> Any:
    return next(items, END)


class Run:
    """One generation in flight: the pipeline's stream and its slot. :meth:`close` closes the
    stream (which cancels decoding, see ``Generator.stream``) and frees the slot, once."""

    def __init__(self, items: Iterator[Any], slots: Slots) -> None:
        self.items, self.slots, self.closed = items, slots, False

    async def next(self) -> Any:
        # abandon_on_cancel=False (the default): a cancelled request waits for next() to
        # return, so close() never meets a generator that is still running in a thread.
        return await anyio.to_thread.run_sync(next_item, self.items)

    async def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        with anyio.CancelScope(shield=True):
            try:
                close = getattr(self.items, "close", None)
                if close is not None:
                    await anyio.to_thread.run_sync(close)
            except Exception:  # the answer is over either way; keep the failure in the log
                log.exception("closing a pipeline stream failed")
            finally:
                self.slots.give()
