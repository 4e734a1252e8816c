"""Pane 3, Dead & interrupted: the rows a human must look at, with why they stopped."""

from __future__ import annotations


from rich.text import Text
from textual.binding import Binding

from onwatch.core import Event, Inbox, Overview

from ..safe import safe_text
from .layout import Column
from .base import PaneData, Window
from .events import EventPane, fetch_events
from ..timefmt import duration


class DeadPane(EventPane):
    """Dead events (out of attempts) and interrupted ones (completion uncertain).

    `r` requeues with a fresh attempt budget; `m` resolves an interrupted event as done (the
    operator checked that its effect happened); `D` buries it; each confirmed. `E` groups
    the dead events by the first line of their error, to requeue a whole group at once.
    """

    BINDINGS = [
        Binding(
            "E",
            "app.dead_groups",
            "By error",
            show=False,  # at 80 columns the footer keeps the row actions
            id="dead-groups",
            tooltip="group by error; requeue a whole group",
        ),
    ]

    PANE_ID = "dead"
    TITLE = "Dead & interrupted"
    TAB = "Dead"
    KEY = "3"
    EMPTY = "No dead or interrupted events: nothing needs a human."
    MARKABLE = True
    STATES = ("dead", "interrupted")
    HELP = "dead events (out of attempts) and interrupted runs (completion uncertain)"
    # At 80 columns the reason and what the event is stay; tries and since give way.
    COLUMNS = (
        Column("id", "id", 7, narrow=5),
        Column("state", "state", 11),
        Column("attempts", "tries", 5, rank=5),
        Column("since", "since", 7, narrow=6, ticking=True, rank=4),
        Column("error", "reason / error", 40, narrow=28, fill=True, rank=1),
        Column("source", "source", 10, narrow=7, rank=3),
        Column("source_id", "source id", 16, narrow=11, rank=2, middle=True),
    )

    @classmethod
    async def fetch(cls, inbox: Inbox, window: Window, overview: Overview) -> PaneData:
        total = overview.counts.get("dead", 0) + overview.counts.get("interrupted", 0)
        return await fetch_events(inbox, ("dead", "interrupted"), window, total)

    def cells(self, event: Event, now: int) -> dict[str, Text]:
        state = Text(event.status, style="bold" if event.status == "interrupted" else "")
        return {
            "id": self.id_cell(event),
            "state": state,
            **self.source_cells(event),
            "attempts": self.attempts_cell(event),
            **self.ticking_cells(event, now),
            "error": safe_text(event.error, limit=300),
        }

    def ticking_cells(self, event: Event, now: int) -> dict[str, Text]:
        return {"since": Text(duration(now - event.updated))}
