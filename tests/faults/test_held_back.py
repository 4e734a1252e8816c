"""A read that never ends, for real: another process holds a read open on the store while
onwatch writes (a sqlite3 shell left inside BEGIN, a backup; a psql session left inside a
transaction, a report that never ends).

The rule it tests (docs/rules.md, "A read that never ends"): while such a read lasts the
store cannot clean up after its writes: an inbox file's write-ahead log cannot be copied
back and grows with every commit; a PostgreSQL database's vacuum removes nothing any write
left behind. Nothing is lost, but the files grow and reads slow, and nothing said so: an
inbox's `-wal` reached 82 MB after 20,000 events while `onwatch status` and the worker's
log were silent, and kept that size for good once the read had ended. Now `Inbox.held_back`
says why (the status shows it, a worker logs it once and when it ends), and a log that grew
is cut back to WAL_KEPT when the next write starts it over.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import pytest

from onwatch.core import Inbox
from onwatch.core.runtime import worker as worker_module
from onwatch.core.runtime.worker import Worker
from onwatch.core.sqlite import db as sqlite_db
from onwatch.core.sqlite import tx as sqlite_tx
from tests.waiting import until

LARGE = 256 << 10  # WAL_LARGE for these tests: a few hundred events, not 64 MiB of them
KEPT = 64 << 10
PAD = {"pad": "x" * 2000}

# Another process's read, held open until its stdin closes: what a sqlite3 shell inside
# BEGIN does once it has read something.
READER = """
import sqlite3, sys
db = sqlite3.connect(sys.argv[1], isolation_level=None)
db.execute("BEGIN")
db.execute("SELECT count(*) FROM events").fetchone()
print("reading", flush=True)
sys.stdin.read()
"""


@contextlib.contextmanager
def read_held_open(path: Path) -> Iterator[None]:
    reader = subprocess.Popen(
        [sys.executable, "-c", READER, str(path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert reader.stdin is not None and reader.stdout is not None
    try:
        assert reader.stdout.readline().strip() == "reading"
        yield
    finally:
        reader.stdin.close()
        reader.wait(timeout=10)


def wal_size(path: Path) -> int:
    try:
        return os.stat(f"{path}-wal").st_size
    except FileNotFoundError:
        return 0


async def grow(box: Inbox, path: Path, prefix: str) -> None:
    """Ingest until the inbox's write-ahead log is past LARGE."""
    for n in range(200):
        if wal_size(path) > LARGE:
            return
        await box.ingest_batch([("s", f"{prefix}{n}-{k}", PAD) for k in range(50)])
    raise AssertionError(f"the log stayed at {wal_size(path)} bytes")


async def scraped(box: Inbox) -> float:
    """onwatch_cleanup_held_back in a scrape of `box`."""
    from prometheus_client.parser import text_string_to_metric_families

    from onwatch.core.metrics import InboxMetrics

    text, _ = await InboxMetrics(box, process=False).render()
    [value] = [
        sample.value
        for family in text_string_to_metric_families(text.decode())
        for sample in family.samples
        if sample.name == "onwatch_cleanup_held_back"
    ]
    return value


@pytest.fixture
def small_logs(monkeypatch) -> None:
    monkeypatch.setattr(sqlite_tx, "WAL_LARGE", LARGE)
    monkeypatch.setattr(sqlite_db, "WAL_KEPT", KEPT)  # read when a connection is set up


async def test_a_read_held_open_elsewhere_is_said_and_the_log_is_cut_back_after(
    tmp_path, small_logs
):
    path = tmp_path / "inbox.db"
    box = await Inbox.open(path)
    try:
        await box.ingest("s", "first", {})
        with read_held_open(path):
            await grow(box, path, "a")
            why = await box.held_back()
            assert why is not None, "a log held back past WAL_LARGE went unsaid"
            assert f"{path}-wal is 0." in why and " MiB and cannot be copied back" in why
            assert "another process holds a read open" in why
            assert await scraped(box) == 1
        assert await scraped(box) == 0
        # The read ended: the next checkpoint copies the whole log back, nothing is held.
        assert await box.held_back() is None
        assert wal_size(path) > LARGE  # but the file keeps its size ...
        await box.ingest("s", "after", {})
        assert wal_size(path) <= KEPT  # ... until the next write starts the log over
        assert (await box.counts())["pending"] > 50  # and nothing was lost meanwhile
    finally:
        await box.close()


async def test_a_large_log_nobody_holds_back_is_not_said(tmp_path, small_logs):
    """A log past WAL_LARGE that a checkpoint can copy back whole (one large transaction)
    is not held back: nothing is said."""
    path = tmp_path / "inbox.db"
    box = await Inbox.open(path)
    try:
        await box.ingest_batch([("s", f"k{n}", PAD) for n in range(400)])
        assert wal_size(path) > LARGE
        assert await box.held_back() is None
    finally:
        await box.close()


async def test_a_worker_says_a_held_back_log_once_and_again_when_it_ends(
    tmp_path, small_logs, monkeypatch, caplog
):
    monkeypatch.setattr(worker_module, "HELD_BACK_LOOK_EVERY", 0.0)  # looks at every pass
    caplog.set_level(logging.INFO, logger="onwatch.worker")
    path = tmp_path / "inbox.db"
    box = await Inbox.open(path)
    ran: list[str] = []

    async def agent(batch, ctx) -> None:
        ran.extend(event.source_id for event in batch)

    worker = Worker(box, agent, holder="w", poll_interval=0.02)
    task = asyncio.create_task(worker.run())
    try:
        with read_held_open(path):
            await grow(box, path, "a")
            await until(lambda: "cleanup held back" in caplog.text, what="the warning")
            for n in range(3):  # three more passes of the worker, each looking again
                await box.ingest("s", f"more{n}", {})
                await until(lambda n=n: f"more{n}" in ran, what=f"more{n} run")
            assert caplog.text.count("cleanup held back") == 1, caplog.text
        await box.ingest("s", "last", {})
        await until(lambda: "cleanup is no longer held back" in caplog.text, what="the end")
    finally:
        worker.request_stop()
        await asyncio.wait_for(task, 10)
        await box.close()


async def test_a_transaction_left_open_on_postgresql_is_said_with_its_session(monkeypatch, caplog):
    import psycopg

    from onwatch.core.pg import tx as pg_tx
    from onwatch.core.pg.fleet import Looker
    from onwatch.core.runtime.fleet_worker import FleetWorker
    from tests.pg.server import cluster_or_skip

    monkeypatch.setattr(pg_tx, "HELD_OPEN", 0)  # no quarter of an hour to wait
    url = cluster_or_skip().new_database()
    box = await Inbox.open(url, name="a")
    looker = Looker(url)
    try:
        await box.ingest("s", "first", {})
        with psycopg.connect(url, application_name="nightly report") as other:
            other.execute("SELECT count(*) FROM events").fetchone()  # read committed:
            assert await box.held_back() is None  # its snapshot ended with the statement
            other.execute("COMMIT")
            other.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
            other.execute("SELECT count(*) FROM events").fetchone()  # holds its snapshot
            why = await box.held_back()
            assert why is not None, "a transaction holding old rows went unsaid"
            pid = other.info.backend_pid
            assert f"pid {pid}, role " in why and "application nightly report" in why
            assert "idle in transaction" in why and "cleans up no row" in why
            fleet_why = await asyncio.to_thread(looker.held_back)
            assert fleet_why is not None and f"pid {pid}," in fleet_why
            # A fleet worker says it once for its database (its visits do not).
            fleet = FleetWorker(url, agent, holder="fleet", concurrency=2)
            task = asyncio.create_task(fleet.run())
            try:
                await until(lambda: "fleet: cleanup held back" in caplog.text, what="it said")
            finally:
                fleet.request_stop()
                await asyncio.wait_for(task, 10)
            assert caplog.text.count("cleanup held back") == 1, caplog.text
            other.execute("COMMIT")
        assert await box.held_back() is None
    finally:
        looker.close()
        await box.close()


async def agent(batch, ctx) -> None:
    pass


def test_status_says_what_holds_cleanup_back(tmp_path, small_logs, capsys):
    from onwatch.cli.entry import main

    path = tmp_path / "inbox.db"
    assert main(["init", str(path)]) == 0
    with read_held_open(path):
        asyncio.run(_grown(path))
        capsys.readouterr()
        assert main(["status", str(path)]) == 0
        shown = capsys.readouterr().out
        assert f"held back   its write-ahead log {path}-wal is " in shown, shown
        assert main(["status", str(path), "--json"]) == 0
        assert (
            "another process holds a read open" in json.loads(capsys.readouterr().out)["held_back"]
        )
    assert main(["status", str(path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["held_back"] is None


async def _grown(path: Path) -> None:
    box = await Inbox.open(path)
    try:
        await grow(box, path, "a")
    finally:
        await box.close()


async def test_a_role_that_may_not_read_the_sessions_is_told_nothing_not_failed():
    """pg_stat_activity revoked from the role (some hosted servers do): `held_back` cannot
    tell, and says nothing, rather than failing `onwatch status`."""
    import psycopg

    from tests.pg.server import cluster_or_skip

    url = cluster_or_skip().new_database()
    await (await Inbox.open(url, name="a")).close()
    with psycopg.connect(url, autocommit=True) as admin:
        admin.execute(
            "DO $$ BEGIN CREATE ROLE onwatch_reader LOGIN; "
            "EXCEPTION WHEN duplicate_object THEN NULL; END $$"
        )
        admin.execute("GRANT SELECT ON ALL TABLES IN SCHEMA public TO onwatch_reader")
        admin.execute("REVOKE SELECT ON pg_catalog.pg_stat_activity FROM PUBLIC")
    reader = url.replace("postgres@", "onwatch_reader@", 1)
    box = await Inbox.open(reader, name="a", read_only=True)
    try:
        assert await box.held_back() is None
    finally:
        await box.close()
