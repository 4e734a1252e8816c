"""What other parts of onwatch rely on: subclassing the app, windows over many rows."""

from __future__ import annotations

import pytest
from textual.binding import Binding
from textual.widgets import Label

from onwatch.core import BadInput
from onwatch.tui.app import OnwatchApp

from .conftest import screen_text, started, wait_for


class Narrated(OnwatchApp):
    """The shape the demo player uses: more widgets and more keys on top of the app."""

    BINDINGS = [Binding("x", "narrate", "Narrate", id="narrate")]

    def compose(self):
        yield from super().compose()
        yield Label("narration line", id="narration")

    def action_narrate(self) -> None:
        self.query_one("#narration", Label).update("narrated")


async def test_a_subclass_adds_widgets_and_keys(seeded):
    inbox, clock, _ = seeded
    app = Narrated(inbox, clock=clock)
    assert app.clock is clock and app.now == clock.now()
    async with app.run_test(size=(120, 40)) as pilot:
        await started(app, pilot)
        assert "narration line" in screen_text(app)
        assert "x Narrate" in screen_text(app)
        await pilot.press("x")
        await pilot.pause()
        assert "narrated" in screen_text(app)
        await pilot.press("4")  # the app's own keys still work
        await pilot.pause()
        assert "Approvals · 1 waiting" in screen_text(app)


async def test_the_clock_defaults_to_the_inboxs(seeded):
    inbox, _, _ = seeded
    assert OnwatchApp(inbox).clock is inbox.clock


def test_without_an_inbox_the_clock_is_required():
    # The fleet desk opens with no inbox chosen yet: its clock cannot be the inbox's. This was
    # an AttributeError on None; a public entry point refuses with BadInput instead.
    with pytest.raises(BadInput, match="clock"):
        OnwatchApp(None)


async def test_keyset_pages_over_many_pending_events(seeded):
    inbox, _, _ = seeded
    for i in range(700):
        await inbox.ingest("bulk", f"b-{i:04d}", {"i": i})
    app = OnwatchApp(inbox)
    async with app.run_test(size=(120, 40)) as pilot:
        await started(app, pilot)
        pane = app.pane("pending")
        first = [int(k) for k in pane._records]
        assert len(first) == 300 and first == sorted(first)
        assert "] next page" in screen_text(app)
        await pilot.press("right_square_bracket")
        await wait_for(
            pilot, lambda: int(next(iter(pane._records))) > first[-1], what="the next page"
        )
        second = [int(k) for k in pane._records]
        assert len(second) == 300 and second[0] > first[-1]
        assert "[ previous" in screen_text(app)
        await pilot.press("right_square_bracket")
        await wait_for(pilot, lambda: int(next(iter(pane._records))) > second[-1])
        assert len(pane._records) == 705 - 600  # the last, partial page
        await pilot.press("left_square_bracket", "left_square_bracket")
        await wait_for(
            pilot, lambda: [int(k) for k in pane._records] == first, what="back to the first page"
        )
        assert "Pending · 705" in screen_text(app)


def test_importing_tui_loads_no_textual():
    """The command line imports `tui` for every command: it must stay cheap."""
    import subprocess
    import sys

    code = "import sys, tui; sys.exit(1 if 'textual' in sys.modules else 0)"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0
