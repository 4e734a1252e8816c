"""`onwatch notify`: each thing once, across the notifier's own restart (SIGTERM and
SIGKILL); a failing command logged and retried with backoff; more things than the rate allows
said in a digest; an inbox with work and no worker; an approval coming near its deadline;
a fleet folder; the command's document and environment."""

from __future__ import annotations

import asyncio
import json
import logging
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from onwatch.core import FakeClock, Inbox, InboxBusy
from onwatch.core.notify import DEADLINE_WARNING, Notifier, Watched

from tests.worker.helpers import env, kill_listed, stop

from .helpers import die, wait_for

pytestmark = pytest.mark.slow

# Appends each document to said.jsonl, one line each (stdin is one JSON line).
RECORD = "cat >> said.jsonl"


def start(target: str, test_dir: Path, *extra: str, command: str = RECORD) -> subprocess.Popen:
    args = [
        sys.executable,
        "-m",
        "onwatch",
        "notify",
        target,
        "--command",
        command,
        "--state",
        str(test_dir / "notify-state.db"),
        "--poll",
        "0.2",
        *extra,
    ]
    with open(test_dir / "notify.err", "ab") as err:
        return subprocess.Popen(args, cwd=test_dir, env=env(test_dir), stderr=err)


def said(test_dir: Path) -> list[dict]:
    path = test_dir / "said.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def recorded(test_dir: Path, n: int) -> bool:
    """The notifier's memory holds `n` things as said: a kill from now on repeats none of
    them. (Killed between running the command and recording it, it would say that one
    again: at least once, as documented.)"""
    db = sqlite3.connect(test_dir / "notify-state.db")
    try:
        return db.execute("SELECT count(*) FROM notices WHERE state = 'said'").fetchone()[0] >= n
    finally:
        db.close()


def notify_log(test_dir: Path) -> str:
    path = test_dir / "notify.err"
    return path.read_text(errors="replace") if path.exists() else ""


async def test_each_thing_is_said_once_across_the_notifiers_restart(tmp_path):
    path = str(tmp_path / "alice.db")
    async with await Inbox.open(path) as inbox:
        await inbox.configure(max_attempts=1)
        await inbox.request_approval("refund-1", 7200, "refund 5 EUR to \x1b]0;pwn\x07 bob")
    notifier = start(path, tmp_path)
    try:
        wait_for(lambda: len(said(tmp_path)) == 1, what="the waiting approval to be said")
        [first] = said(tmp_path)
        assert first["kind"] == "approval_waiting" and first["ids"] == {"request_id": "refund-1"}
        assert first["inbox"] == "alice" and first["target"] == path
        assert "refund 5 EUR to \\x1b]0;pwn\\x07 bob" in first["text"]  # escaped, one line
        assert first["deadline"] - first["at"] in range(7190, 7201)
        async with await Inbox.open(path, create=False) as inbox:
            await die(inbox, "m-1")
        wait_for(lambda: len(said(tmp_path)) == 2, what="the death to be said")
        assert said(tmp_path)[1]["kind"] == "event_dead"
        assert said(tmp_path)[1]["ids"]["event_id"] == 1
        assert stop(notifier) == 0
        # Restarted: nothing said again; what is new is said.
        notifier = start(path, tmp_path)
        async with await Inbox.open(path, create=False) as inbox:
            await inbox.request_approval("refund-2", 7200, "refund 9 EUR")
        wait_for(lambda: len(said(tmp_path)) == 3, what="the second approval")
        wait_for(lambda: recorded(tmp_path, 3), what="the memory to record it")
        # SIGKILL this time: what the memory holds is never said again.
        notifier.send_signal(signal.SIGKILL)
        notifier.wait(10)
        notifier = start(path, tmp_path)
        async with await Inbox.open(path, create=False) as inbox:
            await die(inbox, "m-2")
        wait_for(lambda: len(said(tmp_path)) == 4, what="the second death")
        wait_for(lambda: "watching" in notify_log(tmp_path))
    finally:
        assert stop(notifier) == 0, notify_log(tmp_path)
    keys = [doc["key"] for doc in said(tmp_path)]
    assert len(keys) == len(set(keys)) == 4
    assert [doc["kind"] for doc in said(tmp_path)] == [
        "approval_waiting",
        "event_dead",
        "approval_waiting",
        "event_dead",
    ]


async def test_a_failing_command_is_logged_and_retried_with_backoff(tmp_path):
    path = str(tmp_path / "alice.db")
    async with await Inbox.open(path) as inbox:
        await inbox.request_approval("r-1", 7200, "pay")
    # Fails twice (a counter file), then records the document.
    command = (
        "n=$(cat tries 2>/dev/null || echo 0); echo $((n + 1)) > tries; "
        'if [ "$n" -lt 2 ]; then echo "channel down \x1b[2J" >&2; exit 3; fi; ' + RECORD
    )
    notifier = start(path, tmp_path, "--retry-base", "1", command=command)
    try:
        wait_for(lambda: len(said(tmp_path)) == 1, timeout=30, what="the third try to succeed")
    finally:
        assert stop(notifier) == 0, notify_log(tmp_path)
    assert (tmp_path / "tries").read_text().strip() == "3"
    log = notify_log(tmp_path)
    assert log.count("the command failed (exit 3: channel down \\x1b[2J)") == 2
    assert "\x1b" not in log
    assert "trying again in 1 s (attempt 2 of 8)" in log
    assert "trying again in 2 s (attempt 3 of 8)" in log


async def test_a_command_is_waited_for_not_what_it_left_running(tmp_path):
    """Each try starts a daemon that leaves the command's process group and keeps its
    stderr (as a session bus started by `notify-send` may). The first try then hangs: it is
    killed at the timeout and the notifier goes on; the second exits 0 and has said it.
    (Reading stderr through a pipe, the notifier waited for the daemon after the kill, and
    said nothing more meanwhile.)"""
    path = str(tmp_path / "alice.db")
    async with await Inbox.open(path) as inbox:
        await inbox.request_approval("r-1", 7200, "pay")
    command = (
        "n=$(cat tries 2>/dev/null || echo 0); echo $((n + 1)) > tries; "
        "setsid sleep 60 & echo $! >> daemons; "
        'if [ "$n" -lt 1 ]; then exec sleep 60; fi; ' + RECORD
    )
    notifier = start(path, tmp_path, "--timeout", "1", "--retry-base", "1", command=command)
    try:
        wait_for(lambda: len(said(tmp_path)) == 1, timeout=30, what="the second try to succeed")
    finally:
        assert stop(notifier) == 0, notify_log(tmp_path)
        kill_listed(tmp_path / "daemons")
    assert (tmp_path / "tries").read_text().strip() == "2"
    assert notify_log(tmp_path).count("the command failed (it ran past 1 s and was killed)") == 1


async def test_more_things_than_the_rate_allows_come_as_one_digest(tmp_path):
    path = str(tmp_path / "alice.db")
    async with await Inbox.open(path) as inbox:
        for n in range(6):
            await inbox.request_approval(f"r-{n}", 7200, f"action {n}")
    notifier = start(path, tmp_path, "--max-per-minute", "3")
    try:
        wait_for(lambda: len(said(tmp_path)) == 3, what="two notices and a digest")
    finally:
        assert stop(notifier) == 0, notify_log(tmp_path)
    singles, digest = said(tmp_path)[:2], said(tmp_path)[2]
    assert [d["ids"]["request_id"] for d in singles] == ["r-0", "r-1"]
    assert digest["kind"] == "digest" and digest["ids"]["count"] == 4
    assert [d["ids"]["request_id"] for d in digest["ids"]["items"]] == ["r-2", "r-3", "r-4", "r-5"]
    assert digest["text"] == "4 things need you: 4 approval(s) waiting"


async def test_an_inbox_with_work_and_no_worker_and_the_environment(tmp_path):
    path = str(tmp_path / "alice.db")
    async with await Inbox.open(path) as inbox:
        await inbox.ingest("chat", "m-1", {})
        gen = await inbox.acquire("gone-worker")
        await inbox.release("gone-worker", gen)  # stopped cleanly; the work stays
    command = 'printf "%s|%s|%s\\n" "$ONWATCH_KIND" "$ONWATCH_INBOX" "$ONWATCH_TEXT" >> env.txt'
    notifier = start(path, tmp_path, "--unattended-after", "0", command=command)
    try:
        wait_for(lambda: (tmp_path / "env.txt").exists(), what="the unattended inbox")
    finally:
        assert stop(notifier) == 0, notify_log(tmp_path)
    [line] = (tmp_path / "env.txt").read_text().splitlines()
    assert line == (
        "unattended|alice|alice has work (1 pending) and no live worker: its last worker "
        "(gone-worker) stopped"
    )


async def test_a_folder_of_inboxes(tmp_path):
    folder = tmp_path / "inboxes"
    folder.mkdir()
    for name in ("alice", "bob"):
        async with await Inbox.open(str(folder / f"{name}.db")) as inbox:
            await inbox.configure(max_attempts=1)
            await inbox.request_approval(f"{name}-r", 7200, f"{name}'s request")
    notifier = start(str(folder), tmp_path)
    try:
        wait_for(lambda: len(said(tmp_path)) == 2, what="one approval per inbox")
        async with await Inbox.open(str(folder / "bob.db"), create=False) as inbox:
            await die(inbox, "b-1")
        wait_for(lambda: len(said(tmp_path)) == 3, what="bob's dead event")
    finally:
        assert stop(notifier) == 0, notify_log(tmp_path)
    docs = said(tmp_path)
    assert sorted((d["inbox"], d["kind"]) for d in docs) == [
        ("alice", "approval_waiting"),
        ("bob", "approval_waiting"),
        ("bob", "event_dead"),
    ]


async def test_an_approval_is_said_again_once_it_nears_its_deadline(tmp_path):
    """In-process on a fake clock: the waiting notice, then one notice when it comes within
    DEADLINE_WARNING of its deadline, never again; one first seen that near is one notice."""
    clock = FakeClock(1_000_000)
    path = str(tmp_path / "alice.db")
    async with await Inbox.open(path, clock=clock) as inbox:
        await inbox.request_approval("far", 3600, "later")
        await inbox.request_approval("near", 300, "soon")
    watched = await Watched.of(path, clock=clock)
    documents: list[dict] = []
    notifier = Notifier(watched, "true", state=str(tmp_path / "state.db"), clock=clock)

    async def record(notice):
        documents.append(notice.document())
        from onwatch.core.notify import Outcome

        return Outcome(True)

    notifier.run_command = record  # the command itself is the other tests'
    try:
        for _ in range(2):
            await notifier.look()
            await notifier.say()
        assert [(d["kind"], d["ids"]["request_id"]) for d in documents] == [
            ("approval_waiting", "far"),
            ("approval_waiting", "near"),
        ]
        clock.advance(3600 - DEADLINE_WARNING)
        for _ in range(2):
            await notifier.look()
            await notifier.say()
        # "near" passed its deadline with no scheduler to expire it: its expiry timer is
        # work nobody does, and that is said too (once).
        assert [(d["kind"], d["ids"].get("request_id")) for d in documents[2:]] == [
            ("approval_deadline", "far"),
            ("unattended", None),
        ]
        assert "expires in 10m00s unless answered" in documents[2]["text"]
        for _ in range(2):
            await notifier.look()
            await notifier.say()
        assert len(documents) == 4
    finally:
        notifier.memory.close()
        await watched.close()


async def test_every_inbox_of_a_postgresql_database(tmp_path):
    from tests.pg.server import cluster_or_skip

    url = cluster_or_skip().new_database()
    for name in ("alice", "bob"):
        async with await Inbox.open(url, name=name) as inbox:
            await inbox.configure(max_attempts=1)
            await inbox.request_approval(f"{name}-r", 7200, f"{name}'s request")
    notifier = start(url, tmp_path)
    try:
        wait_for(lambda: len(said(tmp_path)) == 2, timeout=30, what="one approval per inbox")
        wait_for(lambda: recorded(tmp_path, 2), what="the memory to record them")
        notifier.send_signal(signal.SIGKILL)
        notifier.wait(10)
        notifier = start(url, tmp_path)
        async with await Inbox.open(url, name="bob", create=False) as inbox:
            await die(inbox, "b-1")
        wait_for(lambda: len(said(tmp_path)) == 3, timeout=30, what="bob's dead event")
    finally:
        assert stop(notifier) == 0, notify_log(tmp_path)
    docs = said(tmp_path)
    assert sorted((d["inbox"], d["kind"]) for d in docs) == [
        ("alice", "approval_waiting"),
        ("bob", "approval_waiting"),
        ("bob", "event_dead"),
    ]
    assert (
        "postgresql://" in docs[0]["target"]
        and "inbox alice" in docs[0]["target"] + docs[1]["target"]
    )


async def test_what_was_not_said_before_a_restart_is_said_after_it(tmp_path):
    path = str(tmp_path / "alice.db")
    async with await Inbox.open(path) as inbox:
        await inbox.request_approval("r-1", 7200, "pay")
    notifier = start(path, tmp_path, "--retry-base", "60", command="exit 1")
    try:
        wait_for(lambda: "the command failed (exit 1)" in notify_log(tmp_path), what="a failure")
    finally:
        notifier.send_signal(signal.SIGKILL)
        notifier.wait(10)
    assert said(tmp_path) == []
    notifier = start(path, tmp_path)  # the same memory, a command that works
    try:
        wait_for(lambda: len(said(tmp_path)) == 1, what="the approval, said after the restart")
    finally:
        assert stop(notifier) == 0, notify_log(tmp_path)
    [doc] = said(tmp_path)
    assert doc["ids"] == {"request_id": "r-1"}


async def test_an_inbox_it_cannot_read_is_said_once_not_at_every_look(tmp_path, caplog):
    """A look that fails the same way every time (here: the inbox locked by another
    process, for good). It was said at every look (several lines a second, each of them
    long); now once, then once a minute, and the repeats only at debug level."""
    path = str(tmp_path / "alice.db")
    inbox = await Inbox.open(path)

    class Locked(Watched):
        async def looks(self, memory, now):
            self.tried = getattr(self, "tried", 0) + 1
            raise InboxBusy(f"inbox {path} is locked by another process")

    watched = Locked(path, inbox=inbox)
    notifier = Notifier(watched, RECORD, state=str(tmp_path / "state.db"), poll=0.01)
    stop = asyncio.Event()
    caplog.set_level(logging.DEBUG, logger="onwatch.notify")
    running = asyncio.create_task(notifier.run(stop))
    try:
        for _ in range(1000):
            if getattr(watched, "tried", 0) >= 6:
                break
            await asyncio.sleep(0.01)
    finally:
        stop.set()
        await asyncio.wait_for(running, 10)
        await inbox.close()
    assert watched.tried >= 6
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert [r.getMessage() for r in warnings] == [
        f"notify: cannot read {path}: inbox {path} is locked by another process"
    ]
    assert sum("(again)" in r.getMessage() for r in caplog.records) >= 5


async def test_an_inbox_file_deleted_under_it_stops_it_saying_why(tmp_path):
    """The file deleted (or replaced) under the notifier: this process may never open the
    one at the path now. It went on failing every look, for good, exit 0 when stopped;
    now it stops at once, exit 1, as a worker does, and a service manager restarts it."""
    path = str(tmp_path / "alice.db")
    async with await Inbox.open(path):
        pass
    notifier = start(path, tmp_path)
    try:
        wait_for(lambda: "watching" in notify_log(tmp_path), what="the notifier to start")
        for side in ("", "-wal", "-shm"):
            Path(path + side).unlink(missing_ok=True)
        assert notifier.wait(timeout=30) == 1, notify_log(tmp_path)
    finally:
        if notifier.poll() is None:
            stop(notifier)
    log = notify_log(tmp_path)
    assert "notify: stopping:" in log and "was deleted after it was opened" in log, log
    assert "start it again to watch the file now at that path" in log
    assert "notify: cannot read" not in log
