"""Pane 5, Timers: upcoming timers with a countdown, period, catch-up policy, what they fired,
and the timers the scheduler set aside (they no longer fire) with the reason."""

from __future__ import annotations

from typing import Hashable

from rich.text import Text

from onwatch.core import ACTIONS as CORE_ACTIONS
from onwatch.core import Inbox, Overview, Timer

from ..safe import safe_text
from .layout import ID_CHARS, Column
from .base import Pane, PaneData, Window
from ..timefmt import countdown, duration, period


class TimersPane(Pane[Timer]):
    """Durable timers, soonest first; an approval's expiry is a timer too (kind 'expiry').

    `f` fires a timer's next occurrence now, `z` pauses it, `Z` resumes it, `X` deletes it:
    each confirmed and conditional on the state shown (an approval's expiry is answered
    from Approvals, never here)."""

    PANE_ID = "timers"
    TITLE = "Timers"
    TAB = "Timers"
    KEY = "5"
    EMPTY = "No timers."
    MARKABLE = True
    TARGET = "timer"
    STATES = ("scheduled", "paused", "set aside")
    HELP = "timers soonest first: countdown, period, catch-up policy, last fired, skipped"
    COLUMNS = (
        Column("timer", "timer", 24, narrow=13, middle=True),
        Column("due", "next due", 12, narrow=10, ticking=True),
        Column("period", "period", 10, narrow=9, rank=2),
        Column("catch_up", "catch-up", 8, rank=3),
        Column("last", "last fired", 10, ticking=True, rank=4),
        Column("skipped", "skipped", 7, rank=6),
        Column("at", "due at", 6, rank=5),
        Column("note", "note", 24, narrow=16, fill=True, rank=1),
    )

    @classmethod
    async def fetch(cls, inbox: Inbox, window: Window, overview: Overview) -> PaneData:
        rows = await inbox.timers(limit=window.limit)
        needle = (window.search or "").lower()
        shown = tuple(t for t in rows if needle in t.id.lower())
        total = len(shown) if needle else overview.timers
        return PaneData(shown, total, len(rows) >= window.limit)

    def row_key(self, record: Timer) -> str:
        return record.id

    def signature(self, record: Timer) -> Hashable:
        return (
            record.due,
            record.every,
            record.catch_up,
            record.last_fired,
            record.last_skipped,
            record.overflow,
            record.kind,
            record.key,
            record.broken,
            record.paused,
        )

    def label(self, key: str) -> str:
        return key  # a timer is named by its id, digits or not

    def allowed(self, action: str, targets: list[Timer]) -> bool | None:
        """An action applies to a timer in one of its states; never to an approval's
        expiry (answered or expired from Approvals)."""
        wanted = CORE_ACTIONS[action].allowed
        fits = any(t.kind != "approval" and t.state in wanted for t in targets)
        return True if fits else None

    def cells(self, timer: Timer, now: int) -> dict[str, Text]:
        if timer.broken is not None:
            return self.broken_cells(timer)
        expiry = timer.kind == "approval"
        skipped = str(timer.last_skipped) if timer.last_skipped else ""
        if timer.overflow:
            skipped += f" +{timer.overflow} over cap"
        return {
            "timer": safe_text(timer.id, limit=ID_CHARS, style="italic" if expiry else ""),
            **self.ticking_cells(timer, now),
            "at": Text(self.times.clock(timer.due)),
            "period": Text("expiry" if expiry else period(timer.every)),
            "catch_up": Text("" if timer.every is None else timer.catch_up),
            "skipped": Text(skipped),
            "note": Text("paused: nothing fires until resumed (Z)" if timer.paused else ""),
        }

    def broken_cells(self, timer: Timer) -> dict[str, Text]:
        """A row the scheduler set aside: it no longer fires, and the note says why. Its
        fields are whatever was stored (that is why it was set aside): shown as text, never
        computed with."""
        every = timer.every
        return {
            "timer": safe_text(timer.id, limit=ID_CHARS),
            "due": Text("set aside", style="bold reverse"),
            "period": Text(period(every))
            if type(every) is int and every > 0
            else safe_text(every if every is not None else "one-off", limit=12),
            "catch_up": safe_text(timer.catch_up, limit=10),
            "last": Text(""),
            "skipped": Text(""),
            "at": Text(""),
            "note": safe_text(timer.broken, limit=300, style="bold"),
        }

    def ticking_cells(self, timer: Timer, now: int) -> dict[str, Text]:
        if timer.broken is not None:
            return {"due": Text("set aside", style="bold reverse"), "last": Text("")}
        last = "" if timer.last_fired is None else f"{duration(now - timer.last_fired)} ago"
        if timer.paused:
            return {"due": Text("paused", style="bold reverse"), "last": Text(last)}
        return {
            "due": Text(countdown(now, timer.due), style="bold" if timer.due <= now else ""),
            "last": Text(last),
        }
