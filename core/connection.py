"""What the Inbox needs of a backend's connection (core/sqlite/db.py, core/pg/db.py) and of
the wake-up source on it (core/sqlite/wake.py, core/pg/listen.py). The backends do not name
these protocols; mypy checks each one against them where the Inbox is given it, so the two
cannot drift apart. What a transaction is given is core/engine/tx.py's Tx.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Awaitable, Callable, Protocol, TypeVar

from .engine.tx import Ahead

T = TypeVar("T")
# How often a waiter looks for changes itself although a notifier runs (its insurance), and
# how often everyone polls where nothing notifies (Waker.watching is False).
SLOW_POLL = 5.0
# A write on the event loop's own thread (Connection.may_write_here) that took longer than
# this (seconds) sends the connection's writes back to its thread for LOOP_WRITE_REST seconds.
LOOP_WRITE_SLOW = 0.1
LOOP_WRITE_REST = 60.0


class LoopRest:
    """Whether a connection's writes rest from the event loop's thread: for LOOP_WRITE_REST
    seconds after one there took longer than LOOP_WRITE_SLOW (a slow disk or server, a
    checkpoint, a storm of timers), said once in the log. Instants are the caller's
    monotonic clock."""

    def __init__(self, log: logging.Logger) -> None:
        self._log = log
        self._until = 0.0  # no write on the loop's thread until then

    def resting(self, now: float) -> bool:
        return now < self._until

    def after(self, path: str, started: float, now: float) -> None:
        """A write on the loop ran from `started` to `now`: if it was slow, rest."""
        if now - started > LOOP_WRITE_SLOW:
            self._until = now + LOOP_WRITE_REST
            self._log.warning(
                "inbox %s: a write on the event loop took %.3f s; the inbox's writes go "
                "through the connection's thread for %g s",
                path,
                now - started,
                LOOP_WRITE_REST,
            )


class Waker(Protocol):
    """Wakes this process's waiters when the inbox may have changed (`Inbox.wake`)."""

    @property
    def seq(self) -> int: ...  # moves whenever a change may have happened
    @property
    def watching(self) -> bool: ...  # False: nothing tells of other processes' commits; poll
    @property
    def waiting(self) -> int: ...
    def notify(self) -> None: ...
    async def wait(self, since: int, timeout: float) -> bool: ...
    async def confirm(
        self,
        read_token: Callable[[], Awaitable[T]],
        old: T,
        settled: Callable[[], Awaitable[T | None]] | None = None,
    ) -> bool | None: ...
    def close(self) -> None: ...


class Connection(Protocol):
    """One inbox's connection: each call runs one function of the engine (core/engine/)
    whole on the connection's thread, given the backend's Tx, in the order called.

    `call` runs it outside a transaction (a one-statement read is its own snapshot), `read`
    in one read snapshot, `write` in one write transaction (the inbox's write lock held),
    `write_alone` a write of one statement that commits by itself (on PostgreSQL it locks
    the inbox's row and counts its change itself);
    `write_unless` first runs a precheck outside a transaction and writes only when the
    precheck has no answer (nothing to write: no transaction at all). `write_soon` is the
    callback form of `write` for group commit; `write_soon_alone` first tries `alone`, one
    autocommit statement, where the backend can (SQLite; on PostgreSQL an event's id is
    numbered under the inbox's row lock, so it always writes in a transaction). `peek` is a
    tiny read on the event loop's own thread, or None when it cannot answer at once (then
    the caller takes the normal path)."""

    @property
    def path(self) -> str: ...
    @property
    def wake(self) -> Waker: ...

    # Why every write is refused (opened read-only, or the inbox cannot be written), or None.
    read_only: str | None
    # The schema the inbox has (older than the newest only when opened without migrating),
    # and the one it had before this open migrated it (None: not migrated now).
    version: int
    migrated_from: int | None
    # Whether this open made the inbox (a new file, or a new inbox in a database).
    created: bool
    # True (set by a Worker for its inbox): write_ahead and write_here_alone may run on the
    # event loop's own thread where that is safe and quick (each backend's may_write_here).
    loop_writes: bool

    async def call(self, fn: Callable[..., T], *args: Any) -> T: ...
    async def read(self, fn: Callable[..., T], *args: Any) -> T: ...
    async def write(self, fn: Callable[..., T], *args: Any) -> T: ...
    # write, told what `fn` does first (a claim's look, or a finish and the look after it;
    # None: nothing said): sent with the lock where that saves a round trip (PostgreSQL).
    async def write_ahead(self, ahead: Ahead | None, fn: Callable[..., T], *args: Any) -> T: ...
    async def write_alone(self, fn: Callable[..., T], *args: Any) -> T: ...
    async def write_unless(
        self,
        precheck: Callable[..., T | None],
        fn: Callable[..., T],
        *args: Any,
        bounded: bool = False,  # what each savepoint of `fn` changes is bounded by its caller
    ) -> T: ...
    def write_soon(
        self,
        fn: Callable[..., T],
        args: tuple[Any, ...],
        done: Callable[[T | None, BaseException | None], None],
    ) -> None: ...
    def write_soon_alone(
        self,
        alone: Callable[..., T | None],
        fn: Callable[..., T],
        args: tuple[Any, ...],
        done: Callable[[T | None, BaseException | None], None],
    ) -> None: ...
    # True if a write may run on the event loop's own thread now (`loop_writes` and the
    # backend's conditions). write_here_alone is write_soon_alone's work done there at
    # once: (True, its result), or (False, None) with nothing written.
    def may_write_here(self) -> bool: ...
    def write_here_alone(
        self, alone: Callable[..., T | None], fn: Callable[..., T], args: tuple[Any, ...]
    ) -> tuple[bool, T | None]: ...
    def peek(self, fn: Callable[..., T], *args: Any) -> T | None: ...
    def file_replaced(self) -> str | None: ...
    @property
    def clock_offset(self) -> float: ...  # the backend's time minus this process's (s)
    async def close(self) -> None: ...


class Waiters:
    """The waits in progress on one Waker: each is a future set when something may have
    changed. Both backends' wakers keep theirs here."""

    def __init__(self) -> None:
        self._futures: list[asyncio.Future[bool]] = []
        self.wakeups = 0  # times waiters were woken (a spin would show here)

    def __len__(self) -> int:
        return len(self._futures)

    def add(self, loop: asyncio.AbstractEventLoop) -> asyncio.Future[bool]:
        future: asyncio.Future[bool] = loop.create_future()
        self._futures.append(future)
        return future

    def discard(self, future: asyncio.Future[bool]) -> None:
        if future in self._futures:
            self._futures.remove(future)

    def wake_all(self) -> None:
        futures, self._futures = self._futures, []
        if futures:
            self.wakeups += 1
        for future in futures:
            if not future.done():
                future.set_result(True)


async def until_set(future: asyncio.Future[Any], timeout: float | None) -> bool:
    """Await `future` (a waiter's) for at most `timeout` seconds: True once it is set (to
    anything but False), False when the time ran out first. One future and one timer, no
    task: a wake-up reaches its waiter in one turn of the loop."""
    if timeout is None:
        return bool(await future)
    timer = asyncio.get_running_loop().call_later(timeout, _expire, future)
    try:
        return bool(await future)
    finally:
        timer.cancel()


def _expire(future: asyncio.Future[Any]) -> None:
    if not future.done():
        future.set_result(False)


class WaiterCounts:
    """What both backends' wakers report of their waits (a base class)."""

    def __init__(self) -> None:
        self._waiters = Waiters()

    @property
    def waiting(self) -> int:
        """How many waits are in progress (an idle worker is one)."""
        return len(self._waiters)

    @property
    def wakeups(self) -> int:
        """Times waiters were woken (a spin would show here)."""
        return self._waiters.wakeups
