"""Opening files: a foreign, corrupt or newer file is refused and left byte-for-byte untouched."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import sqlite3

import pytest

from onwatch.core import FakeClock, Inbox, InboxBusy, InboxError, NotAnInbox
from onwatch.core.sqlite import schema
from onwatch.core.sqlite.db import PAGE_SIZE


def digest(path: str) -> str:
    with open(path, "rb") as handle:
        return hashlib.sha256(handle.read()).hexdigest()


def sidecars(path: str) -> list[str]:
    return [p for p in (path + "-wal", path + "-shm", path + "-journal") if os.path.exists(p)]


async def test_new_file_is_created_in_wal_mode_with_the_current_schema(path):
    async with await Inbox.open(path) as box:
        assert (await box.counts())["pending"] == 0
    db = sqlite3.connect(path)
    assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert db.execute("PRAGMA user_version").fetchone()[0] == schema.SCHEMA_VERSION
    assert db.execute("PRAGMA application_id").fetchone()[0] == schema.APPLICATION_ID
    assert db.execute("PRAGMA page_size").fetchone()[0] == PAGE_SIZE
    db.close()


async def test_an_open_says_whether_it_made_the_inbox(path, tmp_path):
    async with await Inbox.open(path) as box:
        assert box.created
    async with await Inbox.open(path) as box:
        assert not box.created
    empty = str(tmp_path / "empty.db")
    open(empty, "wb").close()  # an empty file is made an inbox by the open that creates
    async with await Inbox.open(empty) as box:
        assert box.created

    async def opened(where: str) -> bool:
        async with await Inbox.open(where) as box:
            return box.created

    for k in range(5):  # two opens making one new file at once: exactly one made it
        where = str(tmp_path / f"race{k}.db")
        assert sorted(await asyncio.gather(opened(where), opened(where))) == [False, True]


async def test_a_file_made_with_sqlites_default_page_size_keeps_it_and_works(path):
    # As an earlier release made it: SQLite's default page size, not PAGE_SIZE.
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("PRAGMA page_size = 4096")
    db.execute("PRAGMA journal_mode = WAL")
    schema.migrate(db, path)
    db.close()
    async with await Inbox.open(path, create=False) as box:
        assert await box.ingest("chat", "1", {"text": "x" * 5000}) is True
        gen = await box.acquire("w")
        [event] = await box.claim_batch("w", gen)
        assert event.payload == {"text": "x" * 5000}
        assert await box.finish("w", gen, [event.id]) is True
        assert (await box.counts())["done"] == 1
    db = sqlite3.connect(path)
    assert db.execute("PRAGMA page_size").fetchone()[0] == 4096
    assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    db.close()


async def test_every_connection_commits_with_full_durability_and_a_busy_timeout(path):
    async with await Inbox.open(path, busy_timeout=2.5) as box:
        pragmas = await box._db.call(
            lambda db: (
                db.conn.execute("PRAGMA synchronous").fetchone()[0],
                db.conn.execute("PRAGMA busy_timeout").fetchone()[0],
                db.conn.execute("PRAGMA journal_mode").fetchone()[0],
            )
        )
    # 2 = FULL. SQLite's own busy timeout is 0: the connection waits for another's write
    # lock itself, looking every millisecond up to busy_timeout (core/sqlite/db.py `_patiently`).
    assert pragmas == (2, 0, "wal")
    assert box._db.busy_timeout == 2.5


async def test_missing_file_without_create_is_refused_and_not_created(path):
    with pytest.raises(NotAnInbox, match="no inbox at"):
        await Inbox.open(path, create=False)
    assert not os.path.exists(path)


async def test_missing_folder_is_a_clear_error(tmp_path):
    with pytest.raises(NotAnInbox, match="folder does not exist"):
        await Inbox.open(str(tmp_path / "nope" / "inbox.db"))


async def test_a_directory_is_refused(tmp_path):
    with pytest.raises(NotAnInbox, match="directory"):
        await Inbox.open(str(tmp_path))


@pytest.mark.parametrize(
    "content",
    [b"hello, I am a text file\n", b"\x00" * 4096, b"SQLite format 2\x00" + b"\x00" * 100],
)
async def test_a_file_that_is_not_sqlite_is_refused_untouched(path, content):
    with open(path, "wb") as handle:
        handle.write(content)
    before = digest(path)
    with pytest.raises(NotAnInbox, match="not a SQLite database"):
        await Inbox.open(path)
    assert digest(path) == before and sidecars(path) == []


async def test_someone_elses_database_is_refused_untouched(path):
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE customers(id INTEGER PRIMARY KEY, name TEXT)")
    db.execute("INSERT INTO customers(name) VALUES ('Ada')")
    db.commit()
    db.close()
    before = digest(path)
    with pytest.raises(NotAnInbox, match="not an onwatch inbox.*customers"):
        await Inbox.open(path)
    assert digest(path) == before and sidecars(path) == []
    db = sqlite3.connect(path)
    assert [r[0] for r in db.execute("SELECT name FROM sqlite_master")] == ["customers"]
    db.close()


async def test_a_newer_schema_is_refused_untouched(path):
    async with await Inbox.open(path):
        pass
    db = sqlite3.connect(path)
    db.execute(f"PRAGMA user_version = {schema.SCHEMA_VERSION + 1}")
    db.commit()
    db.close()
    before = digest(path)
    with pytest.raises(NotAnInbox, match="newer onwatch"):
        await Inbox.open(path)
    assert digest(path) == before


async def test_a_corrupt_inbox_is_a_clear_error(path):
    async with await Inbox.open(path) as box:
        for i in range(200):
            await box.ingest("chat", f"m{i}", {"text": "x" * 200})
    size = os.path.getsize(path)
    with open(path, "r+b") as handle:  # keep the header, scramble the pages after it
        handle.seek(100)
        handle.write(os.urandom(size - 100))
    with pytest.raises(NotAnInbox) as caught:
        box = await Inbox.open(path)
        await box.events("pending")
    # Refused when opened (the schema cannot be read) or at the first read that meets a bad
    # page: either way it names the file's state, not a bare SQLite error.
    message = str(caught.value)
    assert "is not a usable inbox" in message or "is damaged" in message, message


async def test_a_locked_inbox_reports_busy_and_changes_nothing(path):
    async with await Inbox.open(path, busy_timeout=0.2) as box:
        blocker = sqlite3.connect(path, isolation_level=None)
        blocker.execute("BEGIN IMMEDIATE")
        try:
            with pytest.raises(InboxBusy, match="locked by another process"):
                await box.ingest("chat", "m1", None)
        finally:
            blocker.execute("ROLLBACK")
            blocker.close()
        assert await box.ingest("chat", "m1", None) is True
        assert (await box.counts())["pending"] == 1


async def test_forward_migration_from_a_version_1_file_keeps_every_row(path):
    # Build the file exactly as version 1 of the schema left it, with data in it.
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("PRAGMA journal_mode = WAL")
    schema.migrate(db, path, target=1)
    assert db.execute("PRAGMA user_version").fetchone()[0] == 1
    db.execute(
        "INSERT INTO events(source, source_id, payload, available_at, created, updated) "
        "VALUES ('chat', 'old-1', ?, 5, 5, 5)",
        (json.dumps({"text": "from v1"}),),
    )
    db.execute(
        "INSERT INTO runs(holder, gen, event_ids, claimed_at, finished_at, outcome, "
        "error) VALUES ('old-worker', 1, '[1]', 5, 6, 'error', 'timeout')"
    )
    db.execute("UPDATE events SET attempts = 1 WHERE id = 1")
    db.close()
    async with await Inbox.open(path, clock=FakeClock(1_000), migrate=True) as box:
        [event] = await box.events("pending")
        assert event.payload == {"text": "from v1"}
        assert (await box.counts())["pending"] == 1
        # Version 2 indexed which runs claimed which event, backfilled from version 1's runs.
        assert [(r.holder, r.error) for r in await box.runs(event.id)] == [
            ("old-worker", "timeout")
        ]
        gen = await box.acquire("W")
        [claimed] = await box.claim_batch("W", gen)
        assert [r.holder for r in await box.runs(event.id)] == ["old-worker", "W"]
        key = await box.intend_effect("W", gen, claimed.run_id, "mail", {"to": "a@b"})
        assert key is not None  # the table version 2 added works
    db = sqlite3.connect(path)
    assert db.execute("PRAGMA user_version").fetchone()[0] == schema.SCHEMA_VERSION
    db.close()


async def test_four_connections_creating_the_same_inbox_at_once(path):
    import asyncio

    boxes = await asyncio.gather(*(Inbox.open(path) for _ in range(4)))
    for box in boxes:
        await box.close()
    db = sqlite3.connect(path)
    assert db.execute("PRAGMA user_version").fetchone()[0] == schema.SCHEMA_VERSION
    assert db.execute("SELECT count(*) FROM event_counts").fetchone()[0] == 6
    db.close()


async def test_one_hop_runs_each_function_whole_on_the_connections_thread_in_order(path):
    """What core/sqlite/db.py relies on in aiosqlite's private `_execute` and `_tx` queue (the
    version is pinned): a function given to `call` and a job queued by `write_soon` both run
    on the connection's one thread, never the loop's, in the order they were handed over;
    `call` returns the function's value and raises its error; `done` gets a job's result or
    its error. If an aiosqlite upgrade changed any of that, this fails, not only a lookup."""
    import asyncio
    import threading

    async with await Inbox.open(path) as box:
        db, loop = box._db, asyncio.get_running_loop()
        seen: list[tuple[str, int]] = []

        def note(tx, name):
            seen.append((name, threading.get_ident()))
            return tx.conn.execute("SELECT ?", (name,)).fetchone()[0]

        finished: list[tuple[object, object]] = []
        all_done = asyncio.Event()

        def done(result, error):
            finished.append((result, error))
            if len(finished) == 2:
                all_done.set()

        def boom(tx):
            raise KeyError("boom")

        assert await db.call(note, "call-1") == "call-1"
        db.write_soon(note, ("job-2",), done)
        db.write_soon(boom, (), done)
        assert await db.call(note, "call-4") == "call-4"  # queued after both jobs
        await asyncio.wait_for(all_done.wait(), 5)
        assert [name for name, _ in seen] == ["call-1", "job-2", "call-4"]
        threads = {ident for _, ident in seen}
        assert len(threads) == 1 and threading.get_ident() not in threads
        assert finished[0] == ("job-2", None)
        assert finished[1][0] is None and isinstance(finished[1][1], KeyError)
        with pytest.raises(KeyError):
            await db.call(boom)
        assert loop.is_running()
    with pytest.raises(InboxError, match="closed"):
        db.write_soon(note, ("late",), done)  # after close: refused, never a hang


async def test_opening_an_inbox_another_process_holds_exclusively_says_busy(path):
    async with await Inbox.open(path):
        pass
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("PRAGMA locking_mode = EXCLUSIVE")
    holder.execute("BEGIN EXCLUSIVE")
    holder.execute("UPDATE meta SET value = value WHERE key = 'paused'")
    try:
        with pytest.raises(InboxBusy, match="locked by another process"):
            await Inbox.open(path, busy_timeout=0.2)
    finally:
        holder.execute("ROLLBACK")
        holder.close()


async def test_forward_migration_from_a_version_2_file_adds_the_set_aside_columns(path):
    # A file exactly as version 2 left it: a timer, a delivery and an effect in it.
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("PRAGMA journal_mode = WAL")
    schema.migrate(db, path, target=2)
    db.execute(
        "INSERT INTO timers(id, due, every, catch_up, payload) "
        "VALUES ('tick', 10, 60, 'each', 'null')"
    )
    db.execute(
        "INSERT INTO deliveries(status, attempts, paced, created, retry_after) "
        "VALUES ('sent', 1, 1, 5, 35)"
    )
    db.execute("INSERT INTO runs(holder, gen, event_ids, claimed_at) VALUES ('w', 1, '[1]', 5)")
    db.execute(
        "INSERT INTO effects(run_id, name, key, state, intended_at) "
        "VALUES (1, 'pay', 'onwatch-x-ev1-2-3-pay-1', 'intended', 5)"
    )
    db.close()
    async with await Inbox.open(path, clock=FakeClock(1_000), migrate=True) as box:
        [timer] = await box.timers()
        assert (timer.id, timer.broken) == ("tick", None)
        assert [d.status for d in await box.deliveries()] == ["sent"]
        assert (await box.overview()).set_aside == 0
        assert await box.run_scheduler() == 1  # the old timer still fires
    db = sqlite3.connect(path)
    try:
        assert db.execute("PRAGMA user_version").fetchone()[0] == schema.SCHEMA_VERSION
        assert db.execute("SELECT key, event_id FROM effects").fetchall() == [
            ("onwatch-x-ev1-2-3-pay-1", None)
        ]  # old keys stay as they were issued
    finally:
        db.close()


async def test_migration_6_drops_the_running_index_and_the_lost_claim_is_still_recovered(path):
    # A file as version 4 left it: a worker of generation 1 died holding a claim, and one
    # reply waits in a delivery that was picked but never settled.
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("PRAGMA journal_mode = WAL")
    schema.migrate(db, path, target=4)
    db.execute("INSERT INTO lease(id, holder, gen, until) VALUES (1, 'old', 1, 100)")
    db.execute("INSERT INTO runs(holder, gen, event_ids, claimed_at) VALUES ('old', 1, '[1]', 5)")
    db.execute("INSERT INTO run_events(event_id, run_id) VALUES (1, 1)")
    db.execute(
        "INSERT INTO events(source, source_id, payload, status, attempts, claim_gen, "
        "claimed_at, run_id, available_at, created, updated) "
        "VALUES ('chat', 'lost-1', '{}', 'running', 1, 1, 5, 1, 5, 5, 5)"
    )
    db.execute("UPDATE event_counts SET n = 1 WHERE status = 'running'")
    db.execute("INSERT INTO outbox(body, created) VALUES ('held before the upgrade', 5)")
    db.close()
    async with await Inbox.open(path, clock=FakeClock(1_000), migrate=True) as box:
        gen = await box.acquire("new")
        assert gen == 2
        [event] = await box.claim_batch("new", gen)  # the lost claim, found and run again
        assert (event.source_id, event.attempts, event.claim_gen) == ("lost-1", 2, 2)
        assert await box.finish("new", gen, [event.id], ["answer"], run=event.run_id)
        sent: list[str] = []
        assert await box.dispatch(sent.append) == 2
        assert sent == ["held before the upgrade\n\nanswer"]
        assert (await box.counts())["done"] == 1
        assert [r.outcome for r in await box.runs(event.id)] == ["lost", "done"]
    db = sqlite3.connect(path)
    try:
        assert db.execute("PRAGMA user_version").fetchone()[0] == schema.SCHEMA_VERSION
        indexes = dict(db.execute("SELECT name, sql FROM sqlite_master WHERE type = 'index'"))
        assert "events_running" not in indexes
        assert "WHERE delivery_id IS NOT NULL" in indexes["outbox_by_delivery"]
        assert db.execute("SELECT count(*) FROM outbox WHERE delivery_id IS NULL").fetchone() == (
            0,
        )
    finally:
        db.close()
