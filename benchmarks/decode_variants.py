"""Decode speed of the decoder speed options side by side: tokens/s, TTFT, greedy agreement.

    python -m benchmarks.decode_variants --decoder smollm2 --threads 2 \\
        [--variants eager,int8,compile,static,compile+static] [--new-tokens 128] [--repeats 5]

Each variant is a ``+``-joined set of ``int8``, ``compile``, ``static`` (the options of
:mod:`rag.generate.speed`) and optionally ``fp32`` / ``bf16`` (the float weights' precision,
:mod:`rag.models.precision`; otherwise ``--precision``, whose ``auto`` is what the product runs: bf16 on
a CPU with AMX; ``int8`` is ``--decoder-precision int8``: int8 decode layers over those
weights); ``eager`` is none.
The first variant is the baseline. Every variant is loaded once, as its own
:class:`rag.generate.generator.Generator` (prefix cache on, batching off: one stream), then:

- a first run of ``--new-tokens`` forced tokens, timed on its own: it holds ``torch.compile``'s
  compile time, which is reported apart and kept out of the speed figures; its token ids (and a
  second, short prompt's) are compared with the baseline's: ``greedy_match`` and the index of
  the first differing token;
- ``--repeats`` timed runs per variant, alternating (v1, v2, ..., v1, v2, ...) so a change in the
  machine's load hits every variant alike. Medians are reported: decode tokens/s (after the
  first token), end-to-end tokens/s, TTFT, and tokens per CPU-second of the process (the figure
  that does not depend on other jobs on a shared machine).

The prompt is the grounded prompt of :mod:`benchmarks.decode` (its prompt building and hardware
helpers are reused). Results, config, hardware and a bar plot go to
``$RAG_HOME/benchmarks/decode_variants/<decoder>-<threads>t/`` (``results.json``,
``decode_variants.png``); a markdown table is printed.
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from benchmarks.cli import command
from benchmarks.decode import build_prompt, decode_speed, hardware, timed
from rag.cli.flags import config_parser, run_config_cli
from rag.generate.speed import DecodeSpeed
from rag.models.precision import FLOAT_PRECISIONS
from rag.storage.paths import rag_home

DEFAULT_VARIANTS = "eager,int8,compile,static,compile+static"
GOAL = 25.0  # tokens/s for one stream on 2 cores (issue 12, item 3)


@dataclass
class VariantsBenchConfig:
    """What to measure; every field is a ``--kebab-case`` flag."""

    decoder: str = "smollm2"  # decoder alias or folder
    variants: str = DEFAULT_VARIANTS  # comma-separated; each +-joined int8|compile|static|fp32|bf16
    precision: str = "auto"  # float weights of variants that name none: auto | fp32 | bf16
    prompt_tokens: int = 512  # grounded prompt length (system + passages + question)
    short_prompt_tokens: int = 128  # a second prompt, for the greedy comparison only
    new_tokens: int = 128  # tokens generated per run (forced)
    repeats: int = 5  # timed runs per variant (alternating); medians are reported
    threads: int = 2  # torch CPU threads
    device: str = "cpu"  # cpu | cuda | auto
    out: str | None = None  # output folder (default $RAG_HOME/benchmarks/decode_variants/...)


def log(msg: str) -> None:
    print(f"[decode_variants] {msg}", file=sys.stderr, flush=True)


def parse_variant(spec: str, precision: str) -> tuple[DecodeSpeed, str]:
    """(speed options, float precision) for a spec such as ``int8+static`` or ``bf16+compile``."""
    tokens = [t for t in spec.strip().split("+") if t and t != "eager"]
    unknown = set(tokens) - {"int8", "compile", "static", *FLOAT_PRECISIONS}
    if unknown:
        raise ValueError(
            f"--variants: unknown option {sorted(unknown)[0]!r} in {spec!r} "
            f"(use eager, int8, compile, static, fp32, bf16 joined by +)"
        )
    named = [t for t in tokens if t in FLOAT_PRECISIONS]
    speed = DecodeSpeed(
        int8="int8" in tokens,
        compile="compile" in tokens,
        cache="static" if "static" in tokens else "dynamic",
    )
    return speed, named[-1] if named else precision


def first_difference(a: list[int], b: list[int]) -> int | None:
    """Index of the first token where ``a`` and ``b`` differ; None when equal."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def run(cfg: VariantsBenchConfig) -> dict[str, Any]:
    import torch

    from rag.generate.generator import Generator

    torch.set_num_threads(cfg.threads)
    specs = [s.strip() for s in cfg.variants.split(",") if s.strip()]
    if not specs or len(set(specs)) != len(specs):
        raise ValueError(f"--variants: need distinct variants, got {cfg.variants!r}")
    parsed = [parse_variant(s, cfg.precision) for s in specs]  # all checked before any loading
    gens: dict[str, Any] = {}
    rows: dict[str, dict[str, Any]] = {}
    for spec, (speed, precision) in zip(specs, parsed):
        torch.manual_seed(0)
        t0 = time.perf_counter()
        gens[spec] = Generator.load(
            cfg.decoder, device=cfg.device, precision=precision, speed=speed
        )
        rows[spec] = {
            "variant": spec,
            "options": asdict(speed),
            "dtype": str(next(gens[spec].model.parameters()).dtype).removeprefix("torch."),
            "load_s": time.perf_counter() - t0,
        }
        log(f"loaded {spec} ({rows[spec]['dtype']}) in {rows[spec]['load_s']:.1f}s")
    base = gens[specs[0]]
    ids, prefix = build_prompt(base, cfg.prompt_tokens)
    short_ids, short_prefix = build_prompt(base, cfg.short_prompt_tokens)
    force = {"max_new_tokens": cfg.new_tokens, "min_new_tokens": cfg.new_tokens}
    log(f"prompt {len(ids)} tokens (system prefix {prefix}), {cfg.new_tokens} new tokens")

    outputs: dict[str, tuple[list[int], list[int]]] = {}
    for spec in specs:  # first runs: compile time, and the token ids to compare
        stats: dict[str, float] = {}
        t0 = time.perf_counter()
        main = gens[spec].generate_ids(ids, prefix, stats=stats, **force)
        first_s = time.perf_counter() - t0
        short = gens[spec].generate_ids(short_ids, short_prefix, max_new_tokens=cfg.new_tokens)
        outputs[spec] = (main, short)
        rows[spec].update(first_run_s=first_s, first_run_ttft_s=stats["ttft_s"])
        log(f"first run {spec}: {first_s:.1f}s (includes any compile)")
    for spec in specs:
        diffs = [first_difference(o, b) for o, b in zip(outputs[spec], outputs[specs[0]])]
        rows[spec].update(
            greedy_match=all(d is None for d in diffs),
            first_difference=diffs[0],
            first_difference_short=diffs[1],
        )

    runs: dict[str, list[dict[str, float]]] = {s: [] for s in specs}
    for r in range(cfg.repeats):
        for spec in specs:  # alternate: every repeat runs each variant once
            runs[spec] += timed(gens[spec], ids, prefix, 1, **force)
        log(f"repeat {r + 1}/{cfg.repeats} done (load {os.getloadavg()[0]:.1f})")
    for spec in specs:
        rows[spec].update(decode_speed(runs[spec]))
        rows[spec]["compile_s"] = max(0.0, rows[spec]["first_run_s"] - rows[spec]["total_s"])
    return {
        "config": asdict(cfg),
        "hardware": {**hardware(cfg.threads), "load_avg_1m_end": os.getloadavg()[0]},
        "prompt_tokens": len(ids),
        "prefix_tokens": prefix,
        "short_prompt_tokens": len(short_ids),
        "baseline": specs[0],
        "variants": [rows[s] for s in specs],
    }


def markdown(result: dict[str, Any]) -> str:
    """One row per variant; speed-ups are against the baseline (the first variant)."""
    rows = result["variants"]
    base = rows[0]
    lines = [
        "| variant | dtype | decode tokens/s | × baseline | tokens / CPU-s | TTFT s "
        "| first run s (compile) | greedy = baseline |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if r["greedy_match"]:
            match = "yes"
        else:
            first = [
                d for d in (r["first_difference"], r["first_difference_short"]) if d is not None
            ]
            match = f"no (from token {min(first)})"
        lines.append(
            f"| {r['variant']} | {r['dtype']} | {r['decode_tokens_per_s']:.1f} | "
            f"{r['decode_tokens_per_s'] / base['decode_tokens_per_s']:.2f} | "
            f"{r['tokens_per_cpu_s']:.1f} | {r['ttft_s']:.2f} | "
            f"{r['first_run_s']:.1f} ({r['compile_s']:.1f}) | {match} |"
        )
    return "\n".join(lines)


def plot(result: dict[str, Any], path: Path) -> None:
    """Decode tokens/s (with the goal line) and TTFT per variant."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["variants"]
    names = [r["variant"] for r in rows]
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.8))
    a.bar(names, [r["decode_tokens_per_s"] for r in rows])
    a.axhline(GOAL, color="k", linestyle="--", linewidth=1, label=f"goal {GOAL:.0f} tokens/s")
    a.set_ylabel("decode tokens/s (median)")
    a.legend()
    b.bar(names, [r["ttft_s"] for r in rows], color="tab:orange")
    b.set_ylabel("TTFT s (median)")
    cfg = result["config"]
    fig.suptitle(
        f"{cfg['decoder']}, {cfg['threads']} thread(s), {result['prompt_tokens']}-token prompt"
    )
    for ax in (a, b):
        ax.tick_params(axis="x", rotation=30)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def check(cfg: VariantsBenchConfig) -> None:
    """Refuse sizes too small to measure, before any model loads."""
    if cfg.prompt_tokens < 64 or cfg.new_tokens < 2 or cfg.repeats < 1 or cfg.threads < 1:
        raise ValueError("need --prompt-tokens >= 64, --new-tokens >= 2, --repeats >= 1")


def main(argv: list[str] | None = None) -> int:
    parser = config_parser("python -m benchmarks.decode_variants", __doc__, VariantsBenchConfig)

    def measure(cfg: VariantsBenchConfig) -> dict:
        result = run(cfg)
        name = f"{Path(cfg.decoder).name}-{cfg.threads}t"
        out = Path(cfg.out) if cfg.out else rag_home() / "benchmarks" / "decode_variants" / name
        out.mkdir(parents=True, exist_ok=True)
        result["command"] = command("benchmarks.decode_variants", argv)
        (out / "results.json").write_text(json.dumps(result, indent=2))
        plot(result, out / "decode_variants.png")
        log(f"wrote {out}/results.json and decode_variants.png")
        return result

    return run_config_cli(parser, VariantsBenchConfig, measure, argv, check=check, report=markdown)


if __name__ == "__main__":
    sys.exit(main())
