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

from onwatch.core import Inbox  # noqa: E402

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


def _machine_busy() -> tuple[float, float]:
    """(busy, total) CPU seconds of the whole machine so far, from /proc/stat."""
    fields = [float(v) for v in open("/proc/stat").readline().split()[1:]]
    ticks = os.sysconf("SC_CLK_TCK")
    idle = fields[3] + fields[4]  # idle + iowait
    return (sum(fields) - idle) / ticks, sum(fields) / ticks


def _postgres_cpu(data: Path | None) -> float | None:
    """CPU seconds used so far by the server of the data folder `data`: the postmaster,
    its live children, and (reaped) children that have exited. None without a folder."""
    if data is None:
        return None
    ticks = os.sysconf("SC_CLK_TCK")
    postmaster = int((data / "postmaster.pid").read_text().split()[0])
    total = 0.0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = open(f"/proc/{entry}/stat").read()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()  # after "pid (comm) "
        pid, ppid = int(entry), int(fields[1])
        if pid == postmaster:
            total += sum(float(v) for v in fields[11:15])  # utime stime cutime cstime
        elif ppid == postmaster:
            total += float(fields[11]) + float(fields[12])
    return total / ticks


def measure(
    url: str, processes: int, total: int, data: Path | None = None
) -> tuple[float, float, float, float | None, float]:
    """Runs per second, and over the same span: the machine's CPU busy (share of all
    cores), per run the CPU seconds of the fleet processes, of PostgreSQL (None when the
    server is not ours to look at) and of everything else on the machine."""
    import resource

    env = dict(os.environ, PYTHONPATH=str(ROOT))
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    busy0, all0 = _machine_busy()
    pg0 = _postgres_cpu(data)
    started = time.perf_counter()
    fleet = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "onwatch",
                "worker",
                url,
                "--all-inboxes",
                "--concurrency",
                str(CONCURRENCY),
                "--agent",
                "tests.pg.actors:io_bound",
                "--holder",
                f"p{n}",
                "--poll",
                "1",
                "--no-dispatch",
                "--log-level",
                "warning",
            ],
            cwd=ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
        )
        for n in range(processes)
    ]
    try:
        deadline = time.monotonic() + 600
        while done(url) < total:
            if time.monotonic() > deadline:
                raise RuntimeError("the fleet did not finish within 10 minutes")
            time.sleep(0.05)
        elapsed = time.perf_counter() - started
        busy1, all1 = _machine_busy()
        pg1 = _postgres_cpu(data)
    finally:
        for proc in fleet:
            proc.send_signal(signal.SIGTERM)
        for proc in fleet:
            proc.wait(timeout=60)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    fleet_cpu = (after.ru_utime + after.ru_stime) - (children.ru_utime + children.ru_stime)
    busy = busy1 - busy0
    pg_cpu = None if pg0 is None or pg1 is None else pg1 - pg0
    return (
        total / elapsed,
        busy / (all1 - all0),
        fleet_cpu / total,
        None if pg_cpu is None else pg_cpu / total,
        max(busy - fleet_cpu - (pg_cpu or 0.0), 0.0) / total,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--url")
    args, _ = parser.parse_known_args(argv)
    inboxes, events, counts = (40, 3, (1, 2)) if args.quick else (200, 10, (1, 2, 4))
    base = args.url or os.environ.get("ONWATCH_TEST_DATABASE_URL")
    from tests.pg.server import cluster

    server = None if base else cluster()
    print(
        f"fleet: {inboxes} inboxes × {events} runs, agent {AGENT_SECONDS * 1e3:.0f} ms, "
        f"concurrency {CONCURRENCY}, {os.cpu_count()} cores"
    )
    for processes in counts:
        url = base if server is None else server.new_database()
        asyncio.run(fill(url, inboxes, events))
        data = server.owned.data if server is not None and server.owned else None
        rate, busy, fleet_cpu, pg_cpu, other_cpu = measure(url, processes, inboxes * events, data)
        ideal = processes * CONCURRENCY / AGENT_SECONDS
        pg_text = "?" if pg_cpu is None else f"{pg_cpu * 1e3:.2f}"
        print(
            f"{processes} process(es): {rate:7.1f} runs/s  (ideal {ideal:.0f}, "
            f"{rate / ideal:.2f} of it); machine CPU {busy:.0%} busy; CPU ms per run: "
            f"fleet {fleet_cpu * 1e3:.2f} (start-up included), PostgreSQL {pg_text}, "
            f"rest of the machine {other_cpu * 1e3:.2f}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
