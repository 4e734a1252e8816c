"""An inbox opened through a symlink: SQLite keeps its -wal and -shm beside the file the link
points to, so that is where the wake-up watches and where the files are checked
(core/sqlite/wake.py, core/sqlite/files.py)."""

from __future__ import annotations

import asyncio
import os
import sys

import pytest

from onwatch.core import FileLost, Inbox
from tests.worker.helpers import onwatch

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="file notification is Linux's")


@pytest.fixture
def linked(tmp_path) -> tuple[str, str]:
    """(the inbox file, a symlink to it in another folder)."""
    (tmp_path / "data").mkdir()
    (tmp_path / "links").mkdir()
    real = str(tmp_path / "data" / "inbox.db")
    link = str(tmp_path / "links" / "inbox.db")
    assert onwatch("init", real).returncode == 0
    os.symlink(real, link)
    return real, link


async def test_another_process_commit_wakes_a_waiter_that_opened_the_link(linked):
    real, link = linked
    async with await Inbox.open(link) as inbox:
        assert inbox.wake.watching
        seen = inbox.wake.seq
        waiting = asyncio.ensure_future(inbox.wake.wait(seen, 10))
        await asyncio.sleep(0.1)  # the watch is armed while someone waits
        # Another process commits through the file's own path.
        done = await asyncio.to_thread(onwatch, "ingest", real, "chat", "m1")
        assert done.stdout == "stored\n"
        assert await waiting is True  # woken by the notification, not by the 10 s timeout
        assert await inbox.wake.confirm(inbox.change_token, (-1, -1))
        assert [e.source_id for e in await inbox.events("pending")] == ["m1"]


async def test_the_log_beside_the_target_is_the_one_checked(linked):
    real, link = linked
    async with await Inbox.open(link) as inbox:
        assert await inbox.ingest("chat", "e1", None)
        assert os.path.exists(real + "-wal") and not os.path.exists(link + "-wal")
        assert inbox.file_replaced() is None
        os.unlink(real + "-wal")
        os.unlink(real + "-shm")
        assert "data/inbox.db-wal was deleted" in inbox.file_replaced()
        with pytest.raises(FileLost):
            await inbox.ingest("chat", "e2", None)
