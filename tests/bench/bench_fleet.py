#!/usr/bin/env python3
"""Benchmark of the fleet desk over a folder of 1,000 inbox files.

    python3 tests/bench/bench_fleet.py                 1,000 inbox files in a folder
    python3 tests/bench/bench_fleet.py --url URL       1,000 inboxes in one PostgreSQL
                                                       database (URL: an onwatch database
                                                       with no inboxes yet, or `test` for a
                                                       throwaway server of tests/pg/server.py)
    python3 tests/bench/bench_fleet.py --quick         50 inboxes: a smoke run, figures meaningless

The inboxes are made through `Inbox.open` (four kinds: idle, busy with runs in the last hour,
one with a waiting approval, one with a dead event), copied to fill the folder, and dated a
minute back as a settled fleet is. The desk then runs headless (Textual's test driver,
120×40) in this process, with the wall clock:

* first paint: from starting the app to the Fleet view showing every inbox's summary;
* a change on screen: another connection commits an approval to one inbox; from the scan
  that noticed it (its thread handing the summaries back) until the row shows it (median of
  several changes), and from the commit (includes the wait for the next 1 s scan);
* idle CPU: the desk's process CPU time (every thread) over 10 s with nothing changing;
* resident memory (VmRSS) after the first paint and at the end;
* open SQLite files: how many inbox files the process holds open while idle.

With --url the same inboxes are made in one database (each through `Inbox.open(url, name=)`)
and the desk reads them through `DatabaseFleet`: one query for the change counters each second,
one for the summaries of the inboxes that changed.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from onwatch.core import ApprovalRequest, Inbox  # noqa: E402
from onwatch.core.fleet import DatabaseFleet, FolderFleet  # noqa: E402


def rss_mb() -> float:
    with open("/proc/self/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def open_inbox_files(folder: str) -> int:
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith(folder) and target.endswith(".db"):
            count += 1
    return count


async def fill(inbox: Inbox, kind: str, now: int) -> None:
    """One of the four kinds of inbox ("idle", "busy", "approval", "dead"): an hour of runs."""
    await inbox.configure(backoff_base=1, max_attempts=1 if kind == "dead" else 3)
    runs = 20 if kind == "busy" else 2
    for i in range(runs):
        at = now - 3500 + i * 170
        await inbox.ingest("chat", f"m{i}", {"text": f"message {i}"}, now=at)
        gen = await inbox.acquire("worker", now=at)
        batch = await inbox.claim_batch("worker", gen, now=at)
        approvals = (
            [ApprovalRequest("refund-1", 86_400, "Refund $40")]
            if kind == "approval" and i == runs - 1
            else []
        )
        error = "boom" if kind == "dead" or i % 7 == 3 else None
        await inbox.finish(
            "worker",
            gen,
            [e.id for e in batch],
            now=at + 1,
            messages=[] if error else [f"reply {i}"],
            error=error,
            approvals=[] if error else approvals,
        )
    if kind == "dead":
        gen = await inbox.acquire("worker", now=now)
        await inbox.claim_batch("worker", gen, now=now)


async def make_templates(folder: str) -> list[str]:
    now = int(time.time())
    paths = []
    for kind in ("idle", "busy", "approval", "dead"):
        path = os.path.join(folder, f"template-{kind}.db")
        async with await Inbox.open(path) as inbox:
            await fill(inbox, kind, now)
        paths.append(path)
    return paths


def build(folder: str, count: int, templates: list[str]) -> list[str]:
    kinds = [templates[0]] * 7 + [templates[1]] * 2 + [templates[2], templates[3]]
    settled = time.time() - 60
    names = []
    for i in range(count):
        name = f"agent-{i:04}.db"
        target = os.path.join(folder, name)
        shutil.copyfile(kinds[i % len(kinds)], target)
        os.utime(target, (settled, settled))
        names.append(name)
    for template in templates:
        os.remove(template)
    return names


async def fill_database(url: str, count: int) -> list[str]:
    """The four kinds of inbox of make_templates, made in one database, 20 at a time."""
    now = int(time.time())
    kinds = ["idle"] * 7 + ["busy"] * 2 + ["approval", "dead"]

    async def make(name: str, kind: str) -> None:
        async with await Inbox.open(url, name=name) as inbox:
            await fill(inbox, kind, now)

    names = [f"agent-{i:04}" for i in range(count)]
    for start in range(0, count, 20):
        await asyncio.gather(
            *(
                make(name, kinds[i % len(kinds)])
                for i, name in enumerate(names[start : start + 20], start)
            )
        )
    return names


async def measure(
    folder: str, names: list[str], changes: int, url: str | None = None
) -> dict[str, float]:
    from onwatch.tui.app import OnwatchApp
    from onwatch.tui.fleet import FleetScreen
    from onwatch.core import SystemClock

    figures: dict[str, float] = {}
    start = time.perf_counter()
    source = DatabaseFleet(url) if url else FolderFleet(folder)
    app = OnwatchApp(None, clock=SystemClock(), fleet=source)
    async with app.run_test(size=(120, 40)) as pilot:
        while not (
            getattr(app, "fleet_desk", None)
            and app.fleet_desk.loaded
            and isinstance(app.screen, FleetScreen)
            and app.screen.painted
        ):
            await asyncio.sleep(0.005)
        await pilot.pause()
        figures["first paint (s)"] = time.perf_counter() - start
        figures["inboxes shown"] = len(app.screen.order)
        figures["RSS after first paint (MB)"] = rss_mb()
        screen, desk = app.screen, app.fleet_desk

        noticed: list[float] = []
        original = desk.apply

        painted: list[float] = []

        def timed_apply(scan):
            if scan.read:
                noticed.append(time.perf_counter())
            original(scan)
            if scan.read:  # the first screen refresh after the repaint
                app.call_after_refresh(lambda: painted.append(time.perf_counter()))

        desk.apply = timed_apply
        after_notice, after_commit = [], []
        for i in range(changes):
            name = names[(i * 97 + 13) % len(names)]
            request = f"bench-{i}"
            committed = time.perf_counter()
            async with await (
                Inbox.open(url, name=name, create=False)
                if url
                else Inbox.open(os.path.join(folder, name), create=False)
            ) as inbox:
                await inbox.request_approval(request, 3600 + i, f"bench change {i}")
            noticed.clear()
            painted.clear()
            while not any(
                s.key == name and any(a.request_id == request for a in s.approvals)
                for s in screen.rows.items[:40]
            ):
                await asyncio.sleep(0.001)
            while len(painted) < len(noticed) or not painted:
                await asyncio.sleep(0.001)
            shown = painted[-1]
            after_commit.append(shown - committed)
            after_notice.append(shown - noticed[-1])
        figures["change on screen after noticed, median (ms)"] = (
            statistics.median(after_notice) * 1000 if after_notice else float("nan")
        )
        figures["change on screen after noticed, max (ms)"] = (
            max(after_notice) * 1000 if after_notice else float("nan")
        )
        figures["change on screen after commit, median (ms)"] = (
            statistics.median(after_commit) * 1000
        )

        await asyncio.sleep(3)  # let the files written above settle
        cpu, wall = time.process_time(), time.perf_counter()
        await asyncio.sleep(10)
        figures["idle CPU (%)"] = (time.process_time() - cpu) / (time.perf_counter() - wall) * 100
        if not url:
            figures["inbox files held open while idle"] = open_inbox_files(folder)
        figures["RSS at the end (MB)"] = rss_mb()
    if url:
        source.close()
    return figures


def main(argv: list[str]) -> int:
    quick = "--quick" in argv
    count = 50 if quick else 1000
    url = argv[argv.index("--url") + 1] if "--url" in argv[:-1] else None
    if url == "test":
        from tests.pg.server import cluster

        url = cluster().new_database()
    if url:
        import psycopg

        with psycopg.connect(url) as conn:
            if conn.execute(
                "SELECT to_regclass('inboxes') IS NOT NULL AND EXISTS (SELECT 1 FROM inboxes)"
            ).fetchone()[0]:
                print(
                    "bench_fleet: --url must name a database with no inboxes yet", file=sys.stderr
                )
                return 2
        started = time.perf_counter()
        names = asyncio.run(fill_database(url, count))
        print(f"made {count:,} inboxes in {time.perf_counter() - started:.0f} s")
        figures = asyncio.run(measure("", names, 3 if quick else 9, url))
        what = f"{count:,} inboxes in one PostgreSQL database"
    else:
        with tempfile.TemporaryDirectory(prefix="onwatch-fleet-") as folder:
            templates = asyncio.run(make_templates(folder))
            names = build(folder, count, templates)
            figures = asyncio.run(measure(folder, names, 3 if quick else 9))
        what = f"{count:,} inbox files"
    print(f"fleet desk over {what}, 120×40, headless")
    for label, value in figures.items():
        print(
            f"  {label:<48} {value:,.1f}" if isinstance(value, float) else f"  {label:<48} {value}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
