"""A PostgreSQL inbox's claims, finishes and lone ingests commit on the event loop's own
thread where `loop_writes` is set (a Worker sets it for its inbox; core/pg/db.py
`Database._write_here`), and only where that cannot hold the loop: the inbox's row locked
by another session is not waited for there, a server that stops answering is cut, a slow
write sends the next ones to the connection's thread, a fleet's shared connections never
write there. Each test creates the case and shows where the write ran, nothing written
twice or lost.
"""

from __future__ import annotations

import asyncio
import logging
import threading

import psycopg
import pytest

from onwatch.core import ConnectionLost, Inbox
from onwatch.core import connection as connection_mod
from onwatch.core.pg import db as pg_db
from onwatch.core.pg.shared import Connections
from tests.waiting import Ticker

T = 1_000_000


def _thread_jobs(box: Inbox) -> int:
    """Jobs handed to the inbox's connection thread so far."""
    return box._db._submitted


@pytest.fixture
def never_slow(monkeypatch):
    """No write counts as slow (a loaded machine's may): the tests that say where each write
    ran do not see one sent to the thread by the rule the slow-write test shows."""
    monkeypatch.setattr(connection_mod, "LOOP_WRITE_SLOW", 60.0)


async def _open(url: str) -> Inbox:
    box = await Inbox.open(url)
    box.loop_writes = True
    return box


async def test_claims_finishes_and_lone_ingests_commit_on_the_loops_thread(pg, never_slow):
    box = await _open(pg.new_schema())
    try:
        gen = await box.acquire("w", now=T)
        before = _thread_jobs(box)
        assert await box.ingest("chat", "1", {"n": 1}, now=T) is True
        assert await box.ingest("chat", "1", {"n": 1}, now=T) is False  # a duplicate
        assert await box.ingest("chat", "2", {"n": 2}, now=T) is True
        claimed = await box.claim_next("w", gen, now=T)
        batch = claimed.events
        assert [e.source_id for e in batch] == ["1", "2"]
        await box.finish("w", gen, [e.id for e in batch], ["ok"], now=T)
        assert _thread_jobs(box) == before  # none went through the connection's thread
        assert (await box.counts()).get("done") == 2
    finally:
        await box.close()


async def test_a_write_on_the_loop_never_waits_for_a_lock_another_session_holds(pg):
    url = pg.new_schema()
    box = await _open(url)
    other = psycopg.connect(url)
    ticking = Ticker()
    try:
        gen = await box.acquire("w", now=T)
        before = _thread_jobs(box)
        # Another session holds the inbox's row (an operator's action, a producer's batch).
        other.execute("SELECT 1 FROM inboxes WHERE id = %s FOR UPDATE", [box._db.inbox])
        ingest = asyncio.ensure_future(box.ingest("chat", "held", {}, now=T))
        claim = asyncio.ensure_future(box.claim_next("w", gen, now=T))
        await asyncio.sleep(0.2)
        assert not ingest.done() and not claim.done()  # both wait, having written nothing
        seen = ticking.ticks
        await asyncio.sleep(0.1)
        assert ticking.ticks > seen  # and the loop turns meanwhile: they wait on the thread
        other.commit()
        assert await ingest is True
        await claim
        assert _thread_jobs(box) > before
        assert sum((await box.counts()).values()) == 1  # stored once, wherever it is now
    finally:
        ticking.stop()
        other.close()
        await box.close()


async def test_a_write_on_the_loop_that_the_server_never_answers_is_cut(
    pg, proxy, monkeypatch, caplog
):
    monkeypatch.setattr(pg_db, "LOOP_WRITE_STALL", 0.5)
    direct = pg.new_schema()
    await (await Inbox.open(direct)).close()
    box = await _open(proxy.url(direct))
    try:
        assert await box.ingest("chat", "before", {}, now=T) is True
        proxy.blackhole()
        with caplog.at_level(logging.WARNING, logger="onwatch.pg"):
            with pytest.raises(ConnectionLost, match="outcome is unknown"):
                await box.ingest("chat", "into-the-void", {}, now=T)
        assert "did not answer a write on the event loop" in caplog.text
        assert "writes go through the connection's thread" in caplog.text
        proxy.relay()
        before = _thread_jobs(box)
        # The caller tries again: the connection's thread opens a new session, and the key
        # is stored once (the swallowed message never reached the server).
        assert await box.ingest("chat", "into-the-void", {}, now=T) is True
        assert _thread_jobs(box) > before
        assert (await box.counts()).get("pending") == 2
    finally:
        proxy.relay()
        await box.close()


async def test_a_finish_on_the_loop_whose_answer_was_lost_is_done_once(pg, proxy, never_slow):
    direct = pg.new_schema()
    await (await Inbox.open(direct)).close()
    box = await _open(proxy.url(direct))
    try:
        gen = await box.acquire("w", now=T)
        await box.ingest("chat", "1", {}, now=T)
        [event] = (await box.claim_next("w", gen, now=T)).events
        before = _thread_jobs(box)
        proxy.cut_after_commit()
        with pytest.raises(ConnectionLost, match="outcome is unknown"):
            await box.finish("w", gen, [event.id], ["sent"], now=T)
        assert _thread_jobs(box) == before  # it was the loop's write that lost its answer
        proxy.relay()
        await box.finish("w", gen, [event.id], ["sent"], now=T)  # the worker's retry
        assert (await box.counts()).get("done") == 1
        assert len(await box.runs(event.id)) == 1
    finally:
        proxy.relay()
        await box.close()


async def test_a_slow_write_on_the_loop_sends_the_next_ones_to_the_thread(pg, monkeypatch, caplog):
    box = await _open(pg.new_schema())
    try:
        await box.ingest("chat", "first", {}, now=T)  # a session ready, its statements known
        monkeypatch.setattr(connection_mod, "LOOP_WRITE_SLOW", -1.0)  # every write is slow
        before = _thread_jobs(box)
        with caplog.at_level(logging.WARNING, logger="onwatch.pg"):
            assert await box.ingest("chat", "slow", {}, now=T) is True
        assert _thread_jobs(box) == before  # that one ran on the loop
        assert "a write on the event loop took" in caplog.text
        assert await box.ingest("chat", "next", {}, now=T) is True
        assert _thread_jobs(box) == before + 1  # the next, on the thread
    finally:
        await box.close()


async def test_an_inbox_on_a_fleets_shared_connections_never_writes_on_the_loop(pg):
    url = pg.new_schema()
    shared = Connections(url, limit=2)
    box = await Inbox.open(url, connections=shared)
    box.loop_writes = True
    try:
        before = _thread_jobs(box)
        assert await box.ingest("chat", "1", {}, now=T) is True
        assert _thread_jobs(box) == before + 1
    finally:
        await box.close()
        await asyncio.to_thread(shared.close)


def test_the_stall_watch_starts_again_in_a_forked_process():
    """A process forked from one whose watch ran inherits its record of a thread but not
    the thread: the first write on the loop there starts one of its own."""

    class Writer:  # what the watch reads of a Database
        _here_since = None

    inherited = threading.Thread(target=lambda: None)
    inherited.start()
    inherited.join()
    watch = pg_db._StallWatch()
    watch._thread = inherited  # as fork leaves it: recorded, not running
    writer = Writer()
    watch.watch(writer)
    try:
        assert watch._thread is not inherited and watch._thread.is_alive()
    finally:
        watch.forget(writer)
