"""How the TUI words times: short durations, countdowns and clock times (local time)."""

from __future__ import annotations

import time

from onwatch.core.humanize import duration

__all__ = [
    "WALL",
    "Times",
    "ago",
    "clock",
    "compact_count",
    "countdown",
    "duration",
    "period",
    "stamp",
]


def period(seconds: int | None) -> str:
    """A timer period: 'one-off', '1d', '1h', '90s', '1h30m'."""
    if seconds is None:
        return "one-off"
    units = (("d", 86_400), ("h", 3600), ("m", 60), ("s", 1))
    parts, rest = [], seconds
    for name, size in units:
        if rest >= size:
            count, rest = divmod(rest, size)
            parts.append(f"{count}{name}")
    return "every " + "".join(parts[:2]) + ("…" if len(parts) > 2 else "")


def ago(now: int, then: int | None) -> str:
    """'12s ago', 'now', or 'in 5s' when `then` is still ahead."""
    if then is None:
        return "never"
    delta = now - then
    if delta == 0:
        return "now"
    return f"{duration(delta)} ago" if delta > 0 else f"in {duration(-delta)}"


def countdown(now: int, due: int, *, precise: bool = False) -> str:
    """'in 3m05s' while ahead, 'due now', or '12s overdue' once passed."""
    delta = due - now
    if delta > 0:
        return f"in {duration(delta, precise=precise)}"
    if delta == 0:
        return "due now"
    return f"{duration(-delta, precise=precise)} overdue"


def clock(at: int | None, *, seconds: bool = False) -> str:
    """Local wall-clock time of a Unix instant: '14:02' (or '14:02:07')."""
    if at is None:
        return "—"
    return time.strftime("%H:%M:%S" if seconds else "%H:%M", time.localtime(at))


def stamp(at: int | None) -> str:
    """Local date and time of a Unix instant: '2024-05-01 14:02:07'."""
    if at is None:
        return "—"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(at))


def compact_count(n: int) -> str:
    """A count that fits a tab label: 7, 1,234, 45k, 1.0M."""
    if n < 10_000:
        return f"{n:,}"
    if n < 1_000_000:
        return f"{n // 1000}k"
    return f"{n / 1_000_000:.1f}M"


class Times:
    """How a desk words an instant: local wall time here. The demo's scenario player plays
    on a simulated clock that starts in 1970, and words its instants as offsets from the
    scenario's start instead ('t+2m11s'): its subclass is handed down to the detail view,
    the confirmations, the outcomes and the Timers pane."""

    def stamp(self, at: int | None) -> str:
        """Date and time: '2024-05-01 14:02:07'."""
        return stamp(at)

    def clock(self, at: int | None, *, seconds: bool = False) -> str:
        """Time of day: '14:02' (or '14:02:07')."""
        return clock(at, seconds=seconds)


WALL = Times()  # local wall time: every desk but the scenario player
