"""Connections shared by the inboxes one process serves at once (the fleet worker's visits).

An inbox opened with `Connections` (`Inbox.open(url, name=…, connections=…)`) holds no
connection of its own: each job on its thread (one transaction, or one statement that
commits by itself) takes one for its duration and gives it back (core/pg/db.py
`Database._run`). A fleet serving N inboxes at once then keeps as many sessions on the
server as it has transactions in flight, at most `limit`, not N: every session costs the
server (a fresh one some 20 ms of its CPU before its caches are warm; idle ones beside the
busy ones slow those; docs/performance.md). Nothing of an inbox lives in a
session between two jobs (each job begins and ends its own transactions), so which session
a job gets changes nothing but the cost.

A job that finds all `limit` connections taken waits for one, at most `wait` seconds
(`take`); then it fails as a busy inbox does (InboxBusy: nothing changed, try again).
"""

from __future__ import annotations

import threading
import time
import weakref
from typing import TYPE_CHECKING

import psycopg

if TYPE_CHECKING:
    from .rows import Row


class WriteRefusals:
    """What a write the server refused (ServerReadOnly: a failover, or writes turned off)
    leaves for the writes after it, kept for the sessions one inbox opens, or the sessions
    inboxes share (one for all of them): a session opened while writes were off stays
    read-only after they are back (the server reads `default_transaction_read_only` once,
    at a session's start), and a read opened it, so nobody noticed. Until a write commits,
    each write runs on a session opened for it (`fit_to_write` false), and a session opened
    meanwhile never runs a write. Touched by the inboxes' threads: a lock guards it."""

    def __init__(self) -> None:
        self.refused = False  # a write was refused, and none committed since
        self._opened: weakref.WeakSet[psycopg.Connection[Row]] = weakref.WeakSet()
        self._lock = threading.Lock()

    def opened(self, conn: "psycopg.Connection[Row]") -> None:
        """A session was opened (for any job)."""
        if self.refused:
            with self._lock:
                self._opened.add(conn)

    def fit_to_write(self, conn: "psycopg.Connection[Row]") -> bool:
        if self.refused:
            return False
        if not self._opened:  # the common case: no spell seen since this process began
            return True
        with self._lock:
            return conn not in self._opened

    def committed(self, conn: "psycopg.Connection[Row]") -> None:
        """A write committed on `conn`: writes are taken, and by this session."""
        self.refused = False
        if self._opened:
            with self._lock:
                self._opened.discard(conn)


class Connections:
    """At most `limit` connections to `url`, each opened with `busy_timeout` (the lock wait
    of every inbox opened with them), taken by one job at a time."""

    def __init__(self, url: str, *, limit: int, busy_timeout: float = 5.0) -> None:
        if limit < 1:
            raise ValueError(f"limit must be at least 1, got {limit}")
        self.url = url
        self.limit = limit
        self.busy_timeout = busy_timeout
        self.opened = 0  # connections opened in all (a test and the benchmark read it)
        self.refusals = WriteRefusals()  # one for all the inboxes that share them
        self._idle: list[psycopg.Connection[Row]] = []  # the last given back last
        self._out = 0  # taken, or reserved for a connection being opened
        self._closed = False
        self._cond = threading.Condition()

    def take(self, wait: float) -> "psycopg.Connection[Row] | None":
        """An idle connection, the most recently used (its caches warmest); None when there
        is none but the limit allows one more: the caller opens it (`opened_one`) and gives
        it back like any other, or gives None back if it could not. Raises TimeoutError when
        all `limit` stayed taken for `wait` seconds."""
        deadline = time.monotonic() + wait
        with self._cond:
            while True:
                if self._closed:
                    raise psycopg.OperationalError("the shared connections are closed")
                while self._idle:
                    conn = self._idle.pop()
                    if conn.closed or conn.broken:
                        continue  # lost while idle (a restart): not counted as out
                    self._out += 1
                    return conn
                if self._out < self.limit:
                    self._out += 1
                    return None
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError
                self._cond.wait(left)

    def opened_one(self) -> None:
        with self._cond:
            self.opened += 1

    def give(self, conn: "psycopg.Connection[Row] | None") -> None:
        """Give back what `take` gave (None: the connection the caller was to open, not
        opened). Kept only if idle and healthy; closed otherwise, and the slot freed."""
        keep = (
            conn is not None
            and not conn.closed
            and not conn.broken
            and conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
        )
        with self._cond:
            self._out -= 1
            if keep and not self._closed:
                assert conn is not None
                self._idle.append(conn)
                conn = None
            self._cond.notify()
        if conn is not None:
            conn.close()

    def close(self) -> None:
        """Close the idle connections; those taken are closed as they are given back."""
        with self._cond:
            self._closed = True
            idle, self._idle = self._idle, []
            self._cond.notify_all()
        for conn in idle:
            conn.close()
