"""Pane 1, Pending: events waiting for a run, with their age, attempts and backoff."""

from __future__ import annotations


from rich.text import Text

from onwatch.core import Event, Inbox, Overview

from ..safe import safe_text
from .layout import Column
from .base import PaneData, Window
from .events import EventPane, fetch_events
from ..timefmt import duration


class PendingPane(EventPane):
    """Events waiting for the worker; `c` cancels, `D` buries, `N` runs one waiting out its
    backoff now (each confirmed)."""

    PANE_ID = "pending"
    TITLE = "Pending"
    TAB = "Pending"
    KEY = "1"
    EMPTY = "No pending events: the agent is caught up."
    MARKABLE = True
    STATES = ("pending",)
    HELP = "events waiting for a run: age, attempts so far, when a retry is allowed (backoff)"
    # By importance (tui/panes/layout.py): the id and what the event is, then its last
    # error while one holds text (else the source id takes the room), then the rest.
    COLUMNS = (
        Column("id", "id", 7, narrow=5),
        Column("source", "source", 12, narrow=7, rank=3),
        Column("source_id", "source id", 22, narrow=11, rank=2, middle=True),
        Column("age", "age", 7, narrow=6, ticking=True, rank=4),
        Column("attempts", "tries", 5, rank=6),
        Column("available", "available", 10, narrow=9, ticking=True, rank=5),
        Column("error", "last error", 20, narrow=12, fill=True, rank=1),
    )

    @classmethod
    async def fetch(cls, inbox: Inbox, window: Window, overview: Overview) -> PaneData:
        return await fetch_events(inbox, ("pending",), window, overview.counts.get("pending", 0))

    def cells(self, event: Event, now: int) -> dict[str, Text]:
        return {
            "id": self.id_cell(event),
            **self.source_cells(event),
            **self.ticking_cells(event, now),
            "attempts": self.attempts_cell(event),
            "error": safe_text(event.error, limit=200, style="italic"),
        }

    def allowed(self, action: str, targets: list[Event]) -> bool | None:
        if action == "run_now":  # only an event still waiting out its backoff
            return True if any(t.available_at > self.now for t in targets) else None
        return super().allowed(action, targets)

    def ticking_cells(self, event: Event, now: int) -> dict[str, Text]:
        wait = event.available_at - now
        return {
            "age": Text(duration(now - event.created)),
            "available": Text("now") if wait <= 0 else Text(f"in {duration(wait)}", style="italic"),
        }
