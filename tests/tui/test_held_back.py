"""The desk when another process's read holds the store's cleanup back (docs/rules.md, "A
read that never ends"): a badge while it lasts, a notice, never markup, when it begins and
ends, and the badge taken down once the read ends even if nothing commits meanwhile."""

from __future__ import annotations

import contextlib

from onwatch.core import Inbox
from onwatch.core.sqlite import tx as sqlite_tx
from onwatch.tui import app as app_module
from onwatch.tui.app import OnwatchApp
from tests.faults.test_held_back import LARGE, grow, read_held_open

from .conftest import started, wait_for
from .test_actions import SIZE


async def test_the_desk_badges_a_held_back_store_until_the_read_ends(tmp_path, monkeypatch):
    monkeypatch.setattr(sqlite_tx, "WAL_LARGE", LARGE)
    monkeypatch.setattr(app_module, "HELD_BACK_LOOK_EVERY", 0.0)  # looks at every poll
    folder = tmp_path / "[b]x[@click=app.quit]"  # in the message: never read as markup
    folder.mkdir()
    path = folder / "inbox.db"
    inbox = await Inbox.open(path)
    notices: list[tuple[str, dict]] = []
    try:
        with contextlib.ExitStack() as reading:
            reading.enter_context(read_held_open(path))
            await grow(inbox, path, "a")
            app = OnwatchApp(inbox)
            monkeypatch.setattr(app, "notify", lambda text, **kw: notices.append((text, kw)))
            async with app.run_test(size=SIZE) as pilot:
                await started(app, pilot)
                badge = app.query_one("#held-back")
                await wait_for(pilot, lambda: badge.display, what="the badge")
                [(text, options)] = notices
                assert text.startswith(f"cleanup held back: its write-ahead log {path}-wal")
                assert options["markup"] is False and options["severity"] == "warning"
                assert "another process holds a read open" in str(badge.tooltip)
                reading.close()  # the read ends; nothing commits
                await wait_for(pilot, lambda: not badge.display, what="the badge down")
                assert notices[1][0] == "cleanup is no longer held back"
    finally:
        await inbox.close()
