"""A windowed list drawn line by line: as many lines as fit, painted from a long sorted list.

The fleet can hold a thousand inboxes and the approval queue many more requests; a widget
per item would cost seconds to mount, and Textual's compositor visits every visible widget on
each frame, so even a widget per *visible* row makes a desk ticking once a second cost what
its widget count costs. `RowWindow` is one widget: it asks its screen for each visible item's
`Row` (cells as text, a style name) on a change or a tick, and redraws only the lines whose
row changed — an unchanged second redraws nothing, a ticking countdown redraws its line, and
an unchanged cell's segments are reused. The cursor follows an item by key (not by
position), so re-sorting or a new inbox never moves it to another one.
"""

from __future__ import annotations

from typing import Any, Callable, Hashable, NamedTuple, Sequence

from rich.segment import Segment
from rich.style import Style
from rich.text import Text
from textual import events
from textual.binding import Binding
from textual.geometry import Region
from textual.message import Message
from textual.strip import Strip
from textual.widget import Widget


class Row(NamedTuple):
    """One line of a RowWindow: its cells left to right (joined by a space), the name of its
    component style (the subclass's `COMPONENT_CLASSES`, without the prefix), and words a
    test or a caller may read back (`RowWindow.painted`)."""

    cells: tuple[Text, ...]
    style: str
    flags: frozenset[str] = frozenset()


class RowWindow(Widget, can_focus=True):
    """Items drawn by `render_row(item, now, selected, width) -> Row`, one line each.

    A subclass names the row styles in `COMPONENT_CLASSES` as `<PREFIX>--<style>`; the
    cursor's line adds `row-window--cursor`.
    """

    PREFIX = "row-window"
    COMPONENT_CLASSES = {"row-window--cursor"}

    BINDINGS = [
        Binding("up,k", "move(-1)", "Up", show=False, id="row-up"),
        Binding("down,j", "move(1)", "Down", show=False, id="row-down"),
        Binding("pageup", "page(-1)", "Page up", show=False, id="row-page-up"),
        Binding("pagedown", "page(1)", "Page down", show=False, id="row-page-down"),
        Binding("home", "jump(0)", "First", show=False, id="row-first"),
        Binding("end", "jump(-1)", "Last", show=False, id="row-last"),
    ]

    class Moved(Message):
        """The cursor moved to another item (or to none)."""

        def __init__(self, window: "RowWindow", key: Hashable | None) -> None:
            super().__init__()
            self.window = window
            self.key = key

    def __init__(
        self,
        render_row: Callable[[Any, int, bool, int], Row],
        key_of: Callable[[Any], Hashable],
        *,
        id: str | None = None,
    ) -> None:
        super().__init__(id=id)
        self.render_row = render_row
        self.key_of = key_of
        self.items: Sequence[Any] = ()
        self.index: dict[Hashable, int] = {}
        self.cursor_key: Hashable | None = None
        self.cursor = 0
        self.top = 0
        self.now = 0
        self.lines_redrawn = 0  # lines whose text changed (a benchmark reads it)
        self.painted: dict[Hashable, Row] = {}  # the rows on screen now, by item key
        # per screen line: its row, whether the cursor is on it, the line drawn, its cells drawn
        self._lines: list[tuple[Row | None, bool, Strip, tuple[Strip, ...]]] = []
        self._styles: dict[tuple[str, bool], Style] = {}
        self._stale = True  # every line must be drawn again (a resize, a style change)

    # --- data ---------------------------------------------------------------------------

    def show(self, items: Sequence[Any], now: int) -> None:
        """Show `items` (sorted, filtered); the cursor stays on its item if it is still
        there, else at the same position. The cursor landing on another item (the first
        one shown, or none left) is a move: the screen's keys that need a row follow it."""
        before = self.cursor_key
        self.items = items
        self.index = {self.key_of(item): i for i, item in enumerate(items)}
        self.now = now
        if self.cursor_key in self.index:
            self.cursor = self.index[self.cursor_key]
        else:
            self.cursor = min(self.cursor, max(len(items) - 1, 0))
            self.cursor_key = self.key_of(items[self.cursor]) if items else None
        self._scroll_to_cursor()
        self.repaint()
        if self.cursor_key != before:
            self.post_message(self.Moved(self, self.cursor_key))

    def tick(self, now: int) -> None:
        self.now = now
        self.repaint()

    @property
    def selected(self) -> Any | None:
        return self.items[self.cursor] if self.items else None

    def select_key(self, key: Hashable) -> None:
        if key in self.index:
            self.cursor_key = key
            self.cursor = self.index[key]
            self._scroll_to_cursor()
            self.repaint()

    # --- painting -------------------------------------------------------------------------

    @property
    def height_in_rows(self) -> int:
        return max(self.size.height, 1)

    def on_resize(self, event: events.Resize) -> None:
        self._stale = True
        self._scroll_to_cursor()
        self.repaint()

    def notify_style_update(self) -> None:
        super().notify_style_update()
        # A class or theme change above us may change every line's colours: draw them again.
        self._styles.clear()
        self._stale = True
        self.repaint()

    def _style(self, name: str, selected: bool) -> Style:
        style = self._styles.get((name, selected))
        if style is None:
            # Not partial: Textual blends translucent colours ($text-muted) over our
            # background, as it would for a widget.
            style = self.get_component_rich_style(f"{self.PREFIX}--{name}")
            if selected:
                style += self.get_component_rich_style("row-window--cursor")
            self._styles[(name, selected)] = style
        return style

    def repaint(self) -> None:
        """Ask for the row of every visible item; redraw only the lines whose row changed."""
        if not self.is_mounted:
            return
        width, height = self.size.width, self.height_in_rows
        stale, self._stale = self._stale, False
        if stale or len(self._lines) != height:
            self._lines = [(None, False, Strip.blank(width, self.rich_style), ())] * height
            self.refresh()
        items, top = self.items, self.top
        painted = {}
        for y in range(height):
            at = top + y
            selected = at == self.cursor
            row = (
                self.render_row(items[at], self.now, selected, width - 2)
                if at < len(items)
                else None
            )
            if row is not None:
                painted[self.key_of(items[at])] = row
            old, was_selected, _, _ = self._lines[y]
            if row == old and selected == was_selected and not stale:
                continue
            self._lines[y] = self._draw(y, row, selected, width)
            self.lines_redrawn += 1
            self.refresh(Region(0, y, width, 1))
        self.painted = painted

    def _draw(
        self, y: int, row: Row | None, selected: bool, width: int
    ) -> tuple[Row | None, bool, Strip, tuple[Strip, ...]]:
        """The line for `row`, reusing the segments of the cells that did not change."""
        if row is None:
            return (None, selected, Strip.blank(width, self.rich_style), ())
        old, _, _, old_strips = self._lines[y]
        console = self.app.console
        strips = []
        for i, cell in enumerate(row.cells):
            if (
                old is not None
                and i < len(old.cells)
                and i < len(old_strips)
                and old.cells[i] == cell
            ):
                strips.append(old_strips[i])
            else:
                strips.append(Strip(list(cell.render(console)), cell.cell_len))
        space = Strip([Segment(" ")], 1)
        parts = [space]  # the row's left padding
        for i, strip in enumerate(strips):
            parts += [space, strip] if i else [strip]
        line = Strip.join(parts).crop_extend(0, width, None)
        return (row, selected, line.apply_style(self._style(row.style, selected)), tuple(strips))

    def render_line(self, y: int) -> Strip:
        if y < len(self._lines):
            return self._lines[y][2]
        return Strip.blank(self.size.width, self.rich_style)

    def _scroll_to_cursor(self) -> None:
        height = self.height_in_rows
        if self.cursor < self.top:
            self.top = self.cursor
        elif self.cursor >= self.top + height:
            self.top = self.cursor - height + 1
        self.top = max(0, min(self.top, max(len(self.items) - height, 0)))

    # --- moving ---------------------------------------------------------------------------

    def _go(self, index: int) -> None:
        if not self.items:
            return
        index = max(0, min(index, len(self.items) - 1))
        moved = index != self.cursor
        self.cursor = index
        self.cursor_key = self.key_of(self.items[index])
        self._scroll_to_cursor()
        self.repaint()
        if moved:
            self.post_message(self.Moved(self, self.cursor_key))

    def action_move(self, step: int) -> None:
        self._go(self.cursor + step)

    def action_page(self, direction: int) -> None:
        self._go(self.cursor + direction * max(self.height_in_rows - 1, 1))

    def action_jump(self, where: int) -> None:
        self._go(0 if where == 0 else len(self.items) - 1)

    def on_click(self, event: events.Click) -> None:
        if event.y >= 0:
            self._go(self.top + event.y)

    def on_mouse_scroll_down(self, event: events.MouseScrollDown) -> None:
        event.stop()
        self._go(self.cursor + 3)

    def on_mouse_scroll_up(self, event: events.MouseScrollUp) -> None:
        event.stop()
        self._go(self.cursor - 3)
