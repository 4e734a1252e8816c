"""The textual-serve adapter (tui/web/serving.py) pinned by behaviour: it builds on private
parts of textual-serve, so an upgrade that moves them must fail here, not in a browser; and
it owns the desk processes' lives, which are checked here with real processes."""

from __future__ import annotations

import asyncio
import gc
import os
import re
import sys
import time

import pytest
from aiohttp.test_utils import TestClient, TestServer

from onwatch.core import Inbox
from onwatch.tui.web import serving
from onwatch.tui.web.serving import desk_app
from tests.waiting import until

from .helpers import CSI, alive, descendants

WS = "ws://desk.test/ws"


async def screen_until(ws, *words: str, seconds: float) -> str:
    """What the desk drew on websocket `ws` (escape codes removed), read until every one of
    `words` shows or `seconds` pass."""
    screen = b""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        text = CSI.sub(b"", screen)
        if all(word.encode() in text for word in words):
            break
        try:
            message = await ws.receive(timeout=max(0.1, deadline - time.monotonic()))
        except asyncio.TimeoutError:
            break
        if isinstance(message.data, bytes):
            screen += message.data
    return CSI.sub(b"", screen).decode("utf-8", "replace")


async def test_the_page_names_the_inbox_fits_a_phone_and_points_at_the_desks_own_websocket():
    app, _ = await desk_app(["true"], title="alice <b> · onwatch", websocket_url=lambda: WS)
    async with TestClient(TestServer(app)) as client:
        page = await client.get("/")
        html = await page.text()
        assert "<title>alice &lt;b&gt; · onwatch</title>" in html
        assert '<meta name="viewport" content="width=device-width, initial-scale=1">' in html
        assert f'data-session-websocket-url="{WS}"' in html
        assert 'href="/static/css/xterm.css"' in html and 'src="/static/js/textual.js"' in html
        assert "fonts.googleapis.com" not in html  # nothing from elsewhere
        assert "script-src 'self' 'sha256-" in page.headers["Content-Security-Policy"]
        script = await client.get("/static/js/textual.js")
        assert script.status == 200 and len(await script.read()) > 100_000
        font = await client.get("/static/fonts/RobotoMono-VariableFont_wght.ttf")
        assert font.status == 200


async def test_each_websocket_runs_the_desk_under_textuals_web_driver(tmp_path):
    db = tmp_path / "alice.db"
    async with await Inbox.open(db) as inbox:
        await inbox.ingest("chat", "msg-42", {"text": "hello"})
    argv = [sys.executable, "-m", "onwatch", "tui", str(db), "--read-only"]
    app, desks = await desk_app(argv, title="t", websocket_url=lambda: WS)
    async with TestClient(TestServer(app)) as client:
        ws = await client.ws_connect("/ws?width=100&height=30")
        text = await screen_until(ws, "msg-42", seconds=20)
        assert "msg-42" in text and "Pending" in text
        assert re.search(r"read.only", text, re.IGNORECASE)
        (desk,) = desks.processes
        environ = open(f"/proc/{desk.pid}/environ", "rb").read().split(b"\0")
        assert b"TEXTUAL_DRIVER=textual.drivers.web_driver:WebDriver" in environ
        assert any(item.startswith(b"ONWATCH_ACTOR=web:") for item in environ)
        await ws.close()
        await wait_gone(desks)
        assert not descendants(os.getpid()), "the desk process outlived its websocket"
        gc.collect()
        await asyncio.sleep(0)


async def test_a_desk_gets_no_token_and_no_webhook_secret(monkeypatch):
    monkeypatch.setenv("ONWATCH_WEB_TOKEN", "t" * 40)
    monkeypatch.setenv("ONWATCH_HOOK_SECRET_CI", "whsec_x")
    monkeypatch.setenv("ONWATCH_GITHUB_SECRET", "gh")
    monkeypatch.setenv("KEEP_ME", "1")
    environment = serving.desk_environment(dict(os.environ), "web:alice/1-abc")
    assert "ONWATCH_WEB_TOKEN" not in environment
    assert (
        "ONWATCH_HOOK_SECRET_CI" not in environment and "ONWATCH_GITHUB_SECRET" not in environment
    )
    assert environment["KEEP_ME"] == "1" and environment["ONWATCH_ACTOR"] == "web:alice/1-abc"


# A desk that announces itself as a Textual app, then ignores the quit it is sent and
# SIGTERM, and has a child of its own: only SIGKILL to its process group ends both.
STUBBORN = r"""
import os, signal, subprocess, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
child = subprocess.Popen([sys.executable, "-c", "import signal, time; "
    "signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"])
open(sys.argv[1], "w").write(f"{os.getpid()} {child.pid}")
sys.stdout.write("__GANGLION__\n"); sys.stdout.flush()
time.sleep(600)
"""


async def test_a_desk_that_will_not_quit_is_killed_with_its_children(tmp_path, monkeypatch):
    monkeypatch.setattr(serving, "QUIT_GRACE", 0.3)
    monkeypatch.setattr(serving, "TERM_GRACE", 0.3)
    pids_file = tmp_path / "pids"
    app, desks = await desk_app(
        [sys.executable, "-c", STUBBORN, str(pids_file)], title="t", websocket_url=lambda: WS
    )
    async with TestClient(TestServer(app)) as client:
        ws = await client.ws_connect("/ws")
        await wait(lambda: pids_file.exists() and pids_file.read_text().count(" ") == 1)
        pids = [int(p) for p in pids_file.read_text().split()]
        assert all(alive(pid) for pid in pids)
        await ws.close()  # the tab closes
        await wait_gone(desks)
        await wait(lambda: not any(alive(pid) for pid in pids), what="the desk and its child")


async def test_closing_the_tab_while_the_desk_starts_ends_it(tmp_path):
    db = tmp_path / "alice.db"
    await (await Inbox.open(db)).close()
    argv = [sys.executable, "-m", "onwatch", "tui", str(db)]
    app, desks = await desk_app(argv, title="t", websocket_url=lambda: WS)
    async with TestClient(TestServer(app)) as client:
        ws = await client.ws_connect("/ws")
        await wait(lambda: desks.processes, what="the desk to start")
        (desk,) = desks.processes
        pid = desk.pid
        await ws.close()  # before the app drew anything
        await wait_gone(desks)
        await wait(lambda: not alive(pid), what="the desk process to end")


async def test_past_the_cap_a_tab_is_told_why_and_no_process_starts(tmp_path):
    app, desks = await desk_app(
        [sys.executable, "-c", "import time; time.sleep(60)"], title="t", websocket_url=lambda: WS
    )
    desks.max_desks = 1
    async with TestClient(TestServer(app)) as client:
        first = await client.ws_connect("/ws")
        await wait(lambda: desks.processes, what="the first desk")
        second = await client.ws_connect("/ws")
        message = await second.receive(timeout=10)
        assert b"1 desks are open already, the most this server runs at once" in message.data
        closing = await second.receive(timeout=10)
        assert second.closed or closing.type.name in ("CLOSE", "CLOSING", "CLOSED")
        assert len(desks.processes) == 1
        await first.close()
        await desks.close_all()


async def wait(condition, timeout: float = 20.0, what: str = "the condition"):
    return await until(condition, timeout=timeout, what=what)


async def wait_gone(desks) -> None:
    await wait(lambda: not desks.processes, what="every desk to end")


@pytest.fixture(autouse=True)
def no_leftovers():
    yield
    gc.collect()


async def test_a_database_url_is_served_as_its_fleet_desk(tmp_path):
    """`onwatch web postgresql://…`: each tab's desk process is the fleet desk over every
    inbox of the database, in the browser as in the terminal (against a real server)."""
    from types import SimpleNamespace

    from onwatch.tui.web import plan
    from tests.pg.server import cluster_or_skip

    url = cluster_or_skip().new_database()
    for name in ("billing-agent", "support-agent"):
        async with await Inbox.open(url, name=name) as inbox:
            await inbox.ingest("chat", "m-1", {"text": "hello"})
    args = SimpleNamespace(
        target=url, inbox=None, host="127.0.0.1", port=0, read_only=True, public_url=None
    )
    chosen = await asyncio.to_thread(plan, args, {})
    app, desks = await desk_app(list(chosen.argv), title="t", websocket_url=lambda: WS)
    async with TestClient(TestServer(app)) as client:
        ws = await client.ws_connect("/ws?width=120&height=30")
        text = await screen_until(ws, "billing-agent", "support-agent", seconds=30)
        assert "Fleet" in text and "billing-agent" in text and "support-agent" in text
        await ws.close()
        await wait_gone(desks)
