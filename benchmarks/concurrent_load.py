"""Concurrent decoding load: N sessions for T seconds on one Generator, batching off vs on.

    python -m benchmarks.concurrent_load [--decoder smollm2] [--adapter none] [--sessions 16] [--duration 60]
        [--max-new-tokens 16] [--max-batch 8] [--modes off,on] [--rounds 1] [--threads 2]
        [--device cpu] [--precision fp32] [--json]

Only the decoder is measured (no retrieval, no UI): each session streams answers to grounded
prompts (system turn + passages from ``../shared/data/python-docs`` when present, else filler;
a different question and passage count per session, so prompt lengths differ) through
``Generator.stream``, the path the UI and the API use, in a loop until ``--duration`` seconds
have passed; requests in flight then finish and are counted (as in ``benchmarks.ui_load``).
Mode ``off`` is today's serving (one ``model.generate`` at a time under the decode lock); ``on``
is ``Generator(batching=True, max_batch=...)`` (rag.generate.batching) over the *same* model object,
prompts and settings. Rounds alternate the modes (off, on, off, on, ...) so a change in machine
load hits both. Greedy decoding; each mode's first answer per prompt is kept and the fraction of
prompts answered identically in both modes is reported (float32 should give 1.0; bf16 may not).

Reports per mode: requests, errors, req/s, p50/p95/max latency, p50 time to first token, the
mean batch size (on), CPU seconds of this process, and the 1-minute load average before and
after; ``results.json`` goes to ``$RAG_HOME/benchmarks/concurrent_load/``. On a shared machine
run it alone (``nice`` only lowers its priority; it does not stop others slowing it).
"""

from __future__ import annotations

import statistics
import sys
import time
from dataclasses import asdict, dataclass
from typing import Any

from benchmarks.cli import command, results_dir, save_result
from benchmarks.decode import hardware, source_passages
from benchmarks.loadgen import fmt_s, machine_counters, run_sessions, summarise
from rag.cli.flags import config_parser, run_config_cli

PROG = "benchmarks.concurrent_load"
MODES = ("off", "on")  # batching off (one generate at a time) and on (rag.generate.batching)
QUESTIONS = [
    "How do I read a file line by line?",
    "What does the with statement do?",
    "How do I write a list comprehension?",
    "What is the difference between a list and a tuple?",
    "How do I define a function with default arguments?",
    "How are exceptions handled?",
]


@dataclass
class LoadConfig:
    """One run; every field is a ``--kebab-case`` flag."""

    decoder: str = "smollm2"  # decoder alias or folder
    adapter: str = "none"  # LoRA adapter: none | auto | folder
    sessions: int = 16  # concurrent sessions (threads)
    duration: float = 60.0  # seconds during which sessions start new requests, per mode
    max_new_tokens: int = 16  # answer length cap per request (as benchmarks.ui_load)
    max_batch: int = 8  # rows per step with batching on
    modes: str = "off,on"  # batching modes to run: comma-separated subset of off,on
    rounds: int = 1  # times each mode runs, alternating
    prompts_per_session: int = 3  # distinct prompts a session cycles through
    threads: int = 2  # torch CPU threads
    device: str = "cpu"  # cpu | cuda | auto
    precision: str = "fp32"  # decoder weights (rag.models.precision): fp32 | bf16 | int8 | auto
    out: str | None = None  # output folder (default $RAG_HOME/benchmarks/concurrent_load)


def log(msg: str) -> None:
    print(f"[concurrent_load] {msg}", file=sys.stderr, flush=True)


def mode_list(cfg: LoadConfig) -> list[str]:
    return [m.strip() for m in cfg.modes.split(",") if m.strip()]


def check(cfg: LoadConfig) -> None:
    """Refuse a run that could not measure anything (exit 2, rag.cli), before loading."""
    modes = mode_list(cfg)
    if not modes or set(modes) - set(MODES) or len(set(modes)) < len(modes):
        raise ValueError(f"--modes takes off and/or on, comma-separated, not {cfg.modes!r}")
    for name in ("sessions", "max_new_tokens", "max_batch", "rounds", "prompts_per_session",
                 "threads"):  # fmt: skip
        if getattr(cfg, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1, not {getattr(cfg, name)}")
    if cfg.duration <= 0:
        raise ValueError(f"--duration must be > 0, not {cfg.duration}")


def build_prompts(gen: Any, cfg: LoadConfig) -> list[list[list[dict[str, str]]]]:
    """``prompts[session][j]``: chat messages with 1-4 passages, fitted to the context budget."""
    paras = source_passages()
    out = []
    for s in range(cfg.sessions):
        mine = []
        for j in range(cfg.prompts_per_session):
            k = s * cfg.prompts_per_session + j
            question = QUESTIONS[k % len(QUESTIONS)]
            picked = [paras[(k + i) % len(paras)] for i in range(1 + k % 4)]
            kept = gen.fit_passages(question, picked, max_new_tokens=cfg.max_new_tokens)
            mine.append(gen.messages(question, kept))
        out.append(mine)
    return out


class DecoderSession:
    """A session of :func:`benchmarks.loadgen.run_sessions` that streams its prompts straight
    from ``gen``, keeping each prompt's first answer for the agreement check."""

    def __init__(
        self, gen: Any, prompts: list[Any], cfg: LoadConfig, s: int, answers: dict
    ) -> None:
        self.gen, self.prompts, self.cfg, self.s, self.answers = gen, prompts, cfg, s, answers

    def ask(self, j: int) -> float | None:
        j %= len(self.prompts)
        stats: dict[str, float] = {}
        text = "".join(
            self.gen.stream(self.prompts[j], max_new_tokens=self.cfg.max_new_tokens, stats=stats)
        )
        self.answers.setdefault(f"{self.s}/{j}", text)  # one writer per key: no lock needed
        return stats.get("ttft_s")

    def close(self) -> None:
        pass


def run_mode(gen: Any, prompts: list[list[Any]], cfg: LoadConfig) -> dict[str, Any]:
    """All sessions against ``gen`` for ``cfg.duration`` seconds (benchmarks.loadgen)."""
    answers: dict[str, str] = {}
    batcher = getattr(gen, "batcher", None)
    steps0 = (batcher.steps, batcher.row_steps) if batcher else (0, 0)
    with machine_counters() as machine:
        samples, wall = run_sessions(
            cfg.sessions, cfg.duration, lambda s: DecoderSession(gen, prompts[s], cfg, s, answers)
        )
    out: dict[str, Any] = {**summarise(samples, wall), **machine}
    if batcher:
        steps, rows = batcher.steps - steps0[0], batcher.row_steps - steps0[1]
        out.update(steps=steps, mean_batch=rows / steps if steps else 0.0)
    out["answers"] = answers
    return out


def run(cfg: LoadConfig) -> dict[str, Any]:
    import torch

    from rag.generate.generator import Generator

    torch.set_num_threads(cfg.threads)
    torch.manual_seed(0)
    t0 = time.perf_counter()
    plain = Generator.load(
        cfg.decoder, adapter=cfg.adapter, device=cfg.device, precision=cfg.precision
    )
    log(f"loaded {cfg.decoder} in {time.perf_counter() - t0:.1f}s on {plain.device}")
    batched = Generator(
        plain.model,
        plain.tokenizer,
        plain.device,
        profile=plain.profile,
        batching=True,
        max_batch=cfg.max_batch,
    )
    gens = {"off": plain, "on": batched}
    modes = mode_list(cfg)
    if "on" in modes and batched.batcher is None:
        raise ValueError(f"{cfg.decoder}: its cache layers do not support batched decoding")
    prompts = build_prompts(plain, cfg)
    sizes = [len(plain.prompt_ids(p)[0]) for s in prompts for p in s]
    log(f"{len(sizes)} prompts, {min(sizes)}-{max(sizes)} tokens; warm-up")
    for mode in modes:
        "".join(gens[mode].stream(prompts[0][0], max_new_tokens=2))
    result: dict[str, Any] = {
        "config": asdict(cfg),
        "hardware": hardware(cfg.threads),
        "prompt_tokens": {"min": min(sizes), "max": max(sizes), "mean": statistics.mean(sizes)},
        "runs": [],
    }
    for r in range(cfg.rounds):
        for mode in modes:
            log(f"round {r + 1}/{cfg.rounds}: batching {mode}, {cfg.sessions} sessions")
            res = run_mode(gens[mode], prompts, cfg)
            log(
                f"  {res['requests']} requests, {res['throughput_req_s']:.3f} req/s, "
                f"p50 {res['p50_latency_s'] or 0:.2f} s, load {res['load_avg_1m_end']:.1f}"
            )
            result["runs"].append({"mode": mode, "round": r + 1, **res})
    if batched.batcher is not None:
        batched.batcher.close()
    result["agreement"] = agreement(result["runs"])
    for run_ in result["runs"]:
        run_.pop("answers")
    return result


def agreement(runs: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Of the prompts answered in both modes, the fraction answered with the same text."""
    first: dict[str, dict[str, str]] = {}
    for r in runs:
        for key, text in r["answers"].items():
            first.setdefault(r["mode"], {}).setdefault(key, text)
    if len(first) < 2:
        return None
    both = sorted(set(first["off"]) & set(first["on"]))
    same = sum(first["off"][k] == first["on"][k] for k in both)
    return {"prompts": len(both), "same": same, "fraction": same / len(both) if both else None}


def markdown(result: dict[str, Any]) -> str:
    lines = [
        "| batching | round | requests | errors | req/s | p50 latency | p95 latency | "
        "p50 TTFT | mean batch | load avg start → end |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]

    for r in result["runs"]:
        mean = f"{r['mean_batch']:.1f}" if "mean_batch" in r else "1"
        lines.append(
            f"| {r['mode']} | {r['round']} | {r['requests']} | {r['errors']} | "
            f"{r['throughput_req_s']:.3f} | {fmt_s(r['p50_latency_s'])} | {fmt_s(r['p95_latency_s'])} | "
            f"{fmt_s(r['p50_ttft_s'])} | {mean} | "
            f"{r['load_avg_1m_start']:.1f} → {r['load_avg_1m_end']:.1f} |"
        )
    if agree := result.get("agreement"):
        lines.append(f"\nsame greedy answer in both modes: {agree['same']}/{agree['prompts']}")
    return "\n".join(lines)


def build_parser() -> Any:
    return config_parser(f"python -m {PROG}", __doc__, LoadConfig)


def main(argv: list[str] | None = None) -> int:
    def measure(cfg: LoadConfig) -> dict:
        result = run(cfg)
        out = results_dir(cfg.out, "concurrent_load")
        log(f"wrote {save_result(result, out, command(PROG, argv))}")
        return result

    return run_config_cli(build_parser(), LoadConfig, measure, argv, check=check, report=markdown)


if __name__ == "__main__":
    sys.exit(main())
