"""The right file and the whole story, below the desk: empty files refused untouched, a
deleted or replaced inbox noticed by the worker and the receiver, the traceback migration,
a clean restart that is not a takeover, bury's reason, `onwatch show` in local time."""

from __future__ import annotations

import hashlib
import os
import re
import signal
import sqlite3
import subprocess
import sys

import aiohttp
import pytest

from onwatch.core import FakeClock, Inbox, NotAnInbox
from onwatch.core.runtime.worker import Worker
from onwatch.core.sqlite import schema
from tests.webhook.helpers import ServerProcess, standard_headers
from tests.worker.helpers import ROOT, env, log_of, onwatch, start_worker, stop, wait_for


def digest(path) -> str:
    with open(path, "rb") as handle:
        return hashlib.sha256(handle.read()).hexdigest()


# --- empty files ----------------------------------------------------------------------------


@pytest.mark.parametrize("content", [b"", "bare-sqlite"])
async def test_open_without_create_refuses_an_empty_file_untouched(tmp_path, content):
    path = tmp_path / "empty.db"
    if content == "bare-sqlite":
        sqlite3.connect(path).execute("PRAGMA user_version = 0").connection.close()
    else:
        path.write_bytes(content)
    before = digest(path)
    with pytest.raises(NotAnInbox, match="is not an onwatch inbox .it is empty"):
        await Inbox.open(path, create=False)
    assert digest(path) == before
    assert sorted(os.listdir(tmp_path)) == ["empty.db"]  # no -wal, no -journal


@pytest.mark.parametrize(
    "command", [["status"], ["status", "--json"], ["events", "pending"], ["show", "1"], ["tui"]]
)
def test_every_command_but_init_leaves_an_empty_file_as_it_is(tmp_path, command):
    path = tmp_path / "empty.db"
    path.write_bytes(b"")
    result = onwatch(command[0], path, *command[1:], test_dir=tmp_path)
    assert result.returncode == 2, result.stderr
    assert "is not an onwatch inbox (it is empty)" in result.stderr
    assert path.stat().st_size == 0
    assert sorted(os.listdir(tmp_path)) == ["empty.db"]
    assert onwatch("init", path, test_dir=tmp_path).returncode == 0
    assert path.stat().st_size > 0


async def test_a_new_inbox_is_not_made_over_a_deleted_ones_wal(tmp_path):
    path = tmp_path / "live.db"
    old = await Inbox.open(path)
    try:
        await old.ingest("chat", "old-1", {})
        os.unlink(path)  # as `rm live.db` does: the -wal stays
        with pytest.raises(NotAnInbox, match="-wal is left from a deleted inbox"):
            await Inbox.open(path)
        assert not path.exists()
    finally:
        await old.close()


# --- the file under a running process -------------------------------------------------------


async def test_the_worker_stops_when_its_file_is_deleted(tmp_path):
    path = tmp_path / "live.db"
    await (await Inbox.open(path)).close()
    worker = start_worker(path, "echo", tmp_path)
    try:
        wait_for(lambda: "lease acquired" in log_of(tmp_path), what="the worker to start")
        os.unlink(path)
        code = worker.wait(timeout=20)
    finally:
        stop(worker)
    assert code != 0
    log = log_of(tmp_path)
    assert "was deleted after it was opened" in log
    # Said by whichever notices first: the worker's own look at the path, or the
    # connection's guard at its next call (docs/rules.md, the inbox file).
    assert (
        "will not write to a file nobody else sees" in log or "this process stopped using it" in log
    )


async def test_the_worker_stops_when_its_file_is_replaced(tmp_path):
    path = tmp_path / "live.db"
    await (await Inbox.open(path)).close()
    worker = start_worker(path, "echo", tmp_path)
    try:
        wait_for(lambda: "lease acquired" in log_of(tmp_path), what="the worker to start")
        await (await Inbox.open(tmp_path / "new.db")).close()
        # Moved in as a whole: the old file's -wal and -shm go with the old file (SQLite
        # would otherwise replay the old WAL into the new file).
        for suffix in ("-wal", "-shm"):
            os.unlink(f"{path}{suffix}")
        os.replace(tmp_path / "new.db", path)
        code = worker.wait(timeout=20)
    finally:
        stop(worker)
    assert code != 0
    # The -wal and -shm went first: the connection's guard may notice them before the
    # worker's look at the path notices the new file; either way it stopped and said why.
    log = log_of(tmp_path)
    assert "was replaced by another file" in log or "-wal was deleted while" in log, log
    # The new file was never written by the old worker: no lease in it.
    async with await Inbox.open(path, create=False) as inbox:
        assert await inbox.lease_info() is None


async def test_the_receiver_answers_503_once_its_file_is_replaced(tmp_path):
    server = await ServerProcess(tmp_path / "hooks.db", tmp_path / "server.log").start()
    try:
        body = b'{"build": 1}'
        async with aiohttp.ClientSession() as session:
            async with session.post(
                server.url + "/hooks/ci", data=body, headers=standard_headers(body, "b1")
            ) as response:
                assert response.status == 202
            for name in ("hooks.db", "hooks.db-wal", "hooks.db-shm"):
                if (tmp_path / name).exists():
                    os.unlink(tmp_path / name)
            await (await Inbox.open(tmp_path / "hooks.db")).close()
            body = b'{"build": 2}'
            async with session.post(
                server.url + "/hooks/ci", data=body, headers=standard_headers(body, "b2")
            ) as response:
                assert response.status == 503
                assert "Retry-After" in response.headers
    finally:
        server.stop(signal.SIGTERM)
    async with await Inbox.open(tmp_path / "hooks.db", create=False) as inbox:
        assert (await inbox.counts())["pending"] == 0
    assert (
        "inbox file deleted or replaced" in server.log.read_text()
        or "was replaced by another file" in server.log.read_text()
    )


# --- the schema -----------------------------------------------------------------------------


async def test_migration_4_adds_the_traceback_to_a_version_2_file(tmp_path):
    path = str(tmp_path / "v2.db")
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("PRAGMA journal_mode = WAL")
    schema.migrate(db, path, target=2)
    db.execute(
        "INSERT INTO events(source, source_id, payload, available_at, created, updated,"
        " attempts) VALUES ('chat', 'old-1', '{}', 5, 5, 5, 1)"
    )
    db.execute(
        "INSERT INTO runs(holder, gen, event_ids, claimed_at, finished_at, outcome, "
        "error) VALUES ('old', 1, '[1]', 5, 6, 'error', 'timeout')"
    )
    db.execute("INSERT INTO run_events VALUES (1, 1)")
    db.close()
    async with await Inbox.open(path, clock=FakeClock(1_000), migrate=True) as inbox:
        [old] = await inbox.runs(1)
        assert (old.error, old.traceback) == ("timeout", None)
        gen = await inbox.acquire("W")
        [event] = await inbox.claim_batch("W", gen)
        assert await inbox.finish(
            "W",
            gen,
            [event.id],
            error="KeyError: 'refund'",
            traceback="x" * 20_000 + "\nKeyError: 'refund'\n",
        )
        kept = (await inbox.runs(1))[-1].traceback
        assert kept.endswith("KeyError: 'refund'\n") and len(kept) == 16_384
    db = sqlite3.connect(path)
    assert db.execute("PRAGMA user_version").fetchone()[0] == schema.SCHEMA_VERSION
    db.close()


# --- the whole story ------------------------------------------------------------------------


async def test_a_released_lease_is_a_succession_not_a_takeover(tmp_path):
    async with await Inbox.open(tmp_path / "l.db", clock=FakeClock(1_000)) as inbox:
        gen = await inbox.acquire("w-1", now=1_000)
        assert await inbox.release("w-1", gen, now=1_010)
        view = await inbox.overview(now=1_012)
        assert view.lease_released and view.takeovers == 0
        assert await inbox.acquire("w-2", now=1_012) == gen + 1
        view = await inbox.overview(now=1_013)
        assert (view.takeovers, view.lease_released) == (0, False)
        assert (await inbox.lease_history())[0].how == "released"
        # A lease left to expire still counts.
        assert await inbox.acquire("w-3", now=1_012 + 10_000) == gen + 2
        assert (await inbox.overview(now=1_012 + 10_000)).takeovers == 1


async def test_show_prints_local_times_the_traceback_and_bury_reason(tmp_path):
    path = tmp_path / "show.db"
    async with await Inbox.open(path) as inbox:
        await inbox.configure(max_attempts=1)
        await inbox.ingest("stripe", "evt-1", {"kind": "refund"})

        def agent(batch, ctx):
            return {}["refund"]

        await Worker(inbox, agent, holder="w", max_runs=1, poll_interval=0.05).run()
        await inbox.ingest("chat", "m2", {})
        await inbox.bury(2, reason="customer asked us to drop it")
    result = onwatch("show", path, "1", test_dir=tmp_path)
    assert result.returncode == 0, result.stderr
    assert re.search(
        r"claimed \d{4}-\d\d-\d\d \d\d:\d\d:\d\d \S+ \((now|\S+ ago)\)", result.stdout
    ), result.stdout
    assert "traceback (the agent's" in result.stdout
    assert 'return {}["refund"]' in result.stdout and "test_right_file.py" in result.stdout
    shown = onwatch("show", path, "2", test_dir=tmp_path).stdout
    assert "sent to dead by operator: customer asked us to drop it" in shown
    raw = onwatch("show", path, "1", "--json", test_dir=tmp_path).stdout
    assert '"claimed_at": 1' in raw  # raw seconds stay in --json


def test_a_held_reply_says_in_the_log_why_it_waits(tmp_path):
    path = tmp_path / "held.db"
    assert onwatch("init", path, test_dir=tmp_path).returncode == 0
    assert (
        onwatch("ingest", path, "chat", "a", '{"text": "hello"}', test_dir=tmp_path).returncode == 0
    )
    # A paced send went out a moment ago: the next reply waits for the gap.
    db = sqlite3.connect(path)
    db.execute("UPDATE meta SET value = strftime('%s','now') - 720 WHERE key = 'last_paced_send'")
    db.commit()
    db.close()
    worker = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "onwatch",
            "worker",
            str(path),
            "--agent",
            "examples.refund_agent:handle",
            "--poll",
            "0.1",
        ],
        cwd=ROOT,
        env=env(tmp_path),
        stdout=subprocess.PIPE,
        stderr=open(tmp_path / "worker.err", "wb"),
    )
    try:
        wait_for(lambda: "reply held" in log_of(tmp_path), what="the held line")
    finally:
        stop(worker)
    log = log_of(tmp_path)
    # 60 min gap - 12 min since the last send = 48m, less the worker's start-up (a wall
    # clock: each second it takes shows, "47m59s").
    said = re.search(r"reply held: next paced send in (\d+)m(?:(\d+)s)? \(outbox_gap 3600 s", log)
    assert said is not None, log
    assert 47 * 60 <= int(said[1]) * 60 + int(said[2] or 0) <= 48 * 60, log
