"""What the three event panes share: keyset windows over one or two event states."""

from __future__ import annotations

from typing import Hashable

from rich.text import Text

from onwatch.core import Event, Inbox

from ..safe import safe_text
from .base import Pane, PaneData, Window
from .layout import ID_CHARS


async def fetch_events(
    inbox: Inbox, statuses: tuple[str, ...], window: Window, total: int
) -> PaneData:
    """One window of events in `statuses`, by id, after the window's anchor.

    Each state is its own keyset page on the (status, id) index, merged by id, so a million
    rows cost the same as ten.
    """
    rows: list[Event] = []
    for status in statuses:
        # Without payloads: a window holds rows, not documents (the detail view reads the
        # payload of the one row it shows).
        rows += await inbox.events(
            status, limit=window.limit + 1, after=window.after, search=window.search, payload=False
        )
    rows.sort(key=lambda e: e.id)
    more = len(rows) > window.limit
    rows = rows[: window.limit]
    return PaneData(tuple(rows), total, more, inbox.settings.max_attempts)


class EventPane(Pane[Event]):
    """A pane of events: keyset pages, filter by source, source id or error text."""

    PAGED = True
    TARGET = "event"

    def signature(self, record: Event) -> Hashable:
        # With the attempt budget: the tries column reads 'attempts/max_attempts'.
        return (
            record.updated,
            record.status,
            record.attempts,
            record.available_at,
            record.claim_gen,
            record.error,
            self.data.extra,
        )

    def id_cell(self, event: Event) -> Text:
        return Text(str(event.id), justify="right")

    def attempts_cell(self, event: Event) -> Text:
        limit = self.data.extra
        return Text(f"{event.attempts}/{limit}" if limit else str(event.attempts))

    def source_cells(self, event: Event) -> dict[str, Text]:
        return {
            "source": safe_text(event.source, limit=60),
            "source_id": safe_text(event.source_id, limit=ID_CHARS),
        }

    def count_label(self, data: PaneData) -> str:
        if self.window.search:
            shown = f"{len(data.rows):,}{'+' if data.more else ''} matching"
            return f"{shown} of {data.total:,}"
        return f"{data.total:,}"
