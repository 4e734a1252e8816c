"""Pilot tests for an operator's hands: the right row, the right file, the whole story.

Each test creates the fault it guards against: another connection moving rows above the
cursor, the inbox file deleted and replaced under the desk, marks hidden by a filter, a
burst of pasted keys, an agent whose exception carries markup and escape sequences.
"""

from __future__ import annotations

import os
import sqlite3

import pytest
from textual import events

from onwatch.core import FakeClock, FileLost, Inbox
from onwatch.core.runtime.worker import Worker
from onwatch.tui.app import OnwatchApp
from onwatch.tui.screens.confirm import ConfirmScreen
from onwatch.tui.screens.detail import DetailScreen
from onwatch.tui.screens.filter import FilterScreen
from onwatch.tui.screens.help import HelpScreen

from .conftest import T0, screen_text, started, wait_for, wait_for_text
from .test_actions import confirm_open, highlight, press

SIZE = (120, 40)


async def pending_inbox(path: str, n: int = 12) -> tuple[Inbox, FakeClock]:
    clock = FakeClock(T0)
    inbox = await Inbox.open(path, clock=clock)
    for i in range(1, n + 1):
        await inbox.ingest("chat", f"m{i}", {"text": f"message {i}"}, now=T0 - 100 + i)
    return inbox, clock


# --- the right row --------------------------------------------------------------------------


async def test_the_highlight_stays_on_its_event_while_rows_above_it_go(tmp_path):
    path = str(tmp_path / "live.db")
    inbox, clock = await pending_inbox(path)
    other = await Inbox.open(path, clock=clock)  # the worker / another CLI
    try:
        app = OnwatchApp(inbox)
        async with app.run_test(size=SIZE) as pilot:
            await started(app, pilot)
            pane = app.pane("pending")
            await highlight(pilot, "pending", "8")
            # Rows above the cursor leave (cancelled elsewhere) and one is deleted outright.
            for event_id in (2, 3, 5):
                assert await other.cancel(event_id, now=T0)
            raw = sqlite3.connect(path)
            raw.execute("DELETE FROM events WHERE id = 1")
            raw.commit()
            raw.close()
            await wait_for(
                pilot,
                lambda: "1" not in pane._records and "5" not in pane._records,
                what="the rows above to leave",
            )
            assert pane.cursor_key() == "8"
            assert pane.table.cursor_row == list(pane._records).index("8")
            # The event itself leaves: the pane says so and stays at the same height.
            assert await other.cancel(8, now=T0)
            await wait_for_text(pilot, "#8 left Pending; the highlight is now on #9")
            assert pane.cursor_key() == "9"
            # The next key names its row before anything changes.
            await press(pilot, "c")
            await confirm_open(pilot)
            assert "#9  chat / m9" in screen_text(app)
            await press(pilot, "n")
            assert (await inbox.get_event(9)).status == "pending"
    finally:
        await other.close()
        await inbox.close()


async def test_a_left_notice_goes_once_it_is_no_longer_true(tmp_path):
    """'#1 left Pending; no row is left' must not stand under three new pending rows, nor
    'the highlight is now on #3' once the operator moved it."""
    path = str(tmp_path / "live.db")
    inbox, clock = await pending_inbox(path, n=1)
    other = await Inbox.open(path, clock=clock)
    try:
        app = OnwatchApp(inbox)
        async with app.run_test(size=SIZE) as pilot:
            await started(app, pilot)
            pane = app.pane("pending")
            assert await other.cancel(1, now=T0)
            await wait_for_text(pilot, "#1 left Pending; no row is left")
            for i in range(2, 5):
                await other.ingest("chat", f"m{i}", {"text": "again"}, now=T0)
            await wait_for(pilot, lambda: len(pane._records) == 3, what="three new rows")
            await pilot.pause()
            assert "left Pending" not in screen_text(app)
            # A notice about where the highlight landed stands while it is there...
            assert await other.cancel(2, now=T0)
            await wait_for_text(pilot, "#2 left Pending; the highlight is now on #3")
            await other.ingest("chat", "m5", {"text": "more"}, now=T0)
            await wait_for(pilot, lambda: "5" in pane._records, what="a row below")
            assert "the highlight is now on #3" in screen_text(app)
            # ...and goes when the operator moves it.
            await press(pilot, "down")
            assert pane.cursor_key() == "4"
            assert "left Pending" not in screen_text(app)
    finally:
        await other.close()
        await inbox.close()


async def test_a_row_that_left_a_hidden_pane_is_not_announced_when_it_is_shown(seeded):
    """The Timers pane was read at start, its highlight on its first row, never looked at;
    that timer goes meanwhile. Shown later, the pane must not report a row nobody saw."""
    inbox, clock, path = seeded
    app = OnwatchApp(inbox)
    async with app.run_test(size=SIZE) as pilot:
        await started(app, pilot)
        first = app.pane("timers").cursor_key()
        assert first == "sync-calendar"
        other = await Inbox.open(path, create=False, clock=clock)
        try:
            assert await other.cancel_timer("sync-calendar")
            await other.ingest("chat", "nudge", {"text": "a commit the desk follows"})
        finally:
            await other.close()
        await wait_for(pilot, lambda: app.pane("timers").stale, what="the hidden pane stale")
        await press(pilot, "5")
        pane = app.pane("timers")
        await wait_for(pilot, lambda: "sync-calendar" not in pane._records, what="the reread")
        await pilot.pause()
        assert "left Timers" not in screen_text(app)


async def test_dead_pane_keeps_its_row_when_another_is_requeued_from_the_cli(tmp_path):
    path = str(tmp_path / "dead.db")
    clock = FakeClock(T0)
    inbox = await Inbox.open(path, clock=clock)
    other = await Inbox.open(path, clock=clock)
    try:
        for name in ("z1", "z2", "z3", "z4"):
            await inbox.ingest("stripe", name, {}, now=T0)
            [event] = await inbox.events("pending", limit=1)
            await inbox.bury(event.id, now=T0, reason=f"poison {name}")
        app = OnwatchApp(inbox)
        async with app.run_test(size=SIZE) as pilot:
            await started(app, pilot)
            await press(pilot, "3")
            await highlight(pilot, "dead", "3")
            assert await other.requeue(1, now=T0)
            pane = app.pane("dead")
            await wait_for(pilot, lambda: "1" not in pane._records, what="z1 to leave")
            assert pane.cursor_key() == "3"
            # The reason given to bury shows in the reason column.
            assert "poison z3" in screen_text(app)
            await press(pilot, "r")
            await confirm_open(pilot)
            assert "#3  stripe / z3" in screen_text(app)
            assert "#4" not in screen_text(app)
            await press(pilot, "y")
            await wait_for_text(pilot, "requeued #3")
            assert (await inbox.get_event(4)).status == "dead"
    finally:
        await other.close()
        await inbox.close()


async def test_marks_hidden_by_a_filter_are_left_out_and_said_so(tmp_path):
    path = str(tmp_path / "marks.db")
    inbox, _ = await pending_inbox(path, n=8)
    try:
        app = OnwatchApp(inbox)
        async with app.run_test(size=SIZE) as pilot:
            await started(app, pilot)
            pane = app.pane("pending")
            await highlight(pilot, "pending", "3")
            await press(pilot, "space", "space")  # marks #3 and #4
            await press(pilot, "slash")
            await wait_for(pilot, lambda: isinstance(app.screen, FilterScreen))
            await pilot.press(*"m7", "enter")
            await wait_for(pilot, lambda: list(pane._records) == ["7"], what="the filter")
            assert "2 marked (2 hidden)" in screen_text(app)
            await press(pilot, "c")
            await confirm_open(pilot)
            text = screen_text(app)
            assert "#7  chat / m7" in text
            assert "#3" not in text and "#4" not in text
            assert "2 marked rows are hidden by the filter" in text
            await press(pilot, "y")
            await wait_for_text(pilot, "cancelled #7")
            assert [(await inbox.get_event(i)).status for i in (3, 4, 7)] == [
                "pending",
                "pending",
                "cancelled",
            ]
            # Escape clears the filter; * marks every row shown, u clears every mark.
            await press(pilot, "escape")
            await wait_for(pilot, lambda: len(pane._records) == 7, what="every row again")
            assert pane.window.search is None
            await press(pilot, "asterisk")
            assert "7 marked" in screen_text(app)
            await press(pilot, "u")
            assert "marked" not in screen_text(app)
    finally:
        await inbox.close()


async def test_a_burst_of_pasted_keys_goes_into_the_filter_not_a_dialog(tmp_path):
    path = str(tmp_path / "burst.db")
    inbox, _ = await pending_inbox(path, n=4)
    try:
        app = OnwatchApp(inbox)
        async with app.run_test(size=SIZE) as pilot:
            await started(app, pilot)
            # All five keys queued before the app handles the first one, as a paste arrives.
            for char in "/chat":
                key = "slash" if char == "/" else char
                app.post_message(events.Key(key, char))
            await wait_for(
                pilot, lambda: isinstance(app.screen, FilterScreen), what="the filter dialog"
            )
            await pilot.pause()
            screens = [type(s).__name__ for s in app.screen_stack]
            assert "ConfirmScreen" not in screens, screens
            assert app.screen.query_one("#filter-input").value == "chat"
            await press(pilot, "enter")
            assert all(e.status == "pending" for e in await inbox.events("pending"))
            assert len(await inbox.events("pending")) == 4
    finally:
        await inbox.close()


async def test_vim_and_k9s_keys_move_the_cursor(tmp_path):
    path = str(tmp_path / "keys.db")
    inbox, _ = await pending_inbox(path, n=60)
    try:
        app = OnwatchApp(inbox)
        async with app.run_test(size=(80, 24)) as pilot:
            await started(app, pilot)
            pane = app.pane("pending")
            await press(pilot, "j", "j")
            assert pane.cursor_key() == "3"
            await press(pilot, "k")
            assert pane.cursor_key() == "2"
            await press(pilot, "G")
            assert pane.cursor_key() == "60"
            await press(pilot, "g")
            assert pane.cursor_key() == "1"
            await press(pilot, "end")
            assert pane.cursor_key() == "60"
            await press(pilot, "home")
            assert pane.cursor_key() == "1"
            await press(pilot, "ctrl+d")
            down = int(pane.cursor_key())
            assert 3 <= down <= 12
            await press(pilot, "ctrl+u")
            assert pane.cursor_key() == "1"
            await press(pilot, "question_mark")
            await wait_for(pilot, lambda: isinstance(app.screen, HelpScreen))
            text = screen_text(app)
            # The help at 80×24 shows the action keys first (the first panes' on its first
            # screen, the next ones a scroll below), then the habits.
            assert "Cancel" in text and "Requeue" in text
            app.screen.query_one("#help-scroll").scroll_to(y=10, animate=False)
            await pilot.pause()
            assert "Approve" in screen_text(app)
            app.screen.query_one("#help-scroll").scroll_end(animate=False)
            await pilot.pause()
            assert "Half page down" in screen_text(app)
    finally:
        await inbox.close()


# --- the right file -------------------------------------------------------------------------


async def test_a_deleted_and_replaced_file_raises_an_alarm_and_refuses_actions(tmp_path):
    path = str(tmp_path / "live.db")
    inbox, clock = await pending_inbox(path, n=3)
    app = OnwatchApp(inbox)
    try:
        async with app.run_test(size=SIZE) as pilot:
            await started(app, pilot)
            os.unlink(path)
            for suffix in ("-wal", "-shm"):
                if os.path.exists(path + suffix):
                    os.unlink(path + suffix)
            fresh = await Inbox.open(path, clock=clock)  # a new live.db, filled
            await fresh.ingest("mail", "new-1", {"text": "in the new file"}, now=T0)
            # Worded by whichever look saw it first: the deletion (the connection's guard,
            # before the new file came) or the new file at the path.
            await wait_for(
                pilot,
                lambda: (
                    "was replaced by another file" in screen_text(app)
                    or "was deleted after it was opened" in screen_text(app)
                ),
                what="the alarm",
            )
            assert "every action is refused" in screen_text(app)
            assert "not the file at the path" in screen_text(app)
            assert "updated 0s ago" not in screen_text(app)
            # c is refused: the deleted file's #1 stays as it was, the new file's #1 too.
            await press(pilot, "c")
            assert not isinstance(app.screen, ConfirmScreen)
            app.pane("pending").request("cancel")
            await wait_for_text(pilot, "refused:")
            assert (await fresh.get_event(1)).status == "pending"
            # The deleted file's connection has stopped for good: it neither writes nor reads
            # (docs/rules.md, The inbox file against the world outside it).
            with pytest.raises(FileLost):
                await app.inbox.get_event(1)
            await press(pilot, "p")
            assert not (await fresh.overview()).paused
            # R reopens the path: the new file's rows, the alarm down.
            await press(pilot, "R")
            await wait_for_text(pilot, "new-1")
            assert app.file_problem is None
            assert "every action is refused" not in screen_text(app)
            await press(pilot, "c")
            await confirm_open(pilot)
            await press(pilot, "y")
            await wait_for_text(pilot, "cancelled #1")
            assert (await fresh.get_event(1)).status == "cancelled"
            await fresh.close()
    finally:
        await app.inbox.close()
        if app.inbox is not inbox:
            await inbox.close()


async def test_an_action_waiting_for_the_lock_says_so(tmp_path):
    path = str(tmp_path / "lock.db")
    inbox, _ = await pending_inbox(path, n=2)
    try:
        app = OnwatchApp(inbox)
        async with app.run_test(size=SIZE) as pilot:
            await started(app, pilot)
            app.pane("pending").show_outcome("cancelled #7: it will never run", True)
            blocker = sqlite3.connect(path, isolation_level=None)
            blocker.execute("BEGIN IMMEDIATE")
            try:
                await press(pilot, "c")
                await confirm_open(pilot)
                await press(pilot, "y")
                await wait_for_text(pilot, "waiting for the lock…")
                assert "cancelled #7" not in screen_text(app)
            finally:
                blocker.execute("ROLLBACK")
                blocker.close()
            await wait_for_text(pilot, "cancelled #1")
    finally:
        await inbox.close()


# --- the whole story ------------------------------------------------------------------------

HOSTILE = "refund [@click=app.quit]x[/] \x1b]0;pwned\x07 [bold red]z"


async def test_the_agents_traceback_is_stored_and_shown_escaped(tmp_path, caplog):
    path = str(tmp_path / "trace.db")
    clock = FakeClock(T0)
    inbox = await Inbox.open(path, clock=clock)
    try:
        await inbox.configure(max_attempts=1)
        await inbox.ingest("stripe", "evt-9", {"kind": "refund"}, now=T0)

        def agent(batch, ctx):
            lookup = {}
            return lookup[HOSTILE]  # KeyError carrying markup and an OSC sequence

        caplog.set_level("INFO", logger="onwatch")
        await Worker(inbox, agent, holder="w", max_runs=1, poll_interval=0.05).run()
        [run] = await inbox.runs(1)
        assert "test_trust.py" in run.traceback and "lookup[HOSTILE]" in run.traceback
        assert (await inbox.get_event(1)).status == "dead"
        logged = caplog.text
        assert logged.count("Traceback (most recent call last)") == 1
        assert "event #1 (stripe / evt-9) is dead" in logged
        app = OnwatchApp(inbox)
        async with app.run_test(size=SIZE) as pilot:
            await started(app, pilot)
            await press(pilot, "3", "enter")
            await wait_for(pilot, lambda: isinstance(app.screen, DetailScreen))
            body = app.screen.query_one("#detail-body")
            await wait_for_text(pilot, "traceback")
            app.screen.query_one("#detail-scroll").scroll_end(animate=False)
            await pilot.pause()
            text = screen_text(app)
            assert "lookup[HOSTILE]" in text
            assert "\x1b" not in text and "\x07" not in text
            # Literal, not markup: the brackets are on screen and nothing is clickable.
            rendered = body.render()
            plain = getattr(rendered, "plain", str(rendered))
            assert "[@click=app.quit]x[/]" in plain
            assert "@click" not in str(getattr(rendered, "spans", ""))
            assert app.is_running
    finally:
        await inbox.close()


async def test_late_and_answered_approvals_say_what_will_happen(seeded):
    inbox, clock, _ = seeded
    app = OnwatchApp(inbox)
    async with app.run_test(size=SIZE) as pilot:
        await started(app, pilot)
        await press(pilot, "4")
        pane = app.pane("approvals")
        # deploy-prod-v2 is answered: a/d/e are not offered on it, even when a new request
        # arrives above it and the highlight stays where it was.
        await highlight(pilot, "approvals", "deploy-prod-v2")
        other = await Inbox.open(inbox.path, clock=clock)
        try:
            await other.request_approval("new-one", 3600, "Ship the hotfix", now=T0)
        finally:
            await other.close()
        await wait_for(pilot, lambda: "new-one" in pane._records, what="the new request")
        assert pane.cursor_key() == "deploy-prod-v2"
        footer = screen_text(app).splitlines()[-1]
        assert "Approve" not in footer and "Deny" not in footer and "Expire" not in footer
        for action in ("approve", "deny", "expire"):
            assert pane.check_action("act", (action,)) is False
        for key in ("a", "d", "e"):
            await press(pilot, key)
            assert not isinstance(app.screen, ConfirmScreen)
        assert "already answered" not in screen_text(app)
        assert (await inbox.get_approval("new-one")).answer is None
        # On a waiting row they are there again.
        await press(pilot, "g")
        await highlight(pilot, "approvals", "new-one")
        footer = screen_text(app).splitlines()[-1]
        assert "Approve" in footer and "Deny" in footer
        # Past its deadline: the dialog does not promise a yes.
        await press(pilot, "g")
        await highlight(pilot, "approvals", "refund-ord-991")
        clock.set(T0 + 5 * 3600)
        await press(pilot, "a")
        await confirm_open(pilot)
        text = screen_text(app)
        assert "past its deadline" in text and "will be refused" in text
        assert "resumes with the answer yes" not in text
        await press(pilot, "n")
        # A filtered pane counts what it shows, answered rows included.
        app.pane("approvals").set_filter("zzz-none")
        await wait_for_text(pilot, "0 matches: 0 waiting, 0 answered")
        app.pane("approvals").set_filter("deploy")
        await wait_for_text(pilot, "Approvals · 1 match: 0 waiting, 1 answered")
