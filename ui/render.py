"""Turn a :class:`rag.types.Answer` into what the UI shows: the chat reply (markdown with
citation markers as links) and the sources panel (HTML).

Each cited passage is a ``<details id="src-N">`` block; a marker ``[N]`` in the reply is a link
to ``#src-N``, and a small script (:data:`CITATION_JS`) opens and scrolls to that block when the
link is clicked. All document text is HTML-escaped here: chunk text comes from user uploads.
"""

from __future__ import annotations

import html
import re

from rag.types import Answer, Citation, Hit

# A marker, optionally wrapped in backticks by the model (a code span would hide the link).
_MARKER = re.compile(r"`?\[(\d+(?:\s*,\s*\d+)*)\]`?")

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
"""


def link_markers(raw_text: str, valid: set[int]) -> str:
    """Replace ``[2]`` / ``[1, 3]`` with markdown links to ``#src-N``; numbers that name no given
    passage are kept as plain text with a note (never linked)."""

    def repl(m: re.Match[str]) -> str:
        parts = []
        for num in (int(x) for x in m.group(1).split(",")):
            parts.append(f"[[{num}]](#src-{num})" if num in valid else f"\\[{num}?\\]")
        return "".join(parts)

    return _MARKER.sub(repl, raw_text)


def reply_markdown(answer: Answer) -> str:
    """The chat reply: the model's text with linked markers, plus a note for dropped markers."""
    valid = {c.number for c in answer.citations}
    text = link_markers(answer.raw_text or answer.text, valid)
    if answer.citations_completed:  # raw_text is the model's own reply, without the added marker
        markers = "".join(f"[[{c.number}]](#src-{c.number})" for c in answer.citations)
        text += f" {markers}\n\n*The model did not cite by itself; the marker is the passage it finds most likely (citation completion).*"
    if answer.invalid_citations:
        bad = ", ".join(str(n) for n in answer.invalid_citations)
        text += f"\n\n*Citation(s) {bad} named no retrieved passage and were dropped.*"
    if not answer.citations and not answer.refused and answer.passages:
        text += "\n\n*No passage was cited: check the sources before trusting this answer.*"
    return text


def _heading(path: tuple[str, ...] | list[str]) -> str:
    return " › ".join(path) if path else "(no heading)"


def _block(
    number: int | None, path: str, heading_path, text: str, score: float, open_: bool
) -> str:
    """One passage; ``path`` is the display path (relative to the ingested folder: the server's
    absolute paths are not shown to whoever reaches the UI)."""
    anchor = f' id="src-{number}"' if number is not None else ""
    label = f"[{number}] " if number is not None else ""
    summary = (
        f"{label}{html.escape(path)} — {html.escape(_heading(heading_path))}"
        f' <span class="rag-meta">score {score:.3f}</span>'
    )
    return (
        f'<details class="rag-source"{anchor}{" open" if open_ else ""}>'
        f"<summary>{summary}</summary><pre>{html.escape(text)}</pre></details>"
    )


def citation_html(c: Citation) -> str:
    return _block(c.number, c.display_path, c.heading_path, c.text, c.score, open_=False)


def sources_html(answer: Answer, question: str) -> str:
    """The sources panel: retrieval query (and whether it was rewritten), then cited passages."""
    query = answer.query or question
    parts = [f'<p class="rag-query">Retrieval query: <code>{html.escape(query)}</code>']
    if query.strip() != question.strip():
        parts.append(f'<br><span class="rag-meta">rewritten from: {html.escape(question)}</span>')
    parts.append("</p>")
    if answer.citations:
        parts.append(f"<h4>Cited passages ({len(answer.citations)})</h4>")
        parts.extend(citation_html(c) for c in answer.citations)
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
    hits = uncited_hits(answer)
    if not hits:
        return (
            "<p>Every retrieved passage was cited.</p>"
            if answer.passages
            else "<p>Nothing was retrieved.</p>"
        )
    return "\n".join(
        _block(
            None, h.chunk.display_path, h.chunk.heading_path, h.chunk.text, h.score, open_=False
        ).replace("<summary>", f"<summary>#{i} ", 1)
        for i, h in hits
    )


def error_markdown(message: str) -> str:
    """A readable error in the chat (the traceback goes to the log only)."""
    return f"**Error:** {message}"
