"""A worker's claims and finishes commit on its own loop's thread (`Inbox.loop_writes`,
core/sqlite/db.py `Database.write_ahead`) only where that is safe: nothing queued on the
connection's thread before them, the write lock free, the last such write quick. Each test
creates the case where it would not be safe and shows the write going to the connection's
thread instead, in order, with nothing written twice or lost.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sqlite3
import threading
import time
import types

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from onwatch.core import BadInput, BudgetExceeded, FakeClock, FileLost, Inbox, InboxError
from onwatch.core.connection import LOOP_WRITE_REST, LOOP_WRITE_SLOW
from onwatch.core.engine import intake, runs
from onwatch.core.runtime import Worker
from onwatch.core.sqlite import db as sqlite_db
from tests.waiting import Ticker

from .conftest import T

MAIN = threading.get_ident()


@pytest.fixture
async def box(tmp_path):
    inbox = await Inbox.open(str(tmp_path / "inbox.db"), clock=FakeClock(T))
    yield inbox
    await inbox.close()


def where(threads: list[str]):
    """An engine function for write_ahead that notes which thread ran it."""

    def fn(tx) -> str:
        threads.append("loop" if threading.get_ident() == MAIN else "connection")
        return threads[-1]

    return fn


def spy_on(monkeypatch, name: str, threads: list[str]) -> None:
    """Note the thread every call of the engine's runs.<name> runs on."""
    real = getattr(runs, name)

    def spied(*args, **kwargs):
        threads.append("loop" if threading.get_ident() == MAIN else "connection")
        return real(*args, **kwargs)

    monkeypatch.setattr(runs, name, spied)


def record_naps(monkeypatch) -> list[str]:
    """The thread of every sleep of a write waiting for the lock, from now on."""
    naps: list[str] = []

    def nap(seconds: float) -> None:
        naps.append("loop" if threading.get_ident() == MAIN else "connection")
        time.sleep(seconds)

    monkeypatch.setattr(
        sqlite_db, "time", types.SimpleNamespace(monotonic=time.monotonic, sleep=nap)
    )
    return naps


async def drain(box: Inbox, count: int, **options) -> Worker:
    done: list[int] = []

    async def agent(batch, ctx):
        done.extend(e.id for e in batch)
        if len(done) >= count:
            worker.request_stop()

    worker = Worker(box, agent, holder="w", poll_interval=0.05, **options)
    await worker.run()
    assert sorted(done) == list(range(1, count + 1))  # each once
    return worker


async def test_a_worker_claims_and_finishes_on_its_loop_and_gives_the_setting_back(
    box, monkeypatch
):
    threads: list[str] = []
    spy_on(monkeypatch, "claim_next", threads)
    spy_on(monkeypatch, "finish_and_claim", threads)
    await box.configure(max_batch=1)
    await box.ingest_batch([("chat", f"e{k}", None) for k in range(5)])
    assert box.loop_writes is False  # an inbox's own default: off the loop
    worker = await drain(box, 5)
    assert worker.stats.done == 5
    assert threads and set(threads) == {"loop"}
    assert box.loop_writes is False  # set while the worker ran only


async def test_a_worker_told_not_to_keeps_every_commit_off_its_loop(box, monkeypatch):
    threads: list[str] = []
    spy_on(monkeypatch, "claim_next", threads)
    spy_on(monkeypatch, "finish_and_claim", threads)
    await box.configure(max_batch=1)
    await box.ingest_batch([("chat", f"e{k}", None) for k in range(5)])
    await drain(box, 5, loop_writes=False)
    assert threads and set(threads) == {"connection"}


async def test_the_setting_takes_only_true_or_false(box):
    with pytest.raises(BadInput, match="loop_writes must be True or False"):
        box.loop_writes = 1
    with pytest.raises(BadInput, match="loop_writes must be True or False"):
        Worker(box, lambda batch, ctx: None, loop_writes="yes")
    assert box.loop_writes is False


async def test_a_write_queued_before_keeps_its_place(box):
    db = box._db
    db.loop_writes = True
    order: list[str] = []
    threads: list[str] = []
    committed = asyncio.Event()

    def slow_first(tx) -> None:
        time.sleep(0.05)  # still on the connection's thread when write_ahead is called
        order.append("queued")

    def second(tx) -> None:
        where(threads)(tx)
        order.append("ahead")

    db.write_soon(slow_first, (), lambda result, error: committed.set())
    await db.write_ahead(None, second)
    assert order == ["queued", "ahead"] and threads == ["connection"]
    assert committed.is_set()
    await db.write_ahead(None, where(threads))  # nothing queued now: on the loop
    assert threads == ["connection", "loop"]


@settings(max_examples=40, deadline=None)
@given(st.lists(st.sampled_from(["soon", "ahead", "write"]), min_size=1, max_size=25))
def test_writes_commit_in_the_order_called_whichever_thread_runs_them(tmp_path_factory, kinds):
    """Whatever the mix of queued writes (group commit), awaited writes and a worker's
    writes: each commits once, in the order called."""

    async def scenario() -> list[int]:
        path = str(tmp_path_factory.mktemp("order") / "inbox.db")
        inbox = await Inbox.open(path, clock=FakeClock(T))
        try:
            db = inbox._db
            db.loop_writes = True
            db_conn = sqlite3.connect(path)
            db_conn.execute("CREATE TABLE IF NOT EXISTS probe(k INTEGER)")
            db_conn.close()

            def put(tx, k: int) -> None:
                tx.conn.execute("INSERT INTO probe(k) VALUES (?)", (k,))

            pending: list[asyncio.Future[None]] = []
            loop = asyncio.get_running_loop()
            for k, kind in enumerate(kinds):
                if kind == "soon":
                    future = loop.create_future()
                    pending.append(future)
                    db.write_soon(put, (k,), lambda r, e, f=future: f.set_result(None))
                elif kind == "ahead":
                    await db.write_ahead(None, put, k)
                else:  # a write another task awaits: queued once that task first runs
                    pending.append(asyncio.ensure_future(db.write(put, k)))
                    await asyncio.sleep(0)
            await asyncio.gather(*pending)
            rows = await db.call(lambda tx: tx.conn.execute("SELECT k FROM probe").fetchall())
            return [k for (k,) in rows]
        finally:
            await inbox.close()

    assert asyncio.run(scenario()) == list(range(len(kinds)))


async def test_a_write_lock_held_elsewhere_sends_it_to_the_thread_without_holding_the_loop(
    box, monkeypatch
):
    db = box._db
    db.loop_writes = True
    naps = record_naps(monkeypatch)
    other = sqlite3.connect(box.path, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")
    threads: list[str] = []
    ticking = Ticker()
    try:
        write = asyncio.ensure_future(db.write_ahead(None, where(threads)))
        await asyncio.sleep(0.1)
        assert not write.done() and threads == []  # waiting, having written nothing
        before = ticking.ticks
        await asyncio.sleep(0.05)
        assert ticking.ticks > before  # the loop turns meanwhile
        other.execute("COMMIT")
        assert await write == "connection"
        assert threads == ["connection"]  # run once, once the lock was free
        assert "connection" in naps and "loop" not in naps  # the loop never waited
    finally:
        ticking.stop()
        other.close()


async def test_a_slow_write_sends_the_next_ones_to_the_thread_for_a_while(box, monkeypatch, caplog):
    db = box._db
    db.loop_writes = True
    now = [1000.0]
    fake = types.SimpleNamespace(monotonic=lambda: now[0], sleep=time.sleep)
    monkeypatch.setattr(sqlite_db, "time", fake)
    threads: list[str] = []

    def slow(tx) -> None:
        now[0] += LOOP_WRITE_SLOW * 2  # a disk that took its time
        where(threads)(tx)

    with caplog.at_level(logging.WARNING, logger="onwatch.sqlite"):
        await db.write_ahead(None, slow)
    assert threads == ["loop"]
    assert "a write on the event loop took 0.200 s" in caplog.text
    await db.write_ahead(None, where(threads))
    now[0] += LOOP_WRITE_REST - 1
    await db.write_ahead(None, where(threads))
    assert threads == ["loop", "connection", "connection"]
    now[0] += 2  # the rest is over
    await db.write_ahead(None, where(threads))
    assert threads[-1] == "loop"


async def test_a_failed_write_on_the_loop_rolls_back_and_says_why(box):
    db = box._db
    db.loop_writes = True
    await box.ingest("chat", "e1", None)

    def broken(tx) -> None:
        tx.conn.execute("UPDATE events SET status = 'done'")
        tx.conn.execute("SELECT no_such_column FROM events")

    with pytest.raises(InboxError, match="no such column"):
        await db.write_ahead(None, broken)
    assert (await box.counts())["pending"] == 1  # rolled back

    def refuses(tx) -> None:
        tx.conn.execute("UPDATE events SET status = 'done'")
        raise ValueError("the engine refused")

    with pytest.raises(ValueError, match="the engine refused"):
        await db.write_ahead(None, refuses)
    assert (await box.counts())["pending"] == 1
    threads: list[str] = []
    assert await db.write_ahead(None, where(threads)) == "loop"  # not left in a transaction


async def test_a_claim_on_the_loop_after_the_log_was_deleted_stops_as_on_the_thread(box):
    box.loop_writes = True
    await box.ingest("chat", "e1", None)
    gen = await box.acquire("W")
    for side in ("-wal", "-shm"):
        os.unlink(box.path + side)
    with pytest.raises(FileLost, match="copied into the inbox file"):
        await box.claim_next("W", gen)
    with pytest.raises(FileLost):
        await box.claim_next("W", gen)
    db = sqlite3.connect(box.path)
    try:
        assert db.execute("SELECT status FROM events").fetchall() == [("pending",)]
    finally:
        db.close()


# --- ingests: a lone one on the loop, a storm on the thread (core/group_commit.py) ----------


def spy_ingests(monkeypatch) -> list[tuple[str, int]]:
    """(thread, items) for every ingest transaction or statement from now on; call before
    the inbox opens (its group commit binds the one-statement form then)."""
    calls: list[tuple[str, int]] = []
    for name in ("ingest_alone", "ingest_many"):
        real = getattr(intake, name)

        def spied(tx, items, *rest, real=real, **named):
            calls.append(("loop" if threading.get_ident() == MAIN else "connection", len(items)))
            return real(tx, items, *rest, **named)

        monkeypatch.setattr(intake, name, spied)
    return calls


async def test_a_lone_ingest_commits_on_the_loop_and_a_storm_goes_to_the_thread_as_a_group(
    tmp_path, monkeypatch
):
    calls = spy_ingests(monkeypatch)
    async with await Inbox.open(str(tmp_path / "inbox.db"), clock=FakeClock(T)) as inbox:
        assert await inbox.ingest("chat", "off", None) is True
        assert calls == [("connection", 1)]  # an inbox's default: off the loop
        inbox.loop_writes = True
        calls.clear()
        for k in range(3):
            assert await inbox.ingest("chat", f"lone{k}", None) is True
        assert calls == [("loop", 1)] * 3
        calls.clear()
        results = await asyncio.gather(*(inbox.ingest("chat", f"s{k}", None) for k in range(40)))
        assert results == [True] * 40
        assert calls and {thread for thread, _ in calls} == {"connection"}
        assert calls[0][1] == 40  # callers of one turn of the loop share one transaction
        assert await inbox.ingest("chat", "lone0", None) is False  # a duplicate, as ever
        assert (await inbox.counts())["pending"] == 44


async def test_a_lone_ingest_behind_a_queued_write_keeps_its_place(box):
    box.loop_writes = True
    db = box._db
    order: list[str] = []

    def slow_first(tx) -> None:
        time.sleep(0.05)  # still on the connection's thread when the ingest comes
        order.append("queued")

    db.write_soon(slow_first, (), lambda result, error: order.append("settled"))
    assert await box.ingest("chat", "e1", None) is True
    assert order[0] == "queued"
    rows = await db.call(lambda tx: tx.conn.execute("SELECT source_id FROM events").fetchall())
    assert rows == [("e1",)]


async def test_a_lone_ingest_waits_for_a_lock_held_elsewhere_on_the_thread_not_the_loop(
    box, monkeypatch
):
    box.loop_writes = True
    naps = record_naps(monkeypatch)
    other = sqlite3.connect(box.path, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")
    try:
        ingest = asyncio.ensure_future(box.ingest("chat", "e1", None))
        await asyncio.sleep(0.1)
        assert not ingest.done()  # waiting on the thread, the loop free to run this
        other.execute("COMMIT")
        assert await ingest is True
        assert "connection" in naps and "loop" not in naps
        assert (await box.counts())["pending"] == 1  # stored once
    finally:
        other.close()


async def test_a_lone_ingest_refused_on_the_loop_raises_and_stores_nothing(box, tmp_path):
    box.loop_writes = True
    await box.configure(max_pending=1)
    assert await box.ingest("chat", "e1", None) is True
    with pytest.raises(BudgetExceeded):
        await box.ingest("chat", "e2", None)
    other = await Inbox.open(box.path)  # lowers the limit behind this inbox's back
    await other.configure(max_pending=None, max_payload_bytes=100)
    await other.close()
    with pytest.raises(BadInput, match="over 100 bytes"):  # found in the transaction
        await box.ingest("chat", "big", "x" * 500)
    assert [e.source_id for e in await box.events("pending")] == ["e1"]
    assert await box.ingest("chat", "e3", None) is True  # no transaction left open


async def test_a_slow_lone_ingest_sends_the_next_writes_to_the_thread(
    tmp_path, monkeypatch, caplog
):
    calls = spy_ingests(monkeypatch)
    now = [1000.0]
    monkeypatch.setattr(
        sqlite_db, "time", types.SimpleNamespace(monotonic=lambda: now[0], sleep=time.sleep)
    )
    real = intake.ingest_alone
    slow = [True]

    def slow_once(*args, **kwargs):
        if slow.pop() if slow else False:
            now[0] += LOOP_WRITE_SLOW * 2  # a disk that took its time
        return real(*args, **kwargs)

    monkeypatch.setattr(intake, "ingest_alone", slow_once)  # bound when the inbox opens
    async with await Inbox.open(str(tmp_path / "inbox.db"), clock=FakeClock(T)) as inbox:
        inbox.loop_writes = True
        with caplog.at_level(logging.WARNING, logger="onwatch.sqlite"):
            assert await inbox.ingest("chat", "slow", None) is True
        assert "a write on the event loop took 0.200 s" in caplog.text
        assert await inbox.ingest("chat", "next", None) is True
        assert [thread for thread, _ in calls] == ["loop", "connection"]


async def test_close_waits_for_a_lone_ingest_not_yet_written(tmp_path):
    path = str(tmp_path / "inbox.db")
    inbox = await Inbox.open(path, clock=FakeClock(T))
    inbox.loop_writes = True
    ingest = asyncio.ensure_future(inbox.ingest("chat", "e1", None))
    await asyncio.sleep(0)  # queued, to be written at the end of this turn of the loop
    await inbox.close()
    assert await ingest is True
    db = sqlite3.connect(path)
    try:
        assert db.execute("SELECT source_id FROM events").fetchall() == [("e1",)]
    finally:
        db.close()


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(["lone", "burst", "soon", "ahead"]), st.integers(2, 6)),
        min_size=1,
        max_size=20,
    )
)
def test_ingests_mixed_with_other_writes_each_commit_once(tmp_path_factory, steps):
    """Lone ingests (on the loop), bursts (one group on the thread), queued and worker's
    writes in any mix: every ingest answered True and stored once, nothing else lost."""

    async def scenario() -> tuple[list[str], int, int]:
        path = str(tmp_path_factory.mktemp("mix") / "inbox.db")
        inbox = await Inbox.open(path, clock=FakeClock(T))
        try:
            inbox.loop_writes = True
            db = inbox._db
            keys: list[str] = []
            pending: list[asyncio.Future[object]] = []

            def touch(tx) -> None:
                tx.conn.execute("UPDATE event_counts SET n = n WHERE 0")

            loop = asyncio.get_running_loop()
            for k, (kind, size) in enumerate(steps):
                if kind == "lone":
                    keys.append(f"k{k}")
                    pending.append(asyncio.ensure_future(inbox.ingest("chat", keys[-1], None)))
                elif kind == "burst":
                    batch = [f"k{k}.{j}" for j in range(size)]
                    keys.extend(batch)
                    pending.extend(
                        asyncio.ensure_future(inbox.ingest("chat", key, None)) for key in batch
                    )
                elif kind == "soon":
                    future = loop.create_future()
                    pending.append(future)
                    db.write_soon(touch, (), lambda r, e, f=future: f.set_result(e))
                else:
                    await db.write_ahead(None, touch)
                if k % 2:
                    await asyncio.sleep(0)
            answers = await asyncio.gather(*pending)
            stored = [e.source_id for e in await inbox.events("pending")]
            trues = sum(answer is True for answer in answers)
            settled = sum(answer is None for answer in answers)  # write_soon's error: None
            return sorted(stored), trues, settled + sum(kind == "ahead" for kind, _ in steps)
        finally:
            await inbox.close()

    keys = [f"k{k}" for k, (kind, _) in enumerate(steps) if kind == "lone"] + [
        f"k{k}.{j}" for k, (kind, size) in enumerate(steps) if kind == "burst" for j in range(size)
    ]
    writes = sum(kind in ("soon", "ahead") for kind, _ in steps)
    stored, trues, settled = asyncio.run(scenario())
    assert stored == sorted(keys)
    assert trues == len(keys)
    assert settled == writes  # every queued write committed (error None)


async def test_a_lone_ingest_on_the_loop_after_the_log_was_deleted_stops_as_on_the_thread(box):
    box.loop_writes = True
    assert await box.ingest("chat", "e1", None) is True
    for side in ("-wal", "-shm"):
        os.unlink(box.path + side)
    with pytest.raises(FileLost, match="copied into the inbox file"):
        await box.ingest("chat", "e2", None)
    with pytest.raises(FileLost):
        await box.ingest("chat", "e3", None)
    db = sqlite3.connect(box.path)
    try:
        assert db.execute("SELECT source_id FROM events").fetchall() == [("e1",)]
    finally:
        db.close()
