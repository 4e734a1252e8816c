"""Size limit (413, enforced while reading), slow bodies (408), a full or locked inbox (503)."""

from __future__ import annotations

import asyncio
import sqlite3

import pytest

from onwatch.core import Inbox
from onwatch.core.webhooks import server as server_module

from .helpers import post, standard_headers

LIMIT = 64 * 1024


async def raw_request(server, head_lines: list[str]):
    """Open a raw connection and send a request head; return (reader, writer)."""
    reader, writer = await asyncio.open_connection(server.host, server.port)
    writer.write(("\r\n".join(head_lines) + "\r\n\r\n").encode("latin-1"))
    await writer.drain()
    return reader, writer


async def read_status(reader, timeout: float = 5.0) -> tuple[int, str]:
    """The status code of the next response, and its head."""
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout)
    return int(head.split(b" ", 2)[1]), head.decode("latin-1")


def signed_head(path: str, body_hint: bytes, *extra: str) -> list[str]:
    return [
        f"POST {path} HTTP/1.1",
        "Host: 127.0.0.1",
        *(
            f"{name}: {value}"
            for name, value in standard_headers(body_hint, "big").items()
            if name != "Content-Type"
        ),
        "Content-Type: application/json",
        *extra,
    ]


async def test_declared_content_length_over_the_limit_is_413(serve, inbox, http):
    server = await serve(inbox, max_body=LIMIT)
    body = b'{"pad": "' + b"x" * LIMIT + b'"}'
    status, answer, headers = await post(
        http, server.url + "/hooks/ci", body, standard_headers(body, "big")
    )
    assert status == 413
    assert f"{LIMIT} bytes" in answer["error"]
    assert headers.get("Connection") == "close"
    assert sum((await inbox.counts()).values()) == 0


async def test_a_body_of_exactly_the_limit_is_accepted(serve, inbox, http):
    server = await serve(inbox, max_body=LIMIT)
    body = b'{"pad": "' + b"x" * (LIMIT - 12) + b'"}'
    assert len(body) == LIMIT - 1
    for key, payload in (("fits", body), ("fits-exactly", body + b" "), ("one-over", body + b"  ")):
        status, _, _ = await post(
            http, server.url + "/hooks/ci", payload, standard_headers(payload, key)
        )
        assert status == {"fits": 202, "fits-exactly": 202, "one-over": 413}[key], key


async def test_chunked_body_over_the_limit_is_refused_mid_stream(serve, inbox):
    """No Content-Length: the receiver counts while reading. The client sends a little more
    than the limit and then nothing: the 413 comes although the body never ends, so the
    receiver did not wait for (or buffer) the rest."""
    server = await serve(inbox, max_body=LIMIT)
    reader, writer = await raw_request(
        server, signed_head("/hooks/ci", b"", "Transfer-Encoding: chunked")
    )
    chunk = b"x" * 4096
    sent = 0
    while sent <= LIMIT + len(chunk):
        writer.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
        sent += len(chunk)
    await writer.drain()
    status, head = await read_status(reader)
    assert status == 413
    assert "Connection: close" in head
    writer.close()
    assert sum((await inbox.counts()).values()) == 0


async def test_endless_chunked_upload_gets_413_and_the_connection_closed(serve, inbox, http):
    """Same with aiohttp's client streaming an (almost) endless generator body."""
    server = await serve(inbox, max_body=LIMIT)
    produced = 0

    async def endless():
        nonlocal produced
        for _ in range(100_000):  # 6.5 GB if anyone read it all
            produced += 65536
            yield b"x" * 65536

    try:
        async with http.post(
            server.url + "/hooks/ci", data=endless(), headers=standard_headers(b"", "endless")
        ) as response:
            assert response.status == 413
    except (OSError, asyncio.TimeoutError) as exc:  # a reset may beat the answer
        pytest.fail(f"no answer, the connection failed: {exc!r}")
    assert produced < 64 * 1024 * 1024, f"client produced {produced} bytes"
    assert sum((await inbox.counts()).values()) == 0


async def test_expect_100_continue_is_refused_before_the_body_is_sent(serve, inbox):
    server = await serve(inbox, max_body=LIMIT)
    reader, writer = await raw_request(
        server,
        signed_head("/hooks/ci", b"", f"Content-Length: {10 * LIMIT}", "Expect: 100-continue"),
    )
    status, head = await read_status(reader)  # no body was sent at all
    assert status == 413
    assert "Connection: close" in head
    writer.close()


async def test_expect_100_continue_within_the_limit_continues(serve, inbox):
    server = await serve(inbox, max_body=LIMIT)
    body = b'{"ok": true}'
    head = signed_head("/hooks/ci", body, f"Content-Length: {len(body)}", "Expect: 100-continue")
    reader, writer = await raw_request(server, head)
    status, _ = await read_status(reader)
    assert status == 100
    writer.write(body)
    await writer.drain()
    status, _ = await read_status(reader)
    assert status == 202
    writer.close()


async def test_an_unknown_expectation_is_417_and_nothing_is_stored(serve, inbox):
    server = await serve(inbox, max_body=LIMIT)
    body = b'{"ok": true}'
    reader, writer = await raw_request(
        server, signed_head("/hooks/ci", body, f"Content-Length: {len(body)}", "Expect: 200-ok")
    )
    status, _ = await read_status(reader)
    assert status == 417
    writer.close()
    assert sum((await inbox.counts()).values()) == 0


async def test_expect_100_continue_unsigned_is_401_without_the_body(serve, inbox):
    server = await serve(inbox, max_body=LIMIT)
    reader, writer = await raw_request(
        server,
        ["POST /hooks/github HTTP/1.1", "Host: x", "Content-Length: 100", "Expect: 100-continue"],
    )
    status, _ = await read_status(reader)
    assert status == 401
    writer.close()


async def test_a_body_that_never_finishes_is_408(serve, inbox, monkeypatch):
    monkeypatch.setattr(server_module, "BODY_TIMEOUT", 0.3)
    server = await serve(inbox, max_body=LIMIT)
    reader, writer = await raw_request(server, signed_head("/hooks/ci", b"", "Content-Length: 100"))
    writer.write(b"{")
    await writer.drain()
    status, _ = await read_status(reader)
    assert status == 408
    writer.close()


async def test_payload_over_the_inbox_limit_is_413(tmp_path, serve, http):
    # --max-body above the inbox's max_payload_bytes: the inbox refuses, the sender gets 413.
    inbox = await Inbox.open(tmp_path / "small.db")
    try:
        await inbox.configure(max_payload_bytes=1000)
        await inbox.reload_settings()
        server = await serve(inbox, max_body=LIMIT)
        body = b'{"pad": "' + b"x" * 2000 + b'"}'
        status, answer, _ = await post(
            http, server.url + "/hooks/ci", body, standard_headers(body, "k")
        )
        assert status == 413
        assert "max_payload_bytes" in answer["error"]
        assert sum((await inbox.counts()).values()) == 0
    finally:
        await inbox.close()


async def test_default_limit_is_the_inbox_payload_limit(tmp_path, serve):
    inbox = await Inbox.open(tmp_path / "d.db")
    try:
        server = await serve(inbox)
        assert server.receiver.max_body == inbox.settings.max_payload_bytes == 1 << 20
    finally:
        await inbox.close()


async def test_full_inbox_is_503_with_retry_after_and_duplicates_still_2xx(server, inbox, http):
    await inbox.configure(max_pending=2)
    url = server.url + "/hooks/ci"
    answers = []
    for key in ("a", "b", "c", "a"):
        body = b'{"n": 1}'
        status, _, headers = await post(http, url, body, standard_headers(body, key))
        answers.append((status, headers.get("Retry-After")))
    assert answers[:2] == [(202, None), (202, None)]
    status, retry_after = answers[2]
    assert status == 503 and int(retry_after) > 0
    assert answers[3] == (200, None)  # a redelivery of a stored event is never refused
    assert (await inbox.counts())["pending"] == 2


async def test_locked_database_is_503_with_retry_after(tmp_path, serve, http):
    path = tmp_path / "locked.db"
    inbox = await Inbox.open(path, busy_timeout=0.2)
    locker = sqlite3.connect(path, isolation_level=None, timeout=0.1)
    try:
        server = await serve(inbox)
        body = b'{"n": 1}'
        locker.execute("BEGIN IMMEDIATE")
        status, answer, headers = await post(
            http, server.url + "/hooks/ci", body, standard_headers(body, "during-lock")
        )
        assert status == 503, answer
        assert int(headers["Retry-After"]) > 0
        locker.execute("ROLLBACK")
        assert sum((await inbox.counts()).values()) == 0
        # The sender's retry after the lock is gone is stored.
        status, _, _ = await post(
            http, server.url + "/hooks/ci", body, standard_headers(body, "during-lock")
        )
        assert status == 202
    finally:
        locker.close()
        await inbox.close()
