"""Agents the worker tests run in real processes (`--agent tests.worker.agents:NAME`).

They talk to the test through files in $ONWATCH_TEST_DIR: `inside-<source_id>` marks that a
run reached the blocking effect, `release` lets blocked runs go on, `ledger` records the
effects that really happened (one JSON line each). `show_naps` is a --setup that lets the test
see when the worker sleeps (helpers.wait_asleep).
"""

from __future__ import annotations

import asyncio
import json
import os
import random


def _dir() -> str:
    return os.environ["ONWATCH_TEST_DIR"]


def _ledger(entry: dict) -> None:
    with open(os.path.join(_dir(), "ledger"), "a", encoding="utf-8") as handle:
        handle.write(json.dumps(entry, sort_keys=True) + "\n")
        handle.flush()
        os.fsync(handle.fileno())


async def blocking(batch, ctx) -> None:
    """Charge (confirmed), then send a mail that blocks until `release` exists, then reply."""
    for event in batch:
        async with ctx.effect("charge", {"event": event.source_id}) as key:
            _ledger({"effect": "charge", "event": event.source_id, "key": key, "pid": os.getpid()})
        async with ctx.effect("send-mail", {"event": event.source_id}) as key:
            open(os.path.join(_dir(), f"inside-{event.source_id}"), "w").close()
            while not os.path.exists(os.path.join(_dir(), "release")):
                await asyncio.sleep(0.02)
            _ledger(
                {"effect": "send-mail", "event": event.source_id, "key": key, "pid": os.getpid()}
            )
        ctx.reply(f"done {event.source_id}")


async def held(batch, ctx) -> None:
    """Mark `inside-<source_id>`, wait until `release` exists, then reply: the run's outcome
    is written only after the test let it go."""
    for event in batch:
        open(os.path.join(_dir(), f"inside-{event.source_id}"), "w").close()
    while not os.path.exists(os.path.join(_dir(), "release")):
        await asyncio.sleep(0.02)
    for event in batch:
        ctx.reply(f"done {event.source_id}")


async def echo(batch, ctx) -> None:
    """One reply per event, after a short random pause (the race test's agent)."""
    await asyncio.sleep(random.uniform(0, float(os.environ.get("ONWATCH_ECHO_PAUSE", "0.15"))))
    for event in batch:
        ctx.reply(f"reply {event.source}/{event.source_id}")
    ctx.result = {"ids": [e.id for e in batch], "pid": os.getpid()}


async def sleepy(batch, ctx) -> None:
    """Never finishes on its own (for run budgets and stop handling)."""
    open(os.path.join(_dir(), f"inside-{batch[0].source_id}"), "w").close()
    await asyncio.sleep(3600)


NAP = 0.1  # seconds: a wait at least this long is an idle nap; confirm's looks are shorter


def show_naps(inbox) -> None:
    """--setup: while the worker sleeps in an idle nap (waiting for a wake-up or its poll),
    the file signals/asleep exists in $ONWATCH_TEST_DIR, so a test can tell an idle worker
    from one still busy. A subfolder: the inbox's own folder is watched for commits."""
    folder = os.path.join(_dir(), "signals")
    os.makedirs(folder, exist_ok=True)
    marker = os.path.join(folder, "asleep")
    wake = inbox.wake
    wait = wake.wait

    async def watched_wait(since: int, timeout: float) -> bool:
        if timeout < NAP:
            return await wait(since, timeout)
        open(marker, "w").close()
        try:
            return await wait(since, timeout)
        finally:
            os.unlink(marker)

    wake.wait = watched_wait
