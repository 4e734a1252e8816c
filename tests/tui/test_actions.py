"""Pilot tests: real key presses for every action, asserting the screen and the database."""

from __future__ import annotations

import io
import os

import pytest
from rich.console import Console
from rich.text import Text

from onwatch.core import Inbox, Reply
from onwatch.tui.app import OnwatchApp
from onwatch.tui.screens.confirm import ConfirmScreen, Subject
from onwatch.tui.screens.detail import DetailScreen
from onwatch.tui.screens.help import HelpScreen

from .conftest import screen_text, started, wait_for, wait_for_text

SIZE = (120, 40)


async def press(pilot, *keys: str) -> None:
    for key in keys:
        await pilot.press(key)
        await pilot.pause()


async def confirm_open(pilot) -> ConfirmScreen:
    await wait_for(
        pilot, lambda: isinstance(pilot.app.screen, ConfirmScreen), what="the confirmation"
    )
    return pilot.app.screen


async def highlight(pilot, pane_id: str, key: str) -> None:
    """Move the cursor of `pane_id` to the row `key` (by pressing down, as a person would)."""
    pane = pilot.app.pane(pane_id)
    for _ in range(pane.table.row_count):
        if pane.cursor_key() == key:
            return
        await press(pilot, "down")
    assert pane.cursor_key() == key, f"row {key} not found in {pane_id}"


# --- approvals ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "key, confirm, answer, words",
    [
        ("a", "y", "yes", "approved refund-ord-991"),
        ("d", "enter", "no", "denied refund-ord-991"),
        ("e", "y", "expired", "expired refund-ord-991 now"),
    ],
)
async def test_approval_actions_confirm_then_store_the_answer(seeded, key, confirm, answer, words):
    inbox, clock, _ = seeded
    app = OnwatchApp(inbox)
    async with app.run_test(size=SIZE) as pilot:
        await started(app, pilot)
        await press(pilot, "4", key)
        await confirm_open(pilot)
        shown = screen_text(app)
        assert "Refund $42.00 to alice@example.com for order 991" in shown
        assert "time left 3h28m25s" in shown  # the deadline counts down in the dialog
        clock.advance(5)
        app.tick()
        await pilot.pause()
        assert "time left 3h28m20s" in screen_text(app)
        await press(pilot, confirm)
        await wait_for_text(pilot, words)
        assert (await inbox.get_approval("refund-ord-991")).answer == answer
        assert "0 waiting" in screen_text(app)


async def test_declining_the_confirmation_changes_nothing(seeded):
    inbox, _, _ = seeded
    app = OnwatchApp(inbox)
    async with app.run_test(size=SIZE) as pilot:
        await started(app, pilot)
        await press(pilot, "4", "a")
        await confirm_open(pilot)
        await press(pilot, "n")
        await wait_for_text(pilot, "not confirmed: nothing changed")
        await press(pilot, "d")
        await confirm_open(pilot)
        await press(pilot, "escape")
        await wait_for(pilot, lambda: not isinstance(app.screen, ConfirmScreen))
        assert (await inbox.get_approval("refund-ord-991")).answer is None


async def test_approving_after_the_deadline_says_too_late(seeded):
    inbox, clock, _ = seeded
    approval = await inbox.get_approval("refund-ord-991")
    app = OnwatchApp(inbox)
    async with app.run_test(size=SIZE) as pilot:
        await started(app, pilot)
        await press(pilot, "4", "a")
        await confirm_open(pilot)
        clock.set(approval.due + 30)  # the operator hesitated past the deadline
        app.tick()
        await pilot.pause()
        assert "deadline passed 30s ago" in screen_text(app)
        await press(pilot, "y")
        await wait_for_text(pilot, "refund-ord-991: too late: expired at 01:41")
        assert (await inbox.get_approval("refund-ord-991")).answer == "expired"


async def test_an_answer_given_elsewhere_meanwhile_stands(seeded):
    inbox, _, path = seeded
    app = OnwatchApp(inbox)
    async with app.run_test(size=SIZE) as pilot:
        await started(app, pilot)
        await press(pilot, "4", "a")
        await confirm_open(pilot)
        other = await Inbox.open(path, create=False, clock=inbox.clock)
        try:  # another operator (another process) answers first
            assert await other.answer_approval("refund-ord-991", "no", actor="bob") == "no"
        finally:
            await other.close()
        await press(pilot, "y")
        await wait_for_text(pilot, "refund-ord-991: already answered: no (by bob at 22:13)")
        assert (await inbox.get_approval("refund-ord-991")).answer == "no"


async def test_the_same_answer_given_elsewhere_meanwhile_is_not_claimed_as_ours(seeded):
    """bob approves while the dialog is open; our 'yes' stored nothing (the audit log says
    refused), so the desk must not say 'approved': it says whose answer stands."""
    inbox, _, path = seeded
    app = OnwatchApp(inbox, actor="ana")
    async with app.run_test(size=SIZE) as pilot:
        await started(app, pilot)
        await press(pilot, "4", "a")
        await confirm_open(pilot)
        other = await Inbox.open(path, create=False, clock=inbox.clock)
        try:
            assert await other.answer_approval("refund-ord-991", "yes", actor="bob") == "yes"
        finally:
            await other.close()
        await press(pilot, "y")
        await wait_for_text(pilot, "refund-ord-991: already answered: yes (by bob at 22:13)")
        assert "approved refund-ord-991" not in screen_text(app)
        [entry] = await inbox.audit(target="approval refund-ord-991", limit=1)
        assert (entry.actor, entry.applied) == ("ana", False)


# --- events ---------------------------------------------------------------------------------


async def test_requeue_a_dead_event(seeded):
    inbox, _, _ = seeded
    app = OnwatchApp(inbox)
    async with app.run_test(size=SIZE) as pilot:
        await started(app, pilot)
        await press(pilot, "3")
        await highlight(pilot, "dead", "2")
        await press(pilot, "r")
        # Confirmed, naming the row: rerunning the wrong poison event can repeat a refund.
        await confirm_open(pilot)
        assert "#2  webhook / gh-poison-77" in screen_text(app)
        assert (await inbox.get_event(2)).status == "dead"
        await press(pilot, "y")
        await wait_for_text(pilot, "requeued #2: pending again with a fresh attempt budget")
        event = await inbox.get_event(2)
        assert (event.status, event.attempts) == ("pending", 0)
        assert "2" not in app.pane("dead")._records


async def test_cancel_a_pending_event(seeded):
    inbox, _, _ = seeded
    app = OnwatchApp(inbox)
    async with app.run_test(size=SIZE) as pilot:
        await started(app, pilot)
        await highlight(pilot, "pending", "13")
        await press(pilot, "c")
        screen = await confirm_open(pilot)
        assert "gh-delivery-4411" in screen_text(app)
        await press(pilot, "y")
        await wait_for_text(pilot, "cancelled #13: it will never run")
        assert screen is not app.screen
        assert (await inbox.get_event(13)).status == "cancelled"
        assert "Pending · 4" in screen_text(app)


async def test_mark_an_interrupted_event_done(seeded):
    inbox, _, _ = seeded
    app = OnwatchApp(inbox)
    async with app.run_test(size=SIZE) as pilot:
        await started(app, pilot)
        await press(pilot, "3")
        await highlight(pilot, "dead", "1")
        await press(pilot, "m")
        await confirm_open(pilot)
        assert "evt_1OqRm2" in screen_text(app)
        await press(pilot, "y")
        await wait_for_text(pilot, "resolved #1 as done")
        assert (await inbox.get_event(1)).status == "done"


async def test_resolve_is_disabled_on_a_dead_row(seeded):
    inbox, _, _ = seeded
    app = OnwatchApp(inbox)
    async with app.run_test(size=SIZE) as pilot:
        await started(app, pilot)
        await press(pilot, "3")
        await highlight(pilot, "dead", "2")
        await press(pilot, "m")
        assert not isinstance(app.screen, ConfirmScreen)
        assert (await inbox.get_event(2)).status == "dead"


async def test_marked_rows_are_acted_on_together(seeded):
    inbox, _, _ = seeded
    app = OnwatchApp(inbox)
    async with app.run_test(size=SIZE) as pilot:
        await started(app, pilot)
        await highlight(pilot, "pending", "13")
        await press(pilot, "space", "space")  # marks 13 and 14 (the cursor moves down)
        assert "2 marked" in screen_text(app)
        await press(pilot, "c")
        await confirm_open(pilot)
        assert "Cancel these 2 pending events?" in screen_text(app)
        await press(pilot, "y")
        await wait_for_text(pilot, "cancelled 2 of 2")
        assert [(await inbox.get_event(i)).status for i in (13, 14, 15)] == [
            "cancelled",
            "cancelled",
            "pending",
        ]
        assert "marked" not in screen_text(app)


async def test_a_row_the_worker_claimed_meanwhile_is_reported_not_overwritten(seeded):
    inbox, _, path = seeded
    app = OnwatchApp(inbox)
    async with app.run_test(size=SIZE) as pilot:
        await started(app, pilot)
        await highlight(pilot, "pending", "13")
        await press(pilot, "c")
        await confirm_open(pilot)
        worker = await Inbox.open(path, create=False, clock=inbox.clock)
        try:  # between the operator's look and the confirmation, the worker claims it
            gen = await worker.acquire("worker-b")
            assert 13 in [e.id for e in await worker.claim_batch("worker-b", gen)]
        finally:
            await worker.close()
        await press(pilot, "y")
        await wait_for_text(pilot, "#13: changed meanwhile: the worker claimed it (it was pending)")
        assert (await inbox.get_event(13)).status == "running"
        audit = (await inbox.audit(target="event 13", limit=1))[0]
        assert not audit.applied and "changed meanwhile" in audit.reason


async def test_a_row_the_worker_finished_meanwhile_is_reported(seeded):
    inbox, _, _ = seeded
    app = OnwatchApp(inbox)
    async with app.run_test(size=SIZE) as pilot:
        await started(app, pilot)
        await press(pilot, "2")
        running = app.pane("running").cursor_record()
        # The worker finishes the run after the operator looked; the TUI has not refreshed.
        gen = await inbox.acquire("worker-b")
        assert await inbox.finish("worker-b", gen, [running.id])
        pane = app.pane("pending")
        app.post_message(
            pane.ActionRequested(
                pane,
                "cancel",
                (
                    running.__class__(
                        **{
                            **{f: getattr(running, f) for f in running.__slots__},
                            "status": "pending",
                        }
                    ),
                ),
            )
        )
        await confirm_open(pilot)
        await press(pilot, "y")
        await press(pilot, "1")
        await wait_for_text(pilot, f"#{running.id}: changed meanwhile: the worker finished it")
        assert (await inbox.get_event(running.id)).status == "done"


# --- execution and outbox -------------------------------------------------------------------


async def test_pause_and_resume(seeded):
    inbox, _, _ = seeded
    app = OnwatchApp(inbox)
    async with app.run_test(size=SIZE) as pilot:
        await started(app, pilot)
        await press(pilot, "p")
        await wait_for_text(pilot, "paused: claims return nothing until you resume")
        assert (await inbox.overview()).paused
        assert "PAUSED" in screen_text(app)
        assert "PAUSED · p resumes" in screen_text(app)
        await press(pilot, "p")
        await wait_for_text(pilot, "resumed: the worker may claim events again")
        assert not (await inbox.overview()).paused
        assert "PAUSED" not in screen_text(app)


async def test_hold_and_release_the_outbox(seeded):
    inbox, _, _ = seeded
    app = OnwatchApp(inbox)
    async with app.run_test(size=SIZE) as pilot:
        await started(app, pilot)
        await press(pilot, "6", "o")
        await wait_for_text(pilot, "outbox held: paced sends wait until you release it")
        assert (await inbox.overview()).outbox_held
        assert "OUTBOX HELD" in screen_text(app)
        assert "HELD by the operator" in screen_text(app)
        await press(pilot, "o")
        await wait_for_text(pilot, "outbox released")
        assert not (await inbox.overview()).outbox_held


async def test_send_now_flushes_held_messages_to_the_outbox_log(seeded):
    inbox, _, path = seeded
    app = OnwatchApp(inbox)
    async with app.run_test(size=SIZE) as pilot:
        await started(app, pilot)
        await press(pilot, "6", "s")
        await confirm_open(pilot)
        # In words nobody can misread: a file, marked sent, nobody receives them.
        dialog = app.screen
        assert dialog.question == "Write 2 held messages to a file and mark them sent?"
        assert dialog.note.startswith(
            "Nobody receives them: the desk has no channel to your users. They are appended "
            f"to {path}.outbox.log and leave the outbox as sent"
        )
        assert "onwatch dispatch --now" in dialog.note
        shown = " ".join(screen_text(app).split())
        assert "Write 2 held messages to a file and mark them sent?" in shown
        assert "Nobody receives them" in shown
        await press(pilot, "y")
        await wait_for_text(
            pilot,
            "wrote 2 held messages to inbox.db.outbox.log and marked them sent (nobody "
            "received them)",
        )
        assert await inbox.held_messages() == []
        with open(f"{path}.outbox.log", encoding="utf-8") as log:
            sent = log.read()
        assert "Still waiting on the refund approval." in sent
        assert "I'll tell you as soon as it is decided." in sent
        assert "Outbox · 0" in screen_text(app)
        entry = (await inbox.audit(target="outbox", limit=1))[0]
        assert (entry.action, entry.applied) == ("send now", True)


async def test_recent_sends_say_urgent_or_paced_in_words(seeded):
    """An urgent send skipped the gap: the sends table says so in a column of its own, not
    with a '!' nothing explains."""
    inbox, clock, _ = seeded
    gen = await inbox.acquire("worker-b")  # the seed's live worker, renewing
    assert gen is not None
    await inbox.ingest("chat", "msg-6", {"text": "where is my refund??"})
    batch = await inbox.claim_batch("worker-b", gen)
    await inbox.finish(
        "worker-b", gen, [e.id for e in batch], [Reply("On it, right now.", urgent=True)]
    )
    held = len(await inbox.held_messages())  # the urgent one included
    # Inside the gap the urgent one goes, with the messages held before it (written order).
    assert await inbox.dispatch(lambda text: None) == held
    app = OnwatchApp(inbox)
    async with app.run_test(size=SIZE) as pilot:
        await started(app, pilot)
        await press(pilot, "6")
        await wait_for_text(pilot, "Recent sends")
        lines = screen_text(app).splitlines()
        sends = {line.split()[1]: line for line in lines if line.strip("│ ").startswith("#")}
        assert "urgent" in sends["#2"] and "sent" in sends["#2"]
        assert "paced" in sends["#1"] and "urgent" not in sends["#1"]
        assert " !" not in "".join(sends.values())


# --- read-only ------------------------------------------------------------------------------


async def test_read_only_refuses_every_action(seeded):
    inbox, _, path = seeded
    before = (
        await inbox.counts(),
        await inbox.approvals(),
        await inbox.overview(),
        await inbox.held_messages(),
    )
    audit_before = await inbox.audit(limit=1000)
    app = OnwatchApp(inbox, read_only=True)
    async with app.run_test(size=SIZE) as pilot:
        await started(app, pilot)
        assert "READ-ONLY" in screen_text(app)
        for pane_key, keys in (
            ("1", ("space", "c")),
            ("3", ("r", "m")),
            ("4", ("a", "d", "e")),
            ("6", ("p", "o", "s")),
        ):
            await press(pilot, pane_key)
            for key in keys:
                await press(pilot, key)
                assert not isinstance(app.screen, ConfirmScreen), key
            footer = screen_text(app).splitlines()[-1]
            for word in (
                "Cancel",
                "Requeue",
                "Resolve",
                "Approve",
                "Deny",
                "Expire",
                "Pause",
                "Hold outbox",
                "Send now",
                "Mark",
            ):
                assert word not in footer, (word, footer)
        await app.workers.wait_for_complete()
    after = (
        await inbox.counts(),
        await inbox.approvals(),
        await inbox.overview(),
        await inbox.held_messages(),
    )
    assert after == before
    assert await inbox.audit(limit=1000) == audit_before
    assert not os.path.exists(f"{path}.outbox.log")


# --- reading --------------------------------------------------------------------------------


async def test_detail_shows_payload_runs_and_audit(seeded):
    inbox, _, _ = seeded
    await inbox.requeue(2, expect="dead", reason="fixed the summariser")
    await inbox.bury(2, expect="pending")
    app = OnwatchApp(inbox)
    async with app.run_test(size=SIZE) as pilot:
        await started(app, pilot)
        await press(pilot, "3")
        await highlight(pilot, "dead", "2")
        await press(pilot, "enter")
        await wait_for(pilot, lambda: isinstance(app.screen, DetailScreen), what="detail")
        body = app.screen.body.plain
        assert '"size": "huge"' in body
        assert "Runs (3)" in body and "MemoryError" in body
        assert "requeue" in body and "fixed the summariser" in body
        assert "Effect journal (0)" in body
        await press(pilot, "escape")
        await wait_for(pilot, lambda: not isinstance(app.screen, DetailScreen))


async def test_filter_narrows_the_pane(seeded):
    inbox, _, _ = seeded
    app = OnwatchApp(inbox)
    async with app.run_test(size=SIZE) as pilot:
        await started(app, pilot)
        await press(pilot, "slash")
        await pilot.press(*"msg-5", "enter")
        await wait_for(
            pilot, lambda: list(app.pane("pending")._records) == ["14"], what="the filtered window"
        )
        assert "filter “msg-5”" in screen_text(app)
        await press(pilot, "slash", "ctrl+a", "ctrl+k", "enter")
        await wait_for(pilot, lambda: len(app.pane("pending")._records) == 5)


async def test_help_and_palette_read_the_bindings(seeded):
    inbox, _, _ = seeded
    app = OnwatchApp(inbox)
    async with app.run_test(size=SIZE) as pilot:
        await started(app, pilot)
        await press(pilot, "4", "question_mark")
        assert isinstance(app.screen, HelpScreen)
        assert "onwatch keys" in screen_text(app)
        console = Console(width=120, file=io.StringIO(), record=True)
        console.print(app.screen.body)
        text = console.export_text()
        for words in (
            "Approve",
            "answer yes",
            "Requeue",
            "Write out",
            "outbox.log",
            "s sends nothing to anyone",
            "Resolve",
            "Cancel",
            "Next page",
        ):
            assert words in text, words
        await press(pilot, "escape")
        names = [c.title for c in app.get_system_commands(app.screen)]
        for name in (
            "Approve",
            "Deny",
            "Expire",
            "Pause",
            "Hold outbox",
            "Write out",
            "Detail",
            "Filter",
            "Pending",
            "Outbox",
            "Help",
            "Quit",
        ):
            assert name in names, name
        assert len(names) == len(set(names)), names  # one Quit, one Help
        assert "Cursor up" not in names  # the table's own keys are Textual's "Keys" command


async def test_countdowns_tick_from_the_one_clock(seeded):
    inbox, clock, _ = seeded
    app = OnwatchApp(inbox)
    async with app.run_test(size=SIZE) as pilot:
        await started(app, pilot)
        await press(pilot, "4")
        assert "3h28m25s left" in screen_text(app)
        assert "9m40s left" in screen_text(app)  # the lease, in the status strip
        clock.advance(61)
        app.tick()
        await pilot.pause()
        assert "3h27m24s left" in screen_text(app)
        assert "8m39s left" in screen_text(app)
        clock.advance(600)
        app.tick()
        await pilot.pause()
        assert "lease worker-b gen 2 · expired 1m21s ago" in screen_text(app)


async def test_a_clock_tick_before_the_dialog_is_composed_is_kept_not_fatal(seeded):
    # The app's clock may fire between `push_screen` and the dialog's compose (a loaded
    # machine): the tick finds no countdown yet, and the dialog shows that tick's `now`.
    inbox, clock, _ = seeded
    app = OnwatchApp(inbox)
    async with app.run_test(size=SIZE) as pilot:
        await started(app, pilot)
        subject = Subject(Text("refund-ord-991"), due=clock.now() + 120)
        app.push_screen(ConfirmScreen("Approve?", [subject], clock.now()))
        clock.advance(61)
        app.tick()
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen), what="confirm")
        await wait_for_text(pilot, "time left 59s")


async def test_the_outbox_countdowns_and_send_times_tick(seeded):
    inbox, clock, _ = seeded
    app = OnwatchApp(inbox)
    async with app.run_test(size=SIZE) as pilot:
        await started(app, pilot)
        await press(pilot, "6")
        await wait_for_text(pilot, "28m20s ago")  # the last paced send
        assert "next paced send in 31m40s" in screen_text(app)
        clock.advance(60)
        app.tick()
        await pilot.pause()
        assert "29m20s ago" in screen_text(app)
        assert "next paced send in 30m40s" in screen_text(app)
