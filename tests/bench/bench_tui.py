#!/usr/bin/env python3
"""Benchmark of the supervisor TUI over a big inbox: paint, memory, refresh, tick, action.

    python3 tests/bench/bench_tui.py            1,000,000 events (seeding takes ~20 s)
    python3 tests/bench/bench_tui.py --quick    20,000 events: a smoke run, figures meaningless

The inbox gets 1,000,000 events across every state, 10,000 timers, 1,000 approvals and 10,000
held outbox messages: created with `Inbox.open` (core's schema, triggers and indexes), then
filled with plain sqlite3 `executemany` in one transaction (the count triggers keep
`counts()` right). The app then runs headless (Textual's test driver, 120×40) in a fresh
process, so the resident memory measured is the app's own:

* first full paint: from opening the inbox and starting the app to the first full read
  shown (every pane filled); also from the process start (interpreter and imports included);
* resident memory (VmRSS) after that paint;
* refresh after one row changed: another connection changes one row; the poll that finds
  the change re-reads and repaints (median over several changes; the whole way, commit
  elsewhere → row gone from the pane, is reported separately; bench_wake.py measures it
  with and without the file notifier);
* idle tick: the once-a-second clock tick with nothing changed, on the Approvals pane where
  every row's countdown moves each second (median);
* keypress to committed action: the key event `r` on the Dead & interrupted pane (posted as
  the terminal driver posts it) until another connection sees the row pending (median).
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

T0 = 1_700_000_000
FULL = {"events": 1_000_000, "timers": 10_000, "approvals": 1_000, "outbox": 10_000}
QUICK = {"events": 20_000, "timers": 500, "approvals": 100, "outbox": 500}
# share of events per state (the rest are done)
STATES = {"pending": 0.15, "running": 0.001, "dead": 0.02, "interrupted": 0.005, "cancelled": 0.02}
TARGETS = {
    "first full paint": (1.5, "s"),
    "resident memory": (200, "MB"),
    "refresh after one row changed": (50, "ms"),
    "idle tick": (5, "ms"),
    "keypress to committed action": (100, "ms"),
}


def seed(path: str, sizes: dict[str, int]) -> float:
    """Create the inbox with core's schema, then bulk-insert the rows; return seconds."""
    from onwatch.core import Inbox

    async def create() -> None:
        inbox = await Inbox.open(path)
        await inbox.close()

    started = time.perf_counter()
    asyncio.run(create())
    rng = random.Random(7)
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("PRAGMA synchronous = OFF")  # seeding only; the app opens it as usual
    db.execute("BEGIN")
    statuses = []
    for status, share in STATES.items():
        statuses += [status] * int(sizes["events"] * share)
    statuses += ["done"] * (sizes["events"] - len(statuses))
    rng.shuffle(statuses)

    def events():
        for i, status in enumerate(statuses):
            created = T0 - 86_400 + i % 86_400
            attempts = {"pending": i % 3, "running": 1, "dead": 3, "interrupted": 1}.get(
                status, 1 if status == "done" else 0
            )
            error = (
                "too many attempts (3/3): TimeoutError"
                if status == "dead"
                else "completion uncertain: run lost, generation 1 lost its lease"
                if status == "interrupted"
                else None
            )
            yield (
                rng.choice(("webhook", "chat", "email", "timer")),
                f"bench-{i}",
                json.dumps({"n": i, "text": "hello " * 8}),
                status,
                attempts,
                2 if status == "running" else None,
                T0 if status == "running" else None,
                created,
                created,
                created,
                error,
            )

    db.executemany(
        "INSERT INTO events(source, source_id, payload, status, attempts, claim_gen, "
        "claimed_at, available_at, created, updated, error) VALUES (?,?,?,?,?,?,?,?,?,?,?)",
        events(),
    )
    db.executemany(
        "INSERT INTO timers(id, kind, due, every, catch_up, payload) VALUES (?,?,?,?,?,?)",
        (
            (
                f"timer-{i}",
                "timer",
                T0 + 60 + i * 7,
                3600 if i % 2 else None,
                "coalesce",
                json.dumps({"i": i}),
            )
            for i in range(sizes["timers"])
        ),
    )
    db.executemany(
        "INSERT INTO approvals(request_id, action, requested, due, answer, answered_at, "
        "answered_by) VALUES (?,?,?,?,?,?,?)",
        (
            (
                f"req-{i}",
                f"Refund ${i}.00 to customer {i}",
                T0 - 600,
                T0 + 3600 + i,
                None if i % 2 else "yes",
                None if i % 2 else T0 - 60,
                None if i % 2 else "operator",
            )
            for i in range(sizes["approvals"])
        ),
    )
    db.executemany(
        "INSERT INTO outbox(body, urgent, created, status) VALUES (?,?,?, 'held')",
        (
            (f"update {i}: still working on it", int(i % 50 == 0), T0 - 3600 + i)
            for i in range(sizes["outbox"])
        ),
    )
    db.execute(
        "INSERT INTO lease(id, holder, gen, until) VALUES (1, 'worker-b', 2, ?)", (T0 + 100,)
    )
    db.execute(
        "INSERT INTO lease_history(gen, holder, previous_holder, at, how) VALUES "
        "(1, 'worker-a', NULL, ?, 'first'), (2, 'worker-b', 'worker-a', ?, 'takeover')",
        (T0 - 3600, T0 - 60),
    )
    db.execute("UPDATE meta SET value = ? WHERE key = 'last_paced_send'", (T0 - 600,))
    db.execute("COMMIT")
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    db.close()
    return time.perf_counter() - started


def rss_mb() -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


async def measure(path: str, repeats: int, process_start: float | None = None) -> dict[str, float]:
    """Run the app headless over `path` and take every figure (in this fresh process)."""
    from textual import events

    from onwatch.core import FakeClock, Inbox
    from onwatch.tui.app import OnwatchApp
    from onwatch.tui.screens.confirm import ConfirmScreen

    figures: dict[str, float] = {}
    clock = FakeClock(T0)
    started = time.perf_counter()
    inbox = await Inbox.open(path, create=False, clock=clock)
    other = sqlite3.connect(path, isolation_level=None, timeout=5)
    try:
        app = OnwatchApp(inbox)
        async with app.run_test(size=(120, 40)) as pilot:
            await app.loaded.wait()
            await pilot.pause()
            figures["first full paint"] = time.perf_counter() - started
            if process_start is not None:
                figures["first full paint, from process start"] = time.time() - process_start
            figures["resident memory"] = rss_mb()

            # Refresh after one row changed elsewhere: the poll that finds it does the work.
            pending = [int(k) for k in app.pane("pending")._records]
            costs, latencies = [], []
            for event_id in pending[:repeats]:
                while app._polling:
                    await asyncio.sleep(0.001)
                other.execute("UPDATE events SET status = 'cancelled' WHERE id = ?", (event_id,))
                app._polling = True  # run the poll by hand, timed, instead of the interval
                begin = time.perf_counter()
                await app._poll_once()
                costs.append(time.perf_counter() - begin)
                assert str(event_id) not in app.pane("pending")._records
                await pilot.pause()
            figures["refresh after one row changed"] = statistics.median(costs) * 1000
            # End to end, left to the app: commit → row gone from the pane (the file
            # notifier triggers the poll; without it, the 0.5 s poll finds the change).
            rng = random.Random(11)
            for event_id in pending[repeats : 2 * repeats]:
                await asyncio.sleep(rng.uniform(0, app.POLL_SECONDS))  # any phase of the poll
                other.execute("UPDATE events SET status = 'cancelled' WHERE id = ?", (event_id,))
                changed = time.perf_counter()
                while str(event_id) in app.pane("pending")._records:
                    await asyncio.sleep(0.002)
                latencies.append(time.perf_counter() - changed)
            figures["change elsewhere on screen"] = statistics.median(latencies) * 1000

            # Idle: a tick of the clock and a poll that finds nothing changed.
            await pilot.press("4")  # the worst case: every approval's countdown moves
            await app.workers.wait_for_complete()
            await pilot.pause()
            for name, job in (("idle tick", None), ("idle poll (nothing changed)", "poll")):
                samples = []
                for _ in range(repeats * 5):
                    clock.advance(1)
                    begin = time.perf_counter()
                    if job is None:
                        app.tick()
                    else:
                        app._polling = True
                        await app._poll_once()
                    samples.append(time.perf_counter() - begin)
                    await pilot.pause()
                figures[name] = statistics.median(samples) * 1000

            # Keypress to committed action: requeue on pane 3, timed from the confirming y.
            await pilot.press("3")
            await app.workers.wait_for_complete()
            await pilot.pause()
            samples = []
            for _ in range(repeats):
                pane = app.pane("dead")
                event_id = int(pane.cursor_key())
                app.post_message(events.Key("r", "r"))  # as the terminal driver delivers it
                for _ in range(5000):  # bounded: a missing dialog fails below, not hangs
                    if isinstance(app.screen, ConfirmScreen):
                        break
                    await asyncio.sleep(0.001)
                assert isinstance(app.screen, ConfirmScreen), "requeue asked no confirmation"
                await pilot.pause()
                begin = time.perf_counter()
                app.post_message(events.Key("y", "y"))
                while (
                    other.execute("SELECT status FROM events WHERE id = ?", (event_id,)).fetchone()[
                        0
                    ]
                    != "pending"
                ):
                    await asyncio.sleep(0.001)
                samples.append(time.perf_counter() - begin)
                await app.workers.wait_for_complete()
                await pilot.pause()
            figures["keypress to committed action"] = statistics.median(samples) * 1000
            figures["resident memory, at the end"] = rss_mb()
    finally:
        other.close()
        await inbox.close()
    return figures


def table(sizes: dict[str, int], seconds: float, figures: dict[str, float]) -> str:
    units = {
        "first full paint": "s",
        "first full paint, from process start": "s",
        "resident memory": "MB",
        "resident memory, at the end": "MB",
    }
    lines = [
        f"inbox: {sizes['events']:,} events, {sizes['timers']:,} timers, "
        f"{sizes['approvals']:,} approvals, {sizes['outbox']:,} held messages "
        f"(seeded in {seconds:.1f} s)",
        f"{'measure':<46}{'target':>10}{'measured':>12}  ok",
    ]
    for name, value in figures.items():
        unit = units.get(name, "ms")
        target = TARGETS.get(name)
        shown = f"{value:.2f} {unit}" if unit == "s" else f"{value:.1f} {unit}"
        if target is None:
            lines.append(f"{name:<46}{'':>10}{shown:>12}")
        else:
            limit, _ = target
            ok = "yes" if value < limit else "NO"
            lines.append(f"{name:<46}{f'< {limit:g} {unit}':>10}{shown:>12}  {ok}")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    if argv[:1] == ["--measure"]:  # the child: measure and print JSON
        print(json.dumps(asyncio.run(measure(argv[1], int(argv[2]), float(argv[3])))))
        return 0
    quick = "--quick" in argv
    sizes = QUICK if quick else FULL
    with tempfile.TemporaryDirectory(prefix="onwatch-bench-tui-") as scratch:
        path = os.path.join(scratch, "big.db")
        seconds = seed(path, sizes)
        child = subprocess.run(
            [sys.executable, __file__, "--measure", path, "3" if quick else "7", str(time.time())],
            capture_output=True,
            text=True,
            cwd=ROOT,
            timeout=900,
            env=dict(os.environ, TZ="UTC"),
        )
        if child.returncode != 0:
            print(child.stdout + child.stderr, file=sys.stderr)
            return child.returncode
        figures = json.loads(child.stdout.strip().splitlines()[-1])
    print(table(sizes, seconds, figures))
    if quick:
        print("(--quick: a smoke run on a small inbox; the figures are not the measurement)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
