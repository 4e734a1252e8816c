"""The browser desk shows the same: a running event's transcript followed live in the page,
written by a worker in another process (real `onwatch web`, the system's Chromium)."""

from __future__ import annotations

import pytest

from onwatch.core import Inbox

from tests.web.helpers import CHROMIUM, NO_CHROMIUM, Screen, WebProcess, launch
from tests.worker.helpers import query, stop

from .helpers import log_of, say, start_worker, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.skipif(CHROMIUM is None, reason=NO_CHROMIUM)]

playwright_api = pytest.importorskip("playwright.async_api")


async def test_the_browser_desk_follows_a_running_events_transcript(tmp_path):
    path = tmp_path / "alice.db"
    async with await Inbox.open(str(path)) as inbox:
        await inbox.ingest("chat", "m-1", {})
    worker = start_worker(str(path), "talker", tmp_path)
    web = None
    try:
        wait_for(
            lambda: query(str(path), "SELECT status FROM events") == [("running",)],
            what="the worker to claim the event",
        )
        say(tmp_path, 1, "log said before the page opened")
        web = WebProcess(path, tmp_path).start()
        async with playwright_api.async_playwright() as playwright:
            browser = await launch(playwright)
            try:
                page = await browser.new_page(viewport={"width": 1280, "height": 800})
                screen = Screen(page)
                await page.goto(web.link)  # the one-time link `onwatch web` printed
                await page.wait_for_url(f"{web.origin}/")
                await screen.wait_for("Pending", "Running")
                await page.focus(".xterm-helper-textarea")
                await screen.press(page, "2")
                await screen.wait_for("m-1")
                await screen.press(page, "Enter")
                await screen.wait_for("following", "said before the page opened")
                mark = screen.mark()
                say(tmp_path, 2, "log said while the page watches \x1b[2J")
                # No key pressed: the line reaches the page by itself, escaped.
                await screen.wait_for("said while the page watches \\x1b[2J", since=mark)
            finally:
                await browser.close()
        say(tmp_path, 3, "end")
        wait_for(lambda: query(str(path), "SELECT status FROM events") == [("done",)])
    finally:
        if web is not None:
            assert web.stop() == 0, web.err.read_text()
        assert stop(worker) == 0, log_of(tmp_path)
