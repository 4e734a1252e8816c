"""Pane 6, Outbox: held messages, the countdown to the next allowed send, recent sends."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rich.text import Text
from textual.app import ComposeResult
from textual.widgets import DataTable, Label

from onwatch.core import Delivery, Inbox, Message, Overview

from ..safe import join, safe_text
from .layout import Column
from .base import Pane, PaneData, Window
from ..timefmt import duration, period


@dataclass(frozen=True, slots=True)
class OutboxState:
    """What the outbox pane shows besides its held messages."""

    deliveries: tuple[Delivery, ...]
    next_send_at: int | None
    held: bool  # the operator holds the outbox: paced sends wait
    gap: int
    # at-most-once sends cut off mid-send: maybe delivered, never re-sent by themselves
    uncertain: tuple[Delivery, ...] = ()


class OutboxPane(Pane[Message]):
    """Messages waiting for the next paced send (urgent ones skip the gap), and recent sends.

    `s` (everywhere) writes what is held to a file and marks it sent (the desk has no
    channel: nobody receives it); `o` holds or releases the outbox.
    """

    PANE_ID = "outbox"
    TITLE = "Outbox"
    TAB = "Outbox"
    KEY = "6"
    EMPTY = "Nothing held: every message has gone out."
    HELP = "held messages, countdown to the next allowed send, recent sends"
    COLUMNS = (
        Column("id", "id", 6),
        Column("queued", "queued", 8, ticking=True, rank=2),
        Column("urgent", "urgent", 6, rank=3),
        Column("run", "run", 6, rank=4),
        Column("body", "message", 40, narrow=24, fill=True, rank=1),
    )
    SENDS = 8  # recent sends listed under the held messages
    # An uncertain send (at-most-once, cut off mid-send) is settled by the operator: its
    # actions act on the oldest one listed, the rows of the table being held messages.
    TARGET = "delivery"
    STATES = ("uncertain",)

    @classmethod
    async def fetch(cls, inbox: Inbox, window: Window, overview: Overview) -> PaneData:
        held = await inbox.held_messages(limit=window.limit)
        needle = (window.search or "").lower()
        shown = tuple(m for m in held if needle in m.body.lower())
        sends = tuple(await inbox.deliveries(limit=cls.SENDS))
        uncertain = (
            tuple(await inbox.uncertain_deliveries(limit=cls.SENDS))
            if overview.uncertain_deliveries
            else ()
        )
        listed = {d.id for d in sends}
        sends = tuple(d for d in uncertain if d.id not in listed) + sends  # never scrolled off
        state = OutboxState(
            sends, overview.next_send_at, overview.outbox_held, inbox.settings.outbox_gap, uncertain
        )
        return PaneData(shown, overview.held_messages, len(held) >= window.limit, state)

    def compose(self) -> ComposeResult:
        yield Label("", classes="summary")
        yield from super().compose()
        sends: DataTable[Text] = DataTable(id="sends", cursor_type="none", show_cursor=False)
        sends.can_focus = False
        for key, label, width in (
            ("id", "send", 6),
            ("status", "status", 9),
            ("kind", "kind", 6),  # urgent (skipped the gap) or paced
            ("count", "msgs", 4),
            ("when", "when", 10),
            ("attempts", "tries", 5),
            ("note", "last error", 60),
        ):
            sends.add_column(label, key=key, width=width)
        yield Label("Recent sends", classes="sends-title")
        yield sends

    def cells(self, message: Message, now: int) -> dict[str, Text]:
        return {
            "id": Text(str(message.id), justify="right"),
            **self.ticking_cells(message, now),
            "urgent": Text("urgent", style="bold") if message.urgent else Text(""),
            "run": Text(f"#{message.run_id}" if message.run_id else "—"),
            "body": safe_text(message.body, limit=300),
        }

    def ticking_cells(self, message: Message, now: int) -> dict[str, Text]:
        return {"queued": Text(duration(now - message.created))}

    def show(self, data: PaneData, now: int) -> None:
        super().show(data, now)
        self._show_sends(now)
        self._show_summary(now)

    def tick(self, now: int) -> None:
        super().tick(now)
        self._show_summary(now)
        state: OutboxState | None = self.data.extra
        table = self.query_one("#sends", DataTable)
        for d in state.deliveries if state else ():
            table.update_cell(str(d.id), "when", self._sent_when(d, now))

    def _show_summary(self, now: int) -> None:
        state: OutboxState | None = self.data.extra
        if state is None:
            return
        parts: list[str | Text] = [f"{self.data.total:,} held"]
        if state.uncertain:
            count = len(state.uncertain)
            parts.append(
                Text(
                    f" · {count} UNCERTAIN send{'s' if count != 1 else ''} (cut off "
                    f"mid-send: may or may not have gone out; never re-sent by "
                    f"itself — settle: mark sent or send again)",
                    style="bold",
                )
            )
        if state.held:
            parts.append(" · HELD by the operator: nothing goes out until released (o)")
        elif state.next_send_at is not None:
            wait = state.next_send_at - now
            parts.append(
                " · next paced send "
                + ("allowed now" if wait <= 0 else f"in {duration(wait, precise=True)}")
            )
        parts.append(f" · pacing: one send {period(state.gap)}" if state.gap else " · pacing: off")
        self.query_one(".summary", Label).update(join(*parts))
        self.set_class(state.held, "-held")

    def _show_sends(self, now: int) -> None:
        state: OutboxState | None = self.data.extra
        table = self.query_one("#sends", DataTable)
        table.clear()
        for d in state.deliveries if state else ():
            note = safe_text(d.last_error, limit=200)
            table.add_row(
                Text(f"#{d.id}"),
                Text(d.status, style="bold" if d.status == "uncertain" else ""),
                Text("urgent", style="bold") if d.urgent else Text("paced"),
                Text(str(d.message_count)),
                self._sent_when(d, now),
                Text(str(d.attempts)),
                note,
                key=str(d.id),
            )

    @staticmethod
    def _sent_when(delivery: Delivery, now: int) -> Text:
        when = delivery.sent_at if delivery.sent_at is not None else delivery.created
        return Text(f"{duration(now - when)} ago")

    def _oldest_uncertain(self) -> Delivery | None:
        state: OutboxState | None = self.data.extra
        return min(state.uncertain, key=lambda d: d.id) if state and state.uncertain else None

    def targets(self) -> list[Any]:
        """The oldest uncertain send: what `x` and `A` settle (not a row of the table)."""
        delivery = self._oldest_uncertain()
        return [] if delivery is None else [delivery]

    def allowed(self, action: str, targets: list[Any]) -> bool | None:
        # Hidden, not greyed, while nothing is uncertain: a rare case must not crowd the footer.
        return bool(targets)
