"""The inbox's SQLite connection: pragmas, open checks, and one thread hop per transaction."""

from __future__ import annotations

import os
import sqlite3
import time
from typing import Any, Callable, TypeVar

import aiosqlite

from . import schema
from .errors import InboxBusy, InboxError, NotAnInbox

T = TypeVar("T")


def _map_error(exc: sqlite3.Error, path: str, busy_timeout: float) -> InboxError:
    text = str(exc)
    if isinstance(exc, sqlite3.OperationalError) and ("locked" in text or "busy" in text):
        return InboxBusy(f"inbox {path} stayed locked by another process for more than "
                         f"{busy_timeout:g} s; nothing was changed, try again")
    if "malformed" in text or "not a database" in text:
        return NotAnInbox(f"inbox {path} is damaged: {text}")
    return InboxError(f"inbox {path}: {text}")


def _write_tx(db: sqlite3.Connection, fn: Callable[..., T], args: tuple) -> T:
    db.execute("BEGIN IMMEDIATE")
    try:
        result = fn(db, *args)
        db.execute("COMMIT")
    except BaseException:
        if db.in_transaction:
            db.execute("ROLLBACK")
        raise
    return result


def _read_tx(db: sqlite3.Connection, fn: Callable[..., T], args: tuple) -> T:
    db.execute("BEGIN")  # deferred: one consistent snapshot, no write lock
    try:
        return fn(db, *args)
    finally:
        if db.in_transaction:
            db.execute("COMMIT")


class Database:
    """One aiosqlite connection to one inbox file.

    aiosqlite hops to its thread for every statement, which halves throughput against plain
    sqlite3. Here each transaction is one synchronous function from core/store.py, run whole
    on the connection's thread with a single hop (aiosqlite's `_execute`; the version is
    pinned in pyproject.toml and tests/core/test_db.py checks the hook exists).
    """

    def __init__(self, conn: aiosqlite.Connection, path: str, busy_timeout: float) -> None:
        self._conn = conn
        self.path = path
        self.busy_timeout = busy_timeout

    @classmethod
    async def open(cls, path: str | os.PathLike, *, create: bool = True,
                   busy_timeout: float = 5.0,
                   factory: type[sqlite3.Connection] | None = None) -> "Database":
        """Open (creating or migrating) an inbox file; raise NotAnInbox and leave it untouched
        if it is missing (with create=False), foreign, corrupt, or newer."""
        path = os.fspath(path)
        exists = schema.check_file(path)
        if not exists and not create:
            raise NotAnInbox(f"no inbox at {path} (run `onwatch init {path}` to create one)")
        if not exists and not os.path.isdir(os.path.dirname(os.path.abspath(path))):
            raise NotAnInbox(f"cannot create {path}: its folder does not exist")
        kwargs: dict[str, Any] = {"isolation_level": None, "check_same_thread": False}
        if factory is not None:
            kwargs["factory"] = factory
        try:
            conn = await aiosqlite.connect(path, **kwargs)
        except sqlite3.Error as exc:
            raise _map_error(exc, path, busy_timeout) from None
        db = cls(conn, path, busy_timeout)
        try:
            await db.call(_prepare, path, busy_timeout)
        except BaseException:
            await conn.close()
            raise
        return db

    async def call(self, fn: Callable[..., T], *args: Any) -> T:
        """Run `fn(sqlite3_connection, *args)` on the connection's thread, mapping errors."""
        try:
            return await self._conn._execute(fn, self._conn._conn, *args)
        except sqlite3.Error as exc:
            raise _map_error(exc, self.path, self.busy_timeout) from None

    async def write(self, fn: Callable[..., T], *args: Any) -> T:
        """Run `fn` inside BEGIN IMMEDIATE … COMMIT; roll back on any exception."""
        return await self.call(_write_tx, fn, args)

    async def read(self, fn: Callable[..., T], *args: Any) -> T:
        """Run `fn` inside one read snapshot."""
        return await self.call(_read_tx, fn, args)

    async def data_version(self) -> int:
        """Changes whenever another connection commits to the file (PRAGMA data_version)."""
        return await self.call(lambda db: db.execute("PRAGMA data_version").fetchone()[0])

    async def close(self) -> None:
        await self._conn.close()


def _retry_while_busy(step: Callable[[], Any], busy_timeout: float) -> None:
    """Switching to WAL needs a moment alone with a brand-new file, and SQLite reports
    SQLITE_BUSY for it without calling the busy handler: retry until the busy timeout."""
    deadline = time.monotonic() + busy_timeout
    while True:
        try:
            step()
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.005)


def _prepare(db: sqlite3.Connection, path: str, busy_timeout: float) -> None:
    db.execute(f"PRAGMA busy_timeout = {int(busy_timeout * 1000)}")
    version = schema.inspect(db, path)  # refuse foreign files before any write
    if version == 0 or db.execute("PRAGMA journal_mode").fetchone()[0] != "wal":
        _retry_while_busy(lambda: db.execute("PRAGMA journal_mode = WAL"), busy_timeout)
    # FULL: an acknowledged commit survives power loss, not only a process crash.
    db.execute("PRAGMA synchronous = FULL")
    if version < schema.SCHEMA_VERSION:
        schema.migrate(db, path)
