"""Instant wake on PostgreSQL: LISTEN on a dedicated connection, in a thread.

A commit that gives an inbox work (a new event: ingest, an approval's answer or expiry, a
timer; or an event made pending again by hand) sends a NOTIFY with the inbox's name from
the events triggers (core/pg/schema.py), on its schema's channel (SCHEMA_CHANNEL; `onwatch`
for every schema before database schema 8), delivered only if and when it commits. A
`Listener` turns those into wake-ups a worker awaits:

    listener = await Listener.open(url)
    seen = listener.seen("support")
    ... look for work in inbox "support" ...
    await listener.wait("support", seen, timeout=30)   # True: woken (or a reconnect)

Taking `seen` before looking for work closes the gap where a notification arrives between
the look and the wait. If the connection is lost, every waiter is woken at once (it should
look again, as it would after a poll), `wait` degrades to a sleep of at most
`poll_interval` while reconnecting with backoff, and the reconnection wakes everyone again,
because notifications sent meanwhile were lost. `reconnects` counts them; each is logged.
"""

from __future__ import annotations

import asyncio
import logging
import select
import socket
import threading
import time
from collections import defaultdict
from typing import Awaitable, Callable, TypeVar

import psycopg
from psycopg import sql

from ..connection import WaiterCounts, until_set
from . import redact, said
from .connect import connect

T = TypeVar("T")
log = logging.getLogger("onwatch.pg.listen")
CHANNEL = "onwatch"  # every schema's, before database schema 8
# The channel of the schema whose tables this session's statements name (the events' own, or
# where they would be made): what the trigger of database schema 8 sends on (schema.py
# CHANNEL_OF_SCHEMA, with TG_TABLE_SCHEMA).
SCHEMA_CHANNEL = """
SELECT 'onwatch.' || md5(coalesce(
    (SELECT n.nspname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
     WHERE c.oid = to_regclass('events')),
    current_schema()))
"""
# Seconds the listening thread waits on its socket at most before it reads again: a
# notification wakes it at once, a close too (its own socket pair). The bound is for what
# the socket may not show: a notification already read into a TLS layer's buffer.
IDLE_WAIT = 0.2


class Listener:
    def __init__(
        self,
        url: str,
        conn: psycopg.Connection | None,
        loop: asyncio.AbstractEventLoop,
        *,
        poll_interval: float = 1.0,
        max_backoff: float = 5.0,
    ) -> None:
        self.url = url
        self.poll_interval = poll_interval
        self.max_backoff = max_backoff
        self.reconnects = 0
        self.connected = conn is not None
        self._conn: psycopg.Connection | None = conn
        self._loop = loop
        self._counts: dict[str, int] = defaultdict(int)
        self._generation = 0  # moves on every loss and every reconnection: wake everyone
        self._waiters: dict[str, set[asyncio.Future[bool]]] = defaultdict(set)
        self._stopping = threading.Event()
        # Written to by close(): the listening thread waits on it beside its connection.
        self._bell, self._bell_rung = socket.socketpair()
        self._thread = threading.Thread(target=self._listen, name="onwatch-pg-listen", daemon=True)
        self._thread.start()

    @classmethod
    async def open(cls, url: str, **options: float) -> "Listener":
        """Start listening. A server that cannot be reached now (a restart, a network cut)
        is not an error: the listener starts disconnected, its waiters poll, and it
        connects with backoff, saying so in the log."""
        try:
            conn = await asyncio.to_thread(cls._connect, url)
        except psycopg.Error as exc:
            log.warning(
                "listener: cannot reach %s (%s); polling until it can",
                redact(url),
                said(exc),
            )
            conn = None
        return cls(url, conn, asyncio.get_running_loop(), **options)

    @staticmethod
    def _connect(url: str) -> psycopg.Connection:
        """A session listening on its schema's channel, and on the one every schema used
        before database schema 8 (a database not migrated yet, or migrated meanwhile)."""
        conn = connect(url, waits=True)
        try:
            [own] = conn.execute(SCHEMA_CHANNEL).fetchone() or [None]
            for channel in (CHANNEL, own):
                if channel is not None:
                    conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel)))
        except BaseException:
            conn.close()
            raise
        return conn

    # --- on the loop ----------------------------------------------------------------------

    def seen(self, name: str) -> tuple[int, int]:
        """A mark of what has been heard for `name` so far; pass it to `wait`."""
        return self._counts[name], self._generation

    async def wait(self, name: str, seen: tuple[int, int], timeout: float | None) -> bool:
        """Wait until `name` is notified after `seen`, or the connection was lost or regained
        since (True: look for work), or `timeout` seconds passed (False). While disconnected,
        return True after at most `poll_interval` (polling, the fallback)."""
        if self.seen(name) != seen:
            return True
        polling = not self.connected  # True after the poll, or sooner at the reconnection
        if polling:
            timeout = self.poll_interval if timeout is None else min(timeout, self.poll_interval)
        future: asyncio.Future[bool] = self._loop.create_future()
        self.watch(name, future)
        try:
            return await until_set(future, timeout) or polling
        finally:
            self.unwatch(name, future)

    def watch(self, name: str, future: asyncio.Future[bool]) -> None:
        """Set `future` (to True) once `name` is notified, or the connection is lost or
        regained; `unwatch` it when the wait ends. A waiter that also waits on something
        else adds its own future here rather than a task around `wait` (fewer turns of
        the loop between a NOTIFY and the claim it starts)."""
        self._waiters[name].add(future)

    def unwatch(self, name: str, future: asyncio.Future[bool]) -> None:
        self._waiters[name].discard(future)

    async def wait_any(self, timeout: float | None) -> bool:
        """Wait until any inbox is notified, or the connection is lost or regained (True),
        or `timeout` seconds passed (False)."""
        return await self.wait("", self.seen(""), timeout)

    def _heard(self, name: str) -> None:
        self._counts[name] += 1
        self._counts[""] += 1  # "" stands for any inbox (no inbox has an empty name)
        for key in (name, ""):
            for future in self._waiters.get(key, ()):
                if not future.done():
                    future.set_result(True)

    def _wake_all(self, connected: bool) -> None:
        self.connected = connected
        self._generation += 1
        for futures in self._waiters.values():
            for future in futures:
                if not future.done():
                    future.set_result(True)

    async def close(self) -> None:
        """Stop listening: the thread notices at once and ends, closing its connection."""
        self._stopping.set()
        try:
            self._bell.send(b"\0")
        except OSError:  # closed already (a second close)
            pass
        await asyncio.to_thread(self._thread.join)
        self._bell.close()
        self._bell_rung.close()

    # --- on the listening thread ----------------------------------------------------------

    def _post(self, fn: Callable[..., None], *args: object) -> None:
        try:
            self._loop.call_soon_threadsafe(fn, *args)
        except RuntimeError:  # the loop is closed: nobody waits any more
            self._stopping.set()

    def _listen(self) -> None:
        backoff, said_at = 0.1, 0.0
        while not self._stopping.is_set():
            conn = self._conn
            if conn is None:
                try:
                    conn = self._conn = self._connect(self.url)
                except psycopg.Error as exc:
                    if time.monotonic() - said_at >= 60.0:  # once, then once a minute
                        said_at = time.monotonic()
                        log.warning(
                            "listener: cannot reconnect to %s (%s); trying again every "
                            "%.0f s at most",
                            redact(self.url),
                            said(exc),
                            self.max_backoff,
                        )
                    self._stopping.wait(backoff)
                    backoff = min(backoff * 2, self.max_backoff)
                    continue
                self.reconnects += 1
                backoff, said_at = 0.1, 0.0
                log.warning(
                    "listener: reconnected to %s; waking every waiter (notifications "
                    "sent meanwhile were lost)",
                    redact(self.url),
                )
                self._post(self._wake_all, True)
            try:
                # What has come (read without waiting), then a wait for more on the socket,
                # or for close()'s bell.
                for notify in conn.notifies(timeout=0):
                    self._post(self._heard, notify.payload)
                select.select([conn.fileno(), self._bell_rung.fileno()], [], [], IDLE_WAIT)
            except psycopg.Error as exc:
                log.warning(
                    "listener: lost the connection to %s (%s); polling until it is back",
                    redact(self.url),
                    said(exc),
                )
                self._post(self._wake_all, False)
                try:
                    conn.close()
                except psycopg.Error:
                    pass
                self._conn = None
                time.sleep(0.05)
        if self._conn is not None:
            self._conn.close()


class ListenWake(WaiterCounts):
    """What `Inbox.wake` is on PostgreSQL: core/sqlite/wake.py's interface (`seq`, `watching`,
    `notify`, `wait`, `confirm`, `close`), fed by NOTIFY instead of the file notifier.

    Commits through this process's own connection call `notify`; other connections' commits
    arrive through a `Listener` once one is attached (`attach`, done by the listening worker
    and the fleet). `seq` moves with either, and with every loss or regain of the listening
    connection, so a waiter that took `seq` before reading the change token misses nothing.
    A NOTIFY is delivered after its commit, so `confirm` needs one read, not the file's
    retries. Without a listener `watching` is False and waiters poll, as on a file
    without inotify.
    """

    source = "NOTIFY"  # what wakes the waiters, for the worker's log

    def __init__(self, name: str) -> None:
        self.name = name
        self.listener: Listener | None = None
        self._own = 0
        self._heard_before = -1  # NOTIFYs heard for this inbox when the last wait began
        super().__init__()

    def attach(self, listener: Listener | None) -> None:
        self.listener = listener
        self.notify()  # whoever waits should look again with the new source

    @property
    def seq(self) -> int:
        listener = self.listener
        if listener is None:
            return self._own
        heard, generation = listener.seen(self.name)
        return self._own + heard + generation

    @property
    def watching(self) -> bool:
        return self.listener is not None and self.listener.connected

    def notify(self) -> None:
        self._own += 1
        self._waiters.wake_all()

    async def wait(self, since: int, timeout: float) -> bool:
        """Wait until `seq` moves past `since` (True) or `timeout` seconds pass (False)."""
        listener = self.listener
        self._heard_before = -1 if listener is None else listener.seen(self.name)[0]
        if self.seq != since:
            return True
        # One future, set by this process's own commits (notify) and by the listener (this
        # inbox named, the connection lost or regained).
        future = self._waiters.add(asyncio.get_running_loop())
        if listener is not None:
            if not listener.connected:
                timeout = min(timeout, listener.poll_interval)  # polling meanwhile
            listener.watch(self.name, future)
        try:
            await until_set(future, timeout)
        finally:
            self._waiters.discard(future)
            if listener is not None:
                listener.unwatch(self.name, future)
        return self.seq != since

    async def confirm(
        self,
        read_token: Callable[[], Awaitable[T]],
        old: T,
        settled: Callable[[], Awaitable[T | None]] | None = None,
    ) -> bool | None:
        """Whether the inbox changed since `old`. A NOTIFY naming this inbox heard during
        the wait says so without asking (it is sent only by a commit, and only once that
        commit is visible): one round trip less between a new event and its run. The
        answer is certain either way (a commit is visible to all at once), so `settled`
        is not needed."""
        listener = self.listener
        if listener is not None and 0 <= self._heard_before < listener.seen(self.name)[0]:
            return True
        return await read_token() != old

    def close(self) -> None:
        self.listener = None
        self.notify()
