"""The Fleet view: one row per inbox, the ones that need a human first, coloured by health.

Pushed over the six-pane supervisor (a modal screen: the supervisor's keys stay asleep under
it). `Enter` drills into the highlighted inbox (the app switches the inbox its panes show),
`0` or `Escape` there comes back here with the cursor on the same inbox, `A` lists every
waiting approval of the fleet, `/` filters by name.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Hashable, Iterable

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.renderables.sparkline import Sparkline as SparklineRenderable
from textual.widgets import Label, Static

from onwatch.core import InboxError
from onwatch.core.engine.transcripts import shown_amount
from onwatch.core.fleet import (
    SILENT_AFTER,
    DatabaseFleet,
    FolderFleet,
    InboxSummary,
    run_buckets,
)

from .. import actions as desk_actions
from ..footer import KeysFooter
from ..panes.layout import middle
from ..timefmt import duration
from ..safe import join, safe_text
from ..screens.filter import FilterScreen
from ..screens.help import HelpScreen, render_groups
from .desk import (
    WARN_SECONDS,
    approval_counts,
    approvals_phrase,
    health,
    lease_lost,
    needs_a_human_first,
    needs_worker,
    unserved_since,
)
from .rows import Row, RowWindow

if TYPE_CHECKING:
    from .desk import FleetDesk

BUCKETS = 12  # five-minute buckets: the last hour
HEALTH = ("urgent", "approval", "unserved", "dead", "lost", "problem", "ok")

# (column, wide width, narrow width; 0 = not shown when narrow), right-aligned if numeric.
# At 80 columns what an operator decides by stays (the name, approvals, who is watching),
# the outbox gives way first and the rest shortens its words.
COLUMNS = (
    ("inbox", 16, 12),
    ("pending", 7, 4),
    ("run", 4, 3),
    ("dead", 5, 4),
    ("approvals", 13, 10),
    ("lease", 26, 15),
    ("last run", 15, 10),
    ("outbox", 12, 0),
)
# With a spend column (some inbox of the fleet spent or has a spend budget), the wide
# widths that make room for it at the design size; narrow terminals show no spend column.
WITH_SPEND = {"approvals": 11, "lease": 21, "last run": 14, "outbox": 11, "spend": 8}
NUMERIC = {"pending", "run", "dead", "spend"}
SHORT = {"pending": "pend", "approvals": "approval", "last run": "last"}
NARROW_BELOW = 100  # terminal columns


def widths(narrow: bool, spend: bool) -> dict[str, int]:
    """Each column's width (0: not shown)."""
    shown = {name: small if narrow else wide for name, wide, small in COLUMNS}
    shown["spend"] = 0
    if spend and not narrow:
        shown.update(WITH_SPEND)
    return shown


def coarse(seconds: int) -> str:
    """An age to the second under a minute, then to the minute: an idle fleet's rows then
    change once a minute, not every second (only approval countdowns tick)."""
    seconds = max(int(seconds), 0)
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m"
    return duration(seconds)


def _cell(text: Text | str, width: int, right: bool = False) -> Text:
    cell = text.copy() if isinstance(text, Text) else Text(text)
    cell.no_wrap = True
    cell.truncate(width, overflow="ellipsis")
    cell.align("right" if right else "left", width)
    return cell


def header_text(narrow: bool, spend: bool = False) -> Text:
    parts = []
    for name, width in widths(narrow, spend).items():
        if width:
            words = SHORT.get(name, name) if narrow else ("spend/d" if name == "spend" else name)
            parts.append(_cell(words, width, name in NUMERIC))
    return Text(" ").join(parts)


def spend_cell(summary: InboxSummary) -> str:
    """What the inbox spent in the last 24 hours in its first unit (budgeted ones first),
    '!' once a budget is reached (its runs wait): '3.2 usd', '5 usd!'."""
    if not summary.spend:
        return "—"
    unit, spent, _ = summary.spend[0]
    amount = shown_amount(spent, unit).replace(",", "")
    return amount + ("!" if summary.over_budget else "")


def approvals_cell(summary: InboxSummary, now: int, narrow: bool = False) -> str:
    """'2 · 3h28m25s': how many wait and the soonest deadline's countdown (to the minute past
    an hour when narrow, so the count keeps its place)."""
    if not summary.waiting:
        return "—"
    due = summary.soonest_due
    left = (
        ""
        if due is None
        else (
            f" · {duration(due - now, precise=not narrow or due - now < 3600)}"
            if due > now
            else " · expired"
        )
    )
    return f"{summary.waiting:,}{left}"


def lease_cell(summary: InboxSummary, now: int, narrow: bool, watched: bool = False) -> Text:
    lease = summary.lease
    since = unserved_since(summary, now)
    if since is not None:
        # Nobody holds the lease and work waits: say so, with how long it has waited. With
        # a fleet worker connected it waits for a visit (a slot), not for a worker to exist.
        waited = coarse(now - since)
        if watched:
            return Text(f"queued {waited}" if narrow else f"fleet · waiting {waited}")
        return Text(f"no worker {waited}" if narrow else f"no worker · waiting {waited}")
    if needs_worker(summary, now, watched) and (narrow or lease is None):
        # Approvals wait, and no worker will act on their answers.
        return Text("no worker" if narrow else "no worker · never started")
    if lease is None:
        return Text("none")
    if lease.until >= now:
        state = "healthy" if not narrow else "ok"
    elif summary.lease_released:
        state = "released"
    else:
        state = (
            f"expired {coarse(now - lease.until)} ago"
            if not narrow
            else f"lost {coarse(now - lease.until)}"
        )
    if narrow:
        return Text(f"g{lease.gen} {state}")
    if needs_worker(summary, now, watched):  # approvals wait: who last held it, in short
        short = "released" if summary.lease_released else f"lost {coarse(now - lease.until)} ago"
        return Text(f"no worker · g{lease.gen} {short}")
    # The state first: a long holder name is what gets cut.
    return join(f"g{lease.gen} {state} ", safe_text(lease.holder, limit=40))


def last_run_cell(summary: InboxSummary, now: int, narrow: bool) -> str:
    run = summary.last_run
    if run is None:
        return "never"
    if run.outcome is None:
        return f"running {coarse(now - run.claimed_at)}" if not narrow else "running"
    words = {"done": "ok", "error": "fail" if narrow else "failed", "lost": "lost"}
    word = words.get(run.outcome, run.outcome)
    at = run.finished_at or run.claimed_at
    return f"{coarse(now - at)} ago {word}" if not narrow else f"{coarse(now - at)} {word}"


def outbox_cell(summary: InboxSummary, now: int) -> str:
    if not summary.held:
        return "—"
    if summary.outbox_held:
        return f"{summary.held:,} · held"
    at = summary.next_send_at
    when = "now" if at is None or at <= now else f"in {coarse(at - now)}"
    return f"{summary.held:,} · {when}"


def inbox_cell(summary: InboxSummary) -> Text:
    """The inbox's name (through tui.safe), marked when its execution is paused."""
    name = safe_text(summary.name, limit=60)
    return join(name, " ⏸") if summary.paused else name


def count_cells(summary: InboxSummary) -> dict[str, str]:
    """The cells that change only with a new summary, never with the clock."""
    return {
        "pending": f"{summary.pending:,}",
        "run": f"{summary.running:,}",
        "dead": f"{summary.dead + summary.interrupted:,}",
    }


def ticking_cells(
    summary: InboxSummary, now: int, narrow: bool, watched: bool = False
) -> dict[str, Text | str]:
    """The cells the clock moves: countdowns and ages (and the spend, beside them);
    `watched`: a fleet worker is connected (needs_worker)."""
    return {
        "approvals": approvals_cell(summary, now, narrow),
        "lease": lease_cell(summary, now, narrow, watched),
        "last run": last_run_cell(summary, now, narrow),
        "outbox": outbox_cell(summary, now),
        "spend": spend_cell(summary),
    }


def activity(summary: InboxSummary, now: int) -> tuple[list[int], int]:
    """Runs per five minutes over the last hour (oldest first) and the failures among them."""
    return run_buckets(summary.activity, now, BUCKETS)


def next_change(summaries: Iterable[InboxSummary], now: int) -> int:
    """The next instant at which the clock alone changes an inbox's health: an approval
    coming within WARN_SECONDS of its deadline or passing it, a lease expiring, a timer
    coming due (work for a worker, if none is watching)."""
    soonest = now + 3600
    for summary in summaries:
        due = summary.soonest_due
        if due is not None:
            for at in (due - WARN_SECONDS, due + 1):
                if now < at < soonest:
                    soonest = at
        lease = summary.lease
        if lease is not None and now <= lease.until < soonest:
            soonest = lease.until + 1
        timer = summary.next_timer_due
        if timer is not None and now < timer < soonest:
            soonest = timer
    return soonest


class FleetRows(RowWindow):
    """The fleet's rows, one line per inbox, coloured by health."""

    PREFIX = "fleet-row"
    COMPONENT_CLASSES = {f"fleet-row--{name}" for name in HEALTH} | {
        "fleet-row--runs",
        "fleet-row--runs-low",
        "fleet-row--failing",
        "fleet-row--failing-low",
        "row-window--cursor",
    }


class RowPainter:
    """Makes each inbox's `Row` for the fleet's RowWindow, cheaply enough to run for every
    visible inbox each second: the cells that only a new summary changes are kept per inbox,
    the ticking ones are re-cut only when their text changes, the sparkline once a minute."""

    def __init__(self) -> None:
        self.narrow = False
        self.spend = False  # a spend column is shown
        self.watched = False  # a fleet worker is connected to the source (needs_worker)
        self._fixed: dict[str, tuple[InboxSummary, bool, tuple[Text, ...]]] = {}
        self._ticking: dict[tuple[str, str], tuple[Text | str, Text]] = {}
        self._sparks: dict[str, tuple[InboxSummary, int, bool, Text, bool]] = {}

    def forget(self, keep: set[str]) -> None:
        """Drop what is kept for inboxes no longer listed."""
        for cache in (self._fixed, self._sparks):
            for key in [k for k in cache if k not in keep]:
                del cache[key]
        for pair in [p for p in self._ticking if p[0] not in keep]:
            del self._ticking[pair]

    def sparkline(self, window: RowWindow, summary: InboxSummary, now: int) -> tuple[Text, bool]:
        """Textual's sparkline renderable as text: green bars, red and amber when some of
        the hour's runs failed (computed once a minute per inbox)."""
        kept = self._sparks.get(summary.key)
        minute = now // 60
        if kept is not None and kept[0] is summary and kept[1] == minute and kept[2] == self.narrow:
            return kept[3], kept[4]
        runs, failed = activity(summary, now)
        high, low = (
            ("fleet-row--failing", "fleet-row--failing-low")
            if failed
            else ("fleet-row--runs", "fleet-row--runs-low")
        )
        base = window.background_colors[1]
        colours = [
            (base + window.get_component_styles(name).color).rich_color for name in (low, high)
        ]
        renderable = SparklineRenderable(
            runs, width=8 if self.narrow else 12, min_color=colours[0], max_color=colours[1]
        )
        console = window.app.console
        spark = Text.assemble(
            *(
                (segment.text, segment.style or "")  # Text.append: no style and "" alike
                for segment in console.render(renderable, console.options)
                if segment.text and segment.text != "\n"
            )
        )
        self._sparks[summary.key] = (summary, minute, self.narrow, spark, bool(failed))
        return spark, bool(failed)

    def row(self, window: RowWindow, summary: InboxSummary, now: int, width: int) -> Row:
        narrow = self.narrow
        shown = widths(narrow, self.spend)
        fixed = self._fixed.get(summary.key)
        if fixed is None or fixed[0] is not summary or fixed[1] != narrow:
            # A name too long keeps its end: agents are often named alike up to a number.
            cells = [_cell(middle(inbox_cell(summary), shown["inbox"]), shown["inbox"])]
            if not summary.problem:
                cells += [
                    _cell(value, shown[name], True) for name, value in count_cells(summary).items()
                ]
            fixed = (summary, narrow, tuple(cells))
            self._fixed[summary.key] = fixed
        spark, failed = self.sparkline(window, summary, now)
        # Every cell and then the sparkline, a space between each: the gap before the
        # sparkline puts it at the right edge.
        used = sum(cell.cell_len + 1 for cell in fixed[2]) + spark.cell_len
        if summary.problem:
            reason = safe_text(summary.problem, limit=200)
            reason.truncate(max(width - used - 1, 0), overflow="ellipsis", pad=True)
            blank = Text(" " * spark.cell_len)
            return Row((*fixed[2], reason, blank), "problem")
        cells = list(fixed[2])
        for name, value in ticking_cells(summary, now, narrow, self.watched).items():
            if not shown[name]:
                continue
            kept = self._ticking.get((summary.key, name))
            if kept is None or kept[0] != value or kept[1].cell_len != shown[name]:
                kept = (value, _cell(value, shown[name], name == "spend"))
                self._ticking[(summary.key, name)] = kept
            cells.append(kept[1])
            used += shown[name] + 1
        gap = Text(" " * max(width - used, 0))
        return Row(
            (*cells, Text.assemble(gap, spark)),
            health(summary, now),
            frozenset({"failing"}) if failed else frozenset(),
        )


class FleetScreen(ModalScreen[None]):
    """Every inbox of the fleet, "needs a human" first."""

    covers_panes = True  # opaque: the app does not tick the panes beneath (see on_screen_suspend)

    BINDINGS = [
        Binding(
            "enter",
            "open",
            "Open",
            id="fleet-open",
            priority=True,
            tooltip="the highlighted inbox's seven panes (esc or 0 comes back)",
        ),
        Binding(
            "A",
            "approvals",
            "All approvals",
            id="fleet-approvals",
            tooltip="every approval waiting in the fleet, by deadline; answer with a/d/e",
        ),
        Binding(
            "slash",
            "filter",
            "Filter",
            id="fleet-filter",
            key_display="/",
            tooltip="show only the inboxes whose name contains a text",
        ),
        Binding(
            "escape",
            "clear_filter",
            "Clear filter",
            id="fleet-clear-filter",
            key_display="esc",
            tooltip="show every inbox again",
        ),
        Binding(
            "question_mark",
            "help",
            "Help",
            id="fleet-help",
            key_display="?",
            tooltip="this list of keys",
        ),
        Binding(
            "q",
            "app.quit",
            "Quit",
            id="fleet-quit",
            tooltip="leave onwatch (the agents keep running)",
        ),
    ]

    def __init__(self, desk: "FleetDesk") -> None:
        super().__init__(id="fleet-screen")
        self.desk = desk
        self.search: str | None = None
        self.order: list[InboxSummary] = []
        self.narrow = False
        self.painted = 0  # repaints after a scan (the benchmark reads it)
        self.resort_at = 0  # when time alone next changes a row's health
        self.painter = RowPainter()

    def compose(self) -> ComposeResult:
        with Vertical(id="fleet"):
            with Horizontal(id="fleet-head"):
                yield Label(Text("Fleet"), id="fleet-title")
                yield Label("", id="fleet-figures")
            yield Label("", id="fleet-outcome")
            yield Static("", id="fleet-columns", markup=False)
            yield Static("", id="fleet-empty", markup=False)
            yield FleetRows(self._row, lambda s: s.key, id="fleet-rows")
        yield KeysFooter()

    def on_mount(self) -> None:
        self.query_one(RowWindow).focus()
        self.show_fleet(self.desk.now())

    def on_screen_resume(self) -> None:
        if self.is_mounted:
            self.show_fleet(self.desk.now())

    def on_screen_suspend(self) -> None:
        # Whatever is uncovered now (the panes, a dialog) shows the time at once, not up to
        # a second late: the app skipped the panes' countdowns while this screen covered them.
        self.app.call_later(self.desk.app.tick)

    def on_resize(self) -> None:
        narrow = self.app.size.width < NARROW_BELOW
        if narrow != self.narrow or not self.query_one("#fleet-columns", Static).visual:
            self.narrow = self.painter.narrow = narrow
            self.set_class(narrow, "-narrow")
            self.query_one("#fleet-columns", Static).update(header_text(narrow, self.painter.spend))

    def _row(self, summary: InboxSummary, now: int, selected: bool, width: int) -> Row:
        return self.painter.row(self.rows, summary, now, width)

    @property
    def rows(self) -> RowWindow:
        return self.query_one(RowWindow)

    @property
    def cursor_key(self) -> str | None:
        key = self.rows.cursor_key
        return str(key) if key is not None else None

    # --- data -----------------------------------------------------------------------------

    def show_fleet(self, now: int) -> None:
        """Sort and filter the desk's summaries and repaint (called after every scan)."""
        summaries: Iterable[InboxSummary] = self.desk.summaries.values()
        if self.search:
            needle = self.search.lower()
            summaries = [s for s in summaries if needle in s.name.lower()]
        self.order = sorted(summaries, key=lambda s: needs_a_human_first(s, now))
        self.painter.forget(set(self.desk.summaries))
        self.painter.watched = self.desk.workers > 0
        spend = any(s.spend for s in self.desk.summaries.values())
        if spend != self.painter.spend:  # the first spend, or the last gone: columns change
            self.painter.spend = spend
            self.painter.forget(set())
            self.query_one("#fleet-columns", Static).update(header_text(self.narrow, spend))
        self.rows.show(self.order, now)
        self._figures(now)
        self.resort_at = next_change(self.desk.summaries.values(), now)
        self.painted += 1

    def tick(self, now: int) -> None:
        """Every second: the countdowns on screen; the order and the figures only when a
        row's health changes with time (a deadline or a lease expiry passes)."""
        if now >= self.resort_at:
            self.show_fleet(now)
        else:
            self.rows.tick(now)

    def _figure_parts(self, now: int, short: bool) -> list[str]:
        """The header's counts, most important first; a zero is left out (a "0 lost leases"
        next to an inbox nobody serves read as all clear), approvals are always counted."""
        every = self.desk.summaries.values()
        total = len(self.desk.summaries)
        waiting, soon = approval_counts(every, now)
        parts = [
            f"{total:,} inbox{'es' if total != 1 else ''}",
            approvals_phrase(waiting, soon),  # the title's very words
        ]
        dead = "dead" if short else "with dead events"
        watched = self.desk.workers > 0
        for count, one, many in (
            (
                sum(1 for s in every if needs_worker(s, now, watched)),
                "needs a worker",
                "need a worker",
            ),
            (sum(1 for s in every if s.dead or s.interrupted), dead, dead),
            (sum(1 for s in every if lease_lost(s, now)), "lost lease", "lost leases"),
            (sum(1 for s in every if s.problem), "unreadable", "unreadable"),
        ):
            if count:
                parts.append(f"{count:,} {one if count == 1 else many}")
        if watched:  # what serves the inboxes between their visits (needs_worker)
            workers = self.desk.workers
            parts.append(
                f"{workers:,} fleet worker{'s' if workers != 1 else ''}"
                + ("" if short else " connected")
            )
        silent = self.desk.silent
        if silent:  # connected, yet looking no more: it serves nothing (needs_worker)
            parts.append(
                f"{silent:,} fleet worker{'s' if silent != 1 else ''} silent"
                + ("" if short else f" for {SILENT_AFTER:g} s+")
            )
        return parts

    def _figures(self, now: int) -> None:
        total = len(self.desk.summaries)
        label = safe_text(self.desk.source.label, limit=40, style="bold")
        # The long words where they fit on one line, else shorter ones (which may wrap:
        # every count stays on screen, the lost leases included).
        room = self.app.size.width - len("Fleet") - label.cell_len - 6
        parts = self._figure_parts(now, short=False)
        if len(" · ".join(parts)) > room:
            parts = self._figure_parts(now, short=True)
        soon = approval_counts(self.desk.summaries.values(), now)[1]
        if not self.desk.loaded:
            parts = ["reading the inboxes…"]
        figures = join(label, "  ", " · ".join(parts))
        self.query_one("#fleet-figures", Label).update(figures)
        self.set_class(bool(soon), "-alarm")
        self._empty_hint(total)
        if self.search:
            shown = len(self.order)
            self._line(
                join(
                    "filter “",
                    safe_text(self.search, limit=40),
                    f"”: {shown:,} of {total:,} shown (esc shows every inbox)",
                )
            )

    def _empty_hint(self, total: int) -> None:
        """An empty fleet says how to make its first inbox, in the command that does it."""
        hint = self.query_one("#fleet-empty", Static)
        hint.display = self.desk.loaded and total == 0
        if not hint.display:
            return
        source = self.desk.source
        if isinstance(source, DatabaseFleet):
            where = "this database"
            command = join("onwatch init ", safe_text(source.shown_url, limit=200), " --inbox NAME")
        else:
            folder = source.folder if isinstance(source, FolderFleet) else source.label
            where = "this folder"
            command = join("onwatch init ", safe_text(os.path.join(folder, "NAME.db"), limit=200))
        hint.update(
            join(
                f"No inbox in {where} yet. Create one with\n\n    ",
                command,
                "\n\nand point an agent's worker at it; it shows up here within a second.",
            )
        )

    def _line(self, text: Text, applied: bool | None = None) -> None:
        label = self.query_one("#fleet-outcome", Label)
        label.update(text)
        label.set_class(applied is True, "-applied")
        label.set_class(applied is False, "-refused")

    # --- keys -----------------------------------------------------------------------------

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "clear_filter":
            return bool(self.search)
        if action == "open":
            return True if self.rows.selected is not None else None
        return True

    def action_open(self) -> None:
        summary = self.rows.selected
        if summary is not None:
            self.run_worker(
                self.open_inbox(summary.key),
                group="fleet-open",
                exclusive=True,
                exit_on_error=False,
            )

    async def open_inbox(
        self, key: str, pane: str | None = None, *, back_to: Hashable | None = None
    ) -> None:
        """Drill into inbox `key`: the app's panes show it, this screen steps aside.
        `back_to` is the approval queue's row it was opened from: `Escape` in the inbox
        goes back to that list (else to this one)."""
        app = self.desk.app
        summary = self.desk.summaries.get(key)
        if summary is None:
            return
        self.rows.select_key(key)
        if app.inbox is None or app.inbox.path != summary.target:
            try:
                inbox = await self.desk.source.open(key, clock=app.clock)
            except (InboxError, OSError) as exc:
                self._line(
                    join(
                        safe_text(summary.name, limit=40, style="bold"),
                        ": cannot open: ",
                        safe_text(str(exc), limit=200),
                    ),
                    False,
                )
                return
            await app.switch_inbox(inbox)
        while app.screen is not self and len(app.screen_stack) > 1:
            app.pop_screen()
        if app.screen is self:
            app.pop_screen()
        app.back_to_queue = back_to
        if pane is not None:
            app.action_show_pane(pane)

    def action_approvals(self) -> None:
        from .queue import ApprovalQueueScreen

        self.app.push_screen(ApprovalQueueScreen(self.desk))

    def action_filter(self) -> None:
        def apply(search: str | None) -> None:
            if search is None:
                return
            self.search = search or None
            if not self.search:
                self._line(Text(""))
            self.show_fleet(self.desk.now())
            self.refresh_bindings()

        self.app.push_screen(
            FilterScreen(
                "inboxes",
                self.search,
                "Matches the inbox name (the file name without its extension).",
            ),
            apply,
        )

    def action_clear_filter(self) -> None:
        self.search = None
        self._line(Text(""))
        self.show_fleet(self.desk.now())
        self.refresh_bindings()

    def action_help(self) -> None:
        from .queue import ApprovalQueueScreen

        def listed(bindings: list[BindingType]) -> list[tuple[Binding, bool]]:
            return [(b, True) for b in bindings if isinstance(b, Binding)]

        queue = [
            (b, not self.desk.read_only or desk_actions.acted(b) is None)
            for b in ApprovalQueueScreen.BINDINGS
            if isinstance(b, Binding)
        ]
        groups = [
            ("Fleet", listed(self.BINDINGS)),
            ("Moving", listed(RowWindow.BINDINGS)),
            ("All approvals (A)", queue),
            (
                "In an inbox",
                [
                    (
                        Binding(
                            "0",
                            "fleet",
                            "Fleet",
                            tooltip="back to the fleet, the cursor on the same inbox",
                        ),
                        True,
                    ),
                    (
                        Binding(
                            "escape",
                            "leave",
                            "Back",
                            key_display="esc",
                            tooltip="back where the inbox was opened from: the fleet, or "
                            "the all-approvals list",
                        ),
                        True,
                    ),
                ],
            ),
        ]
        notes = [
            "Rows: approvals by deadline first, then work waiting with no worker to run it, "
            "then dead or interrupted events, then lost leases, then unreadable files, then "
            "the rest by name.",
            "A new approval anywhere, or one within 10 minutes of its deadline, raises a "
            "toast and the bell; the title counts the approvals waiting, as the header "
            "does, whichever view is open.",
        ]
        self.app.push_screen(HelpScreen(render_groups(groups, self.app.get_key_display, notes)))

    def on_row_window_moved(self, message: RowWindow.Moved) -> None:
        self.refresh_bindings()
