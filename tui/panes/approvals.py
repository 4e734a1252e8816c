"""Pane 4, Approvals: requests waiting for a human, with a live countdown to their expiry."""

from __future__ import annotations


from rich.text import Text

from onwatch.core import Approval, Inbox, Overview

from ..safe import safe_text
from .layout import ID_CHARS, Column
from .base import Pane, PaneData, Window
from ..timefmt import duration


def matches(approval: Approval, search: str | None) -> bool:
    if not search:
        return True
    needle = search.lower()
    return needle in approval.request_id.lower() or needle in approval.action.lower()


def time_left(approval: Approval, now: int) -> str:
    """A waiting request's status: '3h59m12s left', or, for a deadline passed before the
    scheduler wrote the expiry, '12s overdue' (an answer now is refused)."""
    if approval.answer is not None:
        return approval.answer
    left = approval.due - now
    return f"{duration(left, precise=True)} left" if left > 0 else f"{duration(-left)} overdue"


class ApprovalsPane(Pane[Approval]):
    """Waiting requests first (soonest deadline first), then the latest answered, greyed.

    `a` approves, `d` denies, `e` expires now; each asks for confirmation showing the action
    text and the time left.
    """

    PANE_ID = "approvals"
    TITLE = "Approvals"
    TAB = "Approvals"
    KEY = "4"
    EMPTY = "No approval requests."
    MARKABLE = True
    TARGET = "approval"
    STATES = ("waiting",)
    HELP = "requests for a human's yes or no, with a live countdown; answered ones greyed"
    COLUMNS = (
        Column("request", "request", 18, narrow=14, middle=True),
        # Waiting: the time left; answered: the answer and who gave it.
        Column("left", "status", 15, narrow=14, ticking=True),
        Column("asked", "asked", 7, ticking=True, rank=2),
        Column("action", "action", 40, narrow=24, fill=True, rank=1),
    )

    @classmethod
    async def fetch(cls, inbox: Inbox, window: Window, overview: Overview) -> PaneData:
        rows = await inbox.approvals(limit=window.limit)
        shown = tuple(a for a in rows if matches(a, window.search))
        return PaneData(shown, overview.waiting_approvals, len(rows) >= window.limit)

    def row_key(self, record: Approval) -> str:
        return record.request_id

    def count_label(self, data: PaneData) -> str:
        if self.window.search:  # the count must be of what the filter shows, all of it
            matches = len(data.rows)
            waiting = sum(1 for a in data.rows if a.answer is None)
            return (
                f"{matches:,} match{'es' if matches != 1 else ''}: {waiting:,} waiting, "
                f"{matches - waiting:,} answered"
            )
        return f"{data.total:,} waiting"

    def cells(self, approval: Approval, now: int) -> dict[str, Text]:
        dim = "dim" if approval.answer is not None else ""
        return {
            "request": safe_text(approval.request_id, limit=ID_CHARS, style=dim),
            **self.ticking_cells(approval, now),
            "action": safe_text(approval.action, limit=300, style=dim),
        }

    def ticking_cells(self, approval: Approval, now: int) -> dict[str, Text]:
        if approval.answer is not None:
            by = f" by {approval.answered_by}" if approval.answered_by else ""
            if len(approval.answer) + len(by) > 14:  # never cut mid-word: the answer alone
                by = ""
            left = Text(approval.answer, style="dim")
            left.append_text(safe_text(by, limit=30, style="dim"))
            return {"left": left, "asked": Text(duration(now - approval.requested), style="dim")}
        overdue = approval.due <= now
        return {
            "left": Text(time_left(approval, now), style="bold" if overdue else ""),
            "asked": Text(duration(now - approval.requested)),
        }

    def allowed(self, action: str, targets: list[Approval]) -> bool | None:
        # Only a waiting request is offered an answer: on an answered row (the highlight
        # stays on it when new requests arrive above) a/d/e are not there to press.
        return any(a.answer is None for a in targets)
