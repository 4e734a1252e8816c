"""The inbox's -wal and -shm deleted under live processes (a clean-up script, an operator who
thinks the log is "huge"): nothing acknowledged is lost, nothing is done twice
(docs/rules.md#many-processes-one-file, core/sqlite/files.py).

Real processes on a real file: a worker, the command line, a process that holds the inbox
open and writes only when told to (so that it has not noticed yet when others act), and a
process that is no onwatch at all (plain sqlite3, as an older tool or a backup script would
open the file).
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from tests.worker.helpers import ROOT, env, log_of, onwatch, query, start_worker, stop, wait_for

pytestmark = pytest.mark.slow

# Holds the inbox open; on each line of stdin ingests that key and prints what happened.
HOLDER = r"""
import asyncio, json, sys
from onwatch.core import Inbox, InboxError

async def main(path):
    box = await Inbox.open(path)
    print("ready", flush=True)
    loop = asyncio.get_running_loop()
    while True:
        line = await loop.run_in_executor(None, sys.stdin.readline)
        key = line.strip()
        if not key:
            break
        try:
            stored = await box.ingest("chat", key, {"key": key})
            print(json.dumps({"key": key, "stored": stored}), flush=True)
        except InboxError as exc:
            print(json.dumps({"key": key, "error": type(exc).__name__, "text": str(exc),
                              "recovered": getattr(exc, "recovered", None)}), flush=True)
    await box.close()
    print("closed", flush=True)

asyncio.run(main(sys.argv[1]))
"""


class Holder:
    def __init__(self, path: str) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-c", HOLDER, path],
            cwd=ROOT,
            env=env("/tmp"),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert self.readline() == "ready", self.process.stderr.read()  # type: ignore[union-attr]

    def readline(self) -> str:
        line = self.process.stdout.readline()  # type: ignore[union-attr]
        assert line, f"the holder died: {self.process.stderr.read()}"  # type: ignore[union-attr]
        return line.strip()

    def ingest(self, key: str) -> dict:
        self.process.stdin.write(key + "\n")  # type: ignore[union-attr]
        self.process.stdin.flush()  # type: ignore[union-attr]
        return json.loads(self.readline())

    def finish(self) -> str:
        self.process.stdin.write("\n")  # type: ignore[union-attr]
        self.process.stdin.flush()  # type: ignore[union-attr]
        assert self.readline() == "closed"
        assert self.process.wait(20) == 0
        return self.process.stderr.read()  # type: ignore[union-attr]


def delete_log(path: str) -> None:
    for side in ("-wal", "-shm"):
        os.unlink(path + side)


def keys(path: str) -> set[str]:
    return {key for (key,) in query(path, "SELECT source_id FROM events")}


def intact(path: str) -> None:
    assert query(path, "PRAGMA integrity_check") == [("ok",)]


def test_a_worker_notices_recovers_what_it_committed_and_stops_then_nothing_runs_twice(tmp_path):
    path = str(tmp_path / "inbox.db")
    assert onwatch("init", path, "outbox_gap=0", "lease_ttl=4").returncode == 0
    sent = tmp_path / "sent.jsonl"
    worker = start_worker(path, "echo", tmp_path, "--file", str(sent), holder="w1", name="w1")
    try:
        assert onwatch("ingest", path, "chat", "e1").stdout == "stored\n"
        wait_for(lambda: sent.exists() and sent.read_text().count("\n") == 1, what="e1's reply")
        delete_log(path)
        # The worker hears the deletion (or sees it at its next look), copies its log into
        # the file (nobody else opened the inbox since) and stops, saying so.
        code = worker.wait(30)
    finally:
        if worker.poll() is None:
            stop(worker)
    log = log_of(tmp_path, "w1")
    assert code != 0, log
    assert "inbox.db-wal was deleted" in log and "copied into the inbox file" in log, log
    intact(path)
    # The next command sees everything the worker had committed: e1 done, its lease.
    assert onwatch("ingest", path, "chat", "e2").stdout == "stored\n"
    second = start_worker(path, "echo", tmp_path, "--file", str(sent), holder="w2", name="w2")
    try:
        wait_for(
            lambda: query(path, "SELECT status FROM events WHERE source_id = 'e2'") == [("done",)],
            timeout=30,  # after the first worker's lease ran out (lease_ttl 4 s)
            what="e2 done by the second worker",
        )
        wait_for(lambda: sent.read_text().count("\n") == 2, what="e2's reply")
    finally:
        assert stop(second) == 0, log_of(tmp_path, "w2")
    replies = [json.loads(line)["text"] for line in sent.read_text().splitlines()]
    assert sorted(replies) == ["reply chat/e1", "reply chat/e2"]  # e1 never ran twice
    assert query(path, "SELECT gen, holder FROM lease_history ORDER BY gen") == [
        (1, "w1"),
        (2, "w2"),
    ]
    assert keys(path) == {"e1", "e2"}
    intact(path)


def test_an_opener_waits_for_the_process_that_has_not_noticed_and_refuses_in_the_end(tmp_path):
    path = str(tmp_path / "inbox.db")
    assert onwatch("init", path).returncode == 0
    holder = Holder(path)
    assert holder.ingest("e1") == {"key": "e1", "stored": True}
    delete_log(path)
    # The holder has not looked yet: a new process would start a second log, without e1.
    refused = onwatch("ingest", path, "chat", "x1", "--busy-timeout", "1")
    assert refused.returncode == 1, refused
    assert "deleted while process" in refused.stderr and str(holder.process.pid) in refused.stderr
    assert "stored" not in refused.stdout
    # The holder's next call finds out: nobody opened the inbox since, so its log is copied
    # into the file; it stops.
    lost = holder.ingest("e2")
    assert lost["error"] == "FileLost" and lost["recovered"] is True, lost
    assert "copied into the inbox file" in lost["text"]
    holder.finish()  # its connection is set aside, never closed (nothing is checkpointed)
    assert onwatch("ingest", path, "chat", "x1").stdout == "stored\n"
    assert keys(path) == {"e1", "x1"}  # e1, acknowledged before the deletion, is kept
    intact(path)


def test_an_orphaned_log_is_never_checkpointed_over_another_processs_commits(tmp_path):
    path = str(tmp_path / "inbox.db")
    assert onwatch("init", path).returncode == 0
    holder = Holder(path)
    assert holder.ingest("e1") == {"key": "e1", "stored": True}
    delete_log(path)
    # A process that is not onwatch (a script, an older tool) opens the file meanwhile: it
    # starts a new log beside the file, and commits to it.
    other = sqlite3.connect(path, isolation_level=None)
    other.execute(
        "INSERT INTO events(source, source_id, payload, available_at, created, updated) "
        "VALUES ('chat', 'p1', 'null', 1, 1, 1)"
    )
    other.close()  # not the last connection (the holder's holds the file): the log stays
    assert Path(path + "-wal").exists()
    lost = holder.ingest("e2")
    assert lost["error"] == "FileLost" and lost["recovered"] is False, lost
    assert "NOT copied" in lost["text"]
    holder.finish()
    # The holder's close did not checkpoint its own log over the file, nor unlink the new
    # one by name: p1 is there. (e1 stayed in the holder's deleted log, as its log said.)
    assert "p1" in keys(path)
    intact(path)


def test_commands_refuse_while_the_log_is_gone_and_never_answer_stored(tmp_path):
    path = str(tmp_path / "inbox.db")
    assert onwatch("init", path).returncode == 0
    holder = Holder(path)
    assert holder.ingest("e1")["stored"] is True
    delete_log(path)
    for args in (
        ("ingest", path, "chat", "x1"),
        ("status", path),
        ("approve", path, "r1"),
    ):
        result = onwatch(*args, "--busy-timeout", "0.5")
        assert result.returncode == 1, (args, result)
        assert "deleted while process" in result.stderr, (args, result.stderr)
    assert not Path(path + "-wal").exists()  # none of them made a second log
    holder.finish()
