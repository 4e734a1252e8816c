"""Class 14: a script that forgets close() and raises must still exit, with its events kept."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = textwrap.dedent("""
    import asyncio
    from onwatch.core import Inbox

    async def main(path):
        box = await Inbox.open(path)
        await box.ingest("chat", "m1", {{"text": "kept"}})
        raise RuntimeError("the agent script crashed")  # no close()

    asyncio.run(main({path!r}))
""")


def test_a_script_that_raises_without_close_exits(tmp_path):
    path = str(tmp_path / "inbox.db")
    process = subprocess.run(
        [sys.executable, "-c", SCRIPT.format(path=path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert process.returncode == 1
    assert "the agent script crashed" in process.stderr
    db = sqlite3.connect(path)
    try:
        assert db.execute("SELECT source_id FROM events").fetchall() == [("m1",)]
    finally:
        db.close()


def test_the_connection_thread_is_a_daemon(tmp_path):
    import asyncio

    from onwatch.core import Inbox

    async def main():
        box = await Inbox.open(str(tmp_path / "inbox.db"))
        try:
            assert box._db._conn._thread.daemon  # the hook core/db.py relies on exists
        finally:
            await box.close()

    asyncio.run(main())
