"""Fixtures for in-process worker tests: a scratch inbox on a fake clock, workers as tasks."""

from __future__ import annotations

import asyncio

from tests import waiting
import pytest

from onwatch.core import FakeClock, Inbox
from onwatch.core.runtime.worker import Worker

T = 1_000_000
DAY = 86_400


class CountingClock(FakeClock):
    """A FakeClock that counts its reads. The worker's loops read the clock on every pass, so
    reads that moved since a moment prove the worker went round and had its chance to act."""

    reads = 0

    def now(self) -> int:
        self.reads += 1
        return super().now()


@pytest.fixture
def clock() -> CountingClock:
    return CountingClock(T)


@pytest.fixture
async def inbox(tmp_path, clock):
    box = await Inbox.open(str(tmp_path / "inbox.db"), clock=clock)
    await box.configure(lease_ttl=120, max_attempts=3, outbox_gap=0)
    yield box
    await box.close()


async def until(predicate, timeout: float = 5.0, what: str = "it"):
    """Await an (async or plain) predicate until truthy; fail after `timeout` real seconds."""
    return await waiting.until(predicate, timeout=timeout, what=what, interval=0.01)


class Running:
    """A worker running as a task; `stop()` asks it to stop and returns its stats."""

    def __init__(self, worker: Worker) -> None:
        self.worker = worker
        self.task = asyncio.create_task(worker.run())

    async def stop(self, force: bool = False):
        self.worker.request_stop(force)
        return await asyncio.wait_for(self.task, 10)


@pytest.fixture
async def start(inbox):
    running: list[Running] = []

    def launch(agent, *, box=None, **options) -> Running:
        options.setdefault("poll_interval", 0.02)
        options.setdefault("holder", f"w{len(running) + 1}")
        handle = Running(Worker(box or inbox, agent, **options))
        running.append(handle)
        return handle

    yield launch
    for handle in running:
        if not handle.task.done():
            await handle.stop(force=True)


async def asleep(running: Running, inbox: Inbox) -> int:
    """Wait until the worker sleeps in its idle nap (a wait on the inbox's wake-up); return
    how many times it went idle, a count that moves each time it goes back to sleep."""
    await until(lambda: inbox.wake.waiting, what="the worker asleep")
    return running.worker.stats.idle


async def status(inbox: Inbox, event_id: int) -> str:
    return (await inbox.get_event(event_id)).status
