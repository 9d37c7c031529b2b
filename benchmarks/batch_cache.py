"""Decode-step time of the batch KV cache: transformers' ``DynamicLayer`` vs our ``AppendLayer``.

    python -m benchmarks.batch_cache --decoder smollm2 --rows 1,4,16 --prompt-tokens 700

The peer is transformers' own ``DynamicLayer`` (each step ``torch.cat``s the whole cache to add a
column); ours is :class:`rag.generate.kv_append.AppendLayer` (each step writes into spare columns).
One process, one model: a real grounded prompt (:func:`benchmarks.decode.build_prompt`) is
prefilled once; for every row count its cache is repeated to that many rows and ``--steps``
greedy decode steps are timed, alternating the two layers ``--repeats`` times (cat, append, cat,
append, ...) so a change in the machine's load hits both. It reports the median ms per step of
each, their ratio, and whether the two produced the same logits bit for bit. This isolates the
decode step the batched decoder runs; the serving path end to end is ``benchmarks.serve_load``.

Output: ``$RAG_HOME/benchmarks/batch_cache/`` (``results.json`` with config, hardware and every
timing; ``batch_cache.png``); a markdown table is printed.
"""

from __future__ import annotations

import copy
import os
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from benchmarks.cli import command, results_dir, save_result
from rag.cli.flags import config_parser, run_config_cli


@dataclass
class BatchCacheBenchConfig:
    """What to measure; every field is a ``--kebab-case`` flag."""

    decoder: str = "smollm2"  # decoder alias or folder
    rows: str = "1,4,16"  # comma-separated batch sizes (rows decoding together)
    prompt_tokens: int = 700  # each row's cached context (a grounded prompt of about this length)
    steps: int = 16  # decode steps per timed run
    repeats: int = 3  # timed runs per layer and row count (alternating); medians are reported
    threads: int = 2  # torch CPU threads
    precision: str = "auto"  # decoder weights: auto | fp32 | bf16 (as the product's auto)
    out: str | None = None  # output folder (default $RAG_HOME/benchmarks/batch_cache)


def log(msg: str) -> None:
    print(f"[batch_cache] {msg}", file=sys.stderr, flush=True)


def row_counts(spec: str) -> list[int]:
    """``--rows`` as distinct positive ints, in order."""
    try:
        rows = [int(r) for r in spec.split(",") if r.strip()]
    except ValueError:
        rows = []
    if not rows or min(rows) < 1 or len(set(rows)) != len(rows):
        raise ValueError(f"--rows: need distinct positive integers such as 1,4,16, got {spec!r}")
    return rows


def check(cfg: BatchCacheBenchConfig) -> None:
    """Refuse bad sizes before any model loads."""
    row_counts(cfg.rows)
    if cfg.prompt_tokens < 64 or cfg.steps < 2 or cfg.repeats < 1 or cfg.threads < 1:
        raise ValueError("need --prompt-tokens >= 64, --steps >= 2, --repeats >= 1, --threads >= 1")


def cpu() -> dict[str, Any]:
    """CPU model and the flags that decide float speed here (AVX512, bf16 units, AMX)."""
    from rag.models.precision import probe_key

    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        info = ""
    flags = next(
        (ln.split(":", 1)[1].split() for ln in info.splitlines() if ln.startswith("flags")), []
    )
    wanted = ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16", "amx_tile")
    return {
        "model": probe_key()["cpu"],
        "flags": [f for f in wanted if f in flags],
        "cores": os.cpu_count(),
    }


def decode_steps(model: Any, cache: Any, first: Any, steps: int) -> tuple[float, Any]:
    """Seconds for ``steps`` greedy one-token steps from ``cache`` (rows: ``first`` [B, 1]) and
    the logits of every step [B, steps, V]."""
    import torch

    ids, logits = first, []
    t0 = time.perf_counter()
    for _ in range(steps):
        out = model(input_ids=ids, cache=cache, use_cache=True)
        step = out["logits"][:, -1]
        logits.append(step)
        ids = step.argmax(-1, keepdim=True)
    return time.perf_counter() - t0, torch.stack(logits, dim=1)


def run(cfg: BatchCacheBenchConfig) -> dict[str, Any]:
    import torch
    from transformers import DynamicCache

    from benchmarks.decode import build_prompt
    from rag.generate.generator import Generator
    from rag.generate.kv_append import appending

    torch.set_num_threads(cfg.threads)
    rows = row_counts(cfg.rows)
    gen = Generator.load(cfg.decoder, device="cpu", precision=cfg.precision, batching=False)
    model = gen.model
    ids, _ = build_prompt(gen, cfg.prompt_tokens)
    log(f"{cfg.decoder} ({next(model.parameters()).dtype}), prompt {len(ids)} tokens")
    with torch.inference_mode():
        prompt = DynamicCache(config=model.config)
        out = model(input_ids=torch.tensor([ids[:-1]]), cache=prompt, use_cache=True)
        results = []
        for b in rows:
            times: dict[str, list[float]] = {"cat": [], "append": []}
            logits: dict[str, Any] = {}
            first = torch.full((b, 1), ids[-1])
            for _ in range(cfg.repeats):
                for kind in ("cat", "append"):
                    cache = copy.deepcopy(prompt)
                    if b > 1:
                        cache.batch_repeat_interleave(b)  # [b, H, len(ids) - 1, D]
                    if kind == "append":
                        appending(cache)
                    seconds, logits[kind] = decode_steps(model, cache, first, cfg.steps)
                    times[kind].append(seconds / cfg.steps)
            cat, app = statistics.median(times["cat"]), statistics.median(times["append"])
            results.append(
                {
                    "rows": b,
                    "cat_ms_per_step": cat * 1000,
                    "append_ms_per_step": app * 1000,
                    "speedup": cat / app,
                    "same_logits": bool(torch.equal(logits["cat"], logits["append"])),
                    "times_s": times,
                }
            )
            log(
                f"{b} rows: cat {cat * 1000:.0f} ms/step, append {app * 1000:.0f} ms/step "
                f"(load {os.getloadavg()[0]:.1f})"
            )
    del out
    return {
        "config": asdict(cfg),
        "hardware": {
            "cpu": cpu(),
            "torch": torch.__version__,
            "threads": cfg.threads,
            "load_avg_1m_start": None,
            "load_avg_1m_end": os.getloadavg()[0],
        },
        "prompt_tokens": len(ids),
        "dtype": str(next(model.parameters()).dtype).removeprefix("torch."),
        "results": results,
    }


def markdown(result: dict[str, Any]) -> str:
    lines = [
        "| rows | DynamicLayer (torch.cat) ms/step | AppendLayer ms/step | speed-up | same logits |",
        "|---|---|---|---|---|",
    ]
    for r in result["results"]:
        lines.append(
            f"| {r['rows']} | {r['cat_ms_per_step']:.0f} | {r['append_ms_per_step']:.0f} | "
            f"{r['speedup']:.2f}× | {'yes' if r['same_logits'] else 'NO'} |"
        )
    return "\n".join(lines)


def plot(result: dict[str, Any], path: Path) -> None:
    """ms per decode step by row count, both layers side by side."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    res = result["results"]
    x = range(len(res))
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.bar(
        [i - 0.2 for i in x], [r["cat_ms_per_step"] for r in res], 0.4, label="DynamicLayer (cat)"
    )
    ax.bar([i + 0.2 for i in x], [r["append_ms_per_step"] for r in res], 0.4, label="AppendLayer")
    ax.set_xticks(list(x), [str(r["rows"]) for r in res])
    ax.set_xlabel("rows decoding together")
    ax.set_ylabel("ms per decode step (median)")
    ax.set_title(
        f"{result['config']['decoder']} {result['dtype']}, {result['prompt_tokens']}-token context"
    )
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def build_parser() -> Any:
    return config_parser("python -m benchmarks.batch_cache", __doc__, BatchCacheBenchConfig)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()

    def measure(cfg: BatchCacheBenchConfig) -> dict:
        start = os.getloadavg()[0]
        result = run(cfg)
        result["hardware"]["load_avg_1m_start"] = start
        folder = results_dir(cfg.out, "batch_cache")
        save_result(result, folder, command("benchmarks.batch_cache", argv))
        plot(result, folder / "batch_cache.png")
        log(f"wrote {folder}/results.json and batch_cache.png")
        return result

    return run_config_cli(
        parser, BatchCacheBenchConfig, measure, argv, check=check, report=markdown
    )


if __name__ == "__main__":
    sys.exit(main())
