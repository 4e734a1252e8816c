"""Wake-ups when the inbox file may have changed: the OS's file notification, not a poll.

    seen = wake.seq
    token = await inbox.change_token()
    ...
    if await wake.wait(seen, timeout=5.0):   # True: something may have changed
        seen = wake.seq
        if await inbox.change_token() != token: ...

Another process's commit appends to the inbox's WAL file; on Linux the kernel tells us at once
(inotify on the file's folder, filtered to the database and its `-wal`), so a waiter wakes
within a millisecond and costs nothing while it sleeps. A commit through this process's own
connection wakes waiters directly (`notify`, called by core/sqlite/db.py), no file round trip.

A wake-up says only "may have changed": the waiter confirms with `Inbox.change_token()`
(PRAGMA data_version), so our own writes, a checkpoint or a neighbour file in the folder cost a
read, never a wrong answer. The notifier is armed only while someone waits and drains
everything queued at each wake, so a burst of thousands of commits is one wake per wait, never
a busy loop. Where it cannot run (not Linux, the `inotify_simple` package missing, the watch
limit reached, ONWATCH_NO_NOTIFY=1) or dies, `watching` is False and waiters fall back to
their poll; it is also blind to writes by other machines on a network file system, which is
why waiters keep a slow poll even when it runs.
"""

from __future__ import annotations

import asyncio
import logging
import os
from typing import Any, Awaitable, Callable, TypeVar

from ..connection import WaiterCounts, until_set

try:  # Linux only; elsewhere the waiters poll
    from inotify_simple import INotify, flags
except ImportError:  # pragma: no cover - other platforms
    INotify = None
    flags = None

log = logging.getLogger("onwatch.wake")

CONFIRM_DELAYS = (0, 0.0005, 0.001, 0.002, 0.004, 0.008, 0.016, 0.032, 0.064)  # see confirm
CONFIRM_READS = 64  # at most this many token reads per confirm, whatever the folder does

T = TypeVar("T")


def _disabled() -> bool:
    return os.environ.get("ONWATCH_NO_NOTIFY", "") not in ("", "0")


class Wake(WaiterCounts):
    """Tells this process's waiters that one inbox file may have changed."""

    def __init__(self, path: str | None) -> None:
        # None: no file to watch (an inbox in a database server); only notify() wakes.
        # Resolved: SQLite writes its -wal next to the file a symlink points to, so a watch
        # on the link's folder would never hear another process's commit.
        self.path = None if path is None else os.path.realpath(path)
        base = "" if self.path is None else os.path.basename(self.path)
        # The -shm too, and deletions: a waiter must also hear its files deleted under it
        # (it then looks at Inbox.file_replaced(), which stops the connection).
        self._names = frozenset({base, base + "-wal", base + "-shm"})
        self.seq = 0  # moves whenever a change may have happened
        self.reads = 0  # times the notifier's queue was drained
        super().__init__()
        self._notifier: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._armed = False
        self._started = False

    @property
    def watching(self) -> bool:
        """True while the OS notifier runs (after the first wait), False if it cannot."""
        if not self._started:
            return INotify is not None and not _disabled() and self.path is not None
        return self._notifier is not None

    def notify(self) -> None:
        """Something may have changed (a commit through this process's own connection)."""
        self.seq += 1
        self._waiters.wake_all()

    async def wait(self, since: int, timeout: float) -> bool:
        """Wait until `seq` moves past `since` (True) or `timeout` seconds pass (False)."""
        if self.seq != since:
            return True
        loop = asyncio.get_running_loop()
        if not self._started:
            self._start(loop)
        future = self._waiters.add(loop)
        self._arm()
        try:
            return await until_set(future, timeout)
        finally:
            self._waiters.discard(future)
            if not self._waiters:
                self._disarm()

    async def confirm(
        self,
        read_token: Callable[[], Awaitable[T]],
        old: T,
        settled: Callable[[], Awaitable[T | None]] | None = None,
    ) -> bool | None:
        """After a wake-up: True once `read_token()` differs from `old`; False if nothing
        changed, for certain; None if the token stayed as it was but that is not certain.

        The OS reports another process's commit at its first write to the WAL, before the
        commit is visible (the fsync and the WAL index update come after, and the index is
        shared memory, which sends no notification). So an unchanged token is not yet an
        answer. `settled` (Inbox.settled_change_token) makes it one: read while no other
        connection is half-way through a commit, so every commit the wake-up told of is
        visible to it. Our own writes and a checkpoint, the usual wake-ups that find
        nothing, then cost two reads. Without it, or while another connection is half-way,
        the token is read again a few times over about 0.1 s before the wake-up is called
        spurious (None). A notification that arrives meanwhile cuts the wait short, so a
        real commit is not kept behind a spurious one.
        """
        seen, step, reads = self.seq, 0, 0
        while step < len(CONFIRM_DELAYS) and reads < CONFIRM_READS:
            delay = CONFIRM_DELAYS[step]
            step += 1
            if delay and await self.wait(seen, delay):
                # Another write meanwhile (often the commit that matters, after one of ours
                # woke us): look at once, and take the short steps again.
                seen, step = self.seq, 1
            reads += 1
            if await read_token() != old:
                return True
            if settled is not None:
                token = await settled()
                if token is not None:
                    return token != old
                settled = None  # a commit is half-way: the reads above will see it land
        return None

    def close(self) -> None:
        """Stop watching; waiters fall back to their timeouts."""
        self._disarm()
        notifier, self._notifier = self._notifier, None
        if notifier is not None:
            notifier.close()
        self.notify()

    # --- the OS notifier ------------------------------------------------------------------

    def _start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._started = True
        self._loop = loop
        if INotify is None or _disabled() or self.path is None:
            return
        try:
            notifier = INotify(nonblocking=True)
        except OSError as exc:
            log.warning("file notification unavailable (%s); polling instead", exc)
            return
        try:
            # The folder, not the files: the -wal file comes and goes with the last
            # connection, and a watch on a deleted file would go quiet.
            notifier.add_watch(
                os.path.dirname(self.path),
                flags.MODIFY | flags.CREATE | flags.MOVED_TO | flags.DELETE | flags.MOVED_FROM,
            )
        except OSError as exc:
            notifier.close()
            log.warning("cannot watch %s (%s); polling instead", self.path, exc)
            return
        self._notifier = notifier

    def _arm(self) -> None:
        if self._armed or self._notifier is None or self._loop is None:
            return
        self._loop.add_reader(self._notifier.fileno(), self._readable)
        self._armed = True

    def _disarm(self) -> None:
        if self._armed and self._notifier is not None and self._loop is not None:
            self._loop.remove_reader(self._notifier.fileno())
        self._armed = False

    def _readable(self) -> None:
        """On the loop: drain everything queued; wake the waiters if it concerns our file."""
        notifier = self._notifier
        if notifier is None:
            return
        try:
            events = notifier.read(timeout=0)
        except OSError as exc:
            self._fail(f"the notifier failed ({exc})")
            return
        self.reads += 1
        ours = False
        for event in events:
            if event.mask & (flags.IGNORED | flags.Q_OVERFLOW):
                if event.mask & flags.IGNORED:  # the folder went away: the watch is dead
                    self._fail("the watched folder is gone")
                    return
                ours = True  # overflow: events were lost, assume ours among them
            elif event.name in self._names:
                ours = True
        if ours:
            self.notify()

    def _fail(self, why: str) -> None:
        log.warning("%s; polling %s instead", why, self.path)
        self.close()
