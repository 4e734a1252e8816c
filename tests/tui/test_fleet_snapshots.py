"""Snapshot tests of the fleet desk: the seeded fleet on a fake clock, at 120×40 and 80×24.

Plain `def` tests: snap_compare runs the app in its own event loop. Review and update the
baselines with `python3 dev.py test tests/tui/test_fleet_snapshots.py --snapshot-update`.
"""

from __future__ import annotations

import asyncio
import os

import pytest

from onwatch.core.fleet import FolderFleet
from onwatch.tui.app import OnwatchApp
from onwatch.tui.fleet import FleetScreen
from onwatch.tui.fleet.queue import ApprovalQueueScreen
from onwatch.tui.fleet.seed import seed_fleet
from onwatch.tui.screenshots import settle

WIDE, NARROW = (120, 40), (80, 24)

CASES = {
    "fleet_wide": (WIDE, (), FleetScreen),
    "fleet_narrow": (NARROW, (), FleetScreen),
    "queue_wide": (WIDE, ("A",), ApprovalQueueScreen),
    "queue_narrow": (NARROW, ("A", "down"), ApprovalQueueScreen),
    # An inbox drilled into at 80×24: its panes, and the footer keeping 0 Fleet.
    "inbox_narrow": (NARROW, ("enter", "4"), None),
}


def driver(keys: tuple[str, ...], screen: type | None):
    async def run_before(pilot) -> None:
        app = pilot.app
        for _ in range(200):
            desk = getattr(app, "fleet_desk", None)
            if desk is not None and desk.loaded and isinstance(app.screen, FleetScreen):
                break
            await pilot.pause(0.05)
        for key in keys:
            await pilot.press(key)
            await settle(app, pilot)
        if screen is None:  # the inbox's own panes
            for _ in range(200):
                if app.inbox is not None and app.loaded.is_set():
                    break
                await pilot.pause(0.05)
        else:
            assert isinstance(app.screen, screen)
        await settle(app, pilot)
        app.tick()
        await pilot.pause()

    return run_before


@pytest.mark.parametrize("case", sorted(CASES))
def test_fleet_snapshot(case, tmp_path, snap_compare):
    size, keys, screen = CASES[case]
    folder = str(tmp_path / "agents")
    os.mkdir(folder)
    clock = asyncio.run(seed_fleet(folder))
    app = OnwatchApp(None, clock=clock, fleet=FolderFleet(folder, label="agents"))
    assert snap_compare(app, terminal_size=size, run_before=driver(keys, screen))
