"""Snapshot tests: the seeded inbox on a fake clock, at the design size and at 80×24.

Plain `def` tests: snap_compare runs the app in its own event loop. Baselines live in
tests/tui/__snapshots__/; after an intended change of the screen, review and update them with
`python3 dev.py test tests/tui/test_snapshots.py --snapshot-update`.
"""

from __future__ import annotations

import asyncio

import pytest

from onwatch.tui.app import OnwatchApp
from onwatch.tui.screens.confirm import ConfirmScreen
from onwatch.tui.screens.detail import DetailScreen
from onwatch.tui.screens.groups import GroupsScreen
from onwatch.tui.screens.help import HelpScreen
from onwatch.tui.screens.workers import WorkersScreen
from onwatch.tui.screenshots import settle
from onwatch.tui.seed import open_seeded


WIDE, NARROW = (120, 40), (80, 24)


@pytest.fixture
def make_app(tmp_path, monkeypatch):
    """Build an app over a freshly seeded inbox (opened outside snap_compare's loop), by a
    path relative to the test's folder: a dialog naming a file beside it reads the same in
    every run."""
    monkeypatch.chdir(tmp_path)
    opened = []

    def make(**kwargs) -> OnwatchApp:
        inbox, clock = asyncio.run(open_seeded("inbox.db"))
        opened.append(inbox)
        return OnwatchApp(inbox, clock=clock, **kwargs)

    yield make
    for inbox in opened:
        asyncio.run(inbox.close())


def driver(*keys: str, screen: type | None = None):
    """A run_before that waits for the first read, presses `keys`, and waits for `screen`."""

    async def run_before(pilot) -> None:
        app = pilot.app
        await asyncio.wait_for(app.loaded.wait(), 10)
        for key in keys:
            await pilot.press(key)
            await settle(app, pilot)
        if screen is not None:
            for _ in range(100):
                if isinstance(app.screen, screen):
                    break
                await pilot.pause(0.05)
            assert isinstance(app.screen, screen)
        await settle(app, pilot)
        app.tick()
        await pilot.pause()

    return run_before


CASES = {
    "pending_wide": (WIDE, (), None),
    "running_wide": (WIDE, ("2",), None),
    "dead_wide": (WIDE, ("3",), None),
    "approvals_wide": (WIDE, ("4",), None),
    "timers_wide": (WIDE, ("5",), None),
    "outbox_wide": (WIDE, ("6",), None),
    "confirm_approve_wide": (WIDE, ("4", "a"), ConfirmScreen),
    "detail_wide": (WIDE, ("3", "enter"), DetailScreen),
    "pending_narrow": (NARROW, (), None),
    "running_narrow": (NARROW, ("2",), None),
    "dead_narrow": (NARROW, ("3",), None),
    "timers_narrow": (NARROW, ("5",), None),
    "approvals_narrow": (NARROW, ("4",), None),
    "outbox_narrow": (NARROW, ("6",), None),
    "confirm_cancel_narrow": (NARROW, ("c",), ConfirmScreen),
    "confirm_write_out_narrow": (NARROW, ("6", "s"), ConfirmScreen),
    "detail_narrow": (NARROW, ("3", "enter"), DetailScreen),
    "help_narrow": (NARROW, ("question_mark",), HelpScreen),
    "done_narrow": (NARROW, ("7",), None),
    "workers_narrow": (NARROW, ("W",), WorkersScreen),
    "dead_groups_narrow": (NARROW, ("3", "E"), GroupsScreen),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_snapshot(case, make_app, snap_compare):
    size, keys, screen = CASES[case]
    assert snap_compare(make_app(), terminal_size=size, run_before=driver(*keys, screen=screen))


def test_snapshot_read_only(make_app, snap_compare):
    assert snap_compare(make_app(read_only=True), terminal_size=WIDE, run_before=driver("4"))
