#!/usr/bin/env python3
"""Fleet throughput on PostgreSQL: fleet-worker processes over 200 inboxes of one database.

    python3 tests/bench/bench_fleet_worker.py [--quick] [--url postgresql://…]

Each inbox holds the same number of events and runs them one per run (max_batch 1); the
agent waits 50 ms (I/O-bound). For 1, 2 and 4 processes at concurrency 25 it prints the runs
per second from the first process's start until every event is done, against the ideal
(processes × 25 / 0.05 s). PostgreSQL is the tests' session server (tests/pg/server.py)
unless --url or ONWATCH_TEST_DATABASE_URL names one; each measurement gets a database of
its own. --quick: 40 inboxes, 1 and 2 processes, a smoke test.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import psycopg  # noqa: E402

from core import Inbox  # noqa: E402

CONCURRENCY, AGENT_SECONDS = 25, 0.05


async def fill(url: str, inboxes: int, events: int) -> None:
    for i in range(inboxes):
        box = await Inbox.open(url, name=f"inbox-{i:03d}")
        await box.configure(max_batch=1)
        await box.ingest_batch([("bench", f"{i}/{k}", None) for k in range(events)])
        await box.close()


def done(url: str) -> int:
    with psycopg.connect(url) as conn:
        return conn.execute("SELECT count(*) FROM events WHERE status = 'done'").fetchone()[0]


def measure(url: str, processes: int, total: int) -> float:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    started = time.perf_counter()
    fleet = [subprocess.Popen(
        [sys.executable, "-m", "cli", "worker", url, "--all-inboxes", "--concurrency",
         str(CONCURRENCY), "--agent", "tests.pg.actors:io_bound", "--holder", f"p{n}",
         "--poll", "1", "--no-dispatch", "--log-level", "warning"], cwd=ROOT, env=env,
        stdout=subprocess.DEVNULL) for n in range(processes)]
    try:
        deadline = time.monotonic() + 600
        while done(url) < total:
            if time.monotonic() > deadline:
                raise RuntimeError("the fleet did not finish within 10 minutes")
            time.sleep(0.05)
        elapsed = time.perf_counter() - started
    finally:
        for proc in fleet:
            proc.send_signal(signal.SIGTERM)
        for proc in fleet:
            proc.wait(timeout=60)
    return total / elapsed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--url")
    args, _ = parser.parse_known_args(argv)
    inboxes, events, counts = (40, 3, (1, 2)) if args.quick else (200, 10, (1, 2, 4))
    base = args.url or os.environ.get("ONWATCH_TEST_DATABASE_URL")
    from tests.pg.server import cluster
    server = None if base else cluster()
    print(f"fleet: {inboxes} inboxes × {events} runs, agent {AGENT_SECONDS * 1e3:.0f} ms, "
          f"concurrency {CONCURRENCY}, {os.cpu_count()} cores")
    for processes in counts:
        url = base if server is None else server.new_database()
        asyncio.run(fill(url, inboxes, events))
        rate = measure(url, processes, inboxes * events)
        ideal = processes * CONCURRENCY / AGENT_SECONDS
        print(f"{processes} process(es): {rate:7.1f} runs/s  (ideal {ideal:.0f}, "
              f"{rate / ideal:.2f} of it)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
