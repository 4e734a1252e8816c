"""What differs on PostgreSQL: the database's identity, many inboxes in one database, and
the fleet listing. (The rules themselves are the conformance suite in tests/core.)"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time

import psycopg
import pytest

from onwatch.core import BadInput, FakeClock, Inbox, InboxBusy, Lease, NotAnInbox, ReadOnlyInbox
from onwatch.core.errors import ConnectionLost
from onwatch.core.pg import schema
from onwatch.core.settings import Settings
from onwatch.core.pg.db import _find_inbox
from onwatch.core.fleet import DatabaseFleet
from onwatch.core.pg.summaries import CHANGES, SUMMARIES

T = 1_000_000


def tables(url: str) -> list[str]:
    with psycopg.connect(url) as conn:
        return [
            r[0]
            for r in conn.execute(
                "SELECT table_name FROM information_schema.tables "
                "WHERE table_schema = current_schema() ORDER BY 1"
            )
        ]


async def test_a_foreign_database_is_refused_untouched(url):
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE TABLE customers (id int PRIMARY KEY, name text)")
        conn.execute("INSERT INTO customers VALUES (1, 'ada')")
    with pytest.raises(NotAnInbox, match="not an onwatch database.*customers"):
        await Inbox.open(url)
    assert tables(url) == ["customers"]


async def test_a_newer_database_is_refused_untouched(url):
    box = await Inbox.open(url, name="a")
    await box.ingest("chat", "m1", None)
    await box.close()
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("UPDATE onwatch_schema SET version = %s", (schema.SCHEMA_VERSION + 1,))
        before = conn.execute("SELECT count(*), max(changes) FROM inboxes").fetchone()
    with pytest.raises(NotAnInbox, match="newer onwatch"):
        await Inbox.open(url, name="b")
    with psycopg.connect(url) as conn:
        assert conn.execute("SELECT count(*), max(changes) FROM inboxes").fetchone() == before


async def test_create_false_refuses_a_missing_database_schema_or_inbox(url):
    with pytest.raises(NotAnInbox, match="no onwatch database"):
        await Inbox.open(url, create=False)
    assert tables(url) == []
    await (await Inbox.open(url, name="a")).close()
    with pytest.raises(NotAnInbox, match="no inbox 'b'"):
        await Inbox.open(url, name="b", create=False)
    assert list(listing(url)) == ["a"]


async def test_of_two_opens_making_one_inbox_at_once_exactly_one_created_it(url):
    async def opened(name: str) -> bool:
        async with await Inbox.open(url, name=name) as inbox:
            return inbox.created

    for k in range(5):
        assert sorted(await asyncio.gather(opened(f"race{k}"), opened(f"race{k}"))) == [
            False,
            True,
        ]
        assert not await opened(f"race{k}")


async def test_a_missing_inbox_is_refused_with_the_names_the_database_holds(url):
    """`--inbox` missing or mistyped: the refusal names the inboxes there are (the first
    five, escaped: a name is anyone's text), and creates nothing."""
    hostile = "evil\x1b[2Jname"
    for name in ("alpha", "beta", "delta", "gamma", hostile, "zeta", "zulu"):
        await (await Inbox.open(url, name=name)).close()
    with pytest.raises(NotAnInbox) as refused:
        await Inbox.open(url, name="default", create=False)
    message = str(refused.value)
    assert "it holds 'alpha', 'beta', 'delta', 'evil\\x1b[2Jname', 'gamma' and 2 more" in message
    assert "\x1b" not in message and "--inbox NAME" in message
    assert "default" not in listing(url)


async def test_a_read_replicas_url_opens_read_only_and_says_so_at_once(url):
    """A standby's URL (or default_transaction_read_only on): every write failed only when
    it was tried, and a receiver answered 500 to each delivery. The open now reads that the
    server takes no writes: the inbox is read-only (reads work, the desk offers no
    actions), each write is refused saying why, and a receiver does not start."""
    from tests.worker.helpers import env

    async with await Inbox.open(url, name="a") as box:
        await box.ingest("s", "before", None)
    name = psycopg.conninfo.conninfo_to_dict(url)["dbname"]
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f'ALTER DATABASE "{name}" SET default_transaction_read_only = on')
    for _ in range(2):  # a new connection (not the first open's), then one kept idle
        async with await Inbox.open(url, name="a", busy_timeout=7) as box:
            assert box.read_only is not None and "the server takes no writes" in box.read_only
            assert (await box.counts())["pending"] == 1
            with pytest.raises(ReadOnlyInbox, match="a standby server, such as a read replica"):
                await box.ingest("s", "after", None)
    served = subprocess.run(
        [sys.executable, "-m", "onwatch", "serve", url, "--inbox", "a", "--port", "0"],
        env=env("/tmp", ONWATCH_GITHUB_SECRET="s3cret"),
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert served.returncode == 1 and "cannot store deliveries" in served.stderr, served.stderr


async def test_a_file_is_one_inbox_so_a_name_is_bad_input(tmp_path):
    path = str(tmp_path / "inbox.db")
    with pytest.raises(BadInput, match="a file is one inbox"):
        await Inbox.open(path, name="support")
    assert not (tmp_path / "inbox.db").exists()


async def test_many_inboxes_in_one_database_never_see_each_other(url):
    clock = FakeClock(T)
    a = await Inbox.open(url, name="alice", clock=clock)
    b = await Inbox.open(url, name="bob", clock=clock)
    try:
        for box in (a, b):
            await box.configure(lease_ttl=120)
        assert await a.ingest("github", "d-1", {"to": "alice"}) is True
        assert await b.ingest("github", "d-1", {"to": "bob"}) is True  # same key, other inbox
        assert await a.acquire("W") == 1 and await b.acquire("W") == 1  # one lease each
        [ea] = await a.claim_batch("W", 1)
        assert await b.finish("W", 1, [ea.id]) is False  # alice's event is not bob's to finish
        assert (await a.get_event(ea.id)).status == "running"
        # Ids count within an inbox: bob's event 1 is his own.
        assert ea.id == 1 and (await b.get_event(1)).payload == {"to": "bob"}
        assert (await b.get_event(1)).status == "pending"
        await a.request_approval("r1", 3600, "refund")
        assert await b.answer_approval("r1", "yes") == "unknown"
        assert await a.finish("W", 1, [ea.id], ["hi alice"])
        assert [m.body for m in await a.held_messages()] == ["hi alice"]
        assert await b.held_messages() == []
        assert (await a.counts())["done"] == 1 and (await b.counts())["pending"] == 1
        assert [(r.action, r.applied) for r in await b.audit()] == [
            ("approve", False),
            ("refused finish", False),
        ]  # newest first, bob's only
        assert [r.action for r in await a.audit()] == []
    finally:
        await a.close()
        await b.close()
    fleet = listing(url)
    assert fleet["alice"].pending == 0 and fleet["alice"].waiting == 1
    assert fleet["alice"].soonest_due == T + 3600
    assert fleet["bob"].pending == 1 and fleet["bob"].lease.holder == "W"


def test_thousands_of_inboxes_are_listed_by_two_queries_that_use_indexes(url):
    """The fleet desk's two reads of a database (core/pg/summaries.py): the change counters of
    every inbox, then the summaries of the changed ones, each figure an index probe."""
    with psycopg.connect(url, autocommit=True) as conn:
        schema.migrate(conn, "test")
        ids = [_find_inbox(conn, f"inbox-{i:05d}", True, "test")[0] for i in range(2000)]
        conn.execute(
            "INSERT INTO approvals(inbox_id, request_id, action, requested, due) "
            "SELECT id, 'r', 'x', 0, id FROM inboxes WHERE id % 3 = 0"
        )
        # Tables the size a fleet's are (an empty one is scanned: nothing to probe).
        conn.execute(
            "INSERT INTO runs(inbox_id, holder, gen, event_ids, claimed_at, outcome) "
            "SELECT id, 'w', 1, '[]', n, 'done' FROM inboxes, generate_series(1, 10) n"
        )
        conn.execute(
            "INSERT INTO outbox(inbox_id, body, created, status) "
            "SELECT id, 'x', n, 'sent' FROM inboxes, generate_series(1, 10) n"
        )
        conn.execute("ANALYZE")
        params = {"ids": ids[:50], "since": 0, "shown": 100, "chars": 500}
        plan = "\n".join(r[0] for r in conn.execute("EXPLAIN " + SUMMARIES, params))
        listed = conn.execute(CHANGES).fetchall()
    print(f"summaries plan:\n{plan}")
    assert len(listed) == 2000
    for table in ("event_counts", "approvals", "runs", "outbox"):  # probed, never scanned
        assert f"Seq Scan on {table}" not in plan, plan


def listing(url: str) -> dict:
    """What the fleet desk lists of this database, by inbox name."""
    fleet = DatabaseFleet(url)
    try:
        return fleet.scan(T, {}).summaries
    finally:
        fleet.close()


async def test_migration_2_renames_the_old_audit_words_of_a_version_1_database(url):
    with psycopg.connect(url, autocommit=True) as conn:
        schema.migrate(conn, "test", target=1)
        inbox_id, _ = _find_inbox(conn, "a", True, "test")
        for word, target in [
            ("answer yes", "approval r1"),
            ("delivery send again", "delivery 2"),
            ("mark done", "event 3"),
            ("refused sent", "delivery 2"),  # the engine's own word: kept
        ]:
            conn.execute(
                "INSERT INTO audit(inbox_id, at, actor, action, target, applied) "
                "VALUES (%s, 5, 'ops', %s, %s, true)",
                (inbox_id, word, target),
            )
    box = await Inbox.open(url, name="a", migrate=True)
    try:
        assert [r.action for r in reversed(await box.audit())] == [
            "approve",
            "send_again",
            "resolve",
            "refused sent",
        ]
    finally:
        await box.close()
    with psycopg.connect(url) as conn:
        version = conn.execute("SELECT version FROM onwatch_schema").fetchone()[0]
        assert version == schema.SCHEMA_VERSION >= 2


# --- what an open and a worker's heartbeat cost (a fleet pays them on every visit) --------


async def test_an_inbox_opened_again_on_a_kept_connection_is_two_statements(url, record_statements):
    await (await Inbox.open(url, name="a")).close()  # its connection is kept for the next
    sent = record_statements()
    box = await Inbox.open(url, name="a", create=False)
    try:
        # The schema, the inbox's id and the server's clock; then the settings.
        assert sent == ["SELECT s.application,", "SELECT settings"]
        assert box.clock.now() == pytest.approx(time.time(), abs=5)
        await box.ingest("chat", "m1", None)
        assert (await box.counts())["pending"] == 1
    finally:
        await box.close()


async def test_a_kept_connection_the_server_dropped_is_replaced_at_the_next_open(url):
    await (await Inbox.open(url, name="a")).close()
    with psycopg.connect(url, autocommit=True) as conn:
        dropped = conn.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        ).fetchone()[0]
    assert dropped >= 1
    box = await Inbox.open(url, name="a", create=False)
    try:
        await box.ingest("chat", "m1", None)
        assert (await box.counts())["pending"] == 1
    finally:
        await box.close()


async def test_a_heartbeat_and_a_goodbye_are_one_statement_each_and_count_as_changes(
    url, record_statements
):
    box = await Inbox.open(url, name="a")
    try:
        before = await box.change_token()
        sent = record_statements()
        await box.worker_seen("w1", host="h", pid=7)
        assert sent == ["WITH locked"]
        seen = await box.change_token()
        assert seen != before
        assert [(w.holder, w.host, w.pid) for w in await box.workers()] == [("w1", "h", 7)]
        del sent[:]
        await box.worker_gone("w1")
        assert sent == ["WITH locked"]
        assert await box.change_token() != seen
        assert await box.workers() == []
    finally:
        await box.close()


async def test_a_heartbeat_waits_for_the_inbox_lock_and_changes_nothing_when_refused(url):
    box = await Inbox.open(url, name="a", busy_timeout=0.2)
    try:
        with psycopg.connect(url) as holder:  # a write transaction of another process
            holder.execute("SELECT 1 FROM inboxes WHERE name = 'a' FOR UPDATE")
            with pytest.raises(InboxBusy):
                await box.worker_seen("w1", host="h", pid=7)
        assert await box.workers() == []
        await box.worker_seen("w1", host="h", pid=7)  # the lock is free again
        assert [w.holder for w in await box.workers()] == ["w1"]
    finally:
        await box.close()


def _session(box: Inbox, sql: str) -> list[tuple]:
    """Rows of `sql` run in the inbox's own session (on its connection's thread)."""

    def run(tx) -> list[tuple]:
        cursor = tx.conn.execute(sql)
        return cursor.fetchall() if cursor.description else []

    return box._db.call(run)


@pytest.mark.parametrize(
    "default, session",
    [
        ("off", "on"),  # a commit acknowledged before its WAL is written: raised
        ("local", "local"),
        ("remote_apply", "remote_apply"),  # the database's stronger choice: kept
    ],
)
async def test_a_session_commits_durably_whatever_the_databases_default(pg, default, session):
    """synchronous_commit off acknowledges a commit before its WAL is written (a server
    crash loses it, after onwatch said it was stored); onwatch's sessions raise it to on
    and keep every durable level. Also READ COMMITTED, whatever the default isolation."""
    url = pg.new_database()
    with psycopg.connect(url, autocommit=True) as conn:
        [(name,)] = conn.execute("SELECT current_database()").fetchall()
        conn.execute(f"ALTER DATABASE {name} SET synchronous_commit = '{default}'")
        conn.execute(f"ALTER DATABASE {name} SET default_transaction_isolation = 'serializable'")
    box = await Inbox.open(url, name="a", create=True)
    try:
        assert await _session(box, "SHOW synchronous_commit") == [(session,)]
        assert await _session(box, "SHOW default_transaction_isolation") == [("read committed",)]
    finally:
        await box.close()


async def test_a_transaction_begins_and_ends_with_statements_its_session_prepared(
    url, record_statements
):
    box = await Inbox.open(url, name="a")
    try:
        # A budget to count: each batch below is a write transaction (set from another
        # connection: this session's first transaction is the first batch).
        budget = Settings().replace({"max_pending": 1000}).to_json()
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("UPDATE inboxes SET settings = %s WHERE name = 'a'", (budget,))
        sent = record_statements()
        for k in range(12):
            await box.ingest_batch([("chat", f"m{k}", None)])  # a write transaction each
        await box.counts()  # a read snapshot
        # Prepared once (the session's first transaction), then only EXECUTEd: sent as
        # text, the lock and the change count were planned again at every transaction.
        assert sent.count("SELECT name") == sent.count("PREPARE onwatch_lock") == 1
        assert sent.count("BEGIN; EXECUTE") == 12
        assert sent.count("EXECUTE onwatch_count") == 12
        assert not any(s.startswith("UPDATE inboxes") for s in sent)  # the count, as text
        plans = {
            name: (generic, custom)
            for name, generic, custom in await _session(
                box,
                "SELECT name, generic_plans, custom_plans FROM pg_prepared_statements "
                "WHERE name LIKE 'onwatch%' ORDER BY name",
            )
        }
        assert set(plans) == {
            "onwatch_claim",
            "onwatch_count",
            "onwatch_lock",
            "onwatch_lock_nowait",  # a write on the event loop's thread takes it (loop_writes)
            "onwatch_now",
        }
        lock_generic, lock_custom = plans["onwatch_lock"]
        assert lock_generic + lock_custom >= 12 and lock_custom <= 5  # the plan was kept
        assert (await box.counts())["pending"] == 12
    finally:
        await box.close()


@pytest.mark.parametrize("lost", ["DEALLOCATE ALL", "DISCARD ALL", "DEALLOCATE onwatch_lock"])
async def test_a_session_that_lost_its_prepared_statements_prepares_them_again(url, lost):
    box = await Inbox.open(url, name="a")
    try:
        await box.configure(max_pending=1000)  # a budget to count: each batch a transaction
        await box.ingest_batch([("chat", "m0", None)])  # the session has them now
        await _session(box, lost)  # what a pooler between us and the server may send
        await box.ingest_batch([("chat", "m1", None)])  # a write transaction
        assert (await box.counts())["pending"] == 2  # a read snapshot
        await _session(box, lost)
        assert (await box.counts())["pending"] == 2  # a read first
        await box.ingest_batch([("chat", "m2", None)])
        names = [row[0] for row in await _session(box, "SELECT name FROM pg_prepared_statements")]
        assert {"onwatch_count", "onwatch_lock", "onwatch_now"} <= set(names)
        assert [e.source_id for e in await box.events("pending")] == ["m0", "m1", "m2"]

        # A worker's claim, its finish with the next claim and a finish alone, each sent
        # with the lock.
        await box.configure(max_batch=1)
        gen = await box.acquire("w")
        [first] = (await box.claim_next("w", gen)).events
        await _session(box, lost)
        accepted, after = await box.finish_and_claim("w", gen, [first.id], run=first.run_id)
        assert accepted and after is not None
        [second] = after.events
        await _session(box, lost)
        assert await box.finish("w", gen, [second.id], run=second.run_id)
        assert (await box.counts())["done"] == 2
    finally:
        await box.close()


async def test_a_lock_not_granted_in_time_leaves_the_session_usable(url):
    """A write transaction's first message (BEGIN and the lock) that fails on a lock held
    past busy_timeout is refused as busy, and rolled back: the session's next write and
    read work (they failed for good while that aborted transaction stayed open)."""
    box = await Inbox.open(url, name="a", busy_timeout=1)
    try:
        await box.configure(max_batch=1)
        await box.ingest_batch([("chat", f"m{k}", None) for k in range(2)])
        gen = await box.acquire("w")
        with psycopg.connect(url) as holder:
            holder.execute("SELECT 1 FROM inboxes WHERE name = 'a' FOR UPDATE")
            with pytest.raises(InboxBusy, match="stayed locked"):
                await box.configure(max_batch=2)
            with pytest.raises(InboxBusy, match="stayed locked"):
                await box.claim_next("w", gen)  # the lock with the look
        [event] = (await box.claim_next("w", gen)).events
        assert await box.finish("w", gen, [event.id], run=event.run_id)
        assert (await box.counts())["done"] == 1 and box.settings.max_batch == 1
    finally:
        await box.close()


@pytest.mark.parametrize(
    "left",
    [
        lambda conn: conn.pgconn.send_query(b"SELECT 1"),  # a reply nobody read
        lambda conn: conn.execute("BEGIN"),  # a transaction nobody ended
    ],
    ids=["command-in-progress", "transaction-open"],
)
async def test_a_session_left_not_idle_is_reopened_not_reused(url, left, caplog):
    """A job that meets an error mid-reply can leave its session with a command in
    progress: every later statement on it fails at once ("another command is already in
    progress") while psycopg never calls it broken, so the inbox refused every write (503
    from a receiver) until it was restarted. The next job now reopens the session; what was
    stored before is there, and writes and reads go on."""
    box = await Inbox.open(url, name="a")
    try:
        assert await box.ingest("chat", "before", None)
        await box._db.call(lambda tx: left(tx.conn))
        with caplog.at_level("WARNING", logger="onwatch.pg"):
            assert await box.ingest("chat", "after", None)
        assert "reconnecting" in caplog.text and "reconnected" in caplog.text
        assert (await box.counts())["pending"] == 2
    finally:
        await box.close()


async def test_a_session_that_lost_what_psycopg_prepared_is_opened_anew(url):
    """psycopg prepares a statement it sent five times, and cannot know when something
    between it and the server (a pooler's DISCARD ALL) drops it. A transaction that meets
    the loss rolled back: it runs once more in a new session, and its caller never knows. A
    call outside a transaction fails as a lost connection (try again), and the same call
    again succeeds. Every event is done once."""
    box = await Inbox.open(url, name="a")
    lost = 0

    async def counts() -> dict[str, int]:  # a read of its own statements, no transaction
        nonlocal lost
        try:
            return await box.counts()
        except ConnectionLost:
            lost += 1
            return await box.counts()

    try:
        await box.configure(max_batch=1)
        await box.ingest_batch([("chat", f"m{k}", None) for k in range(40)])
        gen = await box.acquire("w")
        [event] = (await box.claim_next("w", gen)).events
        for k in range(39):
            if k % 4 == 0:
                await _session(box, "DEALLOCATE ALL")
            await box.ingest_batch([("late", f"n{k}", None)])  # a write transaction
            accepted, claimed = await box.finish_and_claim(
                "w", gen, [event.id], run=event.run_id, fire_timers=k % 2 == 0
            )
            assert accepted and claimed is not None
            [event] = claimed.events
            assert (await counts())["done"] == k + 1
            assert [e.id for e in await box.events("running")] == [event.id]  # a snapshot
        assert (await counts())["pending"] == 39 and lost <= 10
    finally:
        await box.close()


async def test_a_release_is_one_statement_and_its_successor_takes_over_as_released(
    url, record_statements
):
    box = await Inbox.open(url, name="a")
    try:
        gen = await box.acquire("w1", now=T)
        before = await box.change_token()
        sent = record_statements()
        assert await box.release("w1", gen, now=T + 5) is True
        assert sent == ["WITH locked"]
        assert await box.change_token() != before
        assert await box.lease_info() == Lease("w1", gen, T + 4)
        assert await box.acquire("w2", now=T + 5) == gen + 1
        assert [(c.gen, c.holder, c.how) for c in await box.lease_history()] == [
            (gen + 1, "w2", "released"),
            (gen, "w1", "first"),
        ]
        assert (await box.overview(now=T + 5)).takeovers == 0
    finally:
        await box.close()


@pytest.mark.parametrize(
    ("holder", "gen_offset", "at"),
    [("w1", 1, T), ("w2", 0, T), ("w1", 0, T + 31)],
    ids=["another generation", "another holder", "expired"],
)
async def test_a_release_that_does_not_hold_changes_nothing(url, holder, gen_offset, at):
    box = await Inbox.open(url, name="a")
    try:
        await box.configure(lease_ttl=30)
        gen = await box.acquire("w1", now=T)
        before = await box.change_token()
        assert await box.release(holder, gen + gen_offset, now=at) is False
        assert await box.change_token() == before
        assert await box.lease_info() == Lease("w1", gen, T + 30)
        assert await box.acquire("w2", now=T + 1) is None  # still w1's, not handed back
    finally:
        await box.close()


async def test_a_release_waits_for_the_inbox_lock_and_decides_on_the_lease_as_it_is_then(url):
    """A takeover committed while the release waits for the row: the release sees the new
    generation (not the one its statement's snapshot began with) and hands nothing back."""
    box = await Inbox.open(url, name="a")
    try:
        gen = await box.acquire("w1", now=T)
        with psycopg.connect(url) as other:  # a write transaction of another process
            other.execute("SELECT 1 FROM inboxes WHERE name = 'a' FOR UPDATE")
            release = asyncio.create_task(box.release("w1", gen, now=T + 1))
            await asyncio.sleep(0.3)
            assert not release.done()  # waiting for the row
            other.execute(
                "UPDATE inboxes SET lease_holder = 'w2', lease_gen = lease_gen + 1,"
                " lease_until = %s WHERE name = 'a'",
                (T + 100,),
            )
            other.commit()
            assert await release is False
        assert await box.lease_info() == Lease("w2", gen + 1, T + 100)
        assert await box.acquire("w3", now=T + 2) is None
    finally:
        await box.close()
