"""`onwatch --version` says the package's version and the schema versions it reads and
writes, and each figure is what the program does: a new inbox is written at the schema it
names, an inbox at the oldest it names is opened (and brought forward), and the next one up is
refused, untouched."""

from __future__ import annotations

import re
import sqlite3
from contextlib import closing
from importlib.metadata import version

import psycopg

from onwatch.core.pg import schema as pg_schema
from onwatch.core.sqlite import schema as sqlite_schema
from tests.pg.server import cluster_or_skip
from tests.worker.helpers import onwatch

LINE = re.compile(r"^(?P<what>.+): writes schema (?P<new>\d+), reads (?P<old>\d+)")


def printed() -> dict[str, tuple[int, int]]:
    """{backend: (oldest read, written)} as `onwatch --version` prints them."""
    result = onwatch("--version")
    assert result.returncode == 0, result.stderr
    first, *backends = result.stdout.splitlines()
    assert first == f"onwatch {version('onwatch')}"
    found = {}
    for line in backends:
        match = LINE.match(line)
        assert match, line
        found[match["what"]] = (int(match["old"]), int(match["new"]))
    assert set(found) == {"inbox files (SQLite)", "PostgreSQL databases"}, found
    return found


def user_version(path) -> int:
    with closing(sqlite3.connect(path)) as db:
        return int(db.execute("PRAGMA user_version").fetchone()[0])


def test_a_file_is_written_read_and_refused_at_the_schemas_it_prints(tmp_path):
    oldest, newest = printed()["inbox files (SQLite)"]
    new = tmp_path / "new.db"
    assert onwatch("init", new).returncode == 0
    assert user_version(new) == newest

    old = tmp_path / "old.db"  # made by the oldest schema's own migration
    with closing(sqlite3.connect(old)) as db:
        db.isolation_level = None
        sqlite_schema.migrate(db, str(old), target=oldest)
    assert user_version(old) == oldest
    status = onwatch("status", old, "--json")
    assert status.returncode == 0, status.stderr

    newer = tmp_path / "newer.db"
    assert onwatch("init", newer).returncode == 0
    with closing(sqlite3.connect(newer)) as db:
        db.execute(f"PRAGMA user_version = {newest + 1}")
        db.commit()
    before = newer.read_bytes()
    refused = onwatch("status", newer)
    assert refused.returncode == 2 and f"schema {newest + 1}" in refused.stderr, refused.stderr
    assert newer.read_bytes() == before


def test_a_database_is_written_and_refused_at_the_schemas_it_prints():
    oldest, newest = printed()["PostgreSQL databases"]
    cluster = cluster_or_skip()
    url = cluster.new_database(schema=False)
    assert onwatch("init", url, "--inbox", "support").returncode == 0
    with psycopg.connect(url) as conn:
        assert conn.execute("SELECT version FROM onwatch_schema").fetchone()[0] == newest
        conn.execute("UPDATE onwatch_schema SET version = %s", (newest + 1,))
    refused = onwatch("status", url, "--inbox", "support")
    assert refused.returncode == 2 and f"schema {newest + 1}" in refused.stderr, refused.stderr

    old = cluster.new_database(schema=False)  # made by the oldest schema's own migration
    with psycopg.connect(old, autocommit=True) as conn:
        pg_schema.migrate(conn, "old", target=oldest)
    assert onwatch("init", old, "--inbox", "support").returncode == 0
    with psycopg.connect(old) as conn:
        assert conn.execute("SELECT version FROM onwatch_schema").fetchone()[0] == newest
