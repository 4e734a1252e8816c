#!/usr/bin/env python3
"""What a PostgreSQL round trip costs the client: through an inbox's connection thread, as
every statement of the engine reaches the server today, against psycopg's asynchronous
connection driven by the event loop itself.

    python3 tests/bench/bench_pg_hops.py              3 rounds
    python3 tests/bench/bench_pg_hops.py --quick      a smoke run, figures meaningless

**Why.** A fleet job costs the worker process several times pgqueuer's CPU, and counts
about 18 context switches where pgqueuer counts under one (tests/bench/bench_queues.py).
An inbox on PostgreSQL runs its transactions on a thread of its own (core/pg/db.py): each
round trip hands the work from the event loop to that thread and the answer back, and the
threads and the loop take turns holding Python's lock. This script prices that hand-off,
and nothing else: the same one-row statement, prepared, N connections each sending theirs
one after the other, all N at once.

- **thread**: N inboxes opened with `Inbox.open`, the statement run by the engine's own
  `Database.call` (the connection's thread, and the loop's future it answers);
- **async**: N `psycopg.AsyncConnection`s on the loop, the same statement.

Per round trip: the process's CPU (every thread, getrusage), its context switches (waits,
then preemptions) and the round trips a second, at 1, 5 and 25 connections; the two take
turns, the order swapped each round, medians with min–max. The server is a throwaway
cluster of tests/pg/server.py (ONWATCH_TEST_DATABASE_URL names another).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import psycopg  # noqa: E402 - after the path above

from onwatch.core.inbox import Inbox  # noqa: E402

STATEMENT = "SELECT id, lease_gen FROM inboxes WHERE name = %s"
PATHS = ("thread", "async")

Figures = dict[str, float]


def _usage() -> tuple[float, int, int]:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime, r.ru_nvcsw, r.ru_nivcsw


async def _timed(clients: list[Callable[[], Awaitable[object]]], each: int) -> Figures:
    async def client(trip: Callable[[], Awaitable[object]]) -> None:
        for _ in range(each):
            await trip()

    for trip in clients:  # one round trip each first: the statements prepared
        await trip()
    cpu, waits, preempted = _usage()
    started = time.perf_counter()
    await asyncio.gather(*(client(trip) for trip in clients))
    elapsed = time.perf_counter() - started
    cpu_after, waits_after, preempted_after = _usage()
    trips = len(clients) * each
    return {
        "cpu_us": (cpu_after - cpu) / trips * 1e6,
        "waits": (waits_after - waits) / trips,
        "preempted": (preempted_after - preempted) / trips,
        "rate": trips / elapsed,
    }


async def through_threads(url: str, connections: int, each: int) -> Figures:
    boxes = [await Inbox.open(url, name=f"hop{k}") for k in range(connections)]
    try:

        def trip_of(box: Inbox) -> Callable[[], Awaitable[object]]:
            name = box.name
            return lambda: box._db.call(  # the engine's path to the server (core/pg/db.py)
                lambda tx: tx.conn.execute(STATEMENT, (name,), prepare=True).fetchall()
            )

        return await _timed([trip_of(box) for box in boxes], each)
    finally:
        for box in boxes:
            await box.close()


async def on_the_loop(url: str, connections: int, each: int) -> Figures:
    conns = [
        await psycopg.AsyncConnection.connect(url, autocommit=True) for _ in range(connections)
    ]
    try:

        def trip_of(conn: psycopg.AsyncConnection, name: str) -> Callable[[], Awaitable[object]]:
            async def trip() -> object:
                cursor = await conn.execute(STATEMENT, (name,), prepare=True)
                return await cursor.fetchall()

            return trip

        return await _timed([trip_of(conn, f"hop{k}") for k, conn in enumerate(conns)], each)
    finally:
        for conn in conns:
            await conn.close()


def spread(values: list[float], digits: int) -> str:
    median = f"{statistics.median(values):.{digits}f}"
    if len(values) == 1:
        return median
    return f"{median} ({min(values):.{digits}f}–{max(values):.{digits}f})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    rounds, trips, widths = (1, 200, (1, 5)) if args.quick else (args.rounds, 10_000, (1, 5, 25))

    from tests.pg.server import cluster

    url = cluster().new_database(schema=False)
    asyncio.run(through_threads(url, max(widths), 1))  # the inboxes' schema, once
    run = {"thread": through_threads, "async": on_the_loop}
    print(
        f"PostgreSQL round trips: {trips} a measurement, {rounds} round(s), "
        f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}"
    )
    print(
        f"{'connections':>11} {'path':>7} {'µs CPU a round trip':>24} {'waits':>16} "
        f"{'preempted':>16} {'round trips/s':>22}"
    )
    for n in widths:
        results: dict[str, list[Figures]] = {path: [] for path in PATHS}
        for r in range(rounds):
            for path in PATHS if r % 2 == 0 else PATHS[::-1]:
                results[path].append(asyncio.run(run[path](url, n, trips // n)))
        for path in PATHS:
            got = results[path]
            print(
                f"{n:>11} {path:>7} {spread([f['cpu_us'] for f in got], 1):>24} "
                f"{spread([f['waits'] for f in got], 2):>16} "
                f"{spread([f['preempted'] for f in got], 2):>16} "
                f"{spread([f['rate'] for f in got], 0):>22}",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
