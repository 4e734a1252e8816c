#!/usr/bin/env python3
"""How fast onwatch reacts to a commit by another process, and what waiting costs.

    python3 dev.py bench              every benchmark (this one included)
    python3 tests/bench/bench_wake.py [--quick] [--rounds N]

* worker wake: a worker process (`onwatch worker`, an agent that notes the time it is
  called) and an ingesting process on one inbox. The ingester commits one event at a time at
  random intervals (60–120 ms, so the worker is idle and waiting each time) and notes when each
  ingest returned (committed and fsynced); the latency is agent called − ingest returned,
  over 200 events per round. Measured with the file notifier (now) and without it
  (ONWATCH_NO_NOTIFY=1, the 0.5 s poll: before).
* TUI: the supervisor app headless (Textual's test driver) in its own process, another
  connection commits a new pending event; the latency is commit returned → its row in the
  Pending pane (what the operator sees), over 40 events per round, both ways.
* idle CPU: a worker and a TUI, nothing happening, for 30 s, each in its own process and
  folder, with and without the notifier, all four at once; CPU time of every thread
  (/proc/PID/task/*/schedstat, the TUI's own process_time), in nanoseconds.

Targets: worker wake p50 < 10 ms and p99 < 50 ms; TUI p50 < 50 ms; idle CPU below the poll's.
--quick runs small sizes once: a smoke test (CI), not a measurement.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

TARGETS = {"worker wake p50": 10.0, "worker wake p99": 50.0, "TUI change on screen p50": 50.0}


# --- the agent the worker process runs --------------------------------------------------------


async def record(batch, ctx) -> None:
    """The benchmark's agent: note when it was called, for each event of its batch."""
    called = time.time()
    with open(os.environ["ONWATCH_BENCH_CALLS"], "a", encoding="utf-8") as handle:
        for event in batch:
            handle.write(f"{event.source_id} {called!r}\n")


# --- worker wake ----------------------------------------------------------------------------------


def _env(**extra: str) -> dict[str, str]:
    values = {k: v for k, v in os.environ.items() if k != "ONWATCH_NO_NOTIFY"}
    values.update(PYTHONDONTWRITEBYTECODE="1", PYTHONPATH=str(ROOT), **extra)
    return values


def _onwatch(*args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "onwatch", *args],
        cwd=ROOT,
        env=_env(**env),
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )


def _start_worker(path: str, calls: str, notify: bool, log: str) -> subprocess.Popen:
    env = _env(ONWATCH_BENCH_CALLS=calls, **({} if notify else {"ONWATCH_NO_NOTIFY": "1"}))
    with open(log, "ab") as err:
        return subprocess.Popen(
            [
                sys.executable,
                "-m",
                "onwatch",
                "worker",
                path,
                "--agent",
                "tests.bench.bench_wake:record",
                "--no-dispatch",
                "--log-level",
                "warning",
            ],
            cwd=ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=err,
        )


def _stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.terminate()
    if process.wait(30) != 0:
        raise AssertionError(f"process {process.pid} exited with {process.returncode}")


def _wait_for(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


INGESTER = """
import asyncio, random, sys, time
from onwatch.core import Inbox

async def main(path, n, out, seed):
    rng = random.Random(seed)
    lines = []
    async with await Inbox.open(path, create=False) as box:
        for i in range(n):
            await asyncio.sleep(rng.uniform(0.06, 0.12))   # the worker is idle by now
            await box.ingest("bench", f"e{i}", {"n": i})
            lines.append(f"e{i} {time.time()!r}")
    with open(out, "w") as handle:
        handle.write("\\n".join(lines) + "\\n")

asyncio.run(main(sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])))
"""


def worker_wake(folder: str, events: int, notify: bool, seed: int) -> list[float]:
    """Latencies in ms, ingest returned → agent called, for `events` events."""
    os.makedirs(folder, exist_ok=True)
    path, calls, committed = (
        os.path.join(folder, name) for name in ("inbox.db", "calls.txt", "committed.txt")
    )
    _onwatch("init", path, "lease_ttl=30")
    worker = _start_worker(path, calls, notify, os.path.join(folder, "worker.err"))
    try:
        _onwatch("ingest", path, "bench", "warm-up")  # the worker is up once this ran
        _wait_for(lambda: os.path.exists(calls), 30, "the worker's first run")
        subprocess.run(
            [sys.executable, "-c", INGESTER, path, str(events), committed, str(seed)],
            cwd=ROOT,
            env=_env(),
            check=True,
            timeout=600,
        )
        _wait_for(lambda: len(Path(calls).read_text().splitlines()) >= events + 1, 30, "every run")
    finally:
        _stop(worker)
    called = dict(line.split() for line in Path(calls).read_text().splitlines())
    return [
        (float(called[key]) - float(at)) * 1000
        for key, at in (line.split() for line in Path(committed).read_text().splitlines())
    ]


# --- TUI: commit elsewhere → row on screen -------------------------------------------------------


async def tui_latencies(path: str, events: int, seed: int) -> list[float]:
    """In this (child) process: the app headless; another connection commits events."""
    import sqlite3

    from onwatch.core import Inbox
    from onwatch.core.engine import intake
    from onwatch.core.sqlite.db import write_transaction
    from onwatch.core.sqlite.tx import SqliteTx
    from onwatch.tui.app import OnwatchApp

    rng = random.Random(seed)
    inbox = await Inbox.open(path, create=False)
    other = sqlite3.connect(path, isolation_level=None, timeout=5)
    other.execute("PRAGMA synchronous = FULL")
    latencies = []
    try:
        app = OnwatchApp(inbox)
        async with app.run_test(size=(120, 40)) as pilot:
            await app.loaded.wait()
            await pilot.pause()
            pane = app.pane("pending")
            for i in range(events):
                await asyncio.sleep(rng.uniform(0.1, 0.3))
                write_transaction(
                    SqliteTx(other),
                    intake.ingest_many,
                    ([("tui", f"t{i}", "{}", int(time.time()))],),
                )
                changed = time.perf_counter()
                event_id = other.execute(
                    "SELECT id FROM events WHERE source_id = ?", (f"t{i}",)
                ).fetchone()[0]
                deadline = changed + 10
                while str(event_id) not in pane._records:
                    if time.perf_counter() > deadline:
                        raise AssertionError(f"row {event_id} never shown")
                    await asyncio.sleep(0.001)
                latencies.append((time.perf_counter() - changed) * 1000)
    finally:
        other.close()
        await inbox.close()
    return latencies


def tui_wake(folder: str, events: int, notify: bool, seed: int) -> list[float]:
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, "inbox.db")
    _onwatch("init", path)
    env = _env(TZ="UTC", **({} if notify else {"ONWATCH_NO_NOTIFY": "1"}))
    child = subprocess.run(
        [sys.executable, __file__, "--tui-child", path, str(events), str(seed)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    if child.returncode != 0:
        raise AssertionError(child.stdout + child.stderr)
    return json.loads(child.stdout.strip().splitlines()[-1])


# --- idle CPU -------------------------------------------------------------------------------------

TUI_IDLE = """
import asyncio, json, os, sys, time
from onwatch.core import Inbox
from onwatch.tui.app import OnwatchApp

async def main(path, seconds):
    async with await Inbox.open(path, create=False) as inbox:
        app = OnwatchApp(inbox)
        async with app.run_test(size=(120, 40)) as pilot:
            await app.loaded.wait()
            await asyncio.sleep(2)   # past start-up
            before, started = time.process_time(), time.monotonic()
            await asyncio.sleep(seconds)
            spent = time.process_time() - before
            print(json.dumps(spent / (time.monotonic() - started)))

asyncio.run(main(sys.argv[1], float(sys.argv[2])))
"""


def _cpu_seconds(pid: int) -> float:
    """CPU time of every thread of `pid` (the connection's thread too), in nanosecond
    resolution: /proc's tick counts (10 ms) are too coarse for an idle process."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            total += int((task / "schedstat").read_text().split()[0])
        except (FileNotFoundError, ProcessLookupError):
            pass  # a thread that ended meanwhile
    return total / 1e9


def idle_cpu(folder: str, seconds: float) -> dict[str, float]:
    """Share of one CPU used by an idle worker and an idle TUI, with and without the
    notifier: four processes at once, each on its own inbox in its own folder."""
    workers, tuis = {}, {}
    for notify in (True, False):
        sub = os.path.join(folder, f"idle-{'notify' if notify else 'poll'}")
        os.makedirs(sub)
        path = os.path.join(sub, "inbox.db")
        _onwatch("init", path, "lease_ttl=30")
        workers[notify] = _start_worker(
            path, os.path.join(sub, "calls.txt"), notify, os.path.join(sub, "worker.err")
        )
        tui_path = os.path.join(sub, "tui.db")
        _onwatch("init", tui_path)
        tuis[notify] = subprocess.Popen(
            [sys.executable, "-c", TUI_IDLE, tui_path, str(seconds)],
            cwd=ROOT,
            env=_env(TZ="UTC", **({} if notify else {"ONWATCH_NO_NOTIFY": "1"})),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
    try:
        time.sleep(2.0)  # past start-up
        before = {notify: _cpu_seconds(w.pid) for notify, w in workers.items()}
        started = time.monotonic()
        time.sleep(seconds)
        elapsed = time.monotonic() - started
        figures = {
            f"idle worker CPU ({'notifier' if n else '0.5 s poll, before'})": (
                _cpu_seconds(w.pid) - before[n]
            )
            / elapsed
            * 100
            for n, w in workers.items()
        }
    finally:
        for worker in workers.values():
            _stop(worker)
    for notify, tui in tuis.items():
        out, err = tui.communicate(timeout=seconds + 120)
        if tui.returncode != 0:
            raise AssertionError(err)
        figures[f"idle TUI CPU ({'notifier' if notify else '0.5 s poll, before'})"] = (
            json.loads(out.strip().splitlines()[-1]) * 100
        )
    return figures


# --- the run ------------------------------------------------------------------------------------


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--tui-child"]:
        print(json.dumps(asyncio.run(tui_latencies(argv[1], int(argv[2]), int(argv[3])))))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--quick", action="store_true", help="small sizes, a smoke test rather than a measurement"
    )
    parser.add_argument("--rounds", type=int, help="rounds (default 3, quick 1)")
    args = parser.parse_args(argv)
    rounds = args.rounds or (1 if args.quick else 3)
    events, tui_events, idle_seconds = (20, 5, 3.0) if args.quick else (200, 40, 30.0)

    def out(line: str) -> None:
        print(line, flush=True)

    out(
        f"onwatch wake benchmark{' (quick: smoke test only)' if args.quick else ''}: "
        f"{rounds} round(s) of {events} worker events and {tui_events} TUI events per mode; "
        f"idle CPU over {idle_seconds:g} s"
    )
    folder = tempfile.mkdtemp(prefix="onwatch-bench-wake-")
    samples: dict[str, list[float]] = {}
    try:
        for r in range(rounds):
            out(f"  round {r + 1}/{rounds} …")
            # Alternate which mode goes first, so a neighbour's load lands on both alike.
            for notify in (True, False) if r % 2 == 0 else (False, True):
                mode = "notifier" if notify else "0.5 s poll, before"
                samples.setdefault(f"worker ({mode})", []).extend(
                    worker_wake(os.path.join(folder, f"w{r}-{notify}"), events, notify, r)
                )
                samples.setdefault(f"TUI ({mode})", []).extend(
                    tui_wake(os.path.join(folder, f"t{r}-{notify}"), tui_events, notify, r)
                )
        out(f"  idle CPU over {idle_seconds:g} s …")
        idle = idle_cpu(folder, idle_seconds)
    finally:
        shutil.rmtree(folder, ignore_errors=True)

    header = f"{'measure':<52}{'p50':>10}{'p99':>10}{'max':>10}  target"
    out(header)
    out("-" * len(header))
    scores = []
    for name, values in samples.items():
        p50, p99 = percentile(values, 0.5), percentile(values, 0.99)
        target = ""
        if name == "worker (notifier)":
            target = (
                f"p50 < 10 ms {'yes' if p50 < 10 else 'NO'}, "
                f"p99 < 50 ms {'yes' if p99 < 50 else 'NO'}"
            )
            scores += [TARGETS["worker wake p50"] / p50, TARGETS["worker wake p99"] / p99]
        elif name == "TUI (notifier)":
            target = f"p50 < 50 ms {'yes' if p50 < 50 else 'NO'}"
            scores.append(TARGETS["TUI change on screen p50"] / p50)
        label = f"{name}: commit → {'agent called' if name.startswith('w') else 'row shown'}"
        out(f"{label:<52}{p50:>7.1f} ms{p99:>7.1f} ms{max(values):>7.1f} ms  {target}")
    for name, share in idle.items():
        out(f"{name:<52}{share:>9.3f} %")
    for kind in ("worker", "TUI"):
        now, before = (idle[f"idle {kind} CPU ({m})"] for m in ("notifier", "0.5 s poll, before"))
        out(
            f"idle {kind} CPU, notifier / poll: {now / before if before else float('nan'):.2f}"
            f" ({'lower' if now < before else 'NOT lower'})"
        )
    out(f"samples: {', '.join(f'{k} {len(v)}' for k, v in samples.items())}")
    out(f"minimum target/measured: {min(scores):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
