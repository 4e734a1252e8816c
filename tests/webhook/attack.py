"""What an attacker without credentials sends to a receiver, over raw sockets: idle
connections, heads that never end, unsigned bodies, signature headers that cost work. Shared by
the attack tests and the load benchmark (tests/bench/bench_doors.py)."""

from __future__ import annotations

import asyncio
import json
import os
import resource
import time

from .helpers import standard_headers

CHUNK = 1 << 16


def descriptors_for(wanted: int, spare: int = 200) -> int:
    """Raise this process's soft descriptor limit toward `wanted + spare` (as far as the hard
    limit allows) and return how many sockets it can open: `wanted` or fewer."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = wanted + spare
    if soft != resource.RLIM_INFINITY and soft < need:
        target = need if hard == resource.RLIM_INFINITY else min(need, hard)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass
    if soft == resource.RLIM_INFINITY:
        return wanted
    return max(0, min(wanted, soft - spare))


async def open_idle(
    host: str, port: int, count: int, *, batch: int = 100
) -> list[asyncio.StreamWriter]:
    """`count` connections that send nothing (opened `batch` at a time: the listen backlog
    is finite). A connection the server refuses or closes at once is still counted."""
    writers: list[asyncio.StreamWriter] = []

    async def one() -> None:
        try:
            _, writer = await asyncio.wait_for(asyncio.open_connection(host, port), 30)
        except (OSError, asyncio.TimeoutError):
            return
        writers.append(writer)

    for start in range(0, count, batch):
        await asyncio.gather(*(one() for _ in range(min(batch, count - start))))
    return writers


def close_all(writers: list[asyncio.StreamWriter]) -> None:
    for writer in writers:
        writer.close()


def amplifying_stripe_request(
    host: str, body_size: int = (1 << 20) - 1, values: int = 1600
) -> bytes:
    """An unsigned POST /hooks/stripe whose Stripe-Signature offers `values` v1 signatures
    (one character each, so that 1,600 fit in aiohttp's 8,190-byte header line) over a body
    of `body_size` bytes: before, each value cost an HMAC of the whole body."""
    header = "t=%d,%s" % (int(time.time()), ",".join("v1=0" for _ in range(values)))
    head = (
        "POST /hooks/stripe HTTP/1.1\r\n"
        f"Host: {host}\r\n"
        "Content-Type: application/json\r\n"
        f"Content-Length: {body_size}\r\n"
        f"Stripe-Signature: {header}\r\n\r\n"
    )
    return head.encode("ascii") + b" " * body_size


def most_costly_stripe_request(host: str, body_size: int = (1 << 20) - 1) -> bytes:
    """The costliest unsigned request a receiver still reads: as many well-formed signatures
    as it takes (8) over the largest body it accepts."""
    header = "t=%d,%s" % (int(time.time()), ",".join("v1=" + "0" * 64 for _ in range(8)))
    head = (
        "POST /hooks/stripe HTTP/1.1\r\n"
        f"Host: {host}\r\n"
        "Content-Type: application/json\r\n"
        f"Content-Length: {body_size}\r\n"
        f"Stripe-Signature: {header}\r\n\r\n"
    )
    return head.encode("ascii") + b" " * body_size


def unsigned_head(host: str, size: int, key: str) -> bytes:
    """The head of a POST /hooks/ci whose Standard Webhooks signature is well formed but
    wrong (it signs another body), declaring `size` bytes of body."""
    headers = standard_headers(b"not this body", key)
    lines = [
        "POST /hooks/ci HTTP/1.1",
        f"Host: {host}",
        f"Content-Length: {size}",
        *(f"{name}: {value}" for name, value in headers.items()),
    ]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("ascii")


async def send_and_read_status(
    host: str, port: int, request: bytes, timeout: float = 60
) -> int | None:
    """Send `request` on a new connection and return the status of the answer (None if the
    connection ended without one, e.g. reset while sending)."""
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout)
    except (OSError, asyncio.TimeoutError):
        return None
    try:
        for start in range(0, len(request), CHUNK):
            writer.write(request[start : start + CHUNK])
            await writer.drain()
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout)
        return int(head.split(b" ", 2)[1])
    except (OSError, asyncio.IncompleteReadError, asyncio.TimeoutError, ValueError):
        return None
    finally:
        writer.close()


def rss_bytes(pid: int) -> int:
    """Resident memory of process `pid` (Linux /proc)."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for {pid}")


def open_descriptors(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def delivery(n: int) -> tuple[bytes, dict[str, str]]:
    body = json.dumps({"n": n, "text": "a valid delivery"}).encode()
    return body, standard_headers(body, f"valid-{n}")
