"""Fixtures for the engine tests: a scratch inbox on a fake clock with the scenarios' settings
(docs/rules.md#the-reference-scenarios).

The rule tests are one conformance suite: in the modules named in CONFORMANCE every test that
uses an inbox runs once per backend (`[sqlite]`, `[postgresql]`) through the one parametrized
fixture `inbox_target`, which `path` and `inbox` build on. On PostgreSQL each test gets a
fresh schema (a URL whose search_path names it) in a database of the session's server
(tests/pg/server.py) and opens its "default" inbox, so `Inbox.open(path)` means the same
inbox on both. Elsewhere `path` is a file.
"""

from __future__ import annotations

import pytest

from onwatch.core import FakeClock, Inbox

T = 1_000_000
DAY = 86_400

BACKENDS = ("sqlite", "postgresql")
CONFORMANCE = {
    "test_scenarios",
    "test_rules",
    "test_state_machine",
    "test_bad_input",
    "test_hardening",
    "test_group_commit",
}


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    module = metafunc.module.__name__.rsplit(".", 1)[-1]
    if module in CONFORMANCE and "inbox_target" in metafunc.fixturenames:
        metafunc.parametrize("inbox_target", BACKENDS, indirect=True)


@pytest.fixture
def inbox_target(request, tmp_path) -> str:
    """What `Inbox.open` takes: a file path, or the URL of a fresh PostgreSQL database."""
    backend = getattr(request, "param", "sqlite")
    if backend == "sqlite":
        return str(tmp_path / "inbox.db")
    from tests.pg.server import Unavailable, cluster

    try:
        return cluster().new_schema()
    except Unavailable as exc:
        pytest.skip(f"PostgreSQL tests skipped: {exc}")


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(T)


@pytest.fixture
def path(inbox_target) -> str:
    return inbox_target


@pytest.fixture
async def inbox(path, clock):
    box = await Inbox.open(path, clock=clock)
    await box.configure(lease_ttl=120, max_attempts=3, outbox_gap=3600)
    yield box
    await box.close()


def is_postgresql(target: str) -> bool:
    from onwatch.core.pg import is_url

    return is_url(target)


def dump(target: str, name: str = "default") -> list:
    """Everything an inbox holds, to compare before and after a refused call: a file's whole
    SQL dump, or on PostgreSQL the inbox's rows of every table (the `inboxes` row and every
    row carrying its id), each table ordered by all its columns."""
    if not is_postgresql(target):
        import sqlite3

        db = sqlite3.connect(target)
        try:
            return list(db.iterdump())
        finally:
            db.close()
    import psycopg

    rows: list = []
    with psycopg.connect(target, autocommit=True) as conn:
        found = conn.execute("SELECT id FROM inboxes WHERE name = %s", (name,)).fetchone()
        if found is None:
            return []
        tables = conn.execute(
            "SELECT table_name, bool_or(column_name = 'inbox_id'), count(*) "
            "FROM information_schema.columns WHERE table_schema = current_schema() "
            "GROUP BY 1 ORDER BY 1"
        ).fetchall()
        for table, scoped, width in tables:
            order = ", ".join(str(i) for i in range(1, width + 1))
            if table == "inboxes":
                where, params = "WHERE id = %s", (found[0],)
            elif scoped:
                where, params = "WHERE inbox_id = %s", (found[0],)
            else:
                where, params = "", ()
            for row in conn.execute(f"SELECT * FROM {table} {where} ORDER BY {order}", params):
                rows.append((table, *row))
    return rows


def raw_sql(target: str, statement: str, params: tuple = ()) -> list[tuple]:
    """One statement outside the engine (a row written by hand, a look behind its back), on
    either backend: `?` placeholders become psycopg's on PostgreSQL, where each test's schema
    holds the one inbox the statement means."""
    if not is_postgresql(target):
        import sqlite3

        db = sqlite3.connect(target, isolation_level=None)
        try:
            return db.execute(statement, params).fetchall()
        finally:
            db.close()
    import psycopg

    with psycopg.connect(target, autocommit=True) as conn:
        cursor = conn.execute(statement.replace("?", "%s"), params)
        return cursor.fetchall() if cursor.description else []
