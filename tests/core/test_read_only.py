"""Reads work where writes cannot (docs/rules.md#many-processes-one-file): a backup, a
snapshot, an auditor's account, a read-only mount. The reads (`status`, `events`, `show`,
`audit`, the desk with --read-only) show the inbox; a write says the file is read-only; the
file is left as it was.

A reader that may not write is made for real: as root, the commands run as `nobody` on files
root owns (a folder and a file it may read, not write); otherwise the file and its folder are
made read-only for the user running the tests.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

from onwatch.core import FakeClock, Inbox, ReadOnlyInbox
from onwatch.core.sqlite.schema import SCHEMA_VERSION
from tests.worker.helpers import ROOT, env, onwatch

from .conftest import T

AS_ROOT = os.geteuid() == 0
NOBODY_GROUP = pwd.getpwnam("nobody").pw_gid if AS_ROOT else None


def digest(path: str) -> str:
    with open(path, "rb") as handle:
        return hashlib.sha256(handle.read()).hexdigest()


@pytest.fixture
def folder():
    """A folder a reader without write access can reach. Not under pytest's own temporary
    folder: every pytest session started on the machine makes that private to its user
    again, which would lock the reader out mid-test."""
    made = Path(tempfile.mkdtemp(prefix="onwatch-read-only-"))
    os.chmod(made, 0o755)
    yield made
    os.chmod(made, 0o755)
    for name in os.listdir(made):
        os.chmod(made / name, 0o644)
    shutil.rmtree(made)


def lock_down(folder, path: str) -> None:
    """The file and its folder: readable, not writable, by whoever runs `reader`."""
    os.chmod(path, 0o644 if AS_ROOT else 0o444)
    os.chmod(folder, 0o755 if AS_ROOT else 0o555)


def reader(*args: str, script: str | None = None, **environ: str) -> subprocess.CompletedProcess:
    """A command (or a Python script) run by a user that may read but not write."""
    command = [sys.executable, "-c", script] if script else [sys.executable, "-m", "onwatch"]
    return subprocess.run(
        [*command, *args],
        cwd=ROOT,
        env=env("/tmp", HOME="/tmp", **environ),
        capture_output=True,
        text=True,
        timeout=60,
        # nobody in its own group only: in root's group it would get root's group bits.
        **({"user": "nobody", "group": NOBODY_GROUP, "extra_groups": []} if AS_ROOT else {}),
    )


@pytest.fixture
def inbox_file(folder) -> str:
    path = str(folder / "audit.db")
    assert onwatch("init", path).returncode == 0
    assert onwatch("ingest", path, "chat", "ÉCOLE-1", '{"text": "bonjour"}').returncode == 0
    assert onwatch("approve", path, "r1").returncode == 1  # an audit entry (not applied)
    lock_down(folder, path)
    return path


def test_reads_work_on_a_file_this_user_may_not_write(inbox_file):
    before = digest(inbox_file)
    status = reader("status", inbox_file, "--json")
    assert status.returncode == 0, status.stderr
    assert json.loads(status.stdout)["counts"]["pending"] == 1
    events = reader("events", inbox_file, "--json")
    assert [e["source_id"] for e in json.loads(events.stdout)] == ["ÉCOLE-1"]
    show = reader("show", inbox_file, "1")
    assert show.returncode == 0 and "bonjour" in show.stdout, show.stderr
    audit = reader("audit", inbox_file, "--json")
    assert audit.returncode == 0 and "approval r1" in audit.stdout, audit.stderr
    assert digest(inbox_file) == before
    assert sorted(os.listdir(os.path.dirname(inbox_file))) == ["audit.db"]


def test_a_write_says_the_file_is_read_only_and_changes_nothing(inbox_file):
    before = digest(inbox_file)
    for args in (
        ("ingest", inbox_file, "chat", "x"),
        ("approve", inbox_file, "r1"),
        ("pause", inbox_file),
    ):
        result = reader(*args)
        assert result.returncode == 1, (args, result)
        assert "read-only" in result.stderr and "not a usable inbox" not in result.stderr, (
            args,
            result.stderr,
        )
    # The file has this release's schema: nothing to migrate, which needs no write (it
    # said "cannot write to …, which is read-only", exit 1).
    migrate = reader("migrate", inbox_file)
    assert migrate.returncode == 0, migrate.stderr
    assert migrate.stdout == f"already at schema {SCHEMA_VERSION}: {inbox_file}\n"
    # A receiver would refuse every delivery: it does not start.
    serve = reader("serve", inbox_file, "--port", "0", ONWATCH_GITHUB_SECRET="s3cret")
    assert serve.returncode == 1, serve.stderr
    assert f"cannot store deliveries: {inbox_file} is read-only" in serve.stderr, serve.stderr
    worker = reader("worker", inbox_file, "--agent", "tests.worker.agents:echo")
    assert worker.returncode != 0 and "read-only" in worker.stderr, worker.stderr
    # The file is of this release's schema: nothing to migrate, and none is said.
    assert f"cannot write to {inbox_file}, which is read-only" in worker.stderr, worker.stderr
    assert digest(inbox_file) == before


def test_an_older_file_that_cannot_be_written_cannot_be_migrated(folder):
    import sqlite3

    from onwatch.core.sqlite import schema

    path = str(folder / "old.db")
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("PRAGMA journal_mode = WAL")
    schema.migrate(db, path, target=SCHEMA_VERSION - 1)
    db.close()
    lock_down(folder, path)
    before = digest(path)
    migrate = reader("migrate", path)
    assert migrate.returncode == 1, migrate
    assert f"cannot migrate {path}, which is read-only" in migrate.stderr, migrate.stderr
    assert digest(path) == before


def test_a_reader_sees_a_live_inbox_through_its_log(folder):
    """The auditor's case: a worker has the inbox open (its commits still in the -wal);
    the auditor may read the -wal and -shm, not write them."""
    path = str(folder / "live.db")
    assert onwatch("init", path).returncode == 0
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent(
                """
                import asyncio, sys
                from onwatch.core import Inbox
                async def main():
                    box = await Inbox.open(sys.argv[1])
                    await box.ingest("chat", "in-the-log", None)
                    print("ready", flush=True)
                    sys.stdin.readline()
                    await box.close()
                asyncio.run(main())
                """
            ),
            path,
        ],
        cwd=ROOT,
        env=env("/tmp"),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline() == "ready\n"
        lock_down(folder, path)
        events = reader("events", path, "--json")
        assert events.returncode == 0, events.stderr
        assert [e["source_id"] for e in json.loads(events.stdout)] == ["in-the-log"]
    finally:
        os.chmod(folder, 0o755)
        holder.communicate("\n", timeout=20)


def test_the_desk_read_only_shows_a_file_it_may_not_write(inbox_file):
    script = textwrap.dedent(
        """
        import asyncio, sys
        from onwatch.core import Inbox
        from onwatch.tui.app import OnwatchApp

        async def main(path):
            inbox = await Inbox.open(path, create=False, read_only=True)
            app = OnwatchApp(inbox, read_only=True)
            async with app.run_test(size=(120, 40)) as pilot:
                await asyncio.wait_for(app.loaded.wait(), 20)
                for _ in range(200):
                    rows = [r.source_id for r in app.pane("pending").records()]
                    if rows:
                        break
                    await pilot.pause(0.05)
                print(rows, flush=True)
            await inbox.close()

        asyncio.run(main(sys.argv[1]))
        """
    )
    before = digest(inbox_file)
    result = reader(inbox_file, script=script)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "['ÉCOLE-1']"
    assert digest(inbox_file) == before


async def test_opened_read_only_every_write_is_refused_and_nothing_is_written(tmp_path):
    path = str(tmp_path / "inbox.db")
    async with await Inbox.open(path, clock=FakeClock(T)) as box:
        await box.ingest("chat", "e1", None)
    before = digest(path)
    async with await Inbox.open(path, read_only=True) as box:
        assert box.read_only is not None and "opened read-only" in box.read_only
        assert [e.source_id for e in await box.events("pending")] == ["e1"]
        for write in (
            box.ingest("chat", "e2", None),
            box.acquire("W"),
            box.pause(),
            box.run_scheduler(),
            box.configure(max_attempts=5),
        ):
            with pytest.raises(ReadOnlyInbox, match="read-only"):
                await write
    assert digest(path) == before


def test_a_reader_that_may_not_write_is_told_of_a_held_back_log(folder):
    """Its look cannot run SQLite's checkpoint (that writes the file): the log's size alone
    tells, and the look must not fail the reader's status."""
    from tests.faults.test_held_back import LARGE, grow, read_held_open

    path = folder / "held.db"
    assert onwatch("init", str(path)).returncode == 0

    async def grown() -> None:
        async with await Inbox.open(path) as box:
            await grow(box, path, "a")

    script = textwrap.dedent(
        f"""
        import asyncio, sys
        from onwatch.core import Inbox
        from onwatch.core.sqlite import tx
        tx.WAL_LARGE = {LARGE}

        async def main(path):
            async with await Inbox.open(path, read_only=True) as box:
                print(await box.held_back())

        asyncio.run(main(sys.argv[1]))
        """
    )
    with read_held_open(path):
        asyncio.run(grown())
        lock_down(folder, str(path))
        told = reader(str(path), script=script)
    assert told.returncode == 0, told.stderr
    assert "cannot be copied back into the inbox file" in told.stdout, told.stdout
