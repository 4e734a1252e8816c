"""The fleet desk: every inbox of a folder on one screen, and every waiting approval in one list.

`onwatch tui DIR` (or `onwatch tui postgresql://…` with no `--inbox`) runs `run(DIR)`: the supervisor app with a fleet source, which opens on the
Fleet view (tui/fleet/screen.py) over its six panes; the scanning and the approval alarm live
in tui/fleet/desk.py, the all-approvals queue in tui/fleet/queue.py.
"""

from __future__ import annotations

import asyncio
import sys

from core import InboxError, SystemClock
from core.fleet import DatabaseFleet, FleetSource, FolderFleet
from core.pg import is_url

from .desk import FleetDesk, title_for
from .screen import FleetScreen

__all__ = ["DatabaseFleet", "FleetDesk", "FleetScreen", "FolderFleet", "run", "title_for"]


def run(target: str, *, read_only: bool = False) -> int:
    """Open the fleet desk on a folder of inbox files, or on every inbox of a PostgreSQL
    database (a `postgresql://` URL), until the operator quits.

    Returns the exit code: 0 after a normal quit, 2 (one line on stderr) when `target` is
    neither a folder nor a reachable onwatch database.
    """
    from ..app import OnwatchApp

    try:
        if is_url(target):
            database = DatabaseFleet(target)
            database.check()
            source: FleetSource = database
        else:
            source = FolderFleet(target)
    except InboxError as exc:  # BadInput, NotAnInbox, an unreachable server
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
            close = getattr(source, "close", None)
            if close is not None:
                close()

    return asyncio.run(main())
