"""An inbox file's connection: pragmas, open checks, one thread hop per transaction, and the
watch on the files beside it (core/sqlite/files.py)."""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import sqlite3
import threading
import time
import urllib.parse
from typing import Any, Callable, TypeVar, cast

import aiosqlite

from ..connection import LoopRest
from ..engine.tx import Ahead
from ..errors import FileLost, InboxBusy, InboxError, NotAnInbox, ReadOnlyInbox
from . import files, schema
from .tx import STATEMENTS, WAL_KEPT, SqliteTx
from .wake import Wake

T = TypeVar("T")
log = logging.getLogger("onwatch.sqlite")
# What SQLite says when it cannot open or make the -wal or -shm beside the file (a folder
# this user may not write in, a read-only file system) or write the file itself.
_CANNOT_OPEN = "unable to open database file"
_READ_ONLY_TEXTS = ("attempt to write a readonly database", "readonly database")
# What a statement of a newer schema says on a file opened without migrating.
_OLDER_SCHEMA_TEXTS = ("no such column", "no such table", "no such index")


# How often a job waiting for another connection's write lock looks again (at most): see
# Database._patiently.
LOCK_POLL = 0.001
# The page size a new inbox file is made with (SQLite's default: 4,096 bytes). A commit
# writes every page it changed to the write-ahead log and fsyncs it; a worker's finish and
# next claim change about ten pages (the events row, index entries, the counts, the run and
# its link) for a few bytes each. Smaller pages make that 10 KiB instead of 38, and the
# fsync returns sooner (docs/performance.md has the figures). An existing file keeps the
# page size it was made with.
PAGE_SIZE = 1024


def _locked(exc: sqlite3.Error) -> bool:
    text = str(exc)
    return isinstance(exc, sqlite3.OperationalError) and ("locked" in text or "busy" in text)


def _map_error(
    exc: sqlite3.Error, path: str, busy_timeout: float, version: int = schema.SCHEMA_VERSION
) -> InboxError:
    text = str(exc)
    if _locked(exc):
        return InboxBusy(
            f"inbox {path} stayed locked by another process for more than "
            f"{busy_timeout:g} s; nothing was changed, try again"
        )
    full = files.no_room(exc, path)
    if full is not None:
        return full
    if "malformed" in text or "not a database" in text:
        return NotAnInbox(f"inbox {path} is damaged: {text}")
    if any(t in text for t in _READ_ONLY_TEXTS):
        return ReadOnlyInbox(f"inbox {path} cannot be written ({text}); nothing was written")
    if version < schema.SCHEMA_VERSION and any(t in text for t in _OLDER_SCHEMA_TEXTS):
        return InboxError(
            f"inbox {path} is at schema {version} and this needs schema "
            f"{schema.SCHEMA_VERSION} ({text}); run `onwatch migrate {path}` (refused while "
            f"a worker of the older release holds the lease)"
        )
    return InboxError(f"inbox {path}: {text}")


def write_transaction(
    tx: SqliteTx, fn: Callable[..., T], args: tuple[Any, ...], bounded: bool = False
) -> T:
    """`fn(tx, *args)` inside BEGIN IMMEDIATE … COMMIT, rolled back on any exception.

    `bounded`: the caller bounds what each savepoint and statement of `fn` changes (a
    scheduler pass: CHUNK timers a savepoint). What SQLite keeps to undo one of them (its
    statement journal: the pages as they were, a temporary file once past 64 KiB) then
    stays in memory: about 450 KiB for a chunk of 500 timers, which was a temporary file
    created, written and unlinked for every chunk (20 files and 8 MiB of writes in a pass
    of 10,000 timers). SQLite reads the setting as a transaction begins, so it is set before
    the BEGIN of a bounded transaction and set back before the BEGIN of the next one nobody
    bounds (a prune of a million payloads journals to a file as before): one statement,
    only when the setting changes, and never after a COMMIT (what fails there would be
    reported for a transaction that committed)."""
    db = tx.conn
    if bounded != tx.journal_in_memory:
        db.execute("PRAGMA temp_store = MEMORY" if bounded else "PRAGMA temp_store = DEFAULT")
        tx.journal_in_memory = bounded
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
    tx: SqliteTx,
    precheck: Callable[..., T | None],
    fn: Callable[..., T],
    args: tuple[Any, ...],
    bounded: bool = False,
) -> T:
    """`precheck(tx, *args)` outside any transaction (one statement is its own snapshot):
    its answer when it has one, else `fn` in a write transaction (`bounded`: see
    write_transaction)."""
    answer = precheck(tx, *args)
    return write_transaction(tx, fn, args, bounded) if answer is None else answer


def _alone_or_transaction(
    tx: SqliteTx, alone: Callable[..., T | None], fn: Callable[..., T], args: tuple[Any, ...]
) -> T:
    """`alone(tx, *args)`, one autocommit statement; only if it returns None, `fn` in its
    own write transaction (write_soon_alone)."""
    result = alone(tx, *args)
    return write_transaction(tx, fn, args) if result is None else result


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
    hop (aiosqlite's private `_tx` queue, used only in `_send`; the version is pinned in
    pyproject.toml, and tests/core/test_open.py checks what we rely on: one thread, not the
    loop's, the order kept between `call` and `write_soon`, results and errors handed back).
    A worker's claims and finishes, and a lone ingest, may run on the loop's own thread
    instead, while the connection's thread is idle: see may_write_here.

    Every job looks first, and every write looks again after its commit, whether the
    inbox file, its -wal and its -shm are still the ones this connection uses (core/sqlite/
    files.py). Once they are not, the connection stops for good: the job that found out
    copies the orphaned log into the file where that is provably safe, the connection is
    set aside (never closed: see files.py), and this and every later call raises FileLost.
    A write whose commit went only to the orphaned log is never acknowledged.
    """

    def __init__(
        self,
        conn: aiosqlite.Connection,
        path: str,
        busy_timeout: float,
        factory: type[sqlite3.Connection] | None = None,
        target: str | None = None,
    ) -> None:
        self._conn = conn
        self.path = path
        self.real = os.path.realpath(path)
        self.busy_timeout = busy_timeout
        self._factory = factory
        self._target = path if target is None else target  # what sqlite3.connect was given
        self._tx: SqliteTx | None = None  # over the connection, once it is open
        self._reader: SqliteTx | None = None  # see peek()
        self.wake = Wake(path)  # our own commits notify it; other processes' through the OS
        self.version = schema.SCHEMA_VERSION  # the file's schema, as opened
        self.migrated_from: int | None = None  # the schema it had, if this open migrated it
        self.created = False  # whether this open made the inbox (Inbox.created)
        self.statements: dict[str, str] = STATEMENTS
        # Why every write is refused, when the file cannot be written (or was opened so).
        self.read_only: str | None = None
        self._held: files.Held | None = None  # the file, held open: see files.py
        self._guard: files.Guard | None = None
        self._stopped: FileLost | None = None  # set once the files are lost, for good
        self._stop_lock = threading.Lock()
        # Jobs handed to the connection's thread (counted on the loop) and the ones it ended
        # (counted on that thread): equal when the thread holds and waits for nothing.
        self._sent = 0
        self._ended = 0
        self.loop_writes = False  # see may_write_here
        self._rest = LoopRest(log)  # no write on the loop's thread for a while after a slow one

    @classmethod
    async def open(
        cls,
        path: str | os.PathLike[str],
        *,
        create: bool = True,
        busy_timeout: float = 5.0,
        factory: type[sqlite3.Connection] | None = None,
        migrate: bool = False,
        read_only: bool = False,
    ) -> "Database":
        """Open an inbox file; raise NotAnInbox and leave it untouched if it is missing (with
        create=False), foreign, corrupt, or newer.

        A new (or empty) file is created when `create` allows it. An existing file of an
        older schema is migrated only with `migrate` (UpgradeRefused while a worker holds
        its lease): otherwise it is read, and written to where its schema allows, as it is.
        `read_only` never writes; a file this process cannot write (permissions, a
        read-only file system, a folder where SQLite cannot make its -wal) is opened so as
        well, and every write then raises ReadOnlyInbox, saying why."""
        path = os.fspath(path)
        real = os.path.realpath(path)
        exists = schema.check_file(path)
        if not exists and (not create or read_only):
            raise NotAnInbox(f"no inbox at {path} (run `onwatch init {path}` to create one)")
        if not exists and not os.path.isdir(os.path.dirname(os.path.abspath(path))):
            raise NotAnInbox(f"cannot create {path}: its folder does not exist")
        if not exists and os.path.exists(path + "-wal"):
            # A deleted inbox's write-ahead log: SQLite would replay it into the new file.
            raise NotAnInbox(
                f"cannot create {path}: {path}-wal is left from a deleted inbox "
                f"(a process may still have it open); move it away first"
            )
        held = await _hold_safely(path, real, busy_timeout) if exists else None
        try:
            readonly_why = None
            if read_only:
                readonly_why = "it was opened read-only"
            elif held is not None and not held.writable:
                readonly_why = "this user may not write the file (or its file system is read-only)"
            db = None
            if readonly_why is None:
                try:
                    db = await cls._connect(path, path, busy_timeout, factory)
                    before, db.version = await db.call(
                        _prepare, path, busy_timeout, create, migrate
                    )
                    if 0 < before < db.version:
                        db.migrated_from = before
                    db.created = before == 0
                except InboxError as exc:
                    if db is not None:
                        await db._conn.close()
                        db = None
                    if _CANNOT_OPEN not in str(exc) or not exists:
                        raise
                    # SQLite cannot make the -wal or -shm: a folder this user may not write.
                    readonly_why = f"SQLite cannot write beside it in {os.path.dirname(real)}"
            if db is None:
                assert readonly_why is not None
                db = await cls._open_read_only(path, real, busy_timeout, factory)
                db.read_only = f"{path} is read-only: {readonly_why}"
                if migrate:  # a worker, `init`, `migrate`: each must write
                    # (A file of this schema needs no migration: say what is refused.)
                    doing = "migrate" if db.version < schema.SCHEMA_VERSION else "write to"
                    await db._conn.close()
                    raise ReadOnlyInbox(
                        f"cannot {doing} {path}, which is read-only: {readonly_why}; "
                        f"nothing was changed"
                    )
            if held is None:
                held = files.hold(real)  # created just now
            db._held = held
            db.statements = STATEMENTS.for_schema(db.version)
            db._tx = SqliteTx(db._conn._connection, db.statements)  # type: ignore[arg-type]
            guard = files.Guard(path, real, held.main, sides=not db._snapshot)
            db._guard = guard
            held.guards.append(guard)
        except BaseException:
            if held is not None:
                files.let_go(held, None, orphaned=False)
            raise
        return db

    _snapshot = False  # opened as an immutable snapshot: no -wal, no -shm, no locks

    @classmethod
    async def _connect(
        cls,
        path: str,
        target: str,
        busy_timeout: float,
        factory: type[sqlite3.Connection] | None,
        uri: bool = False,
    ) -> "Database":
        kwargs: dict[str, Any] = {"isolation_level": None, "check_same_thread": False}
        if factory is not None:
            kwargs["factory"] = factory
        try:
            conn = aiosqlite.connect(target, uri=uri, **kwargs)
            _daemonize(conn)
            conn = await conn
        except sqlite3.Error as exc:
            raise _map_error(exc, path, busy_timeout) from None
        return cls(conn, path, busy_timeout, factory, target)

    @classmethod
    async def _open_read_only(
        cls,
        path: str,
        real: str,
        busy_timeout: float,
        factory: type[sqlite3.Connection] | None,
    ) -> "Database":
        """Read-only: through the -wal and -shm as they are (SQLite reads a -shm it may not
        write); where SQLite can neither find nor make them, and there is no -wal, as an
        immutable snapshot of the file (no log to miss: the last process to close the inbox
        copied it into the file). A -wal it cannot read through is refused: reading the
        file without it would show an older inbox."""
        quoted = urllib.parse.quote(real)
        db = await cls._connect(path, f"file:{quoted}?mode=ro", busy_timeout, factory, uri=True)
        try:
            _, db.version = await db.call(_prepare, path, busy_timeout, False, False, True)
            return db
        except InboxError as exc:
            await db._conn.close()
            # No -wal and -shm, and SQLite may not make them (it says so one way or the
            # other, depending on which it tried first).
            if _CANNOT_OPEN not in str(exc) and not any(t in str(exc) for t in _READ_ONLY_TEXTS):
                raise
        if files.identity(real + "-wal") is not None:
            raise NotAnInbox(
                f"cannot read {path}: its log {real}-wal holds commits not in the file yet, and "
                f"SQLite can neither open nor make {real}-shm to read them (the folder is "
                f"read-only for this user); read it where the folder is writable, or once "
                f"the processes using it have closed it"
            )
        db = await cls._connect(
            path, f"file:{quoted}?mode=ro&immutable=1", busy_timeout, factory, uri=True
        )
        db._snapshot = True
        try:
            _, db.version = await db.call(_prepare, path, busy_timeout, False, False, True)
        except BaseException:
            await db._conn.close()
            raise
        return db

    @property
    def clock_offset(self) -> float:
        """0: a file's deciding transactions use this machine's own clock."""
        return 0.0

    def file_replaced(self) -> str | None:
        """Why the path no longer names the files this connection uses (the inbox file, its
        -wal or -shm deleted or replaced), else None. The first time it says so, the
        connection stops (see the class's docstring); the stop is done on its thread."""
        stopped = self._stopped
        if stopped is not None:
            return str(stopped)
        guard = self._guard
        why = None if guard is None else guard.lost()
        if why is not None:
            conn = self._conn
            if conn._running and conn._connection is not None:
                self._send(None, self._check)  # stops it, on its thread
        return why

    def _check(self) -> None:
        """On the connection's thread, at the start of every job: raise FileLost (stopping
        the connection first, the first time) if the files are lost."""
        stopped = self._stopped
        if stopped is not None:
            raise stopped
        guard = self._guard
        if guard is not None:
            why = guard.lost()
            if why is not None:
                raise self._stop(why)

    def _committed(self) -> None:
        """On the connection's thread, after a write: its commit went to the files at the
        path, or the caller is not told it succeeded (FileLost), unless the orphaned log
        could be copied into the file at once (then it stands, and only later calls fail)."""
        guard = self._guard
        if guard is None or self._stopped is not None:
            return
        why = guard.lost()
        if why is not None:
            stopped = self._stop(why)
            if not stopped.recovered:
                raise stopped

    def _stop(self, why: str) -> FileLost:
        """Stop for good (on the connection's thread): recover the orphaned log into the
        file where provably safe, set the connections aside, never to be closed, and say
        so once in the log. Returns the FileLost every call raises from now on."""
        with self._stop_lock:
            if self._stopped is not None:
                return self._stopped
            conn = self._conn._connection
            held, guard = self._held, self._guard
            failure: str | None = "this process may not write the inbox file"
            if conn is not None and held is not None and guard is not None and held.writable:
                if guard.sides is not None:
                    failure = files.recover(conn, held.fd, self.real, held.main)
            for connection in (conn, self._reader and self._reader.conn):
                if connection is not None:
                    files.keep_forever(connection)
            self._conn._connection = None  # so aiosqlite never closes it either
            if failure is None:
                outcome = (
                    "everything it committed was copied into the inbox file; it writes "
                    "nothing more (restart it to go on)"
                )
            else:
                outcome = (
                    f"what it committed since the last checkpoint was NOT copied into the "
                    f"inbox file ({failure}): it stays in this process's deleted log, which "
                    f"is kept open and never checkpointed over the file; stop the other "
                    f"processes' writes and ask an operator before restarting this one"
                )
            stopped = FileLost(
                f"inbox {self.path}: {why}; this process stopped using it: {outcome}"
            )
            stopped.recovered = failure is None
            self._stopped = stopped
        log.error("%s", stopped)
        return stopped

    def _handle(self) -> SqliteTx:
        stopped = self._stopped
        if stopped is not None:
            # A new exception each time: one instance raised again and again would carry
            # every earlier raise's traceback (and, through the caller's handler, its context).
            again = FileLost(str(stopped))
            again.recovered = stopped.recovered
            raise again
        tx = self._tx
        if tx is None:
            if self._conn._connection is None:
                raise InboxError(f"inbox {self.path} is closed")
            tx = self._tx = SqliteTx(self._conn._connection, self.statements)
        return tx

    def _writable(self) -> None:
        if self.read_only is not None:
            raise ReadOnlyInbox(f"inbox {self.read_only}; nothing was written")

    async def call(self, fn: Callable[..., T], *args: Any) -> T:
        """Run `fn(tx, *args)` on the connection's thread, outside any transaction (each
        statement on its own), mapping errors."""
        return await self._hop(self._read_job, _plain, fn, self._handle(), args)

    async def _hop(self, fn: Callable[..., T], *args: Any) -> T:
        conn = self._conn
        if not conn._running or conn._connection is None:
            raise InboxError(f"inbox {self.path} is closed")
        future: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        self._send(future, lambda: fn(*args))
        try:
            return await future
        except sqlite3.Error as exc:
            raise _map_error(exc, self.path, self.busy_timeout, self.version) from None

    def _send(
        self,
        future: asyncio.Future[Any] | None,
        job: Callable[[], Any],
        answer: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        """Queue `job` on the connection's thread (aiosqlite's queue: its result or error
        goes to `future`), counted so that may_write_here knows when the thread is idle.
        With `answer` (and no future), `job` returns a callable that is called on that loop.

        A job is counted as ended before its answer reaches the loop (aiosqlite sets the
        future after the job returns; `answer` is posted after the count), so a caller that
        has its answer and writes again finds the thread idle."""

        def counted() -> Any:
            try:
                outcome = job()
            finally:
                self._ended += 1  # only this thread writes it
            if answer is not None:
                answer.call_soon_threadsafe(outcome)
            return outcome

        self._sent += 1
        self._conn._tx.put_nowait((future, counted))

    def _read_job(
        self, runner: Callable[..., T], fn: Callable[..., Any], tx: SqliteTx, args: Any
    ) -> T:
        """On the connection's thread: a read, from the files at the path only."""
        self._check()
        return self._patiently(lambda: runner(tx, fn, args))

    def _write_job(self, run: Callable[[], T], patient: bool = True) -> T:
        """On the connection's thread (or the loop's: _write_here): a write, acknowledged
        only if its commit went to the files at the path; `patient`: see _patiently."""
        self._check()
        result = self._patiently(run) if patient else run()
        self._committed()
        return result

    def _patiently(self, run: Callable[[], T]) -> T:
        """`run()`, tried again while another connection holds the write lock, every
        LOCK_POLL seconds at most, up to the busy timeout (then InboxBusy).

        The connection's own busy timeout is 0 once it is open: SQLite's busy handler
        sleeps longer and longer between its looks (25, 50, then 100 ms), so a writer
        waiting behind a long job of another process (a storm of timers fired in
        transactions of TX_SECONDS with short pauses between them) would keep missing the
        pauses. Looking every LOCK_POLL (1 ms), it gets in at the first one. `run` is a
        whole job that changed nothing when it was refused (a write is refused at BEGIN
        IMMEDIATE, or as the autocommit statement it is), so it is simply run again."""
        deadline = None
        pause = LOCK_POLL / 4
        while True:
            try:
                return run()
            except sqlite3.OperationalError as exc:
                if not _locked(exc):
                    raise
                now = time.monotonic()
                if deadline is None:
                    deadline = now + self.busy_timeout
                elif now >= deadline:
                    raise
                time.sleep(min(pause, deadline - now))
                pause = min(pause * 2, LOCK_POLL)

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

        self._queue_write(lambda tx: _alone_or_transaction(tx, alone, fn, args), done)

    def _queue_write(
        self,
        run: Callable[[SqliteTx], T],
        done: Callable[[T | None, BaseException | None], None],
    ) -> None:
        """Queue `run(connection)`, which commits by itself, for write_soon and
        write_soon_alone."""
        self._writable()
        tx = self._handle()
        conn = self._conn
        if not conn._running or conn._connection is None:
            raise InboxError(f"inbox {self.path} is closed")
        loop = asyncio.get_running_loop()
        path, busy_timeout, version = self.path, self.busy_timeout, self.version

        def job() -> Callable[[], None]:  # on the connection's thread: what the loop calls
            try:
                result = self._write_job(lambda: run(tx))
            except sqlite3.Error as exc:
                return functools.partial(done, None, _map_error(exc, path, busy_timeout, version))
            except BaseException as exc:  # noqa: B036 - handed to the callers, not lost
                return functools.partial(done, None, exc)
            return functools.partial(committed, result)

        def committed(result: T) -> None:  # on the loop
            self.wake.notify()
            done(result, None)

        self._send(None, job, answer=loop)

    def peek(self, fn: Callable[..., T], *args: Any) -> T | None:
        """Run a tiny read-only `fn(tx, *args)` right here, on the event loop's thread,
        through a second, query-only connection; None if it cannot answer at once (the
        caller then takes the normal path).

        Only for point lookups by key. A WAL reader never waits for a writer, and the
        connection has no busy timeout, so this cannot stall the loop on a lock; what it sees
        is committed, and with synchronous = FULL a commit is fsynced before readers see it.
        An answer is given only while the files at the path are still this connection's.
        """
        guard = self._guard
        if self._stopped is not None or guard is None:
            return None
        try:
            reader = self._reader
            if reader is None:
                if self._conn._connection is None:
                    return None
                kwargs: dict[str, Any] = {"isolation_level": None, "check_same_thread": False}
                if self._factory is not None:
                    kwargs["factory"] = self._factory
                connection = sqlite3.connect(self._target, uri=self._target != self.path, **kwargs)
                try:
                    connection.execute("PRAGMA query_only = ON")
                    connection.execute("PRAGMA busy_timeout = 0")
                except BaseException:
                    connection.close()
                    raise
                reader = self._reader = SqliteTx(connection, self.statements)
            answer = fn(reader, *args)
        except sqlite3.Error:
            return None
        return None if guard.lost() is not None else answer

    async def write(self, fn: Callable[..., T], *args: Any) -> T:
        """Run `fn` inside BEGIN IMMEDIATE … COMMIT; roll back on any exception."""
        self._writable()
        tx = self._handle()
        result: T = await self._hop(self._write_job, lambda: write_transaction(tx, fn, args))
        self.wake.notify()
        return result

    async def write_ahead(self, ahead: Ahead | None, fn: Callable[..., T], *args: Any) -> T:
        """write (a file has no round trip to save by sending a statement early), on the
        event loop's own thread where `loop_writes` allows it.

        These are a worker's transactions between two runs (a claim, a finish, a finish
        that claims next), and the hand-off to the connection's thread and back costs about
        a third of such a transaction's time. A Worker sets `loop_writes` for its inbox (its
        loop is its own: no desk on it; docs/rules.md, The worker runtime). The write then
        runs here, whole, when nothing is queued on the connection's thread (the order of
        calls is kept) and the last such write was quick. It never waits on the loop: a
        write lock held by another connection refuses it at BEGIN IMMEDIATE, having changed
        nothing, and it goes to the thread, which waits as every write does. One that took
        longer than LOOP_WRITE_SLOW (a slow disk, a checkpoint, a storm of timers) sends the
        next ones to the thread for LOOP_WRITE_REST seconds."""
        done, result = self._write_here(lambda tx: write_transaction(tx, fn, args))
        if done:
            return cast(T, result)
        return await self.write(fn, *args)

    def may_write_here(self) -> bool:
        """True if a write may run on the event loop's own thread now (write_ahead,
        write_here_alone): `loop_writes` is set, nothing is queued on the connection's
        thread, and the last such write was quick."""
        return (
            self.loop_writes
            and self._sent == self._ended
            and not self._rest.resting(time.monotonic())
        )

    def write_here_alone(
        self, alone: Callable[..., T | None], fn: Callable[..., T], args: tuple[Any, ...]
    ) -> tuple[bool, T | None]:
        """write_soon_alone's work on the event loop's own thread, now, where
        `may_write_here` allows it: (True, its result), or (False, None) when it may not or
        another connection holds the write lock (nothing was written; the caller then
        queues it on the connection's thread). An error is raised, mapped."""
        return self._write_here(lambda tx: _alone_or_transaction(tx, alone, fn, args))

    def _write_here(self, run: Callable[[SqliteTx], T]) -> tuple[bool, T | None]:
        """`run(tx)`, a write that commits by itself, on this thread, tried once where
        may_write_here allows it: (True, its result), or (False, None) when it may not or
        another connection holds the write lock (nothing was written). A slow one sends the
        next ones to the thread for a while (LoopRest)."""
        if not self.may_write_here():
            return False, None
        self._writable()
        tx = self._handle()
        started = time.monotonic()
        try:
            result = self._write_job(lambda: run(tx), patient=False)
        except sqlite3.Error as exc:
            if _locked(exc):
                return False, None
            raise _map_error(exc, self.path, self.busy_timeout, self.version) from None
        finally:
            self._rest.after(self.path, started, time.monotonic())
        self.wake.notify()
        return True, result

    async def write_alone(self, fn: Callable[..., T], *args: Any) -> T:
        """Run `fn`, one statement that commits by itself (SQLite's autocommit: the file's
        write lock for that statement alone), outside any transaction."""
        self._writable()
        tx = self._handle()
        result: T = await self._hop(self._write_job, lambda: fn(tx, *args))
        self.wake.notify()
        return result

    async def write_unless(
        self,
        precheck: Callable[..., T | None],
        fn: Callable[..., T],
        *args: Any,
        bounded: bool = False,
    ) -> T:
        """`precheck(tx, *args)` outside a transaction; its answer when it has one (nothing
        to write), else `fn` inside BEGIN IMMEDIATE … COMMIT. One hop either way. `bounded`:
        see write_transaction."""
        self._writable()
        tx = self._handle()
        result: T = await self._hop(
            self._write_job, lambda: write_unless(tx, precheck, fn, args, bounded)
        )
        self.wake.notify()
        return result

    async def read(self, fn: Callable[..., T], *args: Any) -> T:
        """Run `fn` inside one read snapshot."""
        return await self._hop(self._read_job, read_transaction, fn, self._handle(), args)

    async def close(self) -> None:
        self.wake.close()
        conn = self._conn
        orphaned = True
        if conn._running and conn._connection is not None:
            # On the connection's thread, after every job queued before: a connection whose
            # files are lost is set aside there, never closed (SQLite's close would
            # checkpoint its log over the file and unlink the others' log by name).
            orphaned = await self._hop(self._close_job)
        elif self._stopped is None and conn._connection is None:
            orphaned = False
        self._conn._connection = None
        if conn._running:
            stopping = conn.stop()
            if stopping is not None:
                await stopping
        self._tx = None
        if self._reader is not None and not orphaned:
            self._reader.conn.close()
        self._reader = None
        guard, held = self._guard, self._held
        self._guard = self._held = None
        if guard is not None:
            guard.close()
        if held is not None:
            files.let_go(held, guard, orphaned)

    def _close_job(self) -> bool:
        """On the connection's thread: close the connection, or set it aside if its files
        are lost; True when set aside."""
        try:
            self._check()
        except FileLost:
            return True
        connection = self._conn._connection
        if self._reader is not None:
            self._reader.conn.close()
            self._reader = None
        if connection is not None:
            connection.close()
        return False


def _plain(tx: SqliteTx, fn: Callable[..., T], args: Any) -> T:
    return fn(tx, *args)


async def _hold_safely(path: str, real: str, busy_timeout: float) -> files.Held:
    """Hold the existing inbox file open, once it is safe to open (files.unsafe_to_open): a
    process whose -wal was deleted under it usually notices and recovers within moments,
    so this waits up to the busy timeout for that before refusing (FileLost)."""
    try:
        held = files.hold(real)
    except OSError as exc:
        raise NotAnInbox(f"{path} cannot be opened: {exc.strerror or exc}") from None
    try:
        if held.orphaned is not None:
            raise FileLost(
                f"inbox {path}: {held.orphaned}; this process still has it open through a "
                f"connection it stopped, and cannot open it again until it is restarted"
            )
        for guard in list(held.guards):
            why = guard.lost()
            if why is not None:
                raise FileLost(
                    f"inbox {path}: {why}; this process still has it open through a "
                    f"connection it stopped, and cannot open it again until it is restarted"
                )
        deadline = time.monotonic() + busy_timeout
        while (why := files.unsafe_to_open(held.fd, real)) is not None:
            if time.monotonic() >= deadline:
                raise FileLost(f"inbox {path} was not opened: {why}")
            await asyncio.sleep(0.02)
    except BaseException:
        files.let_go(held, None, orphaned=False)
        raise
    return held


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


def _prepare(
    tx: SqliteTx,
    path: str,
    busy_timeout: float,
    create: bool = True,
    migrate: bool = False,
    read_only: bool = False,
) -> tuple[int, int]:
    """Check the file and set the connection up, creating or migrating it where allowed
    (see Database.open); return its schema version before and after."""
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
    if read_only:
        db.execute("PRAGMA busy_timeout = 0")  # from now on: Database._patiently
        return version, version
    if version == 0:
        db.execute(f"PRAGMA page_size = {PAGE_SIZE}")  # before the first write makes the file
    if version == 0 or db.execute("PRAGMA journal_mode").fetchone()[0] != "wal":
        _retry_while_busy(lambda: db.execute("PRAGMA journal_mode = WAL"), busy_timeout)
    # FULL: an acknowledged commit survives power loss, not only a process crash.
    db.execute("PRAGMA synchronous = FULL")
    db.execute(f"PRAGMA journal_size_limit = {WAL_KEPT}")
    if version == 0 or (migrate and version < schema.SCHEMA_VERSION):
        # Creating a new inbox, or a migration asked for (docs/rules.md#upgrading-a-running-
        # deployment): schema.migrate re-reads the version under the write lock.
        before = schema.migrate(db, path)
        db.execute("PRAGMA busy_timeout = 0")  # from now on: Database._patiently
        return before, schema.SCHEMA_VERSION
    db.execute("PRAGMA busy_timeout = 0")  # from now on: Database._patiently
    return version, version
