"""The pane table's fill column follows the terminal's width: after a resize the table's
virtual width is re-measured (tui.panes.base.remeasure, the one private Textual name)."""

from __future__ import annotations

from textual.app import App, ComposeResult

from onwatch.tui.panes.base import PaneTable


class Table(PaneTable):
    fill_column = "text"
    widths = {"id": (8, 4)}


class Host(App[None]):
    def compose(self) -> ComposeResult:
        yield Table()

    def on_mount(self) -> None:
        table = self.query_one(Table)
        table.add_column("id", key="id")
        table.add_column("text", key="text")
        table.add_row("1", "a long text " * 20)


async def settled(pilot, table, condition) -> None:
    for _ in range(100):  # bounded: the table re-measures on idle
        await pilot.pause()
        if condition(table):
            return
    raise AssertionError(f"virtual width stayed {table.virtual_size.width}")


async def test_the_table_is_remeasured_to_fill_the_width_after_a_resize():
    app = Host()
    async with app.run_test(size=(100, 10)) as pilot:
        table = app.query_one(Table)
        await settled(pilot, table, lambda t: 96 <= t.virtual_size.width <= 100)
        await pilot.resize_terminal(60, 10)
        await settled(pilot, table, lambda t: 56 <= t.virtual_size.width <= 60)
        assert table.columns["id"].width == 8
        await pilot.resize_terminal(120, 10)
        await settled(pilot, table, lambda t: 116 <= t.virtual_size.width <= 120)
