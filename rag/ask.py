"""Ask one question from the command line.

    python -m rag.ask "how do I read a file line by line" --index pydocs [--k 5]
        [--mode dense|bm25|hybrid] [--decoder ALIAS|DIR] [--adapter DIR] [--json] [--stream]
        [--no-complete-citations] [--config rag.toml]

Prints the answer and its sources; ``--json`` prints ``Answer.to_dict()`` on stdout (logs go to
stderr); ``--stream`` prints the answer as it is decoded, then the sources. Settings come from
flags over ``rag.toml`` (see :mod:`rag.config`).
"""

from __future__ import annotations

import argparse
import json
import sys

from rag.config import ConfigError, add_config_args, config_from_args
from rag.types import Answer

CLI_FIELDS = (
    "index",
    "encoder",
    "decoder",
    "adapter",
    "k",
    "mode",
    "temperature",
    "top_p",
    "max_new_tokens",
    "max_context_tokens",
    "min_score",
    "prefix_cache",
    "complete_citations",
    "device",
)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m rag.ask", description=__doc__.split("\n\n")[0])
    p.add_argument("question", help="the question to answer")
    p.add_argument(
        "--config", default=None, help="TOML config file (default: ./rag.toml if present)"
    )
    p.add_argument("--json", action="store_true", help="print Answer.to_dict() as JSON on stdout")
    p.add_argument("--stream", action="store_true", help="print tokens as they are decoded")
    add_config_args(p, CLI_FIELDS)
    return p


def format_sources(answer: Answer) -> str:
    """Human-readable source list: ``[n] source › heading (score)``."""
    lines = []
    for c in answer.citations:
        where = " › ".join(c.heading_path)
        lines.append(
            f"[{c.number}] {c.source}" + (f" › {where}" if where else "") + f"  ({c.score:.3f})"
        )
    if answer.invalid_citations:
        nums = ", ".join(str(n) for n in answer.invalid_citations)
        lines.append(f"(dropped citation(s) naming no given passage: {nums})")
    if not lines and not answer.refused:
        lines.append("(the answer cites no passage)")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    from rag.pipeline import RAGPipeline

    cfg = config_from_args(args, args.config)
    pipe = RAGPipeline(cfg)
    if args.stream:
        answer = None
        for item in pipe.stream(args.question):
            if isinstance(item, Answer):
                answer = item
            elif not args.json:
                print(item, end="", flush=True)
        assert answer is not None
        if not args.json:
            print("\n")
    else:
        answer = pipe.answer(args.question)
    if args.json:
        print(json.dumps(answer.to_dict(), indent=2, ensure_ascii=False))
        return 0
    if not args.stream:
        print(answer.text + "\n")
    sources = format_sources(answer)
    if sources:
        print("Sources:\n" + sources)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return run(args)
    except (ConfigError, ValueError, LookupError, FileNotFoundError, RuntimeError) as e:
        print(f"rag.ask: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
