"""Turn a :class:`rag.types.Answer` into what the UI shows: the chat reply (markdown with
citation markers as links) and the sources panel (HTML).

Each cited passage is a ``<details id="src-N">`` block; a marker ``[N]`` in the reply is a link
to ``#src-N``, and a small script (:data:`CITATION_JS`) opens and scrolls to that block when the
link is clicked. All document text is HTML-escaped here: chunk text comes from user uploads.

Markers are shown as citation verification (:mod:`rag.answer.verify`) left them: a re-attributed
marker ``[2]`` becomes ``[2→3]`` and links to passage 3, an unsupported one ``[2?]`` (class
``rag-unsupported``), each with a tooltip. The verdicts are per passage number (what
:class:`~rag.types.Answer` records), so every marker of a number gets its number's mark.

The reply stays markdown (Gradio renders it): fenced code blocks and inline code spans are left
verbatim (no marker inside code becomes a link), prose outside code is made inert
(:mod:`rag.answer.markup`: no tag, no image, no link of the text's own) so text that the model copied
from a document cannot become markup or make the browser fetch a planted URL, and a fence the
decoder left open is closed before any note is appended. The only links in a reply are the
citation markers this module writes (``#src-N``, same page).
"""

from __future__ import annotations

import datetime
import html
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

# One definition of what a citation marker is: the parser's own (``lines[1]`` is code).
from rag import (
    CITATION,
    CITATION_RUN,
    FENCE_START,
    Answer,
    AnswerSpan,
    Citation,
    Hit,
    close_fence,
    inert,
    page_label,
    quotes_block,
    split_code,
    split_short_answer,
)

UNSUPPORTED_TIP = "not supported by the cited passage"

# Opens the cited passage when its marker is clicked (capture phase: before the chatbot's own
# link handling, which would otherwise try to navigate).
CITATION_JS = """
<script>
document.addEventListener('click', function (e) {
  const a = e.target.closest && e.target.closest('a[href*="#src-"]');
  if (!a) return;
  e.preventDefault();
  e.stopPropagation();
  const id = a.getAttribute('href').split('#').pop();
  const el = document.getElementById(id);
  if (!el) return;
  el.open = true;
  el.scrollIntoView({block: 'center'});
  el.classList.add('rag-flash');
  setTimeout(function () { el.classList.remove('rag-flash'); }, 1500);
}, true);
</script>
"""

CSS = """
.rag-source { border: 1px solid var(--border-color-primary); border-radius: 6px;
  padding: 4px 8px; margin: 6px 0; }
.rag-source summary { cursor: pointer; font-weight: 600; }
.rag-source pre { white-space: pre-wrap; font-size: 0.85em; max-height: 24em; overflow: auto; }
.rag-flash { outline: 3px solid var(--color-accent); }
.rag-query code { white-space: pre-wrap; }
.rag-meta { color: var(--body-text-color-subdued); font-size: 0.85em; }
a.rag-unsupported { color: var(--error-text-color, #b91c1c);
  text-decoration: underline dotted; cursor: help; }
a.rag-reattributed { text-decoration: underline dashed; }
.rag-label { font-size: 0.75em; font-weight: normal; border: 1px solid currentColor;
  border-radius: 4px; padding: 0 4px; margin-left: 4px; }
.rag-label.rag-unsupported { color: var(--error-text-color, #b91c1c); }
.rag-documents { border-collapse: collapse; font-size: 0.9em; }
.rag-documents th, .rag-documents td { text-align: left; padding: 2px 8px;
  border-bottom: 1px solid var(--border-color-primary); }
.rag-warning { border-left: 4px solid #d97706; background: rgba(217, 119, 6, 0.12);
  padding: 4px 8px; }
"""


# ---------------------------------------------------------------------------- markers


def _anchor(number: int, label: str, cls: str, tip: str) -> str:
    return f'<a href="#src-{number}" class="rag-cite {cls}" title="{html.escape(tip)}">{label}</a>'


@dataclass(frozen=True)
class Marks:
    """How the markers of each passage number are shown: ``cited`` numbers are links,
    ``unsupported`` ones carry the ``?`` mark, ``moved[n]`` are the passages a citation of n was
    re-attributed to; any other number named no given passage (``[7?]``, never linked)."""

    cited: frozenset[int]
    unsupported: frozenset[int] = frozenset()
    moved: dict[int, tuple[int, ...]] = field(default_factory=dict)

    @classmethod
    def of(cls, answer: Answer) -> Marks:
        moved: dict[int, tuple[int, ...]] = {}
        for old, new in answer.reattributed:
            moved[old] = (*moved.get(old, ()), new)
        flagged = {c.number for c in answer.citations if not c.supported}
        return cls(
            cited=frozenset(c.number for c in answer.citations),
            unsupported=frozenset(flagged | set(answer.unsupported_citations)),
            moved=moved,
        )

    def marker(self, n: int) -> str:
        """The markdown for one marker number."""
        targets = self.moved.get(n, ())
        if n not in self.cited:
            if not targets:
                return f"\\[{n}?\\]"
            tip = "re-attributed: the sentence is supported by passage {m}, not {n}"
            return "".join(
                _anchor(m, f"[{n}→{m}]", "rag-reattributed", tip.format(m=m, n=n)) for m in targets
            )
        out = (
            _anchor(n, f"[{n}?]", "rag-unsupported", UNSUPPORTED_TIP)
            if n in self.unsupported
            else f"[[{n}]](#src-{n})"
        )
        tip = "re-attributed in part: a sentence this marker covers is supported by passage {m}, not {n}"
        return out + "".join(
            _anchor(m, f"[→{m}]", "rag-reattributed", tip.format(m=m, n=n)) for m in targets
        )

    def run(self, text: str) -> str:
        """A marker run (``[1][3]``, ``[2, 7]``) with each number shown by :meth:`marker`."""
        nums = [int(x) for m in CITATION.finditer(text) for x in m.group(1).split(",")]
        return "".join(self.marker(n) for n in nums)


# ---------------------------------------------------------------------------- code and prose


def _escape_span(text: str) -> str:
    """A short answer inside ``**...**``: no tag, no emphasis or link syntax of its own."""
    flat = " ".join(text.split())
    return re.sub(r"([\\`*_\[\]()#!|~>])", r"\\\1", html.escape(flat, quote=False))


def _prose(text: str, marks: Marks | None) -> str:
    """Prose made inert (:func:`rag.answer.markup.inert`: the browser never fetches what a document
    planted), with its marker runs shown by ``marks`` (None: escaped as text too)."""
    if marks is None:
        return inert(text)
    out, pos = [], 0
    for m in CITATION_RUN.finditer(text):
        out += [inert(text[pos : m.start()]), marks.run(m.group(0))]
        pos = m.end()
    out.append(inert(text[pos:]))
    return "".join(out)


def render_markdown(text: str, marks: Marks | None) -> tuple[str, bool]:
    """``text`` with the markers in its prose shown by ``marks`` (None: shown as text) and the
    rest of the prose inert (no tag, image or link); code is kept verbatim and a fence left open is closed. Returns
    the markdown and whether it ends with a fenced code block."""
    pieces, fence = split_code(text)
    out = close_fence("".join(p if is_code else _prose(p, marks) for p, is_code in pieces), fence)
    last, is_code = pieces[-1] if pieces else ("", False)
    ends_in_block = bool(fence) or (
        is_code and "\n" in last and FENCE_START.match(last) is not None
    )
    return out, ends_in_block


def link_markers(raw_text: str, valid: set[int]) -> str:
    """Replace ``[2]`` / ``[1, 3]`` with markdown links to ``#src-N``; numbers that name no given
    passage are kept as plain text with a note (never linked). Code is left as it is."""
    return render_markdown(raw_text, Marks(frozenset(valid)))[0]


def stream_markdown(raw: str) -> str:
    """The reply while it streams: the decoder's text made inert outside code (markers are
    linked once the answer, and so its citations, is complete)."""
    return render_markdown(raw, None)[0]


def _numbers(nums: Iterable[int]) -> str:
    return ", ".join(f"[{n}]" for n in nums)


def reply_markdown(answer: Answer) -> str:
    """The chat reply: the model's text with linked markers, plus a note for what the citations
    check found and for dropped markers."""
    marks = Marks.of(answer)
    raw = answer.raw_text or answer.text
    span = answer.answer_span
    if span is not None and span.origin == "decoder":  # the reply's last line goes on top
        raw = split_short_answer(raw).rest
    text, ends_in_block = render_markdown(raw, marks)
    if span is not None:  # the short answer, bold, above the sentences
        text = f"**{_escape_span(span.text)}**\n\n{text}"
    if answer.citations_completed and answer.citations:
        # raw_text is the model's own reply, without the marker completion appended.
        targets = {new for _, new in answer.reattributed}
        nums = [old for old, _ in answer.reattributed]
        nums += [c.number for c in answer.citations if c.number not in targets]
        markers = "".join(marks.marker(n) for n in dict.fromkeys(nums))
        text += ("\n\n" if ends_in_block else " ") + markers
        if answer.citation_logprobs:  # the decoder's own likelihoods chose it; else word support
            text += "\n\n*The model did not cite by itself; the marker is the passage it finds most likely (citation completion).*"
    if answer.quotes:  # the encoder's sentences, word for word, under the reply
        text += render_markdown(quotes_block(answer.quotes, citations=answer.citations), marks)[0]
    if marks.unsupported:
        text += (
            f"\n\n*Citation(s) {_numbers(sorted(marks.unsupported))} (marked ?) are not "
            "supported by the passage they name (automatic check): read it before trusting "
            "the sentence.*"
        )
    if answer.reattributed:
        moves = ", ".join(f"[{old}→{new}]" for old, new in answer.reattributed)
        text += f"\n\n*Citation(s) moved to the passage that supports the sentence: {moves}.*"
    if answer.suspected_injection:
        text += (
            "\n\n**Warning:** this answer may repeat instructions found in a document "
            "(see the sources panel)."
        )
    if answer.invalid_citations:
        bad = ", ".join(str(n) for n in answer.invalid_citations)
        text += f"\n\n*Citation(s) {bad} named no retrieved passage and were dropped.*"
    if not answer.citations and not answer.refused and answer.passages:
        text += "\n\n*No passage was cited: check the sources before trusting this answer.*"
    return text


# ---------------------------------------------------------------------------- sources panel


def _heading(path: tuple[str, ...] | list[str]) -> str:
    return " › ".join(path) if path else "(no heading)"


def _label(text: str, cls: str, tip: str) -> str:
    return f'<span class="rag-label {cls}" title="{html.escape(tip)}">{html.escape(text)}</span>'


def _block(
    number: int | None,
    path: str,
    heading_path: Sequence[str],
    text: str,
    score: float,
    open_: bool,
    labels: str = "",
    highlight: tuple[int, int] | None = None,
    page: int = 0,
) -> str:
    """One passage; ``path`` is the display path (relative to the ingested folder: the server's
    absolute paths are not shown to whoever reaches the UI), ``page`` its PDF page (0: none);
    ``labels`` is trusted HTML."""
    anchor = f' id="src-{number}"' if number is not None else ""
    label = f"[{number}] " if number is not None else ""
    summary = (
        f"{label}{html.escape(path)}{page_label(page)}"
        f" — {html.escape(_heading(tuple(heading_path)))}"
        f' <span class="rag-meta">score {score:.3f}</span>{labels}'
    )
    return (
        f'<details class="rag-source"{anchor}{" open" if open_ else ""}>'
        f"<summary>{summary}</summary><pre>{highlighted(text, highlight)}</pre></details>"
    )


def highlighted(text: str, span: tuple[int, int] | None) -> str:
    """``text`` escaped, with ``text[start:end]`` (the reader's answer) in a ``<mark>``; the
    span's own characters are escaped like the rest, so a span holding ``<script>`` is text."""
    if span is None or not (0 <= span[0] < span[1] <= len(text)):
        return html.escape(text)
    a, z = span
    return (
        f'{html.escape(text[:a])}<mark class="rag-answer">{html.escape(text[a:z])}</mark>'
        f"{html.escape(text[z:])}"
    )


def citation_html(
    c: Citation, moved_from: Sequence[int] = (), span: AnswerSpan | None = None
) -> str:
    """A cited passage, labelled "unsupported" when verification flagged it and "re-attributed
    from [n]" for each citation moved to it; the reader's ``span`` highlighted when it is in this
    passage (the passage is then shown open)."""
    labels = ""
    if not c.supported:
        tip = f"{UNSUPPORTED_TIP}: a sentence citing [{c.number}] claims what it does not say"
        labels += _label("unsupported", "rag-unsupported", tip)
    for n in moved_from:
        tip = f"re-attributed: the sentence cited passage {n}; it is supported by this passage"
        labels += _label(f"re-attributed from [{n}]", "rag-reattributed", tip)
    mark = (span.start, span.end) if span is not None and span.chunk_id == c.chunk_id else None
    return _block(
        c.number,
        c.display_path,
        c.heading_path,
        c.text,
        c.score,
        open_=mark is not None,
        labels=labels,
        highlight=mark,
        page=c.page,
    )


def injection_html(answer: Answer) -> str:
    """The warning line for an answer suspected of following an instruction planted in a
    passage ("" when not suspected); the reasons quote documents, so they are escaped."""
    if not answer.suspected_injection:
        return ""
    reasons = "; ".join(answer.injection_reasons) or "instruction-like text"
    return (
        '<p class="rag-warning" role="alert">⚠ This answer may repeat instructions found in a '
        f"document: {html.escape(reasons)}</p>"
    )


def sources_html(answer: Answer, question: str) -> str:
    """The sources panel: the injection warning (when suspected), the retrieval query (whether
    it was rewritten, which reranker ordered the passages), then the cited passages with their
    verification labels."""
    query = answer.query or question
    parts = [injection_html(answer)] if answer.suspected_injection else []
    parts.append(f'<p class="rag-query">Retrieval query: <code>{html.escape(query)}</code>')
    if query.strip() != question.strip():
        parts.append(f'<br><span class="rag-meta">rewritten from: {html.escape(question)}</span>')
    if answer.reranker and answer.passages:
        parts.append(
            f'<br><span class="rag-meta">reranked by {html.escape(answer.reranker)}</span>'
        )
    parts.append("</p>")
    if answer.citations:
        parts.append(f"<h4>Cited passages ({len(answer.citations)})</h4>")
        for c in answer.citations:
            moved_from = [old for old, new in answer.reattributed if new == c.number]
            parts.append(citation_html(c, moved_from, answer.answer_span))
    elif answer.refused:
        parts.append("<p>The answer is a refusal: no passage was judged to contain it.</p>")
    else:
        parts.append("<p>No passage was cited.</p>")
    return "\n".join(parts)


def uncited_hits(answer: Answer) -> list[tuple[int, Hit]]:
    """(prompt number, hit) for retrieved passages that the answer did not cite."""
    cited = {c.number for c in answer.citations}
    return [(i, h) for i, h in enumerate(answer.passages, start=1) if i not in cited]


def uncited_html(answer: Answer) -> str:
    """Retrieved passages the answer does not cite, each labelled "re-attributed to [m]" when
    the model cited it and verification moved the citation."""
    hits = uncited_hits(answer)
    if not hits:
        return (
            "<p>Every retrieved passage was cited.</p>"
            if answer.passages
            else "<p>Nothing was retrieved.</p>"
        )
    blocks = []
    for i, h in hits:
        labels = "".join(
            _label(
                f"re-attributed to [{new}]",
                "rag-reattributed",
                f"the model cited this passage; the sentence is supported by passage {new}",
            )
            for old, new in answer.reattributed
            if old == i
        )
        block = _block(
            None,
            h.chunk.display_path,
            h.chunk.heading_path,
            h.chunk.text,
            h.score,
            open_=False,
            labels=labels,
            page=h.chunk.page,
        )
        blocks.append(block.replace("<summary>", f"<summary>#{i} ", 1))
    return "\n".join(blocks)


def error_markdown(message: str) -> str:
    """A readable error in the chat (the traceback goes to the log only), inert: a message can
    quote a file name or a document."""
    return f"**Error:** {inert(message)}"


# ---------------------------------------------------------------------------- documents panel


def _size(n: int) -> str:
    if n < 1024:
        return f"{n} B"
    return f"{n / 1024:.1f} KiB" if n < 1024**2 else f"{n / 1024**2:.1f} MiB"


def documents_html(index: str, docs: Sequence[Any], generation: str) -> str:
    """The Documents panel's table: one row per document (``rag.ingest.DocumentInfo``), every
    value escaped (file names come from users' folders and uploads)."""
    if not docs:
        return f"<p>Index <b>{html.escape(index)}</b> holds no documents.</p>"
    rows = "".join(
        "<tr>"
        f"<td><code>{html.escape(d.path)}</code></td><td>{html.escape(d.type)}</td>"
        f"<td>{d.chunks}</td><td>{_size(d.bytes)}</td>"
        f"<td>{html.escape(iso_date(d.ingested))}</td>"
        "</tr>"
        for d in docs
    )
    total = sum(d.chunks for d in docs)
    return (
        f'<p class="rag-meta">Index <b>{html.escape(index)}</b> ({html.escape(generation)}): '
        f"{len(docs)} documents, {total} chunks.</p>"
        '<table class="rag-documents"><thead><tr><th>Path</th><th>Type</th><th>Chunks</th>'
        f"<th>Size</th><th>Ingested</th></tr></thead><tbody>{rows}</tbody></table>"
    )


def iso_date(t: float) -> str:
    """When a document was ingested, to the minute (UTC); "unknown" when not recorded."""
    if not t:
        return "unknown"
    when = datetime.datetime.fromtimestamp(t, tz=datetime.timezone.utc)
    return when.strftime("%Y-%m-%d %H:%M UTC")


def paths_html(paths: Iterable[str]) -> str:
    """A list of document paths, escaped (the confirmation and the removal report)."""
    return "<ul>" + "".join(f"<li><code>{html.escape(p)}</code></li>" for p in paths) + "</ul>"
