"""A claim's look read together with the statement before it (core/pg/tx.py: `finish_done` with
`look`, one pipeline): the rows are the look the claim would read itself after the finish,
and they answer only the claim_look that comes next in the same transaction."""

from __future__ import annotations

import json

import psycopg
import pytest

import onwatch.core.pg.db as pg_db
from onwatch.core import Inbox, InboxError
from onwatch.core.engine import intake, runs
from onwatch.core.engine.runs import Claimed
from onwatch.core.engine.tx import FinishAhead, LookAhead

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
    """Where the claim is not made with the lock (tests/pg/test_take.py; switched off here):
    the lock with the look and the probe (prepared by the session's first claim), then the
    claim with the change count and COMMIT. A timer that is due makes the probe say so: it
    fires, and its event is in what the claim looks at again."""
    import onwatch.core.pg.db as pg_db

    monkeypatch.setattr(pg_db, "TAKE_SERVER", 10**9)
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
        claimed = await box._db.write_ahead(
            LookAhead(gen, 3, 3, T + 60), runs.claim_next, "W", gen, T, True, False
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


def _record_messages(monkeypatch) -> list[str]:
    """What every psycopg connection of this process sends, whole, from now on."""
    sent: list[str] = []
    execute = psycopg.Connection.execute

    def recorded(self, query, *args, **kwargs):
        sent.append(str(query))
        return execute(self, query, *args, **kwargs)

    monkeypatch.setattr(psycopg.Connection, "execute", recorded)
    return sent


async def _claimed_run(box: Inbox, events: int = 3) -> tuple[int, Claimed]:
    """An inbox whose worker W runs one event at a time, with `events` pending and the
    first claimed (by the server's clock, as a worker claims)."""
    await box.configure(max_batch=1, max_attempts=3)
    await box.ingest_batch([("hook", f"e{k}", None) for k in range(events)], now=T)
    gen = await box.acquire("W")
    return gen, await box.claim_next("W", gen, mark=False)


def _outcome(url: str, event_id: int) -> tuple:
    with psycopg.connect(url) as conn:
        return conn.execute(
            "SELECT e.status, r.outcome, r.finished_at, r.result FROM events e "
            "JOIN runs r ON r.inbox_id = e.inbox_id AND r.id = e.run_id WHERE e.id = %s",
            (event_id,),
        ).fetchone()


@pytest.mark.parametrize("take", [True, False], ids=["one message", "two round trips"])
async def test_a_finish_that_claims_next_writes_as_before(url, monkeypatch, take):
    """Where the claim is plain, the finish and the claim are made with the lock and
    committed in that message (FINISH_AND_TAKE_WITH_LOCK); without that statement (a server
    before version 16), the finish and the claim's look travel with the lock, the claim
    with the COMMIT. Either way the run is closed, its result stored (quoted by the driver,
    whatever it holds), and the next event claimed."""
    box = await Inbox.open(url)
    try:
        gen, claimed = await _claimed_run(box)
        hostile = {"q": 'it\'s \\ "$1" ); DROP TABLE events; --', "u": "\u202e\x1b[2J é"}
        for result in (None, hostile):
            if not take:
                monkeypatch.setattr(pg_db, "TAKE_SERVER", 10**9)
            sent = _record_messages(monkeypatch)
            [event] = claimed.events
            accepted, claimed = await box.finish_and_claim(
                "W",
                gen,
                [event.id],
                run=event.run_id,
                result=result,
                fire_timers=False,
                mark=False,
            )
            monkeypatch.undo()
            assert accepted and claimed is not None and len(claimed.events) == 1
            messages = [m for m in sent if not m.startswith(("SELECT name", "PREPARE"))]
            assert messages[0].startswith("BEGIN; EXECUTE onwatch_lock(")
            if take:
                assert len(messages) == 1, messages
                assert "EXECUTE onwatch_finish_take(" in messages[0]
                assert messages[0].endswith("; COMMIT")
            else:
                assert len(messages) == 2, messages
                assert "EXECUTE onwatch_finish(" in messages[0]
                assert messages[1].startswith("EXECUTE onwatch_claim(")
            status, outcome, finished_at, stored = _outcome(url, event.id)
            assert (status, outcome) == ("done", "done") and finished_at is not None
            assert (None if stored is None else json.loads(stored)) == result
        assert claimed.events[0].source_id == "e2"
    finally:
        await box.close()


async def test_a_finish_sent_with_the_lock_writes_only_where_the_engine_would(url):
    """The statement is fenced as the engine fences: another holder naming this generation,
    a lease that expired, a run that is not this generation's open run are refused (nothing
    written, the refusal counted); the same finish again after its answer was lost is
    accepted and writes nothing more."""
    box = await Inbox.open(url)
    try:
        gen, claimed = await _claimed_run(box)
        [event] = claimed.events
        run = event.run_id
        assert run is not None

        async def finish(holder: str = "W", run: int = run, now: int | None = None):
            return await box.finish_and_claim(
                holder, gen, [event.id], run=run, now=now, fire_timers=False, mark=False
            )

        assert await finish("X") == (False, None)
        assert await finish(run=run + 1000) == (False, None)
        lease = await box.lease_info()
        assert lease is not None
        assert await finish(now=lease.until + 1) == (False, None)
        assert _outcome(url, event.id)[:2] == ("running", None)
        assert (await box.overview()).refused_writes == 3

        accepted, next_claim = await finish()
        assert accepted and next_claim is not None
        assert _outcome(url, event.id)[:2] == ("done", "done")
        finished_at = _outcome(url, event.id)[2]
        accepted, _ = await finish()  # the answer lost, the finish sent again
        assert accepted and _outcome(url, event.id) == ("done", "done", finished_at, None)
    finally:
        await box.close()


async def test_a_finish_sent_with_the_lock_for_other_settings_claims_by_the_locked_ones(url):
    """The look sent with the finish asks with this Inbox's settings; another process
    changed them meanwhile. The finish stands, the look is read again, and the claim
    takes what the locked settings allow."""
    box = await Inbox.open(url)
    other = await Inbox.open(url)
    try:
        gen, claimed = await _claimed_run(box, events=5)
        await other.configure(max_batch=3)
        [event] = claimed.events
        accepted, claimed = await box.finish_and_claim(
            "W", gen, [event.id], run=event.run_id, fire_timers=False, mark=False
        )
        assert accepted and claimed is not None
        assert [e.source_id for e in claimed.events] == ["e1", "e2", "e3"]
        assert _outcome(url, event.id)[:2] == ("done", "done")
    finally:
        await other.close()
        await box.close()


async def test_a_finish_sent_with_the_lock_and_not_asked_for_first_rolls_back(url):
    """A transaction whose first statement is not the finish it said it would make: if the
    finish wrote, the transaction raises and keeps nothing; if its fence stopped it, it
    wrote nothing and the transaction goes on."""
    box = await Inbox.open(url)
    try:
        gen, claimed = await _claimed_run(box)
        [event] = claimed.events
        assert event.run_id is not None

        def ahead(holder: str) -> FinishAhead:
            return FinishAhead(holder, gen, event.run_id, (event.id,), None, 3, 1, None)

        def read_first(tx) -> int:
            return len(tx.run("claim_look", gen=gen, now=T, max_attempts=3, limit=1).fetchall())

        for first in (read_first, lambda tx: None):  # another statement; none at all
            with pytest.raises(RuntimeError, match="not the transaction's first"):
                await box._db.write_ahead(ahead("W"), first)
            assert _outcome(url, event.id)[:2] == ("running", None)
        assert await box._db.write_ahead(ahead("X"), read_first) > 0
        assert _outcome(url, event.id)[:2] == ("running", None)
    finally:
        await box.close()
