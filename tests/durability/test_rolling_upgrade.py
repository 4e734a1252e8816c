"""A file upgraded under a running worker of the previous release
(docs/rules.md#upgrading-a-running-deployment).

The previous release is the project's own code at PREVIOUS (schema 6 for a file, 2 for a
PostgreSQL database), taken from the git history with `git archive` into a folder of the
test and run from there (`python -m onwatch` with that folder first on sys.path); the test is
skipped where the history is not at hand (a shallow clone). The previous release's worker
runs the whole time, on the same file or database as this release's commands:

- this release's reads (status, events, show, audit) and ingests work on the previous
  schema and change nothing of it (no migration);
- `onwatch migrate` and a worker of this release refuse to migrate while the old worker
  holds the lease, and say why; the old worker never notices anything;
- once it has stopped (handing its lease back), `onwatch migrate` upgrades, and a worker of
  this release runs what came in meanwhile; nothing ran twice.

And every statement of the previous release still compiles on the migrated schema: a
process of it that is still running (a receiver, a desk) keeps working.
"""

from __future__ import annotations

import io
import json
import os
import re
import sqlite3
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from tests.worker.helpers import ROOT, env, log_of, onwatch, query, stop, wait_for

pytestmark = pytest.mark.slow

PREVIOUS = "2491697ba78e3ae4c0de08892da2f8bd35589c6f"  # schema 6 (file), 2 (PostgreSQL)


@pytest.fixture(scope="module")
def previous(tmp_path_factory) -> Path:
    """The previous release's tree, from the git history."""
    try:
        archive = subprocess.run(
            ["git", "archive", "--format=tar", PREVIOUS],
            cwd=ROOT,
            capture_output=True,
            check=True,
            timeout=120,
        ).stdout
    except (OSError, subprocess.CalledProcessError) as exc:
        pytest.skip(f"the previous release {PREVIOUS[:10]} is not in this clone's history: {exc}")
    tree = tmp_path_factory.mktemp("previous")
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        if hasattr(tarfile, "tar_filter"):  # Python 3.11.4 and later
            tar.extractall(tree, filter="tar")
        else:  # pragma: no cover - our own history, not an archive from elsewhere
            tar.extractall(tree)
    return tree


def old(tree: Path, *args: str, test_dir: Path) -> subprocess.CompletedProcess:
    """A command of the previous release."""
    return subprocess.run(
        [sys.executable, "-m", "onwatch", *args],
        cwd=tree,
        env=env(test_dir, PYTHONPATH=str(tree)),
        capture_output=True,
        text=True,
        timeout=60,
    )


def start_old_worker(tree: Path, target: str, test_dir: Path, sent: Path) -> subprocess.Popen:
    out = open(test_dir / "old.out", "ab")
    err = open(test_dir / "old.err", "ab")
    try:
        return subprocess.Popen(
            [
                sys.executable,
                "-m",
                "onwatch",
                "worker",
                target,
                "--agent",
                "tests.worker.agents:echo",
                "--holder",
                "old-worker",
                "--poll",
                "0.1",
                "--file",
                str(sent),
            ],
            cwd=tree,
            env=env(test_dir, PYTHONPATH=str(tree), ONWATCH_ECHO_PAUSE="0"),
            stdout=out,
            stderr=err,
        )
    finally:
        out.close()
        err.close()


class Target:
    """The file, or the PostgreSQL database, under test, and what is stored in it."""

    def __init__(self, kind: str, tmp_path: Path) -> None:
        self.kind = kind
        if kind == "sqlite":
            self.url = str(tmp_path / "inbox.db")
        else:
            from tests.pg.server import cluster_or_skip

            self.url = cluster_or_skip().new_database(schema=False)

    def schema(self) -> int:
        if self.kind == "sqlite":
            return query(self.url, "PRAGMA user_version")[0][0]
        return self.sql("SELECT version FROM onwatch_schema")[0][0]

    def structure(self) -> list:
        """The schema's objects (a migration changes them)."""
        if self.kind == "sqlite":
            return query(self.url, "SELECT type, name, sql FROM sqlite_master ORDER BY name")
        return self.sql(
            "SELECT table_name, column_name FROM information_schema.columns "
            "WHERE table_schema = current_schema() ORDER BY 1, 2"
        ) + self.sql("SELECT indexname FROM pg_indexes WHERE schemaname = current_schema()")

    def sql(self, statement: str) -> list:
        import psycopg

        with psycopg.connect(self.url, autocommit=True) as conn:
            return conn.execute(statement).fetchall()

    def statuses(self) -> dict[str, str]:
        sql = "SELECT source_id, status FROM events"
        rows = query(self.url, sql) if self.kind == "sqlite" else self.sql(sql)
        return dict(rows)

    def lease_holder(self) -> str | None:
        if self.kind == "sqlite":
            rows = query(self.url, "SELECT holder FROM lease")
        else:
            rows = self.sql("SELECT lease_holder FROM inboxes WHERE name = 'default'")
        return rows[0][0] if rows else None


@pytest.mark.parametrize("kind", ["sqlite", "postgresql"])
def test_an_inbox_is_upgraded_under_a_running_worker_of_the_previous_release(
    previous, tmp_path, kind
):
    target = Target(kind, tmp_path)
    url = target.url
    assert old(previous, "init", url, "outbox_gap=0", test_dir=tmp_path).returncode == 0
    before = target.schema()
    structure = target.structure()
    sent = tmp_path / "sent.jsonl"
    worker = start_old_worker(previous, url, tmp_path, sent)
    try:
        wait_for(lambda: target.lease_holder() == "old-worker", what="the old worker's lease")
        # This release's commands on the previous schema: reads and ingests, no migration.
        stored = onwatch("ingest", url, "chat", "n1", test_dir=tmp_path)
        assert stored.stdout == "stored\n", stored.stderr
        wait_for(lambda: target.statuses().get("n1") == "done", what="n1 run by the old worker")
        for args in (("status", url, "--json"), ("events", url, "done"), ("show", url, "1")):
            result = onwatch(*args, test_dir=tmp_path)
            assert result.returncode == 0, (args, result.stderr)
        assert "n1" in onwatch("events", url, "done", test_dir=tmp_path).stdout
        assert onwatch("audit", url, test_dir=tmp_path).returncode == 0
        assert (target.schema(), target.structure()) == (before, structure)
        # Migrating is refused, with the reason, while the old worker holds the lease.
        refused = onwatch("migrate", url, test_dir=tmp_path)
        assert refused.returncode == 1, refused
        assert "was not migrated" in refused.stderr and "old-worker" in refused.stderr
        new_worker = onwatch(
            "worker", url, "--agent", "tests.worker.agents:echo", test_dir=tmp_path, timeout=60
        )
        assert new_worker.returncode == 1 and "was not migrated" in new_worker.stderr
        assert (target.schema(), target.structure()) == (before, structure)
        assert worker.poll() is None, log_of(tmp_path, "old")  # it never noticed a thing
        assert onwatch("ingest", url, "chat", "n2", test_dir=tmp_path).stdout == "stored\n"
        wait_for(lambda: target.statuses().get("n2") == "done", what="n2 run by the old worker")
    finally:
        assert stop(worker) == 0, log_of(tmp_path, "old")  # it hands its lease back
    # Now the upgrade goes through, and this release takes over.
    migrated = onwatch("migrate", url, "--json", test_dir=tmp_path)
    assert migrated.returncode == 0, migrated.stderr
    assert json.loads(migrated.stdout)["schema_before"] == before < target.schema()
    assert onwatch("ingest", url, "chat", "n3", test_dir=tmp_path).stdout == "stored\n"
    ran = onwatch(
        "worker",
        url,
        "--agent",
        "tests.worker.agents:echo",
        "--file",
        str(sent),
        "--max-runs",
        "1",
        test_dir=tmp_path,
        timeout=60,
    )
    assert ran.returncode == 0, ran.stderr
    assert target.statuses() == {"n1": "done", "n2": "done", "n3": "done"}
    replies = sorted(json.loads(line)["text"] for line in sent.read_text().splitlines())
    assert replies == ["reply chat/n1", "reply chat/n2", "reply chat/n3"]  # each ran once
    assert old(previous, "status", url, test_dir=tmp_path).returncode == 2  # newer: refused


def test_every_statement_of_the_previous_release_compiles_on_the_migrated_file(previous, tmp_path):
    """A process of the previous release still running after the migration (a receiver, a
    desk, a standby worker) keeps working: no index or column it names was dropped."""
    path = str(tmp_path / "inbox.db")
    assert onwatch("init", path, test_dir=tmp_path).returncode == 0
    text = (previous / "core" / "sqlite" / "queries.sql").read_text()
    statements = re.split(r"^-- name: (\S+)\s*$", text, flags=re.MULTILINE)[1:]
    assert len(statements) > 50

    class Nulls(dict):
        def __missing__(self, key: str) -> None:
            return None

    db = sqlite3.connect(path)
    try:
        for name, body in zip(statements[::2], statements[1::2], strict=True):
            sql = "\n".join(
                line for line in body.splitlines() if not line.strip().startswith("--")
            ).strip()
            sql = sql.rstrip(";").replace("{rows}", "(?, ?, ?, ?, ?, ?)")
            params = [None] * 6 if "(?, ?, ?, ?, ?, ?)" in sql else Nulls()
            try:
                db.execute("EXPLAIN " + sql, params)
            except sqlite3.Error as exc:
                raise AssertionError(f"{name} of the previous release fails: {exc}") from None
    finally:
        db.close()
    assert os.path.exists(path)
