"""The door in front of the browser desk, over real HTTP (aiohttp's test server), with a fake
clock for the failure window."""

from __future__ import annotations

import logging

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from onwatch.tui.web.door import COOKIE, AccessLog, Door, FailureLimit

TOKEN = "s3cret-token-for-tests-0123456789"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
async def client():
    """(client, clock, seen): an app behind the door whose handlers record what got through."""
    clock = Clock()
    seen: list[str] = []
    door = Door(TOKEN, limit=FailureLimit(clock=clock))

    async def page(request):
        seen.append(request.path_qs)
        return web.Response(text="desk")

    async def socket(request):
        seen.append("ws")
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        await ws.send_str("hello")
        await ws.close()
        return ws

    app = web.Application(middlewares=[door.middleware])
    app.router.add_get("/", page)
    app.router.add_get("/ws", socket)
    async with TestClient(TestServer(app)) as client:
        yield client, clock, seen


async def test_token_once_then_cookie_and_the_address_bar_loses_the_token(client):
    client, _, seen = client
    response = await client.get(f"/?fontsize=18&token={TOKEN}", allow_redirects=False)
    assert response.status == 303
    assert response.headers["Location"] == "/?fontsize=18"
    cookie = response.cookies[COOKIE]
    assert cookie["httponly"] and cookie["samesite"] == "Strict" and cookie["path"] == "/"
    assert TOKEN not in cookie.value
    assert seen == []  # the redirect itself serves nothing
    page = await client.get("/?fontsize=18")  # the cookie jar now carries the session
    assert page.status == 200 and await page.text() == "desk"
    assert page.headers["X-Frame-Options"] == "DENY"
    assert "frame-ancestors 'none'" in page.headers["Content-Security-Policy"]
    assert seen == ["/?fontsize=18"]


async def test_missing_wrong_and_forged_credentials_get_401_and_reach_nothing(client):
    client, _, seen = client
    assert (await client.get("/")).status == 401
    assert (await client.get("/?token=" + TOKEN[:-1])).status == 401
    assert (await client.get("/?token=" + TOKEN + "x")).status == 401
    assert (await client.get("/", cookies={COOKIE: TOKEN})).status == 401
    assert (await client.get("/", headers={"Authorization": "Bearer nope"})).status == 401
    assert seen == []


async def test_bearer_token_admits_a_script_without_a_cookie(client):
    client, _, seen = client
    response = await client.get("/", headers={"Authorization": f"Bearer {TOKEN}"})
    assert response.status == 200 and COOKIE not in response.cookies
    assert seen == ["/"]


async def test_five_wrong_tokens_lock_the_address_for_the_window(client):
    client, clock, seen = client
    for n in range(5):
        assert (await client.get(f"/?token=guess{n}")).status == 401
    locked = await client.get(f"/?token={TOKEN}", allow_redirects=False)
    assert locked.status == 429 and locked.headers["Retry-After"] == "60"
    clock.now += 30
    assert (await client.get(f"/?token={TOKEN}", allow_redirects=False)).status == 429
    clock.now += 30.5  # the first failure has left the window
    assert (await client.get(f"/?token={TOKEN}", allow_redirects=False)).status == 303
    assert seen == []


async def test_bare_requests_do_not_count_as_guesses(client):
    client, _, _ = client
    for _ in range(20):
        assert (await client.get("/")).status == 401
    assert (await client.get(f"/?token={TOKEN}", allow_redirects=False)).status == 303


async def test_websocket_needs_the_session_and_the_desks_own_origin(client):
    client, _, seen = client
    with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
        await client.ws_connect("/ws")
    assert refused.value.status == 401
    await client.get(f"/?token={TOKEN}")
    origin = str(client.make_url("/")).rstrip("/")
    with pytest.raises(aiohttp.WSServerHandshakeError) as foreign:
        await client.ws_connect("/ws", headers={"Origin": "http://evil.example"})
    assert foreign.value.status == 403
    assert seen == ["/"]
    ws = await client.ws_connect("/ws", headers={"Origin": origin})
    assert (await ws.receive()).data == "hello"
    await ws.close()
    assert seen == ["/", "ws"]


def test_failure_memory_is_bounded(monkeypatch):
    import onwatch.tui.web.door as door

    monkeypatch.setattr(door, "MAX_ADDRESSES", 100)
    limit = FailureLimit(clock=Clock())
    for n in range(1000):
        limit.fail(f"10.0.{n // 256}.{n % 256}")
    assert len(limit._failures) == 100


async def test_access_log_never_writes_the_query_string(client, caplog):
    client, _, _ = client
    # the door's own log, through the same access logger the server uses
    logger = logging.getLogger("onwatch.web.test")
    access = AccessLog(logger, "")
    caplog.set_level(logging.INFO, logger="onwatch.web")
    caplog.set_level(logging.INFO, logger="onwatch.web.test")
    response = await client.get(f"/?token={TOKEN}", allow_redirects=False)
    await client.get("/?token=wrong-guess")

    class Request:
        remote, method, path = "127.0.0.1", "GET", "/"
        path_qs = f"/?token={TOKEN}"

    access.log(Request(), response, 0.001)
    # Only the door's loggers: the test client's own access log (aiohttp's default, not the
    # one `onwatch web` installs) may be on when another test left the root logger at INFO.
    ours = "\n".join(
        record.getMessage() for record in caplog.records if record.name.startswith("onwatch.web")
    )
    assert "GET / 303" in ours
    assert TOKEN not in ours and "wrong-guess" not in ours
