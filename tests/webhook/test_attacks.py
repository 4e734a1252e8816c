"""The receiver attacked as anyone who can connect could, without a single credential: each
attack runs against a real `onwatch serve` (or `run`) process over raw sockets, and each must
leave a signed delivery answered, the memory and descriptors bounded, and the log at one line
per request and one per limit reached, with no traceback and no secret in it."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import pytest

from .attack import (
    amplifying_stripe_request,
    close_all,
    delivery,
    descriptors_for,
    most_costly_stripe_request,
    open_descriptors,
    open_idle,
    rss_bytes,
    send_and_read_status,
    unsigned_head,
)
from .helpers import HOOK_SECRET, ServerProcess, standard_headers

pytestmark = pytest.mark.slow

MIB = 1 << 20
ROOT = Path(__file__).resolve().parents[2]


async def deliver(url: str, n: int = 1, timeout: float = 30) -> int:
    """POST one signed delivery to /hooks/ci; its status."""
    body, headers = delivery(n)
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout)) as http:
        async with http.post(url + "/hooks/ci", data=body, headers=headers) as response:
            return response.status


async def wait_until(condition, timeout: float = 30.0, what: str = "the condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        await asyncio.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def log_lines(server: ServerProcess) -> list[str]:
    return server.log.read_text(errors="replace").splitlines()


def assert_quiet(server: ServerProcess) -> None:
    text = server.log.read_text(errors="replace")
    assert "Traceback" not in text, text[-3000:]
    assert "Too many open files" not in text, text[-3000:]
    assert " 500 " not in text, text[-3000:]


@pytest.fixture
async def serve(tmp_path):
    started = []

    async def start(*extra: str, nofile: int | None = None) -> ServerProcess:
        server = await ServerProcess(
            tmp_path / "inbox.db", tmp_path / f"serve-{len(started)}.log", *extra, nofile=nofile
        ).start()
        started.append(server)
        return server

    yield start
    for server in started:
        assert server.stop(signal.SIGTERM) == 0, server.log.read_text()[-3000:]


async def test_idle_connections_past_the_descriptor_limit_block_no_delivery_and_log_once(serve):
    """1,100 connections that send nothing, against a server whose descriptor limit is the
    common default of 1,024: before, accept() failed with EMFILE (a traceback each time,
    ~100 MB of log a minute) and a signed delivery waited in the backlog unanswered."""
    wanted = 1100
    available = descriptors_for(wanted)
    if available < wanted:
        pytest.skip(f"this process may open only {available} sockets (ulimit -n); needs {wanted}")
    server = await serve(nofile=1024)
    host, port = server.host_port
    idle = await open_idle(host, port, wanted)
    try:
        assert len(idle) == wanted
        assert await deliver(server.url) == 202
        # Past the cap the longest-idle connections are closed, so the process stays inside
        # its descriptors whatever is thrown at it.
        assert open_descriptors(server.proc.pid) < 1024
    finally:
        close_all(idle)
    lines = log_lines(server)
    assert len([line for line in lines if "connection limit" in line]) == 1, lines[-20:]
    assert len(lines) < 20, lines[-20:]
    assert_quiet(server)


async def _closed_by_the_server(reader: asyncio.StreamReader) -> bool:
    """True once the server has closed the connection: its end of the stream, or a reset
    (a byte the client sent after the server's close is answered by one, and a reset that
    comes before the read takes the place of the end)."""
    try:
        return await asyncio.wait_for(reader.read(), 30) == b""
    except ConnectionResetError:
        return True


async def test_silent_and_slow_heads_are_closed_by_the_server(serve):
    """A connection that sends nothing, and one that sends its head a byte at a time, are
    both closed within the head timeout (10 s); before, both stayed for an hour."""
    server = await serve()
    host, port = server.host_port
    silent_reader, silent = await asyncio.open_connection(host, port)
    slow_reader, slow = await asyncio.open_connection(host, port)
    head = b"POST /hooks/ci HTTP/1.1\r\nHost: x\r\n" + b"X-Pad: " + b"p" * 4000

    async def trickle() -> None:
        for byte in head:
            try:
                slow.write(bytes([byte]))
                await slow.drain()
            except (ConnectionError, OSError):
                return
            await asyncio.sleep(0.05)

    trickling = asyncio.create_task(trickle())
    try:
        assert await _closed_by_the_server(silent_reader)
        assert await _closed_by_the_server(slow_reader)
        assert not trickling.done(), "the head was sent whole: the test proves nothing"
    finally:
        trickling.cancel()
        silent.close()
        slow.close()
    assert await deliver(server.url) == 202
    assert_quiet(server)


async def test_signature_amplification_leaves_a_delivery_answered(serve):
    """Ten unsigned POST /hooks/stripe at once, each offering 1,600 signatures over a body of
    nearly 1 MiB: before, each value cost an HMAC of the whole body (1-1.5 s of CPU a
    request) and a valid delivery waited 5-17 s. Now such a header is refused before the
    body is read; and the costliest request still read (8 signatures, the largest body) costs
    one MAC per secret, hashed as the body arrives."""
    server = await serve()
    host, port = server.host_port
    attacks = [
        asyncio.create_task(send_and_read_status(host, port, amplifying_stripe_request(host)))
        for _ in range(10)
    ] + [
        asyncio.create_task(send_and_read_status(host, port, most_costly_stripe_request(host)))
        for _ in range(10)
    ]
    assert await deliver(server.url) == 202
    statuses = await asyncio.gather(*attacks)
    assert all(status in (401, None) for status in statuses), statuses
    assert statuses[10:].count(401) == 10, statuses  # read whole, hashed, refused
    text = server.log.read_text()
    assert text.count("offers more than 8 signatures") == statuses[:10].count(401) > 0
    assert_quiet(server)


async def test_unsigned_bodies_held_in_memory_are_bounded(serve):
    """200 connections each send 1 byte short of a 1 MiB body under a wrong signature and then
    wait: before, the server held them all (41 → 246 MiB). Now at most 32 MiB of unverified
    bodies are held at once; the rest are refused with 503 and Retry-After."""
    server = await serve()
    host, port = server.host_port
    before = rss_bytes(server.proc.pid)
    connections = []
    for n in range(200):
        reader, writer = await asyncio.open_connection(host, port)
        writer.write(unsigned_head(host, MIB, f"hold-{n}") + b" " * (MIB - 1))
        connections.append((reader, writer))
    refused = 0

    async def outcome(reader, writer) -> str:
        try:
            await asyncio.wait_for(writer.drain(), 20)
        except (ConnectionError, OSError):
            pass
        except asyncio.TimeoutError:
            return "stuck"
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 3)
        except asyncio.TimeoutError:
            return "held"  # all sent, no answer: the server holds it, waiting for the last byte
        except (ConnectionError, OSError, asyncio.IncompleteReadError):
            return "closed"
        return head.split(b"\r\n", 1)[0].decode() + (" retry" if b"Retry-After" in head else "")

    outcomes = await asyncio.gather(*(outcome(r, w) for r, w in connections))
    grown = rss_bytes(server.proc.pid) - before
    refused = outcomes.count("HTTP/1.1 503 Service Unavailable retry")
    held = outcomes.count("held")
    try:
        assert held <= 32, outcomes
        assert refused >= 200 - 32 - outcomes.count("closed"), outcomes
        assert grown < 96 * MIB, f"the server grew by {grown / MIB:.0f} MiB"
        assert await deliver(server.url) == 202
    finally:
        for _, writer in connections:
            writer.close()
    assert_quiet(server)


async def test_aborted_and_badly_encoded_requests_are_one_line_with_their_status(serve):
    """Before, a client leaving mid-body or a body aiohttp could not decode was a 500 with a
    traceback; a malformed head was logged with the request's own bytes (its cookie)."""
    server = await serve()
    host, port = server.host_port
    body, headers = delivery(1)
    signed = "".join(f"{name}: {value}\r\n" for name, value in headers.items())

    async def raw(data: bytes, *, leave: bool = False) -> None:
        reader, writer = await asyncio.open_connection(host, port)
        writer.write(data)
        await writer.drain()
        if not leave:
            await asyncio.wait_for(reader.read(), 15)
        writer.close()

    # the client leaves mid-body
    await raw(
        f"POST /hooks/ci HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n{signed}\r\n".encode()
        + body,
        leave=True,
    )
    # a gzip body that is not gzip
    await raw(
        f"POST /hooks/ci HTTP/1.1\r\nHost: x\r\nContent-Encoding: gzip\r\n"
        f"Content-Length: 10\r\n{signed}\r\n".encode()
        + b"0123456789"
    )
    # a chunk size that is not hex
    await raw(
        f"POST /hooks/ci HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n{signed}\r\n".encode()
        + b"zz\r\nabc\r\n"
    )
    # a header line over the limit, carrying a cookie; a request line carrying a token
    await raw(b"GET /metrics HTTP/1.1\r\nHost: x\r\nCookie: sid=c00k1e" + b"S" * 9000 + b"\r\n\r\n")
    await raw(b"GET /?token=t0k3n HTTP/1.1\r\nHost: x\r\nBad\x01Header: y\r\n\r\n")
    await wait_until(
        lambda: len([line for line in log_lines(server) if " 400 " in line]) >= 5,
        what="five 400 lines",
    )
    lines = log_lines(server)
    answered = [line for line in lines if re.search(r" (POST|GET|UNKNOWN) \S+ \d{3} ", line)]
    assert len(answered) == 5, lines
    assert all(" 400 " in line for line in answered), answered
    notes = sorted(line.split(" 400 ", 1)[1].rsplit(" ", 1)[0] for line in answered)
    assert notes == [
        "aborted: the connection closed mid-body",
        "malformed body (its framing or encoding)",
        "malformed request",
        "malformed request",
        "malformed request",
    ], answered
    text = server.log.read_text()
    assert "c00k1e" not in text and "t0k3n" not in text
    assert_quiet(server)
    assert await deliver(server.url) == 202


async def test_metrics_answers_only_under_names_that_cannot_be_rebound(serve):
    """DNS rebinding: a page at http://attacker.example:PORT/ whose name is re-pointed at
    127.0.0.1 reads /metrics from the victim's browser, Host: attacker.example:PORT."""
    server = await serve("--allow-host", "metrics.example.org")
    host, port = server.host_port
    async with aiohttp.ClientSession() as http:

        async def status(name: str, path: str = "/metrics") -> int:
            async with http.get(server.url + path, headers={"Host": name}) as response:
                return response.status

        assert await status(f"attacker.example:{port}") == 421
        assert await status(f"localhost.attacker.example:{port}") == 421
        assert await status(f"{host}:{port}") == 200
        assert await status(f"localhost:{port}") == 200
        assert await status(f"metrics.example.org:{port}") == 200
        # hooks are signed and reached through proxies under any name: not checked
        body, headers = delivery(7)
        async with http.post(
            server.url + "/hooks/ci", data=body, headers={**headers, "Host": "hooks.example.org"}
        ) as response:
            assert response.status == 202
    assert "421" in server.log.read_text()
    assert_quiet(server)


def test_a_bad_allow_host_is_refused_before_listening(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "onwatch", "serve", str(tmp_path / "x.db"), "--allow-host", "a:80"],
        capture_output=True,
        text=True,
        env={**os.environ, "ONWATCH_HOOK_SECRET_CI": HOOK_SECRET},
    )
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and "--allow-host" in result.stderr


async def test_run_reply_command_does_not_inherit_the_webhook_secrets(tmp_path):
    """`onwatch run --command CMD`: the reply channel's command ran with every webhook secret
    in its environment."""
    db = tmp_path / "inbox.db"
    seen = tmp_path / "reply-env.txt"
    init = [sys.executable, "-m", "onwatch", "init", str(db), "outbox_gap=0"]
    assert subprocess.run(init).returncode == 0
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("ONWATCH_")},
        "ONWATCH_HOOK_SECRET_CI": HOOK_SECRET,
        "ONWATCH_GITHUB_SECRET": "github-secret-value-1234",
        "ONWATCH_ECHO_PAUSE": "0",
    }
    err = open(tmp_path / "run.err", "wb")
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "onwatch",
            "run",
            str(db),
            "--agent",
            "tests.worker.agents:echo",
            "--port",
            "0",
            "--command",
            f"env > {seen}",
        ],
        env=env,
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=err,
    )
    try:
        url = (
            await wait_until(
                lambda: re.search(r"listening on (http://\S+)", (tmp_path / "run.err").read_text()),
                what="the server",
            )
        ).group(1)
        body = json.dumps({"text": "hello"}).encode()
        async with aiohttp.ClientSession() as http:
            async with http.post(
                url + "/hooks/ci", data=body, headers=standard_headers(body, "d-1")
            ) as response:
                assert response.status == 202
        environment = await wait_until(
            lambda: seen.exists() and "PATH=" in seen.read_text() and seen.read_text(),
            what="the reply command",
        )
        assert "ONWATCH_DELIVERY_KEY=" in environment  # it is the reply channel's environment
        assert "ONWATCH_HOOK_SECRET" not in environment and "ONWATCH_GITHUB" not in environment
        assert HOOK_SECRET not in environment and "github-secret-value-1234" not in environment
    finally:
        process.send_signal(signal.SIGTERM)
        assert process.wait(30) == 0
        err.close()
