#!/usr/bin/env python3
"""What `--isolate` costs: an agent in a process of its own against one in the worker's.

    python3 dev.py bench                  every benchmark (this one included)
    python3 tests/bench/bench_isolation.py [--quick] [--runs N]

* the call: what the worker does to call the agent on one event (Worker._call_agent: a
  thread of its own for a plain def; for an isolated agent a JSON line to its process, one
  per context call, and one back), the agent replying once; and what one more context call
  (`ctx.now`) costs. No database write is in it: this is isolation's own price.
* the whole run: a worker serves N events one run each (max_batch = 1) on a fresh inbox
  file, claim and fenced finish included (each an fsynced SQLite commit, which dominates
  and varies with the disk and the machine's load).
* a fresh agent process: IsolatedAgent.start() until the process has loaded the agent and
  said so (what the first run, and the run after a killed one, pays), and its memory (RSS).

--quick runs small sizes: a smoke test, not a measurement.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from onwatch.core import Event, Inbox, RunContext  # noqa: E402
from onwatch.core.runtime.isolation import IsolatedAgent  # noqa: E402
from onwatch.core.runtime.worker import Worker, run_worker  # noqa: E402

SPEC = "tests.bench.bench_isolation"


# --- the agents (imported by name in the isolated process) -----------------------------------


async def reply(batch, ctx) -> None:
    for event in batch:
        ctx.reply(f"ok {event.source_id}")


async def effect_reply(batch, ctx) -> None:
    for event in batch:
        async with ctx.effect("notify", {"event": event.source_id}):
            pass
        ctx.reply(f"ok {event.source_id}")


def plain_reply(batch, ctx) -> None:
    for event in batch:
        ctx.reply(f"ok {event.source_id}")


def plain_effect_reply(batch, ctx) -> None:
    for event in batch:
        ctx.perform("notify", {"event": event.source_id}, lambda key: None)
        ctx.reply(f"ok {event.source_id}")


async def many_nows(batch, ctx) -> None:
    ctx.result = [ctx.now for _ in range(100)][-1]


def plain_many_nows(batch, ctx) -> None:
    ctx.result = [ctx.now for _ in range(100)][-1]


AGENTS = {
    ("reply", "async def"): (reply, "reply"),
    ("reply", "plain def"): (plain_reply, "plain_reply"),
    ("effect + reply", "async def"): (effect_reply, "effect_reply"),
    ("effect + reply", "plain def"): (plain_effect_reply, "plain_effect_reply"),
}


async def per_run(folder: str, agent, runs: int) -> float:
    """Milliseconds per run for `runs` one-event runs served by one worker."""
    path = os.path.join(folder, f"inbox-{time.monotonic_ns()}.db")
    async with await Inbox.open(path) as inbox:
        await inbox.configure(outbox_gap=0, max_batch=1, lease_ttl=60)
        await inbox.ingest_batch([("chat", f"m{n}", {"n": n}) for n in range(runs)])
    started = time.perf_counter()
    stats = await run_worker(path, agent, holder="bench", max_runs=runs, poll_interval=0.05)
    elapsed = time.perf_counter() - started
    assert stats.done == runs, stats
    return elapsed / runs * 1000


async def per_call(folder: str, agent, calls: int) -> float:
    """Microseconds per call of the agent on one event, as the worker calls it."""
    path = os.path.join(folder, f"calls-{time.monotonic_ns()}.db")
    async with await Inbox.open(path) as inbox:
        event = Event(1, "chat", "m1", {"n": 1}, "running", 1, 1, None, run_id=1)
        worker = Worker(inbox, agent, holder="bench")
        loop = asyncio.get_running_loop()
        ctx = RunContext(inbox, "bench", 1, [event], loop)
        for _ in range(10):  # warm up
            await worker._call_agent([event], ctx)
        ctx.messages.clear()
        started = time.perf_counter()
        for _ in range(calls):
            await worker._call_agent([event], ctx)
        elapsed = time.perf_counter() - started
    return elapsed / calls * 1e6


async def both(folder: str, function, name: str, measure, size: int, rounds: int):
    here, apart = [], []
    for _ in range(rounds):
        here.append(await measure(folder, function, size))
        async with IsolatedAgent(f"{SPEC}:{name}") as isolated:
            await isolated.start()  # the process is up before the clock starts
            apart.append(await measure(folder, isolated, size))
    return statistics.median(here), statistics.median(apart)


async def measure(runs: int, rounds: int) -> None:
    with tempfile.TemporaryDirectory() as folder:
        print(f"the call (µs per run, median of {rounds} rounds of {runs * 10} calls)")
        print(f"{'agent':<28}{'in-process':>12}{'isolated':>12}{'isolation adds':>16}")
        for kind, (function, name) in {
            "async def": (reply, "reply"),
            "plain def": (plain_reply, "plain_reply"),
        }.items():
            a, b = await both(folder, function, name, per_call, runs * 10, rounds)
            print(f"{'reply, ' + kind:<28}{a:>12.0f}{b:>12.0f}{b - a:>16.0f}")
        for kind, (function, name) in {
            "async def": (many_nows, "many_nows"),
            "plain def": (plain_many_nows, "plain_many_nows"),
        }.items():
            a, b = await both(folder, function, name, per_call, runs, rounds)
            a, b = a / 100, b / 100
            print(f"{'one ctx call, ' + kind:<28}{a:>12.1f}{b:>12.1f}{b - a:>16.1f}")
        print()
        print(f"the whole run (ms, median of {rounds} rounds of {runs} runs; one worker, SQLite)")
        print(f"{'agent':<28}{'in-process':>12}{'isolated':>12}{'isolation adds':>16}")
        for (work, kind), (function, name) in AGENTS.items():
            a, b = await both(folder, function, name, per_run, runs, rounds)
            print(f"{work + ', ' + kind:<28}{a:>12.2f}{b:>12.2f}{b - a:>16.2f}")
        starts, memory = [], []
        for _ in range(max(3, rounds * 3)):
            isolated = IsolatedAgent(f"{SPEC}:reply")
            began = time.perf_counter()
            await isolated.start()
            starts.append((time.perf_counter() - began) * 1000)
            child = isolated._idle[0].process
            memory.append(_rss_kib(child.pid))
            await isolated.close()
        print()
        print(
            f"a fresh agent process (start to ready, median of {len(starts)}): "
            f"{statistics.median(starts):.0f} ms"
            + (f", {statistics.median(memory) / 1024:.0f} MiB resident" if all(memory) else "")
        )


def _rss_kib(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes (smoke test)")
    parser.add_argument("--runs", type=int, default=300)
    args = parser.parse_args(argv)
    runs, rounds = (20, 1) if args.quick else (args.runs, 3)
    asyncio.run(measure(runs, rounds))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
