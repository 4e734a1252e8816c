"""Instant wake: a commit that gives an inbox work notifies its listeners, in commit order,
only if it commits; a lost listening connection falls back to polling and reconnects."""

from __future__ import annotations

import asyncio
import logging
import statistics
import time

import psycopg
import pytest

from onwatch.core import BudgetExceeded, FakeClock, Inbox
from onwatch.core.pg.listen import Listener

T = 1_000_000


@pytest.fixture
async def boxes(url):
    clock = FakeClock(T)
    a = await Inbox.open(url, name="a", clock=clock)
    b = await Inbox.open(url, name="b", clock=clock)
    listener = await Listener.open(url)
    yield a, b, listener
    await listener.close()
    await a.close()
    await b.close()


async def heard(listener: Listener, name: str, seen) -> None:
    assert await listener.wait(name, seen, timeout=5), f"no notification for {name}"


async def test_ingest_answer_and_expiry_each_wake_the_inbox(boxes):
    a, b, listener = boxes
    seen = listener.seen("a")
    await a.ingest("chat", "m1", None)
    await heard(listener, "a", seen)
    await a.request_approval("r1", 60, "refund", now=T)
    await a.request_approval("r2", 60, "refund", now=T)
    seen = listener.seen("a")
    assert await a.answer_approval("r1", "yes", now=T + 1) == "yes"
    await heard(listener, "a", seen)
    seen = listener.seen("a")
    assert await a.run_scheduler(now=T + 61) == 1  # r2 expires: its answer event is work
    await heard(listener, "a", seen)
    assert listener.seen("b")[0] == 0  # b heard nothing of a's


async def test_commits_without_new_work_and_rolled_back_ones_send_nothing(boxes):
    a, b, listener = boxes
    await a.ingest("chat", "m1", None)
    await a.configure(max_pending=1)
    await heard(listener, "a", (0, 0))
    seen_a = listener.seen("a")
    gen = await a.acquire("W")
    await a.claim_batch("W", gen)
    await a.ingest("chat", "m1", None)  # a duplicate: no new work
    await a.ingest("chat", "m2", None)  # pending is 0 after the claim: stored, work
    with pytest.raises(BudgetExceeded):
        await a.ingest_batch([("chat", "m3", None), ("chat", "m4", None)])  # rolled back
    seen_b = listener.seen("b")
    await b.ingest("chat", "x", None)
    # Notifications arrive in commit order: once b's is heard, every earlier one of a's was.
    await heard(listener, "b", seen_b)
    assert listener.seen("a")[0] == seen_a[0] + 1  # m2 only


async def test_wake_latency_from_another_connection(boxes, url):
    a, b, listener = boxes
    other = await Inbox.open(url, name="a")
    latencies = []
    try:
        for i in range(50):
            seen = listener.seen("a")
            started = time.perf_counter()
            await other.ingest("chat", f"m{i}", None)
            await heard(listener, "a", seen)
            latencies.append(time.perf_counter() - started)
    finally:
        await other.close()
    latencies.sort()
    p50, p99 = statistics.median(latencies), latencies[-1]
    print(f"ingest commit -> listener woken: p50 {p50 * 1e3:.1f} ms, max {p99 * 1e3:.1f} ms")
    assert p50 < 0.1


async def test_a_lost_listening_connection_falls_back_and_reconnects(boxes, url, caplog):
    a, b, listener = boxes
    seen = listener.seen("a")
    waiting = asyncio.ensure_future(listener.wait("a", seen, timeout=10))
    await asyncio.sleep(0)
    with psycopg.connect(url, autocommit=True) as admin:
        killed = admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE "
            "query LIKE 'LISTEN %' AND pid <> pg_backend_pid() "
            "AND datname = current_database()"  # not another test's, on the shared server
        ).fetchall()
    assert killed == [(True,)]
    assert await waiting is True  # woken by the loss: look again, as after a poll
    for _ in range(200):
        if listener.reconnects == 1 and listener.connected:
            break
        await asyncio.sleep(0.05)
    assert listener.reconnects == 1 and listener.connected
    assert "lost the connection" in caplog.text and "reconnected" in caplog.text
    seen = listener.seen("a")
    await a.ingest("chat", "after", None)
    await heard(listener, "a", seen)


async def test_a_listener_opened_while_the_server_is_away_polls_and_says_so(caplog):
    """A fleet worker started during a server restart must not die of it: the listener
    starts disconnected, its waiters fall back to polling, and the log says why."""
    import socket

    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    listener = await Listener.open(f"postgresql://nobody@127.0.0.1:{port}/none", poll_interval=0.05)
    try:
        assert not listener.connected
        # A poll (every 0.05 s) says the server is away: True; a hang would time out: False.
        assert await listener.wait("a", listener.seen("a"), timeout=5)
        assert "cannot reach" in caplog.text
    finally:
        await listener.close()


async def test_an_inbox_whose_idle_session_the_server_ended_opens_another_and_says_so(url, caplog):
    """The server ends the inbox's backend while it is idle (a restart, an administrator):
    the next call opens a new session before it sends anything, so it succeeds at its first
    try; the log says so (not as a loss: nothing was lost), and nothing committed before is
    lost. (A connection cut under a call in flight fails that call: test_faults.py.)"""
    box = await Inbox.open(url, name="a")
    try:
        assert await box.ingest("chat", "before", None)
        with psycopg.connect(url, autocommit=True) as admin:
            killed = admin.execute(
                "SELECT pg_terminate_backend(pid, 10000) FROM pg_stat_activity WHERE datname = "
                "current_database() AND pid <> pg_backend_pid() AND application_name = ''"
            ).fetchall()
        assert killed
        with caplog.at_level(logging.INFO, logger="onwatch"):
            assert await box.ingest("chat", "after", None)
        keys = [e.source_id for e in await box.events("pending")]
        assert keys == ["before", "after"]
        assert "ended the session while it was idle" in caplog.text, caplog.text
        assert "lost the connection" not in caplog.text, caplog.text
    finally:
        await box.close()


async def test_run_now_and_a_resumed_timer_wake_the_inbox(boxes):
    a, b, listener = boxes
    await a.configure(backoff_base=3600, backoff_cap=3600)
    await a.ingest("chat", "m1", None, now=T)
    gen = await a.acquire("W", now=T)
    [event] = await a.claim_batch("W", gen, now=T)
    await a.finish("W", gen, [event.id], error="TimeoutError", now=T)  # an hour's backoff
    seen = listener.seen("a")
    assert await a.act("run_now", event.id, expect="pending", now=T + 1)
    await heard(listener, "a", seen)
    await a.add_timer("digest", T + 10, None, every=3600)
    assert await a.act("pause_timer", "digest", now=T + 1)
    seen = listener.seen("a")
    assert await a.act("resume_timer", "digest", now=T + 20)  # due meanwhile: work now
    await heard(listener, "a", seen)


async def test_an_idle_wait_ends_when_its_listener_reconnects_not_at_its_next_poll(pg, url):
    """While the listening connection is down an idle worker polls (every poll_interval);
    the listener's reconnection ends its wait at once, since what was sent meanwhile was
    lost: the worker looks now, not a poll later."""
    from onwatch.core.pg.listen import ListenWake

    from .proxy import Proxy

    if pg.owned is None:
        pytest.skip("needs the server the tests started (its port is proxied)")
    await (await Inbox.open(url, name="a")).close()
    proxy = Proxy(pg.owned.port)
    proxy.refuse()
    listener = await Listener.open(proxy.url(url), poll_interval=60, max_backoff=0.2)
    wake = ListenWake("a")
    try:
        assert not listener.connected
        wake.attach(listener)
        waiting = asyncio.ensure_future(wake.wait(wake.seq, 60))
        anything = asyncio.ensure_future(listener.wait_any(None))  # the fleet's wait
        await asyncio.sleep(0.5)
        assert not waiting.done() and not anything.done()  # polling, every 60 s
        proxy.relay()
        assert await asyncio.wait_for(waiting, 10)  # woken by the reconnection
        assert await asyncio.wait_for(anything, 1)
        assert listener.connected and listener.reconnects == 1
    finally:
        wake.close()
        await listener.close()
        proxy.close()


async def test_the_listening_thread_waits_on_its_socket_and_a_close_ends_it_at_once(
    boxes, url, monkeypatch
):
    """With the thread's own look-again interval an hour long, what wakes it is its socket
    (a notification, two in one packet) and close()'s bell: a close that had to wait for
    the interval would not end within the 30 s given here."""
    import onwatch.core.pg.listen as listen

    monkeypatch.setattr(listen, "IDLE_WAIT", 3600.0)
    a, b, _ = boxes
    listener = await Listener.open(url)
    try:
        await asyncio.sleep(0.2)  # the thread is now waiting on its socket
        seen_a, seen_b = listener.seen("a"), listener.seen("b")
        await a.ingest("chat", "m1", None)
        await heard(listener, "a", seen_a)
        seen_a = listener.seen("a")
        with psycopg.connect(url, autocommit=True) as conn:  # one message, one packet
            conn.execute("NOTIFY onwatch, 'a'; NOTIFY onwatch, 'b'")
        await heard(listener, "a", seen_a)
        await heard(listener, "b", seen_b)
    finally:
        await asyncio.wait_for(listener.close(), 30)
    assert not listener._thread.is_alive()


async def test_a_schema_does_not_hear_another_schemas_inbox_of_the_same_name(pg):
    """Two schemas of one database, each with an inbox `support`: a listener hears its own
    schema's, not the other's (each schema sends on a channel of its own). Notifications
    come in commit order, so once `marker` (committed last) is heard, every notification
    committed before it has been."""
    here, there = pg.new_schema(), pg.new_schema()  # two schemas of one database
    mine = await Inbox.open(here, name="support")
    marker = await Inbox.open(here, name="marker")
    other = await Inbox.open(there, name="support")
    listener = await Listener.open(here)
    try:
        seen, seen_marker = listener.seen("support"), listener.seen("marker")
        await other.ingest("chat", "m1", None)
        await mine.ingest("chat", "m1", None)
        await other.ingest("chat", "m2", None)
        await marker.ingest("chat", "m1", None)
        await heard(listener, "marker", seen_marker)
        assert listener.seen("support")[0] == seen[0] + 1  # its own only
    finally:
        await listener.close()
        for box in (mine, marker, other):
            await box.close()


async def test_a_listener_hears_a_database_of_schema_7_and_one_migrated_under_it(pg):
    """Before database schema 8 every schema sent on `onwatch`: a listener of this release
    listens there too, so it hears a database not migrated yet, and the same database once
    migrated under it (its own schema's channel from then on)."""
    from onwatch.core.pg import schema

    url = pg.new_database(schema=False)
    with psycopg.connect(url, autocommit=True) as conn:
        schema.migrate(conn, url, target=7)
    box = await Inbox.open(url, name="support")
    listener = await Listener.open(url)
    try:
        for step, key in (("schema 7", "m1"), ("migrated", "m2")):
            if step == "migrated":
                with psycopg.connect(url, autocommit=True) as conn:
                    assert schema.migrate(conn, url) == 7
            seen = listener.seen("support")
            await box.ingest("chat", key, None)
            await heard(listener, "support", seen)
    finally:
        await listener.close()
        await box.close()
