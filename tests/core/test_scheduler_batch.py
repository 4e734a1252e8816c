"""The scheduler pass fires runs of one-shot timers in batches: the same events, in the same
order, and a row the engine cannot process is still set aside with its reason.

Bad rows are written by hand with plain sqlite3 (what no valid call can store), in the middle
of runs longer than one insert statement carries, so that the batch path meets them.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import sqlite3

import pytest

from onwatch.core.engine import intake, scheduler
from onwatch.core.sqlite.db import write_transaction
from onwatch.core.sqlite.tx import INSERT_ROWS, SqliteTx

from .conftest import T


def sql(path: str, statement: str, params: tuple = ()) -> list[tuple]:
    db = sqlite3.connect(path, isolation_level=None)
    try:
        return db.execute(statement, params).fetchall()
    finally:
        db.close()


def occurrence(timer_id: str, due: int, now: int, data: object) -> dict:
    return {
        "timer": timer_id,
        "scheduled_for": due,
        "late_by": now - due,
        "skipped": 0,
        "data": data,
    }


async def test_batched_timers_fire_in_due_order_with_the_payloads_they_stored(inbox, path):
    count = 2 * INSERT_ROWS + 7  # several insert statements
    payloads = [
        None,
        {"n": 1},
        ["ü", "日本", "\u2028"],
        'text "quoted"',
        7.5,
        {"deep": [[{}]]},
        {"nested": [[[[[[[[[[[[1]]]]]]]]]]]] * 10},
    ]
    for i in range(count):
        await inbox.add_timer(f"t-{i:04d}", T - i, payloads[i % len(payloads)])
    await inbox.add_timer("keyed", T - count, {"k": 1}, key=("crm", "follow-up-9"))
    await inbox.add_timer("non-ascii-ïd", T - count - 1, None)
    assert await inbox.run_scheduler(now=T + 3) == count + 2
    events = await inbox.events("pending", limit=10_000)
    assert [(e.source, e.source_id) for e in events] == (
        [("timer", f"non-ascii-ïd@{T - count - 1}"), ("crm", "follow-up-9")]
        + [("timer", f"t-{i:04d}@{T - i}") for i in reversed(range(count))]
    )  # due order
    assert events[0].payload == occurrence("non-ascii-ïd", T - count - 1, T + 3, None)
    assert events[1].payload == occurrence("keyed", T - count, T + 3, {"k": 1})
    for event in events[2:]:
        i = int(event.source_id[2:6])
        assert event.payload == occurrence(f"t-{i:04d}", T - i, T + 3, payloads[i % len(payloads)])
    stored = sql(path, "SELECT payload FROM events WHERE source_id = ?", ("t-0001@999999",))[0][0]
    assert json.loads(stored) == occurrence("t-0001", T - 1, T + 3, {"n": 1})
    assert await inbox.timers() == []
    assert (await inbox.overview(now=T + 3)).set_aside == 0


async def test_a_row_the_events_table_refuses_mid_batch_is_set_aside_and_the_rest_fire(inbox, path):
    count = 2 * INSERT_ROWS + 7
    for i in range(count):
        await inbox.add_timer(f"t-{i:04d}", T + i, {"i": i})
    # Keys the events table's CHECK refuses (an empty source), one in each insert statement,
    # and payloads that are not one JSON value: each must be set aside, never spliced.
    refused = {3, INSERT_ROWS + 1, count - 1}
    # (1,500 levels of nesting is valid JSON to SQLite's json_valid, not to Python's decoder.)
    malformed = {10: '{"i": 10', 11: '{"i": 11} trailing', 12: "", 13: "[" * 1500 + "]" * 1500}
    why = {
        10: "JSONDecodeError",
        11: "JSONDecodeError",
        12: "JSONDecodeError",
        13: "RecursionError",
    }
    for i in refused:
        sql(path, "UPDATE timers SET key_source = '', key_id = 'x' WHERE id = ?", (f"t-{i:04d}",))
    for i, text in malformed.items():
        sql(path, "UPDATE timers SET payload = ? WHERE id = ?", (text, f"t-{i:04d}"))
    assert await inbox.run_scheduler(now=T + count) == count
    fired = [e.source_id for e in await inbox.events("pending", limit=10_000)]
    good = [i for i in range(count) if i not in refused and i not in malformed]
    assert fired == [f"t-{i:04d}@{T + i}" for i in good]  # due order, none lost, none twice
    left = {t.id: t.broken for t in await inbox.timers()}
    assert set(left) == {f"t-{i:04d}" for i in refused | set(malformed)}
    for i in refused:
        assert left[f"t-{i:04d}"].startswith("set aside, not fired: IntegrityError")
    for i in malformed:
        assert left[f"t-{i:04d}"].startswith(f"set aside, not fired: {why[i]}")
    assert (await inbox.overview(now=T + count)).set_aside == len(refused) + len(malformed)
    assert sql(path, "SELECT count(*) FROM events WHERE source = ''") == [(0,)]
    counted = dict(sql(path, "SELECT status, n FROM event_counts"))
    assert counted["pending"] == len(good)  # the refused statements left no count behind


async def test_recurring_and_approval_timers_between_batches_keep_their_place(inbox, path):
    await inbox.add_timer("a", T - 30, {"n": "a"})
    await inbox.add_timer("every", T - 20, {"n": "every"}, every=3600)
    await inbox.request_approval("r-1", 5, "refund", now=T - 15)  # its expiry is due at T - 10
    await inbox.add_timer("b", T - 5, {"n": "b"})
    assert await inbox.run_scheduler(now=T) == 4
    assert [(e.source, e.source_id) for e in await inbox.events("pending")] == [
        ("timer", f"a@{T - 30}"),
        ("timer", f"every@{T - 20}"),
        ("approval", "r-1"),
        ("timer", f"b@{T - 5}"),
    ]
    assert [t.id for t in await inbox.timers()] == ["every"]


@pytest.mark.parametrize("chunk_ms, chunks", [(10, 3), (5, 7), (40, 1)])
async def test_a_transaction_stops_before_a_chunk_would_take_it_past_its_bound(
    inbox, path, monkeypatch, chunk_ms, chunks
):
    # A chunk of the pass takes `chunk_ms` on the monotonic clock (one tick per look). Another
    # chunk is fired only if, taking as long as the last one, it would end within the 35 ms
    # bound: so no transaction holds the lock past it by a chunk (measured from the start
    # alone, 10 ms chunks would make a transaction of 40 ms). The first chunk always fires.
    for i in range(60):
        await inbox.add_timer(f"t-{i:02d}", T - 100 + i, None)
    ticks = itertools.count()
    db = sqlite3.connect(path, isolation_level=None)
    try:
        with monkeypatch.context() as patch:  # only while the synchronous pass runs
            patch.setattr(scheduler.time, "monotonic", lambda: next(ticks) * chunk_ms / 1000)
            fired, more = write_transaction(SqliteTx(db), scheduler.run_scheduler, (T, 5, 0.035))
    finally:
        db.close()
    assert (fired, more) == (5 * chunks, True)
    assert len(await inbox.events("pending", limit=100)) == 5 * chunks
    assert await inbox.run_scheduler(now=T) == 60 - 5 * chunks  # the rest, in later ones


def _temporary_files() -> list[str]:
    """The temporary files SQLite holds open in this process (created and unlinked at once:
    only the process's open files name them)."""
    found = []
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            if "etilqs_" in os.readlink(f"/proc/self/fd/{fd}"):
                found.append(fd)
    return found


@pytest.mark.skipif(
    not os.path.isdir("/proc/self/fd"), reason="needs /proc to see a process's open files"
)
async def test_a_pass_keeps_its_undo_pages_in_memory_and_a_prune_does_not(inbox, path, monkeypatch):
    # What a chunk's savepoint may have to undo is bounded (CHUNK timers), so the pass keeps
    # it in memory instead of a temporary file per chunk. A write nobody bounds (a prune of a
    # million payloads) must still journal to a file: the next such write sets the default
    # again before it begins, also after a pass that failed.
    for i in range(2 * scheduler.CHUNK):
        await inbox.add_timer(f"t-{i:04d}", T - i, {"i": i})
    seen = []
    fire = scheduler.run_scheduler

    def watched(tx, *args):
        fired = fire(tx, *args)
        seen.append((tx.conn.execute("PRAGMA temp_store").fetchone()[0], _temporary_files()))
        return fired

    monkeypatch.setattr(scheduler, "run_scheduler", watched)
    assert await inbox.run_scheduler(now=T) == 2 * scheduler.CHUNK
    assert seen and all(setting == 2 and files == [] for setting, files in seen)  # 2: MEMORY

    def failing(tx, *args):
        seen.append(tx.conn.execute("PRAGMA temp_store").fetchone()[0])
        raise RuntimeError("the pass broke")

    await inbox.add_timer("late", T, None)
    monkeypatch.setattr(scheduler, "run_scheduler", failing)
    with pytest.raises(RuntimeError):
        await inbox.run_scheduler(now=T)
    assert seen[-1] == 2

    # The next write nobody bounds (a prune: its UPDATE journals what it changes) after the
    # pass and after the failed one: on a file again (0: the default, FILE).
    prune = intake.prune_payloads

    def pruning(tx, *args):
        seen.append(tx.conn.execute("PRAGMA temp_store").fetchone()[0])
        return prune(tx, *args)

    monkeypatch.setattr(intake, "prune_payloads", pruning)
    assert await inbox.prune_payloads(T, now=T) == 0
    assert seen[-1] == 0
