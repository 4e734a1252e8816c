"""A windowed list: as many row widgets as fit the screen, painted from a long sorted list.

The fleet can hold a thousand inboxes and the approval queue many more requests; a widget
per item would cost seconds to mount. `RowWindow` keeps a pool of rows the height of the
view and repaints them from `items[offset:]` on a change or a tick. The cursor follows an
item by key (not by position), so re-sorting or a new inbox never moves it to another one.
"""

from __future__ import annotations

from typing import Any, Callable, Hashable, Sequence

from textual import events
from textual.binding import Binding
from textual.containers import Vertical
from textual.message import Message
from textual.widget import Widget


class RowWindow(Vertical, can_focus=True):
    """Rows `make_row()` made, painted by `paint(row, item, now, selected)`."""

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

    def __init__(self, make_row: Callable[[], Widget],
                 paint: Callable[[Widget, Any, int, bool], None],
                 key_of: Callable[[Any], Hashable], *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.make_row = make_row
        self.paint = paint
        self.key_of = key_of
        self.items: Sequence[Any] = ()
        self.index: dict[Hashable, int] = {}
        self.cursor_key: Hashable | None = None
        self.cursor = 0
        self.top = 0
        self.now = 0
        self.rows: list[Widget] = []

    # --- data ---------------------------------------------------------------------------

    def show(self, items: Sequence[Any], now: int) -> None:
        """Show `items` (sorted, filtered); the cursor stays on its item if it is still
        there, else at the same position."""
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

    def on_resize(self, event: events.Resize) -> None:
        wanted = max(event.size.height, 1)
        if wanted > len(self.rows):
            new = [self.make_row() for _ in range(wanted - len(self.rows))]
            self.rows.extend(new)
            self.mount_all(new)
        elif wanted < len(self.rows):
            extra, self.rows = self.rows[wanted:], self.rows[:wanted]
            for row in extra:
                row.remove()
        self._scroll_to_cursor()
        self.call_after_refresh(self.repaint)

    def repaint(self) -> None:
        """Paint every pooled row from the items at the current offset."""
        items, top = self.items, self.top
        with self.app.batch_update():
            for position, row in enumerate(self.rows):
                at = top + position
                if at < len(items):
                    if not row.display:
                        row.display = True
                    self.paint(row, items[at], self.now, at == self.cursor)
                elif row.display:
                    row.display = False

    def _scroll_to_cursor(self) -> None:
        height = max(len(self.rows), 1)
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
        self._go(self.cursor + direction * max(len(self.rows) - 1, 1))

    def action_jump(self, where: int) -> None:
        self._go(0 if where == 0 else len(self.items) - 1)

    def on_click(self, event: events.Click) -> None:
        widget = event.widget
        for position, row in enumerate(self.rows):
            if widget is row or (widget is not None and row in widget.ancestors):
                self._go(self.top + position)
                return

    def on_mouse_scroll_down(self, event: events.MouseScrollDown) -> None:
        event.stop()
        self._go(self.cursor + 3)

    def on_mouse_scroll_up(self, event: events.MouseScrollUp) -> None:
        event.stop()
        self._go(self.cursor - 3)
