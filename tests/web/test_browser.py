"""The desk in a real browser: the system's Chromium, driven by Playwright, against a real
`onwatch web` process serving a real inbox file."""

from __future__ import annotations

import asyncio
import time

import pytest

from onwatch.core import Inbox

from .helpers import CHROMIUM, NO_CHROMIUM, Screen, WebProcess, launch
from .seed import APPROVAL, seed

pytestmark = [pytest.mark.slow, pytest.mark.skipif(CHROMIUM is None, reason=NO_CHROMIUM)]

playwright_api = pytest.importorskip("playwright.async_api")


@pytest.fixture
async def desk(tmp_path):
    db = tmp_path / "alice.db"
    await seed(db)
    web = WebProcess(db, tmp_path).start()
    yield db, web
    assert web.stop() == 0, web.err.read_text()


@pytest.fixture
async def browser():
    async with playwright_api.async_playwright() as playwright:
        browser = await launch(playwright)
        yield browser
        await browser.close()


async def answer(db, request_id: str, timeout: float = 20.0) -> str | None:
    """The stored answer, once there is one (bounded wait)."""
    deadline = time.monotonic() + timeout
    async with await Inbox.open(db, create=False) as inbox:
        while time.monotonic() < deadline:
            approval = await inbox.get_approval(request_id)
            if approval.answer is not None:
                return approval.answer
            await asyncio.sleep(0.1)
    return None


async def test_desk_in_the_browser_shows_the_panes_and_approves_by_keystroke(desk, browser):
    db, web = desk
    page = await browser.new_page(viewport={"width": 1280, "height": 800})
    screen = Screen(page)
    response = await page.goto(f"{web.url}/?token={web.token}")
    assert response.status == 200
    assert page.url == f"{web.url}/", "the token must leave the address bar"
    (cookie,) = await page.context.cookies()
    assert cookie["httpOnly"] and cookie["sameSite"] == "Strict"
    assert web.token not in cookie["value"]

    await screen.wait_for(
        "Pending", "Running", "Dead", "Approvals", "Timers", "Outbox", "msg-5", "lease"
    )
    await page.focus(".xterm-helper-textarea")
    await screen.press(page, "4")
    await screen.wait_for("send the daily digest", "refund 40")
    # the soonest deadline is first and selected; move to the hostile refund request
    await screen.press(page, "ArrowDown")
    await page.keyboard.press("a")
    await screen.wait_for("Approve this request?")
    async with await Inbox.open(db, create=False) as inbox:
        assert (await inbox.get_approval(APPROVAL)).answer is None  # asked, not yet done
    await page.keyboard.press("y")
    assert await answer(db, APPROVAL) == "yes"
    async with await Inbox.open(db, create=False) as inbox:
        assert (await inbox.get_approval("send-digest")).answer is None
        (entry,) = await inbox.audit(limit=5, target=f"approval {APPROVAL}")
        assert (entry.before, entry.after, entry.applied) == ("waiting", "yes", True)


async def test_hostile_text_stays_inert_in_the_page(desk, browser):
    db, web = desk
    page = await browser.new_page(viewport={"width": 1280, "height": 800})
    screen = Screen(page)
    await page.goto(f"{web.url}/?token={web.token}")
    await screen.wait_for("Pending")
    title = await page.title()
    scripts = await page.evaluate("document.scripts.length")
    await page.focus(".xterm-helper-textarea")
    await page.keyboard.press("4")
    # Markup shown as its own characters (a parsed [@click] would leave just "x"), HTML as
    # text inside the terminal's canvas, ESC shown as the four characters \x1b.
    await screen.wait_for(
        "[@click=app.quit]x[/]", "<script>window.__pwned=1</script>", "\\x1b]0;PWNED\\x07\\x1b[2J"
    )
    assert b"\x1b]0;PWNED" not in screen.raw and b"PWNED\x07" not in screen.raw
    assert b"\x1b[2J<img" not in screen.raw
    # the hostile event's payload, in its detail view (pane 1, its first row, Enter). Each
    # key waits for what only its answer draws: the approvals pane redraws every second (its
    # countdowns), so "some frame came" would not say the key was taken.
    shown = screen.mark()
    await page.keyboard.press("1")
    await screen.wait_for("available", since=shown)  # the Pending pane's header, drawn anew
    for attempt in range(3):  # Enter opens the detail; a key lost in transit is pressed again
        shown = screen.mark()
        await page.keyboard.press("Enter")
        try:
            await screen.wait_for("esc close", timeout=5, since=shown)
            break
        except AssertionError:
            if attempt == 2:
                raise
    await screen.wait_for(
        "[@click=app.quit]pay[/]",
        "<script>window.__pwned=3</script>",
        "[link=https://evil.example]here[/link]",
        since=shown,
    )
    assert b"\x1b]0;PAYLOAD" not in screen.raw and b"PAYLOAD\x07" not in screen.raw
    assert b"\x1b]8;" not in screen.raw  # no hyperlink was made of the [link] markup
    await page.keyboard.press("Escape")
    assert await page.evaluate("window.__pwned") is None
    assert await page.evaluate("document.scripts.length") == scripts
    assert await page.evaluate("document.querySelectorAll('img').length") == 0
    assert await page.title() == title
    # the app is still there and still answers keys
    await page.keyboard.press("6")
    await screen.wait_for("Outbox")
    assert "Session ended" not in await page.evaluate(
        "document.body.classList.contains('-closed') ? 'Session ended' : ''"
    )


async def test_wrong_token_gets_401_then_429_and_the_token_never_reaches_the_log(desk, browser):
    db, web = desk
    operator = await (await browser.new_context()).new_page()
    assert (await operator.goto(f"{web.url}/?token={web.token}")).status == 200
    guesser = await (await browser.new_context()).new_page()
    assert (await guesser.goto(f"{web.url}/")).status == 401  # no token: refused, not counted
    for n in range(5):
        response = await guesser.goto(f"{web.url}/?token=guess-{n}")
        assert response.status == 401
    assert await guesser.context.cookies() == []
    limited = await guesser.goto(f"{web.url}/?token={web.token}")
    assert limited.status == 429, "after five wrong tokens even the right one waits"
    assert 0 < int(limited.headers["retry-after"]) <= 60
    assert await guesser.context.cookies() == []
    # the operator's session, from the same address, is not locked out by the guessing
    assert (await operator.reload()).status == 200
    log = web.err.read_text()
    assert "GET / 401" in log and "GET / 429" in log and "GET / 303" in log
    assert web.token not in log and "guess-" not in log
    assert web.out.read_text().count(web.token) == 1  # printed once, at start, on stdout
