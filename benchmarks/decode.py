"""Decode benchmark: tokens/s with vs without the KV cache, and time to first token (TTFT) with
vs without the prefix cache.

    python -m benchmarks.decode [--decoder smollm2] [--prompt-tokens 512] [--new-tokens 128]
        [--no-cache-new-tokens N] [--repeats 3] [--threads 2] [--device cpu] [--json]

The prompt is a real grounded prompt (system turn + numbered passages from
``../shared/data/python-docs`` when present, else filler text) fitted to ``--prompt-tokens``.
Generation is forced to exactly ``--new-tokens`` tokens (``min_new_tokens``) so runs compare.
Without the KV cache every step re-encodes the whole sequence; ``--no-cache-new-tokens`` lets a
slow machine measure fewer such steps (tokens/s is then over that shorter run; say so when
reporting). Results, config and a bar plot go to ``$RAG_HOME/benchmarks/decode/``.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from benchmarks.cli import command
from rag.cli.flags import config_parser, run_config_cli
from rag.storage.paths import rag_home, shared_data_dir

PROG = "benchmarks.decode"
PARTS = ("kv", "nokv", "ttft")  # KV cache on, KV cache off, TTFT without/with the prefix cache
QUESTION = "How do I read a file line by line?"


@dataclass
class DecodeBenchConfig:
    """What to measure; every field is a ``--kebab-case`` flag."""

    decoder: str = "smollm2"  # decoder alias or folder
    prompt_tokens: int = 512  # grounded prompt length (system + passages + question)
    short_prompt_tokens: int = 128  # a second, short prompt for the TTFT comparison
    new_tokens: int = 128  # tokens generated per run (forced)
    # tokens for the no-KV-cache run, fewer on a slow machine (default: none = --new-tokens)
    no_cache_new_tokens: int | None = None
    repeats: int = 3  # runs per measurement; medians are reported
    threads: int = 2  # torch CPU threads
    device: str = "cpu"  # cpu | cuda | auto
    out: str | None = None  # output folder (default $RAG_HOME/benchmarks/decode)
    parts: str = "kv,nokv,ttft"  # which measurements to run: comma-separated subset of kv,nokv,ttft


def log(msg: str) -> None:
    print(f"[decode] {msg}", file=sys.stderr, flush=True)


def source_passages(n: int = 40) -> list[str]:
    """Paragraphs from the Python docs (or filler when the shared data is absent)."""
    data = shared_data_dir()
    docs = data / "python-docs" / "tutorial" if data else None
    paras: list[str] = []
    if docs and docs.is_dir():
        for path in sorted(docs.glob("*.rst.txt")):
            text = path.read_text(encoding="utf-8", errors="replace")
            paras += [p for p in text.split("\n\n") if len(p.split()) > 30]
            if len(paras) >= n:
                break
    if not paras:
        paras = [
            f"Paragraph {i}: files are read line by line with a for loop. " * 6 for i in range(n)
        ]
    return paras[:n]


def build_prompt(gen: Any, n_tokens: int) -> tuple[list[int], int]:
    """Prompt ids of at most ``n_tokens`` (passages fitted by the generator's own budget logic)."""
    from rag.answer.prompt import build_messages

    saved = gen.max_context_tokens
    gen.max_context_tokens = n_tokens + 1
    try:
        kept = gen.fit_passages(QUESTION, source_passages(), max_new_tokens=1)
    finally:
        gen.max_context_tokens = saved
    return gen.prompt_ids(build_messages(QUESTION, kept))


def timed(gen: Any, ids: list[int], prefix: int, repeats: int, **kw: Any) -> list[dict[str, float]]:
    runs = []
    for _ in range(repeats):
        stats: dict[str, float] = {}
        cpu = time.process_time()
        gen.generate_ids(ids, prefix, stats=stats, **kw)
        stats["cpu_s"] = time.process_time() - cpu  # robust to other jobs on a shared machine
        runs.append(stats)
    return runs


def decode_speed(runs: list[dict[str, float]]) -> dict[str, float]:
    """Median end-to-end tokens/s, decode-only tokens/s (after the first token) and TTFT."""
    total = [r["new_tokens"] / r["total_s"] for r in runs]
    decode = [(r["new_tokens"] - 1) / max(r["total_s"] - r["ttft_s"], 1e-9) for r in runs]
    return {
        "new_tokens": runs[0]["new_tokens"],
        "tokens_per_s": statistics.median(total),
        "decode_tokens_per_s": statistics.median(decode),
        "ttft_s": statistics.median(r["ttft_s"] for r in runs),
        "total_s": statistics.median(r["total_s"] for r in runs),
        "cpu_s": statistics.median(r["cpu_s"] for r in runs),
        "tokens_per_cpu_s": statistics.median(r["new_tokens"] / r["cpu_s"] for r in runs),
        "runs": len(runs),
    }


def ttft_pair(gen: Any, ids: list[int], prefix: int, repeats: int) -> dict[str, float]:
    """TTFT (prefill + first token) without and with the cached system prefix.

    Runs alternate (off, on, off, on, ...) so a change in machine load hits both sides alike;
    ``speedup`` is the median of the per-pair ratios.
    """
    gen.clear_prefix_cache()
    gen.generate_ids(ids, prefix, max_new_tokens=1, use_prefix_cache=True)  # warm the prefix
    off, on = [], []
    for _ in range(repeats):
        off += timed(gen, ids, prefix, 1, max_new_tokens=1, use_prefix_cache=False)
        on += timed(gen, ids, prefix, 1, max_new_tokens=1, use_prefix_cache=True)
    ratios = [a["ttft_s"] / b["ttft_s"] for a, b in zip(off, on, strict=True)]
    cpu_off = statistics.median(r["cpu_s"] for r in off)
    cpu_on = statistics.median(r["cpu_s"] for r in on)
    return {
        "prompt_tokens": len(ids),
        "prefix_tokens": prefix,
        "ttft_no_prefix_cache_s": statistics.median(r["ttft_s"] for r in off),
        "ttft_prefix_cache_s": statistics.median(r["ttft_s"] for r in on),
        "speedup": statistics.median(ratios),
        "cpu_no_prefix_cache_s": cpu_off,
        "cpu_prefix_cache_s": cpu_on,
        "cpu_speedup": cpu_off / cpu_on,
        "pairs": repeats,
    }


def run(cfg: DecodeBenchConfig) -> dict[str, Any]:
    import torch

    from rag.generate.generator import Generator

    torch.set_num_threads(cfg.threads)
    torch.manual_seed(0)
    t0 = time.perf_counter()
    gen = Generator.load(cfg.decoder, device=cfg.device, precision="fp32")
    log(f"loaded {cfg.decoder} in {time.perf_counter() - t0:.1f}s on {gen.device}")
    ids, prefix = build_prompt(gen, cfg.prompt_tokens)
    short_ids, short_prefix = build_prompt(gen, cfg.short_prompt_tokens)
    log(f"prompt {len(ids)} tokens (system prefix {prefix}); warm-up")
    gen.generate_ids(short_ids, short_prefix, max_new_tokens=2)

    parts = set(cfg.parts.split(","))
    result: dict[str, Any] = {"config": asdict(cfg), "hardware": hardware(cfg.threads)}
    if "kv" in parts:
        force = {"max_new_tokens": cfg.new_tokens, "min_new_tokens": cfg.new_tokens}
        log(f"KV cache on: {cfg.repeats} x {cfg.new_tokens} tokens")
        result["kv_cache"] = decode_speed(
            timed(gen, ids, prefix, cfg.repeats, use_prefix_cache=False, **force)
        )
    if "nokv" in parts:
        n_off = cfg.no_cache_new_tokens or cfg.new_tokens
        log(f"KV cache off: 1 x {n_off} tokens (re-encodes the sequence every step)")
        off = {"max_new_tokens": n_off, "min_new_tokens": n_off, "use_cache": False}
        result["no_kv_cache"] = decode_speed(timed(gen, ids, prefix, 1, **off))
    if "kv" in parts and "nokv" in parts:
        kv, no_kv = result["kv_cache"], result["no_kv_cache"]
        result["kv_speedup_tokens_per_s"] = kv["tokens_per_s"] / no_kv["tokens_per_s"]
    if "ttft" in parts:
        log("TTFT with vs without prefix cache (interleaved)")
        prompts = ((ids, prefix), (short_ids, short_prefix))
        result["ttft"] = [ttft_pair(gen, i, p, cfg.repeats * 2) for i, p in prompts]
    result["hardware"]["load_avg_1m_end"] = os.getloadavg()[0]
    return result


def hardware(threads: int) -> dict[str, Any]:
    import torch

    return {
        "cpu": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "torch_threads": threads,
        "torch": torch.__version__,
        "load_avg_1m": os.getloadavg()[0],
        "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
    }


def plot(result: dict[str, Any], path: Path) -> None:
    """Bar charts of whatever was measured: tokens/s with/without KV cache, TTFT pairs."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(9, 3.5))
    speeds = {
        label: result[key]["tokens_per_s"]
        for label, key in (("KV cache", "kv_cache"), ("no KV cache", "no_kv_cache"))
        if key in result
    }
    a.bar(list(speeds), list(speeds.values()))
    a.set_ylabel("tokens/s")
    a.set_title("decode speed")
    ttft = result.get("ttft", [])
    x = list(range(len(ttft)))
    b.bar(
        [i - 0.2 for i in x],
        [t["ttft_no_prefix_cache_s"] for t in ttft],
        0.4,
        label="no prefix cache",
    )
    b.bar([i + 0.2 for i in x], [t["ttft_prefix_cache_s"] for t in ttft], 0.4, label="prefix cache")
    b.set_xticks(x, [f"{t['prompt_tokens']} tok" for t in ttft])
    b.set_ylabel("seconds")
    b.set_title("time to first token")
    if ttft:
        b.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def markdown(result: dict[str, Any]) -> str:
    lines = ["| measurement | value |", "|---|---|"]
    for label, key in (("on", "kv_cache"), ("off", "no_kv_cache")):
        if key in result:
            r = result[key]
            lines.append(
                f"| tokens/s, KV cache {label} ({int(r['new_tokens'])} new): wall / per CPU-second "
                f"| {r['tokens_per_s']:.2f} / {r['tokens_per_cpu_s']:.2f} |"
            )
    if "kv_speedup_tokens_per_s" in result:
        kv, off = result["kv_cache"], result["no_kv_cache"]
        cpu = kv["tokens_per_cpu_s"] / off["tokens_per_cpu_s"]
        lines.append(
            f"| speed-up from the KV cache: wall / CPU time | "
            f"{result['kv_speedup_tokens_per_s']:.1f}x / {cpu:.1f}x |"
        )
    for t in result.get("ttft", []):
        lines.append(
            f"| TTFT, {t['prompt_tokens']}-token prompt: no prefix cache / prefix cache "
            f"({t['prefix_tokens']} cached) | {t['ttft_no_prefix_cache_s']:.3f} s / "
            f"{t['ttft_prefix_cache_s']:.3f} s ({t['speedup']:.2f}x); CPU "
            f"{t['cpu_no_prefix_cache_s']:.2f} s / {t['cpu_prefix_cache_s']:.2f} s "
            f"({t['cpu_speedup']:.2f}x) |"
        )
    return "\n".join(lines)


def check(cfg: DecodeBenchConfig) -> None:
    """Refuse a run that cannot measure what it is asked (exit 2, rag.cli), before loading."""
    for name, low in (("prompt_tokens", 64), ("short_prompt_tokens", 1), ("new_tokens", 2),
                      ("repeats", 1), ("threads", 1)):  # fmt: skip
        if getattr(cfg, name) < low:
            raise ValueError(
                f"--{name.replace('_', '-')} must be >= {low}, not {getattr(cfg, name)}"
            )
    if cfg.no_cache_new_tokens is not None and cfg.no_cache_new_tokens < 1:
        raise ValueError(
            f"--no-cache-new-tokens must be >= 1 or none, not {cfg.no_cache_new_tokens}"
        )
    parts = cfg.parts.split(",")
    if set(parts) - set(PARTS):
        raise ValueError(
            f"--parts takes a comma-separated subset of {','.join(PARTS)}, not {cfg.parts!r}"
        )


def build_parser() -> Any:
    return config_parser(f"python -m {PROG}", __doc__, DecodeBenchConfig)


def main(argv: list[str] | None = None) -> int:
    def measure(cfg: DecodeBenchConfig) -> dict:
        result = run(cfg)
        out = Path(cfg.out) if cfg.out else rag_home() / "benchmarks" / "decode"
        out.mkdir(parents=True, exist_ok=True)
        result["command"] = command(PROG, argv)
        name = (
            "results.json"
            if cfg.parts == "kv,nokv,ttft"
            else f"results-{cfg.parts.replace(',', '-')}.json"
        )
        (out / name).write_text(json.dumps(result, indent=2))
        (out / "run.json").write_text(
            json.dumps({"config": asdict(cfg), "command": result["command"]}, indent=2)
        )
        plot(result, out / "decode.png")
        log(f"wrote {out}/{name} and decode.png")
        return result

    return run_config_cli(
        build_parser(), DecodeBenchConfig, measure, argv, check=check, report=markdown
    )


if __name__ == "__main__":
    sys.exit(main())
