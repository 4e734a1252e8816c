"""Instant wake on PostgreSQL: LISTEN on a dedicated connection, in a thread.

A commit that gives an inbox work (a new event: ingest, an approval's answer or expiry, a
timer; or an event made pending again by hand) sends `NOTIFY onwatch, '<inbox name>'` from
the events triggers (core/pg/schema.py), delivered only if and when it commits. A
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
import threading
import time
from collections import defaultdict

import psycopg

from .db import redact

log = logging.getLogger("onwatch.pg.listen")
CHANNEL = "onwatch"


class Listener:
    def __init__(self, url: str, conn: psycopg.Connection, loop: asyncio.AbstractEventLoop,
                 *, poll_interval: float = 1.0, max_backoff: float = 5.0) -> None:
        self.url = url
        self.poll_interval = poll_interval
        self.max_backoff = max_backoff
        self.reconnects = 0
        self.connected = True
        self._conn: psycopg.Connection | None = conn
        self._loop = loop
        self._counts: dict[str, int] = defaultdict(int)
        self._generation = 0  # moves on every loss and every reconnection: wake everyone
        self._waiters: dict[str, set[asyncio.Future]] = defaultdict(set)
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._listen, name="onwatch-pg-listen",
                                        daemon=True)
        self._thread.start()

    @classmethod
    async def open(cls, url: str, **options: float) -> "Listener":
        conn = await asyncio.to_thread(cls._connect, url)
        return cls(url, conn, asyncio.get_running_loop(), **options)

    @staticmethod
    def _connect(url: str) -> psycopg.Connection:
        conn = psycopg.connect(url, autocommit=True, connect_timeout=10)
        conn.execute(f"LISTEN {CHANNEL}")
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
        if not self.connected:
            await asyncio.sleep(self.poll_interval if timeout is None
                                else min(timeout, self.poll_interval))
            return True
        future = self._loop.create_future()
        self._waiters[name].add(future)
        try:
            await asyncio.wait_for(future, timeout)
            return True
        except asyncio.TimeoutError:
            return False
        finally:
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
                    future.set_result(None)

    def _wake_all(self, connected: bool) -> None:
        self.connected = connected
        self._generation += 1
        for futures in self._waiters.values():
            for future in futures:
                if not future.done():
                    future.set_result(None)

    async def close(self) -> None:
        self._stopping.set()
        await asyncio.to_thread(self._thread.join)

    # --- on the listening thread ----------------------------------------------------------

    def _post(self, fn, *args) -> None:
        try:
            self._loop.call_soon_threadsafe(fn, *args)
        except RuntimeError:  # the loop is closed: nobody waits any more
            self._stopping.set()

    def _listen(self) -> None:
        backoff = 0.1
        while not self._stopping.is_set():
            conn = self._conn
            if conn is None:
                try:
                    conn = self._conn = self._connect(self.url)
                except psycopg.Error as exc:
                    log.warning("listener: cannot reconnect to %s (%s); retrying in %.1f s",
                                redact(self.url), str(exc).strip(), backoff)
                    self._stopping.wait(backoff)
                    backoff = min(backoff * 2, self.max_backoff)
                    continue
                self.reconnects += 1
                backoff = 0.1
                log.warning("listener: reconnected to %s; waking every waiter (notifications "
                            "sent meanwhile were lost)", redact(self.url))
                self._post(self._wake_all, True)
            try:
                for notify in conn.notifies(timeout=0.2):
                    self._post(self._heard, notify.payload)
            except psycopg.Error as exc:
                log.warning("listener: lost the connection to %s (%s); polling until it is "
                            "back", redact(self.url), str(exc).strip())
                self._post(self._wake_all, False)
                try:
                    conn.close()
                except psycopg.Error:
                    pass
                self._conn = None
                time.sleep(0.05)
        if self._conn is not None:
            self._conn.close()
