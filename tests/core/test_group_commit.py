"""Group commit (core/inbox.py _GroupCommit, core/db.py write_soon/peek): per-caller results
and errors, cancellation, failure of a whole transaction, close, and the duplicate fast path."""

from __future__ import annotations

import asyncio
import sqlite3

import pytest

from onwatch.core import BadInput, Inbox, InboxBusy, InboxError

from .conftest import is_postgresql, raw_sql

pytestmark = pytest.mark.backends  # the conformance suite: once per backend

T = 1_000_000


@pytest.fixture(params=[False, True], ids=["thread", "loop_writes"])
def on_loop(request) -> bool:
    """Every test runs with Inbox.loop_writes off (the default) and on (a lone ingest then
    commits on the event loop's thread, a storm still as one group on the connection's;
    PostgreSQL ignores it)."""
    return bool(request.param)


@pytest.fixture
async def box(path, on_loop):
    inbox = await Inbox.open(path)
    inbox.loop_writes = on_loop
    yield inbox
    await inbox.close()


def _count_transactions(box: Inbox) -> list[int]:
    """Record the size of every group-commit transaction sent from now on."""
    sizes: list[int] = []
    real = box._db.write_soon

    def spy(fn, args, done):
        sizes.append(len(args[0]))
        return real(fn, args, done)

    box._db.write_soon = spy
    real_alone = box._db.write_soon_alone  # a lone ingest (one statement where it can)

    def spy_alone(alone, fn, args, done):
        sizes.append(len(args[0]))
        return real_alone(alone, fn, args, done)

    box._db.write_soon_alone = spy_alone
    real_here = box._db.write_here_alone  # a lone ingest on the loop's thread (loop_writes)

    def spy_here(alone, fn, args):
        done, result = real_here(alone, fn, args)
        if done:
            sizes.append(len(args[0]))
        return done, result

    box._db.write_here_alone = spy_here
    return sizes


async def test_a_storm_shares_transactions_and_a_lone_caller_goes_at_once(box):
    sizes = _count_transactions(box)
    assert await box.ingest("hook", "alone", None, now=T) is True
    assert sizes == [1]
    results = await asyncio.gather(
        *(box.ingest("hook", f"k{i}", {"i": i}, now=T) for i in range(50))
    )
    assert results == [True] * 50
    assert sum(sizes) == 51 and len(sizes) < 10  # shared, not one commit each
    assert (await box.counts())["pending"] == 51


async def test_one_bad_item_fails_alone_inside_a_shared_transaction(box, path):
    other = await Inbox.open(path)  # lowers the limit behind this inbox's back
    await other.configure(max_payload_bytes=100)
    await other.close()
    items = [{"i": i} for i in range(20)]
    items[7] = {"big": "x" * 500}  # passes this inbox's stale check, fails in the transaction
    results = await asyncio.gather(
        *(box.ingest("hook", f"k{i}", p, now=T) for i, p in enumerate(items)),
        return_exceptions=True,
    )
    assert isinstance(results[7], BadInput)
    assert [r for i, r in enumerate(results) if i != 7] == [True] * 19
    assert (await box.counts())["pending"] == 19


async def test_a_cancelled_caller_does_not_disturb_the_others(box):
    tasks = [asyncio.create_task(box.ingest("hook", f"k{i}", None, now=T)) for i in range(20)]
    await asyncio.sleep(0)
    tasks[3].cancel()
    tasks[15].cancel()
    results = await asyncio.gather(*tasks, return_exceptions=True)
    assert isinstance(results[3], asyncio.CancelledError)
    assert [r for i, r in enumerate(results) if i not in (3, 15)] == [True] * 18
    assert await box.ingest("hook", "after", None, now=T) is True
    assert (await box.counts())["pending"] >= 19  # a cancelled ingest may have committed


async def test_a_failed_transaction_reaches_every_caller_in_it_and_intake_recovers(
    tmp_path, on_loop
):
    path = str(tmp_path / "inbox.db")
    box = await Inbox.open(path, busy_timeout=0.2)
    box.loop_writes = on_loop
    try:
        blocker = sqlite3.connect(path, isolation_level=None)
        blocker.execute("BEGIN IMMEDIATE")  # another process holds the write lock
        results = await asyncio.gather(
            *(box.ingest("hook", f"k{i}", None, now=T) for i in range(10)), return_exceptions=True
        )
        assert all(isinstance(r, InboxBusy) for r in results), results
        blocker.execute("ROLLBACK")
        blocker.close()
        assert await box.ingest("hook", "k1", None, now=T) is True
        assert (await box.counts())["pending"] == 1
    finally:
        await box.close()


async def test_close_waits_for_ingests_in_flight_and_later_ones_are_refused(tmp_path, on_loop):
    path = str(tmp_path / "inbox.db")
    box = await Inbox.open(path)
    box.loop_writes = on_loop
    tasks = [asyncio.create_task(box.ingest("hook", f"k{i}", None, now=T)) for i in range(30)]
    await asyncio.sleep(0)
    await box.close()
    assert await asyncio.gather(*tasks) == [True] * 30
    with pytest.raises(InboxError):
        await box.ingest("hook", "late", None, now=T)
    reopened = await Inbox.open(path)
    assert (await reopened.counts())["pending"] == 30
    await reopened.close()


async def test_a_known_duplicate_is_answered_without_a_write_transaction(box, path):
    assert await box.ingest("hook", "d1", {"v": 1}, now=T) is True
    sizes = _count_transactions(box)
    assert await box.ingest("hook", "d1", {"v": 2}, now=T) is False
    # On PostgreSQL the look-up would be a network round trip on the event loop's thread,
    # so the duplicate takes the write path; the answer is the same.
    assert sizes == ([1] if is_postgresql(path) else [])
    event = (await box.events("pending"))[0]
    assert event.payload == {"v": 1}


@pytest.mark.parametrize(
    "payload, now, message",
    [
        ({"when": object()}, T, "JSON-serialisable"),
        ({"ratio": float("nan")}, T, "JSON-serialisable"),
        ({"text": "x" * 200}, T, "the limit is 100"),
        ({"items": ["x" * 30] * 5}, T, "the limit is 100"),
        ({"v": 1}, 1.5, "now must be an integer"),
    ],
)
async def test_a_known_duplicate_with_bad_input_is_refused_like_a_new_event(
    box, payload, now, message
):
    """The duplicate is answered without a transaction, and its payload (never stored) is
    checked without encoding where that is certain; bad input is still refused."""
    await box.configure(max_payload_bytes=100)
    assert await box.ingest("hook", "d1", {"v": 1}, now=T) is True
    with pytest.raises(BadInput, match=message):
        await box.ingest("hook", "d1", payload, now=now)
    with pytest.raises(BadInput, match=message):
        await box.ingest("hook", "new", payload, now=now)
    assert await box.ingest("hook", "d1", {"v": 2}, now=T) is False
    assert [e.payload for e in await box.events("pending")] == [{"v": 1}]


async def test_the_duplicate_fast_path_checks_the_file_not_a_memory(box, path):
    """If the row went away (another process), the key is stored again, not refused."""
    assert await box.ingest("hook", "d1", None, now=T) is True
    raw_sql(path, "DELETE FROM events WHERE source = 'hook' AND source_id = 'd1'")
    assert await box.ingest("hook", "d1", None, now=T) is True
    assert (await box.counts())["pending"] == 1


async def test_the_duplicate_fast_path_never_waits_for_a_writer(tmp_path, on_loop):
    path = str(tmp_path / "inbox.db")
    box = await Inbox.open(path, busy_timeout=60)
    box.loop_writes = on_loop
    try:
        assert await box.ingest("hook", "d1", None, now=T) is True
        blocker = sqlite3.connect(path, isolation_level=None)
        blocker.execute("BEGIN IMMEDIATE")
        blocker.execute(
            "INSERT INTO events(source, source_id, available_at, created, updated) "
            "VALUES ('x', 'y', 1, 1, 1)"
        )  # uncommitted, holding the write lock
        # A writer waits up to 60 s for the lock; the duplicate is answered without it.
        assert await asyncio.wait_for(box.ingest("hook", "d1", None, now=T), 15) is False
        blocker.execute("ROLLBACK")
        blocker.close()
    finally:
        await box.close()


async def test_duplicates_in_one_storm_get_one_true_each_key(box):
    keys = [f"k{i % 7}" for i in range(70)]
    results = await asyncio.gather(*(box.ingest("hook", k, None, now=T) for k in keys))
    assert sum(results) == 7
    for key in set(keys):
        assert sum(r for k, r in zip(keys, results, strict=True) if k == key) == 1


async def test_a_key_repeated_in_one_storm_keeps_its_first_copy(box):
    await box.ingest("hook", "before", "stored before", now=T)
    keys = ["before", "a", "b", "a", "c", "b", "a"]
    results = await asyncio.gather(
        *(box.ingest("hook", k, f"copy {i}", now=T) for i, k in enumerate(keys))
    )
    assert results == [False, True, True, False, True, False, False]
    stored = {e.source_id: e.payload for e in await box.events("pending")}
    assert stored == {"before": "stored before", "a": "copy 1", "b": "copy 2", "c": "copy 4"}
