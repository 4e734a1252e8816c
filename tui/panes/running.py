"""Pane 2, Running: events a worker has claimed, by lease generation, and for how long."""

from __future__ import annotations


from rich.text import Text

from onwatch.core import Event, Inbox, Overview

from .layout import Column
from .base import PaneData, Window
from .events import EventPane, fetch_events
from ..timefmt import duration


class RunningPane(EventPane):
    """Claimed events; nothing to do here but watch (a running event cannot be cancelled)."""

    PANE_ID = "running"
    TITLE = "Running"
    TAB = "Running"
    KEY = "2"
    EMPTY = "Nothing running."
    STATES = ("running",)  # no operator action applies to a running event
    HELP = "events claimed by a worker: lease generation, attempt number, running for"
    COLUMNS = (
        Column("id", "id", 7, narrow=5),
        Column("source", "source", 12, narrow=7, rank=3),
        Column("source_id", "source id", 22, narrow=10, rank=2, middle=True),
        Column("gen", "generation", 10),
        Column("attempts", "attempt", 7, rank=5),
        Column("running_for", "running for", 11, ticking=True, rank=1),
        Column("run", "run", 8, rank=4),
    )

    @classmethod
    async def fetch(cls, inbox: Inbox, window: Window, overview: Overview) -> PaneData:
        return await fetch_events(inbox, ("running",), window, overview.counts.get("running", 0))

    def cells(self, event: Event, now: int) -> dict[str, Text]:
        return {
            "id": self.id_cell(event),
            **self.source_cells(event),
            "gen": Text(f"gen {event.claim_gen}" if event.claim_gen else "—"),
            "attempts": self.attempts_cell(event),
            **self.ticking_cells(event, now),
            "run": Text(f"#{event.run_id}" if event.run_id else "—"),
        }

    def ticking_cells(self, event: Event, now: int) -> dict[str, Text]:
        since = event.claimed_at if event.claimed_at is not None else event.updated
        return {"running_for": Text(duration(now - since))}
