"""The desk in a real browser: the system's Chromium, driven by Playwright, against a real
`onwatch web` process serving a real inbox file. Cookies, history and requests from other
sites are the browser's own, not simulated."""

from __future__ import annotations

import asyncio
import re
import sqlite3
import time
from urllib.parse import unquote

import pytest
from aiohttp import web as aioweb

from onwatch.core import Inbox

from .helpers import CHROMIUM, CHROMIUM_ARGS, NO_CHROMIUM, Screen, WebProcess, desk_processes
from .helpers import launch, wait_for
from .seed import APPROVAL, seed

pytestmark = [pytest.mark.slow, pytest.mark.skipif(CHROMIUM is None, reason=NO_CHROMIUM)]

playwright_api = pytest.importorskip("playwright.async_api")


@pytest.fixture
async def desk(tmp_path):
    db = tmp_path / "alice.db"
    await seed(db)
    web = WebProcess(db, tmp_path).start()
    yield db, web
    assert web.stop() == 0, web.log()


@pytest.fixture
async def playwright():
    async with playwright_api.async_playwright() as playwright:
        yield playwright


@pytest.fixture
async def browser(playwright):
    browser = await launch(playwright)
    yield browser
    await browser.close()


class LocalApp:
    """Another program on this machine: a web server on another port of 127.0.0.1 that
    records the cookies browsers send it and serves the pages it is given."""

    def __init__(self) -> None:
        self.cookies: list[str] = []
        self.pages: dict[str, str] = {}
        self.set_cookies: list[str] = []

    async def start(self) -> "LocalApp":
        async def handle(request: aioweb.Request) -> aioweb.Response:
            self.cookies.append(request.headers.get("Cookie", ""))
            response = aioweb.Response(
                text=self.pages.get(request.path, "hello"), content_type="text/html"
            )
            for header in self.set_cookies:
                response.headers.add("Set-Cookie", header)
            return response

        app = aioweb.Application()
        app.router.add_route("*", "/{tail:.*}", handle)
        self.runner = aioweb.AppRunner(app, access_log=None)
        await self.runner.setup()
        site = aioweb.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        self.port = self.runner.addresses[0][1]
        return self

    async def close(self) -> None:
        await self.runner.cleanup()


@pytest.fixture
async def local_app():
    app = await LocalApp().start()
    yield app
    await app.close()


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


async def open_desk(page, web: WebProcess) -> Screen:
    """Open the printed link, as the operator's one click does; the desk drawn."""
    screen = Screen(page)
    await page.goto(web.link)
    await page.wait_for_url(f"{web.origin}/")
    await screen.wait_for("Pending", "Approvals")
    return screen


async def test_the_printed_link_opens_the_desk_in_one_click_and_keys_work_at_once(desk, browser):
    db, web = desk
    page = await browser.new_page(viewport={"width": 1280, "height": 800})
    screen = await open_desk(page, web)
    assert page.url == f"{web.origin}/", "the one-time code must leave the address bar"
    assert await page.title() == "alice.db · onwatch"
    (cookie,) = await page.context.cookies()
    assert cookie["httpOnly"] and cookie["sameSite"] == "Strict"
    assert cookie["domain"] == web.host.split(":")[0]  # desk-….localhost, not 127.0.0.1
    assert web.token not in cookie["value"] and web.code not in cookie["value"]
    # no click, no focus call: the page gave the terminal the keyboard on load
    shown = screen.mark()
    await page.keyboard.press("4")
    await screen.wait_for("send the daily digest", "refund 40", since=shown)
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
    screen = await open_desk(page, web)
    title = await page.title()
    scripts = await page.evaluate("document.scripts.length")
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
    assert not await page.evaluate("document.body.classList.contains('-closed')")


async def test_wrong_tokens_get_401_then_429_and_no_token_reaches_the_log(desk, browser):
    db, web = desk
    operator = await (await browser.new_context()).new_page()
    await open_desk(operator, web)
    guesser = await (await browser.new_context()).new_page()
    assert (await guesser.goto(f"{web.origin}/")).status == 401  # the login page, not counted
    for n in range(5):
        await guesser.fill("#token", f"guess-{n}")
        async with guesser.expect_navigation() as navigation:
            await guesser.click("button[type=submit]")
        assert (await navigation.value).status == 401
        assert "That is not the token." in await guesser.content()
    assert await guesser.context.cookies() == []
    await guesser.fill("#token", web.token)
    async with guesser.expect_navigation() as navigation:
        await guesser.click("button[type=submit]")
    limited = await navigation.value
    assert limited.status == 429, "after five wrong tokens even the right one waits"
    assert 0 < int(limited.headers["retry-after"]) <= 60
    assert await guesser.context.cookies() == []
    # the operator's session, from the same address, is not locked out by the guessing
    assert (await operator.reload()).status == 200
    log = web.log()
    assert "POST /login 401 wrong token" in log and "POST /login 429" in log
    assert "POST /login 303 login by link" in log
    assert web.token not in log and "guess-" not in log and web.code not in log
    assert web.out.read_text().count(web.token) == 1  # printed once, at start, on stdout


async def test_the_session_cookie_never_reaches_another_local_port(desk, browser, local_app):
    """Browsers keep cookies per host name, not per port: under 127.0.0.1 the desk's cookie
    went to every other server on this machine, which could replay it."""
    db, web = desk
    page = await browser.new_page()
    await open_desk(page, web)
    for host in ("127.0.0.1", "localhost"):
        await page.goto(f"http://{host}:{local_app.port}/")
    assert len(local_app.cookies) >= 2  # the pages (and perhaps a favicon)
    (cookie,) = await page.context.cookies()
    assert not [sent for sent in local_app.cookies if cookie["value"] in sent]
    assert all("onwatch" not in sent for sent in local_app.cookies)


async def test_another_site_cannot_spend_the_operators_login_attempts(desk, browser, local_app):
    """A page elsewhere that makes the browser send wrong tokens (images, form posts)
    locked the operator's own correct login out with 429, every minute."""
    db, web = desk
    attacks = "".join(f'<img src="{web.origin}/?token=wrong-{n}">' for n in range(5))
    posts = "".join(
        f'fetch("{web.origin}/login", {{method: "POST", mode: "no-cors", '
        f'body: new URLSearchParams({{token: "wrong-post-{n}"}})}});'
        for n in range(5)
    )
    local_app.pages["/attack"] = f"<html><body>{attacks}<script>{posts}</script></body></html>"
    page = await browser.new_page()
    await page.goto(f"http://127.0.0.1:{local_app.port}/attack")
    await wait_for(
        lambda: (
            web.log().count("POST /login 403 foreign Origin") == 5
            and web.log().count("GET / 403 caused by another site") == 5
        ),
        what="the other site's ten requests",
    )
    operator = await (await browser.new_context()).new_page()
    screen = Screen(operator)  # before the desk's page opens its socket, or its frames are missed
    assert (await operator.goto(f"{web.origin}/")).status == 401
    await operator.fill("#token", web.token)
    async with operator.expect_navigation(url=f"{web.origin}/"):
        await operator.click("button[type=submit]")
    await screen.wait_for("Pending")
    assert "wrong token" not in web.log()  # nothing the other site sent was a guess


async def test_the_printed_link_is_no_lasting_credential_in_the_history(tmp_path, playwright):
    """A typed address is kept in the browser's history file: with the token in it, anyone
    who reads the profile could open the desk for as long as the token stood."""
    db = tmp_path / "alice.db"
    await seed(db)
    web = WebProcess(db, tmp_path).start()
    profile = tmp_path / "profile"
    try:
        context = await playwright.chromium.launch_persistent_context(
            str(profile), executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True
        )
        page = await context.new_page()
        await open_desk(page, web)
        await context.close()  # the profile is written out
        history = (profile / "Default" / "History").read_bytes()
        assert web.token.encode() not in history
        with sqlite3.connect(profile / "Default" / "History") as connection:
            urls = [row[0] for row in connection.execute("SELECT url FROM urls")]
        ours = [url for url in urls if url.startswith(web.origin)]
        assert ours, urls
        for url in ours:  # whatever an address in the history carries, it opens nothing now
            for code in re.findall(r"code=([\w-]+)", url):
                form = f"code={code}".encode()
                status, _ = await web.raw(
                    "POST /login HTTP/1.1\r\n"
                    f"Origin: {web.origin}\r\nContent-Length: {len(form)}\r\n"
                    "Content-Type: application/x-www-form-urlencoded\r\nConnection: close\r\n",
                    form,
                )
                assert status == 401, url
            for token in re.findall(r"token=([^&#]+)", url):
                status, _ = await web.raw(
                    f"GET / HTTP/1.1\r\nAuthorization: Bearer {unquote(token)}\r\n"
                    "Connection: close\r\n"
                )
                assert status == 401, url
    finally:
        assert web.stop() == 0


async def test_a_cookie_jar_filled_by_another_local_app_leaves_the_desk_working(
    desk, browser, local_app
):
    """Another program on this machine sets ~10 KB of cookies on 127.0.0.1 and localhost:
    a browser sent them to the desk too (every request a 400, logged with the cookies)."""
    db, web = desk
    local_app.set_cookies = [f"junk{n}={'x' * 3400}; Path=/" for n in range(3)]
    context = await browser.new_context()
    page = await context.new_page()
    for host in ("127.0.0.1", "localhost"):
        await page.goto(f"http://{host}:{local_app.port}/")
    assert len([c for c in await context.cookies() if c["name"].startswith("junk")]) == 6
    screen = await open_desk(page, web)
    await page.keyboard.press("4")
    await screen.wait_for("send the daily digest")
    log = web.log()
    assert " 400 " not in log and "xxxxxxxx" not in log


async def test_logging_out_ends_the_session_and_its_desks(desk, browser):
    db, web = desk
    context = await browser.new_context()
    page = await context.new_page()
    await open_desk(page, web)
    (cookie,) = await context.cookies()
    desks = await wait_for(lambda: desk_processes(db), what="the desk process")
    async with page.expect_navigation(url=f"{web.origin}/"):
        await page.click("text=Log out")
    assert "Open the desk" in await page.content()  # the login page
    await wait_for(lambda: not desk_processes(db), what="the desk to end with the session")
    assert desks
    status, _ = await web.raw(
        f"GET / HTTP/1.1\r\nCookie: onwatch_desk={cookie['value']}\r\nConnection: close\r\n"
    )
    assert status == 401, "a cookie kept from before the logout opens nothing"


async def test_a_phone_gets_a_page_that_fits_and_a_desk_of_about_80_columns(desk, browser):
    """A phone's width (390 CSS pixels): laid out at that width, not a desktop's zoomed out,
    with the terminal's font shrunk so that the desk gets about 80 columns. (At a device
    pixel ratio above 1, headless Chromium draws xterm.js's canvas at that many times its
    size, with textual-serve's own page too, so the ratio stays at 1 here.)"""
    db, web = desk
    context = await browser.new_context(
        viewport={"width": 390, "height": 844}, is_mobile=True, has_touch=True
    )
    page = await context.new_page()
    sockets: list[str] = []
    page.on("websocket", lambda socket: sockets.append(socket.url))
    screen = await open_desk(page, web)
    width = await page.evaluate("window.innerWidth")
    assert width == 390, "the page must not be laid out for a desktop width and zoomed out"
    assert await page.evaluate("document.documentElement.scrollWidth") <= width
    screen_width = await page.evaluate(
        "document.querySelector('.xterm-screen').getBoundingClientRect().width"
    )
    assert screen_width <= width
    (url,) = sockets
    columns = int(re.search(r"[?&]width=(\d+)", url).group(1))
    assert 70 <= columns <= 90, url
    shown = screen.mark()
    await page.keyboard.press("4")
    await screen.wait_for("Approvals", "send the daily digest", since=shown)
