"""The chat UI in a real browser: Debian's Chromium driven by Playwright (never a browser
download). A tiny index is built through rag.ingest; only the decoder is scripted (see
tests/ui_support.py), so retrieval, citation parsing, rendering and clicking are all real."""

from __future__ import annotations

import os
import shutil

import pytest
from ui_support import ScriptedGenerator, build_index, module_rag_home, scripted_factory, serve

CHROMIUM = "/usr/bin/chromium"
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]

pytestmark = [pytest.mark.browser, pytest.mark.server]


@pytest.fixture(scope="module")
def browser():
    if not os.path.exists(CHROMIUM):
        hint = "run `make browser` (apt-get install -y chromium)"
        reason = (
            f"{CHROMIUM} is absent and apt-get is unavailable"
            if not shutil.which("apt-get")
            else f"{CHROMIUM} is absent: {hint}"
        )
        pytest.skip(reason)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        yield b
        b.close()


@pytest.fixture(scope="module")
def app_url(tmp_path_factory, request):
    with module_rag_home(tmp_path_factory):
        build_index(tmp_path_factory.mktemp("corpus"), "uitest", "minilm")
        gen = ScriptedGenerator(delay=0.15)
        with serve("uitest", scripted_factory(gen), mode="hybrid", k=3) as (url, _demo):
            yield url, gen


# Records every text the last assistant message shows, to see the answer arrive in pieces.
_WATCH = """
window.__seen = [];
new MutationObserver(() => {
  const bots = document.querySelectorAll('#chat .bot, #chat [data-testid="bot"]');
  if (bots.length) { const t = bots[bots.length - 1].innerText; if (window.__seen.at(-1) !== t) window.__seen.push(t); }
}).observe(document.body, {subtree: true, childList: true, characterData: true});
"""


def _ask(page, question: str) -> None:
    page.locator("#question textarea").fill(question)
    page.locator("#ask").click()


def test_streamed_cited_answer_opens_its_source(browser, app_url, tmp_path):
    url, gen = app_url
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.goto(url)
    page.evaluate(_WATCH)
    _ask(page, "How do I close a file in Python?")

    marker = page.locator('#chat a[href$="#src-1"]').last
    marker.wait_for(timeout=60_000)
    seen = page.evaluate("window.__seen")
    assert any("According" in s and "[1]" not in s for s in seen), seen  # partial text shown first

    source = page.locator("#src-1")
    assert source.evaluate("e => e.open") is False
    marker.click()
    page.wait_for_function("document.getElementById('src-1').open === true", timeout=10_000)
    summary = source.locator("summary").inner_text()
    assert "files.md" in summary and "Closing a file" in summary
    assert "with statement" in source.locator("pre").inner_text()
    page.screenshot(path=str(tmp_path / "ui_answer.png"), full_page=True)
    assert (tmp_path / "ui_answer.png").stat().st_size > 10_000

    # The prompt the decoder got holds the cited passage as [1].
    assert "[1] " in gen.prompts[-1][-1]["content"] and "close()" in gen.prompts[-1][-1]["content"]

    # Retrieved-but-not-cited passages are one click away.
    page.locator("#uncited-box").get_by_text("Retrieved but not cited").click()
    assert "#2" in page.locator("#uncited").inner_text(timeout=10_000)


def test_follow_up_is_rewritten_and_shown(browser, app_url):
    url, _ = app_url
    page = browser.new_page()
    page.goto(url)
    _ask(page, "How do I delete a git branch?")
    page.locator("#sources >> text=Cited passages").wait_for(timeout=60_000)
    _ask(page, "and how do I create one?")
    page.locator("#sources >> text=rewritten from").wait_for(timeout=60_000)
    text = page.locator("#sources").inner_text()
    assert "git" in text.split("rewritten from")[0] and "branch" in text.split("rewritten from")[0]


def test_documents_panel_lists_and_removes_after_confirmation(browser, app_url):
    """The Documents panel: the index's files listed; removing one asks first, then the table
    no longer lists it. The file is still in the corpus folder, so re-ingesting that folder
    brings it back (the re-ingest rule), which also leaves the index as the other tests need."""
    from rag.ingest import ingest, list_documents

    page = browser.new_page(viewport={"width": 1400, "height": 1200})
    page.goto(app_url[0])
    page.get_by_text("Documents in the current index").click()
    table = page.locator("#documents table")
    table.wait_for(timeout=60_000)
    assert "files.md" in table.inner_text() and "git.md" in table.inner_text()

    page.locator("#documents-pick input").click()
    page.get_by_role("option", name="git.md").click()
    page.keyboard.press("Escape")
    page.locator("#documents-remove").click()
    confirm = page.locator("#documents-confirm")
    confirm.get_by_text("Remove 1 document(s)").wait_for(timeout=30_000)
    assert "git.md" in confirm.inner_text()
    assert "git.md" in table.inner_text()  # nothing removed before the confirmation
    page.locator("#documents-yes").click()
    page.locator("#documents-report").get_by_text("Removed 1 document(s)").wait_for(timeout=60_000)
    page.wait_for_function(
        "!document.querySelector('#documents table').innerText.includes('git.md')",
        timeout=30_000,
    )
    assert not confirm.is_visible()
    left = list_documents("uitest").documents
    assert [d.path for d in left] == ["files.md"]

    folder = left[0].source.rsplit("/", 1)[0]
    assert ingest([folder], index="uitest").added == [f"{folder}/git.md"]
