"""The shape every pane shares: a titled keyset window of rows, updated by diff, with marks.

The app hands a pane its data (`pane.show(data, now)`) and its clock (`pane.tick(now)`);
the pane posts messages up when the operator asks for something (an action on the marked or
highlighted rows, a detail view, a new window). Panes never read the inbox themselves: each
pane class names its query as an async `fetch(inbox, window, overview)` the app runs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import islice
from typing import Any, ClassVar, Generic, Hashable, Iterable, TypeVar, cast

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.coordinate import Coordinate
from textual.message import Message
from textual.widgets import DataTable, Label
from textual.widgets.data_table import ColumnKey

from onwatch.core import ACTIONS as CORE_ACTIONS
from onwatch.core import Inbox, Overview

from .. import actions as desk
from ..safe import join, safe_content, safe_text
from ..timefmt import WALL, Times
from ..screens.filter import FilterScreen
from .layout import Column, fit, middle

WINDOW_ROWS = 300  # rows per pane window: a few screens, never the whole table
MARK = "●"

R = TypeVar("R")  # the record type a pane shows (an Event, an Approval, a Timer…)


@dataclass(slots=True)
class Window:
    """Which slice of the rows a pane shows: a keyset anchor, a filter, a size."""

    after: int | None = None
    search: str | None = None
    limit: int = WINDOW_ROWS
    previous: list[int | None] = field(default_factory=list)  # anchors of earlier pages


@dataclass(frozen=True, slots=True)
class PaneData:
    """One fetched window: its rows, how many such rows exist, whether more follow."""

    rows: tuple[Any, ...] = ()
    total: int = 0
    more: bool = False
    extra: Any = None


def remeasure(table: DataTable[Any]) -> None:
    """Have `table` re-measure its columns on its next idle, as its add_column does.

    The one private name of Textual we use: 8.2 has no public call for a column width set by
    hand, and without it the table keeps its old virtual width (the fill column is clipped or
    leaves a gap). tests/tui/test_table_widths.py checks that effect, not the attribute.
    """
    table._require_update_dimensions = True


class PaneTable(DataTable[Text]):
    """The pane's table: row cursor, no markup anywhere (cells are safe Text). Its pane
    decides the columns' widths (tui/panes/layout.py) and is told when the width changes."""

    class Resized(Message):
        """The table's width changed: its pane fits the columns again."""

    # k9s / vim habits next to the arrows; `home`/`end` move the row cursor (DataTable's
    # own move a column cursor, which a row table does not have).
    BINDINGS = [
        Binding(
            "j", "cursor_down", "Down", show=False, id="row-down", tooltip="the next row (↓ too)"
        ),
        Binding(
            "k", "cursor_up", "Up", show=False, id="row-up", tooltip="the previous row (↑ too)"
        ),
        Binding(
            "g,home",
            "scroll_top",
            "First row",
            show=False,
            id="row-first",
            key_display="g home",
            tooltip="the first row of the window",
        ),
        Binding(
            "G,end",
            "scroll_bottom",
            "Last row",
            show=False,
            id="row-last",
            key_display="G end",
            tooltip="the last row of the window",
        ),
        Binding(
            "ctrl+d",
            "half_page(1)",
            "Half page down",
            show=False,
            id="half-down",
            key_display="^d",
            tooltip="half a screen down (pgdn: a screen)",
        ),
        Binding(
            "ctrl+u",
            "half_page(-1)",
            "Half page up",
            show=False,
            id="half-up",
            key_display="^u",
            tooltip="half a screen up (pgup: a screen)",
        ),
    ]

    def action_half_page(self, direction: int) -> None:
        if self.row_count == 0:
            return
        step = max(self.scrollable_content_region.height // 2, 1)
        row = min(max(self.cursor_row + direction * step, 0), self.row_count - 1)
        self.move_cursor(row=row, animate=False)

    def on_resize(self) -> None:
        self.post_message(self.Resized())

    def set_widths(self, widths: dict[str, int]) -> None:
        """Give the shown columns these widths (the table re-measures on its next idle)."""
        changed = False
        for key, width in widths.items():
            column = self.columns.get(ColumnKey(key))
            if column is not None and (column.width != width or column.auto_width):
                column.width = width
                column.auto_width = False
                changed = True
        if changed:
            remeasure(self)
            self.refresh()


class Pane(Vertical, Generic[R]):
    """Base pane. Subclasses set the class attributes and implement fetch/row_key/cells."""

    PANE_ID: ClassVar[str] = ""
    TITLE: ClassVar[str] = ""
    TAB: ClassVar[str] = ""  # short label for the pane bar
    KEY: ClassVar[str] = ""
    COLUMNS: ClassVar[tuple[Column, ...]] = ()
    EMPTY: ClassVar[str] = "Nothing here."
    MARKABLE: ClassVar[bool] = False  # has actions that can apply to several rows
    PAGED: ClassVar[bool] = False  # keyset pages over events
    # What the rows are (a core action target: "event", "approval", "delivery") and the
    # states the pane shows: its operator actions follow (tui/actions.py), never listed here.
    TARGET: ClassVar[str | None] = None
    STATES: ClassVar[tuple[str, ...]] = ()
    ACTIONS: ClassVar[frozenset[str]] = frozenset()  # derived: the actions that write
    HELP: ClassVar[str] = ""

    BINDINGS = [
        # Help and quit lead the footer (they are the app's; repeated here only for the
        # order), so they stay visible at 80 columns, where the last keys are cut off.
        Binding(
            "question_mark",
            "app.help",
            "Help",
            id="help",
            key_display="?",
            tooltip="this list of keys",
        ),
        Binding("q", "app.quit", "Quit", id="quit", show=False),
        # The fleet's key next, so at 80 columns the footer keeps it (the app offers it only
        # on a fleet desk; the pane's binding is the app's, repeated for the order).
        Binding(
            "0",
            "app.fleet",
            "Fleet",
            id="fleet",
            tooltip="every inbox of the fleet, the cursor on this one",
        ),
        Binding(
            "enter",
            "detail",
            "Detail",
            priority=True,
            id="detail",
            tooltip="the highlighted row in full: payload, attempts, errors, history",
        ),
        Binding(
            "slash",
            "filter",
            "Filter",
            id="filter",
            key_display="/",
            tooltip="show only the rows matching a text",
        ),
        Binding(
            "space",
            "mark",
            "Mark",
            id="mark",
            key_display="␣",
            tooltip="mark or unmark the row; an action applies to the marked rows shown",
        ),
        Binding(
            "asterisk",
            "mark_all",
            "Mark all shown",
            show=False,
            id="mark-all",
            key_display="*",
            tooltip="mark every row the window and filter show",
        ),
        Binding(
            "u",
            "unmark_all",
            "Unmark all",
            show=False,
            id="unmark-all",
            tooltip="clear every mark in this pane, shown or hidden",
        ),
        Binding(
            "escape",
            "clear_filter",
            "Clear filter",
            show=False,
            id="clear-filter",
            key_display="esc",
            tooltip="show every row again (when a filter is set)",
        ),
        Binding(
            "right_square_bracket",
            "next_page",
            "Next page",
            show=False,
            id="next-page",
            key_display="]",
            tooltip="the next window of rows (by id)",
        ),
        Binding(
            "left_square_bracket",
            "prev_page",
            "Previous page",
            show=False,
            id="prev-page",
            key_display="[",
            tooltip="the window before",
        ),
    ]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        # Before Textual merges the class's bindings: the keys of the actions on what this
        # pane shows join its own.
        offered = desk.offered(cls.TARGET, cls.STATES)
        cls.ACTIONS = frozenset(offered)
        if "TARGET" in cls.__dict__ or "STATES" in cls.__dict__:
            cls.BINDINGS = [*cls.__dict__.get("BINDINGS", ()), *desk.bindings(offered)]
        super().__init_subclass__(**kwargs)

    class ActionRequested(Message):
        """The operator asked for `action` on `targets` (records as they were on screen);
        `hidden` marked rows are not among them (filtered out or on another page)."""

        def __init__(
            self, pane: "Pane[Any]", action: str, targets: tuple[Any, ...], hidden: int = 0
        ) -> None:
            super().__init__()
            self.pane = pane
            self.action = action
            self.targets = targets
            self.hidden = hidden

    class DetailRequested(Message):
        """The operator wants the full story of `record`."""

        def __init__(self, pane: "Pane[Any]", record: Any) -> None:
            super().__init__()
            self.pane = pane
            self.record = record

    class WindowChanged(Message):
        """The pane's window (filter or page) changed: fetch it again."""

        def __init__(self, pane: "Pane[Any]") -> None:
            super().__init__()
            self.pane = pane

    class FilterRequested(Message):
        """The operator wants to set this pane's filter."""

        def __init__(self, pane: "Pane[Any]") -> None:
            super().__init__()
            self.pane = pane

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id or self.PANE_ID, classes="pane")
        self.window = Window()
        self.data = PaneData()
        self.read_only = False  # set by the app: a read-only desk offers no actions
        self.times: Times = WALL  # set by the app: how instants are worded
        self.refusing: str | None = None  # set by the app: why every action is refused now
        self._window_moved = False  # the operator moved the window: rows leave, no news
        self._acted_on: set[str] = set()  # rows the operator's own action moves out
        self.stale = True  # the app fetches a stale pane when it is shown
        self.now = 0
        self._records: dict[str, R] = {}  # row key → record, in table order
        self._sigs: dict[str, Hashable] = {}
        self._cells: dict[str, dict[str, Text]] = {}  # row key → the cells shown
        self._full: dict[str, dict[str, Text]] = {}  # row key → its cells before shortening
        # The columns shown and their widths, as tui/panes/layout.py fitted them last.
        self._shown: tuple[str, ...] = tuple(c.key for c in self.COLUMNS)
        self._widths: dict[str, int] = {c.key: c.width for c in self.COLUMNS}
        self._marks: dict[str, R] = {}  # row key → record as last seen
        # A "left the pane" notice is true while the highlight stays where it said (a row
        # key, or None for "no row is left"); it goes once that is no longer so.
        self._notice_on: str | None = None
        self._notice_standing = False

    # --- what subclasses provide --------------------------------------------------------

    @classmethod
    async def fetch(cls, inbox: Inbox, window: Window, overview: Overview) -> PaneData:
        """Read this pane's window from the inbox (runs in the app's refresh)."""
        raise NotImplementedError

    def row_key(self, record: R) -> str:
        """The row's key; by default the record's id (panes whose records have none say)."""
        return str(cast(Any, record).id)

    def signature(self, record: R) -> Hashable:
        """What must change for the row to be redrawn (never the payload itself)."""
        return cast(Hashable, record)  # every pane's records are frozen dataclasses

    def cells(self, record: R, now: int) -> dict[str, Text]:
        """Every cell of the row, by column key (safe Text only)."""
        raise NotImplementedError

    def ticking_cells(self, record: R, now: int) -> dict[str, Text]:
        """Only the cells that depend on the clock; the default recomputes the row."""
        ticking = {c.key for c in self.COLUMNS if c.ticking}
        return {k: v for k, v in self.cells(record, now).items() if k in ticking}

    def count_label(self, data: PaneData) -> str:
        return f"{data.total:,}"

    def allowed(self, action: str, targets: list[R]) -> bool | None:
        """Whether `action` applies to these targets: True, None (shown disabled), False.

        By default: when one of them is in a state the core's row allows."""
        wanted = CORE_ACTIONS[action].allowed
        return True if any(getattr(t, "status", None) in wanted for t in targets) else None

    # --- layout -------------------------------------------------------------------------

    def compose(self) -> ComposeResult:
        table = PaneTable(id=f"{self.PANE_ID}-table", cursor_type="row", zebra_stripes=True)
        self._add_columns(table)
        yield table
        yield Label(self.EMPTY, classes="empty")
        yield Label("", classes="outcome")

    def on_mount(self) -> None:
        self.border_title = self.TITLE
        self._show_titles()

    def _add_columns(self, table: PaneTable) -> None:
        if self.MARKABLE:
            table.add_column(" ", key="mark", width=1)
        for column in self.COLUMNS:
            if column.key in self._shown:
                table.add_column(
                    column.label, key=column.key, width=self._widths.get(column.key) or 1
                )

    # --- the columns' widths (tui/panes/layout.py) ----------------------------------------

    def on_pane_table_resized(self, message: PaneTable.Resized) -> None:
        message.stop()
        self.refit()

    def refit(self) -> None:
        """Share the table's width among the columns by importance and by what the rows
        hold now; a column that gives way leaves the table, an id too long for its column
        is shortened in the middle. Cheap when nothing changed (run after every fetch)."""
        table = self.table
        available = table.scrollable_content_region.width - (3 if self.MARKABLE else 0)
        if available <= 0:
            return
        content: dict[str, int] = {}
        for cells in self._full.values():
            for key, cell in cells.items():
                if cell.cell_len > content.get(key, 0):
                    content[key] = cell.cell_len
        widths = fit(self.COLUMNS, available, content, padding=2 * table.cell_padding)
        shown = tuple(c.key for c in self.COLUMNS if widths[c.key] > 0)
        if shown == self._shown and widths == self._widths:
            return
        cut = {c.key for c in self.COLUMNS if c.middle}
        recut = shown != self._shown or any(widths[k] != self._widths.get(k) for k in cut)
        self._widths = widths
        if shown != self._shown:
            # A column comes or goes: the table is laid out again, the highlight kept.
            self._shown = shown
            cursor = self.cursor_key()
            records = list(self._records.items())
            table.clear(columns=True)
            self._add_columns(table)
            self._records.clear()
            self._sigs.clear()
            self._cells.clear()
            self._full.clear()
            for key, record in records:
                self._add_row(key, record, self.now)
            if cursor is not None and cursor in self._records:
                table.move_cursor(row=table.get_row_index(cursor), animate=False, scroll=False)
        elif recut:
            for key, record in self._records.items():
                self._update_row(key, self._row_cells(key, record, self.now))
        table.set_widths({k: widths[k] for k in shown})

    @property
    def table(self) -> PaneTable:
        return self.query_one(PaneTable)

    def focus_table(self) -> None:
        self.table.focus()

    # --- data down ----------------------------------------------------------------------

    def show(self, data: PaneData, now: int) -> None:
        """Show a freshly fetched window, touching only the rows and cells that changed."""
        self.data = data
        self.now = now
        if self.stale:  # hidden while its rows changed: nobody saw the row that left
            self._window_moved = True
        self.stale = False
        table = self.table
        cursor, cursor_row = self.cursor_key(), table.cursor_row
        fresh = [(self.row_key(r), r) for r in data.rows]
        fresh_keys = [k for k, _ in fresh]
        fresh_set = set(fresh_keys)
        kept_before = [k for k in self._records if k in fresh_set]
        kept_after = [k for k in fresh_keys if k in self._records]
        only_appended = fresh_keys[: len(kept_after)] == kept_after
        with self.app.batch_update():
            if kept_before != kept_after or not only_appended:
                self._rebuild(fresh, now)
            else:
                for key in [k for k in self._records if k not in fresh_set]:
                    table.remove_row(key)
                    del self._records[key], self._sigs[key], self._cells[key]
                    self._full.pop(key, None)
                for key, record in fresh:
                    if key in self._records:
                        self._records[key] = record
                        signature = self.signature(record)
                        if signature != self._sigs[key]:
                            self._sigs[key] = signature
                            self._update_row(key, self._row_cells(key, record, now))
                    else:
                        self._add_row(key, record, now)
            for key in self._marks:
                if key in self._records:
                    self._marks[key] = self._records[key]
            self._follow_cursor(cursor, cursor_row)
            self._retire_notice()
            self.refit()  # what the rows hold may have changed
        self.set_class(not fresh, "-empty")
        self._show_titles()
        self.refresh_bindings()

    def tick(self, now: int) -> None:
        """Redraw the clock-driven cells whose text changed (the idle path: keep it cheap).

        Only the rows on screen are redrawn; a row scrolled into view catches up at the next
        tick, within a second.
        """
        self.now = now
        if not any(c.ticking for c in self.COLUMNS) or not self._records:
            return
        table = self.table
        first = max(int(table.scroll_y) - 1, 0)
        last = first + table.size.height + 2
        for key in islice(self._records, first, last):
            record = self._records[key]
            old = self._cells[key]
            for column, value in self.ticking_cells(record, now).items():
                if column in old and old[column] != value:  # a column given way is not there
                    old[column] = value
                    table.update_cell(key, column, value)

    def show_outcome(self, text: str, applied: bool | None) -> None:
        """Show the outcome that stands after an action (inbox text inside: made safe)."""
        self._notice_standing = False
        label = self.query_one(".outcome", Label)
        label.update(safe_content(text, limit=500))
        label.set_class(applied is True, "-applied")
        label.set_class(applied is False, "-refused")

    def _rebuild(self, fresh: list[tuple[str, R]], now: int) -> None:
        self.table.clear()
        self._records.clear()
        self._sigs.clear()
        self._cells.clear()
        self._full.clear()
        for key, record in fresh:
            self._add_row(key, record, now)

    def label(self, key: str) -> str:
        """How a row is named in a sentence: '#228' for events (their key is the id)."""
        return f"#{key}" if key.isdigit() else key

    def _follow_cursor(self, cursor: str | None, cursor_row: int) -> None:
        """Keep the highlight on the row it was on (its key), whatever came and went above.

        If that row left the window, stay at the same height (the row that took its place,
        or the last) and say so, so a key pressed next is not aimed at a row by surprise.
        """
        table = self.table
        if cursor is None or table.row_count == 0:
            if cursor is not None and not self._window_moved and cursor not in self._acted_on:
                self.show_notice(
                    f"{self.label(cursor)} left {self.TITLE}; no row is left", cursor_on=None
                )
            self._window_moved = False
            return
        if cursor in self._records:
            row = table.get_row_index(cursor)
            if row != table.cursor_row:
                table.move_cursor(row=row, animate=False, scroll=False)
            self._window_moved = False
            return
        row = min(max(cursor_row, 0), table.row_count - 1)
        table.move_cursor(row=row, animate=False, scroll=False)
        if self._window_moved or cursor in self._acted_on:
            self._window_moved = False
            self._acted_on.clear()
            return
        landed = self.cursor_key()
        self.show_notice(
            f"{self.label(cursor)} left {self.TITLE}; the highlight is now on "
            f"{self.label(landed) if landed else 'no row'}",
            cursor_on=landed,
        )

    def acted_on(self, records: Iterable[R]) -> None:
        """These rows may leave because of the operator's own action: its outcome says
        so, no 'left the pane' note replaces it."""
        self._acted_on = {self.row_key(r) for r in records}

    def show_notice(self, text: str, *, cursor_on: str | None | bool = False) -> None:
        """A note that is not an action's outcome (a row left, a filter cleared). With
        `cursor_on` (a row key, or None for no row), the note says where the highlight is:
        it is taken down as soon as the highlight is elsewhere (rows arrived, the operator
        moved), so it never stands under rows it no longer describes."""
        self.show_outcome(text, None)
        self._notice_standing = cursor_on is not False
        self._notice_on = cursor_on if isinstance(cursor_on, str) else None

    def _retire_notice(self) -> None:
        if self._notice_standing and self.cursor_key() != self._notice_on:
            self._notice_standing = False
            self.show_outcome("", None)

    def _row_cells(self, key: str, record: R, now: int) -> dict[str, Text]:
        """The row's cells as shown: the columns that did not give way, ids shortened in
        the middle to their column (the whole cells are kept: `refit` measures them)."""
        cells = self.cells(record, now)
        self._full[key] = cells
        ordered = {"mark": self._mark_cell(key)} if self.MARKABLE else {}
        for column in self.COLUMNS:
            if column.key not in self._shown:
                continue
            cell = cells.get(column.key) or Text("")
            if column.middle:
                cell = middle(cell, self._widths[column.key])
            ordered[column.key] = cell
        return ordered

    def _mark_cell(self, key: str) -> Text:
        return Text(MARK if key in self._marks else " ", style="bold")

    def _add_row(self, key: str, record: R, now: int) -> None:
        cells = self._row_cells(key, record, now)
        self._records[key] = record
        self._sigs[key] = self.signature(record)
        self._cells[key] = cells
        self.table.add_row(*cells.values(), key=key)

    def _update_row(self, key: str, cells: dict[str, Text]) -> None:
        old = self._cells[key]
        for column, value in cells.items():
            if old.get(column) != value:
                self.table.update_cell(key, column, value)
        self._cells[key] = cells

    def _show_titles(self) -> None:
        parts: list[Text | str] = [f"{self.TITLE} · {self.count_label(self.data)}"]
        self.border_title = join(*parts)
        notes: list[Text | str] = []
        if self.PAGED and (self.window.after is not None or self.data.more) and self._records:
            ids = [int(k) for k in self._records]
            notes.append(f"ids {min(ids):,}–{max(ids):,}")
            if self.data.more:
                notes.append(" · ] next page")
            if self.window.previous:
                notes.append(" · [ previous")
        if self.window.search:
            notes.append(" · " if notes else "")
            notes += ["filter “", safe_text(self.window.search, limit=40), "”"]
        if self._marks:
            notes.append(" · " if notes else "")
            hidden = self.hidden_marks()
            notes.append(f"{len(self._marks)} marked" + (f" ({hidden} hidden)" if hidden else ""))
        self.border_subtitle = join(*notes) if notes else None

    # --- selection ----------------------------------------------------------------------

    def cursor_key(self) -> str | None:
        table = self.table
        if table.row_count == 0:
            return None
        row = min(max(table.cursor_row, 0), table.row_count - 1)
        return table.coordinate_to_cell_key(Coordinate(row, 0)).row_key.value

    def cursor_record(self) -> R | None:
        key = self.cursor_key()
        return None if key is None else self._records.get(key)

    def targets(self) -> list[R]:
        """The marked rows on screen (as last seen), else the highlighted one.

        Marked rows a filter or another page hides are never acted on: an operator must
        see what a key changes (`hidden_marks` says how many were left out).
        """
        shown = [record for key, record in self._marks.items() if key in self._records]
        if shown:
            return shown
        record = self.cursor_record()
        return [] if record is None else [record]

    def hidden_marks(self) -> int:
        """Marked rows the current window does not show (a filter, another page)."""
        return sum(1 for key in self._marks if key not in self._records)

    def clear_marks(self) -> None:
        keys = list(self._marks)
        self._marks.clear()
        for key in keys:
            if key in self._records:
                self._update_row(key, self._row_cells(key, self._records[key], self.now))
        self._show_titles()
        self.refresh_bindings()

    def records(self) -> Iterable[R]:
        return self._records.values()

    # --- actions ------------------------------------------------------------------------

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "act":
            name = parameters[0] if parameters else None
            if self.read_only or name not in self.ACTIONS:
                return False
            if self.refusing:
                return None
            return self.allowed(str(name), self.targets())
        if action in ("mark", "mark_all"):
            return (
                False
                if (self.read_only or not self.MARKABLE)
                else (True if self._records else None)
            )
        if action == "unmark_all":
            return (
                False if (self.read_only or not self.MARKABLE) else (True if self._marks else None)
            )
        if action == "clear_filter":
            return bool(self.window.search)  # otherwise escape means what it meant
        if action in ("next_page", "prev_page"):
            if not self.PAGED:
                return False
            return (self.data.more if action == "next_page" else bool(self.window.previous)) or None
        if action == "detail":
            return True if self._records else None
        return True

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        event.stop()
        self._retire_notice()
        self.refresh_bindings()

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        event.stop()  # Enter is our "detail" binding; a mouse double-click lands here too
        self.action_detail()

    def action_detail(self) -> None:
        record = self.cursor_record()
        if record is not None:
            self.post_message(self.DetailRequested(self, record))

    def action_filter(self) -> None:
        # The dialog goes up now, not when a message reaches the app: the keys of a paste
        # ("/chat") are already queued behind this one and must land in the filter's input,
        # not on this pane's `c`.
        hint = (
            "Matches the source, the source id or the error text."
            if self.PAGED
            else "Matches the text of the rows in this pane."
        )
        self.app.push_screen(FilterScreen(self.TITLE, self.window.search, hint), self.set_filter)

    def action_clear_filter(self) -> None:
        if self.window.search:
            self.set_filter("")
            self.show_notice("filter cleared: every row is shown")

    def action_mark_all(self) -> None:
        if not self.MARKABLE or self.read_only:
            return
        for key, record in self._records.items():
            self._marks[key] = record
            self._update_row(key, self._row_cells(key, record, self.now))
        self._show_titles()
        self.refresh_bindings()

    def action_unmark_all(self) -> None:
        self.clear_marks()

    def set_filter(self, search: str | None) -> None:
        """Apply a new filter (None: keep the old one; "" clears) and ask for a new window."""
        if search is None:
            return
        self.window.search = search.strip() or None
        self._window_moved = True
        self.window.after = None
        self.window.previous.clear()
        self._show_titles()
        self.post_message(self.WindowChanged(self))

    def action_mark(self) -> None:
        key = self.cursor_key()
        if key is None or not self.MARKABLE:
            return
        if key in self._marks:
            del self._marks[key]
        else:
            self._marks[key] = self._records[key]
        self.table.update_cell(key, "mark", self._mark_cell(key))
        self._cells[key]["mark"] = self._mark_cell(key)
        self.table.action_cursor_down()
        self._show_titles()
        self.refresh_bindings()

    def action_next_page(self) -> None:
        if not (self.PAGED and self.data.more and self._records):
            return
        self.window.previous.append(self.window.after)
        self._window_moved = True
        self.window.after = max(int(k) for k in self._records)
        self.post_message(self.WindowChanged(self))

    def action_prev_page(self) -> None:
        if not (self.PAGED and self.window.previous):
            return
        self.window.after = self.window.previous.pop()
        self._window_moved = True
        self.post_message(self.WindowChanged(self))

    def action_act(self, name: str) -> None:
        """The key of an operator action: the app confirms and runs it on the targets."""
        if name in self.ACTIONS:
            self.request(name)

    def request(self, action: str) -> None:
        """Post an action request for the current targets (the app confirms and runs it)."""
        targets = self.targets()
        if targets and not self.read_only:
            self.post_message(
                self.ActionRequested(self, action, tuple(targets), self.hidden_marks())
            )
