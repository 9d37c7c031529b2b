"""The decoder on OpenVINO GenAI: the maintained inference engine the answer path runs on CPUs.

What the engine does for us, and so what is not written here: continuous batching of concurrent
requests (one scheduler step serves every running answer), prefix caching (the keys and values
of a prompt another request already read are reused block by block), a paged KV cache in u8,
prompt lookup decoding (an answer that copies its excerpts is checked several tokens per
forward), and the int4/int8 weight kernels for each CPU kind (AMX, AVX512, AVX2), reading the
pinned GGUF files directly (:func:`rag.models.gguf.package_engine_path`). The torch engine
(:class:`rag.generate.generator.Generator`) stays where training and scoring need gradients or
logits; docs/answering.md measures the two side by side.

What is ours: the prompt (:class:`rag.generate.chat.ChatDecoder`, the same token ids as torch),
the stop rules and the loop guard (:mod:`rag.generate.stopping`), streaming text that never has
to be taken back (:func:`rag.generate.streaming.stream_tokens`), and one worker thread that
makes every call into the engine: it adds, steps, reads, stops and cancels requests
(``ContinuousBatchingPipeline.step`` releases the GIL, so HTTP handlers and the retriever keep
running beside it), and builds the engine anew if a step fails.

What the engine does not offer: the log-probability of a given continuation (citation scores,
the refusal gate of :mod:`rag.answer.refusal`) and LoRA adapters trained by ``training.finetune.lora``
on the dequantised weights. A decoder with an adapter runs on torch (``engine = "auto"`` picks
it, :func:`rag.generate.engines.choose_engine`); an answer with no citation of its own is attributed by the passages'
support of its words (:func:`rag.answer.verify.attribute`), not by decoder likelihoods.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import queue
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from rag.defaults import DEFAULT_PROMPT_LOOKUP
from rag.generate.chat import ChatDecoder, DecodeOptions
from rag.generate.engines import EngineUnavailable, engine_gguf, engine_reason
from rag.generate.stopping import DecodingRules, loop_cut

log = logging.getLogger(__name__)
LOOKUP_NGRAM = 3  # prompt lookup matches n-grams of up to 3 of the reply's last ids in the prompt


def inference_precision(
    setting: str, amx: bool | None = None, *, short_replies: bool = False
) -> str | None:
    """The engine's ``INFERENCE_PRECISION_HINT`` for a ``decoder_precision`` setting: ``fp32``
    → ``f32``, ``bf16`` → ``bf16``; ``auto`` → ``f32`` on a CPU with AMX (``amx``: None = read
    this CPU) for a decoder that writes answers, else None (the engine's own choice); ``int8``
    → None (the engine already runs the GGUF's quantised weight blocks; the int8 decode layers
    are the torch engine's). ``short_replies``: a decoder whose replies are a few tokens (the
    factoid copier, :func:`rag.pipeline.load_factoid_decoder`), bound by its prompt.

    Why: on AMX the engine picks bf16 by itself, which prefills faster but decodes about a
    quarter slower than f32, so the 0.5B's written answers (a few dozen tokens) took longer in
    bf16 and the 1.5B's copied factoids (a few tokens) longer in f32 (docs/benchmarks.md). Not
    measured on the other CPU kinds, so not applied there."""
    if setting == "fp32":
        return "f32"
    if setting == "bf16":
        return "bf16"
    if setting == "auto" and not short_replies:
        from rag.models.precision import cpu_has_amx

        return "f32" if (cpu_has_amx() if amx is None else amx) else None
    return None


# the engine's graph and its tokenizer's, saved beside the GGUF (:func:`build_pipeline`); the
# stamp says what they were made from
IR_MODELS = ("openvino_model", "openvino_tokenizer", "openvino_detokenizer")
IR_FILES = tuple(f"{name}.{ext}" for name in IR_MODELS for ext in ("bin", "xml"))  # each .bin first
IR_STAMP = "openvino_model.json"


def _ir_stamp(folder: Path) -> dict[str, Any]:
    """What a saved IR was made from: the engine folder's GGUF (size, mtime) and the engine's
    version (its GGUF reader builds the graph, so another version may build another one)."""
    import openvino_genai as og

    from rag.models.gguf import ENGINE_GGUF

    st = (folder / ENGINE_GGUF).stat()
    return {"gguf_size": st.st_size, "gguf_mtime_ns": st.st_mtime_ns, "engine": og.__version__}


def _holds_ir(folder: Path) -> bool:
    """Whether every file of a saved IR (:data:`IR_FILES`) is in ``folder``."""
    return all((folder / f).is_file() for f in IR_FILES)


def _ir_is_current(folder: Path, stamp: dict[str, Any]) -> bool:
    import json

    try:
        saved = json.loads((folder / IR_STAMP).read_text())
    except (OSError, ValueError):
        return False
    return saved == stamp and _holds_ir(folder)


def _save_tokenizer(tokenizer: Any, out: Path) -> None:
    """The Hugging Face ``tokenizer`` as the engine's tokenizer and detokenizer models (read by
    the engine for its stop strings; the GGUF reader builds them from the GGUF but does not save
    them)."""
    import openvino as ov
    from openvino_tokenizers import convert_tokenizer

    encode, decode = convert_tokenizer(tokenizer, with_detokenizer=True)
    ov.save_model(encode, out / "openvino_tokenizer.xml")
    ov.save_model(decode, out / "openvino_detokenizer.xml")


def build_pipeline(folder: Path, sched: Any, props: dict[str, Any], tokenizer: Any) -> Any:
    """The engine's pipeline for an engine folder (:func:`rag.generate.engines.engine_gguf`),
    from the OpenVINO IR saved beside its GGUF when that IR is current, else from the GGUF,
    saving the IR the engine builds from it for the next process.

    Why: the engine's GGUF reader builds the model graph anew in every process, most of an
    engine's start, and every ``rag.ask``, server and UI start paid it; the saved IR loads in a
    fraction of that time (docs/benchmarks.md, the AVX2-only EPYC's section). The IR is the
    engine's own graph serialised (``enable_save_ov_model``), so it decodes the same ids, with
    ``tokenizer`` converted beside it (:func:`_save_tokenizer`). It is written in a scratch
    folder beside the GGUF (a hard link to it) and moved in, the stamp (:func:`_ir_stamp`)
    last: a killed save leaves no IR that looks whole. An IR that fails to load is built again
    from the GGUF; a folder that cannot be written to, or a tokenizer the converter does not
    read, keeps the GGUF."""
    import json
    import os
    import shutil

    import openvino_genai as og

    from rag.models.gguf import ENGINE_GGUF

    stamp = _ir_stamp(folder)
    if _ir_is_current(folder, stamp):
        try:
            return og.ContinuousBatchingPipeline(str(folder), sched, "CPU", props)
        except Exception as e:  # a damaged IR: the GGUF is still there
            log.warning(
                "the saved engine graph in %s did not load (%s); reading the GGUF", folder, e
            )
    tmp = folder / f".ir-{os.getpid()}-{threading.get_ident()}"
    try:
        tmp.mkdir()
        os.link(folder / ENGINE_GGUF, tmp / ENGINE_GGUF)
    except OSError:  # a read-only folder, or no hard links here: the GGUF alone, as before
        shutil.rmtree(tmp, ignore_errors=True)
        return og.ContinuousBatchingPipeline(str(folder / ENGINE_GGUF), sched, "CPU", props)
    try:
        save = {**props, "enable_save_ov_model": True}
        pipe = og.ContinuousBatchingPipeline(str(tmp / ENGINE_GGUF), sched, "CPU", save)
        try:
            _save_tokenizer(tokenizer, tmp)
        except Exception as e:  # the IR is of no use without it
            log.info("the engine's graph of %s is not saved: %s", folder, e)
            return pipe
        if _holds_ir(tmp):
            (folder / IR_STAMP).unlink(missing_ok=True)
            for f in IR_FILES:
                os.replace(tmp / f, folder / f)
            (tmp / IR_STAMP).write_text(json.dumps(stamp))
            os.replace(tmp / IR_STAMP, folder / IR_STAMP)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return pipe


def _running(handle: Any) -> bool:
    """Whether the engine is still decoding the request behind ``handle``."""
    return handle.get_status().name == "RUNNING"


class _Request:
    """One request for the engine: its prompt and settings, the handle the worker gets for it
    (None until added), and the queue its new token ids arrive on."""

    def __init__(self, prompt: list[int], config: Any) -> None:
        self.prompt, self.config = prompt, config
        self.max_new_tokens = config.max_new_tokens
        self.retried = False  # resubmitted once after a failed step (:meth:`_Stepper._recover`)
        self.handle: Any = None
        self.chunks: queue.Queue[list[int] | BaseException | None] = queue.Queue()
        self.ids: list[int] = []  # every id read so far (the worker's side)

    def __iter__(self) -> Iterator[list[int]]:
        while True:
            item = self.chunks.get()
            if item is None:
                return
            if isinstance(item, BaseException):
                raise item
            yield item


class _Run:
    """One request as the engine decodes it: the OpenVINO engine's
    :class:`rag.generate.chat.Decoding`. Iterating gives the request's new ids as they come,
    stopping the request when the loop guard fires; :meth:`close` cancels it when the consumer
    goes away (a closed stream, a stop string already met). Engine errors are raised while
    iterating."""

    cached: int | None = None  # the engine keeps no per-request count of reused prompt ids
    error: BaseException | None = None

    def __init__(self, req: _Request, rules: DecodingRules, stepper: _Stepper) -> None:
        self.req, self.rules, self.stepper = req, rules, stepper
        self._chunks = self._read()

    def _read(self) -> Iterator[list[int]]:
        seen: list[int] = []
        try:
            for chunk in self.req:
                seen.extend(chunk)
                yield chunk
                if self.rules.loop_guard and loop_cut(seen, self.rules) is not None:
                    self.stepper.end(self.req, "stop")
        finally:
            self.stepper.end(self.req, "cancel")

    def __iter__(self) -> Iterator[list[int]]:
        return self._chunks

    @property
    def ids(self) -> list[int]:
        """Every new id read from the engine (the worker's side)."""
        return self.req.ids

    def close(self) -> None:
        self._chunks.close()


class _Stepper:
    """The one thread that calls the engine: it adds the requests, steps them, reads their ids
    and stops or cancels them, all between two steps; other threads only queue work for it
    (:meth:`submit`, :meth:`end`) and read the ids it hands out, since the engine's own locking
    is not documented to cover those calls during a step. With prompt lookup on, the engine
    fails a step now and then all the same (``Cannot remove more tokens than has been
    generated``, docs/answering.md) and then fails every later one: so after a step that
    raises, the engine is built anew by ``rebuild`` (when given) and the requests it was running
    go on there (:meth:`_recover`). With ``serial`` (batching off) one request runs at a time, the
    others wait their turn in arrival order.
    """

    def __init__(self, pipe: Any, serial: bool, rebuild: Callable[[], Any] | None = None) -> None:
        if pipe is None and rebuild is None:
            raise ValueError("an engine, or a way to build one, is needed")
        self.pipe = pipe  # None: built at the first request (:meth:`ensure_built`)
        self._rebuild = rebuild
        self._build_lock = threading.Lock()
        self._ids = itertools.count()
        self._active: dict[int, _Request] = {}
        self._adding: list[_Request] = []  # submitted, added at the next pause
        self._ending: list[tuple[_Request, str]] = []  # (request, "stop" | "cancel")
        self._cond = threading.Condition()
        self._turn = threading.Semaphore(1) if serial else None
        self._closed = False
        self._broken: RuntimeError | None = None
        self._thread = threading.Thread(target=self._run, name="rag-ov-engine", daemon=True)
        self._thread.start()

    def ensure_built(self) -> None:
        """Build the engine by ``rebuild`` if there is none yet (a lazy load), once; the worker
        touches the engine only once a request is queued, so it never sees it missing."""
        if self.pipe is None:
            from rag.models.loading import MODEL_LOAD_LOCK

            with self._build_lock:
                if self.pipe is None:
                    with MODEL_LOAD_LOCK:
                        self.pipe = self._rebuild()

    def submit(self, ids: Sequence[int], config: Any) -> _Request:
        """Queue a request; the worker adds it to the engine before its next step."""
        if self._turn is not None:
            self._turn.acquire()
        req = _Request(list(ids), config)
        with self._cond:
            if self._closed:
                self._release()
                raise self._broken or RuntimeError("the decoder was closed")
            self._adding.append(req)
            self._cond.notify()
        return req

    def end(self, req: _Request, how: str) -> None:
        """Ask for ``req`` to be stopped (``"stop"``: it ends as if finished) or cancelled
        (``"cancel"``) between two steps; nothing when it has already ended."""
        with self._cond:
            if any(r is req for r in self._active.values()) or req in self._adding:
                self._ending.append((req, how))
                self._cond.notify()

    def _between_steps(self) -> None:
        """Add the queued requests, then stop or cancel those asked to end."""
        with self._cond:
            adding, self._adding = self._adding, []
            ending, self._ending = self._ending, []
        import numpy as np
        import openvino as ov

        for req in adding:
            rid = next(self._ids)
            try:
                tensor = ov.Tensor(np.asarray([req.prompt], dtype=np.int64))
                req.handle = self.pipe.add_request(rid, tensor, req.config)
            except Exception as e:  # noqa: BLE001 - this request's error, not the engine's
                req.chunks.put(e)
                self._release()
                continue
            with self._cond:
                self._active[rid] = req
        for req, how in ending:
            if req.handle is not None and _running(req.handle):
                req.handle.stop() if how == "stop" else req.handle.cancel()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._active and not self._adding and not self._closed:
                    self._cond.wait()
                if self._closed:
                    self._wind_down()
                    return
            try:
                self._between_steps()
                if not self._active:
                    continue
                self.pipe.step()
            except BaseException as e:
                self._recover(e)
                continue
            with self._cond:
                items = list(self._active.items())
            for rid, req in items:
                handle = req.handle
                if handle.can_read():
                    for out in handle.read().values():
                        new = list(out.generated_ids)
                        if new:
                            req.ids.extend(new)
                            req.chunks.put(new)
                if not _running(handle) and not handle.can_read():
                    with self._cond:
                        self._active.pop(rid, None)
                    req.chunks.put(None)
                    self._release()

    def _release(self) -> None:
        if self._turn is not None:
            self._turn.release()

    def _recover(self, error: BaseException) -> None:
        """After a failed step: the engine is built anew (:meth:`_renew`) and each request it
        was running goes on there once, from its prompt and the ids it already gave (with the
        token limit that is left), so its consumer sees one uninterrupted reply; a request that
        failed before, was asked to end, or could not go on gets the error (or its end)."""
        with self._cond:
            done, self._active = list(self._active.values()), {}
            ending = {id(r) for r, _ in self._ending}
            self._ending = []
        log.warning(
            "the OpenVINO engine failed a step with %d requests running (prompt ids, ids given, "
            "token limit: %s): %s",
            len(done),
            [(len(r.prompt), len(r.ids), r.max_new_tokens) for r in done],
            error,
        )
        with contextlib.suppress(Exception):  # let the old engine free its blocks if it can
            for req in done:
                req.handle.cancel()
            self.pipe.step()
        self._renew()
        for req in done:
            left = req.max_new_tokens - len(req.ids)
            if id(req) in ending or left <= 0:
                req.chunks.put(None)
            elif req.retried or self._broken is not None or not isinstance(error, Exception):
                req.chunks.put(self._broken or error)
            else:
                req.retried = True
                req.prompt = [*req.prompt, *req.ids]
                req.config.max_new_tokens = left
                req.handle = None
                with self._cond:
                    self._adding.append(req)
                continue
            self._release()

    def _renew(self) -> None:
        """After a failed step: a new engine (the old one's state is not to be trusted), or,
        without ``rebuild`` or when building fails, every later request is refused."""
        log.warning("building the OpenVINO engine anew")
        with self._cond:  # no request is added meanwhile (it would go to the old engine)
            try:
                if self._rebuild is None:
                    raise RuntimeError("no way to rebuild it")
                self.pipe = self._rebuild()
            except Exception as e:  # noqa: BLE001 - said on every later submit
                self._closed = True
                self._broken = RuntimeError(f"the decoder engine failed and could not restart: {e}")
                waiting, self._adding = self._adding, []
                for req in waiting:
                    req.chunks.put(self._broken)
                    self._release()

    def _wind_down(self) -> None:
        """On close (the worker's last act, under the lock): cancel what still runs and step
        once more so the engine frees its cache blocks; every waiting consumer gets its end."""
        running = [r for r in self._active.values() if _running(r.handle)]
        for req in running:
            req.handle.cancel()
        if running:
            with contextlib.suppress(Exception):  # closing anyway
                self.pipe.step()
        for req in [*self._active.values(), *self._adding]:  # those never added: no ids
            req.chunks.put(None)
        self._active.clear()
        self._adding.clear()

    def close(self) -> None:
        """Stop the worker: it cancels what still runs and exits (:meth:`_wind_down`)."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join(timeout=30)


class OpenVINOGenerator(ChatDecoder):
    """A GGUF decoder on OpenVINO GenAI's continuous-batching pipeline: ``generate``, ``stream``
    and ``generate_ids`` (:class:`rag.generate.chat.ChatDecoder`'s, the same as the torch
    engine's) over the engine's requests (:meth:`_start`). One instance serves every request;
    concurrent requests are batched by the engine (``batching=False``: one at a time)."""

    def __init__(
        self,
        pipe: Any,
        tokenizer: Any,
        *,
        max_positions: int | None = None,
        batching: bool = True,
        profile: str = "plain",
        max_context_tokens: int | None = None,
        rules: DecodingRules | None = None,
        prompt_lookup: int = 0,
        rebuild: Callable[[], Any] | None = None,
    ) -> None:
        super().__init__(
            tokenizer, profile=profile, max_context_tokens=max_context_tokens, rules=rules
        )
        self.prompt_lookup = prompt_lookup
        self._positions = max_positions
        self._stepper = _Stepper(pipe, serial=not batching, rebuild=rebuild)
        self.batcher = None  # the torch batcher's slot (benchmarks read it): the engine batches
        self._eos = self._eos_ids()

    @classmethod
    def load(
        cls,
        name: str | Path = "smollm2",
        device: str = "auto",
        *,
        profile: str = "auto",
        prompt_cache_mb: int = 512,
        batching: bool = True,
        max_batch: int = 16,
        max_prefill_tokens: int = 4096,
        max_context_tokens: int | None = None,
        rules: DecodingRules | None = None,
        prompt_lookup: int = DEFAULT_PROMPT_LOOKUP,
        precision: str = "auto",
        short_replies: bool = False,
        lazy: bool = False,
    ) -> OpenVINOGenerator:
        """The engine folder of ``name`` (:func:`engine_gguf`: built once from the pinned GGUF
        parts, sha256-checked) on the CPU. The scheduler holds ``max_batch`` sequences, prefills
        at most ``max_prefill_tokens`` tokens per step, and keeps a KV cache of the running
        answers plus ``prompt_cache_mb`` for prefix caching (0 = no prefix caching).
        ``prompt_lookup`` > 0 turns on the engine's prompt lookup decoding: each step proposes
        that many tokens found after an earlier occurrence of the reply's last ids (an n-gram of
        up to :data:`LOOKUP_NGRAM`) in the prompt or reply, and one forward keeps the ones
        greedy decoding would have chosen. ``precision``: the ``decoder_precision`` setting,
        for a decoder of ``short_replies`` or not (:func:`inference_precision`). ``lazy``: the
        tokenizer now, the engine (most of the load: reading the GGUF file) at the first
        request or :meth:`ensure_loaded`; a pipeline whose factoid is answered by another
        decoder then never builds this one (``rag.ask``: a factoid's answer 7 s sooner)."""
        import json

        import openvino_genai as og
        from transformers import AutoTokenizer

        from rag.models import pick_profile
        from rag.models.loading import MODEL_LOAD_LOCK

        reason = engine_reason(name, None, "cuda" if device == "cuda" else "cpu")
        if reason:
            raise EngineUnavailable(reason)
        folder = engine_gguf(name)
        run = json.loads((folder / "run.json").read_text())
        sched = og.SchedulerConfig()
        sched.enable_prefix_caching = prompt_cache_mb > 0
        sched.max_num_seqs = max_batch if batching else 1
        sched.max_num_batched_tokens = max_prefill_tokens
        # running answers (~3k tokens each at most) plus the prompts kept for reuse; the engine
        # allocates blocks on demand up to this size
        sched.cache_size = max(1, round((prompt_cache_mb + 256 * sched.max_num_seqs) / 1024))
        props: dict[str, Any] = {"prompt_lookup": True} if prompt_lookup else {}
        hint = inference_precision(precision, short_replies=short_replies)
        if hint:
            props["INFERENCE_PRECISION_HINT"] = hint

        def build() -> Any:
            return build_pipeline(folder, sched, props, tokenizer)

        with MODEL_LOAD_LOCK:
            tokenizer = AutoTokenizer.from_pretrained(folder)
            pipe = None if lazy else build()
        return cls(
            pipe,
            tokenizer,
            max_positions=run.get("max_positions"),
            batching=batching,
            profile=pick_profile(name) if profile == "auto" else profile,
            max_context_tokens=max_context_tokens,
            rules=rules,
            prompt_lookup=prompt_lookup,
            rebuild=build,
        )

    def ensure_loaded(self) -> OpenVINOGenerator:
        """Build the engine now if it was loaded lazily (:meth:`load`), once, so that a front
        end's preload (:meth:`rag.pipeline.RAGPipeline.load_models`) fails or pays here."""
        self._stepper.ensure_built()
        return self

    def model_positions(self) -> int | None:
        return self._positions

    def _eos_ids(self) -> set[int]:
        tok = self.tokenizer
        ids = {tok.eos_token_id} if tok.eos_token_id is not None else set()
        for special in ("<|im_end|>", "<|endoftext|>", "<|eot_id|>"):
            i = tok.convert_tokens_to_ids(special)
            if isinstance(i, int) and i != tok.unk_token_id and i >= 0:
                ids.add(i)
        return ids

    def _config(self, options: DecodeOptions) -> Any:
        import openvino_genai as og

        cfg = og.GenerationConfig()
        cfg.max_new_tokens = options.max_new_tokens
        cfg.apply_chat_template = False
        cfg.stop_token_ids = set(self._eos)
        if self.tokenizer.eos_token_id is not None:  # an engine read from its saved IR has none
            cfg.eos_token_id = self.tokenizer.eos_token_id
        if stops := self.rules.stops(options.stop):
            cfg.stop_strings = set(stops)
            cfg.include_stop_str_in_output = True  # cut here (cut_at_stop), as on torch
        if self.rules.repetition_penalty != 1.0:
            cfg.repetition_penalty = self.rules.repetition_penalty
        if self.rules.no_repeat_ngram_size:
            cfg.no_repeat_ngram_size = self.rules.no_repeat_ngram_size
        if self.prompt_lookup:
            cfg.num_assistant_tokens, cfg.max_ngram_size = self.prompt_lookup, LOOKUP_NGRAM
        if options.temperature > 0:
            cfg.do_sample, cfg.temperature, cfg.top_p = True, options.temperature, options.top_p
        else:
            cfg.do_sample = False
        return cfg

    def stop_ids(self) -> set[int]:
        return self._eos

    def _start(self, ids: list[int], prefix_len: int, options: DecodeOptions) -> _Run:
        """Submit the prompt ``ids`` to the engine, which stops at the stop strings itself. Of
        ``options`` the engine reads the token limit, sampling and ``stop``; ``use_cache``,
        ``use_prefix_cache``, ``min_new_tokens``, ``prompt_cache`` and ``ban`` are the torch
        engine's (this one keeps its own prefix cache) and are ignored."""
        self._stepper.ensure_built()
        return _Run(self._stepper.submit(ids, self._config(options)), self.rules, self._stepper)

    def close(self) -> None:
        """Cancel running requests and stop the worker thread."""
        self._stepper.close()
