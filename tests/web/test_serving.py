"""The textual-serve adapter (tui/web/serving.py) pinned by behaviour: it builds on private
parts of textual-serve, so an upgrade that moves them must fail here, not in a browser."""

from __future__ import annotations

import asyncio
import gc
import os
import re
import shlex
import sys
import time

from aiohttp.test_utils import TestClient, TestServer

from onwatch.core import Inbox
from onwatch.tui.web.serving import desk_app

from .helpers import CSI


async def test_page_points_its_websocket_and_scripts_at_the_address_used(tmp_path):
    app = await desk_app("true", title="onwatch alice")
    async with TestClient(TestServer(app)) as client:
        page = await client.get("/")
        html = await page.text()
        host = f"{client.host}:{client.port}"
        assert f'data-session-websocket-url="ws://{host}/ws"' in html
        assert f'href="http://{host}/static/css/xterm.css"' in html
        assert "onwatch alice" in html
        script = await client.get("/static/js/textual.js")
        assert script.status == 200 and len(await script.read()) > 100_000


async def test_public_url_behind_a_tls_proxy_gives_wss(tmp_path):
    app = await desk_app("true", title="t", public_url="https://desk.example.org")
    async with TestClient(TestServer(app)) as client:
        html = await (await client.get("/")).text()
        assert 'data-session-websocket-url="wss://desk.example.org/ws"' in html
        assert 'src="https://desk.example.org/static/js/textual.js"' in html


async def test_each_websocket_runs_the_command_under_textuals_web_driver(tmp_path):
    db = tmp_path / "alice.db"
    async with await Inbox.open(db) as inbox:
        await inbox.ingest("chat", "msg-42", {"text": "hello"})
    command = shlex.join([sys.executable, "-m", "onwatch", "tui", str(db), "--read-only"])
    app = await desk_app(command, title="t")
    async with TestClient(TestServer(app)) as client:
        ws = await client.ws_connect("/ws?width=100&height=30")
        screen = b""
        deadline = time.monotonic() + 20
        while b"msg-42" not in CSI.sub(b"", screen) and time.monotonic() < deadline:
            try:
                message = await ws.receive(timeout=max(0.1, deadline - time.monotonic()))
            except asyncio.TimeoutError:
                break
            if isinstance(message.data, bytes):
                screen += message.data
        text = CSI.sub(b"", screen).decode("utf-8", "replace")
        assert "msg-42" in text and "Pending" in text
        assert re.search(r"read.only", text, re.IGNORECASE)
        await ws.close()
        # closing the tab ends its process (textual-serve sends quit); wait for it to go
        # and let its pipes close while the loop still runs
        deadline = time.monotonic() + 20
        while children() and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert not children(), "the desk process outlived its websocket"
        gc.collect()
        await asyncio.sleep(0)


def children() -> list[int]:
    """This process's live child processes (Linux /proc)."""
    found = []
    for task in os.listdir(f"/proc/{os.getpid()}/task"):
        with open(f"/proc/{os.getpid()}/task/{task}/children") as handle:
            found += [int(pid) for pid in handle.read().split()]
    alive = []
    for pid in found:
        with open(f"/proc/{pid}/stat") as handle:
            if handle.read().rsplit(")", 1)[1].split()[0] != "Z":
                alive.append(pid)
    return alive
