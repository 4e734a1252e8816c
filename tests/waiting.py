"""The one bounded wait every test uses: poll a condition until it holds, or fail saying what."""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import Any

Nap = Callable[[float], Awaitable[Any]]


def _failed(what: str, timeout: float, detail: Callable[[], str] | None) -> AssertionError:
    message = f"timed out after {timeout} s waiting for {what}"
    if detail is not None:
        message += f":\n{detail()}"
    return AssertionError(message)


async def until(
    condition: Callable[[], Any],
    *,
    timeout: float = 10.0,
    what: str = "the condition",
    interval: float = 0.05,
    nap: Nap | None = None,
    detail: Callable[[], str] | None = None,
) -> Any:
    """Await `condition()` (plain or async) until it is truthy and return its value.

    `nap` is how to pass the time between looks (a Textual pilot's `pause`, so the app runs
    meanwhile); `detail` says what was seen when the wait fails. The bound is the only use of
    the clock: a test never asserts how long something took.
    """
    pause: Nap = nap or asyncio.sleep
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        if time.monotonic() > deadline:
            raise _failed(what, timeout, detail)
        await pause(interval)


def until_sync(
    condition: Callable[[], Any],
    *,
    timeout: float = 10.0,
    what: str = "the condition",
    interval: float = 0.05,
) -> Any:
    """`until` for code outside an event loop (a test driving real processes)."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise _failed(what, timeout, None)
        time.sleep(interval)


class Ticker:
    """A task counting its turns of the running event loop (one every 5 ms at most) until
    stopped: a count that stops moving says something holds the loop."""

    def __init__(self) -> None:
        self.ticks = 0
        self._task = asyncio.ensure_future(self._tick())

    async def _tick(self) -> None:
        while True:
            self.ticks += 1
            await asyncio.sleep(0.005)

    def stop(self) -> None:
        self._task.cancel()
