"""Pane 7, Done: the history of what was done, newest first, with the run that did each, so
an operator can watch an approval's effect land."""

from __future__ import annotations

from rich.text import Text

from onwatch.core import Event, Inbox, Overview
from onwatch.core.clock import MAX_ID

from ..timefmt import duration
from .base import PaneData, Window
from .events import EventPane
from .layout import Column


class DonePane(EventPane):
    """Finished events, newest first, a keyset page at a time (`]` older, `[` newer);
    nothing to act on, Enter shows the event's runs, payload and audit in full."""

    PANE_ID = "done"
    TITLE = "Done"
    TAB = "Done"
    KEY = "7"
    EMPTY = "Nothing done yet."
    STATES = ("done",)  # no operator action applies to a done event
    HELP = "the history: finished events newest first, with the run that finished each"
    COLUMNS = (
        Column("id", "id", 7, narrow=5),
        Column("source", "source", 12, narrow=7, rank=3),
        Column("source_id", "source id", 22, narrow=11, rank=2, middle=True),
        Column("finished", "finished", 11, narrow=10, ticking=True, rank=1),
        Column("took", "took", 7, rank=5),
        Column("attempts", "tries", 5, rank=6),
        Column("run", "run", 8, rank=4),
    )

    @classmethod
    async def fetch(cls, inbox: Inbox, window: Window, overview: Overview) -> PaneData:
        # Newest first: the window's anchor is the id the page starts below.
        rows = await inbox.events(
            "done",
            limit=window.limit + 1,
            before=MAX_ID if window.after is None else window.after,
            search=window.search,
            payload=False,
        )
        more = len(rows) > window.limit
        total = overview.counts.get("done", 0)
        return PaneData(tuple(rows[: window.limit]), total, more, inbox.settings.max_attempts)

    def action_next_page(self) -> None:
        """Older events: the page below the oldest one shown."""
        if not (self.data.more and self._records):
            return
        self.window.previous.append(self.window.after)
        self._window_moved = True
        self.window.after = min(int(k) for k in self._records)
        self.post_message(self.WindowChanged(self))

    def cells(self, event: Event, now: int) -> dict[str, Text]:
        took = "" if event.claimed_at is None else duration(event.updated - event.claimed_at)
        return {
            "id": self.id_cell(event),
            **self.source_cells(event),
            **self.ticking_cells(event, now),
            "took": Text(took),
            "attempts": self.attempts_cell(event),
            "run": Text(f"#{event.run_id}" if event.run_id else "—"),
        }

    def ticking_cells(self, event: Event, now: int) -> dict[str, Text]:
        return {"finished": Text(f"{duration(now - event.updated)} ago")}
