"""Intake on PostgreSQL (core/pg/queries.sql `event_insert_alone`, `events_insert_alone`,
`events_insert`).

A lone ingest is one autocommit statement that locks the inbox's row itself. Its snapshot
is taken before that lock: these tests commit another writer while the statement waits for
it, and show that the statement then stores nothing, and the write transaction that follows
decides by the whole rule. A batch is one call of a server function (schema 7), whose
statements see that writer's commit. A batch's cost does not grow with the events the
inbox holds.
"""

from __future__ import annotations

import asyncio
import time

import psycopg
import pytest

from onwatch.core import BudgetExceeded, Inbox
from onwatch.core.pg import schema as pg_schema
from onwatch.core.pg.tx import STATEMENTS
from onwatch.core.settings import Settings
from tests.core.test_claim_cost import rows_read

T = 1_000_000


def _rows(url: str, statement: str, params: tuple = ()) -> list[tuple]:
    with psycopg.connect(url, autocommit=True) as conn:
        return conn.execute(statement, params).fetchall()


async def _until_waiting_for_a_lock(url: str) -> None:
    """Until some backend of this database waits for a row lock (the lone statement)."""
    deadline = time.monotonic() + 30
    while not _rows(
        url,
        "SELECT 1 FROM pg_stat_activity WHERE datname = current_database() "
        "AND wait_event_type = 'Lock'",
    ):
        assert time.monotonic() < deadline, "the ingest never waited for the inbox's lock"
        await asyncio.sleep(0.01)


def _insert_holding_the_lock(conn, inbox: int, event_id: int, source_id: str, payload: str):
    """In `conn`'s open transaction, as an onwatch writer does: the inbox's row lock, one
    event inserted under it, and the change counted in the inbox's row (not committed)."""
    conn.execute("SELECT 1 FROM inboxes WHERE id = %s FOR UPDATE", (inbox,))
    conn.execute(
        "INSERT INTO events(inbox_id, id, source, source_id, payload, available_at, "
        "created, updated) VALUES (%s, %s, 'hook', %s, %s, %s, %s, %s)",
        (inbox, event_id, source_id, payload, T, T, T),
    )
    conn.execute("UPDATE inboxes SET changes = changes + 1 WHERE id = %s", (inbox,))


@pytest.fixture
async def box(url):
    inbox = await Inbox.open(url)
    yield inbox
    await inbox.close()


async def test_a_lone_ingest_is_one_round_trip_and_counts_a_change(
    box, url, monkeypatch, record_statements
):
    assert await box.ingest("hook", "a", None, now=T)  # the first also reads the settings
    before = await box.change_token()
    sent = record_statements()
    assert await box.ingest("hook", "b", {"n": 2}, now=T)
    assert sent == ["WITH locked"]  # no BEGIN, no lock of its own, no COMMIT
    monkeypatch.undo()
    assert await box.change_token() != before  # an idle worker's look sees the news
    assert _rows(url, "SELECT id, source_id, payload, created FROM events ORDER BY id") == [
        (1, "a", "null", T),
        (2, "b", '{"n": 2}', T),
    ]


async def test_a_batch_is_one_round_trip_and_counts_a_change(
    box, url, monkeypatch, record_statements
):
    """Schema 7's function locks the inbox's row, stores the batch and counts the change:
    nothing else goes to the server (the first batch also reads the settings)."""
    assert await box.ingest_batch([("hook", "a", None)], now=T) == [True]
    before = await box.change_token()
    sent = record_statements()
    assert await box.ingest_batch(
        [("hook", "b", 1), ("hook", "a", 2), ("hook", "c", 3), ("hook", "b", 4)], now=T
    ) == [True, False, True, False]  # a key stored, or repeated after its first copy
    assert sent == ["SELECT onwatch_ingest_many"]
    monkeypatch.undo()
    assert await box.change_token() != before
    assert _rows(url, "SELECT id, source_id, payload, created FROM events ORDER BY id") == [
        (1, "a", "null", T),
        (2, "b", "1", T),
        (3, "c", "3", T),
    ]
    before = await box.change_token()
    assert await box.ingest_batch([("hook", "a", 5), ("hook", "c", 6)]) == [False, False]
    assert await box.change_token() == before  # nothing stored, no change counted


async def test_a_batch_on_a_database_of_schema_6_is_one_write_transaction(
    pg, monkeypatch, record_statements
):
    """Opening never migrates: a database the previous release wrote has no function, and
    its batch goes as it went there, the lock, the insert and the count with the commit."""
    url = pg.new_database(schema=False)
    with psycopg.connect(url, autocommit=True) as conn:
        pg_schema.migrate(conn, "test", target=6)
    async with await Inbox.open(url, create=True) as box:
        assert await box.ingest_batch([("hook", "a", None)], now=T) == [True]
        sent = record_statements()
        assert await box.ingest_batch([("hook", "b", 1), ("hook", "a", 2)], now=T) == [
            True,
            False,
        ]
        assert sent == ["BEGIN; EXECUTE", "INSERT INTO", "EXECUTE onwatch_count"]
    monkeypatch.undo()
    assert _rows(url, "SELECT id, source_id FROM events ORDER BY id") == [(1, "a"), (2, "b")]


@pytest.mark.parametrize("default", [None, "repeatable read", "serializable"])
async def test_a_batch_waiting_for_another_writer_numbers_after_it_and_sees_its_keys(url, default):
    """The function reads the events after the lock is granted: the other writer's event
    keeps its id, and a key it stored meanwhile is a duplicate of the batch. Also where the
    database's default isolation is stricter (the engine's sessions say their own)."""
    if default is not None:
        with psycopg.connect(url, autocommit=True) as conn:
            [(name,)] = conn.execute("SELECT current_database()").fetchall()
            conn.execute(f"ALTER DATABASE {name} SET default_transaction_isolation = '{default}'")
    box = await Inbox.open(url)
    try:
        await _batch_waits_for_a_writer(box, url)
    finally:
        await box.close()


async def _batch_waits_for_a_writer(box: Inbox, url: str) -> None:
    assert await box.ingest_batch([("hook", "a", None)], now=T) == [True]
    [(inbox,)] = _rows(url, "SELECT id FROM inboxes")
    with psycopg.connect(url) as other:
        _insert_holding_the_lock(other, inbox, 2, "theirs", '"theirs"')
        ours = asyncio.create_task(
            box.ingest_batch([("hook", "x", 1), ("hook", "theirs", 2), ("hook", "y", 3)], now=T)
        )
        await _until_waiting_for_a_lock(url)
        other.commit()
    assert await ours == [True, False, True]
    assert _rows(url, "SELECT id, source_id, payload FROM events ORDER BY id") == [
        (1, "a", "null"),
        (2, "theirs", '"theirs"'),
        (3, "x", "1"),
        (4, "y", "3"),
    ]


async def test_a_budget_another_writer_set_before_a_batch_is_kept(box, url):
    """Settings changed while the function waits for the lock: it stores nothing, and the
    write transaction refuses the whole batch by the rule."""
    assert await box.ingest_batch([("hook", "a", None)], now=T) == [True]
    [(inbox,)] = _rows(url, "SELECT id FROM inboxes")
    tight = Settings().replace({"max_pending": 2}).to_json()
    with psycopg.connect(url) as other:
        other.execute("SELECT 1 FROM inboxes WHERE id = %s FOR UPDATE", (inbox,))
        other.execute("UPDATE inboxes SET settings = %s WHERE id = %s", (tight, inbox))
        over = asyncio.create_task(box.ingest_batch([("hook", "b", 1), ("hook", "c", 2)]))
        await _until_waiting_for_a_lock(url)
        other.commit()
    with pytest.raises(BudgetExceeded):
        await over
    assert _rows(url, "SELECT source_id FROM events") == [("a",)]
    assert await box.ingest_batch([("hook", "b", 1)]) == [True]  # within the new budget


async def test_without_a_given_time_the_event_takes_the_servers_clock(box, url):
    assert await box.ingest("hook", "a")
    [(created, server)] = _rows(
        url, "SELECT created, extract(epoch FROM clock_timestamp())::bigint FROM events"
    )
    assert 0 <= server - created <= 5


async def test_a_duplicate_stores_nothing_and_counts_no_change(box, url):
    assert await box.ingest("hook", "a", "first", now=T)
    before = await box.change_token()
    assert await box.ingest("hook", "a", "second", now=T) is False
    assert await box.change_token() == before
    assert _rows(url, "SELECT source_id, payload FROM events") == [("a", '"first"')]


async def test_an_event_another_writer_numbered_meanwhile_keeps_its_id(box, url):
    """The statement's snapshot predates the writer's commit, so the id it would number
    (the last + 1) is taken: it stores nothing, and the transaction numbers the next."""
    assert await box.ingest("hook", "a", None, now=T)
    [(inbox,)] = _rows(url, "SELECT id FROM inboxes")
    with psycopg.connect(url) as other:
        _insert_holding_the_lock(other, inbox, 2, "theirs", '"theirs"')
        ours = asyncio.create_task(box.ingest("hook", "ours", "ours", now=T))
        await _until_waiting_for_a_lock(url)
        other.commit()
    assert await ours is True
    assert _rows(url, "SELECT id, source_id, payload FROM events ORDER BY id") == [
        (1, "a", "null"),
        (2, "theirs", '"theirs"'),
        (3, "ours", '"ours"'),
    ]


async def test_a_budget_another_writer_set_meanwhile_is_kept(box, url):
    """Settings changed while the statement waits: it stores nothing, the rule refuses."""
    assert await box.ingest("hook", "a", None, now=T)
    [(inbox,)] = _rows(url, "SELECT id FROM inboxes")
    tight = Settings().replace({"max_pending": 1}).to_json()
    with psycopg.connect(url) as other:
        other.execute("SELECT 1 FROM inboxes WHERE id = %s FOR UPDATE", (inbox,))
        other.execute("UPDATE inboxes SET settings = %s WHERE id = %s", (tight, inbox))
        over = asyncio.create_task(box.ingest("hook", "b", None, now=T))
        await _until_waiting_for_a_lock(url)
        other.commit()
    with pytest.raises(BudgetExceeded):
        await over
    assert _rows(url, "SELECT source_id FROM events") == [("a",)]


async def test_an_inbox_with_events_keeps_its_row(box, url):
    """Events have no foreign key to their inbox (schema 7: its check cost a query per row
    inserted); a trigger refuses what it refused: deleting the inbox's row, or changing
    its id, while it has events. A delete that waited for a writer's lock sees its events."""
    [(inbox,)] = _rows(url, "SELECT id FROM inboxes")
    assert not _rows(
        url,
        "SELECT conname FROM pg_constraint WHERE conrelid = 'events'::regclass "
        "AND confrelid = 'inboxes'::regclass",
    )
    with psycopg.connect(url) as writer, psycopg.connect(url) as person:
        _insert_holding_the_lock(writer, inbox, 1, "a", "null")
        deleting = asyncio.create_task(
            asyncio.to_thread(person.execute, "DELETE FROM inboxes WHERE id = %s", (inbox,))
        )
        await _until_waiting_for_a_lock(url)
        writer.commit()
        with pytest.raises(psycopg.errors.ForeignKeyViolation, match="still has events"):
            await deleting
        person.rollback()
        with pytest.raises(psycopg.errors.ForeignKeyViolation, match="still has events"):
            person.execute("UPDATE inboxes SET id = id + 100 WHERE id = %s", (inbox,))
        person.rollback()
        person.execute("UPDATE inboxes SET id = id WHERE id = %s", (inbox,))  # unchanged
        person.commit()
    assert _rows(url, "SELECT id, source_id FROM events") == [(1, "a")]
    assert await box.ingest_batch([("hook", "a", 1), ("hook", "b", 2)]) == [False, True]


async def _batch_rows_read(url: str, stored: int, analyzed: bool) -> int:
    """The rows a batch of 100 new keys reads (EXPLAIN ANALYZE, rolled back), in an inbox
    that holds `stored` events, with or without the table's statistics."""
    async with await Inbox.open(url) as box:
        for start in range(0, stored, 5000):
            chunk = range(start, min(stored, start + 5000))
            await box.ingest_batch([("hook", f"old{k}", None) for k in chunk], now=T)
        inbox = box._db.inbox  # type: ignore[attr-defined]
    keys = [f"new{k}" for k in range(100)]
    params = {
        "inbox": inbox,
        "sources": ["hook"] * 100,
        "source_ids": keys,
        "payloads": ["null"] * 100,
        "nows": [T] * 100,
    }
    with psycopg.connect(url) as conn:
        if analyzed:
            conn.execute("ANALYZE events")
        plan = conn.execute(
            "EXPLAIN (ANALYZE, FORMAT JSON) " + STATEMENTS["events_insert"], params
        ).fetchone()[0]
        conn.rollback()
    return rows_read(plan[0]["Plan"])


@pytest.mark.parametrize("analyzed", [False, True], ids=["no statistics", "analyzed"])
async def test_a_batch_reads_the_keys_it_names_not_the_events_stored(pg, analyzed):
    """Ten times the events stored: a join against all of them would read ten times more
    (it did, on a table without statistics: every event of the inbox, sorted)."""
    small = await _batch_rows_read(pg.new_database(schema=False), 2_000, analyzed)
    large = await _batch_rows_read(pg.new_database(schema=False), 20_000, analyzed)
    assert large < small * 1.5 + 50, (small, large)
