"""A pane's table follows the terminal's width: after a resize its columns are fitted again
(tui/panes/layout.py) and the table's virtual width re-measured (tui.panes.base.remeasure,
the one private Textual name), so it neither clips its last column nor leaves a gap."""

from __future__ import annotations

from onwatch.tui.app import OnwatchApp

from .conftest import started


async def settled(pilot, table, condition) -> None:
    for _ in range(100):  # bounded: the table re-measures on idle
        await pilot.pause()
        if condition(table):
            return
    raise AssertionError(f"virtual width stayed {table.virtual_size.width}")


async def test_the_table_is_fitted_and_remeasured_after_a_resize(seeded):
    inbox, clock, _ = seeded
    app = OnwatchApp(inbox, clock=clock)
    async with app.run_test(size=(120, 40)) as pilot:
        await started(app, pilot)
        pane = app.pane("pending")
        table = pane.table

        def spans(t) -> bool:
            return abs(t.virtual_size.width - t.scrollable_content_region.width) <= 1

        await settled(pilot, table, spans)
        wide = dict(pane._widths)
        await pilot.resize_terminal(80, 24)
        await settled(pilot, table, lambda t: spans(t) and t.virtual_size.width < 80)
        narrow = dict(pane._widths)
        assert narrow["source_id"] < wide["source_id"] and narrow["error"] < wide["error"]
        await pilot.resize_terminal(120, 40)
        await settled(pilot, table, lambda t: spans(t) and t.virtual_size.width > 100)
        assert pane._widths == wide
