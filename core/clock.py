"""Clocks: every time in onwatch is integer Unix seconds, read from one injectable clock."""

from __future__ import annotations

import time
from typing import Callable, Protocol

from .errors import BadInput


# The bounds of every integer the public API takes, decided once. Times are Unix seconds in
# 0..MAX_TIME (2**53: exactly representable as a float too, about 285 million years);
# durations are 1..MAX_DURATION. Any time plus any duration (due + every, now + lease_ttl,
# now + backoff, now + expires_in) stays below 2**55, far inside SQLite's int64, so no later
# arithmetic can overflow. Counts (batch sizes, limits, attempts) are bounded by MAX_COUNT.
MAX_TIME = 1 << 53
MAX_DURATION = 1 << 53
MAX_COUNT = 1 << 31
MAX_ID = (1 << 63) - 1  # row ids: what SQLite's INTEGER PRIMARY KEY holds


class Clock(Protocol):
    """Something that tells the time in integer seconds."""

    def now(self) -> int: ...


class SystemClock:
    """The wall clock, truncated to whole seconds."""

    def now(self) -> int:
        return int(time.time())


class BackendClock:
    """The wall clock, moved by what the backend says its own time is: an inbox's deciding
    transactions use the backend's time (on PostgreSQL, the server's), so a process that
    counts down to a lease's expiry, a deadline or a timer must count in that time too.
    `offset()` is the backend's time minus this process's, in seconds (0 for a file)."""

    def __init__(self, offset: Callable[[], float]) -> None:
        self.offset = offset

    def now(self) -> int:
        return int(time.time() + self.offset())


class FakeClock:
    """A clock that moves only when told to; tests, demos and screenshots use it."""

    def __init__(self, start: int = 1_000_000) -> None:
        self._now = check_time(start, "start")

    def now(self) -> int:
        return self._now

    def set(self, value: int) -> None:
        self._now = check_time(value, "value")

    def advance(self, seconds: int) -> int:
        """Move forward by `seconds` and return the new time."""
        self._now = check_time(self._now + check_duration(seconds, "seconds", minimum=0), "time")
        return self._now


def check_int(value: object, name: str, low: int, high: int) -> int:
    """Return `value` if it is an int (not a bool) within low..high, else raise BadInput."""
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        kind = (
            "a positive integer"
            if low == 1
            else "a non-negative integer"
            if low == 0
            else f"an integer from {low}"
        )
        raise BadInput(f"{name} must be {kind} up to {high}, got {show(value)}")
    return value


def check_time(value: object, name: str = "now") -> int:
    """Return `value` if it is an integer number of seconds in 0..MAX_TIME, else raise
    BadInput.

    A float is refused, never rounded: rounding would give two keys to one timer occurrence.
    """
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadInput(f"{name} must be an integer number of seconds, got {show(value)}")
    return check_int(value, name, 0, MAX_TIME)


def check_duration(value: object, name: str, *, minimum: int = 1) -> int:
    """Return `value` if it is an integer number of seconds in minimum..MAX_DURATION."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadInput(f"{name} must be an integer number of seconds, got {show(value)}")
    return check_int(value, name, minimum, MAX_DURATION)


def show(value: object) -> str:
    """A short repr for an error message (a 10**5000 or a megabyte string stays short)."""
    try:
        text = repr(value)
    except Exception:  # noqa: BLE001 - a hostile __repr__ must not hide the refusal
        text = f"<{type(value).__name__}>"
    return text if len(text) <= 60 else text[:57] + "..."
