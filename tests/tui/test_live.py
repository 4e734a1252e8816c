"""Live following: another process's commits show up without a keypress; errors are clear."""

from __future__ import annotations

import sqlite3

from onwatch.core import Inbox, InboxBusy
from onwatch.tui import app as app_module
from onwatch.tui.app import OnwatchApp

from .conftest import T0, screen_text, started, wait_for, wait_for_text

SIZE = (120, 40)


async def test_another_connection_writes_and_the_panes_follow(seeded):
    inbox, clock, path = seeded
    app = OnwatchApp(inbox)
    async with app.run_test(size=SIZE) as pilot:
        await started(app, pilot)
        assert "gh-live-1" not in screen_text(app)
        other = await Inbox.open(path, create=False, clock=clock)
        try:
            await other.ingest("webhook", "gh-live-1", {"n": 1})
            await wait_for_text(pilot, "gh-live-1", timeout=3)  # no key pressed
            assert "Pending · 6" in screen_text(app)
            assert "1 Pending 6" in screen_text(app)
            await other.pause()
            await wait_for_text(pilot, "PAUSED", timeout=3)
            gen = await other.acquire("worker-b")
            await other.resume()
            claimed = await other.claim_batch("worker-b", gen)
            assert claimed
            await wait_for(
                pilot,
                lambda: (
                    "gh-live-1" not in " ".join(r.source_id for r in app.pane("pending").records())
                ),
                timeout=3,
                what="the claimed row to leave Pending",
            )
            await pilot.press("2")
            await wait_for_text(pilot, "gh-live-1", timeout=3)
        finally:
            await other.close()


async def test_an_idle_inbox_is_not_read_again(seeded):
    inbox, _, _ = seeded
    app = OnwatchApp(inbox)
    async with app.run_test(size=SIZE) as pilot:
        await started(app, pilot)
        await inbox.ingest("chat", "same-connection", {})
        await app.reload()  # what an action does after its write: read once, right away
        await pilot.pause()
        assert "same-connection" in screen_text(app)
        reads = 0
        original = inbox.overview

        async def counting(*args, **kwargs):
            nonlocal reads
            reads += 1
            return await original(*args, **kwargs)

        inbox.overview = counting
        try:
            for _ in range(12):  # six poll intervals
                await pilot.pause(0.1)
        finally:
            del inbox.overview
        assert reads == 0  # the change token did not move since that read: nothing re-read


async def test_writes_through_the_apps_own_connection_are_followed(seeded):
    """The demo's steps (and any code sharing the app's Inbox) write on its connection, which
    PRAGMA data_version alone does not see; the change token does."""
    inbox, _, _ = seeded
    app = OnwatchApp(inbox)
    async with app.run_test(size=SIZE) as pilot:
        await started(app, pilot)
        await inbox.ingest("chat", "same-connection", {})  # no reload
        await wait_for_text(pilot, "same-connection", timeout=3)


def test_run_refuses_a_missing_file(tmp_path, capsys):
    assert app_module.run(str(tmp_path / "nope.db")) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("onwatch: no inbox at") and "\n" not in err


def test_run_refuses_a_foreign_database(tmp_path, capsys):
    path = tmp_path / "other.db"
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE customers (id INTEGER PRIMARY KEY)")
    assert app_module.run(str(path)) == 2
    err = capsys.readouterr().err.strip()
    assert "not an onwatch inbox" in err and "Traceback" not in err and "\n" not in err
    with sqlite3.connect(path) as db:  # untouched
        assert [r[0] for r in db.execute("SELECT name FROM sqlite_master")] == ["customers"]


def test_run_refuses_a_file_that_is_not_sqlite(tmp_path, capsys):
    path = tmp_path / "notes.db"
    path.write_text("just some notes\n")
    assert app_module.run(str(path)) == 2
    assert "not a SQLite database" in capsys.readouterr().err


def test_run_reports_a_locked_inbox(tmp_path, capsys, monkeypatch):
    async def busy(*args, **kwargs):
        raise InboxBusy(
            "inbox x.db stayed locked by another process for more than 5 s; "
            "nothing was changed, try again"
        )

    monkeypatch.setattr(app_module.Inbox, "open", busy)
    assert app_module.run(str(tmp_path / "x.db")) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("onwatch: inbox x.db stayed locked") and "\n" not in err


def test_run_reports_a_file_locked_by_another_process(tmp_path, capsys, monkeypatch):
    """A real lock: a rollback-journal inbox held EXCLUSIVE by another connection."""
    import asyncio

    path = str(tmp_path / "locked.db")

    async def make():
        inbox = await Inbox.open(path)
        await inbox.close()

    asyncio.run(make())
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("PRAGMA journal_mode = DELETE")
    holder.execute("BEGIN EXCLUSIVE")
    try:
        original = Inbox.open

        async def quick(p, **kwargs):  # a short busy timeout keeps the test fast
            return await original(p, busy_timeout=0.2, **kwargs)

        monkeypatch.setattr(app_module.Inbox, "open", quick)
        code = app_module.run(path)
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert err.startswith("onwatch: ") and "Traceback" not in err and "\n" not in err


async def test_a_failed_read_is_shown_and_retried(seeded):
    from onwatch.core import InboxBusy

    inbox, _, _ = seeded
    app = OnwatchApp(inbox)
    async with app.run_test(size=SIZE) as pilot:
        await started(app, pilot)
        original = inbox.overview

        async def busy(*args, **kwargs):
            raise InboxBusy("inbox stayed locked by another process for more than 5 s")

        inbox.overview = busy
        try:
            await app.reload()
            await pilot.pause()
            assert "cannot read the inbox: inbox stayed locked" in screen_text(app)
        finally:
            inbox.overview = original
        await wait_for(
            pilot,
            lambda: "updated 0s ago" in screen_text(app),
            timeout=3,
            what="the poll to read again",
        )


async def test_a_failed_poll_is_shown_and_cleared_once_the_file_answers(seeded):
    """A poll that cannot ask whether anything changed shows why, and the next poll that can
    reads again, though nobody committed in between."""
    from onwatch.core import InboxBusy

    inbox, _, _ = seeded
    app = OnwatchApp(inbox)
    async with app.run_test(size=SIZE) as pilot:
        await started(app, pilot)
        failures = 0

        async def busy(*args, **kwargs):
            nonlocal failures
            failures += 1
            raise InboxBusy("inbox stayed locked by another process for more than 5 s")

        inbox.change_token = busy
        try:
            await wait_for(pilot, lambda: failures > 0, timeout=3, what="a failed poll")
            await wait_for_text(pilot, "cannot read the inbox: inbox stayed locked", timeout=3)
        finally:
            del inbox.change_token
        await wait_for(
            pilot,
            lambda: "updated 0s ago" in screen_text(app),
            timeout=3,
            what="the next poll to clear the problem",
        )


async def test_a_change_reads_only_the_shown_pane(seeded):
    """The pane bar's counts come from the overview: a change reads the shown pane's window
    and no other (the rest are read when shown)."""
    inbox, clock, path = seeded
    app = OnwatchApp(inbox)
    async with app.run_test(size=SIZE) as pilot:
        await started(app, pilot)
        windows = []
        for name in ("events", "timers", "approvals", "held_messages"):

            def counting(*args, _original=getattr(inbox, name), _name=name, **kwargs):  # noqa: B008 - evaluated once, on purpose
                windows.append(_name)
                return _original(*args, **kwargs)

            setattr(inbox, name, counting)
        other = await Inbox.open(path, create=False, clock=clock)
        try:
            await other.add_timer("nightly", T0 + 600, {})
            await wait_for_text(pilot, "5 Timers 6", timeout=3)  # the count moved
            assert windows == ["events"]  # the Pending pane's window, and nothing else
            assert app.pane("timers").stale
            await pilot.press("5")
            await wait_for_text(pilot, "nightly", timeout=3)
        finally:
            await other.close()


async def test_settings_changed_by_another_process_are_shown(seeded):
    """`onwatch config` in another terminal: the attempt budget and the pacing follow."""
    inbox, clock, path = seeded
    app = OnwatchApp(inbox)
    async with app.run_test(size=SIZE) as pilot:
        await started(app, pilot)
        assert "1/3" in screen_text(app)  # gh-flaky-12, one attempt of three
        other = await Inbox.open(path, create=False, clock=clock)
        try:
            await other.configure(max_attempts=5, outbox_gap=600)
        finally:
            await other.close()
        await wait_for_text(pilot, "1/5", timeout=3)
        await pilot.press("6")
        await wait_for_text(pilot, "pacing: one send every 10m", timeout=3)
