"""One inbox's PostgreSQL connection: the same interface as core/sqlite/db.py's `Database`,
with each whole transaction run on a dedicated thread through a synchronous psycopg
connection.

As on SQLite, a transaction is one synchronous function of the engine (core/engine/), given
this inbox's Tx (core/pg/tx.py), handed to the connection's thread in one hop; the event loop
never waits on the network or on a commit.

Isolation: READ COMMITTED plus one explicit row lock, not SERIALIZABLE plus retry.
Every write transaction starts with `SELECT … FROM inboxes WHERE id = … FOR UPDATE`
(`write_transaction`): the inbox's row is its mutex, as the file's write lock (BEGIN
IMMEDIATE) is on SQLite. Writers of one inbox therefore run one after another, and each
statement after the lock sees everything committed before it was granted, so every rule is
checked and applied against the state it changes: fencing, claim selection, the write-once
approval answer, dedupe (also a UNIQUE key), the next event id. Why not SERIALIZABLE: its
conflicts are detected at commit and need the whole transaction re-run; under the
contention a lease invites (every standby asking at once) that is a retry storm, and its
predicate locks on shared index pages make *different* inboxes of one database abort each
other. With the row lock, inboxes never wait for one another, a transaction never has to be
retried, and there is no deadlock: each transaction locks one inbox row first and then only
rows of that inbox. Reads run as one REPEATABLE READ snapshot and never block writers.
"""

from __future__ import annotations

import asyncio
import logging
import os
import queue
import socket
import sys
import threading
import time
import weakref
from typing import Any, Callable, TypeVar, cast

from ..connection import LoopRest
from ..engine.decoding import settings_from
from ..engine.runs import plain_claim
from ..engine.tx import Ahead, ClaimAhead, FinishAhead, FinishClaimAhead, LookAhead
from ..errors import (
    BadInput,
    ConnectionLost,
    InboxBusy,
    InboxError,
    NotAnInbox,
    ReadOnlyInbox,
    ServerReadOnly,
    StorageFull,
)
from ..text import printable
from . import redact, said, schema
from .connect import READ_ONLY_SERVER, STATEMENT_TIMEOUT, connect, ended_while_idle, not_yet
from .listen import ListenWake
from .rows import Row, one
from .shared import Connections, WriteRefusals
from .tx import (
    CLAIM_WITH_COMMIT,
    FINISH_AND_TAKE_WITH_LOCK,
    FINISH_WITH_LOCK,
    LOOK_WITH_LOCK,
    SERVER_TIME,
    STATEMENTS,
    TAKE_WITH_LOCK,
    UNSEEN,
    Tx,
)

T = TypeVar("T")
Args = tuple[Any, ...]  # a store function's arguments after the Tx: whatever it declares
log = logging.getLogger("onwatch.pg")
MAX_BACKOFF = 5.0  # seconds between two reconnection attempts, at most
# A process whose clock differs from the server's by more than this says so in its log
# (once per SKEW_LOG_EVERY) and in `onwatch status`: decisions use the server's clock anyway,
# but a countdown shown from this machine's would be off by as much.
SKEW_WARNING = 2.0
OUTAGE_LOG_EVERY = 60.0  # seconds between two log lines of one outage
# A job (one transaction) still waiting for the server this long after it started has met a
# server that stopped answering: its socket is cut, so it fails as a lost connection (retried
# like one) instead of holding the connection's thread, and whoever waits on it, for ever.
# A live server ends any statement at STATEMENT_TIMEOUT and any lock wait at the busy timeout.
JOB_GRACE = STATEMENT_TIMEOUT + 15.0
# A write on the event loop's own thread (Database._write_here) that the server has not
# answered in this many seconds is cut, as a job of the connection's thread is at its
# deadline: the loop, waiting, cannot watch itself. A commit takes milliseconds; a lock held
# by another session is never waited for there.
LOOP_WRITE_STALL = 2.0
CLOSE_WAIT = 3.0  # seconds close() waits for a job in flight before cutting its socket
SKEW_LOG_EVERY = 600.0

# Connections of closed inboxes, kept for the next open in this process: a fleet worker
# opens and closes an inbox each time it takes one up, and a new connection costs a
# server process and an authentication (more than the runs of a short visit).
POOL_SIZE = 32  # idle connections kept in all, whatever their database; the oldest go first
_pool: list[tuple[tuple[str, float], "psycopg.Connection[Row]"]] = []  # oldest first
_pool_lock = threading.Lock()


class _Unheld:
    """What an inbox opened with shared connections holds between two jobs: nothing (a
    closed connection, to every check that looks)."""

    closed = broken = True

    def close(self) -> None:
        pass

    @property
    def pgconn(self) -> Any:
        raise psycopg.OperationalError("no connection held between jobs")


UNHELD = cast("psycopg.Connection[Row]", _Unheld())


def _pooled(url: str, busy_timeout: float) -> "psycopg.Connection | None":
    key = (url, busy_timeout)
    with _pool_lock:
        for index in range(len(_pool) - 1, -1, -1):
            if _pool[index][0] == key:
                conn = _pool.pop(index)[1]
                if not conn.closed and not conn.broken and not ended_while_idle(conn):
                    return conn
                conn.close()
    return None


def _shared_take(connections: Connections, where: str) -> "psycopg.Connection[Row] | None":
    """`connections.take`, waiting as long as for the inbox's lock."""
    try:
        return connections.take(connections.busy_timeout)
    except TimeoutError:
        raise InboxBusy(
            f"{where}: all {connections.limit} connections to PostgreSQL stayed busy for "
            f"more than {connections.busy_timeout:g} s; nothing was changed, try again"
        ) from None
    except psycopg.Error as exc:
        raise ConnectionLost(f"{where}: {said(exc)}") from None


def _give_back(url: str, busy_timeout: float, conn: "psycopg.Connection[Row]") -> None:
    """Keep an idle, healthy connection for the next open; close anything else."""
    evicted = []
    if (
        not conn.closed
        and not conn.broken
        and conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    ):
        with _pool_lock:
            _pool.append(((url, busy_timeout), conn))
            while len(_pool) > POOL_SIZE:
                evicted.append(_pool.pop(0)[1])
    else:
        evicted.append(conn)
    for old in evicted:
        old.close()


try:
    import psycopg
    from psycopg import errors as pg_errors
    from psycopg import sql as pg_sql
except ImportError:  # pragma: no cover - psycopg is a dependency; say so if it is missing
    psycopg = None  # type: ignore[assignment]


# How a job runs its store function: write_transaction, read_transaction or _plain.
Runner = Callable[[Tx, Callable[..., T], Args], T]

# The inbox row's columns a write transaction reads as it locks the row (see Tx.row).
# As queries.sql inbox_state, and the change count as the transaction began (Tx.change_token).
INBOX_ROW = "lease_holder, lease_gen, lease_until, settings, paused, changes, released_gen"

# What every transaction sends around the engine's statements, prepared once per session
# and run with EXECUTE: they travel in one simple-protocol message with BEGIN or COMMIT (a
# round trip each saved), and a statement sent as text is planned at every call (measured on
# a fleet: the lock 65 µs and the change count 38 µs of the server's time a transaction; a
# prepared one settles on its generic plan after five calls). `onwatch_look`, a claim's look
# sent with the lock, and `onwatch_finish`, a finish and the look after it sent so
# (write_transaction's `ahead`), are prepared by the first transaction that sends each: they
# name the newest schema's columns.
SESSION_STATEMENTS = {
    "onwatch_lock(bigint)": f"SELECT {INBOX_ROW} FROM inboxes WHERE id = $1 FOR UPDATE",
    "onwatch_lock_nowait(bigint)": (
        f"SELECT {INBOX_ROW} FROM inboxes WHERE id = $1 FOR UPDATE NOWAIT"
    ),
    "onwatch_count(bigint)": "UPDATE inboxes SET changes = changes + 1 WHERE id = $1",
    "onwatch_now": SERVER_TIME,
}
LOOK_PARTS = ("claim_look", "timer_due_any")  # its parts: a schema with other texts sends them
LOOK_STATEMENT = {"onwatch_look(bigint, bigint, bigint, bigint, bigint)": LOOK_WITH_LOCK}
FINISH_PARTS = ("finish_done", "claim_look")
FINISH_STATEMENT = {
    "onwatch_finish(bigint, bigint, bigint, bigint[], bigint, bigint, text, text, bigint)": (
        FINISH_WITH_LOCK
    )
}
# A claim sent with its transaction's COMMIT (Tx.claim), on a schema whose claim it is.
CLAIM_STATEMENT = {"onwatch_claim(bigint, bigint, bigint, bigint[])": CLAIM_WITH_COMMIT}
# A plain claim decided and made with the lock, and committed in the same message (`_take`).
TAKE_PARTS = ("claim_look", "timer_due_any", "claim")
TAKE_STATEMENT = {
    "onwatch_take(bigint, bigint, bigint, bigint, bigint, text, text, boolean, bigint)": (
        TAKE_WITH_LOCK
    )
}
# A run's finish and the plain claim after it, made with the lock and committed in the same
# message (`_take`).
FINISH_TAKE_PARTS = ("finish_done", *TAKE_PARTS)
FINISH_TAKE_STATEMENT = {
    "onwatch_finish_take(bigint, bigint, bigint, bigint, bigint, text, text, boolean, bigint, "
    "bigint, bigint[], text)": FINISH_AND_TAKE_WITH_LOCK
}
# The server's JSON check that the take's statement needs (IS JSON) came with version 16.
TAKE_SERVER = 160000
# The session statements each session has prepared, as far as this process knows.
_prepared: "weakref.WeakKeyDictionary[psycopg.Connection[Row], set[str]]" = (
    weakref.WeakKeyDictionary()
)


class _StallWatch:
    """Cuts the socket of a write on an event loop's own thread that the server has not
    answered in LOOP_WRITE_STALL (Database._stalled). A thread of its own looks four times
    in that span while an inbox that has written there is open, and ends when none is."""

    def __init__(self) -> None:
        self._writers: weakref.WeakSet[Database] = weakref.WeakSet()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def watch(self, db: "Database") -> None:
        if db in self._writers:
            return
        with self._lock:
            self._writers.add(db)
            if self._thread is None or not self._thread.is_alive():  # none yet, or forked
                self._thread = threading.Thread(
                    target=self._look, name="onwatch-pg-stalls", daemon=True
                )
                self._thread.start()

    def forget(self, db: "Database") -> None:
        with self._lock:
            self._writers.discard(db)

    def _look(self) -> None:
        while True:
            time.sleep(LOOP_WRITE_STALL / 4)
            with self._lock:
                writers = list(self._writers)
                if not writers:
                    self._thread = None
                    return
            now = time.monotonic()
            for db in writers:
                since = db._here_since
                if since is not None and now - since > LOOP_WRITE_STALL:
                    db._stalled(since)


_STALLS = _StallWatch()


def _map_error(exc: BaseException, where: str, busy_timeout: float) -> InboxError:
    if isinstance(exc, (pg_errors.InsufficientPrivilege, pg_errors.ReadOnlySqlTransaction)):
        why = said(exc)  # its first line: the statement quoted after it is not for users
        if isinstance(exc, pg_errors.ReadOnlySqlTransaction):
            why += f": {READ_ONLY_SERVER}"
        return ReadOnlyInbox(
            f"inbox {where} cannot be written by this connection ({why}); nothing was written"
        )
    if isinstance(exc, pg_errors.LockNotAvailable):
        return InboxBusy(
            f"inbox {where} stayed locked by another connection for more than "
            f"{busy_timeout:g} s; nothing was changed, try again"
        )
    if isinstance(exc, pg_errors.DiskFull):  # an OperationalError, but the session lives on
        return StorageFull(
            f"inbox {where}: the PostgreSQL server has no room to write ({said(exc)}); "
            f"nothing was written, try again once space is freed"
        )
    if isinstance(exc, psycopg.OperationalError):
        return ConnectionLost(
            f"inbox {where}: lost the connection to PostgreSQL "
            f"({said(exc)}); the transaction did not commit or its "
            f"outcome is unknown, try again"
        )
    return InboxError(f"inbox {where}: {said(exc)}")


def _cannot_connect(exc: BaseException, url: str) -> InboxError:
    """A connection to `url` failed: ConnectionLost (worth another try) where it may
    succeed later (`not_yet`), else InboxError (a refusal for good: no such database or
    role, a wrong password)."""
    message = f"cannot connect to {redact(url)}: {said(exc)}"
    why = not_yet(exc, url)
    if why is None:
        return InboxError(message)
    return ConnectionLost(f"{message} ({why}); try again")


def _prepare(conn: "psycopg.Connection[Row]", statements: dict[str, str]) -> None:
    """Prepare those of `statements` this session lacks. (The question is never itself a
    statement psycopg prepares: it is asked when a session lost what it had prepared.)"""
    have = {
        row[0] for row in conn.execute("SELECT name FROM pg_prepared_statements", prepare=False)
    }
    missing = [
        f"PREPARE {signature} AS {sql}"
        for signature, sql in statements.items()
        if signature.split("(")[0] not in have
    ]
    if missing:
        conn.execute("; ".join(missing))
    _prepared.setdefault(conn, set()).update(statements)


def _begin(
    conn: "psycopg.Connection[Row]", text: str, statements: dict[str, str] = SESSION_STATEMENTS
) -> "psycopg.Cursor[Row]":
    """Send `text` (BEGIN, then statements that EXECUTE the session's `statements`),
    preparing them first on a session that does not have them yet. One that lost them
    (DEALLOCATE or DISCARD ALL, as a pooler between client and server may send) gets them
    again, and `text` is sent again: the failed message ended in an aborted transaction that
    changed nothing. Called inside its transaction's `try`: a message that fails otherwise (a
    lock not granted in time, a lost connection) left its BEGIN's transaction open, and the
    caller rolls it back, as every later statement of the session would fail in it."""
    if not _prepared.get(conn, set()).issuperset(statements):
        _prepare(conn, statements)
    try:
        return conn.execute(text)
    except pg_errors.InvalidSqlStatementName:
        _rollback(conn)
        _prepare(conn, statements)
        return conn.execute(text)


def write_transaction(tx: Tx, fn: Callable[..., T], args: Args, ahead: Ahead | None = None) -> T:
    """`fn(tx, *args)` inside BEGIN … COMMIT holding the inbox's row lock, rolled back on any
    exception. The lock is what BEGIN IMMEDIATE is on SQLite: one writer per inbox.

    Round trips are what a transaction costs here, so BEGIN travels with the lock and the
    change count with COMMIT (one simple-protocol message each). `ahead` (what `fn` does
    first) travels with the lock too, where the schema's statements are the newest: a
    claim's look and the probe for due timers (Tx.saw_look), or a finish and the look after
    it (Tx.saw_finish). Both run after the lock is granted, as they would a round trip later;
    their rows are used only where the transaction's own decision asks for exactly them, and
    the finish writes only where the engine would have asked for it (fenced in the statement
    as the engine fences). Every value in these messages is an integer of ours, or a text
    quoted by psycopg (`Literal`)."""
    if isinstance(ahead, (ClaimAhead, FinishClaimAhead)):
        taken = _take(tx, fn, args, ahead)
        if taken is not _NOT_TAKEN:
            return cast(T, taken)
        ahead = ahead.look() if isinstance(ahead, ClaimAhead) else ahead.finish
    conn = tx.conn
    tx.changed = False
    inbox = int(tx.inbox)
    text = f"BEGIN; EXECUTE {tx.lock}({inbox})"
    statements = SESSION_STATEMENTS
    if _newest(tx, ("claim",)):
        tx.commit_tail = f"EXECUTE onwatch_count({inbox}); COMMIT"
        statements = {**statements, **CLAIM_STATEMENT}
    if isinstance(ahead, FinishAhead) and _newest(tx, FINISH_PARTS):
        text += f"; {_execute_finish(conn, inbox, ahead)}"
        statements = {**statements, **FINISH_STATEMENT}
    else:
        # The server's time is read after the lock is granted (in the same message): "now"
        # for every decision of the transaction, however long the lock took. (The finish
        # above reads it itself.)
        text += "; EXECUTE onwatch_now"
        if isinstance(ahead, LookAhead) and _newest(tx, LOOK_PARTS):
            gen, max_attempts, limit, now = map(_number, ahead)
            text += f"; EXECUTE onwatch_look({inbox}, {gen}, {max_attempts}, {limit}, {now})"
            statements = {**statements, **LOOK_STATEMENT}
        else:
            ahead = None
    try:
        cursor = _begin(conn, text, statements)
        cursor.nextset()
        _locked(tx, cursor.fetchone())
        cursor.nextset()
        if isinstance(ahead, FinishAhead):
            tx.saw_finish(ahead, cursor.fetchall())
        else:
            tx.saw_server_time(one(cursor)[0])
            if ahead is not None:
                cursor.nextset()
                tx.saw_look(ahead.gen, ahead.max_attempts, ahead.limit, cursor.fetchall())
        result = fn(tx, *args)
        tx.unasked()  # a finish sent with the lock that fn never asked for: raises if it wrote
        if not tx.committed:  # a claim commits with its own message (Tx.claim)
            if tx.changed:
                conn.execute(f"EXECUTE onwatch_count({inbox}); COMMIT")
            else:
                conn.execute("COMMIT", prepare=False)
    except BaseException:
        _rollback(conn)
        tx.undone = True
        raise
    finally:
        tx.row = tx.begun_changes = tx.looked = tx.probed = tx.finished = tx.commit_tail = None
        tx.committed = False
    return result


_NOT_TAKEN = object()


def _take(
    tx: Tx, fn: Callable[..., T], args: Args, ahead: ClaimAhead | FinishClaimAhead
) -> T | object:
    """A woken worker's claim (runs.claim_next), or a run's finish and the claim after it
    (runs.finish_and_claim), in one round trip where it is plain: BEGIN, the lock,
    TAKE_WITH_LOCK (or FINISH_AND_TAKE_WITH_LOCK) and COMMIT in one message. The statement
    writes only where the engine, deciding on the rows it read, writes exactly that; `fn`
    then runs on those rows (no statement of its own: any would fail, the transaction being
    over), and its finish and claim must be the ones made, or it raises. Where the case was
    not plain the message changed nothing, and _NOT_TAKEN says to run the transaction as
    before; so does a claim that cannot be plain (settings with a budget or a run deadline,
    by the settings the last lock read: the statement checks they are still those), a
    server without IS JSON, a schema whose statements are not the newest, and the claim
    just after one not plain (a timer due, claims lost: the next may be the same, and costs
    no round trip more)."""
    conn = tx.conn
    seen = tx.seen_settings
    missed, tx.take_missed = tx.take_missed, False
    finish = ahead.finish if isinstance(ahead, FinishClaimAhead) else None
    claim = ahead.claim() if isinstance(ahead, FinishClaimAhead) else ahead
    if (
        missed
        or seen is UNSEEN
        or conn.info.server_version < TAKE_SERVER
        or not _newest(tx, TAKE_PARTS if finish is None else FINISH_TAKE_PARTS)
    ):
        return _NOT_TAKEN
    text = cast("str | None", seen)
    settings = settings_from(text)
    if not plain_claim(settings):
        return _NOT_TAKEN
    inbox = int(tx.inbox)
    gen, max_attempts, limit, now = map(
        _number, (claim.gen, settings.max_attempts, settings.max_batch, claim.now)
    )
    holder = pg_sql.Literal(claim.holder).as_string(conn)
    stored = "NULL" if text is None else pg_sql.Literal(text).as_string(conn)
    # A payload may nest no deeper than this thread's stack lets Python read it: its count
    # of `[` and `{` bounds its depth (the statement checks it).
    depth = sys.getrecursionlimit() // 2
    take = (
        f"{inbox}, {gen}, {max_attempts}, {limit}, {now}, {holder}, {stored}, "
        f"{'true' if claim.timers else 'false'}, {depth}"
    )
    if finish is None:
        take = f"EXECUTE onwatch_take({take})"
        statements = {**SESSION_STATEMENTS, **TAKE_STATEMENT}
    else:
        ids = ", ".join(str(int(i)) for i in finish.ids)
        outcome = "NULL" if finish.result is None else pg_sql.Literal(finish.result).as_string(conn)
        take = (
            f"EXECUTE onwatch_finish_take({take}, {int(finish.run)}, "
            f"ARRAY[{ids}]::bigint[], {outcome})"
        )
        statements = {**SESSION_STATEMENTS, **FINISH_TAKE_STATEMENT}
    tx.changed = False
    try:
        cursor = _begin(conn, f"BEGIN; EXECUTE {tx.lock}({inbox}); {take}; COMMIT", statements)
        cursor.nextset()
        _locked(tx, cursor.fetchone())
        cursor.nextset()
        rows = cursor.fetchall()
        looked = [row for row in rows if row[-1] not in (10, 11)]  # the finish's own rows
        if not tx.saw_take(
            claim.holder, claim.gen, settings.max_attempts, settings.max_batch, looked
        ):
            tx.take_missed = True
            return _NOT_TAKEN
        if finish is not None:  # its look is the one the statement read, by these settings
            tx.saw_finish(
                finish._replace(max_attempts=settings.max_attempts, limit=settings.max_batch),
                rows,
            )
        tx.committed = True
        result = fn(tx, *args)
        if tx.taken is not None:
            raise RuntimeError(f"the claim made with the lock {tx.taken} was not the engine's")
        if tx.finished is not None:
            raise RuntimeError("the finish made with the lock was not the engine's")
    except BaseException:
        _rollback(conn)
        tx.undone = not tx.committed  # a committed claim is not undone by an error after it
        raise
    finally:
        tx.row = tx.begun_changes = tx.looked = tx.probed = tx.taken = tx.finished = None
        tx.committed = False
    return result


def _locked(tx: Tx, row: Row | None) -> None:
    """The inbox's row as a write transaction's lock read it (INBOX_ROW's columns)."""
    tx.row = row
    tx.begun_changes = None if row is None else row[5]
    if row is not None:
        tx.seen_settings = row[3]


def _newest(tx: Tx, names: tuple[str, ...]) -> bool:
    """Whether the transaction's statements `names` are the newest schema's (a session
    statement is built from those)."""
    return all(tx.statements[name] == STATEMENTS[name] for name in names)


def _number(value: int | None) -> str:
    return "NULL" if value is None else str(int(value))


def _execute_finish(conn: "psycopg.Connection[Row]", inbox: int, ahead: FinishAhead) -> str:
    """EXECUTE onwatch_finish for `ahead`: its integers written as integers, its texts (the
    holder, the result) quoted by psycopg for this connection."""
    ids = ", ".join(str(int(i)) for i in ahead.ids)
    holder = pg_sql.Literal(ahead.holder).as_string(conn)
    result = "NULL" if ahead.result is None else pg_sql.Literal(ahead.result).as_string(conn)
    gen, run, max_attempts, limit, now = map(
        _number, (ahead.gen, ahead.run, ahead.max_attempts, ahead.limit, ahead.now)
    )
    return (
        f"EXECUTE onwatch_finish({inbox}, {gen}, {run}, ARRAY[{ids}]::bigint[], "
        f"{max_attempts}, {limit}, {holder}, {result}, {now})"
    )


def write_unless(precheck: Callable[..., T | None]) -> Runner[T]:
    """A runner: `precheck(tx, *args)` outside any transaction (each statement its own
    snapshot, and its own commit), its answer when it has one (it decided: nothing to
    write, or a lone statement wrote it), else `fn` in a write transaction."""

    def run(tx: Tx, fn: Callable[..., T], args: Args) -> T:
        answer = precheck(tx, *args)
        return write_transaction(tx, fn, args) if answer is None else answer

    return run


def _written(ahead: Ahead | None) -> Runner[Any]:
    """A runner: `fn` in a write transaction, told what it does first (write_transaction)."""
    return lambda tx, fn, args: write_transaction(tx, fn, args, ahead)


class _Elsewhere(Exception):
    """A job on the event loop's thread that must run on the connection's thread instead
    (Database._write_here); it changed nothing."""


class _Writes:
    """A runner that writes (the Database's write methods), so told apart from one that
    only reads (see _run_held: after a write was refused)."""

    def __init__(self, runner: Callable[[Tx, Callable[..., Any], Args], Any]) -> None:
        self.runner = runner

    def __call__(self, tx: Tx, fn: Callable[..., T], args: Args) -> T:
        return cast(T, self.runner(tx, fn, args))


def read_transaction(tx: Tx, fn: Callable[..., T], args: Args) -> T:
    """`fn(tx, *args)` inside one read-only snapshot."""
    conn = tx.conn
    try:
        cursor = _begin(
            conn, "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY; EXECUTE onwatch_now"
        )
        cursor.nextset()
        tx.saw_server_time(one(cursor)[0])
        result = fn(tx, *args)
    except BaseException:
        _rollback(conn)
        tx.undone = True
        raise
    # A read-only snapshot ends the same either way, but psycopg forgets every statement it
    # prepared when it sees a ROLLBACK (the server may have dropped those prepared inside
    # the transaction): ending with COMMIT keeps them for the next read (measured: a fleet's
    # server CPU per job -16 %).
    conn.execute("COMMIT", prepare=False)
    return result


def _rollback(conn: "psycopg.Connection[Row]") -> None:
    """End an open transaction; a broken connection has none left to end (it is reopened
    at the next job), and trying would hide the error that broke it."""
    if (
        not conn.closed
        and not conn.broken
        and conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE
    ):
        conn.execute("ROLLBACK", prepare=False)


def _plain(tx: Tx, fn: Callable[..., T], args: Args) -> T:
    return fn(tx, *args)


class Database:
    """One connection to one inbox of a PostgreSQL database, with its own thread.

    Jobs go through one queue to the thread in order, as on aiosqlite's connection thread:
    `call` (autocommit statements), `read` (one snapshot), `write` and `write_soon` (one
    locked transaction). A connection lost between jobs is reopened at the next job.
    """

    def __init__(
        self,
        url: str,
        name: str,
        inbox: int,
        busy_timeout: float,
        conn: "psycopg.Connection[Row]",
        version: int = schema.SCHEMA_VERSION,
        server_time: float | None = None,
        shared: Connections | None = None,
    ) -> None:
        self.url = url
        # Shared: each job takes a connection from these for its duration (core/pg/shared.py).
        self._shared = shared
        # The database's schema as opened (older only when opened without migrating), the
        # one it had before this open migrated it, and why writes are refused (read-only).
        self.version = version
        self.migrated_from: int | None = None
        self.created = False  # whether this open made the inbox (Inbox.created)
        self.read_only: str | None = None
        self.loop_writes = False  # see may_write_here
        self._rest = LoopRest(log)  # no write on the loop's thread for a while after a slow one
        self._here_since: float | None = None  # (monotonic) a write on the loop's thread began
        self.name = name
        self.inbox = inbox
        # What messages and logs call it: no password, and a name with control characters
        # shown escaped (it must not forge a log line or drive a terminal).
        self.path = f"{printable(redact(url))} inbox {printable(name)}"
        self.busy_timeout = busy_timeout
        self._tx = Tx(conn, inbox, name, STATEMENTS.for_schema(version))
        self._skew_logged = 0.0  # (monotonic) when a clock skew was last logged
        if server_time is not None:  # the server's clock as the open read it
            self._tx.saw_server_time(server_time)
            self._check_skew(self._tx.offset)
        self._jobs: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._closed = False
        self._backoff = 0.0  # after a failed reconnection: how long until the next try
        self._retry_at = 0.0  # (monotonic) no attempt before this; jobs fail fast meanwhile
        self._outage_said = 0.0  # (monotonic) when a failed reconnection was last logged
        # After a write the server refused: which sessions may take writes (the shared
        # connections' own, for every inbox that shares them).
        self._refusals = shared.refusals if shared is not None else WriteRefusals()
        self._running_since: float | None = None  # (monotonic) since the job in hand began
        # Jobs handed to the thread (counted on the loop) and done (counted on the thread,
        # before the answer is handed back): each counter has one writer.
        self._submitted = self._finished = 0
        self._watch: asyncio.TimerHandle | None = None  # see _check_overdue
        self.wake = ListenWake(name)  # our commits notify it; others' through a Listener
        self._thread = threading.Thread(target=self._serve, name=f"onwatch-pg-{name}", daemon=True)
        self._thread.start()

    @staticmethod
    def _connect(url: str, busy_timeout: float) -> "psycopg.Connection[Row]":
        # lock_timeout plays SQLite's busy timeout: how long a write waits for the inbox.
        return connect(url, lock_timeout=f"{max(int(busy_timeout * 1000), 1)}ms")

    @classmethod
    async def open(
        cls,
        url: str,
        *,
        name: str = "default",
        create: bool = True,
        busy_timeout: float = 5.0,
        migrate: bool = False,
        read_only: bool = False,
        connections: Connections | None = None,
    ) -> "Database":
        """Open one inbox (creating the schema in an empty database, and the inbox `name`,
        unless create=False); raise NotAnInbox and leave the database untouched if it is
        foreign or newer, or the inbox is missing with create=False. A database of an older
        schema is migrated only with `migrate` (UpgradeRefused while any inbox's lease is
        held); `read_only` creates, migrates and writes nothing. With `connections` (of this
        URL and busy timeout) the inbox holds none of its own: each job takes one of those."""
        if psycopg is None:
            raise InboxError("PostgreSQL inboxes need psycopg 3: pip install 'psycopg[binary]'")
        where = redact(url)

        def prepare(
            conn: "psycopg.Connection[Row] | None",
        ) -> tuple[psycopg.Connection, int, int, int, float, bool, bool]:
            if conn is not None:  # kept idle, from an inbox of this database
                found = _open_known(conn, name)
                if found is not None:
                    inbox, server_time, refused = found
                    version = schema.SCHEMA_VERSION
                    return conn, inbox, version, version, server_time, refused, False
                if conn.closed or conn.broken:  # it did not survive (a restart meanwhile)
                    conn.close()
                    conn = None
            try:
                if conn is None:
                    conn = cls._connect(url, busy_timeout)
                    if connections is not None:
                        connections.opened_one()
                        connections.refusals.opened(conn)
            except psycopg.Error as exc:
                raise _cannot_connect(exc, url) from None
            try:
                try:
                    version = schema.inspect(conn, where)
                except NotAnInbox:
                    # Tables but no onwatch_schema may be another process creating the
                    # schema this very moment (its commit fell between our two looks):
                    # decided again below, under the migration lock, in one snapshot.
                    version = -1
                before = version
                if not read_only and (
                    version <= 0 or (migrate and version < schema.SCHEMA_VERSION)
                ):
                    # An empty database gets the schema (a new inbox's first open); an older
                    # one is migrated only when asked (docs/rules.md#upgrading-a-running-
                    # deployment). The version is read again under the migration lock.
                    before = schema.migrate(conn, where, create=create)
                    version = schema.SCHEMA_VERSION if before > 0 or create else 0
                if version <= 0:
                    raise NotAnInbox(
                        f"no onwatch database at {where} (run `onwatch init "
                        f"{where} --inbox {name}` to create one)"
                    )
                inbox, created = _find_inbox(conn, name, create, where)
                server_time, refused = one(conn.execute(_OPENED))
            except psycopg.Error as exc:
                conn.close()
                raise _map_error(exc, where, busy_timeout) from None
            except BaseException:
                conn.close()
                raise
            return conn, inbox, before, version, float(server_time), bool(refused), created

        def opened() -> tuple[psycopg.Connection, int, int, int, float, bool, bool]:
            if connections is None:
                return prepare(_pooled(url, busy_timeout))
            if (connections.url, connections.busy_timeout) != (url, busy_timeout):
                raise BadInput("connections shared by inboxes of another URL or busy timeout")
            found = None
            try:
                found = prepare(_shared_take(connections, f"{where} inbox {name}"))
                return (UNHELD, *found[1:])
            finally:
                connections.give(None if found is None else found[0])

        conn, inbox, before, version, server_time, refused, created = await asyncio.to_thread(
            opened
        )
        db = cls(url, name, inbox, busy_timeout, conn, version, server_time, connections)
        db.created = created
        if 0 < before < version:
            db.migrated_from = before
        if read_only:
            db.read_only = f"{db.path} was opened read-only"
        elif refused:
            db.read_only = (
                f"{db.path} is read-only: the server takes no writes ({READ_ONLY_SERVER})"
            )
        return db

    # --- the connection's thread ----------------------------------------------------------

    def _serve(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                break
            self._running_since = time.monotonic()
            try:
                job()
            finally:
                self._running_since = None
        if self._shared is None:
            conn = self._tx.conn
            if self._refusals.fit_to_write(conn):
                _give_back(self.url, self.busy_timeout, conn)
            else:  # not for the next inbox opened in this process either
                conn.close()

    def _run(self, runner: Runner[T], fn: Callable[..., T], args: Args) -> T:
        """On the thread: run one job on this inbox's connection, or on one taken from the
        shared connections for the job's duration (opened first if none is idle)."""
        shared = self._shared
        if shared is None:
            return self._run_held(runner, fn, args)
        tx = self._tx
        # The overdue watch times the job from when it has a connection: a wait for one (all
        # taken by busy inboxes, up to the busy timeout) is no sign of a silent server.
        self._running_since = None
        tx.conn = _shared_take(shared, f"inbox {self.path}") or UNHELD
        self._running_since = time.monotonic()
        try:
            return self._run_held(runner, fn, args)
        finally:
            conn, tx.conn = tx.conn, UNHELD
            shared.give(None if conn is UNHELD else conn)

    def _run_held(
        self, runner: Runner[T], fn: Callable[..., T], args: Args, again: bool = False
    ) -> T:
        """On the thread: run one job, reconnecting first if the connection was lost.

        Reconnection backs off (0.1 s doubling to MAX_BACKOFF) while the server stays
        unreachable; a job that comes meanwhile fails at once with ConnectionLost rather
        than wait, so a receiver answers 503 and a worker retries later. The loss and the
        reconnection are logged once each.

        Every job begins and ends its own transactions, so a session found not idle was
        left by a job that met an error mid-reply (a command still in progress that nobody
        reads) or mid-transaction: every statement on it would fail at once ("another
        command is already in progress") without psycopg ever calling it broken, and the
        inbox would refuse every write until restarted. It is closed and reopened as a lost
        one (the server rolls back whatever it held). A session the server ended while it
        was idle (connect.py `ended_while_idle`) is replaced before the job is sent: nothing
        was lost, and the log says so at INFO, not as a loss.

        After the server refused a write (ServerReadOnly), a write runs only on a session
        that may take it (shared.py `WriteRefusals`): a session opened while writes were off
        (by a read) stays read-only after they are back."""
        tx = self._tx
        conn = tx.conn
        writes = isinstance(runner, _Writes)
        if writes and not conn.closed and not self._refusals.fit_to_write(conn):
            conn.close()
            tx.conn = UNHELD  # opened again below, as a session wanted, not a lost one
        if not conn.closed and conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
            conn.close()
        elif not conn.closed:
            self._drop_if_ended()  # opened again below, as a session wanted, not a lost one
        if tx.conn.closed or tx.conn.broken:
            # UNHELD: a shared connection to open (none idle), not a loss, unless it fails.
            lost = tx.conn is not UNHELD
            if time.monotonic() < self._retry_at:
                raise ConnectionLost(
                    f"inbox {self.path}: lost the connection to PostgreSQL; "
                    f"reconnecting (next try in at most "
                    f"{self._backoff:.1f} s), try again"
                )
            if self._backoff == 0.0 and lost:
                log.warning("inbox %s: lost the connection to PostgreSQL; reconnecting", self.path)
            try:
                tx.conn = self._connect(self.url, self.busy_timeout)
            except psycopg.Error as exc:
                self._backoff = min(max(self._backoff * 2, 0.1), MAX_BACKOFF)
                now = time.monotonic()
                self._retry_at = now + self._backoff
                if now - self._outage_said >= OUTAGE_LOG_EVERY:  # once, then once a minute
                    self._outage_said = now
                    log.warning(
                        "inbox %s: cannot reconnect (%s); trying again every %.0f s at most",
                        self.path,
                        said(exc),
                        MAX_BACKOFF,
                    )
                raise _map_error(exc, self.path, self.busy_timeout) from None
            if lost or self._backoff:
                log.warning("inbox %s: reconnected to PostgreSQL", self.path)
            self._backoff = self._retry_at = self._outage_said = 0.0
            self._refusals.opened(tx.conn)
            if self._shared is not None:
                self._shared.opened_one()
        return self._run_ready(runner, fn, args, again)

    def _run_ready(
        self, runner: Runner[T], fn: Callable[..., T], args: Args, again: bool, here: bool = False
    ) -> T:
        """Run one job on a connection ready for it (_run_held), its errors mapped; `here`:
        on the event loop's own thread (_write_here), where a job that must wait or begin
        again in a new session raises _Elsewhere, having changed nothing."""
        tx = self._tx
        tx.server_time = None  # read again by each job that needs it
        tx.undone = False
        try:
            result = runner(tx, fn, args)
            if isinstance(runner, _Writes):
                self._refusals.committed(tx.conn)
            return result
        except pg_errors.LockNotAvailable as exc:
            # NOWAIT on the loop's thread: another session holds the inbox's row, and the
            # statement that asked for it changed nothing (an autocommit statement, or the
            # first of a transaction, rolled back). The connection's thread waits for it.
            if here:
                raise _Elsewhere from None
            raise _map_error(exc, self.path, self.busy_timeout) from None
        except pg_errors.InvalidSqlStatementName:
            # A statement psycopg prepared by itself is gone from the session (DEALLOCATE or
            # DISCARD ALL sent by something between us and the server; ours are prepared
            # again by _begin), and psycopg cannot know which: every later use would fail.
            # A new session, then: a job whose transaction rolled back (it changed nothing)
            # runs once more in it; any other stopped at the statement that failed.
            tx.conn.close()
            if tx.undone and not again:
                if here:  # the connection's thread opens the new session
                    raise _Elsewhere from None
                return self._run_held(runner, fn, args, again=True)
            raise ConnectionLost(
                f"inbox {self.path}: the PostgreSQL session lost statements prepared in it "
                f"(reset by a pooler?); reconnecting, try again"
            ) from None
        except pg_errors.ReadOnlySqlTransaction as exc:
            # The server took writes when the inbox was opened: a failover demoted it, or
            # writes were turned off for maintenance. The session is dropped (one opened
            # while writes were off stays read-only for good), and the next job opens one
            # that reaches whichever server the URL names by then.
            tx.conn.close()
            tx.conn = UNHELD
            self._refusals.refused = True
            raise ServerReadOnly(
                f"inbox {self.path}: the PostgreSQL server stopped taking writes "
                f"({said(exc)}: {READ_ONLY_SERVER}; a failover or maintenance?); nothing "
                f"was written, try again"
            ) from None
        except psycopg.Error as exc:
            raise _map_error(exc, self.path, self.busy_timeout) from None
        finally:
            if tx.server_time is not None:
                self._check_skew(tx.offset)

    def _check_skew(self, offset: float) -> None:
        if abs(offset) <= SKEW_WARNING:
            self._skew_logged = 0.0
            return
        now = time.monotonic()
        if self._skew_logged and now - self._skew_logged < SKEW_LOG_EVERY:
            return
        self._skew_logged = now
        log.warning(
            "inbox %s: this machine's clock is %s the PostgreSQL server's by %.1f s; leases, "
            "deadlines and timers follow the server's clock, but check this machine's time "
            "synchronisation",
            self.path,
            "behind" if offset > 0 else "ahead of",
            abs(offset),
        )

    @property
    def clock_offset(self) -> float:
        """The server's clock minus this process's, in seconds, as last read."""
        return self._tx.offset

    def _submit(
        self,
        runner: Runner[T],
        fn: Callable[..., T],
        args: Args,
        done: Callable[[T | None, BaseException | None], None],
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        if self._closed:
            raise InboxError(f"inbox {self.path} is closed")

        def job() -> None:
            try:
                result = self._run(runner, fn, args)
            except BaseException as exc:  # noqa: B036 - handed to the caller, not lost
                error: BaseException | None = exc
                result = None
            else:
                error = None
            # Counted done before it is answered: the loop, answered, finds the thread idle
            # (may_write_here) and the connection free.
            self._finished += 1
            try:
                loop.call_soon_threadsafe(done, result, error)
            except RuntimeError:  # the loop is gone: nobody is waiting any more
                pass

        self._submitted += 1
        self._jobs.put(job)
        if self._watch is None:
            self._watch = loop.call_later(self.busy_timeout + JOB_GRACE, self._check_overdue)

    def _check_overdue(self) -> None:
        """On the loop, while jobs are queued: a job running for longer than its deadline
        met a server that stopped answering; cut its socket (the job then fails as a lost
        connection). One timer per connection, re-armed while there is work."""
        self._watch = None
        deadline = self.busy_timeout + JOB_GRACE
        started = self._running_since
        wait = deadline
        if started is not None:
            running_for = time.monotonic() - started
            if running_for > deadline:
                log.warning(
                    "inbox %s: PostgreSQL did not answer for %.0f s; dropping the connection",
                    self.path,
                    running_for,
                )
                self._cut()
            else:
                wait = deadline - running_for
        if self._submitted != self._finished and not self._closed:
            loop = asyncio.get_running_loop()
            self._watch = loop.call_later(max(wait, 1.0), self._check_overdue)

    def _cut(self) -> None:
        """Shut the connection's socket down under whatever blocks on it (from any thread):
        a read waiting for a silent server returns at once, as on a lost connection."""
        conn = self._tx.conn
        try:
            fd = conn.pgconn.socket
        except psycopg.Error:
            return  # closed already
        try:
            with socket.socket(fileno=os.dup(fd)) as sock:  # a duplicate: ours to close
                sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    async def _await(self, runner: Runner[T], fn: Callable[..., T], args: Args) -> T:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()

        def done(result: T | None, error: BaseException | None) -> None:
            if future.done():
                return
            if error is not None:
                future.set_exception(error)
            else:
                future.set_result(cast(T, result))  # no error: fn returned it

        self._submit(runner, fn, args, done, loop)
        return await future

    # --- the interface of core/sqlite/db.py-----------------------------------------------------

    async def call(self, fn: Callable[..., T], *args: Any) -> T:
        """Run `fn(tx, *args)` on the connection's thread, each statement on its own."""
        return await self._await(_plain, fn, args)

    def _writable(self) -> None:
        if self.read_only is not None:
            raise ReadOnlyInbox(f"inbox {self.read_only}; nothing was written")

    async def write(self, fn: Callable[..., T], *args: Any) -> T:
        """Run `fn` in one transaction holding the inbox's lock; roll back on any exception."""
        self._writable()
        result = await self._await(_Writes(_written(None)), fn, args)
        self.wake.notify()
        return result

    async def write_ahead(self, ahead: Ahead | None, fn: Callable[..., T], *args: Any) -> T:
        """write, with what `fn` does first sent with the lock (one round trip fewer; see
        write_transaction), on the event loop's own thread where `loop_writes` allows it
        (_write_here)."""
        self._writable()
        runner = _Writes(_written(ahead))
        done, result = self._write_here(runner, fn, args)
        if done:
            return cast(T, result)
        result = await self._await(runner, fn, args)
        self.wake.notify()
        return result

    async def write_alone(self, fn: Callable[..., T], *args: Any) -> T:
        """Run `fn`, one statement that commits by itself (it locks the inbox's row and
        counts its change itself): one round trip where a write transaction takes three."""
        self._writable()
        result = await self._await(_Writes(_plain), fn, args)
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
        to write), else `fn` in one transaction holding the inbox's lock. (`bounded` is
        SQLite's: where its statement journals are kept. PostgreSQL keeps none.)"""
        self._writable()
        result = await self._await(_Writes(write_unless(precheck)), fn, args)
        self.wake.notify()
        return result

    async def read(self, fn: Callable[..., T], *args: Any) -> T:
        """Run `fn` inside one read snapshot."""
        return await self._await(read_transaction, fn, args)

    def write_soon(
        self,
        fn: Callable[..., T],
        args: Args,
        done: Callable[[T | None, BaseException | None], None],
    ) -> None:
        """Queue `fn` in its own write transaction; call `done(result, error)` on this loop
        once it committed or rolled back (the callback form of `write`, for group commit)."""
        self._queue_write(fn, args, done)

    def _queue_write(
        self,
        fn: Callable[..., T],
        args: Args,
        done: Callable[[T | None, BaseException | None], None],
        runner: Runner[T] = write_transaction,
    ) -> None:
        self._writable()

        def committed(result: T | None, error: BaseException | None) -> None:  # on the loop
            if error is None:
                self.wake.notify()
            done(result, error)

        self._submit(_Writes(runner), fn, args, committed, asyncio.get_running_loop())

    def write_soon_alone(
        self,
        alone: Callable[..., T | None],
        fn: Callable[..., T],
        args: Args,
        done: Callable[[T | None, BaseException | None], None],
    ) -> None:
        """`write_soon`, trying `alone(tx, *args)` first: one autocommit statement that
        locks the inbox's row itself (no BEGIN or COMMIT of its own: one round trip where a
        transaction takes four). Only if it returns None does `fn` run in its own write
        transaction."""
        self._queue_write(fn, args, done, runner=write_unless(alone))

    def may_write_here(self) -> bool:
        """True if a write may run on the event loop's own thread now (write_ahead,
        write_here_alone): `loop_writes` is set, the inbox holds a connection of its own (a
        fleet's shared ones serve other inboxes meanwhile), nothing is queued on the
        connection's thread (the order of calls is kept), and the last such write was
        quick."""
        return (
            self.loop_writes
            and self._shared is None
            and self._submitted == self._finished
            and not self._closed
            and not self._rest.resting(time.monotonic())
        )

    def write_here_alone(
        self, alone: Callable[..., T | None], fn: Callable[..., T], args: Args
    ) -> tuple[bool, T | None]:
        """write_soon_alone's work on the event loop's own thread, now, where _write_here
        may: (True, its result), or (False, None) with nothing written (the caller then
        queues it on the connection's thread). An error is raised, mapped."""
        return self._write_here(_Writes(write_unless(alone)), fn, args)

    def _write_here(
        self, runner: Runner[T], fn: Callable[..., T], args: Args
    ) -> tuple[bool, T | None]:
        """One write job on this thread, the event loop's, tried once where may_write_here
        allows it and the connection is ready (else the connection's thread, which reopens
        it, takes the job): (True, its result), or (False, None) with nothing written.

        A worker's claims and finishes, and a producer's lone ingests (`loop_writes`), are a
        round trip each, and the hand-off to the connection's thread and back costs about
        30 µs of CPU and as much time again (docs/performance.md). Here the loop waits for
        the server, but never for another session: the inbox's row is locked NOWAIT, and
        held elsewhere the statement changes nothing and the job goes to the connection's
        thread, which waits as every write does. Nor for a silent server: a write the server
        has not answered in LOOP_WRITE_STALL is cut (_StallWatch) and fails as a lost
        connection, as the thread's overdue job does later. One that took longer than
        LOOP_WRITE_SLOW sends the next ones to the thread for LOOP_WRITE_REST seconds."""
        if not self.may_write_here() or not self._ready_here():
            return False, None
        self._writable()
        tx = self._tx
        tx.nowait = True
        started = self._here_since = time.monotonic()
        _STALLS.watch(self)
        try:
            result = self._run_ready(runner, fn, args, again=False, here=True)
        except _Elsewhere:
            return False, None
        finally:
            self._here_since = None
            tx.nowait = False
            self._rest.after(self.path, started, time.monotonic())
        self.wake.notify()
        return True, result

    def _drop_if_ended(self) -> bool:
        """Whether the server ended the inbox's session while it was idle (connect.py
        `ended_while_idle`): then it is closed and let go (the next job opens a session as
        one wanted, not a lost one), and the log says so at INFO."""
        tx = self._tx
        if not ended_while_idle(tx.conn):
            return False
        tx.conn.close()
        tx.conn = UNHELD
        log.info(
            "inbox %s: the server ended the session while it was idle "
            "(idle_session_timeout, a restart?); opening a new one",
            self.path,
        )
        return True

    def _ready_here(self) -> bool:
        """Whether this inbox's own connection can take a job on the loop's thread as it
        is: open, idle, fit to write, not ended by the server meanwhile (else _run_held
        mends it on the connection's thread, reconnecting)."""
        conn = self._tx.conn
        return (
            not conn.closed
            and not conn.broken
            and conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
            and self._refusals.fit_to_write(conn)
            and not self._drop_if_ended()
        )

    def _stalled(self, since: float) -> None:
        """From _StallWatch's thread: the write on the loop's thread that began at `since`
        has had no answer for LOOP_WRITE_STALL; cut its socket (once)."""
        if self._here_since != since:
            return  # it ended meanwhile
        self._here_since = None
        log.warning(
            "inbox %s: PostgreSQL did not answer a write on the event loop for %.1f s; "
            "dropping the connection",
            self.path,
            time.monotonic() - since,
        )
        self._cut()

    def file_replaced(self) -> str | None:
        """Always None: an inbox in a database server has no file to be deleted or swapped."""
        return None

    def peek(self, fn: Callable[..., T], *args: Any) -> T | None:
        """None: "cannot answer at once". SQLite answers tiny reads on the loop's thread from
        a local file; here that would be a network round trip on the event loop."""
        return None

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        _STALLS.forget(self)
        self.wake.close()
        self._jobs.put(None)
        if self._watch is not None:
            self._watch.cancel()
            self._watch = None
        await asyncio.to_thread(self._thread.join, CLOSE_WAIT)
        if self._thread.is_alive():  # a job waits on a server that does not answer
            self._cut()
            await asyncio.to_thread(self._thread.join, CLOSE_WAIT)


async def migrate_database(url: str, *, busy_timeout: float = 5.0) -> tuple[int, int]:
    """Migrate the whole database at `url` (every inbox in it) to this release's schema;
    return its version before and after (see core/backends.py `migrate`)."""
    if psycopg is None:
        raise InboxError("PostgreSQL inboxes need psycopg 3: pip install 'psycopg[binary]'")
    where = redact(url)

    def run() -> tuple[int, int]:
        try:
            conn = Database._connect(url, busy_timeout)
        except psycopg.Error as exc:
            raise _cannot_connect(exc, url) from None
        try:
            before = schema.migrate(conn, where, create=False)
        except psycopg.Error as exc:
            raise _map_error(exc, where, busy_timeout) from None
        finally:
            conn.close()
        if before == 0:
            raise NotAnInbox(
                f"no onwatch database at {where} (run `onwatch init {where}` to create one)"
            )
        return before, schema.SCHEMA_VERSION

    return await asyncio.to_thread(run)


# What opening an inbox reads on a connection kept from an inbox of the same database (see
# _pooled), in one round trip where the full path takes four: the schema as this release
# writes it, the inbox's id, and the server's clock.
# The server's time, and whether its transactions are read-only (a replica's URL): an open
# says so at once, not at its first write.
_OPENED = f"SELECT ({SERVER_TIME}), current_setting('transaction_read_only') = 'on'"
_OPEN_KNOWN = (
    "SELECT s.application, s.version, (SELECT id FROM inboxes WHERE name = %s), "
    f"({SERVER_TIME}), current_setting('transaction_read_only') = 'on' "
    "FROM onwatch_schema s WHERE s.id = 1"
)


def _open_known(conn: "psycopg.Connection[Row]", name: str) -> tuple[int, float, bool] | None:
    """(the inbox's id, the server's time, whether its transactions are read-only) when the
    database is of this release's schema
    and holds the inbox `name`; None for anything else (a schema changed since, no such
    inbox, a connection that did not survive), which the full path then decides."""
    try:
        row = conn.execute(_OPEN_KNOWN, (name,)).fetchone()
    except psycopg.Error:
        return None
    if (
        row is None
        or row[0] != schema.APPLICATION
        or row[1] != schema.SCHEMA_VERSION
        or row[2] is None
    ):
        return None
    return int(row[2]), float(row[3]), bool(row[4])


NAMES_SHOWN = 5  # of a database's inboxes, named when the one asked for is not there


def _inbox_names(conn: "psycopg.Connection[Row]") -> str:
    """The database's first inboxes by name, quoted and escaped (a name is anyone's text),
    for a person choosing one: "'alpha', 'beta' and 3 more"; "" when it has none."""
    count = int(one(conn.execute("SELECT count(*) FROM inboxes"))[0])
    rows = conn.execute(
        "SELECT name FROM inboxes ORDER BY name LIMIT %s", (NAMES_SHOWN,)
    ).fetchall()
    names = ", ".join(f"'{printable(row[0])}'" for row in rows)
    return names + (f" and {count - len(rows):,} more" if count > len(rows) else "")


def _find_inbox(
    conn: "psycopg.Connection[Row]", name: str, create: bool, where: str
) -> tuple[int, bool]:
    """The inbox's id, creating it (one insert) unless create=False; and whether this call
    created it (False where another process created it meanwhile)."""
    import time

    row = conn.execute("SELECT id FROM inboxes WHERE name = %s", (name,)).fetchone()
    if row is not None:
        found: int = row[0]
        return found, False
    if not create:
        others = _inbox_names(conn)
        if not others:
            raise NotAnInbox(
                f"no inbox {name!r} in {where} "
                f"(run `onwatch init {where} --inbox {name}` to create it)"
            )
        raise NotAnInbox(
            f"no inbox {name!r} in {where}; it holds {others} (name one with --inbox NAME, "
            f"or run `onwatch init {where} --inbox {name}` to create this one)"
        )
    with conn.transaction():
        row = conn.execute(
            "INSERT INTO inboxes(name, created) VALUES (%s, %s) ON CONFLICT (name) DO NOTHING "
            "RETURNING id",
            (name, int(time.time())),
        ).fetchone()
        created = row is not None
        if row is None:  # created by someone else meanwhile
            row = one(conn.execute("SELECT id FROM inboxes WHERE name = %s", (name,)))
        else:
            conn.execute(
                "INSERT INTO event_counts(inbox_id, status) SELECT %s, s FROM unnest("
                "ARRAY['pending','running','done','dead','interrupted','cancelled']) AS s",
                (row[0],),
            )
    inbox: int = row[0]
    return inbox, created
