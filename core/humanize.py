"""Durations in words for a person: one formatter for the desk, the command line, the demo
and the worker's log (no UI imports, so every one of them can use it)."""

from __future__ import annotations


def duration(seconds: int, *, precise: bool = False) -> str:
    """A short human duration: 45s, 12m05s, 3h05m, 2d04h.

    `precise` keeps the seconds up to a day (3h05m12s), for countdowns that must tick.
    """
    seconds = max(int(seconds), 0)
    if seconds < 60:
        return f"{seconds}s"
    minutes, secs = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    if hours < 24:
        return f"{hours}h{minutes:02d}m{secs:02d}s" if precise else f"{hours}h{minutes:02d}m"
    days, hours = divmod(hours, 24)
    return f"{days}d{hours:02d}h{minutes:02d}m" if precise else f"{days}d{hours:02d}h"
