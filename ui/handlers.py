"""The handlers behind the chat page: stream an answer, ingest uploads, list and remove an
index's documents. Every model and index call goes through ``rag``'s public face (the pipeline,
ingest, an index's documents); this module only checks settings, renders results and
turns failures into one readable line (the traceback goes to the log)."""

from __future__ import annotations

import contextlib
import html
import logging
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import gradio as gr

from rag import (
    MODES,
    Answer,
    Pipelines,
    build_config,
    conversational,
    decoder_sharing_factory,
    inert,
    list_indexes,
    resolve_models,
)
from ui import render
from ui.config import AppConfig
from ui.state import (
    INDEX_DEFAULT_ENCODER,
    NO_ADAPTER,
    NO_RERANKER,
    PIPELINES_KEPT,
    PipelineFactory,
    SettingError,
    check_choice,
    check_index_name,
    list_models,
)
from ui.uploads import stage_uploads

log = logging.getLogger("ui")

# Exceptions whose message is meant for the user; anything else gets a generic line.
_READABLE = (SettingError, ValueError, LookupError, FileNotFoundError, PermissionError)


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
    """The handlers behind the Blocks layout, over one shared :class:`rag.Pipelines`."""

    def __init__(self, config: AppConfig, pipeline_factory: PipelineFactory | None = None):
        # "auto" becomes the adapter trained for the decoder when there is one, else none, and
        # the reranker minilm-rerank when trained, else off; the page says which (decoder_line,
        # reranker_line), so a user knows whether the tuned models answer
        models = resolve_models(config.rag)
        self.decoder_line, self.reranker_line = models.decoder_line, models.reranker_line
        self.reader_line = models.reader_line  # the reader that puts the short answer on top
        config = replace(config, rag=models.config)
        self.config = config
        # keyed by whole configs: the page's models over this base (see _pipeline)
        self.pipelines = Pipelines(
            conversational(config.rag),
            pipeline_factory or decoder_sharing_factory(PIPELINES_KEPT),
            PIPELINES_KEPT,
        )

    # ---- chat -----------------------------------------------------------------------------

    def models(self) -> dict[str, list[str]]:
        """Dropdown choices: what :func:`ui.state.list_models` finds, plus the models named on
        the command line (trusted: they may be folder paths, which the page never accepts)."""
        models = list_models()
        retrieval, generate = self.config.rag.retrieval, self.config.rag.generate
        for key, value in (
            ("encoders", retrieval.encoder),
            ("decoders", generate.decoder),
            ("adapters", generate.adapter),
            ("rerankers", retrieval.rerank),
        ):
            if value and value not in models[key]:
                models[key].append(value)
        return models

    def _pipeline(
        self,
        index: str,
        encoder: str,
        decoder: str,
        adapter: str,
        reranker: str | None = None,
        rerank_depth: float | None = None,
    ) -> Any:
        """The shared pipeline for these settings (the page's choices, checked);
        ``reranker`` / ``rerank_depth`` None = the app's own (a client of the /chat API that
        predates them)."""
        models = self.models()
        index = self._existing_index(index)
        check_choice(encoder, models["encoders"], "encoder")
        check_choice(decoder, models["decoders"], "decoder")
        check_choice(adapter, models["adapters"], "adapter")
        retrieval = self.config.rag.retrieval
        reranker = reranker or retrieval.rerank or NO_RERANKER
        check_choice(reranker, models["rerankers"], "reranker")
        depth = retrieval.rerank_depth if rerank_depth is None else int(rerank_depth)
        if depth < 1:
            raise SettingError(f"rerank depth must be >= 1, not {depth}")
        # the app's config with this pipeline's models (None: the index's encoder, no adapter,
        # no reranker); the per-request settings stay the app's, so they share the pipeline
        choices = {
            "index": index,
            "encoder": None if encoder == INDEX_DEFAULT_ENCODER else encoder,
            "decoder": decoder,
            "adapter": None if adapter == NO_ADAPTER else adapter,
            "rerank": None if reranker == NO_RERANKER else reranker,
            "rerank_depth": depth,
        }
        return self.pipelines.get(build_config(choices, self.pipelines.base))

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
        reranker: str | None = None,
        rerank_depth: float | None = None,
        where: str | None = None,
    ) -> Iterator[tuple[list[dict], str, str, str]]:
        """Stream one answer: yields (chat, textbox, sources html, uncited html). The rerank
        settings and the filter come last and may be left out (the app's own), so /chat
        clients written before they existed keep working. ``where``: the filter box, clauses
        separated by spaces or ``;`` (``path=library/* type=pdf``, rag.retrieval.filters);
        empty = the app's ``--where``; a clause that cannot be read is the answer's error."""
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
            pipe = self._pipeline(index, encoder, decoder, adapter, reranker, rerank_depth)
            answer, raw = None, ""
            clauses = (where or "").replace(";", " ").split()
            stream = pipe.stream(
                question,
                history=turns,
                k=int(k),
                mode=mode,
                temperature=float(temperature),
                max_new_tokens=int(max_new_tokens),
                **({"where": clauses} if clauses else {}),
            )
            # closing(): a user who leaves mid-answer stops the decoding, not just the display.
            with contextlib.closing(stream):
                for item in stream:
                    if isinstance(item, Answer):
                        answer = item
                        break
                    raw += str(item)
                    shown = render.stream_markdown(raw)  # code stays code, prose is escaped
                    history[-1] = {"role": "assistant", "content": shown or "…"}
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
        lines = [f"- refused **{inert(r.name)}**: {inert(r.reason)}" for r in refused]
        if staged:
            from rag import IngestConfig, ingest_config

            # The pipeline's Retriever re-reads the index when ingest publishes a new
            # generation, so the next question sees the new chunks without reloading models.
            paths = [str(p) for p in staged]
            report = ingest_config(IngestConfig(paths=paths, **self._ingest_kwargs(index)))
            lines = _report_lines(report) + lines
        head = f"Index **{index}**: {len(staged)} file(s) accepted, {len(refused)} refused."
        return "\n".join([head, *lines])

    # ---- documents ------------------------------------------------------------------------

    def documents(self, index: str) -> tuple[str, Any]:
        """The Documents panel for ``index``: (table html, the removal picker's choices, none
        chosen). An index not created yet, or a bad name, is said in the table's place."""
        try:
            index = self._existing_index(index)
            from rag import list_documents

            docs = list_documents(index)
        except Exception as e:  # noqa: BLE001
            return f"<p>{html.escape(readable(e))}</p>", gr.update(choices=[], value=[])
        paths = sorted({d.path for d in docs.documents})
        table = render.documents_html(index, docs.documents, docs.generation)
        return table, gr.update(choices=paths, value=[])

    def confirm_removal(self, index: str, selected: list[str] | None) -> tuple[Any, str, str]:
        """First step of a removal: (the confirmation row shown, what it would remove, report
        cleared); with nothing chosen the row stays hidden and the report says why."""
        chosen = [p for p in (selected or []) if p]
        if not chosen:
            return gr.update(visible=False), "", "<p>Choose the documents to remove first.</p>"
        text = (
            f"<p>Remove {len(chosen)} document(s) from index <b>{html.escape(index)}</b>? "
            "They can be ingested again from their folder.</p>" + render.paths_html(chosen)
        )
        return gr.update(visible=True), text, ""

    def remove(self, index: str, selected: list[str] | None) -> tuple[str, str, Any, Any]:
        """Second step, after confirmation: remove ``selected`` from ``index`` (one new
        generation, :func:`rag.remove_documents`); returns (report html, table html,
        picker update, confirmation row hidden). A failure (a path removed meanwhile, an
        ingest running) is one line and nothing changes."""
        hidden = gr.update(visible=False)
        try:
            index = self._existing_index(index)
            chosen = [p for p in (selected or []) if p]
            if not chosen:
                raise SettingError("no document chosen")
            from rag import remove_documents

            report = remove_documents(index, chosen)
            done = (
                f"<p>Removed {len(report.removed)} document(s), {report.chunks_removed} chunks; "
                f"{report.chunks} chunks left ({html.escape(report.generation)}). A removed file "
                "still in its folder comes back at the next ingest of that folder.</p>"
                + render.paths_html(d.path for d in report.removed)
            )
        except Exception as e:  # noqa: BLE001
            log.exception("removing documents from %r failed", index)
            done = f"<p><b>Error:</b> {html.escape(readable(e))}</p>"
        table, picker = self.documents(index)
        return done, table, picker, hidden

    def _existing_index(self, index: str) -> str:
        index = check_index_name(index)
        if index not in list_indexes():
            raise SettingError(f"index {index!r} does not exist yet: upload documents to create it")
        return index

    def _ingest_kwargs(self, index: str) -> dict[str, Any]:
        kwargs: dict[str, Any] = {"index": index}
        encoder = self.config.rag.retrieval.encoder
        if index not in list_indexes() and encoder:
            # a new index is built with the app's encoder when one was given; else ingest
            # picks it (rag.models.default_encoder: minilm-tuned when trained, else minilm)
            kwargs["encoder"] = encoder
        return kwargs


def _turns(history: list[dict]) -> list[dict[str, str]]:
    """The finished chat turns as plain ``{"role", "content"}`` messages for the pipeline."""
    return [
        {"role": m["role"], "content": _text(m.get("content"))}
        for m in history
        if m.get("role") in ("user", "assistant")
    ]


def _report_lines(report: Any) -> list[str]:
    """Markdown lines from a :class:`rag.IngestReport`: its summary, then each failed and
    each skipped file with the reason (the same per-file report as ``python -m rag.ingest``:
    an upload that holds no text, or a page that asks not to be indexed, is skipped)."""
    lines = [f"- {inert(report.summary())}"]
    for kind, files in (("failed", report.failures), ("skipped", report.skipped)):
        lines += [
            f"- {kind} **{inert(Path(path).name)}**: {inert(reason)}" for path, reason in files
        ]
    return lines
