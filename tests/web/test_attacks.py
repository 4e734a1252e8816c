"""The browser desk's door attacked over raw sockets, against a real `onwatch web` process:
names, origins, redirects, malformed requests, guessing from many addresses, idle
connections, restarts, and desk processes that must end."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import socket

import aiohttp
import pytest

from tests.webhook.attack import close_all, descriptors_for, open_idle

from .helpers import WebProcess, alive, desk_processes, wait_for
from .seed import seed

pytestmark = pytest.mark.slow

TOKEN = "a-long-chosen-token-0123456789"


@pytest.fixture
async def desk(tmp_path):
    db = tmp_path / "alice.db"
    await seed(db)
    web = WebProcess(db, tmp_path, env={"ONWATCH_WEB_TOKEN": TOKEN}).start()
    yield db, web
    web.stop()


def assert_quiet(web: WebProcess, *secrets: str) -> None:
    log = web.log()
    assert "Traceback" not in log and "internal error" not in log, log[-3000:]
    for secret in (TOKEN, *secrets):
        assert secret not in log, f"{secret!r} in the log"


async def websocket(web: WebProcess, *, cookie: str | None = None, **headers: str):
    """A websocket to the desk as a script would open it (Bearer unless a cookie is given)."""
    auth = {"Cookie": f"onwatch_desk={cookie}"} if cookie else {"Authorization": f"Bearer {TOKEN}"}
    http = aiohttp.ClientSession()
    try:
        ws = await http.ws_connect(
            f"http://127.0.0.1:{web.port}/ws?width=80&height=24",
            headers={"Host": web.host, "Origin": web.origin, **auth, **headers},
        )
    except BaseException:
        await http.close()
        raise
    return http, ws


async def test_only_the_desks_own_name_is_answered_even_with_a_session(desk):
    """DNS rebinding (a page at attacker.example whose name now points at 127.0.0.1) and a
    program replaying the cookie under another name both meet 421."""
    db, web = desk
    cookie = await web.login(TOKEN)
    for host in (f"attacker.example:{web.port}", f"127.0.0.1:{web.port}", f"localhost:{web.port}"):
        status, answer = await web.raw(
            f"GET / HTTP/1.1\r\nCookie: onwatch_desk={cookie}\r\nConnection: close\r\n",
            host=host,
        )
        assert status == 421, host
        assert "desk-" not in answer  # the refusal does not give the name away
    status, _ = await web.raw(
        f"GET / HTTP/1.1\r\nCookie: onwatch_desk={cookie}\r\nConnection: close\r\n"
    )
    assert status == 200
    assert_quiet(web, cookie)


async def test_a_forged_origin_with_a_stolen_cookie_opens_no_websocket(desk):
    db, web = desk
    cookie = await web.login(TOKEN)
    for origin in ("http://127.0.0.1:9999", "http://evil.example", "null"):
        with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
            http, ws = await websocket(web, cookie=cookie, Origin=origin)
        assert refused.value.status == 403
    # an Upgrade header with trailing junk used to skip the Origin check
    status, _ = await web.raw(
        "GET /ws HTTP/1.1\r\n"
        f"Cookie: onwatch_desk={cookie}\r\nOrigin: http://evil.example\r\n"
        "Upgrade: websocket, junk\r\nConnection: Upgrade\r\nSec-WebSocket-Version: 13\r\n"
        "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
    )
    assert status == 403
    assert not desk_processes(db)
    assert_quiet(web, cookie)


async def test_no_redirect_leaves_the_desk(desk):
    """`/?token=…` used to redirect to the request's own path: `//other-host/…` too."""
    db, web = desk
    for path in (f"//evil.example/x?token={TOKEN}", f"/\\evil.example?token={TOKEN}"):
        status, answer = await web.raw(f"GET {path} HTTP/1.1\r\nConnection: close\r\n")
        assert status not in (301, 302, 303, 307, 308), answer
    form = f"token={TOKEN}".encode()
    status, answer = await web.raw(
        "POST /login?next=//evil.example HTTP/1.1\r\n"
        f"Origin: {web.origin}\r\nContent-Length: {len(form)}\r\n"
        "Content-Type: application/x-www-form-urlencoded\r\nConnection: close\r\n",
        form,
    )
    assert status == 303 and "\r\nLocation: /\r\n" in answer


async def test_malformed_requests_are_one_line_without_the_cookie_or_the_token(desk):
    db, web = desk
    cookie = await web.login(TOKEN)
    # the login's own line is written once its answer is out: wait for it, then count
    await wait_for(lambda: "POST /login 303" in web.log(), what="the login's line")
    before = len(web.log().splitlines())
    jar = "j" * 10000
    await web.raw(
        f"GET / HTTP/1.1\r\nCookie: onwatch_desk={cookie}; jar={jar}\r\nConnection: close\r\n"
    )
    await web.raw(f"GET /?token={TOKEN} HTTP/1.1\r\nBad\x01Header: {cookie}\r\n")
    await web.raw(f"GET /ws?token={TOKEN} HTTP/1.1\r\nUpgrade: websocket\r\nX: \x7f{cookie}\r\n")
    await wait_for(lambda: len(web.log().splitlines()) >= before + 3, what="three lines")
    lines = web.log().splitlines()[before:]
    assert len(lines) == 3 and all(" 400 malformed request" in line for line in lines), lines
    assert_quiet(web, cookie)


async def test_404_and_405_carry_the_security_headers(desk):
    db, web = desk
    cookie = await web.login(TOKEN)
    for request in ("GET /nope HTTP/1.1\r\n", f"PUT / HTTP/1.1\r\nOrigin: {web.origin}\r\n"):
        status, answer = await web.raw(
            request + f"Cookie: onwatch_desk={cookie}\r\nContent-Length: 0\r\nConnection: close\r\n"
        )
        assert status in (404, 405)
        for header in (
            "Content-Security-Policy: default-src 'none'",
            "X-Frame-Options: DENY",
            "X-Content-Type-Options: nosniff",
        ):
            assert header in answer, (status, answer)


async def test_a_hundred_local_addresses_cannot_make_hundreds_of_guesses(desk):
    """Every 127.x address is this machine: a per-address limit alone let 100 of them make
    500 guesses in a fraction of a second."""
    db, web = desk
    statuses: list[int] = []

    async def guess(n: int) -> None:
        address = f"127.0.{n // 250}.{n % 250 + 2}"
        for attempt in range(5):
            sock = socket.socket()
            sock.setblocking(False)
            sock.bind((address, 0))
            await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", web.port))
            reader, writer = await asyncio.open_connection(sock=sock)
            writer.write(
                f"GET / HTTP/1.1\r\nHost: {web.host}\r\nAuthorization: Bearer guess-{n}-{attempt}"
                "\r\nConnection: close\r\n\r\n".encode()
            )
            head = await reader.readuntil(b"\r\n\r\n")
            statuses.append(int(head.split(b" ", 2)[1]))
            writer.close()

    await asyncio.gather(*(guess(n) for n in range(100)))
    assert len(statuses) == 500
    assert statuses.count(401) <= 20, f"{statuses.count(401)} guesses were checked"
    assert statuses.count(429) >= 480
    assert_quiet(web)


async def test_idle_connections_past_the_descriptor_limit_leave_the_login_working(tmp_path):
    wanted = 1100
    if descriptors_for(wanted) < wanted:
        pytest.skip(f"this process may not open {wanted} sockets (ulimit -n)")
    db = tmp_path / "alice.db"
    await seed(db)
    web = WebProcess(db, tmp_path, env={"ONWATCH_WEB_TOKEN": TOKEN}, nofile=1024).start()
    try:
        idle = await open_idle("127.0.0.1", web.port, wanted)
        try:
            assert await web.login(TOKEN)
        finally:
            close_all(idle)
        log = web.log()
        assert "Too many open files" not in log
        assert log.count("connection limit") == 1
        assert len(log.splitlines()) < 20
    finally:
        assert web.stop() == 0


async def test_sessions_end_with_the_server(tmp_path):
    """The cookie was HMAC(token): the same after a restart, valid forever. Now a restarted
    server knows no session (and answers under a new name)."""
    db = tmp_path / "alice.db"
    await seed(db)
    first = WebProcess(db, tmp_path, env={"ONWATCH_WEB_TOKEN": TOKEN}).start()
    try:
        cookie = await first.login(TOKEN)
        status, _ = await first.raw(
            f"GET / HTTP/1.1\r\nCookie: onwatch_desk={cookie}\r\nConnection: close\r\n"
        )
        assert status == 200
    finally:
        assert first.stop() == 0
    second = WebProcess(db, tmp_path, env={"ONWATCH_WEB_TOKEN": TOKEN}).start()
    try:
        assert second.origin != first.origin
        status, _ = await second.raw(
            f"GET / HTTP/1.1\r\nCookie: onwatch_desk={cookie}\r\nConnection: close\r\n"
        )
        assert status == 401
    finally:
        assert second.stop() == 0


async def test_a_tab_closed_while_its_desk_starts_leaves_no_process(desk):
    db, web = desk
    for _ in range(3):
        http, ws = await websocket(web)
        await ws.close()  # at once: the desk is still importing
        await http.close()
    await wait_for(lambda: not desk_processes(db), what="every desk to end")
    assert_quiet(web)


async def test_every_desk_ends_with_the_server(desk):
    db, web = desk
    sockets = [await websocket(web) for _ in range(2)]
    await wait_for(lambda: len(desk_processes(db)) == 2, what="two desks")
    late = await websocket(web)  # one more, still starting when the server is told to stop
    web.proc.send_signal(signal.SIGTERM)
    assert web.proc.wait(30) == 0
    await wait_for(lambda: not desk_processes(db), what="the desks to end with the server")
    for http, ws in [*sockets, late]:
        await ws.close()
        await http.close()


async def test_one_login_gets_at_most_four_desks_and_the_fifth_tab_is_told_why(desk):
    db, web = desk
    cookie = await web.login(TOKEN)
    opened = [await websocket(web, cookie=cookie) for _ in range(4)]
    await wait_for(lambda: len(desk_processes(db)) == 4, what="four desks")
    http, fifth = await websocket(web, cookie=cookie)
    message = await fifth.receive(timeout=20)
    assert b"4 desks are open under this login already" in message.data
    assert (await fifth.receive(timeout=20)).type == aiohttp.WSMsgType.CLOSE
    assert len(desk_processes(db)) == 4
    await http.close()
    # a login of its own (a script's token) is a separate count
    other_http, other = await websocket(web)
    await wait_for(lambda: len(desk_processes(db)) == 5, what="a desk for the other login")
    for session_http, ws in [*opened, (other_http, other)]:
        await ws.close()
        await session_http.close()
    await wait_for(lambda: not desk_processes(db), what="every desk to end")
    assert "too many desks" in web.log()
    assert_quiet(web, cookie)


def test_the_printed_lines_are_the_link_and_for_a_generated_token_the_token(tmp_path):
    import subprocess
    import sys

    db = tmp_path / "alice.db"
    assert subprocess.run([sys.executable, "-m", "onwatch", "init", str(db)]).returncode == 0
    web = WebProcess(db, tmp_path).start()
    try:
        lines = web.out.read_text().splitlines()
        assert lines[0] == f"open {web.link}" and re.fullmatch(
            r"http://desk-[0-9a-f]{20}\.localhost:\d+/#code=[\w-]{43}", web.link
        )
        assert lines[1].endswith(web.token) and len(web.token) >= 40
        assert web.token not in web.log() and web.code not in web.log()
        assert json.dumps(web.link)  # one line, printable
    finally:
        assert web.stop() == 0


# Loaded by every Python process of the server's environment; in a desk process (the only
# ones with TEXTUAL_DRIVER) it stands for a desk stuck while starting: it ignores the quit it
# is sent and SIGTERM, and never draws.
STUCK_DESK = """
import os, signal, sys, time
if os.environ.get("TEXTUAL_DRIVER"):
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    open(os.path.join(os.environ["STUCK_DIR"], str(os.getpid())), "w").close()
    while True:
        time.sleep(1)
"""


@pytest.mark.parametrize("ended_by", ["closing the tab", "stopping the server"])
async def test_a_desk_stuck_while_starting_is_ended_for_certain(tmp_path, ended_by):
    db = tmp_path / "alice.db"
    await seed(db)
    stuck = tmp_path / "stuck"
    stuck.mkdir()
    (tmp_path / "sitecustomize.py").write_text(STUCK_DESK)
    env = {"ONWATCH_WEB_TOKEN": TOKEN, "PYTHONPATH": str(tmp_path), "STUCK_DIR": str(stuck)}
    web = WebProcess(db, tmp_path, env=env).start()
    try:
        http, ws = await websocket(web)
        pids = await wait_for(lambda: [int(p.name) for p in stuck.iterdir()], what="the desk")
        if ended_by == "closing the tab":
            await ws.close()
        else:
            web.proc.send_signal(signal.SIGTERM)
            assert web.proc.wait(60) == 0
        await wait_for(
            lambda: not [pid for pid in pids if os.path.exists(f"/proc/{pid}/stat") and alive(pid)],
            what="the stuck desk to be killed",
        )
        await http.close()
    finally:
        web.stop()
