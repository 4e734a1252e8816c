"""The door in front of the browser desk, over real HTTP (aiohttp's test server), with fake
clocks for the failure window and the session lifetime."""

from __future__ import annotations

import logging

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from onwatch.tui.web.door import COOKIE, NOTE, AccessLog, Door, FailureLimit, token_bits
from onwatch.tui.web.sessions import SESSION, Sessions

TOKEN = "s3cret-token-for-tests-0123456789"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Desk:
    """An app behind the door whose handlers record what got through."""

    def __init__(self, client: TestClient, clock: Clock, sessions: Sessions, seen: list[str]):
        self.client, self.clock, self.sessions, self.seen = client, clock, sessions, seen
        self.origin = str(client.make_url("/")).rstrip("/")

    def headers(self, **extra: str) -> dict[str, str]:
        return {"Origin": self.origin, **extra}

    async def login(self, token: str = TOKEN, **kwargs) -> aiohttp.ClientResponse:
        return await self.client.post(
            "/login",
            data={"token": token},
            headers=self.headers(),
            allow_redirects=False,
            **kwargs,
        )


@pytest.fixture
async def desk():
    clock = Clock()
    seen: list[str] = []
    ended = []
    sessions = Sessions(clock=clock, lifetime=3600, on_end=ended.append)
    door = Door(TOKEN, sessions, limit=FailureLimit(clock=clock), title="alice · onwatch")

    async def page(request):
        seen.append(f"{request.method} {request.path_qs} {request[SESSION].label}")
        return web.Response(text="desk")

    async def socket(request):
        seen.append("ws")
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        await ws.send_str("hello")
        await ws.close()
        return ws

    app = web.Application()
    app.router.add_get("/", page)
    app.router.add_get("/ws", socket)
    door.install(app)
    async with TestClient(TestServer(app)) as client:
        door.bind(str(client.make_url("/")))
        found = Desk(client, clock, sessions, seen)
        found.ended = ended
        found.door = door
        yield found


async def test_the_token_by_the_login_form_starts_a_session_and_goes_to_the_root_only(desk):
    response = await desk.login()
    assert response.status == 303 and response.headers["Location"] == "/"
    cookie = response.cookies[COOKIE]
    assert cookie["httponly"] and cookie["samesite"] == "Strict" and cookie["path"] == "/"
    assert TOKEN not in cookie.value
    assert desk.seen == []  # the login itself serves nothing
    page = await desk.client.get("/?fontsize=18")  # the cookie jar now carries the session
    assert page.status == 200 and await page.text() == "desk"
    assert desk.seen == ["GET /?fontsize=18 1-" + desk.seen[0].rsplit("1-", 1)[1]]


async def test_sessions_are_random_and_not_derived_from_the_token(desk):
    first = (await desk.login()).cookies[COOKIE].value
    second = (await desk.login()).cookies[COOKIE].value
    assert first != second and len(desk.sessions) == 2
    import hashlib
    import hmac

    assert first != hmac.new(TOKEN.encode(), b"onwatch web session", hashlib.sha256).hexdigest()


async def test_a_session_expires_and_ends_on_logout(desk):
    cookie = (await desk.login()).cookies[COOKIE].value
    jar = {COOKIE: cookie}
    assert (await desk.client.get("/", cookies=jar)).status == 200
    desk.clock.now += 3601
    assert (await desk.client.get("/", cookies=jar)).status == 401
    assert len(desk.ended) == 1
    cookie = (await desk.login()).cookies[COOKIE].value
    desk.client.session.cookie_jar.clear()
    jar = {COOKIE: cookie}
    out = await desk.client.post(
        "/logout", cookies=jar, headers=desk.headers(), allow_redirects=False
    )
    assert out.status == 303 and out.headers["Location"] == "/"
    assert out.cookies[COOKIE].value == ""  # the browser forgets it
    assert (await desk.client.get("/", cookies=jar)).status == 401  # the server forgot it
    assert len(desk.ended) == 2


async def test_the_one_time_code_works_once(desk):
    code = desk.sessions.issue_code()
    form = {"code": code}
    first = await desk.client.post(
        "/login", data=form, headers=desk.headers(), allow_redirects=False
    )
    assert first.status == 303
    desk.client.session.cookie_jar.clear()
    again = await desk.client.post(
        "/login", data=form, headers=desk.headers(), allow_redirects=False
    )
    assert again.status == 401 and "used already" in await again.text()


async def test_without_a_session_the_root_is_the_login_page_and_nothing_else_answers(desk):
    page = await desk.client.get("/")
    assert page.status == 401 and 'action="/login"' in await page.text()
    assert "alice · onwatch" in await page.text()
    for path in ("/ws", "/static/x", "/anything"):
        assert (await desk.client.get(path, headers=desk.headers())).status == 401
    assert (await desk.client.get("/", cookies={COOKIE: "forged"})).status == 401
    assert (await desk.client.get("/?token=" + TOKEN)).status == 401  # tokens no longer ride URLs
    assert desk.seen == []


async def test_a_wrong_host_is_misdirected_even_with_a_session(desk):
    cookie = (await desk.login()).cookies[COOKIE].value
    for host in ("evil.example", "127.0.0.1", "localhost:1", "LOCALHOST"):
        response = await desk.client.get("/", headers={"Host": host}, cookies={COOKIE: cookie})
        assert response.status == 421
    assert desk.seen == []


@pytest.mark.parametrize(
    "headers",
    [
        {"Origin": "http://evil.example"},
        {"Origin": "null"},
        {"Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "no-cors"},
        {"Sec-Fetch-Site": "same-site", "Sec-Fetch-Mode": "cors"},
    ],
)
async def test_requests_another_site_caused_are_refused_with_a_session(desk, headers):
    await desk.login()
    response = await desk.client.get("/", headers=headers)
    assert response.status == 403
    assert desk.seen == []


async def test_following_a_link_from_another_site_reaches_the_login_page(desk):
    response = await desk.client.get(
        "/", headers={"Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "navigate"}
    )
    assert response.status == 401 and 'action="/login"' in await response.text()


async def test_posts_need_this_exact_origin(desk):
    for origin in (None, "http://evil.example", desk.origin + ".evil.example", "null"):
        headers = {"Origin": origin} if origin else {}
        response = await desk.client.post(
            "/login", data={"token": TOKEN}, headers=headers, allow_redirects=False
        )
        assert response.status == 403, origin
    assert len(desk.sessions) == 0


async def test_cross_site_guesses_are_never_counted(desk):
    for n in range(50):
        response = await desk.client.post(
            "/login",
            data={"token": f"guess-{n}"},
            headers={"Origin": "http://evil.example", "Sec-Fetch-Site": "cross-site"},
            allow_redirects=False,
        )
        assert response.status == 403
        assert (await desk.client.get(f"/?token=guess-{n}")).status == 401
    assert (await desk.login()).status == 303


async def test_five_wrong_tokens_lock_the_address_for_the_window(desk):
    for n in range(5):
        assert (await desk.login(f"guess{n}")).status == 401
    locked = await desk.login()
    assert locked.status == 429 and locked.headers["Retry-After"] == "60"
    desk.clock.now += 30
    assert (await desk.login()).status == 429
    desk.clock.now += 30.5  # the first failure has left the window
    assert (await desk.login()).status == 303
    # the one-time link works even while the address is locked
    for n in range(5):
        await desk.login(f"again{n}")
    code = desk.sessions.issue_code()
    response = await desk.client.post(
        "/login", data={"code": code}, headers=desk.headers(), allow_redirects=False
    )
    assert response.status == 303


def test_the_limit_is_also_global():
    clock = Clock()
    limit = FailureLimit(clock=clock)
    for n in range(100):  # 100 addresses, one guess each
        address = f"127.0.0.{n + 2}"
        if limit.retry_after(address) is None:
            limit.fail(address)
    assert len(limit._total) == 20
    assert limit.retry_after("127.0.0.200") == 60
    clock.now += 61
    assert limit.retry_after("127.0.0.200") is None


async def test_bearer_token_admits_a_script_and_wrong_ones_count(desk):
    response = await desk.client.get("/", headers={"Authorization": f"Bearer {TOKEN}"})
    assert response.status == 200 and COOKIE not in response.cookies
    assert desk.seen[-1].endswith(" bearer")
    for _ in range(5):
        assert (await desk.client.get("/", headers={"Authorization": "Bearer no"})).status == 401
    assert (await desk.client.get("/", headers={"Authorization": f"Bearer {TOKEN}"})).status == 429


async def test_websocket_needs_the_session_and_the_desks_own_origin(desk):
    with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
        await desk.client.ws_connect("/ws", headers=desk.headers())
    assert refused.value.status == 401
    await desk.login()
    for headers in ({}, {"Origin": "http://evil.example"}):
        with pytest.raises(aiohttp.WSServerHandshakeError) as foreign:
            await desk.client.ws_connect("/ws", headers=headers)
        assert foreign.value.status == 403
    assert desk.seen == []
    ws = await desk.client.ws_connect("/ws", headers=desk.headers())
    assert (await ws.receive()).data == "hello"
    await ws.close()
    assert desk.seen == ["ws"]


async def test_an_upgrade_header_with_trailing_junk_is_still_checked(desk):
    await desk.login()
    response = await desk.client.get(
        "/ws",
        headers={
            "Upgrade": "websocket, junk",
            "Connection": "Upgrade",
            "Sec-WebSocket-Version": "13",
            "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==",
            "Origin": "http://evil.example",
        },
    )
    assert response.status == 403
    assert desk.seen == []


async def test_every_answer_carries_the_security_headers(desk):
    await desk.login()
    for method, path in (("GET", "/"), ("GET", "/nope"), ("POST", "/"), ("GET", "/login")):
        response = await desk.client.request(
            method, path, headers=desk.headers(), allow_redirects=False
        )
        assert response.status in (200, 303, 404, 405), (method, path)
        assert response.headers["X-Frame-Options"] == "DENY", (method, path, response.status)
        assert "frame-ancestors 'none'" in response.headers["Content-Security-Policy"]
        assert response.headers["X-Content-Type-Options"] == "nosniff"


async def test_a_login_form_too_large_is_refused_without_reading_it_all(desk):
    response = await desk.client.post(
        "/login",
        data=b"token=" + b"x" * 100_000,
        headers=desk.headers(**{"Content-Type": "application/x-www-form-urlencoded"}),
    )
    assert response.status == 400


def test_failure_memory_is_bounded(monkeypatch):
    import onwatch.tui.web.door as door

    monkeypatch.setattr(door, "MAX_ADDRESSES", 100)
    limit = FailureLimit(clock=Clock(), max_total=10**6)
    for n in range(1000):
        limit.fail(f"10.0.{n // 256}.{n % 256}")
    assert len(limit._failures) == 100


async def test_the_access_log_writes_no_token_cookie_or_query(desk, caplog):
    logger = logging.getLogger("onwatch.web.test")
    access = AccessLog(logger, "")
    caplog.set_level(logging.INFO, logger="onwatch.web.test")
    response = await desk.login()
    cookie = response.cookies[COOKIE].value

    class Request(dict):
        remote, method, path = "127.0.0.1", "POST", "/login"
        path_qs = f"/login?token={TOKEN}"

    access.log(Request({NOTE: "login by token: session 1-x"}), response, 0.001)
    line = caplog.records[-1].getMessage()
    assert "POST /login 303 login by token" in line
    assert TOKEN not in line and cookie not in line


@pytest.mark.parametrize(
    "token",
    [
        "aaaaaaaaaaaaaaaa",
        "abababababababab",
        "abcdefghijklmnop",
        "0123456789abcdef",
        "passwordpassword",
        "password12345678",
    ],
)
def test_guessable_tokens_fall_short(token):
    assert token_bits(token) < 64


@pytest.mark.parametrize(
    "token",
    [
        "a-long-chosen-token-0123456789",
        "tMP1E1b77L6J-3CU",
        "1f5243f3ac7e4e85dd",
        "correct horse battery staple",
    ],
)
def test_random_or_long_tokens_pass(token):
    assert token_bits(token) >= 64
