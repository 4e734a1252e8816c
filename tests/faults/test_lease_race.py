"""Fencing under real concurrency, on both backends: OS processes, each with its own
connection, race on one inbox (the file's write lock, or the inbox's row lock, is what they
fight over). Scenario 2 (docs/rules.md#scenario-2-simultaneous-acquire) for real."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time

import pytest

from onwatch.core import Inbox
from tests.worker.helpers import ROOT, env

pytestmark = [pytest.mark.slow, pytest.mark.backends]
PROCESSES = 6
T = 1_000_000


def start(tmp_path, role: str, target: str, *args: str) -> list[subprocess.Popen]:
    """PROCESSES actors, each told to act at the same instant, 2.5 s from now (every one
    imported and connected by then)."""
    t0 = str(time.time() + 2.5)
    return [
        subprocess.Popen(
            [sys.executable, "-m", "tests.faults.actors", role, target, f"h{i}", t0, *args],
            cwd=ROOT,
            env=env(tmp_path),
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


async def create(target: str, events: int = 0, **settings: int) -> None:
    async with await Inbox.open(target) as box:
        await box.configure(**settings)
        await box.ingest_batch([("chat", f"m{i}", {"i": i}) for i in range(events)])


def test_simultaneous_acquire_exactly_one_wins_each_generation(tmp_path, inbox_target):
    rounds = 5
    asyncio.run(create(inbox_target, lease_ttl=60))
    got = results(start(tmp_path, "acquire", inbox_target, str(rounds), "0.4", "60"))
    for k in range(rounds):
        winners = [r[k] for r in got if r[k] is not None]
        # Every round's instant is past the previous lease: exactly one process takes over.
        assert winners == [k + 1], (k, got)

    async def history() -> list:
        async with await Inbox.open(inbox_target, create=False) as box:
            return await box.lease_history()

    changes = asyncio.run(history())
    assert [(c.gen, c.how) for c in reversed(changes)] == [(1, "first")] + [
        (g, "takeover") for g in range(2, rounds + 1)
    ]


def test_simultaneous_acquire_on_the_wall_clock(tmp_path, inbox_target):
    asyncio.run(create(inbox_target, lease_ttl=60))
    got = results(start(tmp_path, "acquire", inbox_target, "1", "0.4", "0"))
    assert sorted(r[0] for r in got if r[0] is not None) == [1]
    assert sum(r[0] is None for r in got) == PROCESSES - 1


def test_racing_workers_claim_every_event_exactly_once(tmp_path, inbox_target):
    events = 300
    asyncio.run(create(inbox_target, events, max_batch=5, lease_ttl=60))
    got = results(start(tmp_path, "serve", inbox_target))
    gens = [gen for r in got for gen, _ in r["runs"]]
    assert len(gens) == len(set(gens))  # no generation was ever handed to two holders
    claimed = [i for r in got for _, ids in r["runs"] for i in ids]
    assert sorted(claimed) == sorted(set(claimed)) and len(claimed) == events
    assert sum(r["refused"] for r in got) == 0
    assert sum(1 for r in got if r["runs"]) >= 2, got  # the lease really changed hands

    async def check() -> None:
        async with await Inbox.open(inbox_target, create=False) as box:
            assert (await box.counts())["done"] == events
            done = await box.events("done", limit=events)
            assert {e.attempts for e in done} == {1}
            assert len(await box.held_messages(limit=10 * events)) == len(gens)

    asyncio.run(check())
