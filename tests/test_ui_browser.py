"""The chat UI in a real browser: Debian's Chromium driven by Playwright (never a browser
download). A tiny index is built through rag.ingest; only the decoder is scripted (see
tests/ui_support.py), so retrieval, citation parsing, rendering and clicking are all real."""

from __future__ import annotations

import contextlib
import os
import shutil
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

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


@contextlib.contextmanager
def _listener():
    """A local HTTP server that records every request it gets: (port, paths)."""
    paths: list[str] = []

    class Record(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - the http.server API
            paths.append(self.path)
            self.send_response(204)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Record)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1], paths
    finally:
        server.shutdown()
        server.server_close()


def test_planted_image_and_link_make_the_browser_fetch_nothing(browser, app_url):
    """An answer that copied a document's ``![x](http://127.0.0.1:PORT/leak?d=...)`` (the RAG
    exfiltration channel, docs/security.md) shows it as text while it streams and once done:
    the local listener gets no request and the page makes none to it; a planted link shows its
    target."""
    url, gen = app_url
    with _listener() as (port, paths):
        leak = f"http://127.0.0.1:{port}/leak?d=close+a+file"
        link = f"http://127.0.0.1:{port}/guide?d=q"
        old = gen.pieces
        gen.pieces = [
            "According ",
            f"![status]({leak}) ",
            "to the documents ",
            f"[guide]({link})",
            " [1].",
        ]
        page = browser.new_page()
        requested: list[str] = []
        page.on("request", lambda r: requested.append(r.url) if f":{port}/" in r.url else None)
        try:
            page.goto(url)
            _ask(page, "How do I close a file in Python?")
            page.locator('#chat a[href$="#src-1"]').last.wait_for(timeout=60_000)
            page.wait_for_timeout(1_000)  # time for any image the page would load
            chat = page.locator("#chat")
            text = chat.inner_text()
            hidden = chat.evaluate(
                "(el, port) => [...el.querySelectorAll('a[href*=\":' + port + '/\"]')]"
                ".filter(a => !a.innerText.includes(a.getAttribute('href'))).length",
                port,
            )
            images = chat.evaluate("el => el.querySelectorAll('img[src*=\"leak\"]').length")
        finally:
            gen.pieces = old
            page.close()
        assert paths == [] and requested == []
        assert images == 0 and hidden == 0
        assert f"![status]({leak})" in text and f"[guide]({link})" in text  # shown, as text


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
