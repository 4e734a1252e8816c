"""Pilot tests of the desk's third round: run now, the timer actions, dead events by error,
the Done pane, the workers, and an approval's links; real keys, asserting the screen and
the database."""

from __future__ import annotations

from onwatch.tui.app import OnwatchApp
from onwatch.tui.screens.detail import DetailScreen, detail_links
from onwatch.tui.screens.groups import GroupsScreen
from onwatch.tui.screens.workers import WorkersScreen

from .conftest import screen_text, started, wait_for, wait_for_text
from .test_actions import SIZE, confirm_open, highlight, press


async def event_id(inbox, status: str, source_id: str) -> int:
    [found] = [e.id for e in await inbox.events(status) if e.source_id == source_id]
    return found


async def test_run_now_ends_the_backoff_of_the_highlighted_event(seeded):
    inbox, clock, _ = seeded
    flaky = await event_id(inbox, "pending", "gh-flaky-12")
    assert (await inbox.get_event(flaky)).available_at > clock.now()
    app = OnwatchApp(inbox)
    async with app.run_test(size=SIZE) as pilot:
        await started(app, pilot)
        pending = app.pane("pending")
        await highlight(pilot, "pending", str(flaky))
        assert pending.check_action("act", ("run_now",)) is True
        await press(pilot, "N")
        await confirm_open(pilot)
        assert "instead of waiting out its backoff?" in screen_text(app)
        await press(pilot, "y")
        await wait_for_text(pilot, f"#{flaky} runs now")
        event = await inbox.get_event(flaky)
        assert event.available_at == clock.now() and event.attempts == 1
        [entry] = await inbox.audit(target=f"event {flaky}", limit=1)
        assert (entry.action, entry.applied) == ("run_now", True)
        fresh = await event_id(inbox, "pending", "msg-5")
        await highlight(pilot, "pending", str(fresh))
        assert pending.check_action("act", ("run_now",)) is None  # nothing to wait out


async def test_timer_actions_pause_resume_fire_and_delete(seeded):
    inbox, clock, _ = seeded
    app = OnwatchApp(inbox)
    async with app.run_test(size=SIZE) as pilot:
        await started(app, pilot)
        await press(pilot, "5")
        timers = app.pane("timers")
        await highlight(pilot, "timers", "daily-digest")
        assert timers.check_action("act", ("resume_timer",)) is None  # not paused
        await press(pilot, "z")
        await confirm_open(pilot)
        await press(pilot, "y")
        await wait_for_text(pilot, "paused daily-digest: nothing fires until you resume it")
        [digest] = [t for t in await inbox.timers() if t.id == "daily-digest"]
        assert digest.paused
        await wait_for(
            pilot, lambda: timers._full["daily-digest"]["due"].plain == "paused", what="paused"
        )
        await press(pilot, "Z")
        await confirm_open(pilot)
        await press(pilot, "y")
        await wait_for_text(pilot, "resumed daily-digest")
        await press(pilot, "f")
        await confirm_open(pilot)
        await press(pilot, "y")
        await wait_for_text(pilot, "fired daily-digest now")
        [fired] = [e for e in await inbox.events("pending") if "fired_by" in (e.payload or {})]
        assert fired.payload["fired_by"] == app.actor
        await highlight(pilot, "timers", "daily-digest")
        await press(pilot, "X")
        await confirm_open(pilot)
        await press(pilot, "y")
        await wait_for_text(pilot, "deleted daily-digest")
        assert "daily-digest" not in {t.id for t in await inbox.timers()}
        # An approval's deadline is a timer the Timers pane shows but never acts on.
        [expiry] = [t for t in await inbox.timers() if t.kind == "approval"][:1]
        await press(pilot, "g")  # back to the first row: the highlight only moves down
        await highlight(pilot, "timers", expiry.id)
        for name in ("fire_timer", "pause_timer", "delete_timer"):
            assert timers.check_action("act", (name,)) is None


async def test_a_group_of_dead_events_is_requeued_after_one_confirmation(seeded):
    inbox, _, _ = seeded
    poison = await event_id(inbox, "dead", "gh-poison-77")
    app = OnwatchApp(inbox)
    async with app.run_test(size=SIZE) as pilot:
        await started(app, pilot)
        await press(pilot, "3", "E")
        await wait_for(pilot, lambda: isinstance(app.screen, GroupsScreen), what="the groups")
        assert "MemoryError: payload too large to summarise" in screen_text(app)
        await press(pilot, "r")
        await confirm_open(pilot)
        shown = screen_text(app)
        assert "Requeue this dead event?" in shown and "1 ×" in shown
        await press(pilot, "y")
        await wait_for_text(pilot, "requeued 1 of 1 with the error")
        assert (await inbox.get_event(poison)).status == "pending"


async def test_the_done_pane_shows_the_newest_first_with_their_runs(seeded):
    inbox, _, _ = seeded
    done = await inbox.events("done")
    app = OnwatchApp(inbox)
    async with app.run_test(size=SIZE) as pilot:
        await started(app, pilot)
        await press(pilot, "7")
        await wait_for_text(pilot, f"Done · {len(done)}")
        pane = app.pane("done")
        newest = max(done, key=lambda e: e.id)
        assert pane.cursor_key() == str(newest.id)
        assert f"#{newest.run_id}" in screen_text(app)
        assert pane.check_action("act", ("requeue",)) is False  # nothing to act on


async def test_the_done_pane_pages_older_with_a_keyset(tmp_path):
    from onwatch.core import FakeClock, Inbox

    inbox = await Inbox.open(str(tmp_path / "many.db"), clock=FakeClock(1_800_000_000))
    try:
        await inbox.configure(max_batch=500)
        for i in range(350):
            await inbox.ingest("chat", f"m{i}", None)
        gen = await inbox.acquire("W")
        batch = await inbox.claim_batch("W", gen)
        await inbox.finish("W", gen, [e.id for e in batch])
        app = OnwatchApp(inbox)
        async with app.run_test(size=SIZE) as pilot:
            await started(app, pilot)
            await press(pilot, "7")
            pane = app.pane("done")
            await wait_for(pilot, lambda: pane.cursor_key() == "350", what="the newest first")
            await press(pilot, "right_square_bracket")
            await wait_for(pilot, lambda: pane.cursor_key() == "50", what="the older page")
            assert pane.table.row_count == 50
            await press(pilot, "left_square_bracket")
            await wait_for(pilot, lambda: pane.cursor_key() == "350", what="back to newest")
    finally:
        await inbox.close()


async def test_the_workers_say_who_holds_the_lease_and_who_stands_by(seeded):
    inbox, _, _ = seeded
    app = OnwatchApp(inbox)
    async with app.run_test(size=SIZE) as pilot:
        await started(app, pilot)
        await press(pilot, "W")
        await wait_for(pilot, lambda: isinstance(app.screen, WorkersScreen), what="workers")
        await wait_for_text(pilot, "lease holder · gen 2")
        shown = screen_text(app)
        assert "lease holder · gen 2" in shown and "box-b" in shown and "4242" in shown
        assert "standing by" in shown and "box-c" in shown
        await press(pilot, "escape")
        await wait_for(pilot, lambda: not isinstance(app.screen, WorkersScreen), what="closed")


async def test_an_approval_links_to_the_event_that_asked_and_the_one_it_became(seeded):
    inbox, _, _ = seeded
    answered = await event_id(inbox, "done", "deploy-prod-v2")  # the answer, run since
    asker = (await inbox.approval_trail("deploy-prod-v2")).asked_by[0]
    app = OnwatchApp(inbox)
    async with app.run_test(size=SIZE) as pilot:
        await started(app, pilot)
        await press(pilot, "4")
        await highlight(pilot, "approvals", "deploy-prod-v2")
        await press(pilot, "enter")
        await wait_for(pilot, lambda: isinstance(app.screen, DetailScreen), what="the detail")
        await wait_for_text(pilot, f"event #{answered}: what its answer became")
        assert f"event #{asker}: asked for this approval" in screen_text(app)
        links = [label for label, _ in app.screen.links]
        number = 1 + next(i for i, label in enumerate(links) if "answer became" in label)
        await press(pilot, str(number))
        await wait_for_text(pilot, f"Event #{answered} · done")
        await wait_for_text(pilot, "approval deploy-prod-v2: this event answers it")
        await press(pilot, "1")  # and back, the other way
        await wait_for_text(pilot, "Approval · yes")
    # From the event that asked: the approvals its run asked for.
    links = await detail_links(inbox, await inbox.get_event(asker))
    assert (
        "approval deploy-prod-v2: asked by this event's run",
        ("approval", "deploy-prod-v2"),
    ) in links
