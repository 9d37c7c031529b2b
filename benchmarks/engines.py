"""Decoder engines side by side: torch (rag.generate.generator) and OpenVINO GenAI
(rag.generate.ov_engine) on the same prompts, in one run.

    python -m benchmarks.engines [--decoders qwen2.5-coder-0.5b,qwen2.5-coder-1.5b]
        [--engines torch,openvino] [--index docs] [--questions 4] [--max-new-tokens 48]

For each decoder and engine (loaded one at a time, each at the product's settings: the system
prefix and prompt caches on) it answers the same questions with three prompts built from the
index: the k-passage prompt (five whole passages, the answer path before excerpts), the
reader-first prompt (one passage and a short answer to phrase) and the evidence prompt (the
encoder's excerpts, the default answer path). Each prompt is decoded greedily once to warm up,
then timed on distinct questions, so no prompt reuses another's passages. Reported per
(decoder, engine, prompt): prompt tokens, prefill tokens/s (prompt tokens over time to first
token), decode tokens/s (after the first token), time to first token and full-answer latency
(medians), and how many greedy answers equal the torch engine's word for word.

Results, the command and the CPU go to ``$RAG_HOME/benchmarks/engines/results.json``; the
table is printed as markdown (docs/benchmarks.md).
"""

from __future__ import annotations

import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from benchmarks.cli import command, results_dir, save_result
from rag.cli.flags import config_parser, run_config_cli

PROG = "benchmarks.engines"
QUESTIONS = Path(__file__).parent / "data" / "docs_questions.txt"
PROMPTS = ("five passages", "reader-first", "excerpts")


@dataclass
class EngineBenchConfig:
    """What to compare; every field is a ``--kebab-case`` flag."""

    decoders: str = "qwen2.5-coder-0.5b,qwen2.5-coder-1.5b"  # comma-separated decoder aliases
    engines: str = "torch,openvino"  # comma-separated: torch, openvino
    index: str = "docs"  # index the prompts' passages come from (make setup builds docs)
    questions: int = 4  # distinct questions timed per prompt kind (after one warm-up)
    max_new_tokens: int = 48  # answer length cap (greedy; the same for every engine)
    out: str | None = None  # results folder (default $RAG_HOME/benchmarks/engines)


def log(msg: str) -> None:
    print(f"[engines] {msg}", file=sys.stderr, flush=True)


def check(cfg: EngineBenchConfig) -> None:
    bad = set(cfg.engines.split(",")) - {"torch", "openvino"}
    if bad:
        raise ValueError(f"--engines: unknown engine(s) {', '.join(sorted(bad))}")
    if cfg.questions < 1 or cfg.max_new_tokens < 2:
        raise ValueError("--questions must be >= 1 and --max-new-tokens >= 2")


def cpu_line() -> str:
    """The CPU's model name and the flags that decide bf16/int8 speed."""
    info = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    name = next((ln.split(":", 1)[1].strip() for ln in info.splitlines() if "model name" in ln), "")
    flags = next(
        (ln.split(":", 1)[1].split() for ln in info.splitlines() if ln.startswith("flags")), []
    )
    keep = [
        f
        for f in ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16", "amx_int8")
        if f in flags
    ]
    return f"{name} ({', '.join(keep)})"


def prompts(index: str, n: int, gen: Any) -> dict[str, list[list[dict[str, str]]]]:
    """The three prompts for ``n + 1`` questions of ``benchmarks/data/docs_questions.txt``."""
    from rag.answer.prompt import build_messages, build_span_messages
    from rag.config import RAGConfig
    from rag.pipeline import RAGPipeline

    qs = [q.strip() for q in QUESTIONS.read_text().splitlines() if q.strip()][: n + 1]
    pipe = RAGPipeline(RAGConfig.of(index=index, answerability_threshold=None), generator=gen)
    out: dict[str, list[list[dict[str, str]]]] = {p: [] for p in PROMPTS}
    for q in qs:
        prep = pipe.prepare(q)
        texts = [h.chunk.text for h in pipe.retrieve(q, k=5)]
        kept = gen.fit_passages(q, texts, 64)
        out["five passages"].append(build_messages(q, kept, gen.profile))
        out["reader-first"].append(build_span_messages(q, texts[0], " ".join(texts[0].split()[:4])))
        out["excerpts"].append(prep.messages)
    return out


def measure(gen: Any, batch: list[list[dict[str, str]]], max_new: int) -> tuple[dict, list[str]]:
    """Warm up on the first prompt, then time the rest; medians and the answers."""
    gen.generate(batch[0], max_new_tokens=max_new)
    rows, answers = [], []
    for messages in batch[1:]:
        stats: dict[str, Any] = {}
        answers.append(gen.generate(messages, max_new_tokens=max_new, stats=stats))
        rows.append(stats)
    med = statistics.median
    return {
        "prompt_tokens": med(r["prompt_tokens"] for r in rows),
        "new_tokens": med(r["new_tokens"] for r in rows),
        "prefill_tok_s": med(r["prompt_tokens"] / r["ttft_s"] for r in rows),
        "decode_tok_s": med(
            (r["new_tokens"] - 1) / max(r["total_s"] - r["ttft_s"], 1e-9) for r in rows
        ),
        "ttft_s": med(r["ttft_s"] for r in rows),
        "total_s": med(r["total_s"] for r in rows),
    }, answers


def load(decoder: str, engine: str) -> Any:
    from rag.generate.load import load_decoder
    from rag.generate.settings import GenerationSettings

    settings = GenerationSettings(decoder=decoder, engine=engine, batching=False)
    return load_decoder(settings, "auto", "none")


def run(cfg: EngineBenchConfig, argv: list[str] | None = None) -> dict[str, Any]:
    rows = []
    for decoder in cfg.decoders.split(","):
        reference: dict[str, list[str]] = {}
        for engine in cfg.engines.split(","):
            t0 = time.perf_counter()
            gen = load(decoder, engine)
            load_s = time.perf_counter() - t0
            log(f"{decoder} on {engine}: loaded in {load_s:.1f}s")
            batches = prompts(cfg.index, cfg.questions, gen)
            for kind in PROMPTS:
                stats, answers = measure(gen, batches[kind], cfg.max_new_tokens)
                ref = reference.setdefault(kind, answers)
                same = sum(a == b for a, b in zip(answers, ref))
                rows.append(
                    {
                        "decoder": decoder,
                        "engine": engine,
                        "prompt": kind,
                        "load_s": load_s,
                        **stats,
                        "same_as_torch": f"{same}/{len(answers)}",
                    }  # fmt: skip
                )
                log(f"  {kind}: {stats}")
            if hasattr(gen, "close"):
                gen.close()
            del gen
    result = {"config": asdict(cfg), "cpu": cpu_line(), "rows": rows}
    save_result(result, results_dir(cfg.out, "engines"), command(PROG, argv))
    return result


def markdown(result: dict[str, Any]) -> str:
    lines = [
        f"CPU: {result['cpu']}",
        "",
        "| decoder | engine | prompt | prompt tokens | prefill tok/s | decode tok/s | TTFT s "
        "| answer s | same as torch |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in result["rows"]:
        lines.append(
            f"| {r['decoder']} | {r['engine']} | {r['prompt']} | {r['prompt_tokens']:.0f} | "
            f"{r['prefill_tok_s']:.0f} | {r['decode_tok_s']:.1f} | {r['ttft_s']:.2f} | "
            f"{r['total_s']:.2f} | {r['same_as_torch']} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = config_parser(f"python -m {PROG}", __doc__, EngineBenchConfig)
    return run_config_cli(
        parser, EngineBenchConfig, lambda c: run(c, argv), argv, check=check, report=markdown
    )


if __name__ == "__main__":
    raise SystemExit(main())
