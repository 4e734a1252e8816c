#!/usr/bin/env python3
"""A signed delivery's answer time while the receiver is under attack, by anyone who can connect.

    python3 dev.py bench              every benchmark (this one included)
    python3 tests/bench/bench_doors.py [--quick] [--deliveries N] [--nofile N]

One `onwatch serve` process, twice: with a descriptor limit of 1,024 (soft and hard, the
common default soft limit, here one it cannot raise: fewer connection slots than the crowd
below, so it closes idle connections all the time), then with this environment's own limits
(serve raises its soft limit within them to fit its 1,024 connections). Against it, all at
once and for the whole measurement:

* 1,000 idle connections: opened, and each reopened as soon as the server closes it (the
  server closes the longest-idle ones to make room), so 1,000 are always being attempted;
* 10 amplification attempts in flight: unsigned POST /hooks/stripe with 1,600 `v1=` values
  and a body of 1 MiB − 1 byte, each sent again as soon as it is answered (before the fix,
  each cost 1.1–1.5 s of CPU: 1,600 HMACs of the whole body);
* 10 of the costliest requests the receiver still reads: 8 well-formed signatures (the most
  it takes) over the same body, two secrets configured, likewise repeated.

Meanwhile a sender (another process than the attacker's) posts signed Standard Webhooks
deliveries one after another, each on a new connection, a quarter of a second apart (50 take
~15 s: the idle crowd outlives the 10 s head timeout and comes back); the figures are their
answer times (request sent → answer's status read), the statuses, and the server's resident
memory, descriptors and log lines at the end.

Target: every delivery answered 202 within 1 s. --quick: fewer deliveries, a smoke run.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.webhook.attack import (  # noqa: E402 - after the path is set
    amplifying_stripe_request,
    delivery,
    descriptors_for,
    most_costly_stripe_request,
    open_descriptors,
    rss_bytes,
    send_and_read_status,
)
from tests.webhook.helpers import ServerProcess  # noqa: E402

TARGET = 1.0  # seconds: a valid delivery's answer, under all of the above
IDLE = 1000
AMPLIFIERS = 10
PACE = 0.25  # seconds between deliveries: the measurement spans the head timeout and more


async def keep_idle(host: str, port: int, count: int, stop: asyncio.Event, opened: list[int]):
    """Hold `count` idle connections, reopening each one the server closes."""

    async def one() -> None:
        while not stop.is_set():
            try:
                reader, writer = await asyncio.open_connection(host, port)
            except OSError:
                await asyncio.sleep(0.05)
                continue
            opened[0] += 1
            try:
                done = asyncio.ensure_future(reader.read())
                stopping = asyncio.ensure_future(stop.wait())
                await asyncio.wait({done, stopping}, return_when=asyncio.FIRST_COMPLETED)
                done.cancel()
                stopping.cancel()
            finally:
                writer.close()

    await asyncio.gather(*(one() for _ in range(count)))


async def keep_sending(host: str, port: int, request: bytes, stop: asyncio.Event, sent: list[int]):
    while not stop.is_set():
        await send_and_read_status(host, port, request, timeout=30)
        sent[0] += 1


async def post_delivery(host: str, port: int, n: int) -> tuple[int | None, float]:
    body, headers = delivery(n)
    head = (
        "POST /hooks/ci HTTP/1.1\r\n"
        f"Host: {host}:{port}\r\nContent-Length: {len(body)}\r\nConnection: close\r\n"
        + "".join(f"{name}: {value}\r\n" for name, value in headers.items())
        + "\r\n"
    ).encode()
    started = time.perf_counter()
    status = await send_and_read_status(host, port, head + body, timeout=60)
    return status, time.perf_counter() - started


def cpu_seconds(pid: int) -> float:
    """User and system CPU time process `pid` used so far (Linux /proc)."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def attack(host: str, port: int) -> None:
    """The attacker, in a process of its own (so its own busy loop does not delay the
    sender's): runs until stdin closes, prints "ready" once the idle crowd is in, and its
    counts at the end."""
    descriptors_for(IDLE + 2 * AMPLIFIERS + 50)
    stop = asyncio.Event()
    opened, amplified, costly = [0], [0], [0]
    attackers = [asyncio.ensure_future(keep_idle(host, port, IDLE, stop, opened))]
    attackers += [
        asyncio.ensure_future(
            keep_sending(host, port, amplifying_stripe_request(host), stop, amplified)
        )
        for _ in range(AMPLIFIERS)
    ]
    attackers += [
        asyncio.ensure_future(
            keep_sending(host, port, most_costly_stripe_request(host), stop, costly)
        )
        for _ in range(AMPLIFIERS)
    ]
    while opened[0] < IDLE:
        await asyncio.sleep(0.05)
    print("ready", flush=True)
    loop = asyncio.get_running_loop()
    await loop.run_in_executor(None, sys.stdin.read)  # until the measurer closes our stdin
    stop.set()
    await asyncio.gather(*attackers, return_exceptions=True)
    print(f"{opened[0]} {amplified[0]} {costly[0]}", flush=True)


async def measure(deliveries: int, nofile: int | None) -> dict[str, float | int | str]:
    """One run against a server with descriptor limit `nofile` (None: this environment's,
    which the server raises its soft limit within); the row of figures."""
    with tempfile.TemporaryDirectory() as scratch:
        server = await ServerProcess(
            Path(scratch) / "inbox.db", Path(scratch) / "serve.log", nofile=nofile
        ).start()
        try:
            host, port = server.host_port
            attacker = await asyncio.create_subprocess_exec(
                sys.executable,
                __file__,
                "--attack",
                host,
                str(port),
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                cwd=ROOT,
            )
            assert attacker.stdin is not None and attacker.stdout is not None
            ready = await asyncio.wait_for(attacker.stdout.readline(), 120)
            assert ready == b"ready\n", ready
            results = []
            cpu_before = cpu_seconds(server.proc.pid)
            started = time.monotonic()
            for n in range(deliveries):
                results.append(await post_delivery(host, port, n))
                await asyncio.sleep(PACE)
            lasted = time.monotonic() - started
            cpu = cpu_seconds(server.proc.pid) - cpu_before
            attacker.stdin.close()
            counts = (await asyncio.wait_for(attacker.stdout.read(), 120)).split()
            await attacker.wait()
            opened, amplified, costly = (int(count) for count in counts)
            rss, fds = rss_bytes(server.proc.pid), open_descriptors(server.proc.pid)
            log = server.log.read_text(errors="replace")
        finally:
            server.stop(15)
    limit = re.search(r"at most (\d+) connection", log)
    times = sorted(seconds for _, seconds in results)
    statuses = [status for status, _ in results]

    def at(q: float) -> float:
        return times[min(len(times) - 1, int(round(q * (len(times) - 1))))]

    return {
        "limit": f"{nofile or 'raised'} / {limit.group(1) if limit else '?'}",
        "answered": statuses.count(202),
        "deliveries": len(statuses),
        "p50": at(0.5),
        "p90": at(0.9),
        "max": times[-1],
        "opened": opened,
        "amplified": amplified,
        "costly": costly,
        "seconds": lasted,
        "cpu": cpu / lasted,
        "rss": rss / 2**20,
        "fds": fds,
        "lines": len(log.splitlines()),
        "others": ", ".join(str(s) for s in statuses if s != 202) or "-",
    }


async def measure_all(deliveries: int, limits: list[int | None]) -> int:
    if descriptors_for(IDLE + 2 * AMPLIFIERS + 50) < IDLE:
        print(f"this process may not open {IDLE} sockets (ulimit -n)")
        return 1
    rows = [await measure(deliveries, nofile) for nofile in limits]
    print(
        f"attack: {IDLE} idle connections (each reopened when closed), {AMPLIFIERS} x "
        f"1,600-signature 1 MiB requests, {AMPLIFIERS} x 8-signature 1 MiB requests (2 secrets)"
    )
    print(
        f"{'fd limit / connection cap':<27}{'202':>7}{'p50 s':>8}{'p90 s':>8}{'max s':>8}"
        f"{'idle opened':>13}{'amplif.':>9}{'costly':>8}{'CPU':>6}{'MiB':>5}{'lines':>7}"
    )
    for row in rows:
        print(
            f"{row['limit']:<27}{row['answered']:>4}/{row['deliveries']:<2}"
            f"{row['p50']:>8.3f}{row['p90']:>8.3f}{row['max']:>8.3f}{row['opened']:>13}"
            f"{row['amplified']:>9}{row['costly']:>8}{row['cpu']:>6.0%}{row['rss']:>5.0f}"
            f"{row['lines']:>7}"
        )
        if row["answered"] != row["deliveries"]:
            print(f"  other answers: {row['others']}")
    met = all(r["answered"] == r["deliveries"] and float(r["max"]) < TARGET for r in rows)
    print(f"target: every delivery 202 within {TARGET:g} s: {'met' if met else 'NOT met'}")
    return 0 if all(r["answered"] == r["deliveries"] for r in rows) else 1


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run: 5 deliveries")
    parser.add_argument("--deliveries", type=int, default=50)
    parser.add_argument(
        "--nofile",
        type=int,
        action="append",
        help="the server's descriptor limit, soft and hard (repeatable; default: 1024, then "
        "this environment's own)",
    )
    parser.add_argument("--attack", nargs=2, metavar=("HOST", "PORT"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.attack:
        asyncio.run(attack(args.attack[0], int(args.attack[1])))
        return 0
    limits: list[int | None] = args.nofile or [1024, None]
    return asyncio.run(measure_all(5 if args.quick else args.deliveries, limits))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
