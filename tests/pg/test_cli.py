"""The command line on a PostgreSQL URL: `--inbox NAME` picks the inbox; a worker process
serves it end to end."""

from __future__ import annotations

import json
import subprocess

import psycopg
import pytest

from tests.worker.helpers import onwatch, start_worker, stop, wait_for


def test_init_ingest_status_and_a_worker_on_one_inbox_of_a_database(url, tmp_path):
    assert onwatch("init", url, "max_batch=5", "--inbox", "support").returncode == 0
    assert (
        onwatch("ingest", url, "chat", "m1", '{"text": "hi"}', "--inbox", "support").stdout.strip()
        == "stored"
    )
    assert onwatch("ingest", url, "chat", "m1", "--inbox", "support").stdout.strip() == "duplicate"
    status = json.loads(onwatch("status", url, "--inbox", "support", "--json").stdout)
    assert status["counts"]["pending"] == 1
    other = onwatch("status", url, "--inbox", "sales", "--json")  # never created
    assert other.returncode != 0 and "no inbox 'sales'" in other.stderr
    worker = start_worker(
        url, "echo", tmp_path, "--inbox", "support", "--max-runs", "1", holder="box-1"
    )
    try:
        worker.wait(timeout=30)
    except subprocess.TimeoutExpired:
        stop(worker)
        raise
    assert worker.returncode == 0, (tmp_path / "worker.err").read_text()
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT i.name, e.status FROM events e JOIN inboxes i ON i.id = e.inbox_id"
        ).fetchall()
    assert rows == [("support", "done")]


def test_init_says_whether_it_created_the_inbox_or_found_it(url):
    """A database's inbox exists or not whatever the URL's files: the first init of a name
    creates it, the next ones find it (text and --json), another name is created again."""
    first = onwatch("init", url, "--inbox", "support")
    assert first.returncode == 0 and first.stdout.startswith("created: "), first.stdout
    again = onwatch("init", url, "--inbox", "support")
    assert again.returncode == 0 and again.stdout.startswith("already an inbox: "), again.stdout
    assert (
        json.loads(onwatch("init", url, "--inbox", "support", "--json").stdout)["created"] is False
    )
    assert json.loads(onwatch("init", url, "--inbox", "sales", "--json").stdout)["created"] is True


def test_a_name_for_a_file_is_refused_with_exit_2(tmp_path):
    result = onwatch("init", str(tmp_path / "a.db"), "--inbox", "support")
    assert result.returncode == 2 and "a file is one inbox" in result.stderr
    assert not (tmp_path / "a.db").exists()


def test_worker_waits_for_work_and_runs_it_when_it_arrives(url, tmp_path):
    assert onwatch("init", url, "--inbox", "support").returncode == 0
    worker = start_worker(
        url, "echo", tmp_path, "--inbox", "support", "--max-runs", "1", holder="box-1"
    )
    try:

        def leased():
            with psycopg.connect(url) as conn:
                return conn.execute("SELECT lease_holder FROM inboxes").fetchone()[0]

        wait_for(leased, 20, what="the worker to take the lease")
        assert onwatch("ingest", url, "chat", "late", "--inbox", "support").returncode == 0
        worker.wait(timeout=30)
    finally:
        stop(worker)
    with psycopg.connect(url) as conn:
        assert conn.execute("SELECT status FROM events").fetchall() == [("done",)]


def test_a_worker_wakes_on_notify_long_before_its_next_poll(url, tmp_path):
    assert onwatch("init", url, "--inbox", "support").returncode == 0
    worker = start_worker(
        url,
        "echo",
        tmp_path,
        "--inbox",
        "support",
        "--max-runs",
        "2",
        "--poll",
        "60",
        holder="box-1",
    )  # replaces the 0.1 s of the helper
    try:

        def status(source_id):
            with psycopg.connect(url) as conn:
                row = conn.execute(
                    "SELECT status FROM events WHERE source_id = %s", (source_id,)
                ).fetchone()
            return row and row[0] == "done"

        assert onwatch("ingest", url, "chat", "first", "--inbox", "support").returncode == 0
        wait_for(lambda: status("first"), 20, what="the first run")
        assert onwatch("ingest", url, "chat", "second", "--inbox", "support").returncode == 0
        # A poll would have taken up to 60 s.
        wait_for(lambda: status("second"), 10, what="the second run, woken by NOTIFY")
        worker.wait(timeout=30)
    finally:
        stop(worker)
    assert worker.returncode == 0


def test_a_worker_rides_out_a_server_restart(pg, tmp_path):
    if pg.owned is None:
        pytest.skip("needs a server the tests started (it is restarted)")
    url = pg.new_database()
    assert onwatch("init", url, "--inbox", "support").returncode == 0
    worker = start_worker(
        url, "echo", tmp_path, "--inbox", "support", "--max-runs", "2", holder="box-1"
    )
    try:

        def status(source_id):
            with psycopg.connect(url) as conn:
                row = conn.execute(
                    "SELECT status FROM events WHERE source_id = %s", (source_id,)
                ).fetchone()
            return row and row[0] == "done"

        assert onwatch("ingest", url, "chat", "before", "--inbox", "support").returncode == 0
        wait_for(lambda: status("before"), 20, what="the run before the restart")
        pg.pg_ctl("-w", "-m", "immediate", "restart")
        assert onwatch("ingest", url, "chat", "after", "--inbox", "support").returncode == 0
        wait_for(lambda: status("after"), 30, what="the run after the restart")
        worker.wait(timeout=30)
    finally:
        stop(worker)
    assert worker.returncode == 0
    log = (tmp_path / "worker.err").read_text()
    assert "lost the connection" in log and "reconnected" in log
