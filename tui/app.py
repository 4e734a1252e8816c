"""The supervisor TUI's composition root: seven live panes over one inbox file, and its keys.

The app owns the inbox connection and the one clock. It reads (`_refresh`), hands each pane
its window (`pane.show`), ticks countdowns (`tick`), follows the file with a cheap poll of
`Inbox.change_token()` that never overlaps itself and skips while a dialog is open (run as
soon as the file notifier of core/wake.py reports a write, and on an interval as fallback), and
routes the panes' requests to the core (`tui.operator`), after a confirmation where one is due.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, Hashable, Iterable

from rich.console import Group as RenderGroup
from textual import events
from textual.app import App, ComposeResult, SystemCommand
from textual.binding import Binding
from textual.css.query import NoMatches
from textual.screen import Screen
from textual.widgets import ContentSwitcher, Footer, Label

from onwatch.core import (
    ACTIONS,
    Approval,
    BadInput,
    Clock,
    Delivery,
    Event,
    Inbox,
    InboxError,
    Overview,
    SystemClock,
    Timer,
)
from onwatch.core.actions import check_actor, operator_name
from onwatch.core.fleet import DatabaseFleet, FleetSource, FolderFleet, run_activity
from onwatch.core.pg import is_url
from onwatch.core.connection import SLOW_POLL
from onwatch.core.runtime.worker import HELD_BACK_LOOK_EVERY

from . import actions as desk
from . import operator
from .footer import KeysFooter
from .panes import PANES, Pane
from .panes.base import PaneTable, Window
from .panes.panebar import PaneBar
from .panes.status import SPEND_DAYS, StatusStrip
from .timefmt import WALL, Times, compact_count, period
from .safe import join, safe_plain, safe_text
from .screens.budget import BudgetScreen, budgets_set
from .screens.confirm import ConfirmScreen, Subject
from .screens.detail import DetailScreen, detail_links, load_detail
from .screens.filter import FilterScreen
from .screens.groups import GroupsScreen
from .screens.workers import WorkersScreen
from .screens.help import HelpScreen, render_groups

if TYPE_CHECKING:
    from .fleet import FleetDesk

STYLESHEET = Path(__file__).with_name("app.tcss")

# The confirmation of each action comes from the core's one table of actions.
QUESTIONS = {
    name: (action.question, action.question_many, action.note) for name, action in ACTIONS.items()
}
# What an answer past its deadline does instead (the inbox refuses it, checked on write).
LATE = (
    "The deadline has passed: this answer will be refused and the request ends as "
    "expired; the agent resumes with a refusal."
)


class OnwatchApp(App[int]):
    """Watch and steer one inbox: panes 1–7, actions by key, outcomes in words."""

    CSS_PATH = "app.tcss"
    TITLE = "onwatch"
    ACTOR: str | None = None  # a fixed actor (the demos' "viewer"); else see __init__
    TIMES: Times = WALL  # how instants are worded (the scenario player's clock is simulated)
    POLL_SECONDS = 0.5
    FALLBACK_POLL_SECONDS = 1.0  # while the notifier runs: it also retries a failed read
    TICK_SECONDS = 1.0
    MUTATING = frozenset({"send_now"})  # besides the operator actions (`act(...)`)
    FILE_CHECK_SECONDS = 1.0  # how often the path is checked to still name the opened file

    BINDINGS = [
        *(
            Binding(
                pane.KEY,
                f"show_pane('{pane.PANE_ID}')",
                pane.TITLE,
                show=False,
                id=f"pane-{pane.PANE_ID}",
                tooltip=pane.HELP,
            )
            for pane in PANES
        ),
        # The inbox's switches (pause/resume, hold/release the outbox): p and o.
        *desk.bindings(desk.offered("inbox", ("false", "true"))),
        # Raising a delaying budget (spend per day, runs per day): B, when one is set.
        *desk.bindings(desk.offered("budget", ("set",))),
        Binding(
            "s",
            "send_now",
            "Write out",
            id="send-now",
            tooltip="append every held message to a log file beside the inbox and mark "
            "them sent: nobody receives them, the desk has no channel (confirmed)",
        ),
        Binding(
            "W",
            "workers",
            "Workers",
            show=False,
            id="workers",
            tooltip="who watches this inbox: the lease holder and the workers standing by, "
            "with host, pid and since when",
        ),
        Binding(
            "R",
            "reopen",
            "Reopen",
            id="reopen",
            tooltip="open the file now at the inbox's path (after it was deleted or replaced)",
        ),
        Binding(
            "question_mark", "help", "Help", id="help", key_display="?", tooltip="this list of keys"
        ),
        Binding("q", "quit", "Quit", id="quit", tooltip="leave onwatch (the agent keeps running)"),
        Binding(
            "0",
            "fleet",
            "Fleet",
            id="fleet",
            tooltip="every inbox of the fleet, the cursor on this one",
        ),
        Binding(
            "escape",
            "leave",
            "Back",
            show=False,
            id="fleet-escape",
            key_display="esc",
            tooltip="back where this inbox was opened from: the fleet, or all approvals",
        ),
    ]

    def __init__(
        self,
        inbox: Inbox | None,
        *,
        clock: Clock | None = None,
        read_only: bool = False,
        fleet: FleetSource | None = None,
        actor: str | None = None,
    ) -> None:
        """`actor` is who the audit log says acted: by default `$ONWATCH_ACTOR`, else the
        operating system's user (core.actions.operator_name). Raises BadInput without an
        inbox and without a clock (the clock is the inbox's), or for an actor the audit log
        refuses."""
        if clock is None:
            if inbox is None:
                raise BadInput("a clock is needed when no inbox is given (the fleet desk)")
            clock = inbox.clock
        # CSS_PATH is relative to the class that names it: a subclass in another package
        # that keeps ours gets it by absolute path.
        own_css = type(self).CSS_PATH == OnwatchApp.CSS_PATH
        super().__init__(css_path=str(STYLESHEET) if own_css else None)
        self.inbox = inbox
        self.clock = clock
        self.read_only = read_only
        self.times = self.TIMES
        self.actor = check_actor(actor) if actor is not None else (self.ACTOR or operator_name())
        self.now = self.clock.now()
        self.overview: Overview | None = None
        self.loaded = asyncio.Event()  # set after the first full read (tests wait on it)
        self._refresh_lock = asyncio.Lock()
        self._action_lock = asyncio.Lock()
        self._seen_token: tuple[int, int] | None = None  # the change token the panes show
        self._polling = False
        self._follower: asyncio.Task[None] | None = None  # wakes the poll, see _follow
        self._problem: str | None = None
        self._held_back: str | None = None  # what Inbox.held_back last said
        self._held_back_due = 0.0  # (monotonic) when to ask it again
        self.file_problem: str | None = None  # the path no longer names the opened file
        # A folder (or database) of inboxes: the Fleet view opens over the panes, and the
        # inbox they show is the one chosen there (None until then).
        self.fleet = fleet
        self.fleet_desk: FleetDesk | None = None  # made at mount when fleet is set
        # The all-approvals row this inbox was opened from: Escape goes back to that list.
        self.back_to_queue: Hashable | None = None

    # --- layout ---------------------------------------------------------------------------

    def compose(self) -> ComposeResult:
        yield StatusStrip(
            self.inbox.path if self.inbox else "", read_only=self.read_only, id="status"
        )
        yield PaneBar([(p.PANE_ID, p.KEY, p.TAB) for p in PANES], id="panebar")
        with ContentSwitcher(initial=PANES[0].PANE_ID, id="panes"):
            for pane_class in PANES:
                pane = pane_class()
                pane.read_only = self.read_only
                pane.times = self.times
                yield pane
        yield KeysFooter()

    def on_resize(self, event: events.Resize) -> None:
        # Below the design width the footer drops its padding so every key still fits.
        footer = self.query_one(Footer)
        footer.compact = event.size.width < 140
        self.query_one(PaneBar).set_class(event.size.width < 100, "-narrow")
        footer.show_command_palette = True

    def on_mount(self) -> None:
        self.query_one(PaneBar).activate(PANES[0].PANE_ID)
        self.active_pane.focus_table()
        self.set_interval(self.TICK_SECONDS, self.tick, name="clock")
        # The poll is the fallback; the notifier (core/wake.py) triggers it at once.
        watching = self.inbox is not None and self.inbox.wake.watching
        self.set_interval(
            self.FALLBACK_POLL_SECONDS if watching else self.POLL_SECONDS, self._poll, name="follow"
        )
        self._start_following()
        self.run_worker(self.reload(), group="refresh", exit_on_error=False)
        if self.fleet is not None:
            self._start_fleet()

    @property
    def panes(self) -> list[Pane[Any]]:
        return list(self.query(Pane))

    @property
    def active_pane(self) -> Pane[Any]:
        switcher = self.query_one("#panes", ContentSwitcher)
        return self.query_one(f"#{switcher.current}", Pane)

    def pane(self, pane_id: str) -> Pane[Any]:
        return self.query_one(f"#{pane_id}", Pane)

    # --- reading --------------------------------------------------------------------------

    async def reload(self) -> None:
        """Re-read everything from the inbox now and repaint (the clock is read again too)."""
        await self._refresh(every_pane=True)

    async def _refresh(self, *, every_pane: bool = False, panes: Iterable[Pane[Any]] = ()) -> None:
        """Read the overview and the panes that need it, then hand each its window.

        Only the shown pane is read on a change (the pane bar's counts come from the
        overview); the others are marked stale and read when shown.
        """
        if self.inbox is None:  # the fleet desk before an inbox was chosen
            return
        async with self._refresh_lock:
            now = self.clock.now()
            active = self.active_pane
            wanted = [p for p in self.panes if every_pane or p is active or p in panes]
            try:
                # Read before the data: a commit after this moves the token, so the next poll
                # reads again; none is missed, and the app's own writes are followed too.
                token = await self.inbox.change_token()
                overview = await self.inbox.overview(now=now)
                activity = await run_activity(self.inbox, now)  # the status strip's sparkline
                spending = await self.inbox.spending(days=SPEND_DAYS, now=now)
                await self.inbox.reload_settings()  # `onwatch config` may have run meanwhile
                fetched = [(p, await p.fetch(self.inbox, p.window, overview)) for p in wanted]
                await self._look_held_back()
            except InboxError as exc:
                self._problem = f"cannot read the inbox: {exc}"
                self._seen_token = None  # the next poll tries again
                self.query_one(StatusStrip).problem = self._problem
                self.query_one(StatusStrip).tick(now)
                return
            self._seen_token = token
            self._problem = None
            self.now = now
            self.overview = overview
            with self.batch_update():
                for pane, data in fetched:
                    pane.show(data, now)
                for pane in self.panes:
                    if pane not in wanted:
                        pane.stale = True
                self.query_one(StatusStrip).show(
                    overview, now, now, activity=activity, spending=spending
                )
                self.query_one(PaneBar).show_counts(self._counts())
            self.refresh_bindings()
            self.loaded.set()

    async def _look_held_back(self) -> None:
        """Ask, once per HELD_BACK_LOOK_EVERY, whether another process's read holds the
        store's cleanup back: a badge while it does, a notice when it begins and ends."""
        assert self.inbox is not None
        if time.monotonic() < self._held_back_due:
            return
        self._held_back_due = time.monotonic() + HELD_BACK_LOOK_EVERY
        why = await self.inbox.held_back()
        if (why is None) != (self._held_back is None):
            if why is not None:
                message = safe_plain(f"cleanup held back: {why}", limit=500)
                self.notify(message, severity="warning", markup=False, timeout=30)
            else:
                self.notify("cleanup is no longer held back", severity="information")
        self._held_back = why
        self.query_one(StatusStrip).show_held_back(why)

    def _counts(self) -> dict[str, str]:
        overview = self.overview
        if overview is None:
            return {}
        counts = overview.counts
        return {
            "pending": compact_count(counts.get("pending", 0)),
            "running": compact_count(counts.get("running", 0)),
            "dead": compact_count(counts.get("dead", 0) + counts.get("interrupted", 0)),
            "approvals": compact_count(overview.waiting_approvals),
            "timers": compact_count(overview.timers),
            "outbox": compact_count(overview.held_messages),
            "done": compact_count(counts.get("done", 0)),
        }

    def _dialog_open(self) -> bool:
        return len(self.screen_stack) > 1

    def _poll(self, confirm: bool = False) -> bool:
        """Has anyone committed? Never overlaps, skips under a dialog; False if skipped."""
        if self._polling or self._dialog_open() or self.inbox is None:
            return False
        self._polling = True
        self.run_worker(self._poll_once(confirm), group="refresh", exit_on_error=False)
        return True

    def on_unmount(self) -> None:
        if self._follower is not None:
            self._follower.cancel()

    def _start_following(self) -> None:
        """Follow the inbox shown now (a fleet desk switches it; none before one is chosen)."""
        self._held_back, self._held_back_due = None, 0.0  # asked anew of this inbox
        if self._follower is not None:
            self._follower.cancel()
            self._follower = None
        if self.inbox is not None:
            # A plain task, not a worker: tests wait for the workers to complete.
            self._follower = asyncio.create_task(self._follow())

    async def _follow(self) -> None:
        """Poll as soon as the file may have changed: another process's commit (the OS's
        file notification) or one of ours. A poll skipped meanwhile is tried again."""
        wake, seen = None, 0
        while True:
            inbox = self.inbox
            if inbox is None:  # the fleet view, before any inbox was chosen
                await asyncio.sleep(SLOW_POLL / 10)
                continue
            if inbox.wake is not wake:  # another inbox is shown now (fleet, demo): follow it
                wake, seen = inbox.wake, inbox.wake.seq
            if not await wake.wait(seen, SLOW_POLL):
                continue
            seen = wake.seq
            while not self._poll(confirm=True) and self.inbox is inbox:
                await asyncio.sleep(0.1)

    async def _poll_once(self, confirm: bool = False) -> None:
        inbox = self.inbox
        try:
            if inbox is None:  # another inbox was being chosen meanwhile (the fleet desk)
                return
            # After a wake-up the commit may not be visible yet: confirm reads a little longer.
            if (
                await inbox.wake.confirm(
                    inbox.change_token, self._seen_token, inbox.settled_change_token
                )
                if confirm
                else await inbox.change_token() != self._seen_token
            ):
                await self._refresh()
            elif self._problem is None:
                status = self.query_one(StatusStrip)
                status.updated_at = self.clock.now()
                await self._look_held_back()  # a read may end while nothing commits
        except InboxError as exc:
            self._problem = f"cannot read the inbox: {exc}"
            self._seen_token = None  # the next poll that gets an answer reads again
            self.query_one(StatusStrip).problem = self._problem
        finally:
            self._polling = False

    def tick(self) -> None:
        """The one clock: every countdown on screen derives from this `now`."""
        now = self.clock.now()
        self.now = now
        top = self.top_screen
        if top is None:
            return
        try:
            self.check_file()
            # Under the fleet's opaque screens the panes are hidden: moving their countdowns
            # would only redraw the screen on top (they are ticked again when uncovered).
            if not getattr(top, "covers_panes", False):
                self.query_one(StatusStrip).tick(now)
                self.active_pane.tick(now)
            if self.fleet_desk is not None:
                self.fleet_desk.tick(now)
        except NoMatches:  # starting up or shutting down: nothing on screen to move
            return
        if isinstance(top, ConfirmScreen):
            top.tick(now)

    @property
    def top_screen(self) -> Screen[Any] | None:
        """The screen on top, or None once the app has popped its last one on the way out:
        a timer (the clock, the fleet's scan) can still fire then, and `screen` would raise."""
        stack = self.screen_stack
        return stack[-1] if stack else None

    def check_file(self) -> str | None:
        """Is the path still the file we opened? If not: a standing alarm, every action
        refused, `R` offered. Two stat calls; run by the clock, whatever follows the file."""
        why = self.inbox.file_replaced() if self.inbox is not None else None
        if why != self.file_problem:
            self.file_problem = why
            self.query_one(StatusStrip).raise_alarm(why)
            for pane in self.panes:
                pane.refusing = why
                pane.refresh_bindings()
            self.refresh_bindings()
            if why is not None:
                self.bell()
        return why

    async def action_reopen(self) -> None:
        """Open the inbox now at the path; the old connection (to a lost file) is closed."""
        if self.file_problem is None or self.inbox is None:
            return
        try:
            fresh = await Inbox.open(self.inbox.path, clock=self.clock, create=False)
        except (InboxError, OSError) as exc:
            self.active_pane.show_outcome(f"cannot reopen: {exc}", False)
            return
        async with self._refresh_lock, self._action_lock:
            old, self.inbox = self.inbox, fresh
            if old is not None:
                await old.close()
            self._seen_token = None
            for pane in self.panes:
                pane.clear_marks()
                pane.window.after = None
                pane.window.previous.clear()
        self._start_following()  # the old connection's notifier went with it
        self.check_file()
        self.active_pane.show_outcome(
            f"reopened {fresh.path}: this is the file at that path now", True
        )
        await self.reload()

    # --- panes ----------------------------------------------------------------------------

    def action_show_pane(self, pane_id: str) -> None:
        self.query_one("#panes", ContentSwitcher).current = pane_id
        self.query_one(PaneBar).activate(pane_id)
        pane = self.pane(pane_id)
        pane.focus_table()
        if pane.stale:
            self.run_worker(self._refresh(panes=(pane,)), group="refresh", exit_on_error=False)
        else:
            pane.tick(self.clock.now())
        self.refresh_bindings()

    def on_pane_bar_chosen(self, message: PaneBar.Chosen) -> None:
        self.action_show_pane(message.pane_id)

    def on_pane_window_changed(self, message: Pane.WindowChanged) -> None:
        self.run_worker(self._refresh(panes=(message.pane,)), group="refresh", exit_on_error=False)

    def on_key(self, event: events.Key) -> None:
        # A key the panes' queue held while the filter dialog went up reaches the app with
        # no binding on the dialog: it was typed for the filter.
        if event.is_forwarded and isinstance(self.screen, FilterScreen):
            self.screen.type_ahead(event)

    def on_pane_filter_requested(self, message: Pane.FilterRequested) -> None:
        pane = message.pane
        hint = (
            "Matches the source, the source id or the error text."
            if pane.PAGED
            else "Matches the text of the rows in this pane."
        )
        self.push_screen(FilterScreen(pane.TITLE, pane.window.search, hint), pane.set_filter)

    def on_pane_detail_requested(self, message: Pane.DetailRequested) -> None:
        self.run_worker(self._detail(message.record), group="dialog", exit_on_error=False)

    async def _detail(self, record: Any) -> None:
        if self.inbox is None:  # the fleet desk before an inbox was chosen: no rows
            return
        try:
            detail = await load_detail(self.inbox, record, self.clock.now(), self.times)
            links = await detail_links(self.inbox, record)
        except InboxError as exc:
            self.active_pane.show_outcome(f"cannot read the detail: {exc}", False)
            return
        await self.push_screen(
            DetailScreen(detail.title, detail.body, detail.follow, links), self._follow_link
        )

    def _follow_link(self, link: tuple[str, int | str] | None) -> None:
        """A detail's link was chosen: open the linked row's detail (an approval and the
        events that asked for it and that its answer became, both ways)."""
        if link is None or self.inbox is None:
            return
        self.run_worker(self._linked(*link), group="dialog", exit_on_error=False)

    async def _linked(self, kind: str, key: int | str) -> None:
        inbox = self.inbox
        if inbox is None:
            return
        record: Any = None
        try:
            if kind == "event" and isinstance(key, int):
                record = await inbox.get_event(key)
            elif kind == "approval" and isinstance(key, str):
                record = await inbox.get_approval(key)
        except InboxError as exc:
            self.active_pane.show_outcome(f"cannot read the detail: {exc}", False)
            return
        if record is None:
            self.active_pane.show_outcome(f"{kind} {key} no longer exists", False)
            return
        await self._detail(record)

    # --- actions --------------------------------------------------------------------------

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "reopen":
            return self.file_problem is not None
        if action in ("fleet", "leave"):
            return self.fleet is not None
        if action not in self.MUTATING and action != "act":
            return True
        if self.read_only:
            return False
        if self.file_problem is not None:
            return None
        overview = self.overview
        if action == "act":
            # A switch's two keys share one key: only the one that changes it is offered.
            row = ACTIONS.get(str(parameters[0])) if parameters else None
            if row is not None and row.target == "budget":
                return True if budgets_set(overview) else None
            if row is None or row.target != "inbox" or row.switch is None:
                return False
            on = overview is not None and bool(getattr(overview, row.switch))
            return ("true" if on else "false") in row.allowed
        if self.inbox is not None and operator.outbox_log_path(self.inbox) is None:
            return False  # a database's inbox has no file beside it to write to
        return True if overview is None or overview.held_messages else None

    def on_pane_action_requested(self, message: Pane.ActionRequested) -> None:
        message.stop()
        if self.read_only:
            return
        self.run_worker(
            self._act(message.pane, message.action, message.targets, message.hidden),
            group="actions",
            exit_on_error=False,
        )

    def _confirmation(
        self,
        action: str,
        targets: tuple[Any, ...],
        hidden: int = 0,
        inbox: Inbox | None = None,
    ) -> ConfirmScreen:
        """The question before `action` on `targets`, naming the inbox it writes to (the one
        shown unless `inbox` is given: the fleet's approvals queue answers in other files)."""
        one, many, note = QUESTIONS[action]
        question = one if len(targets) == 1 else many.format(n=len(targets))
        now = self.clock.now()
        late = [t for t in targets if isinstance(t, Approval) and t.answer is None and t.due <= now]
        if late and action in ("approve", "deny"):
            if len(late) == len(targets):
                question = question.replace(
                    "?",
                    " (past its deadline)?" if len(late) == 1 else " (all past their deadline)?",
                )
                note = LATE
            else:
                note = (
                    f"{note} {len(late)} of them are past their deadline: those answers "
                    f"will be refused and end as expired."
                )
        if hidden:
            rows = "row is" if hidden == 1 else "rows are"
            note = (
                f"Only the rows listed: {hidden} marked {rows} hidden by the filter or "
                f"another page and left out. {note}"
            )
        subjects = []
        long = 4000 if len(targets) == 1 else 200
        for target in targets:
            if isinstance(target, Approval):
                text = join(
                    safe_text(target.request_id, limit=200, style="bold"),
                    "\n",
                    safe_text(target.action, limit=long, multiline=True),
                )
                subjects.append(Subject(text, target.due))
            elif isinstance(target, Event):
                text = join(
                    f"#{target.id}  ",
                    safe_text(target.source, limit=60),
                    " / ",
                    safe_text(target.source_id, limit=120),
                    f"  ({target.status}, "
                    f"{target.attempts} attempt{'s' if target.attempts != 1 else ''})",
                )
                if target.error:
                    text.append("\n")
                    text.append_text(safe_text(target.error, limit=200, style="italic"))
                subjects.append(Subject(text))
            elif isinstance(target, Timer):
                every = "one-off" if target.every is None else f"every {period(target.every)}"
                subjects.append(
                    Subject(
                        join(
                            safe_text(target.id, limit=200, style="bold"),
                            f"  ({target.state}, {every}, next due ",
                            self.times.clock(target.due) if type(target.due) is int else "?",
                            ")",
                        )
                    )
                )
            elif isinstance(target, Delivery):
                subjects.append(
                    Subject(
                        join(
                            f"send #{target.id}  ",
                            safe_text(target.key, limit=120),
                            f"  ({target.status}, {target.message_count} message"
                            f"{'s' if target.message_count != 1 else ''})",
                        )
                    )
                )
        return ConfirmScreen(
            question, subjects, now, note, where=_where(inbox or self.inbox), times=self.times
        )

    async def _go_ahead(self, pane: Pane[Any], confirm: ConfirmScreen | None) -> bool:
        """Whether an action goes ahead: confirmed (when it asks), and the path still names
        the file opened. Then, until the core answers (a worker may hold the write lock for a
        moment), the previous outcome must not stand on screen as if it were this one's."""
        if confirm is not None and not await self.push_screen_wait(confirm):
            pane.show_outcome("not confirmed: nothing changed", None)
            return False
        if self._refuse_lost_file(pane):
            return False
        pane.show_outcome("waiting for the lock…", None)
        return True

    def _refuse_lost_file(self, pane: Pane[Any]) -> bool:
        """Say so and refuse when the path no longer names the opened file."""
        why = self.check_file()
        if why is not None:
            pane.show_outcome(f"refused: {why}; nothing changed (R reopens the path)", False)
        return why is not None

    async def _act(
        self, pane: Pane[Any], action: str, targets: tuple[Any, ...], hidden: int = 0
    ) -> None:
        answered = [t for t in targets if isinstance(t, Approval) and t.answer is not None]
        if answered and len(answered) == len(targets):
            # Nothing to ask: say what stands rather than do nothing silently.
            pane.show_outcome(
                "; ".join(f"{t.request_id}: already answered: {t.answer}" for t in answered[:3]),
                False,
            )
            return
        targets = tuple(t for t in targets if t not in answered)
        async with self._action_lock:
            if self._refuse_lost_file(pane):
                return
            inbox = self.inbox
            if inbox is None:  # the fleet desk before an inbox was chosen: no rows to act on
                return
            asks = desk.KEYS[action].confirm
            confirm = self._confirmation(action, targets, hidden) if asks else None
            if not await self._go_ahead(pane, confirm):
                return
            now = self.clock.now()
            outcomes = []
            on = ACTIONS[action].target
            for target in targets:
                if on == "approval":
                    outcomes.append(
                        await operator.approval_action(
                            inbox, action, target, now=now, actor=self.actor, times=self.times
                        )
                    )
                elif on == "delivery":
                    outcomes.append(
                        await operator.delivery_action(
                            inbox, action, target.id, now=now, actor=self.actor
                        )
                    )
                elif on == "timer":
                    outcomes.append(
                        await operator.timer_action(
                            inbox, action, target, now=now, actor=self.actor
                        )
                    )
                else:
                    outcomes.append(
                        await operator.event_action(
                            inbox, action, target, now=now, actor=self.actor
                        )
                    )
            outcome = operator.summarize(action, outcomes)
            pane.acted_on(targets)
            pane.clear_marks()
            pane.show_outcome(outcome.text, outcome.applied)
            await self._refresh()

    async def _global(self, action: str) -> None:
        async with self._action_lock:
            pane = self.active_pane
            if self._refuse_lost_file(pane):
                return
            inbox = self.inbox
            if inbox is None:  # the fleet desk before an inbox was chosen: nothing to switch
                return
            if action == "send_now":
                held = self.overview.held_messages if self.overview else 0
                log = operator.outbox_log_path(inbox)
                if log is None:  # no file beside a database's inbox (check_action hides s)
                    return
                them = "it" if held == 1 else "them"
                question = (
                    f"Write {held:,} held message{'s' if held != 1 else ''} to a file and "
                    f"mark {them} sent?"
                )
                note = (
                    f"Nobody receives {them}: the desk has no channel to your users. "
                    f"{'It is' if held == 1 else 'They are'} appended to "
                    f"{safe_plain(_shown_path(log), limit=300)} and leave"
                    f"{'s' if held == 1 else ''} the "
                    f"outbox as sent, so the worker will not send {them} either. To deliver "
                    f"{them}, run `onwatch dispatch --now` with the agent's channel instead."
                )
                confirm = ConfirmScreen(question, [], self.now, note, where=_where(inbox))
                if not await self.push_screen_wait(confirm):
                    pane.show_outcome("not confirmed: nothing written, nothing marked", None)
                    return
                if self._refuse_lost_file(pane):
                    return
                pane.show_outcome("waiting for the lock…", None)
                outcome = await operator.send_now(inbox, now=self.clock.now(), actor=self.actor)
            else:
                pane.show_outcome("waiting for the lock…", None)
                outcome = await operator.flag_action(
                    inbox, action, now=self.clock.now(), actor=self.actor
                )
            pane.acted_on(pane.records())  # rows sent now leave: the outcome says so
            pane.show_outcome(outcome.text, outcome.applied)
            await self._refresh()

    def _run_global(self, action: str) -> None:
        if self.read_only:
            return
        self.run_worker(self._global(action), group="actions", exit_on_error=False)

    def action_act(self, name: str) -> None:
        """The key of an inbox switch or of raising a budget (the panes take the actions on
        rows)."""
        if name in ACTIONS and ACTIONS[name].target == "inbox":
            self._run_global(name)
        elif name in ACTIONS and ACTIONS[name].target == "budget" and not self.read_only:
            self.run_worker(self._raise_budget(), group="actions", exit_on_error=False)

    def action_send_now(self) -> None:
        self._run_global("send_now")

    async def _raise_budget(self) -> None:
        """Ask which budget and to what, confirm, then raise it (conditional on the limit
        shown: a change by someone else meanwhile is reported, not overwritten)."""
        async with self._action_lock:
            pane, inbox = self.active_pane, self.inbox
            if inbox is None or self._refuse_lost_file(pane):
                return
            choices = budgets_set(self.overview)
            if not choices:
                pane.show_outcome("no delaying budget is set: nothing to raise", None)
                return
            picked = await self.push_screen_wait(BudgetScreen(choices))
            if picked is None:
                pane.show_outcome("not raised: nothing changed", None)
                return
            choice, value = picked
            _, _, note = QUESTIONS["raise_budget"]
            question = (
                f"Raise {choice.name} from {choice.shown(choice.limit)} to {choice.shown(value)}?"
            )
            confirm = ConfirmScreen(question, [], self.clock.now(), note, where=_where(inbox))
            if not await self._go_ahead(pane, confirm):
                return
            try:
                outcome = await inbox.raise_budget(
                    choice.budget,
                    value,
                    unit=choice.unit,
                    expect=choice.limit,
                    now=self.clock.now(),
                    actor=self.actor,
                )
            except InboxError as exc:
                pane.show_outcome(f"not raised: {exc}", False)
                return
            if outcome.applied:
                words = desk.KEYS["raise_budget"].done.format(label=outcome.target)
                pane.show_outcome(f"{words}: {outcome.before} → {outcome.after}", True)
            else:
                pane.show_outcome(f"not raised: {outcome.reason}", False)
            await self._refresh()

    # --- workers and dead events by error ---------------------------------------------------

    def action_workers(self) -> None:
        if self.inbox is not None and not self._dialog_open():
            self.run_worker(self._show_workers(), group="dialog", exit_on_error=False)

    async def _show_workers(self) -> None:
        inbox = self.inbox
        if inbox is None:
            return
        now = self.clock.now()
        try:
            workers = await inbox.workers(now=now)
            lease = await inbox.lease_info()
        except InboxError as exc:
            self.active_pane.show_outcome(f"cannot read the workers: {exc}", False)
            return
        ttl = inbox.settings.lease_ttl
        await self.push_screen(WorkersScreen(workers, lease, now, ttl, self.times))

    def action_dead_groups(self) -> None:
        if self.inbox is not None and not self._dialog_open():
            self.run_worker(self._dead_groups(), group="dialog", exit_on_error=False)

    async def _dead_groups(self) -> None:
        """The dead events by the first line of their error; a group picked is requeued
        after one confirmation naming how many, and only the events listed then."""
        inbox, pane = self.inbox, self.pane("dead")
        if inbox is None:
            return
        try:
            groups = await inbox.dead_groups()
        except InboxError as exc:
            pane.show_outcome(f"cannot read the dead events: {exc}", False)
            return
        picked = await self.push_screen_wait(GroupsScreen(groups, read_only=self.read_only))
        if picked is None or self.read_only:
            return
        async with self._action_lock:
            if self._refuse_lost_file(pane):
                return
            ids = await inbox.dead_group_ids(picked.line)
            shown = safe_plain(picked.line or "(no error)", limit=120)
            if not ids:
                pane.show_outcome(f"no dead event has the error “{shown}” now", False)
                return
            n = len(ids)
            question = (
                "Requeue this dead event?"
                if n == 1
                else f"Requeue all {n:,} dead events of this group?"
            )
            note = (
                f"{ACTIONS['requeue'].note} Only these {n:,}: an event that dies of this "
                f"error after now is not touched."
            )
            subject = Subject(join(f"{n:,} × ", safe_text(picked.line or "(no error)", limit=400)))
            confirm = ConfirmScreen(
                question, [subject], self.clock.now(), note, where=_where(inbox), times=self.times
            )
            if not await self._go_ahead(pane, confirm):
                return
            try:
                outcomes = await inbox.requeue_group(
                    picked.line, ids, now=self.clock.now(), actor=self.actor
                )
            except InboxError as exc:
                pane.show_outcome(f"not done: {exc}", False)
                return
            applied = sum(o.applied for o in outcomes)
            text = f"requeued {applied:,} of {n:,} with the error “{shown}”"
            refused = [o for o in outcomes if not o.applied]
            if refused:
                first = refused[0]
                text += f"; #{first.target.removeprefix('event ')}: {first.reason}"
            pane.acted_on(r for r in pane.records() if r.id in set(ids))
            pane.show_outcome(text, applied == n)
            await self._refresh()

    # --- the fleet desk ---------------------------------------------------------------------

    def _start_fleet(self) -> None:
        from .fleet import FleetDesk, FleetScreen

        if self.fleet is None:
            return
        desk = self.fleet_desk = FleetDesk(self, self.fleet, read_only=self.read_only)
        self.install_screen(FleetScreen(desk), name="fleet")
        self.push_screen("fleet")
        desk.start()

    def action_fleet(self) -> None:
        """Back to the Fleet view, its cursor on the inbox it was on."""
        if self.fleet is not None and not self._dialog_open():
            self.back_to_queue = None
            self.push_screen("fleet")

    def action_leave(self) -> None:
        """Back where the inbox shown was opened from: the all-approvals list (its cursor on
        the request it opened, if still waiting), or the Fleet view."""
        if self.fleet is None or self._dialog_open():
            return
        back, self.back_to_queue = self.back_to_queue, None
        self.push_screen("fleet")
        if back is not None and self.fleet_desk is not None:
            from .fleet.queue import ApprovalQueueScreen

            self.push_screen(ApprovalQueueScreen(self.fleet_desk, select=back))

    async def switch_inbox(self, inbox: Inbox) -> None:
        """Show `inbox` in the panes instead of the one shown now, which is closed."""
        async with self._action_lock, self._refresh_lock:
            old, self.inbox = self.inbox, inbox
            self.overview, self._seen_token, self._problem = None, None, None
            self.loaded.clear()
            status = self.query_one(StatusStrip)
            status.path, status.overview, status.updated_at = inbox.path, None, None
            status.query_one("#file", Label).update(
                safe_text(os.path.basename(inbox.path), limit=30)
            )
            for pane in self.panes:
                pane.window = Window()
                pane.clear_marks()
                pane.show_outcome("", None)
                pane.stale = True
        if old is not None:
            await old.close()
        self._start_following()
        await self.reload()

    # --- help and the command palette -----------------------------------------------------

    def _help_text(self) -> RenderGroup:
        def available(binding: Binding) -> bool:
            writes = desk.acted(binding) is not None or binding.action.split("(")[0] in (
                self.MUTATING | {"mark"}
            )
            return not (self.read_only and writes)

        app_bindings = [
            b
            for b in OnwatchApp.BINDINGS
            if isinstance(b, Binding) and (b.action not in ("fleet", "leave") or self.fleet)
        ]
        # A subclass (the demo player) adds its own keys: they come first, under its title.
        added = [
            b
            for cls in type(self).__mro__[: type(self).__mro__.index(OnwatchApp)]
            for b in cls.__dict__.get("BINDINGS", ())
            if isinstance(b, Binding) and b not in app_bindings
        ]
        groups = [(self.TITLE, [(b, True) for b in added])] if added else []
        # The keys that change things come first: at 80×24 they are the first screen.
        for pane in PANES:
            own = [
                (b, available(b))
                for b in pane.BINDINGS
                if isinstance(b, Binding) and b not in Pane.BINDINGS
            ]
            if own:
                groups.append((f"{pane.KEY} {pane.TITLE}", own))
        groups += [
            ("Panes", [(b, True) for b in app_bindings if b.action.startswith("show_pane")]),
            (
                "Everywhere",
                [(b, available(b)) for b in app_bindings if not b.action.startswith("show_pane")]
                + [
                    (
                        Binding(
                            "ctrl+p",
                            "command_palette",
                            "Commands",
                            tooltip="find any of these by name",
                        ),
                        True,
                    )
                ],
            ),
            (
                "In every pane",
                [
                    (b, available(b))
                    for b in Pane.BINDINGS
                    if isinstance(b, Binding) and not b.action.startswith("app.")
                ],
            ),
            (
                "Moving in a table (↑ ↓ pgup pgdn too)",
                [(b, True) for b in PaneTable.BINDINGS if isinstance(b, Binding)],
            ),
        ]
        notes = [
            "Confirmations: y or ↵ confirms, n or esc cancels.",
            "Every action is conditional on the state you saw: a row the worker changed "
            "meanwhile is reported, not overwritten.",
        ]
        log = operator.outbox_log_path(self.inbox) if self.inbox is not None else None
        if log is not None:
            notes.append(
                f"s sends nothing to anyone: the desk has no channel. It appends the held "
                f"messages to {_shown_path(log)} and marks them sent."
            )
        if self.read_only:
            notes.insert(0, "Read-only: every action is removed; you can watch and read.")
        return render_groups(groups, self.get_key_display, notes)

    def action_help(self) -> None:
        self.push_screen(HelpScreen(self._help_text()))

    def get_system_commands(self, screen: Screen[Any]) -> Iterable[SystemCommand]:
        """The palette offers every onwatch key that is active where it was opened, by name.

        Only our bindings (each has an id): the widgets' navigation keys are listed by
        Textual's own "Keys" command, and quitting by its "Quit".
        """
        yield from super().get_system_commands(screen)
        seen = set()
        for active in screen.active_bindings.values():
            binding = active.binding
            if not active.enabled or not binding.id or not binding.description:
                continue
            if (binding.action, id(active.node)) in seen or binding.action.removeprefix("app.") in (
                "command_palette",
                "quit",
            ):
                continue
            seen.add((binding.action, id(active.node)))
            help_text = f"key {self.get_key_display(binding)}"
            if binding.tooltip:
                help_text += f": {binding.tooltip}"
            yield SystemCommand(
                binding.description,
                help_text,
                # The action runs where its binding lives (a pane, a dialog), as a key press would.
                partial(self.call_later, self.run_action, binding.action, active.node),
            )


def run(
    path: str, *, read_only: bool = False, name: str = "default", actor: str | None = None
) -> int:
    """Open the inbox at `path` and run the supervisor until the operator quits; its actions
    are audited as `actor` (see OnwatchApp).

    Returns the exit code: 0 after a normal quit; 2, with one line on stderr and no
    traceback, when the file is missing, not an onwatch inbox (foreign or damaged), or locked.
    """

    async def main() -> int:
        try:
            inbox = await Inbox.open(path, name=name, create=False, read_only=read_only)
        except InboxError as exc:  # NotAnInbox, InboxBusy, or another clear refusal
            print(f"onwatch: {exc}", file=sys.stderr)
            return 2
        except OSError as exc:
            print(f"onwatch: cannot open {path}: {exc.strerror or exc}", file=sys.stderr)
            return 2
        try:
            # A file this user may not write (inbox.read_only says why) is watched only.
            app = OnwatchApp(inbox, read_only=read_only or inbox.read_only is not None, actor=actor)
            code = await app.run_async()
            return code if isinstance(code, int) else (app.return_code or 0)
        finally:
            await inbox.close()

    return asyncio.run(main())


def run_fleet(target: str, *, read_only: bool = False, actor: str | None = None) -> int:
    """Open the fleet desk on a folder of inbox files, or on every inbox of a PostgreSQL
    database (a `postgresql://` URL), until the operator quits; its actions are audited as
    `actor` (see OnwatchApp).

    Returns the exit code: 0 after a normal quit, 2 (one line on stderr) when `target` is
    neither a folder nor a reachable onwatch database.
    """
    try:
        if is_url(target):
            database = DatabaseFleet(target)
            database.check()
            source: FleetSource = database
        else:
            source = FolderFleet(target)
    except InboxError as exc:  # BadInput, NotAnInbox, an unreachable server
        print(f"onwatch: {exc}", file=sys.stderr)
        return 2

    async def main() -> int:
        app = OnwatchApp(None, clock=SystemClock(), read_only=read_only, fleet=source, actor=actor)
        try:
            code = await app.run_async()
            return code if isinstance(code, int) else (app.return_code or 0)
        finally:
            if app.inbox is not None:
                await app.inbox.close()
            close = getattr(source, "close", None)
            if close is not None:
                close()

    return asyncio.run(main())


def _where(inbox: Inbox | None) -> str:
    """How a confirmation names the inbox it writes to: its file's name, as in the status
    strip (for PostgreSQL, the database and the inbox's name)."""
    return "" if inbox is None else os.path.basename(inbox.path)


def _shown_path(path: str) -> str:
    """A file's path as an operator reads it best: relative to the folder the desk was
    started in when it lies inside it, else whole."""
    relative = os.path.relpath(path)
    return path if relative.startswith("..") else relative
