"""Gradio chat UI over an index: streamed, cited answers; a sources panel; uploads; settings.

    python -m ui.app --index docs            # http://127.0.0.1:7860
    make demo                                # ingests docs/ into index "docs", then this

The UI only calls the pipeline in ``rag/`` (``RAGPipeline.stream``, ``rag.ingest.ingest``,
``rag.rewrite.rewrite_query``); it holds no retrieval or generation logic. Pipelines (and so the
models) are loaded once per process and shared by every session (:mod:`ui.state`); the Gradio
queue bounds how many chat requests run at once. Safe by default: binds 127.0.0.1, uploads are
checked by :mod:`ui.uploads` (size, type, content, file name), the index setting is a name, never
a path, and errors reach the user as one readable line while the traceback goes to the log.

``build_app(config, pipeline_factory=...)`` takes the function that turns a
:class:`rag.config.RAGConfig` into a pipeline; tests pass one that builds the real pipeline with
a scripted decoder (see tests/test_ui_browser.py), everything else stays real.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")  # offline: no telemetry calls

import gradio as gr  # noqa: E402

from rag.config import MODES, RAGConfig
from rag.rewrite import rewrite_query
from rag.types import Answer
from ui import render
from ui.state import (
    INDEX_DEFAULT_ENCODER,
    NO_ADAPTER,
    PipelineCache,
    PipelineFactory,
    SettingError,
    check_choice,
    check_index_name,
    list_indexes,
    list_models,
)
from ui.uploads import DEFAULT_MAX_UPLOAD_BYTES, stage_uploads

log = logging.getLogger("ui")
SYSTEM_FONTS = ["ui-sans-serif", "system-ui", "sans-serif"]  # local fonts: no web-font fetch
MONO_FONTS = ["ui-monospace", "monospace"]

# Exceptions whose message is meant for the user; anything else gets a generic line.
_READABLE = (SettingError, ValueError, LookupError, FileNotFoundError, PermissionError)


@dataclass
class AppConfig:
    """How the app is served and its starting settings (each field is a ``--kebab-case`` flag)."""

    index: str = "docs"  # index name under $RAG_HOME/indexes shown first
    host: str = "127.0.0.1"  # bind address; loopback unless told otherwise
    port: int = 7860  # TCP port (0 = any free port)
    encoder: str | None = None  # query encoder; None = the one the index was built with
    decoder: str = "smollm2"  # answer decoder alias or artefact name
    adapter: str | None = None  # optional LoRA adapter artefact for the decoder
    mode: str = "hybrid"  # retrieval mode: dense | bm25 | hybrid
    k: int = 5  # passages retrieved per question
    temperature: float = 0.0  # 0 = greedy
    max_new_tokens: int = 128  # answer length limit
    device: str = "auto"  # auto | cpu | cuda
    max_upload_mb: float = DEFAULT_MAX_UPLOAD_BYTES / 2**20  # per-file upload limit (MiB)
    concurrency: int = 4  # chat requests processed at once (decoding itself is serialised)
    queue_size: int = 64  # requests waiting beyond that; more are refused with a message
    preload: bool = True  # load the starting pipeline before serving (fail fast)

    @property
    def max_upload_bytes(self) -> int:
        return int(self.max_upload_mb * 2**20)


def default_factory(cfg: RAGConfig) -> Any:
    from rag.pipeline import RAGPipeline

    return RAGPipeline(cfg)


def readable(exc: BaseException) -> str:
    """One line for the user: the message of an expected error, else a pointer to the log."""
    if isinstance(exc, _READABLE) and str(exc):
        return str(exc).splitlines()[0]
    return f"internal error ({type(exc).__name__}); the details are in the server log"


def _text(content: Any) -> str:
    """Plain text of a chat message content (a string or Gradio's list of typed parts)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(p.get("text", "") for p in content if isinstance(p, dict))
    return ""


class ChatApp:
    """The handlers behind the Blocks layout, over one shared :class:`PipelineCache`."""

    def __init__(self, config: AppConfig, pipeline_factory: PipelineFactory | None = None):
        self.config = config
        base = RAGConfig(
            index=config.index,
            encoder=config.encoder,
            decoder=config.decoder,
            adapter=config.adapter,
            mode=config.mode,
            k=config.k,
            temperature=config.temperature,
            max_new_tokens=config.max_new_tokens,
            device=config.device,
            rewrite_query=rewrite_query,
        )
        self.cache = PipelineCache(base, pipeline_factory or default_factory)

    # ---- chat -----------------------------------------------------------------------------

    def _pipeline(self, index: str, encoder: str, decoder: str, adapter: str) -> Any:
        models = list_models()
        index = check_index_name(index)
        if index not in list_indexes():
            raise SettingError(f"index {index!r} does not exist yet: upload documents to create it")
        check_choice(encoder, models["encoders"], "encoder")
        check_choice(decoder, models["decoders"], "decoder")
        check_choice(adapter, models["adapters"], "adapter")
        return self.cache.get(
            index,
            None if encoder == INDEX_DEFAULT_ENCODER else encoder,
            decoder,
            None if adapter == NO_ADAPTER else adapter,
        )

    def chat(
        self,
        message: str,
        history: list[dict],
        index: str,
        encoder: str,
        decoder: str,
        adapter: str,
        mode: str,
        k: float,
        temperature: float,
        max_new_tokens: float,
    ) -> Iterator[tuple[list[dict], str, str, str]]:
        """Stream one answer: yields (chat, textbox, sources html, uncited html)."""
        question = (message or "").strip()
        history = list(history or [])
        if not question:
            yield history, "", gr.skip(), gr.skip()
            return
        turns = _turns(history)
        history += [{"role": "user", "content": question}, {"role": "assistant", "content": "…"}]
        yield history, "", gr.skip(), gr.skip()
        try:
            if mode not in MODES:
                raise SettingError(
                    f"retrieval mode must be one of {', '.join(MODES)}, not {mode!r}"
                )
            pipe = self._pipeline(index, encoder, decoder, adapter)
            answer, raw = None, ""
            stream = pipe.stream(
                question,
                history=turns,
                k=int(k),
                mode=mode,
                temperature=float(temperature),
                max_new_tokens=int(max_new_tokens),
            )
            for item in stream:
                if isinstance(item, Answer):
                    answer = item
                    break
                raw += str(item)
                history[-1] = {"role": "assistant", "content": raw or "…"}
                yield history, "", gr.skip(), gr.skip()
            if answer is None:
                raise RuntimeError("the pipeline ended without a final answer")
        except Exception as e:  # noqa: BLE001 - every failure becomes a readable chat message
            log.exception("chat failed for question %r", question)
            history[-1] = {"role": "assistant", "content": render.error_markdown(readable(e))}
            yield history, "", render.error_markdown(readable(e)), ""
            return
        history[-1] = {"role": "assistant", "content": render.reply_markdown(answer)}
        yield history, "", render.sources_html(answer, question), render.uncited_html(answer)

    # ---- uploads --------------------------------------------------------------------------

    def upload(
        self,
        files: list[Any] | None,
        index: str,
        progress=gr.Progress(track_tqdm=True),  # noqa: B008 - Gradio injects it
    ) -> str:
        """Check, stage and ingest uploaded files into ``index``; returns a markdown report."""
        try:
            return self._upload(files or [], index)
        except Exception as e:  # noqa: BLE001
            log.exception("upload into %r failed", index)
            return render.error_markdown(readable(e))

    def _upload(self, files: list[Any], index: str) -> str:
        index = check_index_name(index)
        pairs = [(str(f), getattr(f, "orig_name", None) or Path(str(f)).name) for f in files]
        if not pairs:
            return "No file was uploaded."
        staged, refused = stage_uploads(pairs, index, self.config.max_upload_bytes)
        lines = [f"- refused **{r.name}**: {r.reason}" for r in refused]
        if staged:
            from rag.ingest import ingest

            # The pipeline's Retriever re-reads the index when ingest publishes a new
            # generation, so the next question sees the new chunks without reloading models.
            report = ingest(staged, **self._ingest_kwargs(index))
            lines = _report_lines(report) + lines
        head = f"Index **{index}**: {len(staged)} file(s) accepted, {len(refused)} refused."
        return "\n".join([head, *lines])

    def _ingest_kwargs(self, index: str) -> dict[str, Any]:
        kwargs: dict[str, Any] = {"index": index}
        if index not in list_indexes():  # a new index is built with the app's encoder
            kwargs["encoder"] = self.config.encoder or "minilm"
        return kwargs


def _turns(history: list[dict]) -> list[dict[str, str]]:
    """The finished chat turns as plain ``{"role", "content"}`` messages for the pipeline."""
    return [
        {"role": m["role"], "content": _text(m.get("content"))}
        for m in history
        if m.get("role") in ("user", "assistant")
    ]


def _report_lines(report: Any) -> list[str]:
    """Markdown lines from a :class:`rag.ingest.IngestReport`: its summary, then each failed file
    with the reason (the same per-file report as ``python -m rag.ingest``)."""
    lines = [f"- {report.summary()}"]
    lines += [f"- failed **{Path(path).name}**: {reason}" for path, reason in report.failures]
    return lines


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
    models = list_models()
    indexes = list_indexes()
    with gr.Blocks(title="Local RAG chat") as demo:
        gr.Markdown("## Local RAG chat — answers cite the passages they come from")
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
                    indexes or [config.index],
                    value=config.index,
                    label="Index",
                    allow_custom_value=True,
                    elem_id="index",
                )
                encoder = gr.Dropdown(
                    models["encoders"],
                    value=config.encoder or INDEX_DEFAULT_ENCODER,
                    label="Encoder",
                )
                decoder = gr.Dropdown(models["decoders"], value=config.decoder, label="Decoder")
                adapter = gr.Dropdown(
                    models["adapters"], value=config.adapter or NO_ADAPTER, label="LoRA adapter"
                )
                refresh = gr.Button("Refresh lists", size="sm")
            with gr.Row():
                mode = gr.Radio(list(MODES), value=config.mode, label="Retrieval mode")
                k = gr.Slider(1, 20, value=config.k, step=1, label="k (passages)")
                temperature = gr.Slider(
                    0.0, 1.5, value=config.temperature, step=0.05, label="Temperature"
                )
                max_new = gr.Slider(
                    16, 512, value=config.max_new_tokens, step=16, label="Max new tokens"
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

        settings = [index, encoder, decoder, adapter, mode, k, temperature, max_new]
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
        upload_btn.click(
            app.upload, [files, index], upload_report, api_name="upload", concurrency_limit=1
        )

        def _refresh():
            m = list_models()
            return (
                gr.update(choices=list_indexes() or [config.index]),
                gr.update(choices=m["encoders"]),
                gr.update(choices=m["decoders"]),
                gr.update(choices=m["adapters"]),
            )

        refresh.click(_refresh, None, [index, encoder, decoder, adapter], api_name=False)
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
    pipe = app._pipeline(
        config.index,
        config.encoder or INDEX_DEFAULT_ENCODER,
        config.decoder,
        config.adapter or NO_ADAPTER,
    )
    for part in ("retriever", "generator"):
        getattr(pipe, part, None)


def parse_args(argv: list[str] | None = None) -> AppConfig:
    parser = argparse.ArgumentParser(prog="python -m ui.app", description=__doc__.split("\n")[0])
    defaults = AppConfig()
    for f in fields(AppConfig):
        flag = "--" + f.name.replace("_", "-")
        default = getattr(defaults, f.name)
        if isinstance(default, bool):
            parser.add_argument(
                flag, dest=f.name, default=default, action=argparse.BooleanOptionalAction
            )
        else:
            conv = {int: int, float: float}.get(type(default), str)
            parser.add_argument(flag, dest=f.name, type=conv, default=default)
    return AppConfig(**vars(parser.parse_args(argv)))


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    config = parse_args(argv)
    if config.mode not in MODES:
        print(
            f"error: --mode must be one of {', '.join(MODES)}, not {config.mode!r}", file=sys.stderr
        )
        return 2
    try:
        check_index_name(config.index)
        demo = build_app(config)
        if config.preload and config.index in list_indexes():
            warm_up(demo.chat_app, config)
        elif config.index not in list_indexes():
            log.warning(
                "index %r does not exist yet: upload documents in the UI to create it", config.index
            )
    except Exception as e:  # noqa: BLE001
        log.debug("startup failed", exc_info=True)
        print(
            f"error: {readable(e) if isinstance(e, _READABLE) else f'{type(e).__name__}: {e}'}",
            file=sys.stderr,
        )
        return 1
    launch(demo, config)
    return 0


if __name__ == "__main__":
    sys.exit(main())
