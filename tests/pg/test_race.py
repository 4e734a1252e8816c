"""Fencing under real concurrency: OS processes, each with its own connection, race on one
inbox of a shared database (the row lock of core/pg/store.py is what they fight over)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path

import psycopg
import pytest

from onwatch.core import Inbox

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
PROCESSES = 6


def start(kind: str, url: str, name: str, t0: float, *extra: str) -> list[subprocess.Popen]:
    return [
        subprocess.Popen(
            [sys.executable, "-m", "tests.pg.actors", kind, url, name, f"h{i}", str(t0), *extra],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            text=True,
        )
        for i in range(PROCESSES)
    ]


def results(procs: list[subprocess.Popen]) -> list:
    out = []
    for proc in procs:
        text, _ = proc.communicate(timeout=120)
        assert proc.returncode == 0
        out.append(json.loads(text))
    return out


def query(url: str, sql: str, *params) -> list[tuple]:
    with psycopg.connect(url) as conn:
        return conn.execute(sql, params).fetchall()


def test_simultaneous_acquire_exactly_one_wins_each_generation(url):
    asyncio.run(_create(url, "race"))
    rounds = 5
    got = results(start("acquire", url, "race", time.time() + 2.5, str(rounds), "0.4"))
    for k in range(rounds):
        winners = [r[k] for r in got if r[k] is not None]
        assert winners == [k + 1], (k, got)  # one process, the next generation
    history = query(
        url,
        "SELECT h.gen, h.how FROM lease_history h JOIN inboxes i "
        "ON i.id = h.inbox_id WHERE i.name = 'race' ORDER BY h.gen",
    )
    assert history == [(1, "first")] + [(g, "takeover") for g in range(2, rounds + 1)]


def test_racing_workers_claim_every_event_exactly_once(url):
    events = 300
    asyncio.run(_create(url, "race", events))
    asyncio.run(_create(url, "bystander", 5))  # another inbox of the database, untouched
    got = results(start("serve", url, "race", time.time() + 2.5))
    gens = [gen for r in got for gen, _ in r["runs"]]
    assert len(gens) == len(set(gens))  # no generation was ever handed to two holders
    claimed = [i for r in got for _, ids in r["runs"] for i in ids]
    assert sorted(claimed) == sorted(set(claimed)) and len(claimed) == events
    assert sum(r["refused"] for r in got) == 0
    assert sum(1 for r in got if r["runs"]) >= 2, got  # the lease really changed hands
    rows = query(
        url,
        "SELECT i.name, e.status, e.attempts, count(*) FROM events e "
        "JOIN inboxes i ON i.id = e.inbox_id GROUP BY 1, 2, 3 ORDER BY 1",
    )
    assert rows == [("bystander", "pending", 0, 5), ("race", "done", 1, events)]
    assert query(url, "SELECT count(*) FROM outbox")[0][0] == len(gens)
    assert query(url, "SELECT count(*) FROM runs WHERE outcome = 'done'")[0][0] == len(gens)


async def _create(url: str, name: str, events: int = 0) -> None:
    box = await Inbox.open(url, name=name)
    await box.configure(max_batch=5, lease_ttl=60)
    await box.ingest_batch([("chat", f"m{i}", {"i": i}) for i in range(events)])
    await box.close()
