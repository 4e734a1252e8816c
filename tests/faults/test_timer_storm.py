"""A storm of due timers does not starve intake, and a pass cut off fires nothing twice
(docs/rules.md#timers-and-catch-up).

One process runs a scheduler pass over 30,000 one-off timers due at once; another ingests
while it runs. The ingests are committed while the pass goes on (their events' ids fall
among the storm's), not after it: the pass fires in short transactions with pauses between
them, and a waiting writer looks for the lock often enough to get in at the first pause.
Nothing here is timed; what is checked is the order the commits landed in.
"""

from __future__ import annotations

import json
import signal
import sqlite3
import subprocess
import sys

import pytest

from onwatch.core import FakeClock, Inbox
from onwatch.core.engine import timers
from onwatch.core.sqlite.db import write_transaction
from onwatch.core.sqlite.tx import SqliteTx
from tests.worker.helpers import ROOT, env, query, wait_for

pytestmark = pytest.mark.slow

NOW = 1_700_000_000
STORM = 30_000

PASS = r"""
import asyncio, sys
from onwatch.core import FakeClock, Inbox

async def main(path, now):
    box = await Inbox.open(path, clock=FakeClock(now))
    print("ready", flush=True)
    fired = await box.run_scheduler()
    await box.close()
    print(fired, flush=True)

asyncio.run(main(sys.argv[1], int(sys.argv[2])))
"""


def storm(path: str, count: int) -> None:
    """`count` one-off timers, all due before NOW (a daily digest for every user at 09:00)."""
    db = sqlite3.connect(path, isolation_level=None)
    try:
        tx = SqliteTx(db)

        def add(tx: SqliteTx) -> None:
            for i in range(count):
                timers.add_timer(
                    tx,
                    f"digest-{i}",
                    NOW - 1,
                    json.dumps({"user": i}),
                    None,
                    None,
                    "coalesce",
                    "timer",
                )

        write_transaction(tx, add, ())
    finally:
        db.close()


def start_pass(path: str) -> subprocess.Popen:
    process = subprocess.Popen(
        [sys.executable, "-c", PASS, path, str(NOW)],
        cwd=ROOT,
        env=env("/tmp"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert process.stdout.readline() == "ready\n", process.stderr.read()  # type: ignore[union-attr]
    return process


def fired(path: str) -> int:
    return query(path, "SELECT count(*) FROM events WHERE source = 'timer'")[0][0]


async def test_ingests_from_another_process_get_in_while_a_storm_is_fired(tmp_path):
    path = str(tmp_path / "inbox.db")
    await (await Inbox.open(path)).close()
    storm(path, STORM)
    scheduler = start_pass(path)
    try:
        wait_for(lambda: fired(path) > 0, timeout=60, interval=0.001, what="the storm to begin")
        async with await Inbox.open(path, clock=FakeClock(NOW)) as box:
            for i in range(5):
                assert await box.ingest("chat", f"during-{i}", None)
        assert scheduler.wait(120) == 0, scheduler.stderr.read()  # type: ignore[union-attr]
        assert scheduler.stdout.read().strip() == str(STORM)  # type: ignore[union-attr]
    finally:
        if scheduler.poll() is None:
            scheduler.kill()
            scheduler.wait()
    ours = [i for (i,) in query(path, "SELECT id FROM events WHERE source = 'chat'")]
    last_fired = query(path, "SELECT max(id) FROM events WHERE source = 'timer'")[0][0]
    # Every ingest was committed while the pass went on, not after the last of the storm.
    assert len(ours) == 5 and max(ours) < last_fired, (ours, last_fired)
    assert fired(path) == STORM
    assert query(path, "SELECT count(*) FROM timers") == [(0,)]


async def test_a_pass_killed_in_the_storm_fires_every_timer_exactly_once_in_the_end(tmp_path):
    path = str(tmp_path / "inbox.db")
    await (await Inbox.open(path)).close()
    storm(path, STORM)
    scheduler = start_pass(path)
    try:
        wait_for(lambda: fired(path) > 0, timeout=60, interval=0.001, what="the storm to begin")
        scheduler.send_signal(signal.SIGKILL)  # in the middle of the storm
        scheduler.wait()
    finally:
        if scheduler.poll() is None:
            scheduler.kill()
            scheduler.wait()
    before = fired(path)
    left = query(path, "SELECT count(*) FROM timers")[0][0]
    assert 0 < before < STORM and before + left == STORM  # each chunk all or nothing
    async with await Inbox.open(path, clock=FakeClock(NOW)) as box:
        assert await box.run_scheduler() == left
        assert await box.run_scheduler() == 0
    assert fired(path) == STORM
    keys = query(path, "SELECT count(DISTINCT source_id) FROM events WHERE source = 'timer'")
    assert keys == [(STORM,)]
