"""A watch on the worker's event loop: it says when code blocks the loop, and whose code.

The loop renews the lease, notices a run past its budget, answers webhooks (`onwatch run`)
and handles SIGTERM. An async agent that blocks it (`time.sleep`, a blocking HTTP client, a
CPU-bound loop inside `async def`) stops all of that, and nothing on the loop can say so
while it lasts. So a thread watches a heartbeat the loop sets every few moments:

- a stall longer than a fraction of the lease TTL (`stall_after`, a quarter: the renewal is
  due every third) is logged with the run whose task holds the loop and where its code is;
- when the loop turns again, how long the stall lasted is logged;
- a stall past `end_after` (the lease TTL plus the grace: the lease has lapsed by then, and
  a successor may already run the same events) calls `on_stuck`, which the command line
  uses to end the process: nothing else can stop code that holds the loop. The library
  itself never ends a process.

A suspended process (SIGSTOP, a paused VM) stops the watcher too: a watcher that wakes up
late takes its own lateness for a pause of the process, not a stall of the loop, and looks
again.

One watch serves every worker on a loop (the fleet runs several); each worker names its
runs' tasks, so the log says which run it was.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import sysconfig
import threading
import time
import types
import weakref
from typing import Callable

log = logging.getLogger("onwatch.worker")

_ONWATCH = os.path.dirname(os.path.dirname(os.path.realpath(__file__))) + os.sep  # core/
_STDLIB = tuple(
    {os.path.realpath(sysconfig.get_paths()[name]) + os.sep for name in ("stdlib", "platstdlib")}
)
MIN_TICK = 0.05  # seconds: the finest the heartbeat gets (a lease_ttl of 1 s)


class LoopWatch:
    """The watch of one event loop. Get it with `LoopWatch.of(loop)`, on the loop's thread."""

    _watches: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, LoopWatch] = (
        weakref.WeakKeyDictionary()
    )

    @classmethod
    def of(cls, loop: asyncio.AbstractEventLoop) -> LoopWatch:
        watch = cls._watches.get(loop)
        if watch is None:
            watch = cls._watches[loop] = cls(loop)
        return watch

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._loop_thread = threading.get_ident()
        self._lock = threading.Lock()
        # Each worker's (stall_after, end_after, on_stuck); the watch applies the strictest.
        self._users: dict[int, tuple[float, float, Callable[[str], None] | None]] = {}
        self._labels: dict[asyncio.Task[object], str] = {}
        self._beat = time.monotonic()
        self._reported: float | None = None  # the beat whose stall was logged
        self._ended = False
        self._thread: threading.Thread | None = None
        self._closing = threading.Event()
        self._timer: asyncio.TimerHandle | None = None

    # --- the workers' side (on the loop) ---------------------------------------------------

    def join(
        self,
        user: object,
        *,
        stall_after: float,
        end_after: float,
        on_stuck: Callable[[str], None] | None = None,
    ) -> None:
        """Watch the loop for `user` (a worker), or update its limits."""
        with self._lock:
            self._users[id(user)] = (stall_after, end_after, on_stuck)
        if self._thread is None or not self._thread.is_alive():
            self._closing = threading.Event()
            self._beat = time.monotonic()
            self._thread = threading.Thread(
                target=self._watch, args=(self._closing,), name="onwatch-loop-watch", daemon=True
            )
            self._thread.start()
            self._heartbeat()

    def leave(self, user: object) -> None:
        """Stop watching for `user` (on the loop: which has turned, so a stall it was in has
        ended, and the log says so even if no heartbeat came between)."""
        self._turned()
        with self._lock:
            self._users.pop(id(user), None)
            last = not self._users
        if last:
            self._closing.set()
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None

    def label(self, task: asyncio.Task[object], text: str) -> None:
        """Name the run a task is, for the log; forgotten when the task is done."""
        with self._lock:
            self._labels[task] = text
        task.add_done_callback(self._forget)

    def _forget(self, task: asyncio.Task[object]) -> None:
        with self._lock:
            self._labels.pop(task, None)

    def _tick(self) -> float:
        with self._lock:
            limits = [u[0] for u in self._users.values()]
        return max(MIN_TICK, min(limits, default=1.0) / 4)

    def _turned(self) -> None:
        """On the loop: it turned. Says so if a stall had been reported."""
        now = time.monotonic()
        if self._reported is not None and self._reported == self._beat:
            log.warning("the event loop turned again after %.1f s blocked", now - self._beat)
        self._reported = None
        self._beat = now

    def _heartbeat(self) -> None:
        self._turned()
        self._timer = None
        if not self._closing.is_set():
            self._timer = self._loop.call_later(self._tick(), self._heartbeat)

    # --- the watcher's side (its own thread) -----------------------------------------------

    def _watch(self, closing: threading.Event) -> None:
        looked = time.monotonic()
        while True:
            tick = self._tick()
            if closing.wait(tick):
                return
            now = time.monotonic()
            late, looked = now - looked - tick, now
            if late > max(1.0, 4 * tick):
                # This thread slept far too long itself: the whole process was paused
                # (SIGSTOP, a suspended VM), not the loop alone. Look again afresh.
                self._beat = max(self._beat, now)
                continue
            with self._lock:
                users = list(self._users.values())
            if not users:
                continue
            beat = self._beat
            stalled = now - beat
            stall_after = min(u[0] for u in users)
            if stalled < stall_after:
                continue
            if self._reported != beat:
                self._reported = beat
                log.warning(
                    "the event loop has been blocked for %.1f s by %s: code that blocks in an "
                    "async agent (time.sleep, a blocking client, a long computation) stops the "
                    "lease renewal and every other task; use await, or a plain def",
                    stalled,
                    self._culprit(),
                )
            end_after = max(u[1] for u in users)
            if stalled >= end_after and not self._ended:
                stuck = [u[2] for u in users if u[2] is not None]
                if stuck:
                    self._ended = True
                    stuck[0](
                        f"the event loop has been blocked for {stalled:.1f} s by "
                        f"{self._culprit()}, past the lease TTL and the grace: the lease has "
                        f"lapsed and only ending the process stops that code"
                    )

    def _culprit(self) -> str:
        """Which run holds the loop (its task's label) and where its code is now."""
        try:
            task = asyncio.current_task(self._loop)
        except RuntimeError:
            task = None
        with self._lock:
            label = self._labels.get(task) if task is not None else None
        who = label or "code that is no run's (a setup, a task an agent started)"
        frame = sys._current_frames().get(self._loop_thread)
        where = _where(frame)
        return f"{who}, at {where}" if where else who


def _where(frame: types.FrameType | None, most: int = 3) -> str:
    """The innermost frames that are neither the standard library nor onwatch, each called
    from the next: where in the agent's code (or its libraries) the loop is held."""
    found: list[str] = []
    while frame is not None and len(found) < most:
        path = os.path.realpath(frame.f_code.co_filename)
        if not path.startswith(_STDLIB) and not path.startswith(_ONWATCH):
            found.append(f"{path}:{frame.f_lineno} in {frame.f_code.co_name}")
        frame = frame.f_back
    return " ← ".join(found)
