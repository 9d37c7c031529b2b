"""Screenshot a real answer in the running app with Debian's Chromium (how docs/ui.png is made).

    python -m ui.app --index docs &                     # the demo app
    python -m ui.screenshot --question "How do I start the chat UI?" --out docs/ui.png

Asks the question in the page, waits for the finished answer, opens the first cited source by
clicking its marker, and saves a full-page PNG. Uses /usr/bin/chromium (``make browser``); never
downloads a browser.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass

CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@dataclass
class ShotConfig:
    """One screenshot."""

    url: str = "http://127.0.0.1:7860/"  # the running app
    question: str = "How do I start the chat UI?"  # asked in the page
    out: str = "ui.png"  # PNG path to write
    chromium: str = "/usr/bin/chromium"  # browser executable
    timeout: float = 300.0  # seconds to wait for the finished answer
    width: int = 1400  # viewport width in CSS pixels
    height: int = 1000  # viewport height in CSS pixels


def take(cfg: ShotConfig) -> dict:
    """Ask, wait, open the first cited source, save the PNG; returns what the page showed."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=cfg.chromium, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": cfg.width, "height": cfg.height})
            page.goto(cfg.url)
            page.locator("#question textarea").fill(cfg.question)
            page.locator("#ask").click()
            ms = int(cfg.timeout * 1000)
            page.wait_for_function(
                "() => { const s = document.querySelector('#sources');"
                " return s && s.innerText.includes('Retrieval query'); }",
                timeout=ms,
            )
            markers = page.locator('#chat a[href*="#src-"]')
            cited = markers.count()
            if cited:
                markers.first.click()
                page.wait_for_timeout(500)
            page.screenshot(path=cfg.out, full_page=True)
            bots = page.locator("#chat .bot")
            return {
                "answer": bots.last.inner_text() if bots.count() else "",
                "markers": cited,
                "sources": page.locator("#sources").inner_text(),
                "out": cfg.out,
            }
        finally:
            browser.close()


def main(argv: list[str] | None = None) -> int:
    """Flags from ShotConfig (rag.cli.flags); exit 2 for a bad flag, 1 when the shot fails."""
    from rag.cli import run_cli
    from rag.cli.flags import config_from_args, dataclass_parser

    def run(args: argparse.Namespace) -> int:
        cfg = config_from_args(ShotConfig, args)
        try:
            shown = take(cfg)
        except Exception as e:  # noqa: BLE001 - whatever the browser raised, said in one line
            raise RuntimeError(f"screenshot of {cfg.url} failed: {type(e).__name__}: {e}") from e
        print(f"{cfg.out}: {shown['markers']} citation marker(s)\n{shown['answer']}")
        return 0

    return run_cli(dataclass_parser("python -m ui.screenshot", __doc__, ShotConfig), run, argv)


if __name__ == "__main__":
    sys.exit(main())
