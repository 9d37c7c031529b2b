"""Gradio chat UI over an index: streamed, cited answers; a sources panel; uploads; the index's
documents (listed, removable); settings.

    python -m ui.app --index docs            # http://127.0.0.1:7860
    make demo                                # ingests docs/ into index "docs", then this

The UI only calls ``rag``'s public face (:class:`rag.RAGConfig` with ``check_models`` /
``resolve_models``, ``RAGPipeline.stream`` over a ``conversational`` config, ``ingest_config``,
an index's documents) and the command-line plumbing of :mod:`rag.cli`; it holds no retrieval or
generation logic. Pipelines (and so the models) are loaded once per process and shared by every
session (:mod:`ui.state`, in the server's :class:`rag.Pipelines`); the Gradio
queue bounds how many chat requests run at once. Safe by default: binds 127.0.0.1, uploads are
checked by :mod:`ui.uploads` (size, type, content, file name), the index setting is a name, never
a path, and errors reach the user as one readable line while the traceback goes to the log.

``build_app(config, pipeline_factory=...)`` takes the function that turns a
:class:`rag.RAGConfig` into a pipeline; tests pass one that builds the real pipeline with
a scripted decoder (see tests/test_ui_browser.py), everything else stays real.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Any

import gradio as gr

from rag import MODES, check_models, list_indexes, prepare_serving_process
from rag.cli import run_cli
from ui import render
from ui.config import AppConfig, app_config, build_parser, parse_args
from ui.handlers import ChatApp
from ui.state import (
    INDEX_DEFAULT_ENCODER,
    NO_ADAPTER,
    NO_RERANKER,
    PipelineFactory,
    check_index_name,
)

__all__ = ["AppConfig", "ChatApp", "build_app", "launch", "main", "parse_args", "warm_up"]

log = logging.getLogger("ui")
SYSTEM_FONTS = ["ui-sans-serif", "system-ui", "sans-serif"]  # local fonts: no web-font fetch
MONO_FONTS = ["ui-monospace", "monospace"]
# Slider bounds of the per-request settings; Gradio refuses a request outside them, so clients
# of the /chat endpoint (benchmarks.clients) check against these.
K_RANGE = (1, 20)
MAX_NEW_TOKENS_RANGE = (16, 512)
RERANK_DEPTH_RANGE = (1, 100)  # candidates the reranker re-scores (one forward pass each)


def keep_orig_names(component: gr.File) -> gr.File:
    """Make ``component`` hand the handler the client's claimed file name (``orig_name``) beside
    the cached path, so a traversal-style name can be refused rather than silently reduced to
    its last part. Done on the instance: a ``gr.File`` subclass would make Gradio write a
    ``.pyi`` stub into the source folder."""
    process = component._process_single_file

    def with_name(f: Any) -> Any:
        value = process(f)
        value.orig_name = f.orig_name or Path(f.path).name
        return value

    component._process_single_file = with_name
    return component


def build_app(config: AppConfig, pipeline_factory: PipelineFactory | None = None) -> gr.Blocks:
    """The Blocks app; ``pipeline_factory(RAGConfig) -> pipeline`` defaults to ``RAGPipeline``."""
    app = ChatApp(config, pipeline_factory)
    config = app.config  # adapter and reranker "auto"/"none" resolved to a name or None
    start = config.rag
    retrieval, generate = start.retrieval, start.generate
    models = app.models()
    indexes = list_indexes()
    with gr.Blocks(title="Local RAG chat") as demo:
        gr.Markdown("## Local RAG chat — answers cite the passages they come from")
        gr.Markdown(
            f"Answering with {app.decoder_line}; reranker: {app.reranker_line}; "
            f"reader: {app.reader_line}.",
            elem_id="decoder-line",
        )
        with gr.Row():
            with gr.Column(scale=3):
                chatbot = gr.Chatbot(label="Chat", height=520, elem_id="chat", buttons=["copy"])
                with gr.Row():
                    box = gr.Textbox(
                        placeholder="Ask a question about the documents…",
                        show_label=False,
                        scale=5,
                        elem_id="question",
                    )
                    send = gr.Button("Ask", variant="primary", scale=1, elem_id="ask")
                clear = gr.Button("New conversation", size="sm")
            with gr.Column(scale=2):
                gr.Markdown("### Sources")
                sources = gr.HTML("<p>Ask a question to see its sources.</p>", elem_id="sources")
                with gr.Accordion("Retrieved but not cited", open=False, elem_id="uncited-box"):
                    uncited = gr.HTML("", elem_id="uncited")
        with gr.Accordion("Settings", open=False, elem_id="settings"):
            with gr.Row():
                index = gr.Dropdown(
                    indexes or [start.index],
                    value=start.index,
                    label="Index",
                    allow_custom_value=True,
                    elem_id="index",
                )
                encoder = gr.Dropdown(
                    models["encoders"],
                    value=retrieval.encoder or INDEX_DEFAULT_ENCODER,
                    label="Encoder",
                )
                decoder = gr.Dropdown(models["decoders"], value=generate.decoder, label="Decoder")
                adapter = gr.Dropdown(
                    models["adapters"], value=generate.adapter or NO_ADAPTER, label="LoRA adapter"
                )
                refresh = gr.Button("Refresh lists", size="sm")
            with gr.Row():
                mode = gr.Radio(list(MODES), value=retrieval.mode, label="Retrieval mode")
                k = gr.Slider(*K_RANGE, value=retrieval.k, step=1, label="k (passages)")
                temperature = gr.Slider(
                    0.0, 1.5, value=generate.temperature, step=0.05, label="Temperature"
                )
                max_new = gr.Slider(
                    *MAX_NEW_TOKENS_RANGE,
                    value=generate.max_new_tokens,
                    step=16,
                    label="Max new tokens",
                )
            with gr.Row():  # the reranker reorders the retrieved candidates; (off) skips it
                reranker = gr.Dropdown(
                    models["rerankers"],
                    value=retrieval.rerank or NO_RERANKER,
                    label="Reranker",
                    elem_id="reranker",
                )
                rerank_depth = gr.Slider(
                    RERANK_DEPTH_RANGE[0],
                    max(RERANK_DEPTH_RANGE[1], retrieval.rerank_depth),  # --rerank-depth 200
                    value=retrieval.rerank_depth,
                    step=1,
                    label="Rerank depth (candidates re-scored)",
                )
                where = gr.Textbox(
                    value=" ".join(retrieval.where),
                    label="Filter: search only these documents",
                    placeholder="path=library/* type=pdf (clauses ANDed; type=pdf,md = either)",
                    elem_id="filter",
                )
        with gr.Accordion("Upload documents into the current index", open=False):
            gr.Markdown(
                f"Accepted: .md .txt .rst .html .pdf .docx, up to {config.max_upload_mb:g} MiB each. "
                "Files go through the same ingest as `python -m rag.ingest`."
            )
            files = keep_orig_names(
                gr.File(file_count="multiple", label="Documents", elem_id="upload")
            )
            upload_btn = gr.Button("Add to index", elem_id="upload-btn")
            upload_report = gr.Markdown(elem_id="upload-report")
        with gr.Accordion("Documents in the current index", open=False, elem_id="documents-box"):
            docs_table = gr.HTML("", elem_id="documents")
            with gr.Row():
                docs_pick = gr.Dropdown(
                    [],
                    value=[],
                    multiselect=True,
                    label="Documents to remove",
                    scale=4,
                    elem_id="documents-pick",
                )
                docs_refresh = gr.Button("Refresh", size="sm", elem_id="documents-refresh")
                docs_remove = gr.Button("Remove…", variant="stop", elem_id="documents-remove")
            with gr.Row(visible=False, elem_id="documents-confirm") as docs_confirm:
                docs_confirm_text = gr.HTML("", elem_id="documents-confirm-text")
                docs_yes = gr.Button("Confirm removal", variant="stop", elem_id="documents-yes")
                docs_no = gr.Button("Cancel", elem_id="documents-no")
            docs_report = gr.HTML("", elem_id="documents-report")

        # the rerank settings and the filter last: /chat clients that predate them get the
        # page's values
        settings = [index, encoder, decoder, adapter, mode, k, temperature, max_new]
        settings += [reranker, rerank_depth, where]
        outputs = [chatbot, box, sources, uncited]
        for trigger in (send.click, box.submit):
            trigger(
                app.chat,
                [box, chatbot, *settings],
                outputs,
                api_name="chat" if trigger == send.click else False,
            )
        clear.click(
            lambda: ([], "<p>Ask a question to see its sources.</p>", ""),
            None,
            [chatbot, sources, uncited],
            api_name=False,
        )
        listing = [docs_table, docs_pick]
        upload_btn.click(
            app.upload, [files, index], upload_report, api_name="upload", concurrency_limit=1
        ).then(app.documents, index, listing, api_name=False)
        # the Documents panel: listed on load and for each index; removal in two steps (a
        # confirmation naming the documents, hidden again when the choice changes)
        demo.load(app.documents, index, listing, api_name=False)
        index.change(app.documents, index, listing, api_name=False)
        docs_refresh.click(app.documents, index, listing, api_name=False)
        docs_remove.click(
            app.confirm_removal,
            [index, docs_pick],
            [docs_confirm, docs_confirm_text, docs_report],
            api_name=False,
        )
        docs_pick.change(lambda: gr.update(visible=False), None, docs_confirm, api_name=False)
        docs_no.click(lambda: gr.update(visible=False), None, docs_confirm, api_name=False)
        docs_yes.click(
            app.remove,
            [index, docs_pick],
            [docs_report, docs_table, docs_pick, docs_confirm],
            api_name=False,
            concurrency_limit=1,
        )

        def _refresh():
            m = app.models()
            return (
                gr.update(choices=list_indexes() or [start.index]),
                gr.update(choices=m["encoders"]),
                gr.update(choices=m["decoders"]),
                gr.update(choices=m["adapters"]),
                gr.update(choices=m["rerankers"]),
            )

        refresh.click(_refresh, None, [index, encoder, decoder, adapter, reranker], api_name=False)
    demo.queue(default_concurrency_limit=config.concurrency, max_size=config.queue_size)
    demo.chat_app = app  # for tests and the benchmark (shared cache)
    return demo


def launch(demo: gr.Blocks, config: AppConfig, **kwargs: Any) -> Any:
    """Serve ``demo``; Gradio's own upload limit is twice ours, so a moderately oversized file
    still reaches :func:`ui.uploads.check_content` and gets a per-file message."""
    return demo.launch(
        server_name=config.host,
        server_port=config.port or None,
        max_file_size=2 * config.max_upload_bytes,
        show_error=False,
        head=render.CITATION_JS,
        css=render.CSS,
        theme=gr.themes.Soft(font=SYSTEM_FONTS, font_mono=MONO_FONTS),
        footer_links=["api"],
        **kwargs,
    )


def warm_up(app: ChatApp, config: AppConfig) -> None:
    """Load the starting pipeline's models now (they are lazy), so a bad model or index fails
    at start-up and the first question does not pay the load time."""
    retrieval, generate = config.rag.retrieval, config.rag.generate
    pipe = app._pipeline(
        config.rag.index,
        retrieval.encoder or INDEX_DEFAULT_ENCODER,
        generate.decoder,
        generate.adapter or NO_ADAPTER,
        retrieval.rerank or NO_RERANKER,
        retrieval.rerank_depth,
    )
    load = getattr(pipe, "load_models", None)  # a stand-in pipeline (tests) may not have it
    if load is not None:
        load()  # decoders shared across indexes load through their stand-ins


def run(config: AppConfig) -> int:
    """Check the settings, build the app, load its models, then serve until interrupted."""
    cfg = config.rag
    check_index_name(cfg.index)
    check_models(cfg)  # an unknown name fails now, listing what exists
    prepare_serving_process()  # batched decoding reuses freed buffers instead of new pages
    demo = build_app(config)
    if config.preload and cfg.index in list_indexes():
        warm_up(demo.chat_app, demo.chat_app.config)
    elif cfg.index not in list_indexes():
        log.warning(
            "index %r does not exist yet: upload documents in the UI to create it", cfg.index
        )
    launch(demo, config)
    return 0


def main(argv: list[str] | None = None) -> int:
    """Exit 2 for a bad flag, setting, name or model (one line, rag.cli), 1 when loading fails."""
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    return run_cli(build_parser(), lambda args: run(app_config(args)), argv)


if __name__ == "__main__":
    sys.exit(main())
