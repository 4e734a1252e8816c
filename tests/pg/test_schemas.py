"""onwatch in a schema of its own, and a role that may not create where it is pointed.

Since PostgreSQL 15 only a database's owner may create in its `public` schema. An
application role pointed at such a database failed its `onwatch init` with "cannot be
written by this connection (permission denied for schema public LINE 2: CREATE TABLE …)",
which says neither what to grant nor that a schema of its own would do. It now says both,
and creates nothing; a URL whose search_path names a schema the role owns keeps every
table there, and the whole cycle (init, ingest, a worker's run, the status) works on it.
"""

from __future__ import annotations

import json

import psycopg
import pytest

from tests.worker.helpers import onwatch, start_worker, stop, wait_for

pytestmark = pytest.mark.slow


def _tables(url: str) -> dict[str, int]:
    with psycopg.connect(url, autocommit=True) as conn:
        return dict(
            conn.execute(
                "SELECT schemaname, count(*) FROM pg_tables "
                "WHERE schemaname IN ('public', 'agents') GROUP BY 1"
            ).fetchall()
        )


@pytest.fixture
def app_url(pg) -> str:
    """A database owned by postgres, and a role `agent_app` that may connect to it and owns
    a schema `agents` there, but may not create in `public` (PostgreSQL 15's default)."""
    url = pg.new_database(schema=False)
    database = psycopg.conninfo.conninfo_to_dict(url)["dbname"]
    with psycopg.connect(url, autocommit=True) as admin:
        if not admin.execute("SELECT 1 FROM pg_roles WHERE rolname = 'agent_app'").fetchone():
            admin.execute("CREATE ROLE agent_app LOGIN")
        admin.execute("REVOKE CREATE ON SCHEMA public FROM PUBLIC")
        admin.execute("CREATE SCHEMA agents AUTHORIZATION agent_app")
        admin.execute(f'GRANT CONNECT ON DATABASE "{database}" TO agent_app')
    return url.replace("postgres@", "agent_app@", 1)


def test_a_role_that_may_not_create_in_public_is_told_what_to_do(app_url, tmp_path):
    done = onwatch("init", app_url, "--inbox", "a", test_dir=tmp_path)
    assert done.returncode == 1, (done.stdout, done.stderr)
    assert "permission denied for schema public" in done.stderr, done.stderr
    assert "grant the role CREATE" in done.stderr and "search_path" in done.stderr, done.stderr
    assert "LINE" not in done.stderr and "Traceback" not in done.stderr, done.stderr
    assert _tables(app_url) == {}  # nothing created


def test_an_inbox_in_a_schema_of_its_own_runs_the_whole_cycle(app_url, tmp_path):
    url = app_url + "?options=-csearch_path%3Dagents"
    assert onwatch("init", url, "--inbox", "a", test_dir=tmp_path).returncode == 0
    stored = onwatch("ingest", url, "--inbox", "a", "chat", "m1", "{}", test_dir=tmp_path)
    assert stored.stdout.strip() == "stored", stored.stderr
    worker = start_worker(url, "echo", tmp_path, "--inbox", "a")
    try:

        def done() -> int:
            status = onwatch("status", url, "--inbox", "a", "--json", test_dir=tmp_path)
            assert status.returncode == 0, status.stderr
            return int(json.loads(status.stdout)["counts"]["done"])

        wait_for(lambda: done() == 1, timeout=30, what="the run in the schema")
    finally:
        assert stop(worker) == 0
    tables = _tables(app_url)
    assert tables.get("agents", 0) > 10 and "public" not in tables, tables
    elsewhere = onwatch("status", app_url, "--inbox", "a", test_dir=tmp_path)
    assert elsewhere.returncode == 2 and "no onwatch database" in elsewhere.stderr


def test_a_search_path_that_finds_another_applications_table_first_is_refused(pg, tmp_path):
    """onwatch's statements name their tables without a schema: with another application's
    `events` earlier in the search_path, they would read and write that table. Such a path
    is refused at open, naming the table and the fix; the other table is left as it was."""
    url = pg.new_database()
    assert onwatch("init", url, "--inbox", "a", test_dir=tmp_path).returncode == 0
    with psycopg.connect(url, autocommit=True) as admin:
        admin.execute("CREATE SCHEMA shop")
        admin.execute("CREATE TABLE shop.events (id int PRIMARY KEY, what text)")
        admin.execute("INSERT INTO shop.events VALUES (1, 'an order')")
    shadowed = url + "?options=-csearch_path%3Dshop,public"
    for command in (
        ["ingest", shadowed, "--inbox", "a", "chat", "m1", "{}"],
        ["migrate", shadowed],
    ):
        done = onwatch(*command, test_dir=tmp_path)
        assert done.returncode == 2, (command, done.stdout, done.stderr)
        assert "finds events (in shop) before onwatch's own, in schema public" in done.stderr
        assert "search_path%3Dpublic" in done.stderr and "Traceback" not in done.stderr
    with psycopg.connect(url, autocommit=True) as admin:
        assert admin.execute("SELECT * FROM shop.events").fetchall() == [(1, "an order")]
    assert onwatch("status", url, "--inbox", "a", test_dir=tmp_path).returncode == 0
