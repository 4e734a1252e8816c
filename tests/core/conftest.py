"""Fixtures for the engine tests: a scratch inbox on a fake clock with the scenarios' settings
(docs/rules.md#the-reference-scenarios).

`path` and `inbox` build on `inbox_target` (tests/conftest.py): in a module marked
`pytest.mark.backends` they are an inbox of each backend in turn, elsewhere a file.
"""

from __future__ import annotations

import pytest

from onwatch.core import FakeClock, Inbox
from tests.conftest import BACKENDS  # noqa: F401 - named by modules of this folder

T = 1_000_000
DAY = 86_400


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
