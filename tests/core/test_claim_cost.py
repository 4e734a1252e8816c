"""A claim's cost does not grow with the number of events waiting out a backoff
(docs/rules.md#claiming-a-run).

Measured as work, never as time: on SQLite the virtual-machine steps the claim's transaction
takes (a progress handler counts them), on PostgreSQL the rows its statements read (EXPLAIN
ANALYZE). With ten times as many events in backoff, a claim must not take ten times the
work; it takes about the same. The events in backoff are the issue's case: each failed once
and waits, a fresh event and a retried one whose backoff is over are what the claim finds.
"""

from __future__ import annotations

import json
import sqlite3

import pytest

from onwatch.core import FakeClock, Inbox

from .conftest import T, is_postgresql

pytestmark = pytest.mark.backends  # the conformance suite: once per backend

SMALL, LARGE = 2_000, 20_000


class Counting(sqlite3.Connection):
    """A connection that counts its virtual-machine steps, in hundreds."""

    steps = 0

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.set_progress_handler(self._step, 100)

    @classmethod
    def _step(cls) -> int:
        cls.steps += 1
        return 0


async def fill(box: Inbox, target: str, waiting: int) -> None:
    """`waiting` events that failed once and wait out a long backoff (written as a failed
    finish leaves them), then one fresh event and one retried event whose backoff is over."""
    from .conftest import raw_sql

    batch = [("chat", f"w{i}", {"i": i}) for i in range(waiting)]
    for start in range(0, waiting, 5000):
        await box.ingest_batch(batch[start : start + 5000], now=T)
    raw_sql(
        target,
        "UPDATE events SET attempts = 1, available_at = ?, error = 'timeout' "
        "WHERE status = 'pending'",
        (T + 86_400,),
    )
    await box.ingest("chat", "fresh", None, now=T)
    await box.ingest("chat", "due", None, now=T)
    raw_sql(
        target,
        "UPDATE events SET attempts = 1, available_at = ? WHERE source_id = 'due'",
        (T - 1,),
    )
    if is_postgresql(target):
        raw_sql(target, "ANALYZE events")


async def claim_work(target: str, tmp_path, waiting: int) -> int:
    """The work of the claims that take the two runnable events, with `waiting` in backoff."""
    if is_postgresql(target):
        return await claim_rows_read(target, waiting)
    path = str(tmp_path / f"claim-{waiting}.db")
    async with await Inbox.open(path, clock=FakeClock(T), connection_factory=Counting) as box:
        await box.configure(max_attempts=3)
        await fill(box, path, waiting)
        gen = await box.acquire("W")
        Counting.steps = 0
        first = await box.claim_batch("W", gen)
        second = await box.claim_batch("W", gen)
        third = await box.claim_batch("W", gen)
        work = Counting.steps
    assert [[e.source_id for e in run] for run in (first, second, third)] == [
        ["due"],
        ["fresh"],
        [],
    ]
    return work


async def claim_rows_read(target: str, waiting: int) -> int:
    """On PostgreSQL: the rows the claim's statements read (found, or read and filtered
    out), each run under EXPLAIN ANALYZE in a transaction that is rolled back."""
    import psycopg

    from onwatch.core.pg.tx import STATEMENTS

    async with await Inbox.open(target, clock=FakeClock(T)) as box:
        await box.configure(max_attempts=3)
        await fill(box, target, waiting)
        inbox_id = box._db.inbox  # type: ignore[attr-defined]
    params = {"inbox": inbox_id, "now": T, "limit": 20, "max_attempts": 3, "gen": 2}
    total = 0
    with psycopg.connect(target) as conn:
        # The look, and the burial a claim runs when an event is out of attempts.
        for name in ("claim_look", "bury_exhausted"):
            plan = conn.execute(
                "EXPLAIN (ANALYZE, FORMAT JSON) " + STATEMENTS[name], params
            ).fetchone()[0]
            total += rows_read(plan[0]["Plan"])
            conn.rollback()
    return total


def rows_read(node: dict) -> int:
    own = int(node.get("Actual Rows", 0)) + int(node.get("Rows Removed by Filter", 0))
    if node.get("Node Type") in ("ModifyTable", "Limit", "Sort", "Result"):
        own = 0  # rows passed on from below, already counted there
    return own + sum(rows_read(child) for child in node.get("Plans", []))


async def test_a_claim_costs_the_same_with_ten_times_more_events_in_backoff(path, tmp_path):
    small = await claim_work(path, tmp_path, SMALL)
    target = path
    if is_postgresql(path):
        from tests.pg.server import cluster_or_skip

        target = cluster_or_skip().new_schema()
    large = await claim_work(target, tmp_path, LARGE)
    # Ten times the events waiting: a scan of them would cost ten times as much.
    assert large < small * 1.5 + 50, (small, large)


def test_the_claim_statements_use_the_indexes_made_for_them():
    """SQLite: each statement of the claim names its index, and that index exists."""
    from onwatch.core.sqlite import schema
    from onwatch.core.sqlite.tx import STATEMENTS

    db = sqlite3.connect(":memory:")
    for step in schema.MIGRATIONS:
        for statement in schema._split(step):
            db.execute(statement)
    for name in ("claimable_next", "bury_exhausted"):
        plan = db.execute(
            "EXPLAIN QUERY PLAN " + STATEMENTS[name],
            {"now": T, "limit": 20, "max_attempts": 3},
        ).fetchall()
        text = json.dumps(plan)
        assert "events_fresh" in text or "events_retry" in text, (name, plan)
