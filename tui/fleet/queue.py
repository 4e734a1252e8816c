"""All approvals: every request waiting anywhere in the fleet, soonest deadline first.

`a` approves, `d` denies, `e` expires the highlighted request, with the same confirmation
dialog and the same standing outcomes as pane 4 (`tui.operator`); the list stays open, so a
queue of requests is answered one after another. `Enter` opens the request's inbox at its
Approvals pane, and `Escape` there comes back to this list.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Hashable, Protocol, runtime_checkable

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Label, Static

from onwatch.core import Approval, InboxError
from onwatch.core.fleet import InboxSummary

from ..footer import KeysFooter
from .. import actions as desk_actions
from .. import operator
from ..panes.layout import ID_CHARS, middle
from ..timefmt import duration
from ..safe import join, safe_text
from .desk import WARN_SECONDS
from .rows import Row, RowWindow

if TYPE_CHECKING:
    from .desk import FleetDesk

Item = tuple[InboxSummary, Approval]


@runtime_checkable
class InboxOpener(Protocol):
    """The Fleet view as the queue sees it (tui/fleet/screen.py): it drills into an inbox.
    A protocol, not an import: the Fleet view opens this queue, not the other way round."""

    async def open_inbox(
        self, key: str, pane: str | None = None, *, back_to: Hashable | None = None
    ) -> None: ...


def _cell(text: Text | str, width: int) -> Text:
    cell = text.copy() if isinstance(text, Text) else Text(text)
    cell.no_wrap = True
    cell.truncate(width, overflow="ellipsis")
    cell.align("left", width)
    return cell


def queue_text(item: Item, now: int, width: int) -> Text:
    summary, approval = item
    left = approval.due - now
    narrow = width < 100
    # To the second within the hour (or wide): a narrow column keeps its "left".
    precise = not narrow or left < 3600
    countdown = f"{duration(left, precise=precise)} left" if left > 0 else "deadline passed"
    inbox_w, left_w, request_w = (12, 11, 16) if narrow else (16, 14, 24)
    action_w = max(width - inbox_w - left_w - request_w - 4, 10)
    # Names and ids too long for their column keep their distinguishing end.
    return Text(" ").join(
        [
            _cell(middle(safe_text(summary.name, limit=ID_CHARS), inbox_w), inbox_w),
            _cell(countdown, left_w),
            _cell(middle(safe_text(approval.request_id, limit=ID_CHARS), request_w), request_w),
            _cell(safe_text(approval.action, limit=300), action_w),
        ]
    )


# The actions on a waiting request, from the desk's table (tui/actions.py).
ANSWERS = desk_actions.offered("approval", ("waiting",))


class QueueRows(RowWindow):
    """The queue's rows, one line per waiting approval."""

    PREFIX = "queue-row"
    COMPONENT_CLASSES = {"queue-row--urgent", "queue-row--waiting", "row-window--cursor"}


def queue_row(item: Item, now: int, selected: bool, width: int) -> Row:
    urgent = item[1].due - now <= WARN_SECONDS
    return Row((queue_text(item, now, width),), "urgent" if urgent else "waiting")


class ApprovalQueueScreen(ModalScreen[None]):
    """Every waiting approval of the fleet by deadline, answered without leaving the list."""

    covers_panes = True  # opaque: the app does not tick the panes beneath (see on_screen_suspend)

    ACTIONS = frozenset(ANSWERS)
    BINDINGS = [
        *desk_actions.bindings(ANSWERS, id_prefix="queue-"),
        Binding(
            "enter",
            "open",
            "Open inbox",
            id="queue-open",
            priority=True,
            tooltip="the request's inbox, at its Approvals pane (esc comes back here)",
        ),
        Binding(
            "escape",
            "back",
            "Back",
            id="queue-back",
            key_display="esc",
            tooltip="back to the fleet",
        ),
        Binding("q", "app.quit", "Quit", id="queue-quit"),
    ]

    def __init__(self, desk: "FleetDesk", *, select: Hashable | None = None) -> None:
        """`select`: the row (inbox key, request id) to put the cursor on, if still listed
        (coming back from the inbox it opened); else the first."""
        super().__init__(id="approval-queue")
        self.desk = desk
        self.items: list[Item] = []
        self.select = select

    def compose(self) -> ComposeResult:
        with Vertical(id="queue"):
            yield Label("", id="queue-title")
            yield Label("", id="queue-outcome")
            yield Static("", id="queue-columns", markup=False)
            yield QueueRows(
                queue_row, lambda item: (item[0].key, item[1].request_id), id="queue-rows"
            )
        yield KeysFooter()

    def on_mount(self) -> None:
        self.query_one(RowWindow).focus()
        self.rows.cursor_key = self.select
        self.show_fleet(self.desk.now())

    def on_screen_suspend(self) -> None:
        self.app.call_later(self.desk.app.tick)

    @property
    def rows(self) -> RowWindow:
        return self.query_one(RowWindow)

    def show_fleet(self, now: int) -> None:
        items = [(s, a) for s in self.desk.summaries.values() for a in s.approvals]
        items.sort(
            key=lambda item: (item[1].due, item[0].name.lower(), item[0].key, item[1].request_id)
        )
        self.items = items
        self.rows.show(items, now)
        waiting = sum(s.waiting for s in self.desk.summaries.values())
        inboxes = len({s.key for s, _ in items})
        title = (
            f"All approvals · {waiting:,} waiting in {inboxes:,} inbox"
            f"{'es' if inboxes != 1 else ''} · soonest deadline first"
        )
        if waiting > len(items):
            title += f" ({len(items):,} listed)"
        if not items:
            title = "All approvals · nothing is waiting anywhere in the fleet"
        self.query_one("#queue-title", Label).update(Text(title))
        narrow = self.app.size.width < 100
        widths = (12, 11, 16) if narrow else (16, 14, 24)
        head = Text(" ").join(
            [
                _cell(name, width)
                for name, width in zip(("inbox", "time left", "request"), widths, strict=True)
            ]
            + [Text("action")]
        )
        self.query_one("#queue-columns", Static).update(head)
        self.refresh_bindings()

    def tick(self, now: int) -> None:
        self.rows.tick(now)

    def _line(self, text: Text, applied: bool | None = None) -> None:
        label = self.query_one("#queue-outcome", Label)
        label.update(text)
        label.set_class(applied is True, "-applied")
        label.set_class(applied is False, "-refused")

    # --- keys -----------------------------------------------------------------------------

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "act":
            if self.desk.read_only or not parameters or parameters[0] not in self.ACTIONS:
                return False
            return True if self.rows.selected is not None else None
        if action == "open":
            return True if self.rows.selected is not None else None
        return True

    def on_row_window_moved(self, message: RowWindow.Moved) -> None:
        self.refresh_bindings()

    def action_act(self, action: str) -> None:
        item = self.rows.selected
        if item is None or self.desk.read_only or action not in self.ACTIONS:
            return
        self.run_worker(self.answer(action, *item), group="actions", exit_on_error=False)

    async def answer(self, action: str, summary: InboxSummary, approval: Approval) -> None:
        """Confirm, then answer one request in its own inbox file; show what stands."""
        app = self.desk.app
        name = safe_text(summary.name, limit=40, style="bold")
        shown = app.inbox if app.inbox is not None and app.inbox.path == summary.target else None
        try:
            inbox = (
                shown
                if shown is not None
                else await self.desk.source.open(summary.key, clock=app.clock)
            )
        except (InboxError, OSError) as exc:
            self._line(join(name, ": cannot open: ", safe_text(str(exc), limit=200)), False)
            return
        try:
            # The summary keeps the first characters of the action: confirm on the full text.
            current = await inbox.get_approval(approval.request_id) or approval
            if not await app.push_screen_wait(app._confirmation(action, (current,), inbox=inbox)):
                self._line(join(name, ": not confirmed: nothing changed"), None)
                return
            outcome = await operator.approval_action(
                inbox, action, current, now=app.clock.now(), actor=app.actor, times=app.times
            )
        except InboxError as exc:
            self._line(join(name, ": not done: ", safe_text(str(exc), limit=200)), False)
            return
        finally:
            if shown is None:
                await inbox.close()
        self._line(join(name, ": ", safe_text(outcome.text, limit=300)), outcome.applied)
        self.desk.scan(force=(summary.key,))

    def action_open(self) -> None:
        item = self.rows.selected
        if item is None:
            return
        fleet = next((s for s in self.app.screen_stack if isinstance(s, InboxOpener)), None)
        if fleet is None:
            return
        self.dismiss(None)
        fleet.run_worker(
            fleet.open_inbox(item[0].key, pane="approvals", back_to=self.rows.cursor_key),
            group="fleet-open",
            exclusive=True,
            exit_on_error=False,
        )

    def action_back(self) -> None:
        self.dismiss(None)
