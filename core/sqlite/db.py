"""An inbox file's connection: pragmas, open checks, and one thread hop per transaction."""

from __future__ import annotations

import asyncio
import os
import sqlite3
import time
from typing import Any, Callable, TypeVar

import aiosqlite

from ..errors import InboxBusy, InboxError, NotAnInbox
from . import schema
from .tx import SqliteTx
from .wake import Wake

T = TypeVar("T")


def _map_error(exc: sqlite3.Error, path: str, busy_timeout: float) -> InboxError:
    text = str(exc)
    if isinstance(exc, sqlite3.OperationalError) and ("locked" in text or "busy" in text):
        return InboxBusy(
            f"inbox {path} stayed locked by another process for more than "
            f"{busy_timeout:g} s; nothing was changed, try again"
        )
    if "malformed" in text or "not a database" in text:
        return NotAnInbox(f"inbox {path} is damaged: {text}")
    return InboxError(f"inbox {path}: {text}")


def write_transaction(tx: SqliteTx, fn: Callable[..., T], args: tuple[Any, ...]) -> T:
    """`fn(tx, *args)` inside BEGIN IMMEDIATE … COMMIT, rolled back on any exception."""
    db = tx.conn
    db.execute("BEGIN IMMEDIATE")
    try:
        result = fn(tx, *args)
        db.execute("COMMIT")
    except BaseException:
        if db.in_transaction:
            db.execute("ROLLBACK")
        raise
    return result


def write_unless(
    tx: SqliteTx, precheck: Callable[..., T | None], fn: Callable[..., T], args: tuple[Any, ...]
) -> T:
    """`precheck(tx, *args)` outside any transaction (one statement is its own snapshot):
    its answer when it has one, else `fn` in a write transaction."""
    answer = precheck(tx, *args)
    return write_transaction(tx, fn, args) if answer is None else answer


def read_transaction(tx: SqliteTx, fn: Callable[..., T], args: tuple[Any, ...]) -> T:
    """`fn(tx, *args)` inside one read snapshot."""
    db = tx.conn
    db.execute("BEGIN")  # deferred: one consistent snapshot, no write lock
    try:
        return fn(tx, *args)
    finally:
        if db.in_transaction:
            db.execute("COMMIT")


class Database:
    """One aiosqlite connection to one inbox file.

    aiosqlite hops to its thread for every statement, which halves throughput against plain
    sqlite3. Here each transaction is one synchronous function of the engine
    (core/engine/), given this file's Tx, run whole on the connection's thread with a single
    hop (aiosqlite's private `_execute` and `_tx`
    queue, used only in this class; the version is pinned in pyproject.toml, and
    tests/core/test_open.py checks what we rely on: one thread, not the loop's, the order
    kept between `call` and `write_soon`, results and errors handed back).
    """

    def __init__(
        self,
        conn: aiosqlite.Connection,
        path: str,
        busy_timeout: float,
        factory: type[sqlite3.Connection] | None = None,
    ) -> None:
        self._conn = conn
        self.path = path
        self.busy_timeout = busy_timeout
        self._factory = factory
        self._tx: SqliteTx | None = None  # over the connection, once it is open
        self._reader: SqliteTx | None = None  # see peek()
        self.wake = Wake(path)  # our own commits notify it; other processes' through the OS
        self._fd: int | None = None  # the opened file, held: see file_replaced()

    @classmethod
    async def open(
        cls,
        path: str | os.PathLike[str],
        *,
        create: bool = True,
        busy_timeout: float = 5.0,
        factory: type[sqlite3.Connection] | None = None,
    ) -> "Database":
        """Open (creating or migrating) an inbox file; raise NotAnInbox and leave it untouched
        if it is missing (with create=False), foreign, corrupt, or newer."""
        path = os.fspath(path)
        exists = schema.check_file(path)
        if not exists and not create:
            raise NotAnInbox(f"no inbox at {path} (run `onwatch init {path}` to create one)")
        if not exists and not os.path.isdir(os.path.dirname(os.path.abspath(path))):
            raise NotAnInbox(f"cannot create {path}: its folder does not exist")
        if not exists and os.path.exists(path + "-wal"):
            # A deleted inbox's write-ahead log: SQLite would replay it into the new file.
            raise NotAnInbox(
                f"cannot create {path}: {path}-wal is left from a deleted inbox "
                f"(a process may still have it open); move it away first"
            )
        kwargs: dict[str, Any] = {"isolation_level": None, "check_same_thread": False}
        if factory is not None:
            kwargs["factory"] = factory
        try:
            conn = aiosqlite.connect(path, **kwargs)
            _daemonize(conn)
            conn = await conn
        except sqlite3.Error as exc:
            raise _map_error(exc, path, busy_timeout) from None
        db = cls(conn, path, busy_timeout, factory)
        try:
            await db.call(_prepare, path, busy_timeout, create)
            db._fd = os.open(path, os.O_RDONLY)
        except BaseException:
            await conn.close()
            raise
        return db

    @property
    def clock_offset(self) -> float:
        """0: a file's deciding transactions use this machine's own clock."""
        return 0.0

    def file_replaced(self) -> str | None:
        """Why `path` no longer names the opened file (deleted, replaced), else None."""
        if self._fd is None:
            return None
        try:
            opened = os.fstat(self._fd)
            current = os.stat(self.path)
        except FileNotFoundError:
            return f"{self.path} was deleted after it was opened"
        except OSError as exc:
            return f"{self.path} cannot be checked: {exc.strerror or exc}"
        if (current.st_dev, current.st_ino) != (opened.st_dev, opened.st_ino):
            return f"{self.path} was replaced by another file after it was opened"
        if opened.st_nlink == 0:
            return f"{self.path} was deleted after it was opened"
        return None

    def _handle(self) -> SqliteTx:
        tx = self._tx
        if tx is None:
            if self._conn._connection is None:
                raise InboxError(f"inbox {self.path} is closed")
            tx = self._tx = SqliteTx(self._conn._connection)
        return tx

    async def call(self, fn: Callable[..., T], *args: Any) -> T:
        """Run `fn(tx, *args)` on the connection's thread, outside any transaction (each
        statement on its own), mapping errors."""
        return await self._hop(fn, self._handle(), *args)

    async def _hop(self, fn: Callable[..., T], *args: Any) -> T:
        try:
            # aiosqlite's private hop is untyped; it returns what fn returns
            result: T = await self._conn._execute(fn, *args)  # type: ignore[no-untyped-call]
            return result
        except sqlite3.Error as exc:
            raise _map_error(exc, self.path, self.busy_timeout) from None

    def write_soon(
        self,
        fn: Callable[..., T],
        args: tuple[Any, ...],
        done: Callable[[T | None, BaseException | None], None],
    ) -> None:
        """Queue `fn` in its own write transaction; call `done(result, error)` on this loop
        once it committed (error None) or rolled back (result None, error mapped).

        The callback form of `write` for group commit: no coroutine or task per call, and
        `done` runs even if whoever queued the work was cancelled meanwhile. It goes on the
        same queue as `call` (aiosqlite's `_tx`, pinned version), so order is kept.
        """
        self._queue_write(lambda tx: write_transaction(tx, fn, args), done)

    def write_soon_alone(
        self,
        alone: Callable[..., T | None],
        fn: Callable[..., T],
        args: tuple[Any, ...],
        done: Callable[[T | None, BaseException | None], None],
    ) -> None:
        """`write_soon`, trying `alone(connection, *args)` first: one autocommit statement,
        outside any transaction (a commit that needs no BEGIN or COMMIT statement of its
        own). Only if it returns None does `fn` run in its own write transaction."""

        def alone_or_transaction(tx: SqliteTx) -> T:
            result = alone(tx, *args)
            return write_transaction(tx, fn, args) if result is None else result

        self._queue_write(alone_or_transaction, done)

    def _queue_write(
        self,
        run: Callable[[SqliteTx], T],
        done: Callable[[T | None, BaseException | None], None],
    ) -> None:
        """Queue `run(connection)`, which commits by itself, for write_soon and
        write_soon_alone."""
        conn = self._conn
        if not conn._running or conn._connection is None:
            raise InboxError(f"inbox {self.path} is closed")
        tx, loop = self._handle(), asyncio.get_running_loop()
        path, busy_timeout = self.path, self.busy_timeout

        def job() -> None:  # on the connection's thread
            try:
                result = run(tx)
            except sqlite3.Error as exc:
                loop.call_soon_threadsafe(done, None, _map_error(exc, path, busy_timeout))
            except BaseException as exc:  # noqa: B036 - handed to the callers, not lost
                loop.call_soon_threadsafe(done, None, exc)
            else:
                loop.call_soon_threadsafe(committed, result)

        def committed(result: T) -> None:  # on the loop
            self.wake.notify()
            done(result, None)

        conn._tx.put_nowait((None, job))

    def peek(self, fn: Callable[..., T], *args: Any) -> T | None:
        """Run a tiny read-only `fn(tx, *args)` right here, on the event loop's thread,
        through a second, query-only connection; None if it cannot answer at once (the
        caller then takes the normal path).

        Only for point lookups by key. A WAL reader never waits for a writer, and the
        connection has no busy timeout, so this cannot stall the loop on a lock; what it sees
        is committed, and with synchronous = FULL a commit is fsynced before readers see it.
        """
        try:
            reader = self._reader
            if reader is None:
                if self._conn._connection is None:
                    return None
                kwargs: dict[str, Any] = {"isolation_level": None, "check_same_thread": False}
                if self._factory is not None:
                    kwargs["factory"] = self._factory
                connection = sqlite3.connect(self.path, **kwargs)
                try:
                    connection.execute("PRAGMA query_only = ON")
                    connection.execute("PRAGMA busy_timeout = 0")
                except BaseException:
                    connection.close()
                    raise
                reader = self._reader = SqliteTx(connection)
            return fn(reader, *args)
        except sqlite3.Error:
            return None

    async def write(self, fn: Callable[..., T], *args: Any) -> T:
        """Run `fn` inside BEGIN IMMEDIATE … COMMIT; roll back on any exception."""
        result: T = await self._hop(write_transaction, self._handle(), fn, args)
        self.wake.notify()
        return result

    async def write_unless(
        self, precheck: Callable[..., T | None], fn: Callable[..., T], *args: Any
    ) -> T:
        """`precheck(tx, *args)` outside a transaction; its answer when it has one (nothing
        to write), else `fn` inside BEGIN IMMEDIATE … COMMIT. One hop either way."""
        result: T = await self._hop(write_unless, self._handle(), precheck, fn, args)
        self.wake.notify()
        return result

    async def read(self, fn: Callable[..., T], *args: Any) -> T:
        """Run `fn` inside one read snapshot."""
        return await self._hop(read_transaction, self._handle(), fn, args)

    async def close(self) -> None:
        self.wake.close()
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        if self._reader is not None:
            self._reader.conn.close()
            self._reader = None
        self._tx = None
        await self._conn.close()


def _daemonize(conn: aiosqlite.Connection) -> None:
    """Make the connection's thread a daemon before it starts: a script that raises without
    closing its Inbox must still exit (a non-daemon thread waiting on its queue would keep the
    interpreter alive for ever). Committed transactions are durable either way; one cut off
    at exit rolls back like a crash. aiosqlite's `_thread` (pinned version; checked by
    tests/core/test_exit.py)."""
    thread = getattr(conn, "_thread", None)
    if thread is not None and not thread.is_alive():
        thread.daemon = True


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


def _prepare(tx: SqliteTx, path: str, busy_timeout: float, create: bool = True) -> None:
    db = tx.conn
    db.execute(f"PRAGMA busy_timeout = {int(busy_timeout * 1000)}")
    version = schema.inspect(db, path)  # refuse foreign files before any write
    if version == 0 and not create:
        # An empty file (0 bytes, or SQLite with nothing in it) is not an inbox yet: only
        # `onwatch init` (create=True) may make it one; everyone else leaves it as it is.
        raise NotAnInbox(
            f"{path} is not an onwatch inbox (it is empty); run "
            f"`onwatch init {path}` to make it one"
        )
    if version == 0 or db.execute("PRAGMA journal_mode").fetchone()[0] != "wal":
        _retry_while_busy(lambda: db.execute("PRAGMA journal_mode = WAL"), busy_timeout)
    # FULL: an acknowledged commit survives power loss, not only a process crash.
    db.execute("PRAGMA synchronous = FULL")
    if version < schema.SCHEMA_VERSION:
        schema.migrate(db, path)
