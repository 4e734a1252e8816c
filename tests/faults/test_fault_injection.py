"""Crash at every statement of every write path (SQLite's own crash-test method).

For each path: count its statements in a clean run; then, for every N, start from the same
file, let statement N fail and every later one too (the process is as good as dead: not even
its ROLLBACK runs), drop the connection, reopen the file normally and check that

- the file is exactly as before the call (all or nothing: no half-finished run, no timer
  occurrence half fired, no event lost), and the invariants hold;
- running the same call again converges on exactly the clean run's file.

Dispatch has two transactions around the send: a crash after the send is redelivered under
the same idempotency key (at-least-once), never lost.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import sqlite3
from dataclasses import dataclass
from typing import Awaitable, Callable

import pytest

from onwatch.core import ApprovalRequest, FakeClock, FollowUp, Inbox, InboxError, Reply

T = 1_000_000
DAY = 86_400


class Faulty(sqlite3.Connection):
    """A connection whose N-th statement (once armed) fails, and every one after it."""

    armed = False
    fail_at: int | None = None
    count = 0
    dead = False

    @classmethod
    def arm(cls, fail_at: int | None) -> None:
        cls.armed, cls.fail_at, cls.count, cls.dead = True, fail_at, 0, False

    @classmethod
    def disarm(cls) -> None:
        cls.armed = False

    @classmethod
    def _tick(cls, sql: str) -> None:
        if not cls.armed:
            return
        if cls.dead:
            raise sqlite3.OperationalError("injected crash: the process is gone")
        cls.count += 1
        if cls.fail_at is not None and cls.count == cls.fail_at:
            cls.dead = True
            raise sqlite3.OperationalError(f"injected crash at statement {cls.count}: {sql[:40]}")

    def execute(self, sql, *args):  # type: ignore[override]
        self._tick(sql)
        return super().execute(sql, *args)

    def executemany(self, sql, *args):  # type: ignore[override]
        self._tick(sql)
        return super().executemany(sql, *args)


@dataclass
class Path:
    """A write path: how to set the file up, and the call to crash."""

    name: str
    setup: Callable[[Inbox], Awaitable[None]]
    call: Callable[[Inbox, list], Awaitable[object]]


async def _events(inbox: Inbox, n: int = 3) -> None:
    for i in range(n):
        await inbox.ingest("chat", f"m{i}", {"text": f"hello {i}"}, now=T)


async def setup_ingest(inbox: Inbox) -> None:
    await _events(inbox, 2)


async def call_ingest(inbox: Inbox, sent: list) -> object:
    return await inbox.ingest("chat", "new-1", {"a": 1}, now=T + 1)


async def call_ingest_duplicate(inbox: Inbox, sent: list) -> object:
    return await inbox.ingest("chat", "m0", {"dup": True}, now=T + 1)


async def call_ingest_group(inbox: Inbox, sent: list) -> object:
    """Several at once (group commit may split them over transactions)."""
    return await asyncio.gather(
        *(inbox.ingest("hook", f"g{i}", [i], now=T + 1) for i in range(6)),
        inbox.ingest("chat", "m0", None, now=T + 1),
        return_exceptions=True,
    )


async def setup_claim(inbox: Inbox) -> None:
    await inbox.configure(max_attempts=2)
    await _events(inbox, 3)
    gen = await inbox.acquire("A", now=T)
    await inbox.claim_batch("A", gen, now=T)  # A claims all three, then "dies"
    gen = await inbox.acquire("B", now=T + 200)
    batch = await inbox.claim_batch("B", gen, now=T + 200)  # B claims m0 alone, "dies"
    assert [e.source_id for e in batch] == ["m0"]
    await inbox.ingest("chat", "fresh", {"text": "new"}, now=T + 300)


async def call_claim(inbox: Inbox, sent: list) -> object:
    gen = 3
    return await inbox.claim_batch("C", gen, now=T + 500)


async def setup_claim_lease(inbox: Inbox) -> None:
    await setup_claim(inbox)
    assert await inbox.acquire("C", now=T + 500) == 3


async def setup_finish(inbox: Inbox) -> None:
    await _events(inbox, 3)
    gen = await inbox.acquire("A", now=T)
    await inbox.claim_batch("A", gen, now=T)


async def call_finish(inbox: Inbox, sent: list) -> object:
    return await inbox.finish(
        "A",
        1,
        [1, 2, 3],
        messages=["reply one", Reply("urgent two", urgent=True)],
        result={"ok": True},
        approvals=[ApprovalRequest("r-1", 3600, "refund 5")],
        timers=[FollowUp("check-later", T + 600, {"why": "follow up"})],
        now=T + 10,
    )


async def call_finish_error(inbox: Inbox, sent: list) -> object:
    return await inbox.finish("A", 1, [1, 2, 3], error="tool timed out", now=T + 10)


async def setup_scheduler(inbox: Inbox) -> None:
    await inbox.add_timer("digest", T - 3 * DAY - 600, {"kind": "digest"}, every=DAY)
    await inbox.add_timer("billing", T - 2 * DAY, None, every=DAY, catch_up="each")
    await inbox.add_timer("once", T - 5, {"one": "off"})
    await inbox.add_timer("later", T + DAY, None)
    await inbox.request_approval("r-1", 60, "refund 5", now=T - 120)  # expires at T - 60


async def call_scheduler(inbox: Inbox, sent: list) -> object:
    return await inbox.run_scheduler(now=T)


async def setup_answer(inbox: Inbox) -> None:
    await inbox.request_approval("r-1", 3600, "refund 5", now=T)


async def call_answer(inbox: Inbox, sent: list) -> object:
    return await inbox.answer_approval("r-1", "yes", now=T + 60, actor="ana")


async def call_answer_late(inbox: Inbox, sent: list) -> object:
    return await inbox.answer_approval("r-1", "yes", now=T + 7200, actor="ana")


async def setup_acquire(inbox: Inbox) -> None:
    await _events(inbox, 1)
    gen = await inbox.acquire("A", now=T)
    await inbox.claim_batch("A", gen, now=T)


async def call_acquire(inbox: Inbox, sent: list) -> object:
    return await inbox.acquire("B", now=T + 500)


async def call_requeue(inbox: Inbox, sent: list) -> object:
    return await inbox.cancel(2, actor="ana", reason="spam", now=T + 5)


async def setup_effect(inbox: Inbox) -> None:
    await setup_finish(inbox)


async def call_effect(inbox: Inbox, sent: list) -> object:
    return await inbox.intend_effect("A", 1, 1, "refund", {"amount": 5}, event=2, now=T + 5)


async def setup_broken_timer(inbox: Inbox) -> None:
    await setup_scheduler(inbox)
    await inbox.add_timer("hand-edited", T - 10, None, every=60)
    # A row no valid call could write: its next occurrence would overflow SQLite's int64.
    await inbox._db.write(
        lambda tx: tx.conn.execute(
            "UPDATE timers SET every = ? WHERE id = 'hand-edited'", (2**63 - 1,)
        )
    )


async def setup_uncertain(inbox: Inbox) -> None:
    await inbox.configure(delivery="at_most_once", outbox_gap=0)
    gen = await inbox.acquire("A", now=T)
    await _events(inbox, 1)
    [event] = await inbox.claim_batch("A", gen, now=T)
    await inbox.finish("A", gen, [event.id], ["pay 5"], now=T)

    async def cut_off(text):
        raise asyncio.CancelledError  # the dispatcher dies mid-send

    try:
        await inbox.dispatch(cut_off, now=T)
    except asyncio.CancelledError:
        pass


async def call_settle(inbox: Inbox, sent: list) -> object:
    return await inbox.settle_delivery(1, "send again", now=T + 400, actor="ann")


async def call_group_with_a_bad_item(inbox: Inbox, sent: list) -> object:
    from onwatch.core.engine import intake

    items = [("chat", "g1", "null", T), ("", "bad", "null", T), ("chat", "g2", "null", T)]
    results = await inbox._db.write(intake.ingest_many, items)
    return [r if isinstance(r, bool) else type(r).__name__ for r in results]


PATHS = [
    Path("ingest", setup_ingest, call_ingest),
    Path("ingest-duplicate", setup_ingest, call_ingest_duplicate),
    Path("claim", setup_claim_lease, call_claim),
    Path("finish", setup_finish, call_finish),
    Path("finish-error", setup_finish, call_finish_error),
    Path("scheduler", setup_scheduler, call_scheduler),
    Path("answer", setup_answer, call_answer),
    Path("answer-late", setup_answer, call_answer_late),
    Path("acquire", setup_acquire, call_acquire),
    Path("cancel", setup_ingest, call_requeue),
    Path("intend-effect", setup_effect, call_effect),
    Path("scheduler-sets-a-row-aside", setup_broken_timer, call_scheduler),
    Path("settle-uncertain-delivery", setup_uncertain, call_settle),
    Path("group-with-a-bad-item", setup_ingest, call_group_with_a_bad_item),
]


def snapshot(path: str) -> dict[str, list]:
    """Every row of every table (the file's whole observable state)."""
    db = sqlite3.connect(path)
    try:
        tables = [
            r[0]
            for r in db.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' "
                "ORDER BY name"
            )
        ]
        return {t: sorted(db.execute(f"SELECT * FROM {t}").fetchall(), key=repr) for t in tables}
    finally:
        db.close()


def check_invariants(path: str) -> None:
    db = sqlite3.connect(path)
    try:
        q = lambda sql: db.execute(sql).fetchall()  # noqa: E731
        actual = dict(q("SELECT status, count(*) FROM events GROUP BY status"))
        kept = {s: n for s, n in q("SELECT status, n FROM event_counts") if n}
        assert actual == kept, "kept counts disagree with the rows"
        assert (
            q("""SELECT e.id FROM events e LEFT JOIN runs r ON r.id = e.run_id
                    WHERE e.status = 'running' AND (r.id IS NULL OR r.outcome IS NOT NULL)""")
            == []
        ), "a running event without an open run"
        assert (
            q("""SELECT e.id FROM events e JOIN run_events re ON re.event_id = e.id
                    JOIN runs r ON r.id = re.run_id
                    WHERE r.outcome = 'done' AND e.status <> 'done'""")
            == []
        ), "a done run whose event is not done"
        assert (
            q("""SELECT o.id FROM outbox o JOIN runs r ON r.id = o.run_id
                    WHERE r.outcome IS NOT 'done'""")
            == []
        ), "a message of an unfinished run"
        assert (
            q("""SELECT a.request_id FROM approvals a WHERE a.answer IS NOT NULL AND NOT
                    EXISTS (SELECT 1 FROM events e WHERE e.source = 'approval'
                            AND e.source_id = a.request_id)""")
            == []
        ), "an answer without its resuming event"
        assert (
            q("""SELECT a.request_id FROM approvals a WHERE a.answer IS NULL AND NOT EXISTS
                    (SELECT 1 FROM timers t WHERE t.id = 'approval:' || a.request_id)""")
            == []
        ), "a waiting approval without its expiry timer"
        assert (
            q("""SELECT o.id FROM outbox o LEFT JOIN deliveries d ON d.id = o.delivery_id
                    WHERE o.status = 'sent' AND (d.status IS NOT 'sent')""")
            == []
        ), "a message marked sent by a delivery that was not"
    finally:
        db.close()


async def run_call(path: str, p: Path, fail_at: int | None, sent: list) -> object:
    inbox = await Inbox.open(path, clock=FakeClock(T), connection_factory=Faulty)
    Faulty.arm(fail_at)
    try:
        return await p.call(inbox, sent)
    finally:
        Faulty.disarm()
        await inbox.close()


async def make_base(tmp_path, p: Path) -> str:
    base = str(tmp_path / f"{p.name}-base.db")
    inbox = await Inbox.open(base, clock=FakeClock(T))
    await p.setup(inbox)
    await inbox.close()  # the last connection's close checkpoints the WAL into the file
    return base


def copy(base: str, target: str) -> str:
    shutil.copyfile(base, target)
    return target


@pytest.mark.parametrize("p", PATHS, ids=[p.name for p in PATHS])
async def test_crash_at_every_statement_of_a_write_path(tmp_path, p):
    base = await make_base(tmp_path, p)
    before = snapshot(base)
    clean = copy(base, str(tmp_path / "clean.db"))
    clean_outcome = await run_call(clean, p, None, [])
    statements = Faulty.count
    after = snapshot(clean)
    assert statements >= 2
    check_invariants(clean)
    print(f"{p.name}: crashed at each of its {statements} statements")
    for n in range(1, statements + 1):
        target = copy(base, str(tmp_path / f"crash-{n}.db"))
        with pytest.raises(InboxError, match="injected crash"):
            await run_call(target, p, n, [])
        assert snapshot(target) == before, f"statement {n} of {statements} left a trace"
        check_invariants(target)
        # The same call after the restart converges on the clean run, outcome included.
        assert await run_call(target, p, None, []) == clean_outcome
        assert snapshot(target) == after, f"recovery after statement {n} diverged"


async def setup_dispatch(inbox: Inbox) -> None:
    await setup_finish(inbox)
    await inbox.finish("A", 1, [1, 2, 3], messages=["update 0", "update 1"], now=T + 10)


async def test_crash_at_every_statement_of_a_dispatch(tmp_path):
    """Before the send: nothing changed, nothing sent. After the send: the delivery stays
    'sending' and is sent again, under the same key, once the send timeout passed."""
    p = Path(
        "dispatch", setup_dispatch, lambda inbox, sent: inbox.dispatch(sent.append, now=T + 20)
    )
    base = await make_base(tmp_path, p)
    before = snapshot(base)
    clean_sent: list = []
    clean = copy(base, str(tmp_path / "clean.db"))
    assert await run_call(clean, p, None, clean_sent) == 2
    statements = Faulty.count
    after = snapshot(clean)
    assert [str(s) for s in clean_sent] == ["update 0\n\nupdate 1"]
    resends = 0
    for n in range(1, statements + 1):
        target = copy(base, str(tmp_path / f"crash-{n}.db"))
        sent: list = []
        with pytest.raises(InboxError, match="injected crash"):
            await run_call(target, p, n, sent)
        check_invariants(target)
        held = (
            sqlite3.connect(target)
            .execute("SELECT count(*) FROM outbox WHERE status = 'held'")
            .fetchone()[0]
        )
        assert held == 2, "a crash lost or half-sent a message"
        if not sent:
            assert snapshot(target) == before, f"statement {n} left a trace before the send"
            assert await run_call(target, p, None, []) == 2
            assert snapshot(target) == after
            continue
        # Crashed after the send, before recording it: sent again later, same key.
        resends += 1
        inbox = await Inbox.open(target, clock=FakeClock(T))
        again: list = []
        timeout = inbox.settings.send_timeout
        assert await inbox.dispatch(again.append, now=T + 20) == 0  # still in flight
        assert await inbox.dispatch(again.append, now=T + 21 + timeout) == 2
        await inbox.close()
        assert [str(s) for s in again] == [str(sent[0])]
        assert again[0].key == sent[0].key, "a redelivery must keep its idempotency key"
        check_invariants(target)
    assert resends >= 1  # the end-of-delivery transaction was crashed at least once


async def test_crash_at_every_statement_of_a_group_ingest(tmp_path):
    """Each caller either got True and its event is stored, or got the error and nothing of
    its event is stored; retrying the failed ones converges on the clean file."""
    p = Path("group", setup_ingest, call_ingest_group)
    base = await make_base(tmp_path, p)
    clean = copy(base, str(tmp_path / "clean.db"))
    assert await run_call(clean, p, None, []) == [True] * 6 + [False]
    statements = Faulty.count
    after = snapshot(clean)
    for n in range(1, statements + 1):
        target = copy(base, str(tmp_path / f"crash-{n}.db"))
        outcomes = await run_call(target, p, n, [])
        assert any(isinstance(o, InboxError) for o in outcomes), n
        stored = {
            r[0]
            for r in sqlite3.connect(target).execute(
                "SELECT source_id FROM events WHERE source = 'hook'"
            )
        }
        for i, outcome in enumerate(outcomes[:6]):
            assert (outcome is True) == (f"g{i}" in stored), (n, i, outcome)
        check_invariants(target)
        inbox = await Inbox.open(target, clock=FakeClock(T))
        for i, outcome in enumerate(outcomes[:6]):
            if outcome is not True:  # the caller saw an error: it retries, as a webhook would
                assert await inbox.ingest("hook", f"g{i}", [i], now=T + 1) is True
        assert await inbox.ingest("chat", "m0", None, now=T + 1) is False
        await inbox.close()
        assert snapshot(target) == after


async def test_scheduler_pass_counts_every_occurrence_once(tmp_path):
    """What the scheduler path's converged file holds: each missed occurrence has its own
    event or is counted in `skipped`; none twice."""
    p = next(p for p in PATHS if p.name == "scheduler")
    path = copy(await make_base(tmp_path, p), str(tmp_path / "s.db"))
    with pytest.raises(InboxError):
        await run_call(path, p, 9, [])  # crash in the middle of the pass
    assert await run_call(path, p, None, []) == 4  # digest, billing, once, the expiry
    rows = (
        sqlite3.connect(path)
        .execute("SELECT source, source_id, payload FROM events ORDER BY id")
        .fetchall()
    )
    keys = [f"{s}/{i}" for s, i, _ in rows]
    assert len(keys) == len(set(keys))
    digest = [json.loads(pl) for s, i, pl in rows if i.startswith("digest@")]
    assert len(digest) == 1 and digest[0]["skipped"] == 3 and digest[0]["late_by"] == 600
    billing = [i for _, i, _ in rows if i.startswith("billing@")]
    assert billing == [f"billing@{T - 2 * DAY}", f"billing@{T - DAY}", f"billing@{T}"]
    assert ("timer", "once@" + str(T - 5)) in [(s, i) for s, i, _ in rows]
    assert ("approval", "r-1") in [(s, i) for s, i, _ in rows]
    # A second pass at the same instant finds nothing due.
    assert await run_call(path, p, None, []) == 0
