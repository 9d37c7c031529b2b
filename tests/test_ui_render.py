"""Rendering of answers and sources (ui/render.py): markers become links only for passages
that were given, document text is escaped, uncited passages are listed."""

from __future__ import annotations

from rag.types import Answer, Chunk, Citation, Hit
from ui.render import link_markers, reply_markdown, sources_html, uncited_html


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


def test_uncited_lists_the_rest():
    html = uncited_html(_answer("x [2]", [2]))
    assert "#1 " in html and "#3 " in html and "f2.md" not in html


def test_completed_citation_is_linked_and_labelled():
    from rag.types import Answer, Citation

    cite = Citation(2, "docs/a.md", ("A",), "text", 0.5, "c2")
    answer = Answer(text="It saves prefill.", citations=[cite], raw_text="It saves prefill.")
    answer.citations_completed = True
    md = reply_markdown(answer)
    assert "[[2]](#src-2)" in md and "citation completion" in md
