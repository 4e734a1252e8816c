"""Sessions the server ends while they are idle: `idle_session_timeout` (PostgreSQL 14 and
later, set by a DBA or a managed service on the database or the role), or a backend
terminated while its session waits between two jobs.

Before, an inbox's session ended between two jobs failed the next job as a lost connection
("outcome unknown, try again": a webhook answered 503, a desk action refused, a worker's
claim put off), with two warnings in the log, after every idle spell. The sessions whose
work is to wait were ended too: a worker's listener was ended and opened again at every
timeout (two warnings each time, the notifications sent meanwhile lost), and a fleet
worker's look, whose lock tells the desk that a fleet worker is there, vanished between
looks. Now an inbox's session ended while idle is replaced before the next job is sent on
it (nothing was lost, nothing is said), and the waiting sessions are exempt from the
timeout.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time

import psycopg
import pytest

from onwatch.core import Inbox
from onwatch.core.fleet import DatabaseFleet
from onwatch.core.pg.shared import Connections
from tests.worker.helpers import ROOT, env, onwatch, wait_for

pytestmark = pytest.mark.slow
TIMEOUT_MS = 300  # the database's idle_session_timeout in these tests
IDLE = 4 * TIMEOUT_MS / 1000  # an idle spell the timeout ends several times over


def _timeout_idle_sessions(url: str) -> None:
    """The database ends every new session idle for TIMEOUT_MS."""
    name = psycopg.conninfo.conninfo_to_dict(url)["dbname"]
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"ALTER DATABASE \"{name}\" SET idle_session_timeout = '{TIMEOUT_MS}ms'")


def _client_sessions(url: str) -> list[int]:
    """The process ids of the client sessions on the database, other than the asker's."""
    with psycopg.connect(url, autocommit=True, options="-c idle_session_timeout=0") as conn:
        return [
            row[0]
            for row in conn.execute(
                "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
                "AND pid <> pg_backend_pid() AND backend_type = 'client backend'"
            )
        ]


async def test_an_inbox_session_ended_while_idle_is_replaced_before_the_next_job(pg, caplog):
    url = pg.new_database()
    _timeout_idle_sessions(url)
    box = await Inbox.open(url, name="a")
    try:
        with caplog.at_level(logging.INFO, logger="onwatch"):
            for n in range(3):
                assert await box.ingest("chat", f"m{n}", None) is True
                wait_for(lambda: not _client_sessions(url), what="the server to end it")
            assert (await box.counts())["pending"] == 3  # a read after the spell, too
        assert "lost the connection" not in caplog.text, caplog.text
        assert "reconnect" not in caplog.text, caplog.text
    finally:
        await box.close()


async def test_shared_sessions_the_server_ended_while_idle_cost_no_retry(pg):
    """A fleet's visits share sessions: every idle one ended (a restart of the server's
    backends, an idle timeout) is replaced by the next job that takes it, which commits at
    its first try."""
    url = pg.new_database()
    shared = Connections(url, limit=2)
    a = await Inbox.open(url, name="a", connections=shared)
    b = await Inbox.open(url, name="b", connections=shared)
    try:
        assert await a.ingest("chat", "before", None) and await b.ingest("chat", "before", None)
        with psycopg.connect(url, autocommit=True) as admin:
            ended = admin.execute(
                "SELECT count(pg_terminate_backend(pid, 10000)) FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid() "
                "AND backend_type = 'client backend'"
            ).fetchone()[0]
        assert ended >= 1
        for box in (a, b, a, b):
            assert await box.ingest("chat", f"after-{id(box)}-{time.monotonic()}", None) is True
        assert [(await box.counts())["pending"] for box in (a, b)] == [3, 3]
    finally:
        await a.close()
        await b.close()
        shared.close()


def _start_worker(url: str, test_dir, *where: str) -> subprocess.Popen:
    err = open(os.path.join(test_dir, "worker.err"), "ab")
    try:
        return subprocess.Popen(
            [sys.executable, "-m", "onwatch", "worker", url, *where]
            + ["--agent", "tests.worker.agents:echo"],
            cwd=ROOT,
            env=env(test_dir, ONWATCH_ECHO_PAUSE="0"),
            stdout=subprocess.DEVNULL,
            stderr=err,
        )
    finally:
        err.close()


def _stop(worker: subprocess.Popen) -> int:
    if worker.poll() is None:
        worker.send_signal(signal.SIGTERM)
    return worker.wait(timeout=30)


def _log(test_dir) -> str:
    with open(os.path.join(test_dir, "worker.err"), encoding="utf-8") as handle:
        return handle.read()


def _done(url: str, name: str) -> int:
    counts = onwatch("status", url, "--inbox", name, "--json", timeout=30)
    assert counts.returncode == 0, counts.stderr
    return int(json.loads(counts.stdout)["counts"]["done"])


def test_a_worker_idle_past_the_timeout_keeps_its_listener_and_runs_what_comes(pg, tmp_path):
    url = pg.new_database()
    assert onwatch("init", url, "--inbox", "a").returncode == 0
    _timeout_idle_sessions(url)
    worker = _start_worker(url, tmp_path, "--inbox", "a")
    try:
        wait_for(lambda: "lease acquired" in _log(tmp_path), timeout=30, what="the worker")
        for n in range(2):
            time.sleep(IDLE)  # idle: only its listener waits, exempt from the timeout
            ingest = onwatch("ingest", url, "--inbox", "a", "chat", f"m{n}", "{}")
            assert ingest.returncode == 0, ingest.stderr
            wait_for(lambda n=n: _done(url, "a") == n + 1, timeout=30, what="the run")
        log = _log(tmp_path)
        assert "lost the connection" not in log, log
        assert "reconnect" not in log, log
    finally:
        assert _stop(worker) == 0, _log(tmp_path)


def test_a_fleet_worker_idle_past_the_timeout_stays_seen_by_the_desk(pg, tmp_path):
    url = pg.new_database()
    assert onwatch("init", url, "--inbox", "a").returncode == 0
    _timeout_idle_sessions(url)
    worker = _start_worker(url, tmp_path, "--all-inboxes")
    desk = DatabaseFleet(url)
    try:

        def workers() -> int:
            return desk.scan(int(time.time()), {}).workers

        wait_for(lambda: workers() == 1, timeout=30, what="the fleet worker to be seen")
        for n in range(2):
            time.sleep(IDLE)  # the desk's own session is ended meanwhile, and replaced
            assert workers() == 1, _log(tmp_path)
            ingest = onwatch("ingest", url, "--inbox", "a", "chat", f"m{n}", "{}")
            assert ingest.returncode == 0, ingest.stderr
            wait_for(lambda n=n: _done(url, "a") == n + 1, timeout=30, what="the run")
        log = _log(tmp_path)
        assert "lost the connection" not in log, log
    finally:
        desk.close()
        assert _stop(worker) == 0, _log(tmp_path)
