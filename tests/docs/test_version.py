"""`onwatch --version` says the package's version and the schema versions it reads and
writes, and each figure is what the program does: a new inbox is written at the schema it
names, an inbox at every older schema it names is brought to it by `onwatch migrate`, and
the next one up is refused, untouched."""

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

LINE = re.compile(r"^(?P<what>.+): writes schema (?P<new>\d+); opens schemas? (?P<old>\d+)")


def printed() -> dict[str, tuple[int, int]]:
    """{backend: (oldest opened, written)} as `onwatch --version` prints them."""
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


def test_a_file_is_written_migrated_and_refused_at_the_schemas_it_prints(tmp_path):
    oldest, newest = printed()["inbox files (SQLite)"]
    new = tmp_path / "new.db"
    assert onwatch("init", new).returncode == 0
    assert user_version(new) == newest

    for old in range(oldest, newest):  # each made by its own schema's migrations, in WAL
        path = tmp_path / f"schema-{old}.db"
        with closing(sqlite3.connect(path)) as db:
            db.isolation_level = None
            db.execute("PRAGMA journal_mode = WAL")
            sqlite_schema.migrate(db, str(path), target=old)
        assert user_version(path) == old
        migrated = onwatch("migrate", path)
        assert migrated.returncode == 0, migrated.stderr
        assert user_version(path) == newest
        assert onwatch("status", path).returncode == 0

    newer = tmp_path / "newer.db"
    assert onwatch("init", newer).returncode == 0
    with closing(sqlite3.connect(newer)) as db:
        db.execute(f"PRAGMA user_version = {newest + 1}")
        db.commit()
    before = newer.read_bytes()
    refused = onwatch("status", newer)
    assert refused.returncode == 2 and f"schema {newest + 1}" in refused.stderr, refused.stderr
    assert newer.read_bytes() == before


def test_a_database_is_written_migrated_and_refused_at_the_schemas_it_prints():
    oldest, newest = printed()["PostgreSQL databases"]
    cluster = cluster_or_skip()
    url = cluster.new_database(schema=False)
    assert onwatch("init", url, "--inbox", "support").returncode == 0
    with psycopg.connect(url) as conn:
        assert conn.execute("SELECT version FROM onwatch_schema").fetchone()[0] == newest
        conn.execute("UPDATE onwatch_schema SET version = %s", (newest + 1,))
    refused = onwatch("status", url, "--inbox", "support")
    assert refused.returncode == 2 and f"schema {newest + 1}" in refused.stderr, refused.stderr

    for old in range(oldest, newest):  # each made by its own schema's migrations
        at = cluster.new_database(schema=False)
        with psycopg.connect(at, autocommit=True) as conn:
            pg_schema.migrate(conn, "old", target=old)
        migrated = onwatch("migrate", at)
        assert migrated.returncode == 0, migrated.stderr
        with psycopg.connect(at) as conn:
            assert conn.execute("SELECT version FROM onwatch_schema").fetchone()[0] == newest
