"""A claim's look read together with the statement before it (core/pg/tx.py: `finish_done` with
`look`, one pipeline): the rows are the look the claim would read itself after the finish,
and they answer only the claim_look that comes next in the same transaction."""

from __future__ import annotations

import psycopg
import pytest

from onwatch.core import Inbox, InboxError
from onwatch.core.engine import intake, runs

T = 1_000_000
LOOK = (3, 5)  # max_attempts, limit


def _sql(url: str, statement: str, params: tuple = ()) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(statement, params)


async def _running_run(url: str) -> tuple[Inbox, int, int, list[int]]:
    """An inbox with one run of generation 2 to finish, and beside it every kind of row a
    look reads: fresh events, a retried one whose backoff is over, one out of attempts, and
    a claim lost by generation 1."""
    box = await Inbox.open(url)
    await box.configure(max_attempts=3, max_batch=1)
    await box.ingest_batch([("hook", f"e{k}", None) for k in range(6)], now=T)
    gen = await box.acquire("W", now=T)
    [lost] = await box.claim_batch("W", gen, now=T)  # e0, left running by generation 1
    await box.release("W", gen)
    gen = await box.acquire("W", now=T + 1)
    _sql(url, "UPDATE events SET attempts = 1, error = 'timeout' WHERE source_id = 'e1'")
    _sql(url, "UPDATE events SET attempts = 3, error = 'timeout' WHERE source_id = 'e2'")
    _sql(url, "UPDATE events SET status = 'pending' WHERE source_id = 'e3'")
    claimed = await box.claim_batch("W", gen, now=T + 1)  # recovers e0; takes e1 (retried)
    assert claimed, "the inbox had nothing to claim"
    run = claimed[0].run_id
    assert run is not None and lost.id != claimed[0].id
    return box, gen, run, [e.id for e in claimed]


async def test_the_look_read_with_the_finish_is_the_look_after_it(url):
    box, gen, run, ids = await _running_run(url)

    def finish_then_look(tx):
        known, done = tx.finish_done(ids, gen, run, T + 2, None, None, look=LOOK)
        ahead = tx.looked[1]
        after = tx.run("claim_look", gen=gen, now=T + 2, max_attempts=3, limit=5).fetchall()
        return known, done, ahead, after

    try:
        known, done, ahead, after = await box._db.write(finish_then_look)
    finally:
        await box.close()
    assert known == (gen, None) and [row[0] for row in done] == ids
    assert ahead == after
    assert {row[-1] for row in ahead} >= {0, 3}  # fresh ones, and the out-of-attempts probe


async def test_a_statement_between_the_finish_and_the_claim_makes_it_look_again(url):
    box, gen, run, ids = await _running_run(url)

    def finish_ingest_look(tx):
        tx.finish_done(ids, gen, run, T + 2, None, None, look=LOOK)
        intake.ingest_many(tx, [("hook", "late", "null", T + 2)])
        return tx.claim_look(gen, T + 2, *LOOK)[1]

    try:
        claimable = await box._db.write(finish_ingest_look)
    finally:
        await box.close()
    assert "late" in {row[2] for row in claimable}


async def test_a_look_read_ahead_does_not_outlive_its_transaction(url):
    box, gen, run, ids = await _running_run(url)
    try:
        await box._db.write(lambda tx: tx.finish_done(ids, gen, run, T + 2, None, None, look=LOOK))
        _sql(
            url,
            "INSERT INTO events(inbox_id, id, source, source_id, payload, available_at, "
            "created, updated) SELECT inbox_id, max(id) + 1, 'hook', 'other', 'null', %s, %s, %s "
            "FROM events GROUP BY inbox_id",
            (T, T, T),
        )
        claimable = await box._db.write(lambda tx: tx.claim_look(gen, T + 2, *LOOK)[1])
    finally:
        await box.close()
    assert "other" in {row[2] for row in claimable}


# --- the look read with the probe for due timers (Tx.timer_due with `look`) ------------------


async def test_the_look_read_with_the_timer_probe_is_the_look_itself(url):
    box, gen, run, ids = await _running_run(url)

    def probe_then_look(tx):
        due = tx.timer_due(T + 2, (gen, *LOOK))
        ahead = tx.looked[1]
        after = tx.run("claim_look", gen=gen, now=T + 2, max_attempts=3, limit=5).fetchall()
        return due, ahead, after

    try:
        due, ahead, after = await box._db.write(probe_then_look)
    finally:
        await box.close()
    assert due is False
    assert ahead == after
    assert {row[-1] for row in ahead} >= {0, 3}  # fresh ones, and the out-of-attempts probe


async def test_a_wake_ups_claim_is_two_round_trips_and_a_due_timer_still_joins_it(
    url, monkeypatch, record_statements
):
    """The lock with the look and the probe (prepared by the session's first claim), then
    the claim with the change count and COMMIT. A timer that is due makes the probe say so:
    it fires, and its event is in what the claim looks at again."""
    box = await Inbox.open(url)
    try:
        await box.configure(max_batch=10)
        gen = await box.acquire("W", now=T)
        await box.ingest("hook", "a", None, now=T)
        sent = record_statements()
        claimed = await box.claim_next("W", gen, mark=False, now=T)
        assert [e.source_id for e in claimed.events] == ["a"]
        claim = ["BEGIN; EXECUTE", "EXECUTE onwatch_claim"]
        assert sent == ["SELECT name", "PREPARE onwatch_look", *claim]
        await box.finish("W", gen, [e.id for e in claimed.events], now=T)
        await box.ingest("hook", "b", None, now=T)
        del sent[:]
        claimed = await box.claim_next("W", gen, mark=False, now=T)
        assert [e.source_id for e in claimed.events] == ["b"]
        assert sent == claim
        monkeypatch.undo()

        await box.finish("W", gen, [e.id for e in claimed.events], now=T)
        await box.add_timer("tick", T + 5, None)
        await box.ingest("hook", "c", None, now=T + 5)
        claimed = await box.claim_next("W", gen, mark=False, now=T + 5)
        assert sorted(e.source for e in claimed.events) == ["hook", "timer"]
    finally:
        await box.close()


async def test_a_look_read_with_the_lock_for_other_settings_or_another_time_is_read_again(
    url, record_statements
):
    """The look sent with the lock asks with what the caller expects; the transaction
    decides by the locked row's settings and its own clock. Where they differ, it looks
    again (one more round trip) and claims what those settings and that time allow."""
    box = await Inbox.open(url)
    other = await Inbox.open(url)
    try:
        await box.configure(max_batch=1)
        await box.ingest_batch([("hook", f"e{k}", None) for k in range(5)], now=T)
        gen = await box.acquire("W", now=T)
        await other.configure(max_batch=3)  # this Inbox's settings are stale now
        assert box.settings.max_batch == 1
        sent = record_statements()
        claimed = await box.claim_next("W", gen, mark=False, now=T)
        assert [e.source_id for e in claimed.events] == ["e0", "e1", "e2"]
        assert "(SELECT id," in sent and box.settings.max_batch == 3
        await box.finish("W", gen, [e.id for e in claimed.events], now=T)

        # A look read at another time than the transaction decides by (a second that
        # began between the two clock readings) is not used either.
        del sent[:]
        claimed = await box._db.write_looking(
            (gen, 3, 3, T + 60), runs.claim_next, "W", gen, T, True, False
        )
        assert [e.source_id for e in claimed.events] == ["e3", "e4"]
        assert "(SELECT id," in sent
    finally:
        await other.close()
        await box.close()


async def test_a_claim_commits_with_its_transaction_and_records_the_run_as_before(url):
    """The claim and COMMIT in one message: the run's holder is the lease's, its list of
    ids the text a claim sent alone writes, and its events run under it."""
    box = await Inbox.open(url)
    try:
        await box.configure(max_batch=5)
        await box.ingest_batch([("hook", f"e{k}", None) for k in range(3)], now=T)
        gen = await box.acquire("W", now=T)
        claimed = await box.claim_next("W", gen, mark=False, now=T)
        ids = [e.id for e in claimed.events]
        assert len(ids) == 3 and {e.run_id for e in claimed.events} == {claimed.events[0].run_id}
        with psycopg.connect(url) as conn:
            run = conn.execute(
                "SELECT holder, gen, event_ids, claimed_at FROM runs WHERE id = %s",
                (claimed.events[0].run_id,),
            ).fetchone()
            running = conn.execute(
                "SELECT count(*) FROM events WHERE status = 'running' AND run_id = %s",
                (claimed.events[0].run_id,),
            ).fetchone()[0]
        assert run == ("W", gen, "[" + ", ".join(map(str, ids)) + "]", T)
        assert running == 3
    finally:
        await box.close()


async def test_a_claim_that_fails_with_its_commit_rolls_back_its_whole_transaction(url):
    """What the transaction wrote before its claim commits with the claim or not at all; a
    statement after a claim that committed is a programming error, said at once."""
    box = await Inbox.open(url)
    try:
        await box.ingest_batch([("hook", f"e{k}", None) for k in range(2)], now=T)
        gen = await box.acquire("W", now=T)
        first, second = (e.id for e in await box.events("pending"))

        def set_aside_then_claim_twice(tx) -> int:
            tx.run("event_set_aside", id=second, error="x", now=T)
            return tx.claim("W", gen, [first, first], T)  # one link twice: refused

        with pytest.raises(InboxError):
            await box._db.write(set_aside_then_claim_twice)
        assert [e.id for e in await box.events("pending")] == [first, second]  # nothing kept

        def claim_then_read(tx) -> None:
            tx.claim("W", gen, [first], T)
            tx.execute("SELECT 1")

        with pytest.raises(RuntimeError, match="after the claim"):
            await box._db.write(claim_then_read)
        assert [e.id for e in await box.events("running")] == [first]  # the claim committed
    finally:
        await box.close()
