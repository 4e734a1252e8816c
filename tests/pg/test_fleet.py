"""Fleet workers: processes serving every inbox of one database that has work, at most N at
once each, never two runs of one inbox at the same time."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys

import psycopg
import pytest

from onwatch.core import Inbox
from tests.worker.helpers import ROOT, env, onwatch, wait_for

pytestmark = pytest.mark.slow
INBOXES, EVENTS = 20, 4


# `python -m onwatch …` in a process whose clock is off by argv[1] seconds, as on a machine
# whose clock drifted (its time.time moved before onwatch is imported).
SKEWED = (
    "import runpy, sys, time; skew = float(sys.argv.pop(1)); real = time.time; "
    "time.time = lambda: real() + skew; sys.argv[0] = 'onwatch'; "
    "runpy.run_module('onwatch', run_name='__main__', alter_sys=True)"
)


def start_fleet(
    url: str,
    test_dir,
    holder: str,
    *,
    concurrency: int = 4,
    agent: str = "ledgered",
    skew: float = 0.0,
) -> subprocess.Popen:
    """A fleet worker process; `skew` seconds off the real time if given."""
    out = open(os.path.join(test_dir, f"{holder}.err"), "ab")
    launch = ["-c", SKEWED, str(skew)] if skew else ["-m", "onwatch"]
    try:
        return subprocess.Popen(
            [
                sys.executable,
                *launch,
                "worker",
                url,
                "--all-inboxes",
                "--concurrency",
                str(concurrency),
                "--agent",
                f"tests.pg.actors:{agent}",
                "--holder",
                holder,
                "--poll",
                "5",
                "--no-dispatch",
            ],
            cwd=ROOT,
            env=env(test_dir),
            stdout=subprocess.DEVNULL,
            stderr=out,
        )
    finally:
        out.close()


def done(url: str) -> int:
    with psycopg.connect(url) as conn:
        return conn.execute("SELECT count(*) FROM events WHERE status = 'done'").fetchone()[0]


async def fill(url: str) -> None:
    for i in range(INBOXES):
        box = await Inbox.open(url, name=f"inbox-{i:02d}")
        await box.configure(max_batch=1)  # one run per event: many runs per inbox
        await box.ingest_batch([("chat", f"inbox-{i:02d}/{k}", None) for k in range(EVENTS)])
        await box.close()


def test_two_fleet_workers_share_the_inboxes_and_never_run_one_twice_at_once(url, tmp_path):
    asyncio.run(fill(url))
    fleets = [start_fleet(url, tmp_path, f"fleet-{n}") for n in range(2)]
    try:
        wait_for(lambda: done(url) == INBOXES * EVENTS, 60, what="every event done")
        # Idle now; new work is noticed by NOTIFY, long before the 5 s poll.
        assert (
            onwatch("ingest", url, "chat", "inbox-07/late", "--inbox", "inbox-07").returncode == 0
        )
        wait_for(lambda: done(url) == INBOXES * EVENTS + 1, 4, what="the late event")
    finally:
        for fleet in fleets:
            fleet.send_signal(signal.SIGTERM)
        codes = [fleet.wait(timeout=30) for fleet in fleets]
    errors = [(tmp_path / f"fleet-{n}.err").read_text() for n in range(2)]
    assert codes == [0, 0], errors
    runs = [json.loads(line) for line in (tmp_path / "ledger").read_text().splitlines()]
    assert len(runs) == INBOXES * EVENTS + 1
    assert len({r["pid"] for r in runs}) == 2, "both processes served some inboxes"
    by_inbox: dict[str, list] = {}
    for run in runs:
        by_inbox.setdefault(run["inbox"], []).append((run["began"], run["ended"]))
    for inbox, spans in by_inbox.items():
        spans.sort()
        for (_, end), (start, _) in zip(spans, spans[1:], strict=False):
            assert start >= end, f"{inbox} ran twice at once"
    with psycopg.connect(url) as conn:
        assert conn.execute(
            "SELECT status, attempts, count(*) FROM events GROUP BY 1, 2"
        ).fetchall() == [("done", 1, INBOXES * EVENTS + 1)]
        assert conn.execute("SELECT sum(refused_writes) FROM inboxes").fetchone()[0] == 0
        assert (
            conn.execute(
                "SELECT count(*) FROM inboxes WHERE lease_until >= extract(epoch FROM now())"
            ).fetchone()[0]
            == 0
        )  # all released
