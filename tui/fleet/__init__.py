"""The fleet desk: every inbox of a folder on one screen, and every waiting approval in one list.

`onwatch tui DIR` runs `run(DIR)`: the supervisor app with a fleet source, which opens on the
Fleet view (tui/fleet/screen.py) over its six panes; the scanning and the approval alarm live
in tui/fleet/desk.py, the all-approvals queue in tui/fleet/queue.py.
"""

from __future__ import annotations

import asyncio
import sys

from core import BadInput, SystemClock
from core.fleet import FleetSource, FolderFleet

from .desk import FleetDesk, title_for
from .screen import FleetScreen

__all__ = ["FleetDesk", "FleetScreen", "FolderFleet", "run", "title_for"]


def run(folder: str, *, read_only: bool = False) -> int:
    """Open the fleet desk on a folder of inbox files until the operator quits.

    Returns the exit code: 0 after a normal quit, 2 (one line on stderr) when `folder` is
    not a folder.
    """
    from ..app import OnwatchApp

    try:
        source: FleetSource = FolderFleet(folder)
    except BadInput as exc:
        print(f"onwatch: {exc}", file=sys.stderr)
        return 2

    async def main() -> int:
        app = OnwatchApp(None, clock=SystemClock(), read_only=read_only, fleet=source)
        try:
            code = await app.run_async()
            return code if isinstance(code, int) else (app.return_code or 0)
        finally:
            if app.inbox is not None:
                await app.inbox.close()

    return asyncio.run(main())
