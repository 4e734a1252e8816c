"""The Inbox API when the files beside an inbox file are deleted or replaced under it
(core/sqlite/files.py): what `file_replaced()`, a write, a duplicate answered without a write,
a read and a second open in the same process do. The stories with several processes are in
tests/durability/test_wal_deleted.py.
"""

from __future__ import annotations

import os
import shutil
import sqlite3

import pytest

from onwatch.core import FakeClock, FileLost, Inbox

from .conftest import T


def delete_log(path: str) -> None:
    for side in ("-wal", "-shm"):
        os.unlink(path + side)


@pytest.fixture
async def box(tmp_path):
    path = str(tmp_path / "inbox.db")
    await (await Inbox.open(path)).close()  # the schema in the file itself
    inbox = await Inbox.open(path, clock=FakeClock(T))
    yield inbox
    await inbox.close()


async def test_file_replaced_names_a_deleted_log_and_the_connection_stops(box):
    assert await box.ingest("chat", "e1", None)
    assert box.file_replaced() is None
    delete_log(box.path)
    why = box.file_replaced()
    assert why is not None and "inbox.db-wal was deleted" in why
    with pytest.raises(FileLost, match="copied into the inbox file") as lost:
        await box.ingest("chat", "e2", None)
    assert lost.value.recovered
    with pytest.raises(FileLost):
        await box.counts()  # reads stop too: they would read a log nobody else has
    assert "copied into the inbox file" in box.file_replaced()
    db = sqlite3.connect(box.path)
    try:
        assert db.execute("SELECT source_id FROM events").fetchall() == [("e1",)]
    finally:
        db.close()


async def test_a_commit_that_went_to_the_deleted_log_stands_once_recovered(box):
    assert await box.ingest("chat", "e1", None)
    gen = await box.acquire("W")
    # Deleted while the next write is on its way: it commits to the orphaned log, the look
    # after the commit finds out, and the log (this commit with it) is copied into the file.
    guard = box._db._guard
    seen = guard.lost
    calls = []

    def lost_after_first_look() -> str | None:
        calls.append(1)
        if len(calls) == 1:
            answer = seen()
            delete_log(box.path)
            return answer
        return seen()

    guard.lost = lost_after_first_look
    [event] = await box.claim_batch("W", gen)  # committed, recovered: it stands
    assert event.source_id == "e1"
    with pytest.raises(FileLost):
        await box.finish("W", gen, [event.id], ["done"], run=event.run_id)
    db = sqlite3.connect(box.path)
    try:
        assert db.execute("SELECT status FROM events").fetchall() == [("running",)]
    finally:
        db.close()


async def test_a_known_duplicate_is_not_answered_from_a_lost_log(box):
    assert await box.ingest("chat", "e1", None)
    assert await box.ingest("chat", "e1", None) is False  # answered by a read, no write
    delete_log(box.path)
    with pytest.raises(FileLost):
        await box.ingest("chat", "e1", None)


async def test_the_same_process_cannot_open_the_file_again_while_its_orphan_lives(box):
    assert await box.ingest("chat", "e1", None)
    delete_log(box.path)
    with pytest.raises(FileLost, match="cannot open it again until it is restarted"):
        await Inbox.open(box.path)
    assert not os.path.exists(box.path + "-wal")  # and it made no second log trying
    await box.close()  # set aside, not closed: still no second open in this process
    with pytest.raises(FileLost, match="cannot open it again until it is restarted"):
        await Inbox.open(box.path)


async def test_a_replaced_file_is_a_new_inode_and_may_be_opened_beside_the_orphan(box, tmp_path):
    assert await box.ingest("chat", "e1", None)
    replacement = str(tmp_path / "other.db")
    await (await Inbox.open(replacement)).close()
    shutil.move(replacement, box.path)  # the file itself replaced: a restore, say
    assert "replaced by another file" in box.file_replaced()
    async with await Inbox.open(box.path) as fresh:
        assert await fresh.ingest("chat", "new", None)
        assert box.file_replaced() is not None
    with pytest.raises(FileLost):
        await box.ingest("chat", "e2", None)
