"""Pane 5 shows a timer the scheduler set aside, with its reason, next to the healthy ones.

The broken row is written with plain sqlite3 (no call of the API can store it): a payload that
does not decode, under a hostile id. The scheduler sets it aside and goes on; the pane must
show it literally, say why, and keep every other countdown ticking."""

from __future__ import annotations

import asyncio
import sqlite3

from onwatch.core import FakeClock, Inbox
from onwatch.tui.app import OnwatchApp

from .conftest import T0, screen_text, wait_for_text

HOSTILE_ID = "[b]nightly[/b] \x1b]0;pwned\x07"


async def test_a_set_aside_timer_is_shown_with_its_reason(tmp_path):
    path = str(tmp_path / "inbox.db")
    clock = FakeClock(T0)
    inbox = await Inbox.open(path, clock=clock)
    await inbox.add_timer("hourly-digest", T0 + 3600, {"digest": True}, every=3600)
    with sqlite3.connect(path) as raw:
        raw.execute(
            "INSERT INTO timers (id, kind, due, every, catch_up, payload) "
            "VALUES (?, 'timer', ?, NULL, 'coalesce', '{not json')",
            (HOSTILE_ID, T0 - 10),
        )
    raw.close()
    assert await inbox.run_scheduler(now=T0) == 1  # due, and set aside instead of fired
    with sqlite3.connect(path) as raw:
        [(reason,)] = raw.execute("SELECT broken FROM timers WHERE id = ?", (HOSTILE_ID,))
    raw.close()
    assert reason and reason.startswith("set aside, not fired")
    app = OnwatchApp(inbox, clock=clock)
    try:
        async with app.run_test(size=(120, 40), notifications=True) as pilot:
            await asyncio.wait_for(app.loaded.wait(), 10)
            await pilot.press("5")
            await wait_for_text(pilot, "set aside")
            text = screen_text(app)
            # Literal, escapes visible; too long for its column, it keeps both ends.
            assert "[b]nightly[…]0;pwned\\x07" in text
            assert reason[:20] in text  # the note column, as far as it fits
            assert "in 1h00m" in text  # the healthy timer still counts down
            await pilot.press("enter")  # the detail: the whole reason
            await wait_for_text(pilot, reason[:60])
            await pilot.press("escape")
            await pilot.pause()
            clock.advance(5)
            app.tick()
            await pilot.pause()
            assert "in 59m55s" in screen_text(app)
            assert "set aside" in screen_text(app) and app.is_running
    finally:
        await inbox.close()
    with sqlite3.connect(path) as raw:  # still set aside, never fired, nothing else written
        assert raw.execute(
            "SELECT broken IS NOT NULL, last_fired FROM timers WHERE id = ?", (HOSTILE_ID,)
        ).fetchone() == (1, None)
        assert raw.execute("SELECT count(*) FROM events WHERE source = 'timer'").fetchone()[0] == 0
    raw.close()
