"""Idempotency keys against restores and copies of an inbox (docs/rules.md#effects-and-their-
keys): a key is the same for every retry of one effect or one delivery, and never the key of
another, whatever happened to the file or database in between.

A restore is made the way an operator makes one: on SQLite with the backup API (a copy taken
while the inbox is open, copied back over the file once every connection is closed); on
PostgreSQL the inbox's rows and the sequences, saved and put back (what pg_dump and
pg_restore of the schema do). After it, ids are handed out again: bob's refund had event 1 and
delivery 1, carol's event gets id 1 and her reply delivery 1.
"""

from __future__ import annotations

import shutil
import sqlite3

import pytest

from onwatch.core import FakeClock, Inbox

from .conftest import T, is_postgresql

pytestmark = pytest.mark.backends  # the conformance suite: once per backend


def backup(target: str) -> object:
    """A backup of the inbox as it is now."""
    if not is_postgresql(target):
        copy = target + ".backup"
        source, dest = sqlite3.connect(target), sqlite3.connect(copy)
        try:
            source.backup(dest)  # SQLite's online backup API
        finally:
            source.close()
            dest.close()
        return copy
    import psycopg

    saved: dict[str, list[tuple]] = {}
    with psycopg.connect(target, autocommit=True) as conn:
        tables = [
            r[0]
            for r in conn.execute(
                "SELECT table_name FROM information_schema.tables "
                "WHERE table_schema = current_schema() AND table_type = 'BASE TABLE'"
            )
        ]
        for table in tables:
            saved[table] = conn.execute(f"SELECT * FROM {table}").fetchall()
        sequences = conn.execute(
            "SELECT sequencename, last_value FROM pg_sequences WHERE schemaname = current_schema()"
        ).fetchall()
    return saved, sequences


def restore(target: str, saved: object) -> None:
    """Put the backup back in place of the inbox (no connection open meanwhile)."""
    if not is_postgresql(target):
        assert isinstance(saved, str)
        source, dest = sqlite3.connect(saved), sqlite3.connect(target)
        try:
            source.backup(dest)
        finally:
            source.close()
            dest.close()
        return
    import psycopg

    rows, sequences = saved  # type: ignore[misc]
    with psycopg.connect(target, autocommit=True) as conn:
        with conn.transaction():
            conn.execute(f"TRUNCATE {', '.join(rows)}")
            for table, content in rows.items():
                if content:
                    marks = ", ".join(["%s"] * len(content[0]))
                    conn.cursor().executemany(f"INSERT INTO {table} VALUES ({marks})", content)
            for name, value in sequences:
                if value is None:
                    conn.execute("SELECT setval(%s, 1, false)", (name,))
                else:
                    conn.execute("SELECT setval(%s, %s)", (name, value))


async def refund_and_reply(box: Inbox, who: str, now: int) -> tuple[int, str, str]:
    """`who`'s refund request runs once: an effect (the payment API's idempotency key) and a
    reply sent (the channel's). Returns (event id, effect key, delivery key)."""
    assert await box.ingest("chat", f"{who}-refund", {"who": who}, now=now)
    gen = await box.acquire("W", now=now)
    [event] = await box.claim_batch("W", gen, now=now)
    key = await box.intend_effect("W", gen, event.run_id, "refund", {"who": who}, now=now)
    assert key is not None
    await box.settle_effect(key, now=now)
    assert await box.finish("W", gen, [event.id], [f"refunded {who}"], run=event.run_id, now=now)
    sent: list[str] = []
    assert await box.dispatch(sent.append, now=now) == 1
    await box.release("W", gen, now=now)
    return event.id, key, sent[0].key  # type: ignore[attr-defined]


async def test_after_a_restore_a_new_event_never_gets_an_old_events_keys(path):
    box = await Inbox.open(path, clock=FakeClock(T))
    await box.configure(outbox_gap=0)
    await box.close()
    saved = backup(path)
    async with await Inbox.open(path, clock=FakeClock(T)) as box:
        bob = await refund_and_reply(box, "bob", T)
    restore(path, saved)  # bob's run is gone from the inbox; not from the payment API
    async with await Inbox.open(path, clock=FakeClock(T + 60)) as box:
        carol = await refund_and_reply(box, "carol", T + 60)
    assert carol[0] == bob[0]  # the same event id, handed out again
    assert carol[1] != bob[1]  # carol's refund is not answered with bob's stored result
    assert carol[2] != bob[2]  # nor her reply deduplicated away as bob's


async def test_a_copy_of_an_inbox_never_gives_its_keys_to_the_copys_events(path, tmp_path):
    if is_postgresql(path):
        pytest.skip("a file copied as a template: one inbox of a database is no file")
    async with await Inbox.open(path, clock=FakeClock(T)) as box:
        await box.configure(outbox_gap=0)
    copy = str(tmp_path / "copy.db")
    shutil.copy(path, copy)  # the inbox used as a template: the same uid in both
    async with await Inbox.open(path, clock=FakeClock(T)) as box:
        original = await refund_and_reply(box, "bob", T)
    async with await Inbox.open(copy, clock=FakeClock(T)) as box:
        copied = await refund_and_reply(box, "carol", T)
    assert copied[0] == original[0]
    assert copied[1] != original[1] and copied[2] != original[2]


async def test_every_retry_of_an_effect_and_a_delivery_keeps_its_key(path):
    clock = FakeClock(T)
    async with await Inbox.open(path, clock=clock) as box:
        await box.configure(outbox_gap=0, max_attempts=5)
        await box.ingest("chat", "m1", None)
        keys = []
        for _ in range(3):  # the run fails after its intent; each retry intends it again
            gen = await box.acquire("W")
            [event] = await box.claim_batch("W", gen)
            keys.append(await box.intend_effect("W", gen, event.run_id, "refund", None))
            assert await box.finish("W", gen, [event.id], error="timeout", run=event.run_id)
            clock.advance(3600)
        gen = await box.acquire("W")
        [event] = await box.claim_batch("W", gen)
        keys.append(await box.intend_effect("W", gen, event.run_id, "refund", None))
        assert await box.finish("W", gen, [event.id], ["done"], run=event.run_id)
        # The operator requeues the done event's twin: a different event, other keys.
        await box.ingest("chat", "m2", None)
        gen = await box.acquire("W")
        [other] = await box.claim_batch("W", gen)
        other_key = await box.intend_effect("W", gen, other.run_id, "refund", None)
        assert len(set(keys)) == 1 and other_key not in keys

        attempts: list[str] = []

        def failing(text: str) -> None:
            attempts.append(text.key)  # type: ignore[attr-defined]
            raise OSError("channel down")

        assert await box.dispatch(failing) == 0
        assert await box.dispatch(failing) == 0
        sent: list[str] = []
        assert await box.dispatch(sent.append) == 1
        assert attempts == [sent[0].key] * 2  # type: ignore[attr-defined]
        [delivery] = [d for d in await box.deliveries() if d.status == "sent"]
        assert delivery.key == sent[0].key  # type: ignore[attr-defined]


async def test_keys_stored_before_the_salt_keep_their_old_form(path):
    """An effect begun before the upgrade is retried after it: it must pass the key it
    passed then (a row without a salt keeps the old key), while a new event gets a salt."""
    from onwatch.core.engine import plans

    from .conftest import raw_sql

    async with await Inbox.open(path, clock=FakeClock(T)) as box:
        await box.configure(outbox_gap=0)
        await box.ingest("chat", "old", None)
        await box.ingest("chat", "new", None)
        uid = await box._db.read(lambda tx: tx.meta("uid"))
    # As a release before schema 7 stored it, and ran it once: no salt.
    raw_sql(path, "UPDATE events SET key_salt = NULL, attempts = 1, run_id = 99 WHERE id = 1")
    async with await Inbox.open(path, clock=FakeClock(T)) as box:
        gen = await box.acquire("W")
        [old] = await box.claim_batch("W", gen)
        assert old.id == 1
        key = await box.intend_effect("W", gen, old.run_id, "refund", None)
        assert key == plans.effect_key(uid, 1, "refund", 0)  # onwatch-<uid>-ev1-refund-1
        assert await box.finish("W", gen, [old.id], ["done"], run=old.run_id)
        [new] = await box.claim_batch("W", gen)
        assert new.id == 2
        assert await box.intend_effect("W", gen, new.run_id, "refund", None) != (
            plans.effect_key(uid, 2, "refund", 0)
        )
