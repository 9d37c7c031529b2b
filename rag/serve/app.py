"""An OpenAI-compatible HTTP API over the RAG pipeline, so any OpenAI client (the ``openai``
package, LangChain's ``ChatOpenAI``, curl) can ask the indexes questions.

    python -m rag.serve --index docs [--host 127.0.0.1] [--port 8000] [--api-key KEY]
        [--decoder ALIAS|DIR] [--adapter auto|none|DIR] [--k 5] [--mode hybrid] [--config rag.toml]
        [--rerank auto|none|DIR] [--rerank-depth N] [--rerank-weight W]

Endpoints: ``POST /v1/chat/completions`` (``stream`` true or false), ``GET /v1/models``,
``POST /v1/embeddings``, ``GET /v1/documents``, ``DELETE /v1/documents/{path}``
(:mod:`rag.serve.documents`), ``GET /health``. A model name is ``rag:<index>`` for each index
under ``$RAG_HOME/indexes`` (``rag`` alone is ``--index``); every model answers with the server's one
decoder, adapter and reranker (``--rerank auto``, the default: the trained ``minilm-rerank`` when
present; ``/health`` names the one in use). The answer keeps its ``[n]`` markers and the cited
passages arrive in the extra field ``sources`` (docs/serving.md). Binds 127.0.0.1 unless told
otherwise; a key from ``--api-key`` or ``$RAG_API_KEY`` is then required on every ``/v1`` request.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import anyio
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from rag.cli import OneLineParser, run_cli
from rag.cli.flags import BoolFlag, add_dataclass_args, config_from_args
from rag.config import RAGConfig, ResolvedModels, add_config_args, check_models, resolve_models
from rag.config import config_from_args as rag_config_from_args
from rag.generate.context_budget import QuestionTooLongError
from rag.pipeline import conversational
from rag.serve.api import (
    DONE,
    MODEL_PREFIX,
    ApiError,
    ChatRequest,
    EmbeddingRequest,
    check_chat_request,
    check_question,
    check_text,
    chunk,
    completion,
    embedding_data,
    embedding_texts,
    embedding_tokens,
    final_chunks,
    max_new_tokens,
    request_filter,
    split_messages,
    sse,
)
from rag.serve.documents import add_document_routes, not_ingested
from rag.serve.http import (
    ClosingStreamingResponse,
    Guard,
    install_error_handlers,
    server_error,
    stream_error,
    warn_if_open,
)
from rag.serve.state import (
    END,
    PipelineFactory,
    Pipelines,
    Run,
    Slots,
    decoder_sharing_factory,
)
from rag.storage.manifest import IndexNotFoundError
from rag.storage.paths import (
    IndexNameError,
    check_existing_index,
    check_index_name,
    indexes_dir,
    list_indexes,
)
from rag.types import Answer

PROG = "rag.serve"
log = logging.getLogger("rag.serve")


@dataclass
class ServeOptions:
    """Server settings beside the RAGConfig; the defaults are the safe ones."""

    host: str = "127.0.0.1"  # address to bind; loopback unless told otherwise
    port: int = 8000  # TCP port
    api_key: str | None = None  # None: no key asked (fine on loopback only)
    max_tokens_limit: int = 1024  # largest max_tokens a request may ask for
    # longest question (the last user message) in characters; longer is a 400. 4,000 are
    # 1,100-1,300 SmolLM2 tokens (of docs/*.md): room for a pasted error message, while the
    # system prompt, some passages and the answer still fit the decoder's 2,048-token context
    max_question_chars: int = 4000
    max_body_bytes: int = 1 << 20  # request bodies over this are refused (413)
    max_concurrent: int = 4  # chat completions in flight; more get 429 (clients retry)
    max_embedding_inputs: int = 256  # texts per embeddings request
    pipelines: int = 4  # indexes kept loaded (each holds its retriever)


class Service:
    """What the routes share: the config, the options, the pipelines and the slots."""

    def __init__(self, config: RAGConfig, options: ServeOptions, factory: PipelineFactory) -> None:
        self.config, self.options, self.factory = config, options, factory
        self.pipelines = Pipelines(config, factory, options.pipelines)
        self.slots = Slots(options.max_concurrent)
        self.models: ResolvedModels | None = None  # what auto chose (create_app), for people

    def index_for(self, model: str) -> str:
        """The index a model name selects: ``rag:<index>``, or ``rag`` for the default."""
        name = self.config.index if model == "rag" else None
        if model.startswith(MODEL_PREFIX):
            name = model[len(MODEL_PREFIX) :]
        try:
            if name is not None and check_index_name(name, hint="") in list_indexes():
                return name
        except IndexNameError:
            pass
        have = ", ".join(MODEL_PREFIX + i for i in list_indexes()) or "none"
        raise ApiError(
            404,
            f"model {model!r} does not exist; models are rag:<index> (have: {have})",
            param="model",
            code="model_not_found",
        )

    def preload(self) -> None:
        """Load the default index's retriever, encoder and every decoder before serving
        (:meth:`rag.pipeline.RAGPipeline.load_models`), so a broken index or a missing model
        stops the command instead of the first request."""
        pipe = self.pipelines.get(self.config.index)
        load = getattr(pipe, "load_models", None)  # a stand-in pipeline (tests) may not have it
        if load is not None:
            load()

    async def start(self, req: ChatRequest) -> tuple[Run, Any, str]:
        """Validate, take a slot, and run the pipeline to its first item, so failures before
        any text (a broken index) still get a proper status code. Returns (run, first item,
        index)."""
        check_text(req.model_dump())  # first: every later step, and an error naming it, needs text
        index = self.index_for(req.model)
        check_chat_request(req)
        question, history = split_messages(req.messages)
        check_question(question, self.options.max_question_chars)
        limit = self.options.max_tokens_limit
        max_new = max_new_tokens(req, self.config.generate.max_new_tokens, limit)
        self.slots.take()
        run: Run | None = None
        try:
            pipe = await anyio.to_thread.run_sync(self.pipelines.get, index)
            where = request_filter(req)
            items = pipe.stream(
                question,
                history=history,
                k=req.k,
                mode=req.mode,
                temperature=req.temperature,
                max_new_tokens=max_new,
                **({} if where is None else {"where": where}),
            )
            run = Run(items, self.slots)
            first = await run.next()
        except BaseException as e:  # a cancel too: free the slot, then let it go on
            if run is not None:
                await run.close()
            else:
                self.slots.give()
            if isinstance(e, QuestionTooLongError):  # the request's fault, not the server's
                raise ApiError(
                    400, str(e), param="messages", code="context_length_exceeded"
                ) from None
            if isinstance(e, IndexNotFoundError):  # its last generation went meanwhile
                raise not_ingested(index) from None
            if isinstance(e, Exception) and not isinstance(e, ApiError):
                raise server_error(e) from None
            raise
        return run, first, index


def _meta(model: str) -> dict[str, Any]:
    return {"id": f"chatcmpl-{uuid.uuid4().hex[:24]}", "created": int(time.time()), "model": model}


async def _events(
    run: Run, first: Any, meta: dict[str, Any], include_usage: bool
) -> AsyncIterator[str]:
    """The SSE stream: a role chunk, one chunk per text delta, the finish chunk with
    ``sources``, the usage chunk when asked, ``[DONE]``. Closing it closes the pipeline's stream."""
    try:
        yield sse(chunk(meta, {"role": "assistant", "content": ""}))
        item = first
        while not isinstance(item, Answer):
            if item is END:
                raise RuntimeError("the pipeline ended without a final answer")
            if item:
                yield sse(chunk(meta, {"content": str(item)}))
            item = await run.next()
        await run.close()  # the slot is free before [DONE]: a client's next request fits
        for obj in final_chunks(meta, item, include_usage):
            yield sse(obj)
        yield DONE
    except Exception as e:  # noqa: BLE001 - the headers are sent: report in-band
        yield sse(stream_error(e))
    finally:
        await run.close()


def create_app(
    config: RAGConfig,
    pipeline_factory: PipelineFactory | None = None,
    *,
    options: ServeOptions | None = None,
) -> FastAPI:
    """The FastAPI app. ``pipeline_factory(RAGConfig) -> pipeline`` builds one pipeline per
    index (tests inject a scripted one); by default a RAGPipeline sharing one decoder."""
    options = options or ServeOptions()
    # auto resolved once: every index's pipeline loads the same adapter and reranker, /health
    # names the reranker; follow-ups are rewritten as in the UI
    models = resolve_models(conversational(config))
    config = models.config
    service = Service(config, options, pipeline_factory or decoder_sharing_factory())
    service.models = models
    app = FastAPI(title="rag.serve", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.rag = service
    install_error_handlers(app)
    app.add_middleware(Guard, api_key=options.api_key, max_body=options.max_body_bytes)

    @app.get("/health")
    async def health() -> dict[str, Any]:
        s = service.slots
        return {
            "status": "ok",
            "in_flight": s.used,
            "max_concurrent": s.size,
            "reranker": service.config.retrieval.rerank,
            "generations": service.pipelines.generations(),
        }

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        data = []
        for name in list_indexes():
            try:
                created = int((indexes_dir() / name).stat().st_mtime)
            except OSError:  # removed since it was listed
                continue
            data.append(
                {
                    "id": MODEL_PREFIX + name,
                    "object": "model",
                    "created": created,
                    "owned_by": "rag",
                }
            )
        return {"object": "list", "data": data}

    add_document_routes(app, service.index_for)

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatRequest, request: Request) -> Response:
        run, first, index = await service.start(body)
        meta = _meta(MODEL_PREFIX + index)
        if body.stream:
            usage = bool(body.stream_options and body.stream_options.include_usage)
            return ClosingStreamingResponse(
                _events(run, first, meta, usage),
                media_type="text/event-stream",
                headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
            )
        parts: list[str] = []
        try:
            item = first
            while not isinstance(item, Answer):
                if item is END:
                    raise RuntimeError("the pipeline ended without a final answer")
                parts.append(str(item))
                if await request.is_disconnected():  # nobody to answer: stop decoding
                    log.info("client left before the answer was complete")
                    return Response(status_code=499)
                item = await run.next()
        except Exception as e:  # noqa: BLE001
            raise server_error(e) from None
        finally:
            await run.close()
        return JSONResponse(completion(meta, "".join(parts), item))

    @app.post("/v1/embeddings")
    async def embeddings(body: EmbeddingRequest) -> dict[str, Any]:
        check_text(body.model_dump())
        index = service.index_for(body.model)
        texts = embedding_texts(body, options.max_embedding_inputs)

        def embed() -> tuple[Any, int]:
            encoder = service.pipelines.get(index).retriever.encoder
            dim = int(encoder.dim)
            if body.dimensions is not None and body.dimensions != dim:
                raise ApiError(
                    400,
                    f"dimensions must be {dim} (this index's encoder) or left out",
                    param="dimensions",
                )
            tokens = embedding_tokens(encoder, texts, body.input_type)  # 400 over the limit
            return encoder.encode(texts, kind=body.input_type), tokens

        try:
            vectors, tokens = await anyio.to_thread.run_sync(embed)
        except ApiError:
            raise
        except Exception as e:  # noqa: BLE001
            raise server_error(e) from None
        return {
            "object": "list",
            "data": embedding_data(vectors, body.encoding_format),
            "model": MODEL_PREFIX + index,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        }

    return app


# ---- command line ----------------------------------------------------------------------------

# The settings rag.serve has no flag for, and why (tests/test_config_flags.py): none, every
# setting of every section is a flag.
EXCLUDED: dict[str, str] = {}


def build_parser() -> argparse.ArgumentParser:
    """ServeOptions and RAGConfig flags (rag.cli.flags; the RAGConfig ones over rag.toml)."""
    p = OneLineParser(prog="python -m rag.serve", description=__doc__.split("\n\n")[0])
    p.add_argument("--config", default=None, help="TOML config file (default: ./rag.toml)")
    add_dataclass_args(
        p,
        ServeOptions,
        only=(
            "host",
            "port",
            "api_key",
            "max_tokens_limit",
            "max_question_chars",
            "max_body_bytes",
            "max_concurrent",
        ),
        help={
            "host": "address to bind",
            "port": "TCP port",
            "api_key": "require 'Authorization: Bearer KEY' on /v1 (default: $RAG_API_KEY, "
            "else none)",
        },
    )
    p.add_argument(
        "--preload",
        action=BoolFlag,
        default=True,
        help="load the models at start-up, not on the first request (default: on)",
    )
    p.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"))
    add_config_args(p, EXCLUDED)
    return p


def options_from_args(args: argparse.Namespace) -> ServeOptions:
    for flag in (
        "port",
        "max_tokens_limit",
        "max_question_chars",
        "max_body_bytes",
        "max_concurrent",
    ):
        if getattr(args, flag) < 1:
            raise ValueError(f"--{flag.replace('_', '-')} must be >= 1, not {getattr(args, flag)}")
    options = config_from_args(ServeOptions, args)
    options.api_key = options.api_key or os.environ.get("RAG_API_KEY") or None
    return options


def check_index(name: str) -> None:
    check_existing_index(name, hint="the server serves indexes under $RAG_HOME/indexes by name")


def run(args: argparse.Namespace) -> int:
    from rag.generate.load import prepare_serving_process

    cfg = rag_config_from_args(args, args.config)
    options = options_from_args(args)
    check_index(cfg.index)
    check_models(cfg)
    prepare_serving_process()  # batched decoding reuses freed buffers instead of new pages
    app = create_app(cfg, options=options)
    if args.preload:
        app.state.rag.preload()
    import uvicorn

    warn_if_open(PROG, options.host, options.api_key, "every index")
    models = app.state.rag.models
    print(
        f"{PROG}: model rag:{cfg.index} ({models.decoder_line}; "
        f"reranker {models.reranker_line}) on http://{options.host}:{options.port}/v1",
        file=sys.stderr,
    )
    uvicorn.run(app, host=options.host, port=options.port, log_level=args.log_level)
    return 0


def main(argv: list[str] | None = None) -> int:
    return run_cli(build_parser(), run, argv, quiet=True)


if __name__ == "__main__":
    sys.exit(main())
