"""End-to-end serving load, batching off vs on, through the chat UI and the HTTP API side by side.

    python -m benchmarks.serve_load --index docs --decoder smollm2 --adapter none --target both
        --modes off,on --rounds 2 --sessions 16 --duration 60 --max-new-tokens 32 --max-batch 16

For each round, target (``ui``: ``gradio_client`` sessions on ``ui.app``'s ``/chat``; ``api``:
``openai`` clients streaming ``POST /v1/chat/completions`` from ``rag.serve``) and batching mode,
in that order (so a target's off and on runs are neighbours, and rounds alternate off, on, off,
on: a change in machine load hits both modes), the app or server is started in this process on
a free loopback port with the generation settings' ``batching`` / ``max_batch`` set for the mode
and admitting
every session at once (UI queue concurrency and API ``max_concurrent`` >= ``--sessions``, so the
comparison is about decoding, not a queue); one warm-up request goes through it; then
``--sessions`` clients ask in a loop for ``--duration`` seconds (requests in flight then finish
and are counted) and the server is stopped. By default each session cycles six built-in chat
questions (follow-ups included), so prompts recur; ``--questions FILE`` (one per line, e.g.
``benchmarks/data/docs_questions.txt``) makes every request ask a question no other request
asked, until the file runs out, which is what the decoder's prompt cache
(:mod:`rag.generate.prompt_cache`) cannot serve whole. Each run starts with that cache empty.

Every run answers with the *same* loaded models: one retriever and one decoder are loaded once.
On the torch engine each pipeline gets the decoder as ``Generator(batching=..., max_batch=...)``
(its config's generation settings) over the same model object (what ``Generator.load`` builds,
without loading the weights again), so only the batching differs. On OpenVINO GenAI
(``--engine``, as RAGConfig: ``auto`` takes it for a GGUF decoder without adapter) the engine
batches itself: batching on is a second engine pipeline scheduling ``--max-batch`` sequences,
off the one that runs one at a time (:class:`SharedModels`).

Per run: answered requests, errors (a client exception, the UI's ``Error:`` reply, an API error
status or error event), answered req/s, p50/p95 latency, p50 time to first answer text (API:
first streamed delta; UI: first streamed chat text, polled every 50 ms), mean decode batch
(batching on), the share of prompt tokens the prompt cache served (no prefill), CPU seconds of
this process (server and clients), 1-minute load average before and after. ``results.json`` (config, hardware, runs with per-request samples) and
``serve_load.png`` go to ``$RAG_HOME/benchmarks/serve_load/``; the markdown table is printed
(``--json`` prints the results instead). Exit status 1 when any request failed.
"""

from __future__ import annotations

import json
import statistics
import sys
import threading
from dataclasses import asdict, dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any

from benchmarks.clients import ApiSession, Request, UiSession, api_server, ui_server
from benchmarks.loadgen import (
    Sample,
    fmt_num,
    fmt_s,
    log,
    machine_counters,
    plot,
    run_sessions,
    sample_rows,
    summarise,
    warm_up,
)
from rag.cli import run_cli
from rag.cli.flags import dataclass_parser
from rag.config import RAGConfig, with_overrides
from rag.defaults import DEFAULT_PROMPT_CACHE_MB, DEFAULT_PROMPT_LOOKUP, MODES
from rag.generate.load import ensure_loaded, prepare_serving_process
from rag.storage.paths import rag_home

PROG = "benchmarks.serve_load"
TARGETS = ("ui", "api", "both")
BATCHING = ("off", "on")


@dataclass
class ServeLoadConfig:
    """One side-by-side measurement; every field is a ``--kebab-case`` flag."""

    target: str = "both"  # front end under load: ui (gradio_client), api (openai client) or both
    modes: str = "off,on"  # batching modes, comma-separated, run in this order in each round
    rounds: int = 1  # times each (target, mode) runs; rounds alternate the modes
    sessions: int = 16  # concurrent client sessions
    duration: float = 60.0  # seconds during which sessions start new requests, per run
    max_new_tokens: int = 32  # answer length cap per request (small: this measures serving)
    max_batch: int = 16  # rows per decode step with batching on
    index: str = "docs"  # index under $RAG_HOME/indexes the questions go to
    encoder: str | None = None  # query encoder; none = the index's own
    decoder: str = "smollm2"  # decoder alias or folder
    adapter: str = "none"  # LoRA adapter: none | auto | folder
    retrieval: str = "hybrid"  # retrieval mode of each request
    k: int = 3  # passages per question
    device: str = "auto"  # where the models run (as RAGConfig)
    decoder_precision: str = "auto"  # decoder weights (as RAGConfig: bf16 where the CPU has it)
    # decoder engine (as RAGConfig): auto = OpenVINO GenAI for a GGUF decoder without adapter on
    # the CPU, else torch | torch | openvino; each engine batches its own way (SharedModels)
    engine: str = "auto"
    # OpenVINO engine's prompt lookup decoding (as RAGConfig): tokens proposed per step, 0 = off
    prompt_lookup: int = DEFAULT_PROMPT_LOOKUP
    threads: int | None = None  # torch CPU threads; none = torch's default
    # file of distinct questions, one per line (# comments), asked in turn across sessions so
    # none repeats until it runs out: benchmarks/data/docs_questions.txt for the docs index;
    # none = six built-in chat questions each session cycles (repeats, follow-ups included)
    questions: str | None = None
    prompt_cache_mb: int = DEFAULT_PROMPT_CACHE_MB  # decoder prompt cache, MB (0 = off)
    out: str | None = None  # results folder (default $RAG_HOME/benchmarks/serve_load)

    def targets(self) -> list[str]:
        return ["ui", "api"] if self.target == "both" else [self.target]

    def mode_list(self) -> list[str]:
        return [m.strip() for m in self.modes.split(",") if m.strip()]

    def check(self) -> None:
        """Refuse a run that could not measure anything (exit 2, rag.cli)."""
        if self.target not in TARGETS:
            raise ValueError(f"--target must be one of {', '.join(TARGETS)}, not {self.target!r}")
        modes = self.mode_list()
        if not modes or set(modes) - set(BATCHING) or len(set(modes)) < len(modes):
            raise ValueError(f"--modes takes off and/or on, comma-separated, not {self.modes!r}")
        for name in ("sessions", "rounds", "max_new_tokens", "max_batch", "k"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be >= 1")
        if self.prompt_cache_mb < 0:
            raise ValueError("--prompt-cache-mb must be >= 0 (0 = off)")
        self.question_list()
        if self.duration <= 0:
            raise ValueError("--duration must be > 0")
        if "ui" in self.targets():
            self.request().check_ui()

    def question_list(self) -> tuple[str, ...]:
        """The ``--questions`` file's questions (empty without one); ValueError naming the file
        when it cannot be read or holds none."""
        if not self.questions:
            return ()
        try:
            lines = Path(self.questions).read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError) as e:
            raise ValueError(f"--questions {self.questions}: cannot read it ({e})") from None
        qs = tuple(q.strip() for q in lines if q.strip() and not q.lstrip().startswith("#"))
        if not qs:
            raise ValueError(f"--questions {self.questions}: no questions in it")
        return qs

    def request(self) -> Request:
        """What each session asks, through either front end."""
        return Request(
            index=self.index, encoder=self.encoder, decoder=self.decoder, mode=self.retrieval,
            k=self.k, max_new_tokens=self.max_new_tokens, questions=self.question_list(),
            sessions=self.sessions,
        )  # fmt: skip

    def rag_config(self) -> RAGConfig:
        """The RAGConfig every run starts from (flat names: each goes to its section)."""
        return RAGConfig.of(
            index=self.index, encoder=self.encoder, decoder=self.decoder, adapter=self.adapter,
            k=self.k, mode=self.retrieval, max_new_tokens=self.max_new_tokens,
            max_batch=self.max_batch, device=self.device, decoder_precision=self.decoder_precision,
            prompt_cache_mb=self.prompt_cache_mb, engine=self.engine,
            prompt_lookup=self.prompt_lookup,
        )  # fmt: skip


def with_batching(cfg: RAGConfig, on: bool) -> RAGConfig:
    """``cfg`` with its generation settings' batching on or off."""
    return with_overrides(cfg, batching=on)


class SharedModels:
    """One retriever and one loaded decoder for every run; :meth:`pipeline` is the pipeline
    factory the app and the server are given.

    A pipeline's decoder follows its config's ``batching`` and ``max_batch``. On torch: a
    ``Generator`` over the one model object, unbatched or with its own ``BatchedDecoder`` (kept
    across runs, so its step counters give the mean batch size). On OpenVINO GenAI the engine
    batches itself and holds its own weights: a second engine pipeline with batching on (a
    scheduler of ``max_batch`` sequences), beside the unbatched one (one sequence at a time); it
    reports no step counters or prompt-cache reuse, and its prefix cache is not cleared between
    runs. The decoder that copies factoids' short answers (the 1.5B beside the default 0.5B:
    ``factoid_decoder``, rag.pipeline) is loaded the same way, one unbatched and one batched
    engine, as the server loads it with its generation settings (:meth:`factoid`). Tests pass a
    retriever and a generator (a tiny random model), which then copies factoids too; otherwise
    they are loaded as ``RAGPipeline`` loads them.
    """

    def __init__(self, base: RAGConfig, retriever: Any = None, generator: Any = None) -> None:
        self.base = base
        self._retriever, self._plain = retriever, generator
        self._generators: dict[int, Any] = {}  # max_batch -> batched Generator
        self._factoids: dict[tuple[bool, int], Any] = {}  # (batching, max_batch) -> decoder
        self._given = generator is not None
        self._lock = threading.Lock()

    def load(self, batched: int | None = None) -> None:
        """Load the retriever and the unbatched decoders now, and the batched ones for
        ``batched`` sequences when given (runs with batching on): as a server loads its models
        at start-up, so no run's first requests wait for a load."""
        from rag.pipeline import RAGPipeline

        host = RAGPipeline(with_batching(self.base, False))
        if self._retriever is None:
            self._retriever = host.retriever
            _ = self._retriever.encoder  # load the encoder now, not in the first request
        if self._plain is None:  # built now: the pipeline loads its engine lazily
            self._plain = host.generator
            ensure_loaded(self._plain)
        self.factoid(False, self.base.generate.max_batch)
        if batched:
            self.generator(True, batched)
            self.factoid(True, batched)

    def factoid(self, batching: bool, max_batch: int) -> Any:
        """The decoder that copies factoids' short answers for a run, loaded once per
        (batching, max_batch) with the run's generation settings; None when that is the
        answering decoder (or the generator was passed in): the pipeline then uses its own."""
        from rag.pipeline import load_factoid_decoder, separate_factoid_decoder

        if self._given or separate_factoid_decoder(self.base.generate) is None:
            return None
        key = (batching, max_batch if batching else 0)
        with self._lock:
            if key not in self._factoids:
                cfg = with_overrides(self.base, batching=batching, max_batch=max_batch)
                self._factoids[key] = load_factoid_decoder(cfg.generate, self.base.device)
            return self._factoids[key]

    def generator(self, batching: bool, max_batch: int) -> Any:
        if not batching:
            return self._plain
        from rag.generate.generator import Generator

        with self._lock:
            if max_batch not in self._generators and not isinstance(self._plain, Generator):
                from rag.generate.load import load_decoder

                settings = with_overrides(self.base, batching=True, max_batch=max_batch).generate
                self._generators[max_batch] = load_decoder(
                    settings, self.base.device, settings.adapter
                )
            if max_batch not in self._generators:
                p = self._plain
                gen = Generator(
                    p.model, p.tokenizer, p.device, prefix_cache=p.prefix_cache,
                    max_context_tokens=p.max_context_tokens, profile=p.profile, rules=p.rules,
                    refusal_threshold=p.refusal_threshold, batching=True, max_batch=max_batch,
                    # a prompt cache as the unbatched decoder has one (so both modes alike);
                    # "is not None": an empty PromptCache is falsy (it has a length)
                    prompt_cache_mb=(
                        self.base.generate.prompt_cache_mb
                        if getattr(p, "prompts", None) is not None
                        else 0
                    ),
                )  # fmt: skip
                if gen.batcher is None:
                    decoder = self.base.generate.decoder
                    raise ValueError(f"{decoder}: its cache does not support batching")
                self._generators[max_batch] = gen
            return self._generators[max_batch]

    def pipeline(self, cfg: RAGConfig) -> Any:
        from rag.pipeline import RAGPipeline

        batching, max_batch = cfg.generate.batching, cfg.generate.max_batch
        gen = self.generator(batching, max_batch)
        factoid = self.factoid(batching, max_batch)
        return RAGPipeline(cfg, retriever=self._retriever, generator=gen, factoid_generator=factoid)

    def prompt_counters(self, batching: bool, max_batch: int) -> tuple[int, int]:
        """(prompt tokens looked up, tokens reused) of the decoder ``batching`` uses, so far."""
        prompts = getattr(self.generator(batching, max_batch), "prompts", None)
        return (
            (prompts.stats.prompt_tokens, prompts.stats.reused_tokens)
            if prompts is not None
            else (0, 0)
        )

    def clear_caches(self, batching: bool, max_batch: int) -> None:
        """Start a run cold: the decoder ``batching`` uses forgets its cached prompts (each run
        then fills its own, so neither mode inherits the other's)."""
        gen = self.generator(batching, max_batch)
        if hasattr(gen, "clear_prefix_cache"):
            gen.clear_prefix_cache()

    def batch_counters(self) -> tuple[int, int]:
        """(decode steps, rows over those steps) of every batched decoder so far."""
        gens = [g for g in self._generators.values() if getattr(g, "batcher", None) is not None]
        return sum(g.batcher.steps for g in gens), sum(g.batcher.row_steps for g in gens)

    def engine(self) -> str:
        """``torch`` or ``openvino``: the engine the runs decode on."""
        from rag.generate.generator import Generator

        return "torch" if isinstance(self._plain, Generator) else "openvino"

    def close(self) -> None:
        for gen in self._generators.values():
            if getattr(gen, "batcher", None) is not None:
                gen.batcher.close()
            elif hasattr(gen, "close"):
                gen.close()


def run_one(
    cfg: ServeLoadConfig, models: SharedModels, target: str, mode: str
) -> tuple[dict[str, Any], list[Sample]]:
    """Start the target with batching ``mode``, warm it, load it, stop it; (summary, samples)."""
    from rag.serve.app import ServeOptions
    from ui.app import AppConfig

    rag_cfg = with_batching(models.base, mode == "on")
    batching, max_batch = rag_cfg.generate.batching, rag_cfg.generate.max_batch
    req = cfg.request()
    if target == "ui":
        app_cfg = AppConfig(
            rag=rag_cfg, concurrency=max(cfg.sessions, AppConfig.concurrency),
            queue_size=max(4 * cfg.sessions, AppConfig.queue_size), preload=False,
        )  # fmt: skip
        server = ui_server(app_cfg, models.pipeline)
        session_cls: Any = UiSession
    else:
        options = ServeOptions(max_concurrent=max(cfg.sessions, ServeOptions.max_concurrent))
        server = api_server(rag_cfg, models.pipeline, options)
        session_cls = ApiSession
    with server as (url, app):
        if target == "ui":  # the adapter as the app resolved it ("auto" -> a name or none)
            req.adapter = app.chat_app.config.rag.generate.adapter
        open_session = partial(session_cls, url, req)
        models.clear_caches(batching, max_batch)
        warm_up(open_session, PROG)
        steps0, rows0 = models.batch_counters()
        looked0, reused0 = models.prompt_counters(batching, max_batch)
        with machine_counters() as machine:
            samples, wall = run_sessions(cfg.sessions, cfg.duration, open_session)
        steps, rows = (a - b for a, b in zip(models.batch_counters(), (steps0, rows0)))
        looked, reused = (
            a - b for a, b in zip(models.prompt_counters(batching, max_batch), (looked0, reused0))
        )
    summary = {**summarise(samples, wall), **machine}
    summary["mean_batch"] = rows / steps if mode == "on" and steps else None
    # share of the prompt tokens looked up in the prompt cache whose prefill it saved
    summary["prompt_reused"] = reused / looked if looked else None
    return summary, samples


def speedups(runs: list[dict[str, Any]]) -> dict[str, dict[str, float | None]]:
    """Per target: on / off answered req/s and off / on p50 latency, means over rounds."""
    out = {}
    for target in dict.fromkeys(r["target"] for r in runs):

        def mean(mode: str, key: str, target: str = target) -> float | None:
            vals = [r[key] for r in runs if (r["target"], r["mode"]) == (target, mode)]
            vals = [v for v in vals if v is not None]
            return statistics.mean(vals) if vals else None

        rate = (mean("on", "throughput_req_s"), mean("off", "throughput_req_s"))
        p50 = (mean("off", "p50_latency_s"), mean("on", "p50_latency_s"))
        out[target] = {
            "req_s_on_over_off": rate[0] / rate[1] if rate[0] and rate[1] else None,
            "p50_off_over_on": p50[0] / p50[1] if p50[0] and p50[1] else None,
        }
    return out


def run(
    cfg: ServeLoadConfig, models: SharedModels | None = None, command: str | None = None
) -> dict[str, Any]:
    """Every (round, target, mode) run; writes results.json and the plot, returns the results."""
    import torch

    from benchmarks.decode import hardware

    cfg.check()
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    if models is None:
        prepare_serving_process()  # as rag.serve and ui.app at start-up
        log(PROG, f"loading {cfg.decoder} and the retriever of index {cfg.index}")
        models = SharedModels(cfg.rag_config())
        models.load(cfg.max_batch if "on" in cfg.mode_list() else None)
    runs: list[dict[str, Any]] = []
    series: dict[str, list[Sample]] = {}
    try:
        for r in range(1, cfg.rounds + 1):
            for target in cfg.targets():
                for mode in cfg.mode_list():
                    log(PROG, f"round {r}/{cfg.rounds}: {target}, batching {mode}")
                    summary, samples = run_one(cfg, models, target, mode)
                    log(
                        PROG,
                        f"  {summary['requests']} answered, {summary['errors']} errors, "
                        f"{summary['throughput_req_s']:.3f} req/s, "
                        f"p50 {fmt_s(summary['p50_latency_s'])}",
                    )
                    runs.append(
                        {"target": target, "mode": mode, "round": r, **summary,
                         "samples": sample_rows(samples)}
                    )  # fmt: skip
                    t0 = min((s.start for s in samples), default=0.0)  # rounds overlap
                    series.setdefault(f"{target} {mode}", []).extend(
                        replace(s, start=s.start - t0) for s in samples
                    )
    finally:
        models.close()
    result = {
        "command": command,
        "config": asdict(cfg),
        "engine": models.engine(),
        "hardware": hardware(torch.get_num_threads()),
        "runs": runs,
        "speedup": speedups(runs),
    }
    out = Path(cfg.out) if cfg.out else rag_home() / "benchmarks" / "serve_load"
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(result, indent=2))
    title = (
        f"serve_load ({result['engine']}): {cfg.sessions} sessions, {cfg.max_new_tokens} new tokens"
    )
    rates = {
        label: statistics.mean(
            r["throughput_req_s"] for r in runs if f"{r['target']} {r['mode']}" == label
        )
        for label in series
    }
    plot(series, out / "serve_load.png", title + ", rounds pooled", rates)
    result["out"] = str(out)
    return result


def markdown(result: dict[str, Any]) -> str:
    lines = [
        "| target | batching | round | requests | errors | req/s | p50 latency | p95 latency "
        "| p50 TTFT | mean batch | prompt reused | CPU s | load avg start → end |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in result["runs"]:
        batch = "1" if r["mode"] == "off" else fmt_num(r["mean_batch"], ".1f")
        lines.append(
            f"| {r['target']} | {r['mode']} | {r['round']} | {r['requests']} | {r['errors']} | "
            f"{r['throughput_req_s']:.3f} | {fmt_s(r['p50_latency_s'])} | "
            f"{fmt_s(r['p95_latency_s'])} | {fmt_s(r['p50_ttft_s'])} | {batch} | "
            f"{fmt_num(r.get('prompt_reused'), '.0%')} | "
            f"{r['cpu_s']:.0f} | {r['load_avg_1m_start']:.1f} → {r['load_avg_1m_end']:.1f} |"
        )
    for target, s in result["speedup"].items():
        rate, p50 = s["req_s_on_over_off"], s["p50_off_over_on"]
        if rate is not None:
            lines.append(
                f"\n{target}: batching on gives {rate:.2f}x the req/s of off, "
                f"p50 latency {p50 or float('nan'):.2f}x lower (means over rounds)"
            )
    return "\n".join(lines)


def build_parser() -> Any:
    parser = dataclass_parser(
        f"python -m {PROG}",
        __doc__,
        ServeLoadConfig,
        choices={"target": TARGETS, "retrieval": MODES},
    )
    parser.add_argument("--json", action="store_true", help="print the results as JSON on stdout")
    return parser


def main(argv: list[str] | None = None) -> int:
    def body(args: Any) -> int:
        as_json = vars(args).pop("json")
        cfg = ServeLoadConfig(**vars(args))
        cfg.check()  # before loading any model
        argv_used = sys.argv[1:] if argv is None else argv
        result = run(cfg, command=f"python -m {PROG} " + " ".join(argv_used))
        log(PROG, f"wrote {result['out']}/results.json")
        print(json.dumps(result, indent=2) if as_json else markdown(result))
        return 1 if any(r["errors"] for r in result["runs"]) else 0

    return run_cli(build_parser(), body, argv, quiet=True)


if __name__ == "__main__":
    sys.exit(main())
