"""Ask one question from the command line.

    python -m rag.ask "how do I read a file line by line" --index pydocs [--k 5]
        [--index-dir PATH] [--mode dense|bm25|hybrid] [--decoder ALIAS|DIR] [--adapter DIR]
        [--rerank auto|none|DIR] [--rerank-depth N] [--rerank-weight W]
        [--json] [--stream] [--no-complete-citations] [--config rag.toml]

Prints the answer and its sources (paths relative to the ingested folder) and the reranker that
ordered them (``--rerank auto``, the default: the trained ``minilm-rerank`` when present, see
:func:`rag.retrieval.rerank.resolve_reranker`); ``--json`` prints
``Answer.to_dict()`` on stdout (logs go to stderr); ``--stream`` prints the answer as it is
decoded, then the sources. Settings come from flags over ``rag.toml`` (see :mod:`rag.config`).
Any failure is one line on stderr; exit status 2 for a bad flag, setting, name or path, 1 for a
failure while answering (see :mod:`rag.cli`).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from rag.cli import OneLineParser, run_cli
from rag.config import RAGConfig, add_config_args, check_models, config_from_args
from rag.storage.paths import check_index_name, printable
from rag.types import Answer, page_label

PROG = "rag.ask"

# The settings rag.ask has no flag for, and why (tests/test_config_flags.py): none, every
# setting of every section is a flag.
EXCLUDED: dict[str, str] = {}


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="python -m rag.ask", description=__doc__.split("\n\n")[0])
    p.add_argument("question", help="the question to answer")
    p.add_argument(
        "--config", default=None, help="TOML config file (default: ./rag.toml if present)"
    )
    p.add_argument("--json", action="store_true", help="print Answer.to_dict() as JSON on stdout")
    p.add_argument("--stream", action="store_true", help="print tokens as they are decoded")
    add_config_args(p, EXCLUDED)
    p.add_argument(
        "--index-dir",
        default=None,
        metavar="PATH",
        help="an index folder elsewhere, instead of --index (default: none)",
    )
    return p


def open_retriever(args: argparse.Namespace, cfg: RAGConfig) -> Any:
    """The retriever for ``--index-dir`` (an explicit folder), opened as the pipeline opens a
    named index (:func:`rag.pipeline.open_retriever`), else None: the pipeline opens the index
    named by ``cfg.index``, which must be a plain name (checked here, before any model
    loads)."""
    if args.index_dir is None:
        check_index_name(cfg.index)
        return None
    if getattr(args, "index", None) is not None:
        raise ValueError("give --index NAME or --index-dir PATH, not both")
    from rag.pipeline import open_retriever as open_index

    return open_index(cfg, Path(args.index_dir))  # the settings a named index gets


CLOSEST_SHOWN = 3  # passages listed under a refusal


def _located(path: str, heading_path: Any, page: int = 0) -> str:
    """``path › heading › path``, then ``, p. N`` for a PDF's page, the path printable (a file
    name cannot forge a line)."""
    where = " › ".join(heading_path)
    return printable(path) + (f" › {where}" if where else "") + page_label(page)


def format_sources(answer: Answer) -> str:
    """Human-readable source list: ``[n] path › heading (score)``, the path relative to the
    ingested folder (control characters escaped, :func:`rag.storage.paths.printable`); under a
    refusal, the :data:`CLOSEST_SHOWN` best passages retrieved, unnumbered."""
    lines = []
    for c in answer.citations:
        where = _located(c.display_path, c.heading_path, c.page)
        lines.append(f"[{c.number}] {where}  ({c.score:.3f})")
    if answer.invalid_citations:
        nums = ", ".join(str(n) for n in answer.invalid_citations)
        lines.append(f"(dropped citation(s) naming no given passage: {nums})")
    if not lines and not answer.refused:
        lines.append("(the answer cites no passage)")
    if answer.refused and answer.passages:
        # what was found, so a question asked in other words than the documents' can be found
        # again (the UI shows these passages too); none is cited: none was judged to answer
        lines.append("(none judged to answer; the closest passages found:)")
        for hit in answer.passages[:CLOSEST_SHOWN]:
            lines.append(
                f"- {_located(hit.chunk.display_path, hit.chunk.heading_path, hit.chunk.page)}"
            )
    if answer.reranker and answer.passages:
        lines.append(f"(passages reranked by {answer.reranker})")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    from rag.pipeline import RAGPipeline

    cfg = config_from_args(args, args.config)
    check_models(cfg)
    retriever = open_retriever(args, cfg)
    pipe = RAGPipeline(cfg) if retriever is None else RAGPipeline(cfg, retriever=retriever)
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
    if answer.answer_span is not None and answer.answer_span.origin != "decoder":
        # the reader's span; a decoder's short answer is the reply's own last line already
        print(f"Short answer: {answer.answer_span.text} [{answer.answer_span.number}]")
    if not args.stream:
        print(answer.text + "\n")
    sources = format_sources(answer)
    if sources:
        print("Sources:\n" + sources)
    if answer.query and answer.query != args.question.strip():  # typos corrected, a follow-up
        print(f"(searched for: {printable(answer.query)})")
    return 0


def main(argv: list[str] | None = None) -> int:
    return run_cli(build_parser(), run, argv, quiet=True)


if __name__ == "__main__":
    sys.exit(main())
