"""core.fleet: summaries read read-only in one transaction, unchanged files not read again."""

from __future__ import annotations

import os
import subprocess
import sys

from onwatch.core import FakeClock, Inbox
from onwatch.core.fleet import FolderFleet, read_summary

T0 = 1_700_000_000


def age(path: str, seconds: int = 60) -> None:
    """Make a file (and its WAL) look written a while ago, as a settled inbox does."""
    for name in (path, path + "-wal"):
        if os.path.exists(name):
            stat = os.stat(name)
            os.utime(name, ns=(stat.st_atime_ns, stat.st_mtime_ns - seconds * 10**9))


async def test_only_changed_inboxes_are_read_again(tmp_path):
    clock = FakeClock(T0)
    for name in ("a", "b", "c"):
        async with await Inbox.open(str(tmp_path / f"{name}.db"), clock=clock) as inbox:
            await inbox.ingest("chat", "1", {"text": "hi"})
    for name in ("a", "b", "c"):
        age(str(tmp_path / f"{name}.db"))
    fleet = FolderFleet(tmp_path)
    first = fleet.scan(T0, {})
    assert first.read == {"a.db", "b.db", "c.db"}
    assert first.summaries["a.db"].pending == 1
    assert fleet.scan(T0, first.summaries).read == frozenset()
    async with await Inbox.open(str(tmp_path / "b.db"), clock=clock) as inbox:
        await inbox.request_approval("r-1", 600, "pay")
    second = fleet.scan(T0, first.summaries)
    assert second.read == {"b.db"}
    assert second.summaries["b.db"].waiting == 1
    assert second.summaries["b.db"].approvals[0].action == "pay"
    assert second.summaries["a.db"] is first.summaries["a.db"]
    os.remove(tmp_path / "c.db")
    assert fleet.scan(T0, second.summaries).removed == {"c.db"}
    # A forced read (after an answer from the desk) reads that file only.
    age(str(tmp_path / "b.db"))
    settled = fleet.scan(T0, second.summaries)
    assert fleet.scan(T0, settled.summaries, frozenset({"a.db"})).read == {"a.db"}


async def test_summary_of_runs_lease_and_outbox(tmp_path):
    clock = FakeClock(T0)
    path = str(tmp_path / "w.db")
    async with await Inbox.open(path, clock=clock) as inbox:
        await inbox.configure(backoff_base=1)
        for i, error in enumerate([None, "boom", None]):
            at = T0 - 1800 + i * 600
            await inbox.ingest("chat", f"m{i}", {}, now=at)
            gen = await inbox.acquire("w", now=at)
            batch = await inbox.claim_batch("w", gen, now=at)
            await inbox.finish(
                "w", gen, [e.id for e in batch], ["r"] if not error else [], error=error, now=at + 1
            )
        await inbox.hold_outbox(now=T0)
    summary = read_summary(path, "w.db", "w", T0)
    assert summary.problem is None and summary.lease.holder == "w"
    assert [(runs, bad) for _, runs, bad in summary.activity] == [(1, 0), (1, 1), (1, 0)]
    assert summary.last_run.outcome == "done" and summary.held == 2 and summary.outbox_held


def test_a_summary_read_never_writes_a_foreign_file(tmp_path):
    path = tmp_path / "other.sqlite"
    subprocess.run(
        [
            sys.executable,
            "-c",
            f"import sqlite3; d = sqlite3.connect({str(path)!r}); "
            "d.execute('PRAGMA journal_mode=DELETE'); d.execute('CREATE TABLE x (y)'); "
            "d.commit()",
        ],
        check=True,
    )
    before = path.read_bytes()
    summary = read_summary(str(path), "other.sqlite", "other", T0)
    assert "not an onwatch inbox (tables: x)" in summary.problem
    assert path.read_bytes() == before
    assert sorted(os.listdir(tmp_path)) == ["other.sqlite"]
