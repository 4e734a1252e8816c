"""`database is locked`: another process holds the write lock (BEGIN IMMEDIATE)."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from onwatch.core import Inbox, InboxBusy
from tests.worker.helpers import event_status, log_of, onwatch, scalar, start_worker, stop, wait_for

pytestmark = pytest.mark.slow

LOCKER = """
import select, sqlite3, sys
db = sqlite3.connect(sys.argv[1], isolation_level=None)
db.execute("BEGIN IMMEDIATE")
print("locked", flush=True)
select.select([sys.stdin], [], [], float(sys.argv[2]))  # until told, or for that long
db.execute("ROLLBACK")
"""


def hold_lock(path: str, seconds: float) -> subprocess.Popen:
    """Another process takes the write lock and holds it for `seconds`, or until its stdin
    is closed (`release`); returns once it holds it."""
    locker = subprocess.Popen(
        [sys.executable, "-c", LOCKER, path, str(seconds)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert locker.stdout.readline().strip() == "locked"
    finally:
        locker.stdout.close()  # it prints nothing more
    return locker


def release(locker: subprocess.Popen) -> None:
    assert locker.stdin is not None
    locker.stdin.close()
    assert locker.wait(10) == 0


@pytest.fixture
def path(tmp_path) -> str:
    path = str(tmp_path / "inbox.db")
    assert onwatch("init", path, "lease_ttl=2", "outbox_gap=0").returncode == 0
    return path


async def test_lock_held_past_the_busy_timeout_is_reported_and_changes_nothing(path):
    inbox = await Inbox.open(path, busy_timeout=0.3)
    try:
        await inbox.add_timer("due", 1, None)  # a scheduler pass has something to write
        locker = hold_lock(path, 60)  # until released below
        with pytest.raises(InboxBusy, match="locked by another process.*nothing was changed"):
            await inbox.ingest("chat", "m1", {"text": "hi"})
        for call in (
            lambda: inbox.acquire("A"),
            lambda: inbox.pause(),
            lambda: inbox.run_scheduler(),
        ):
            with pytest.raises(InboxBusy):
                await call()
        # Reads never wait for a writer (WAL): these answer while the lock is still held.
        await inbox.overview()
        assert await inbox.next_timer_due() == 1
        assert locker.poll() is None  # every refusal above came while the lock was held
        release(locker)
        assert await inbox.counts() == {
            "pending": 0,
            "running": 0,
            "done": 0,
            "dead": 0,
            "interrupted": 0,
            "cancelled": 0,
        }
        assert await inbox.lease_info() is None
        assert (await inbox.overview()).paused is False
        assert [t.id for t in await inbox.timers()] == ["due"]
    finally:
        await inbox.close()


async def test_lock_held_shorter_than_the_busy_timeout_is_waited_out(path):
    inbox = await Inbox.open(path, busy_timeout=30)
    try:
        locker = hold_lock(path, 0.5)  # released by itself, well inside the busy timeout
        assert await inbox.ingest("chat", "m1", {"text": "hi"}) is True
        assert locker.wait(10) == 0
        assert (await inbox.get_event(1)).source_id == "m1"
    finally:
        await inbox.close()


def test_cli_prints_one_line_and_exits_3_when_locked(path):
    locker = hold_lock(path, 3)
    try:
        result = onwatch("ingest", path, "chat", "m1", '{"text": "hi"}', "--busy-timeout", "0.2")
        assert result.returncode == 3, result
        assert result.stderr.count("\n") == 1 and result.stderr.startswith("onwatch: ")
        assert "locked" in result.stderr and "Traceback" not in result.stderr
        assert result.stdout == ""
        # Reading status still works while a writer holds the lock.
        assert onwatch("status", path, "--busy-timeout", "0.2").returncode == 0
    finally:
        locker.kill()
        locker.wait()
    assert onwatch("ingest", path, "chat", "m1", "{}").stdout.strip() == "stored"


def test_worker_survives_a_locked_database_and_carries_on(path, tmp_path):
    worker = start_worker(path, "echo", tmp_path, "--busy-timeout", "0.2", "--no-dispatch")
    try:
        wait_for(lambda: scalar(path, "SELECT count(*) FROM lease"), what="the lease")
        onwatch("ingest", path, "chat", "before", '"x"')
        wait_for(lambda: event_status(path, "before") == "done", what="the first run")
        locker = hold_lock(path, 60)  # until killed
        try:
            until = scalar(path, "SELECT until FROM lease")  # no renewal commits from now on
            # The worker meets the lock (its renewal waits out the busy timeout), and the
            # lock outlasts its lease: it cannot renew, so it loses the lease too.
            wait_for(
                lambda: "stayed locked by another process" in log_of(tmp_path),
                what="the worker to meet the lock",
            )
            wait_for(lambda: time.time() > until + 1, what="the lease to lapse under the lock")
            assert worker.poll() is None, log_of(tmp_path)
        finally:
            locker.kill()
            locker.wait()
        onwatch("ingest", path, "chat", "after", '"y"')
        wait_for(
            lambda: event_status(path, "after") == "done", timeout=10, what="a run after the lock"
        )
    finally:
        assert stop(worker) == 0, log_of(tmp_path)
    log = log_of(tmp_path)
    assert "stayed locked by another process" in log
    assert "Traceback" not in log
