"""The connection guard in front of the receiver (core/webhooks/connections.py) and the
unverified-bytes budget, in process with short timeouts and a small cap, over raw sockets."""

from __future__ import annotations

import asyncio
import logging

import pytest

from onwatch.core.webhooks import connections
from onwatch.core.webhooks import server as server_module
from onwatch.core.webhooks import signatures

from .attack import unsigned_head
from .helpers import post, standard_headers

LOGGER = "onwatch.webhooks"


async def connect(server):
    return await asyncio.open_connection(server.host, server.port)


async def closed_by_server(reader, timeout: float = 10) -> bool:
    """Whether the server ends the connection (what it still sends first is read away)."""
    try:
        await asyncio.wait_for(reader.read(), timeout)
    except ConnectionError:
        return True
    return reader.at_eof()


async def status_of(reader, timeout: float = 10) -> tuple[int, bytes]:
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout)
    return int(head.split(b" ", 2)[1]), head


def lines(caplog, needle: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if needle in r.getMessage()]


async def test_over_the_cap_the_longest_idle_connections_are_closed_first(
    serve, inbox, http, caplog
):
    caplog.set_level(logging.INFO, logger=LOGGER)
    server = await serve(inbox, max_connections=3)
    idle = [await connect(server) for _ in range(5)]
    # the first two (the longest idle) made room for the last two
    assert await closed_by_server(idle[0][0]) and await closed_by_server(idle[1][0])
    assert server.guard.open == 3
    body = b'{"n": 1}'
    status, _, _ = await post(http, server.url + "/hooks/ci", body, standard_headers(body, "k"))
    assert status == 202
    assert len(lines(caplog, "connection limit (3) reached")) == 1
    for _, writer in idle:
        writer.close()


async def test_connections_that_sent_nothing_are_closed_before_one_sending_its_head(serve, inbox):
    """A sender's connection has its head on the way a moment before it is read: a crowd of
    silent connections arriving meanwhile must not push it out."""
    server = await serve(inbox, max_connections=3)
    sender_reader, sender = await connect(server)
    sender.write(b"POST /hooks/ci HTTP/1.1\r\nHost: x\r\n")  # the head, not yet whole
    await sender.drain()
    deadline = asyncio.get_running_loop().time() + 10
    while not server.guard._talking:
        assert asyncio.get_running_loop().time() < deadline
        await asyncio.sleep(0.01)
    crowd = [await connect(server) for _ in range(6)]
    assert not sender_reader.at_eof()
    body = b'{"n": 3}'
    head = "".join(f"{k}: {v}\r\n" for k, v in standard_headers(body, "in-crowd").items())
    sender.write(f"Content-Length: {len(body)}\r\n{head}\r\n".encode() + body)
    status, _ = await status_of(sender_reader)
    assert status == 202
    assert sum([await closed_by_server(r, 5) for r, _ in crowd[:4]]) == 4
    for _, writer in [*crowd, (None, sender)]:
        writer.close()


async def test_when_every_connection_is_busy_a_newcomer_gets_503_and_retry_after(
    serve, inbox, caplog
):
    caplog.set_level(logging.INFO, logger=LOGGER)
    server = await serve(inbox, max_connections=2)
    busy = []
    for n in range(2):  # heads complete, bodies unfinished: requests in progress
        reader, writer = await connect(server)
        writer.write(unsigned_head("127.0.0.1", 100, f"busy-{n}") + b"{")
        await writer.drain()
        busy.append((reader, writer))
    await asyncio.sleep(0)
    deadline = asyncio.get_running_loop().time() + 10
    while server.guard._idle and asyncio.get_running_loop().time() < deadline:
        await asyncio.sleep(0.02)  # until both heads were read: both connections busy
    reader, writer = await connect(server)
    status, head = await status_of(reader)
    assert status == 503
    assert b"Retry-After: 5" in head and b"Connection: close" in head
    assert await closed_by_server(reader)
    writer.close()
    for _, w in busy:
        w.close()
    assert len(lines(caplog, "connection limit (2) reached")) == 1


async def test_a_silent_connection_and_a_slow_head_are_closed(serve, inbox, monkeypatch):
    monkeypatch.setattr(connections, "HEAD_TIMEOUT", 0.3)
    server = await serve(inbox)
    silent_reader, silent = await connect(server)
    slow_reader, slow = await connect(server)
    slow.write(b"POST /hooks/ci HTTP/1.1\r\nHost: x\r\n")
    for _ in range(30):  # a byte at a time, never the blank line that ends the head
        if slow_reader.at_eof():
            break
        try:
            slow.write(b"X")
            await slow.drain()
        except ConnectionError:
            break
        await asyncio.sleep(0.05)
    assert await closed_by_server(silent_reader) and await closed_by_server(slow_reader)
    silent.close()
    slow.close()


async def test_a_keep_alive_connection_idle_after_its_answer_is_closed(serve, inbox, monkeypatch):
    monkeypatch.setattr(connections, "HEAD_TIMEOUT", 0.3)
    server = await serve(inbox)
    reader, writer = await connect(server)
    body = b'{"n": 2}'
    head = "".join(f"{k}: {v}\r\n" for k, v in standard_headers(body, "ka").items())
    writer.write(
        f"POST /hooks/ci HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n{head}\r\n".encode()
        + body
    )
    status, _ = await status_of(reader)
    assert status == 202
    assert await closed_by_server(reader)
    writer.close()


async def test_a_request_over_its_time_is_cut_and_logged_once(serve, inbox, monkeypatch, caplog):
    caplog.set_level(logging.INFO, logger=LOGGER)
    monkeypatch.setattr(connections, "REQUEST_TIMEOUT", 0.3)
    server = await serve(inbox)
    readers = []
    for n in range(3):
        reader, writer = await connect(server)
        writer.write(unsigned_head("127.0.0.1", 100, f"slow-{n}") + b"{")
        readers.append((reader, writer))
    for reader, writer in readers:
        assert await closed_by_server(reader)
        writer.close()
    assert len(lines(caplog, "request took over 0.3 s")) == 1


async def test_the_body_is_hashed_in_pieces_as_it_arrives(serve, inbox, http, monkeypatch):
    """No step of the event loop hashes a whole body: each piece is hashed when read."""
    pieces: list[int] = []
    update = signatures.Verifier.update

    def record(self, chunk):
        pieces.append(len(chunk))
        return update(self, chunk)

    monkeypatch.setattr(signatures.Verifier, "update", record)
    server = await serve(inbox)
    body = b'{"pad": "' + b"x" * (1_000_000) + b'"}'
    status, _, _ = await post(http, server.url + "/hooks/ci", body, standard_headers(body, "big"))
    assert status == 202
    assert sum(pieces) == len(body) and max(pieces) <= 1 << 16 and len(pieces) > 10


async def test_unverified_bytes_past_the_budget_refuse_the_oldest_holder(
    serve, inbox, http, monkeypatch
):
    """The request that has held unverified bytes longest is refused to make room; a
    delivery that arrives whole meanwhile is stored."""
    monkeypatch.setattr(server_module, "UNVERIFIED_BYTES", 0)  # i.e. 2 × max_body
    server = await serve(inbox, max_body=64 * 1024)
    assert server.receiver.unverified.limit == 128 * 1024
    holders = []
    for n in range(2):
        reader, writer = await connect(server)
        writer.write(unsigned_head("127.0.0.1", 64 * 1024, f"hold-{n}") + b" " * 60_000)
        await writer.drain()
        holders.append((reader, writer))
        deadline = asyncio.get_running_loop().time() + 10
        while server.receiver.unverified.held < 60_000 * (n + 1):
            assert asyncio.get_running_loop().time() < deadline
            await asyncio.sleep(0.01)
    body = b'{"pad": "' + b"y" * 30_000 + b'"}'
    status, _, _ = await post(http, server.url + "/hooks/ci", body, standard_headers(body, "ok"))
    assert status == 202
    first, head = await status_of(holders[0][0])
    assert first == 503 and b"Retry-After" in head
    assert not holders[1][0].at_eof()  # the younger holder is still being read
    assert server.receiver.unverified.evicted == 1
    for _, writer in holders:
        writer.close()


async def test_out_of_descriptors_accept_errors_are_one_line(serve, inbox, caplog):
    caplog.set_level(logging.INFO, logger=LOGGER)
    await serve(inbox)
    loop = asyncio.get_running_loop()
    for _ in range(100):  # what the loop reports on every failed accept() while out of fds
        loop.call_exception_handler(
            {
                "message": "socket.accept() out of system resource",
                "exception": OSError(24, "Too many open files"),
            }
        )
    assert len(lines(caplog, "out of file descriptors")) == 1
    assert not [r for r in caplog.records if r.exc_info]


@pytest.mark.parametrize("limit, wanted", [(4096, 1024), (1024, 704), (400, 80), (40, 1)])
def test_the_cap_fits_the_descriptor_limit(monkeypatch, limit, wanted):
    import resource

    monkeypatch.setattr(resource, "getrlimit", lambda which: (limit, limit))
    monkeypatch.setattr(resource, "setrlimit", lambda which, value: None)
    assert connections.connection_limit(1024) == wanted


async def test_a_head_over_the_limit_is_refused_with_431(serve, inbox, caplog):
    """aiohttp would hold up to a megabyte of head per connection (128 lines of 8 KiB)."""
    caplog.set_level(logging.INFO, logger=LOGGER)
    server = await serve(inbox)
    reader, writer = await connect(server)
    writer.write(b"POST /hooks/ci HTTP/1.1\r\nHost: x\r\n")
    try:
        for n in range(20):  # 20 header lines of 8000 bytes: 160 KB, never the blank line
            writer.write(b"X-Pad-%d: %s\r\n" % (n, b"p" * 8000))
            await writer.drain()
    except ConnectionError:
        pass
    status, _ = await status_of(reader)
    assert status == 431
    assert await closed_by_server(reader)
    writer.close()
    assert len(lines(caplog, "request head over 65536 bytes")) == 1


async def test_an_unread_body_after_an_early_answer_is_not_taken_for_a_head(serve, inbox, caplog):
    """A 401 sent before the body is read: what the client still sends is its body, which
    aiohttp reads away, not the head of a next request."""
    caplog.set_level(logging.INFO, logger=LOGGER)
    server = await serve(inbox)
    reader, writer = await connect(server)
    writer.write(
        b"POST /hooks/ci HTTP/1.1\r\nHost: x\r\nContent-Length: 200000\r\n\r\n" + b" " * 200000
    )
    status, _ = await status_of(reader)
    assert status == 401  # no signature header
    writer.close()
    assert not lines(caplog, "request head over")
