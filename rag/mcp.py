"""The index over the Model Context Protocol, for the assistants and editors that speak it.

    python -m rag.mcp --index docs                                   # stdio (what clients launch)
    RAG_API_KEY=secret python -m rag.mcp --index docs --transport http --port 8765

Built on the official ``mcp`` SDK's :class:`mcp.server.mcpserver.MCPServer`:

- tool ``search(query, k=5, where=[])``: passages with their path (relative to the ingested
  folder), heading path, score and text, from the same :class:`~rag.retrieval.retriever.Retriever`
  as ``rag.search`` (``where``: a document filter, :mod:`rag.retrieval.filters`), and the
  ``query`` searched (its typos corrected as ``ask`` corrects a question's:
  :mod:`rag.retrieval.spelling`);
- tool ``ask(question, where=[])``: the grounded answer of :class:`rag.pipeline.RAGPipeline`
  with its cited sources and the reader's answer span, as ``rag.serve`` returns them;
- the index's documents as resources ``rag://documents/<path>``: their text as the index holds
  it (the chunks stitched back in order), listed from the live generation on every request, so
  an ingest or a removal shows at once (a document is also found by the name it had while
  another folder held one of the same relative path: :func:`rag.ingest.manage.resolve_documents`).

A bad argument (``k`` out of range, an unreadable filter, an empty question) is the tool's
error result, and an unknown resource an MCP error; the server goes on. stdio by default (its
stdout is the protocol: every log goes to stderr); ``--transport http`` serves streamable HTTP
on 127.0.0.1 at ``/mcp`` with the same API-key rule as ``rag.serve`` (``--api-key`` or
``$RAG_API_KEY``: then ``Authorization: Bearer KEY`` is required, checked in constant time
before the body is read; another ``--host`` without a key is warned about). Registering it in a
client: README.md, docs/serving.md.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Annotated, Any
from urllib.parse import quote, unquote

import anyio
from pydantic import Field

from rag.cli import OneLineParser, one_line, run_cli
from rag.cli.flags import add_dataclass_args
from rag.cli.flags import config_from_args as options_from_args
from rag.config import RAGConfig, add_config_args, check_models, config_from_args
from rag.documents import document_type
from rag.ingest.manage import (
    AmbiguousDocumentError,
    DocumentPathError,
    check_document_path,
    list_documents,
    resolve_documents,
)
from rag.storage.paths import check_existing_index
from rag.types import Answer, Hit

PROG = "rag.mcp"
URI_PREFIX = "rag://documents/"
TRANSPORTS = ("stdio", "http")
MAX_K = 50  # passages one search may ask for
# the text served is what was indexed (HTML, PDF, Word as extracted text): text/plain but these
MIME = {"md": "text/markdown", "rst": "text/x-rst"}
log = logging.getLogger("rag.mcp")

PipelineFactory = Callable[[RAGConfig], Any]


@dataclass
class McpOptions:
    """How the MCP server is reached; the defaults are the safe ones."""

    transport: str = "stdio"  # stdio (the client launches it) | http (streamable HTTP at /mcp)
    host: str = "127.0.0.1"  # http: address to bind; loopback unless told otherwise
    port: int = 8765  # http: TCP port
    api_key: str | None = None  # http: require 'Authorization: Bearer KEY'; $RAG_API_KEY too
    max_body_bytes: int = 1 << 20  # http: request bodies over this are refused (413)


def passage(hit: Hit) -> dict[str, Any]:
    """A search hit for a client: its path relative to the ingested folder (the server's
    absolute paths never leave it), heading path, score and text."""
    c = hit.chunk
    return {
        "rank": hit.rank,
        "path": c.display_path,
        "heading": " > ".join(c.heading_path),
        **({"page": c.page} if c.page else {}),
        "score": round(float(hit.score), 6),
        "chunk_id": c.id,
        "text": c.text,
    }


def answer_dict(answer: Answer) -> dict[str, Any]:
    """What the ``ask`` tool returns: the answer text, the cited passages and the reader's span
    in the shape ``rag.serve`` sends them (:mod:`rag.serve.api`), whether it is the refusal."""
    from rag.serve.api import answer_span, sources

    return {
        "answer": answer.text,
        "refused": answer.refused,
        "sources": sources(answer),
        "answer_span": answer_span(answer),
        "generation": answer.generation,
    }


def stitched_text(chunks: Iterable[Any]) -> str:
    """A document's text as the index holds it: its chunks in order of their offsets into the
    loaded text, each overlap taken once and a gap between two chunks shown as a blank line."""
    out, end = [], None
    for c in sorted(chunks, key=lambda c: (c.start, c.end)):
        if end is None or c.start >= end:
            out.append(("\n\n" if out else "") + c.text)
        elif c.end > end:
            out.append(c.text[end - c.start :])
        end = c.end if end is None else max(end, c.end)
    return "".join(out)


def readable_errors(fn: Callable[[], Any]) -> Callable[[], Any]:
    """``fn`` with the errors written for people (a bad filter, a missing index or model:
    ValueError, LookupError, OSError) raised as the SDK's ``ToolError``, whose message the
    client sees, without the server's paths (:func:`rag.serve.http.hide_paths`, as rag.serve's
    errors); the SDK hides any other exception's text behind a generic line."""
    from mcp.server.mcpserver.exceptions import ToolError

    from rag.serve.http import hide_paths

    def call() -> Any:
        try:
            return fn()
        except (ValueError, LookupError, OSError) as e:
            raise ToolError(hide_paths(one_line(str(e)))) from e

    return call


def create_server(config: RAGConfig, pipeline_factory: PipelineFactory | None = None) -> Any:
    """The MCP server over ``config.index``; ``pipeline_factory(config)`` builds the pipeline
    (default :class:`rag.pipeline.RAGPipeline`, loaded on the first call that needs it)."""
    from mcp.server.lowlevel.helper_types import ReadResourceContents
    from mcp.server.mcpserver import MCPServer
    from mcp.server.mcpserver.exceptions import ResourceNotFoundError
    from mcp.types import Resource

    from rag.retrieval.spelling import searched

    if pipeline_factory is None:
        from rag.pipeline import RAGPipeline

        pipeline_factory = RAGPipeline
    index = config.index
    holder: dict[str, Any] = {}

    def pipeline() -> Any:
        if "pipe" not in holder:
            holder["pipe"] = pipeline_factory(config)
        return holder["pipe"]

    class RagServer(MCPServer):
        """MCPServer whose resources are the index's documents, listed live."""

        async def list_resources(self) -> list[Resource]:
            docs = await anyio.to_thread.run_sync(list_documents, index)
            return [
                Resource(
                    uri=URI_PREFIX + quote(d.path),
                    name=d.path,
                    description=f"{d.type}, {d.chunks} chunks, {d.bytes} bytes",
                    mime_type=MIME.get(d.type, "text/plain"),
                    size=d.bytes,
                )
                for d in docs.documents
            ]

        async def read_resource(self, uri: Any, context: Any = None) -> list[Any]:
            text = str(uri)
            if not text.startswith(URI_PREFIX):
                raise ResourceNotFoundError(
                    f"unknown resource {text!r}: documents are {URI_PREFIX}<path>"
                )
            path = unquote(text[len(URI_PREFIX) :])
            try:
                check_document_path(path)  # the check rag.docs, the API and the UI share
            except DocumentPathError:
                raise ResourceNotFoundError(f"index {index!r} has no document {path!r}") from None
            try:
                found = await anyio.to_thread.run_sync(document_text, path)
            except AmbiguousDocumentError as e:
                raise ResourceNotFoundError(f"index {index!r}: {e}") from None
            if found is None:
                raise ResourceNotFoundError(f"index {index!r} has no document {path!r}")
            body, mime = found
            return [ReadResourceContents(content=body, mime_type=mime)]

    def document_text(path: str) -> tuple[str, str] | None:
        retriever = pipeline().retriever
        retriever.refresh()  # the live generation, as a search would use
        snap = retriever.snapshot
        names = {source: snap.display(source) for source in snap.manifest.sources}
        # the resolver rag.docs and the API use: the name, else an earlier name of one document
        found = resolve_documents(path, names, snap.manifest.roots, as_listed=False)
        if not found:
            return None
        source = found[0]
        entry = snap.manifest.sources[source]
        chunks = [snap.chunks[i] for i in entry.chunk_ids if i in snap.chunks]
        return stitched_text(chunks), MIME.get(document_type(source), "text/plain")

    server = RagServer(
        "rag",
        title=f"Local RAG over index {index}",
        instructions=(
            f"Search and ask the local document index {index!r}. `search` returns passages "
            "(path, heading, score, text); `ask` returns a grounded answer whose [n] markers "
            "cite its `sources`. The index's documents are resources rag://documents/<path>. "
            "`where` filters documents: path=GLOB (relative path), type=pdf,md (ANDed)."
        ),
    )

    @server.tool()
    async def search(
        query: Annotated[str, Field(min_length=1, description="what to search for")],
        k: Annotated[int, Field(ge=1, le=MAX_K, description="passages to return")] = 5,
        where: Annotated[
            list[str],
            Field(description="document filter: path=GLOB, type=pdf,md (clauses ANDed)"),
        ] = [],  # noqa: B006 - the JSON schema's default; never mutated
    ) -> dict[str, Any]:
        """Search the index: the best passages for `query`, each with its document's path
        (relative to the ingested folder), heading path, score and text."""

        def run() -> dict[str, Any]:
            retriever = pipeline().retriever
            # its typos corrected, as `ask` corrects a question's
            typed = searched(retriever, query, config.retrieval.correct_typos)
            hits = retriever.search(typed, k=k, where=list(where) or None)  # none: --where
            return {
                "index": index,
                "query": typed,
                "generation": getattr(retriever, "generation", ""),
                "passages": [passage(h) for h in hits],
            }

        return await anyio.to_thread.run_sync(readable_errors(run))

    @server.tool()
    async def ask(
        question: Annotated[str, Field(min_length=1, description="the question")],
        where: Annotated[
            list[str],
            Field(description="document filter: path=GLOB, type=pdf,md (clauses ANDed)"),
        ] = [],  # noqa: B006
    ) -> dict[str, Any]:
        """Answer `question` from the index's documents: the answer (its [n] markers cite the
        n-th of `sources`), the cited passages, the reader's short answer span (or null), and
        whether the documents did not contain the answer (`refused`)."""

        def run() -> dict[str, Any]:
            extra = {"where": list(where)} if where else {}
            return answer_dict(pipeline().answer(question, **extra))

        return await anyio.to_thread.run_sync(readable_errors(run))

    server.rag_pipeline = pipeline  # for tests and preloading
    return server


# ---- command line ----------------------------------------------------------------------------

# The settings rag.mcp has no flag for, and why (tests/test_config_flags.py): none, every
# setting of every section is a flag.
EXCLUDED: dict[str, str] = {}


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="python -m rag.mcp", description=__doc__.split("\n")[0])
    p.add_argument("--config", default=None, help="TOML config file (default: ./rag.toml)")
    add_dataclass_args(
        p,
        McpOptions,
        choices={"transport": TRANSPORTS},
        help={
            "api_key": "http: require 'Authorization: Bearer KEY' (default: $RAG_API_KEY, "
            "else none)",
        },
    )
    add_config_args(p, EXCLUDED)
    return p


def serve_http(server: Any, options: McpOptions) -> None:
    """Streamable HTTP at ``/mcp`` behind rag.serve's guard (the key, the body limit)."""
    import uvicorn

    from rag.serve.http import Guard

    app = server.streamable_http_app(host=options.host)
    guarded = Guard(app, options.api_key, options.max_body_bytes, prefix="/mcp")
    uvicorn.run(guarded, host=options.host, port=options.port, log_level="warning")


def run(args: argparse.Namespace) -> int:
    cfg = config_from_args(args, args.config)
    options = options_from_args(McpOptions, args)
    options.api_key = options.api_key or os.environ.get("RAG_API_KEY") or None
    if options.port < 1:
        raise ValueError(f"--port must be >= 1, not {options.port}")
    check_existing_index(cfg.index, hint="the server serves an index under $RAG_HOME/indexes")
    list_documents(cfg.index)  # a folder that was never ingested stops here, not at a call
    check_models(cfg)
    server = create_server(cfg)
    if options.transport == "stdio":
        server.run("stdio")
        return 0
    from rag.serve.http import warn_if_open

    warn_if_open(PROG, options.host, options.api_key, "the index")
    print(
        f"{PROG}: index {cfg.index} on http://{options.host}:{options.port}/mcp "
        f"({'key required' if options.api_key else 'no key'})",
        file=sys.stderr,
    )
    serve_http(server, options)
    return 0


def main(argv: list[str] | None = None) -> int:
    """Exit 2 for a bad flag, index or model (one line), 1 when serving fails."""
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    return run_cli(build_parser(), run, argv, quiet=True)


if __name__ == "__main__":
    sys.exit(main())
