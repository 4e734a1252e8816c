"""Clocks: every time in onwatch is integer Unix seconds, read from one injectable clock."""

from __future__ import annotations

import time
from typing import Protocol

from .errors import BadInput


class Clock(Protocol):
    """Something that tells the time in integer seconds."""

    def now(self) -> int: ...


class SystemClock:
    """The wall clock, truncated to whole seconds."""

    def now(self) -> int:
        return int(time.time())


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
        self._now += check_time(seconds, "seconds")
        return self._now


def check_time(value: object, name: str = "now") -> int:
    """Return `value` if it is an integer number of seconds, else raise BadInput.

    A float is refused, never rounded: rounding would give two keys to one timer occurrence.
    """
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadInput(f"{name} must be an integer number of seconds, got {value!r}")
    return value
