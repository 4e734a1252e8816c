"""Waking on another process's commit: the OS notifier, its fallback poll, and bursts.

The worker processes here poll for changes only every 30 s unless a test says otherwise, so a
run that follows a commit within a second can only have been woken by the notifier.
"""

from __future__ import annotations

import asyncio
import os
import select
import sqlite3
import subprocess
import sys
import time

import pytest

from onwatch.core import Inbox
from onwatch.core.runtime.worker import Worker
from onwatch.core.sqlite import wake as wake_module
from tests.waiting import until
from tests.worker.helpers import (
    ROOT,
    SHOW_NAPS,
    env,
    event_status,
    log_of,
    onwatch,
    scalar,
    start_worker,
    stop,
    wait_asleep,
    wait_for,
)

pytestmark = pytest.mark.slow

needs_inotify = pytest.mark.skipif(
    wake_module.INotify is None, reason="file notification is Linux-only"
)


def make_inbox(tmp_path, lease_ttl: int = 30) -> str:
    path = str(tmp_path / "inbox.db")
    assert onwatch("init", path, f"lease_ttl={lease_ttl}", "outbox_gap=0").returncode == 0
    return path


async def waiters(wake, count: int = 1, timeout: float = 5.0) -> None:
    """Wait until `count` waits are in progress on `wake` (a task started is not yet waiting)."""
    await until(
        lambda: wake.waiting >= count, timeout=timeout, what=f"{count} waits", interval=0.001
    )


async def ingest(path: str, source_id: str) -> None:
    """Ingest from this process (another process to the worker)."""
    async with await Inbox.open(path, create=False) as box:
        await box.ingest("chat", source_id, {"text": source_id})


@needs_inotify
def test_another_process_commit_wakes_an_idle_worker_before_its_poll(tmp_path):
    path = make_inbox(tmp_path, lease_ttl=600)  # renewed every 200 s
    worker = start_worker(path, "echo", tmp_path, "--poll", "120", *SHOW_NAPS)
    try:
        wait_for(lambda: scalar(path, "SELECT count(*) FROM lease"), what="the lease")
        wait_for(
            lambda: "woken by file notification" in log_of(tmp_path), what="the worker's start"
        )
        for n in range(3):  # more than once: the notifier re-arms after each wake
            wait_asleep(tmp_path)  # idle: only a wake-up can bring it to the next run
            asyncio.run(ingest(path, f"wake-{n}"))
            # Its nap lasts 120 s unless woken: a run within 30 s is the wake's.
            wait_for(
                lambda: event_status(path, f"wake-{n}") == "done",  # noqa: B023 - called now
                timeout=30,
                what="the run",
            )
    finally:
        assert stop(worker) == 0, log_of(tmp_path)


def test_without_the_notifier_the_fallback_poll_still_wakes_the_worker(tmp_path):
    path = make_inbox(tmp_path)
    worker = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "onwatch",
            "worker",
            path,
            "--agent",
            "tests.worker.agents:echo",
            "--poll",
            "0.3",
            *SHOW_NAPS,
        ],
        cwd=ROOT,
        env=env(tmp_path, ONWATCH_NO_NOTIFY="1"),
        stdout=open(tmp_path / "worker.out", "wb"),
        stderr=open(tmp_path / "worker.err", "wb"),
    )
    try:
        wait_for(
            lambda: "polling for changes every 0.3 s" in log_of(tmp_path),
            what="the worker's start without notification",
        )
        wait_for(lambda: scalar(path, "SELECT count(*) FROM lease"), what="the lease")
        wait_asleep(tmp_path)  # idle: only its poll can find the event
        asyncio.run(ingest(path, "polled"))
        wait_for(lambda: event_status(path, "polled") == "done", timeout=10, what="the run")
    finally:
        assert stop(worker) == 0, log_of(tmp_path)


async def test_a_notifier_that_fails_falls_back_to_the_poll(tmp_path, monkeypatch):
    if wake_module.INotify is None:
        pytest.skip("file notification is Linux-only")
    path = str(tmp_path / "inbox.db")
    async with await Inbox.open(path) as box:
        wake = box.wake
        seen = wake.seq
        assert not await wake.wait(seen, 0.01)  # starts the notifier; nothing changed
        assert wake.watching

        def broken(*args, **kwargs):
            raise OSError(5, "Input/output error")

        monkeypatch.setattr(wake._notifier, "read", broken)
        waiting = asyncio.ensure_future(wake.wait(seen, 30))
        await waiters(wake)
        async with await Inbox.open(path) as other:  # another connection's commit
            await other.ingest("chat", "x")
        assert await asyncio.wait_for(waiting, 5)  # the failure itself wakes the waiter
        assert not wake.watching  # and waiters poll from now on
        seen = wake.seq
        started = time.monotonic()
        assert not await wake.wait(seen, 0.2)  # a plain timeout now, no notifier behind it
        assert time.monotonic() - started >= 0.19


@needs_inotify
async def test_a_commit_that_becomes_visible_after_confirm_gave_up_still_wakes_the_worker(
    tmp_path, monkeypatch
):
    """The OS announces a commit at its first write to the WAL; on a loaded disk the fsync
    can keep it invisible for longer than confirm's reads (about 0.1 s). The idle worker
    then reads the token again after short naps instead of sleeping until its slow poll."""
    lag = 0.6  # seconds a changed token stays invisible, once armed
    async with await Inbox.open(str(tmp_path / "inbox.db")) as box:
        real = box.change_token
        armed, shown, first_seen = False, None, {}

        async def lagging():
            nonlocal shown
            token = await real()
            if not armed or shown is None:
                shown = token
            elif (
                token != shown
                and time.monotonic() - first_seen.setdefault(token, time.monotonic()) >= lag
            ):
                shown = token
            return shown

        monkeypatch.setattr(box, "change_token", lagging)

        async def half_way():
            return None  # the lag is a commit still under way: no read can settle it yet

        monkeypatch.setattr(box, "settled_change_token", half_way)
        ran = []

        async def agent(batch, ctx):
            ran.extend(event.source_id for event in batch)

        worker = Worker(box, agent, poll_interval=30)  # the poll alone would take 30 s
        running = asyncio.create_task(worker.run())
        try:
            await until(lambda: worker.stats.idle >= 1 and box.wake.waiting, what="an idle worker")
            await lagging()
            armed = True
            async with await Inbox.open(str(tmp_path / "inbox.db"), create=False) as other:
                await other.ingest("chat", "late", {"text": "late"})
            await until(lambda: ran == ["late"], timeout=lag + 2.0, what="the run, soon after")
        finally:
            worker.request_stop()
            await running


async def test_a_settled_read_says_when_a_commit_is_half_way(tmp_path):
    """settled_change_token reads the token only while no other connection holds the write
    lock (which a writer holds from its first write to the WAL until its commit is visible),
    and writes nothing itself. It never waits for the lock: that is the connection's busy
    timeout of 0 (Database._patiently does the waiting, and only for writes)."""
    path = str(tmp_path / "inbox.db")
    async with await Inbox.open(path) as box:
        token = await box.settled_change_token()
        assert token == await box.change_token()
        other = sqlite3.connect(path, isolation_level=None)
        try:
            other.execute("BEGIN IMMEDIATE")
            other.execute("UPDATE meta SET value = value + 1 WHERE key = 'takeovers'")
            assert await box.settled_change_token() is None  # half-way: it cannot say
            other.execute("COMMIT")
        finally:
            other.close()
        settled = await box.settled_change_token()
        assert settled is not None and settled != token  # the commit, visible now
        assert settled == await box.change_token()  # the probe itself committed nothing
        await box.ingest("chat", "after")  # the connection is left outside any transaction


async def test_confirm_takes_a_settled_read_as_the_answer(tmp_path):
    """With a settled read, a wake-up that finds nothing is known spurious at once (False);
    while a commit is half-way, confirm reads on as without it, and an unchanged token
    after those reads is not called certain (None)."""
    wake = wake_module.Wake(str(tmp_path / "inbox.db"))
    reads = []

    async def read():
        reads.append("read")
        return 1

    async def settled_same():
        reads.append("settled")
        return 1

    async def settled_moved():
        reads.append("settled")
        return 2

    async def half_way():
        reads.append("settled")
        return None

    assert await wake.confirm(read, 1, settled_same) is False
    assert reads == ["read", "settled"]
    reads.clear()
    assert await wake.confirm(read, 1, settled_moved) is True  # landed between the two
    reads.clear()
    assert await wake.confirm(read, 1, half_way) is None
    assert reads[:2] == ["read", "settled"] and set(reads[2:]) == {"read"}
    assert len(reads) == 1 + len(wake_module.CONFIRM_DELAYS)  # the settled read tried once
    reads.clear()
    assert await wake.confirm(read, 1) is None  # no settled read: never certain
    assert reads == ["read"] * len(wake_module.CONFIRM_DELAYS)


@needs_inotify
async def test_the_idle_workers_own_writes_cost_it_a_read_or_two(tmp_path):
    """Each renewal and heartbeat the idle worker commits reaches its own file notifier a
    moment later. That wake-up is known spurious after two reads (one settled), not after a
    dozen over four seconds: where a wake-up of the process costs a millisecond, those made
    an idle worker use 1.5 % of a CPU (14 token reads per idle pass before, 3 now)."""
    async with await Inbox.open(str(tmp_path / "inbox.db")) as box:
        await box.configure(lease_ttl=3)  # a renewal every second
        reads = 0

        def counting(real):
            async def counted():
                nonlocal reads
                reads += 1
                return await real()

            return counted

        box.change_token = counting(box.change_token)
        box.settled_change_token = counting(box.settled_change_token)

        async def agent(batch, ctx):
            pass

        worker = Worker(box, agent, poll_interval=30)  # no poll inside the window
        running = asyncio.create_task(worker.run())
        try:
            await until(lambda: worker.stats.idle >= 2, what="an idle worker")
            first_reads, first_idle = reads, worker.stats.idle
            await until(
                lambda: worker.stats.idle >= first_idle + 4, timeout=30, what="four renewals"
            )
            per_pass = (reads - first_reads) / (worker.stats.idle - first_idle)
        finally:
            worker.request_stop()
            await running
    print(f"\n{per_pass:.1f} token reads per idle pass")
    assert per_pass <= 4


async def test_a_holding_workers_heartbeat_rides_on_its_renewal(tmp_path):
    """A worker holding the lease records its heartbeat in its renewal's transaction: one
    commit every third of the lease, where a renewal and a heartbeat made two (and woke the
    worker, and every desk watching, twice). The heartbeat still moves with each renewal,
    idle and during a run longer than the lease (it used to stop until the run ended)."""
    async with await Inbox.open(str(tmp_path / "inbox.db")) as box:
        await box.configure(lease_ttl=3)  # a renewal every second
        calls = {"renew": 0, "worker_seen": 0}

        def counting(name, real):
            async def counted(*args, **kwargs):
                calls[name] += 1
                return await real(*args, **kwargs)

            return counted

        box.renew = counting("renew", box.renew)
        box.worker_seen = counting("worker_seen", box.worker_seen)
        seen_in_run = []

        async def three_renewals(what):
            start = calls["renew"]
            await until(lambda: calls["renew"] >= start + 3, timeout=30, what=what)

        async def agent(batch, ctx):  # a run across three renewals
            [before] = await box.workers()
            await three_renewals("three renewals in a run")
            [after] = await box.workers()
            seen_in_run.extend([before.seen, after.seen])

        worker = Worker(box, agent, poll_interval=30)
        running = asyncio.create_task(worker.run())
        try:
            await until(lambda: worker.gen is not None, what="the lease taken")
            [before] = await box.workers()
            own_beats = calls["worker_seen"]
            await three_renewals("three idle renewals")
            [after] = await box.workers()
            await box.ingest("chat", "long")
            await until(lambda: worker.stats.done == 1, timeout=30, what="the long run")
        finally:
            worker.request_stop()
            await running
    assert calls["worker_seen"] == own_beats  # no heartbeat of its own while it holds
    assert after.seen > before.seen and after.pid == os.getpid()
    assert seen_in_run[1] > seen_in_run[0]


async def test_in_process_commit_wakes_a_waiter_directly(tmp_path, monkeypatch):
    monkeypatch.setenv("ONWATCH_NO_NOTIFY", "1")  # only the in-process path is left
    async with await Inbox.open(str(tmp_path / "inbox.db")) as box:
        seen = box.wake.seq
        waiting = asyncio.ensure_future(box.wake.wait(seen, 30))
        await waiters(box.wake)
        await box.ingest("chat", "1")
        assert await asyncio.wait_for(waiting, 10)  # woken, not timed out (30 s)
        assert not box.wake.watching


BURST = 10_000

BURSTER = """
import asyncio, sys
from onwatch.core import Inbox

async def main(path, n, prefix):
    async with await Inbox.open(path, create=False) as box:
        for i in range(n):
            await box.ingest("burst", prefix + str(i))   # one commit each

asyncio.run(main(sys.argv[1], int(sys.argv[2]), sys.argv[3] if len(sys.argv) > 3 else ""))
"""


def _cpu() -> float:
    times = os.times()
    return times.user + times.system


def _queued(wake) -> bool:
    """True if the OS has notifications queued that this process has not read yet (the
    notifier's own descriptor: Wake has no public way to ask)."""
    return bool(select.select([wake._notifier.fileno()], [], [], 0)[0])


@needs_inotify
async def test_a_burst_of_ten_thousand_commits_does_not_make_the_watcher_spin(tmp_path):
    """A waiter that wakes, confirms and works (like a worker) while another process commits
    10,000 times: at most one wake per wait, the notifier drained at each wake, and no
    wake-ups at all once the burst is over."""
    path = str(tmp_path / "inbox.db")
    async with await Inbox.open(path) as box:
        wake = box.wake
        woken = 0
        stop = asyncio.Event()

        async def waiter() -> None:
            nonlocal woken
            token = await box.change_token()
            while not stop.is_set():
                seen = wake.seq
                if await wake.wait(seen, 30):
                    woken += 1
                    if await wake.confirm(box.change_token, token):
                        token = await box.change_token()
                        await box.counts()  # the work a wake-up leads to

        async def settle() -> None:
            """Until the waiter waits with nothing queued for it: every notification of the
            burst has been read and answered."""
            await until(
                lambda: wake.waiting == 1 and not _queued(wake),
                timeout=30,
                what="the waiter to settle",
                interval=0.01,
            )

        task = asyncio.create_task(waiter())
        await waiters(wake)
        cpu_before, started = _cpu(), time.monotonic()
        burster = await asyncio.create_subprocess_exec(
            sys.executable, "-c", BURSTER, path, str(BURST), cwd=ROOT, env=env(tmp_path)
        )
        assert await burster.wait() == 0
        burst_seconds = time.monotonic() - started
        cpu_burst = _cpu() - cpu_before
        assert (await box.counts())["pending"] == BURST

        # Quiet again: once the waiter has read every notification of the burst, a second
        # with nothing to read must cost no wake-up and next to no CPU.
        await settle()
        settled, reads, wakeups, cpu_quiet = woken, wake.reads, wake.wakeups, _cpu()
        await asyncio.sleep(1.0)  # the quiet second being measured (CPU time, not a wait)
        quiet_cpu = _cpu() - cpu_quiet
        assert not _queued(wake) and wake.waiting == 1  # still asleep, nothing left unread
        quiet_woken = woken - settled
        # Proof it was listening all along: one more commit by another process wakes it.
        seen_woken = woken
        one_more = await asyncio.create_subprocess_exec(
            sys.executable, "-c", BURSTER, path, "1", "after-", cwd=ROOT, env=env(tmp_path)
        )
        assert await one_more.wait() == 0
        await until(
            lambda: woken != seen_woken,
            what="the waiter to see a commit after the quiet",
            interval=0.01,
        )
        stop.set()
        wake.notify()
        await task

    print(
        f"\nburst of {BURST} commits in {burst_seconds:.1f} s: {settled} wake-ups of the "
        f"waiter, {wakeups} in all (confirm's included), {reads} notifier reads, "
        f"{cpu_burst:.2f} s CPU here; quiet 1 s: {quiet_cpu:.3f} s"
    )
    assert settled <= BURST  # at most one wake per commit (fewer when commits come together)
    assert wakeups <= 2 * BURST
    assert reads <= wakeups + 2  # every drain of the notifier fed a wake-up: no idle spinning
    assert quiet_woken == 0  # no wake-up once the burst was over
    assert quiet_cpu < 0.05  # asleep once it is over (a spin would burn the whole second)
    # (The CPU per commit during the burst is printed above, not asserted: a loaded machine
    # makes the same work cost more; tests/bench/bench_wake.py measures it.)


@needs_inotify
async def test_nobody_waiting_means_the_notifier_is_not_read(tmp_path):
    """Disarmed between waits: commits by another process while nobody waits cost this
    process nothing, and the next wait returns at once."""
    path = str(tmp_path / "inbox.db")
    async with await Inbox.open(path) as box:
        wake = box.wake
        assert not await wake.wait(wake.seq, 0.01)  # started, then disarmed
        async with await Inbox.open(path) as other:
            for i in range(200):
                await other.ingest("chat", str(i))
        assert wake.reads == 0
        assert await wake.wait(wake.seq, 5)  # the queued notification, read now
        assert wake.reads == 1
