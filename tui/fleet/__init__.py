"""The fleet desk: every inbox of a folder on one screen, and every waiting approval in one list.

`onwatch tui DIR` (or `onwatch tui postgresql://…` with no `--inbox`) runs tui/app.py's
`run_fleet(DIR)`: the supervisor app with a fleet source, which opens on the Fleet view
(tui/fleet/screen.py) over its seven panes; the scanning and the approval alarm live in
tui/fleet/desk.py, the all-approvals queue in tui/fleet/queue.py.
"""

from __future__ import annotations

from onwatch.core.fleet import DatabaseFleet, FolderFleet

from .desk import FleetDesk, title_for
from .screen import FleetScreen

__all__ = ["DatabaseFleet", "FleetDesk", "FleetScreen", "FolderFleet", "title_for"]
