"""The fleet desk driven by real keys: rows, drilling in and out, the filter, the approval
queue answering in each inbox's own file, unreadable files, hostile names, the alarm."""

from __future__ import annotations

import asyncio
import hashlib
import os
import shutil
import sqlite3
import sys

import pytest
from textual.widgets import Sparkline

from onwatch.core import FakeClock, Inbox, SystemClock
from onwatch.core.fleet import FolderFleet
from onwatch.tui.app import OnwatchApp
from onwatch.tui.fleet import FleetScreen, title_for
from onwatch.tui.fleet.queue import ApprovalQueueScreen
from onwatch.tui.fleet.screen import activity
from onwatch.tui.fleet.seed import ESCAPE_NAME, HOSTILE_ACTION, HOSTILE_NAME, seed_fleet
from onwatch.tui.screens.confirm import ConfirmScreen
from onwatch.tui.screens.filter import FilterScreen

from .conftest import T0, screen_text, wait_for, wait_for_text

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture
async def fleet(tmp_path):
    """(folder, clock): the seeded fleet folder on a fake clock at T0."""
    folder = str(tmp_path / "agents")
    os.mkdir(folder)
    clock = await seed_fleet(folder)
    return folder, clock


def make_app(folder: str, clock, **kwargs) -> OnwatchApp:
    return OnwatchApp(None, clock=clock, fleet=FolderFleet(folder, label="agents"), **kwargs)


async def loaded(app, pilot) -> FleetScreen:
    await wait_for(
        pilot,
        lambda: (
            getattr(app, "fleet_desk", None) is not None
            and app.fleet_desk.loaded
            and isinstance(app.screen, FleetScreen)
        ),
        what="the first scan",
    )
    await pilot.pause()
    return app.screen


async def close(app) -> None:
    if app.inbox is not None:
        await app.inbox.close()


def names(screen: FleetScreen) -> list[str]:
    return [s.name for s in screen.order]


def digest(path: str) -> str:
    with open(path, "rb") as handle:
        return hashlib.sha256(handle.read()).hexdigest()


async def answer_of(path: str, request_id: str) -> str | None:
    async with await Inbox.open(path, create=False) as inbox:
        approval = await inbox.get_approval(request_id)
        return approval.answer if approval else None


async def test_rows_need_a_human_first_and_are_coloured_by_health(fleet):
    folder, clock = fleet
    app = make_app(folder, clock)
    async with app.run_test(size=(120, 40), notifications=True) as pilot:
        screen = await loaded(app, pilot)
        order = names(screen)
        # approvals by deadline, then work with no worker, dead, lost leases, unreadable
        # files, the rest
        assert order[:4] == ["bob", "alice", HOSTILE_NAME, ESCAPE_NAME]
        assert order[4:7] == ["dave", "carol", "gina"]
        assert order[7:10] == ["ledger", "new", "notes"]
        assert order[10:] == ["erin", "frank"]
        rows = {
            summary.name: row
            for summary in screen.order
            if (row := screen.rows.painted.get(summary.key)) is not None
        }
        assert rows["bob"].style == "urgent"
        assert rows["alice"].style == "approval"
        assert rows["carol"].style == "dead"
        assert rows["dave"].style == "unserved"
        assert rows["gina"].style == "lost"
        assert rows["notes"].style == "problem"
        assert rows["erin"].style == "ok" and "failing" in rows["erin"].flags
        assert rows["frank"].style == "ok" and "failing" not in rows["frank"].flags
        text = screen_text(app)
        assert (
            "12 inboxes · 4 approvals waiting · 1 expiring soon · 3 need a worker · "
            "2 dead · 3 lost leases · 3 unreadable"
        ) in " ".join(text.split())
        assert "g1 released worker-carol" in text and "g1 expired 23m ago worker" in text
        # Work waits with no worker: said so with its age; approvals nobody will act on too.
        assert "no worker · waiting 6m" in text
        assert "no worker · never started" in text and "no worker · g1 lost 3m ago" in text
        # The countdown is live: the clock moves, the row follows.
        assert "1 · 7m00s" in text
        clock.advance(5)
        app.tick()
        await pilot.pause()
        assert "1 · 6m55s" in screen_text(app)
        await close(app)


async def test_enter_drills_in_and_escape_or_0_come_back_to_the_same_inbox(fleet):
    folder, clock = fleet
    app = make_app(folder, clock)
    async with app.run_test(size=(120, 40), notifications=True) as pilot:
        screen = await loaded(app, pilot)
        while screen.cursor_key != "carol.db":
            await pilot.press("down")
        await pilot.press("enter")
        await wait_for(
            pilot,
            lambda: not isinstance(app.screen, FleetScreen) and app.inbox is not None,
            what="the inbox's panes",
        )
        assert app.inbox.path == os.path.join(folder, "carol.db")
        await pilot.press("3")
        await wait_for_text(pilot, "gh-poison-9")
        assert "carol.db" in screen_text(app)
        # The status strip's sparkline: the same runs of the hour as carol's fleet row
        # (one failed run: drawn in the failing colours).
        runs, failed = activity(app.fleet_desk.summaries["carol.db"], clock.now())
        spark = app.query_one("#runs", Sparkline)
        assert sum(runs) and failed
        assert list(spark.data) == runs and spark.has_class("-failing")
        assert "runs/h" in screen_text(app)
        # Meanwhile dave gets an approval: the fleet re-sorts, the cursor stays on carol.
        async with await Inbox.open(os.path.join(folder, "dave.db"), clock=clock) as dave:
            await dave.request_approval("dave-ask", 3600, "restart the mail relay")
        await pilot.press("escape")
        await wait_for(pilot, lambda: isinstance(app.screen, FleetScreen), what="the fleet")
        await wait_for(pilot, lambda: "dave" in names(screen)[:5], what="dave moving up")
        assert screen.cursor_key == "carol.db"
        assert screen.rows.selected.name == "carol"
        # 0 from an inbox does the same; Enter on another inbox switches the panes to it.
        await pilot.press("up")
        moved_to = screen.cursor_key
        await pilot.press("enter")
        await wait_for(pilot, lambda: app.inbox.path.endswith(moved_to), what="the switch")
        await pilot.press("0")
        await wait_for(pilot, lambda: isinstance(app.screen, FleetScreen), what="the fleet")
        assert screen.cursor_key == moved_to
        await close(app)


async def test_filter_by_name_and_escape_clears_it(fleet):
    folder, clock = fleet
    app = make_app(folder, clock)
    async with app.run_test(size=(120, 40), notifications=True) as pilot:
        screen = await loaded(app, pilot)
        await pilot.press("slash")
        await wait_for(pilot, lambda: isinstance(app.screen, FilterScreen), what="filter")
        await pilot.press("a", "r", "enter")
        await wait_for(pilot, lambda: names(screen) == ["carol"], what="the filter")
        assert "filter “ar”: 1 of 12 shown" in screen_text(app)
        await pilot.press("escape")
        await wait_for(pilot, lambda: len(names(screen)) == 12, what="every inbox")
        await close(app)


async def test_all_approvals_answered_one_after_another_in_their_own_files(fleet):
    folder, clock = fleet
    app = make_app(folder, clock)
    async with app.run_test(size=(120, 40), notifications=True) as pilot:
        await loaded(app, pilot)
        await pilot.press("A")
        await wait_for(pilot, lambda: isinstance(app.screen, ApprovalQueueScreen), what="the queue")
        queue = app.screen
        assert [(s.name, a.request_id) for s, a in queue.items][:2] == [
            ("bob", "wire-transfer-88"),
            ("alice", "refund-ord-991"),
        ]
        # One count with one meaning: the title says what the header and the queue say,
        # and opening the queue does not make a waiting request vanish from it.
        assert app.title == title_for(4, 1) == "onwatch · 4 approvals waiting · 1 expiring soon"
        assert "All approvals · 4 waiting in 4 inboxes" in screen_text(app)
        await pilot.press("a")
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen), what="confirm")
        assert "Wire $9,800 to ACME Ltd" in screen_text(app)
        await pilot.press("y")
        await wait_for_text(pilot, "bob: approved wire-transfer-88")
        assert await answer_of(os.path.join(folder, "bob.db"), "wire-transfer-88") == "yes"
        await wait_for(
            pilot,
            lambda: queue.items and queue.items[0][0].name == "alice",
            what="bob's request leaving the queue",
        )
        assert app.screen is queue and queue.rows.selected[0].name == "alice"
        await wait_for(pilot, lambda: app.title == title_for(3), what="the count going down")
        assert app.title == "onwatch · 3 approvals waiting"
        # Not confirmed: nothing changes.
        await pilot.press("d")
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen), what="confirm")
        await pilot.press("n")
        await wait_for_text(pilot, "not confirmed: nothing changed")
        assert await answer_of(os.path.join(folder, "alice.db"), "refund-ord-991") is None
        await pilot.press("d")
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen), what="confirm")
        await pilot.press("y")
        await wait_for_text(pilot, "alice: denied refund-ord-991")
        assert await answer_of(os.path.join(folder, "alice.db"), "refund-ord-991") == "no"
        # Expire the hostile one: its action text is shown literally in the dialog.
        await wait_for(
            pilot, lambda: queue.rows.selected[0].name == HOSTILE_NAME, what="the next request"
        )
        await pilot.press("e")
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen), what="confirm")
        assert "[@click=app.quit]x[/] \\x1b]0;pwned\\x07" in screen_text(app)
        await pilot.press("y")
        await wait_for_text(pilot, "now: the agent resumes with a refusal")
        hostile = os.path.join(folder, f"{HOSTILE_NAME}.db")
        assert await answer_of(hostile, "[@click=app.quit]go[/]") == "expired"
        assert app.is_running
        # A request answered elsewhere meanwhile: the standing answer is reported.
        escaped = os.path.join(folder, f"{ESCAPE_NAME}.db")
        await wait_for(
            pilot, lambda: queue.rows.selected[0].name == ESCAPE_NAME, what="the last request"
        )
        await pilot.press("a")
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen), what="confirm")
        async with await Inbox.open(escaped, clock=clock) as other:
            await other.answer_approval("ok-\x1b[2J", "no", actor="ana")
        await pilot.press("y")
        await wait_for_text(pilot, "already answered: no (by ana")
        assert await answer_of(escaped, "ok-\x1b[2J") == "no"
        # Enter opens a request's inbox at its Approvals pane; escape leaves the queue.
        await pilot.press("escape")
        await wait_for(pilot, lambda: isinstance(app.screen, FleetScreen), what="fleet")
        async with await Inbox.open(os.path.join(folder, "dave.db"), clock=clock) as dave:
            await dave.request_approval("dave-ask", 3600, "restart the mail relay")
        await pilot.press("A")
        await wait_for(
            pilot,
            lambda: isinstance(app.screen, ApprovalQueueScreen) and app.screen.items,
            what="dave's request",
        )
        await pilot.press("enter")
        await wait_for(
            pilot,
            lambda: (
                app.inbox is not None
                and app.inbox.path.endswith("dave.db")
                and not isinstance(app.screen, (FleetScreen, ApprovalQueueScreen))
            ),
            what="dave's panes",
        )
        await wait_for_text(pilot, "restart the mail relay")
        await close(app)


async def test_one_request_id_in_two_inboxes_is_confirmed_with_its_own_file(fleet):
    """A fleet holds many inboxes whose request ids repeat (each agent numbers its own):
    the dialog names the file it writes to, and only that file changes."""
    folder, clock = fleet
    for name, expires in (("erin", 1800), ("frank", 2400)):
        async with await Inbox.open(os.path.join(folder, f"{name}.db"), clock=clock) as box:
            await box.request_approval("refund-1", expires, f"refund 5 for {name}'s customer")
    app = make_app(folder, clock)
    async with app.run_test(size=(120, 40)) as pilot:
        await loaded(app, pilot)
        await pilot.press("A")
        await wait_for(pilot, lambda: isinstance(app.screen, ApprovalQueueScreen), what="the queue")
        queue = app.screen
        for name, key, answer in (("erin", "a", "yes"), ("frank", "d", "no")):
            for _ in range(len(queue.items)):
                if queue.rows.selected[0].name == name:
                    break
                await pilot.press("down")
            assert queue.rows.selected[0].name == name
            await pilot.press(key)
            await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen), what="confirm")
            shown = screen_text(app)
            other = "frank" if name == "erin" else "erin"
            assert f"in {name}.db" in shown and f"{other}.db" not in shown, shown
            await pilot.press("y")
            await wait_for_text(pilot, f"{name}: {'approved' if answer == 'yes' else 'denied'}")
            assert await answer_of(os.path.join(folder, f"{name}.db"), "refund-1") == answer
        assert await answer_of(os.path.join(folder, "erin.db"), "refund-1") == "yes"
        await close(app)


async def test_read_only_queue_offers_no_answers(fleet):
    folder, clock = fleet
    app = make_app(folder, clock, read_only=True)
    async with app.run_test(size=(120, 40), notifications=True) as pilot:
        await loaded(app, pilot)
        await pilot.press("A")
        await wait_for(pilot, lambda: isinstance(app.screen, ApprovalQueueScreen), what="q")
        await pilot.press("a")
        await pilot.pause(0.1)
        assert isinstance(app.screen, ApprovalQueueScreen)
        assert "Approve" not in screen_text(app)
        assert await answer_of(os.path.join(folder, "bob.db"), "wire-transfer-88") is None
        await close(app)


async def test_unreadable_files_are_rows_with_reasons_and_stay_untouched(fleet):
    folder, clock = fleet
    locked = os.path.join(folder, "busy.db")
    holder = sqlite3.connect(locked, isolation_level=None)
    holder.execute("CREATE TABLE t (x)")
    holder.execute("BEGIN EXCLUSIVE")  # a rollback-journal file locked by another writer
    paths = [
        os.path.join(folder, name) for name in ("ledger.sqlite", "notes.db", "new.db", "busy.db")
    ]
    before = {path: digest(path) for path in paths}
    app = make_app(folder, clock)
    try:
        async with app.run_test(size=(120, 40), notifications=True) as pilot:
            screen = await loaded(app, pilot)
            text = screen_text(app)
            assert "not an onwatch inbox (tables: entries)" in text
            assert "not an onwatch inbox: not a SQLite database" in text
            assert "empty file: not an inbox yet" in text
            assert "locked by another process" in text
            # Enter on one of them: the reason, no switch, no write.
            while screen.cursor_key != "ledger.sqlite":
                await pilot.press("down")
            await pilot.press("enter")
            await wait_for_text(pilot, "ledger: cannot open")
            assert isinstance(app.screen, FleetScreen) and app.inbox is None
            holder.execute("ROLLBACK")
            await wait_for_text(pilot, "busy.db is a SQLite database but not an onwatch")
            await close(app)
    finally:
        holder.close()
    assert {path: digest(path) for path in paths} == before
    assert not os.path.exists(os.path.join(folder, "ledger.sqlite-wal"))


async def test_hostile_names_and_action_texts_stay_inert(fleet):
    folder, clock = fleet
    app = make_app(folder, clock)
    async with app.run_test(size=(120, 40), notifications=True) as pilot:
        screen = await loaded(app, pilot)
        text = screen_text(app)
        assert "[@click…quit[b]x" in text  # the markup is shown, not run (its ends kept)
        assert "\\x1b]0;pwned\\x07" in text and "\x1b" not in text
        # The new approval's toast names the inbox, literally; the title never does.
        async with await Inbox.open(
            os.path.join(folder, f"{HOSTILE_NAME}.db"), clock=clock
        ) as hostile:
            await hostile.request_approval("again", 3600, HOSTILE_ACTION)
        await wait_for_text(pilot, "New approval in [@click=app.quit]quit[b]x")
        assert app.title == title_for(5, 1) == "onwatch · 5 approvals waiting · 1 expiring soon"
        assert "5 approvals waiting · 1 expiring soon" in screen_text(app)  # the toast's words
        assert "\\x1b]0;pwned\\x07 transfer" in screen_text(app)
        await pilot.press("A")
        await wait_for(pilot, lambda: isinstance(app.screen, ApprovalQueueScreen), what="q")
        assert "ok-\\x1b[2J" in screen_text(app)
        assert app.is_running and app.title == title_for(5, 1)  # seeing them answers none
        await close(app)
    assert isinstance(screen, FleetScreen)


async def test_files_appearing_in_the_folder_show_up_live(fleet):
    folder, clock = fleet
    app = make_app(folder, clock)
    async with app.run_test(size=(120, 40), notifications=True) as pilot:
        screen = await loaded(app, pilot)
        async with await Inbox.open(os.path.join(folder, "zed.db"), clock=clock) as zed:
            await zed.ingest("chat", "z-1", {"text": "hi"})
        await wait_for(pilot, lambda: "zed" in names(screen), what="the new inbox")
        os.remove(os.path.join(folder, "notes.db"))
        await wait_for(pilot, lambda: "notes" not in names(screen), what="notes leaving")
        await close(app)


async def test_an_approval_close_to_its_deadline_raises_the_alarm_once(tmp_path):
    folder = str(tmp_path)
    clock = FakeClock(T0)
    async with await Inbox.open(os.path.join(folder, "solo.db"), clock=clock) as solo:
        await solo.request_approval("late-one", 900, "approve the invoice")
    app = OnwatchApp(None, clock=clock, fleet=FolderFleet(folder))
    bells = []
    app.bell = lambda: bells.append(clock.now())
    async with app.run_test(size=(120, 40), notifications=True) as pilot:
        await loaded(app, pilot)
        assert app.title == "onwatch · 1 approval waiting" and not bells
        clock.advance(299)  # 10m01s left: not yet
        app.tick()
        await pilot.pause()
        assert not bells
        clock.advance(1)
        app.tick()
        await wait_for_text(pilot, "late-one expires in 10m00s")
        assert bells == [T0 + 300] and app.title == title_for(1, 1)
        clock.advance(5)
        app.tick()
        await pilot.pause()
        assert bells == [T0 + 300]  # once per request
        clock.advance(600)  # past the deadline: nothing left to answer in time
        app.tick()
        await pilot.pause()
        assert app.title == title_for(1) == "onwatch · 1 approval waiting"
        await close(app)


AGENT = """
import asyncio, sys
sys.path.insert(0, {root!r})
from onwatch.core import Inbox
async def main():
    async with await Inbox.open({path!r}, create=False) as inbox:
        await inbox.request_approval("from-afar", 3600, "ship the release")
asyncio.run(main())
"""


async def test_another_process_adding_an_approval_to_one_of_50_inboxes(tmp_path):
    folder = str(tmp_path / "fleet")
    os.mkdir(folder)
    async with await Inbox.open(os.path.join(folder, "agent-00.db")) as first:
        await first.ingest("chat", "m-1", {"text": "hello"})
    for i in range(1, 50):
        shutil.copy(os.path.join(folder, "agent-00.db"), os.path.join(folder, f"agent-{i:02}.db"))
    app = OnwatchApp(None, clock=SystemClock(), fleet=FolderFleet(folder))
    bells = []
    app.bell = lambda: bells.append(1)
    async with app.run_test(size=(120, 40), notifications=True) as pilot:
        screen = await loaded(app, pilot)
        assert len(screen.order) == 50 and app.title == "onwatch"
        target = os.path.join(folder, "agent-37.db")
        script = AGENT.format(root=ROOT, path=target)
        process = await asyncio.create_subprocess_exec(sys.executable, "-c", script)
        assert await asyncio.wait_for(process.wait(), 30) == 0
        await wait_for_text(pilot, "New approval in agent-37: ship the release", timeout=10)
        assert bells == [1]
        assert app.title == "onwatch · 1 approval waiting"
        assert screen.order[0].name == "agent-37"
        await close(app)


async def test_without_a_fleet_the_app_has_no_fleet_key(seeded):
    inbox, clock, _ = seeded
    app = OnwatchApp(inbox, clock=clock)
    async with app.run_test(size=(120, 40), notifications=True) as pilot:
        await asyncio.wait_for(app.loaded.wait(), 10)
        await pilot.press("0")
        await pilot.press("escape")
        await pilot.pause()
        assert not app.check_action("fleet", ())
        assert "Fleet" not in screen_text(app)
        assert len(app.screen_stack) == 1 and app.inbox is inbox


async def test_work_waiting_with_no_worker_is_its_own_state(tmp_path):
    """`pending 1 · lease none · never`, a worker that released its lease with work left,
    and a timer come due with nobody to fire it: each says "no worker" with how long the
    work has waited, is coloured, sorts with what needs a human, and is counted in the
    header; a worker taking the lease clears it."""
    folder = str(tmp_path)
    clock = FakeClock(T0)
    async with await Inbox.open(os.path.join(folder, "fresh.db"), clock=clock) as fresh:
        await fresh.ingest("chat", "m-1", {"text": "hello?"}, now=T0 - 400)
    async with await Inbox.open(os.path.join(folder, "stopped.db"), clock=clock) as stopped:
        gen = await stopped.acquire("w-1", now=T0 - 200)
        await stopped.ingest("chat", "m-1", {"text": "hi"}, now=T0 - 100)
        await stopped.release("w-1", gen, now=T0 - 90)
    async with await Inbox.open(os.path.join(folder, "timed.db"), clock=clock) as timed:
        await timed.add_timer("digest", T0 + 30, {"to": "ana"})
    async with await Inbox.open(os.path.join(folder, "served.db"), clock=clock) as served:
        await served.ingest("chat", "m-1", {"text": "hi"}, now=T0 - 50)
        await served.acquire("w-2", now=T0 - 10)
    async with await Inbox.open(os.path.join(folder, "broken.db"), clock=clock) as broken:
        await broken.configure(max_attempts=1)
        await broken.ingest("chat", "m-1", {"text": "boom"}, now=T0 - 60)
        gen = await broken.acquire("w-3", now=T0 - 60)
        batch = await broken.claim_batch("w-3", gen, now=T0 - 60)
        await broken.finish("w-3", gen, [e.id for e in batch], error="KeyError", now=T0 - 59)
        await broken.release("w-3", gen, now=T0 - 58)
    app = OnwatchApp(None, clock=clock, fleet=FolderFleet(folder))
    async with app.run_test(size=(120, 40), notifications=True) as pilot:
        screen = await loaded(app, pilot)
        assert names(screen) == ["fresh", "stopped", "broken", "served", "timed"]
        styles = {s.name: screen.rows.painted[s.key].style for s in screen.order}
        assert styles == {
            "fresh": "unserved",
            "stopped": "unserved",
            "broken": "dead",
            "served": "ok",
            "timed": "ok",
        }
        text = screen_text(app)
        assert "no worker · waiting 6m" in text  # fresh: its event arrived 400 s ago
        assert "no worker · waiting 1m" in text  # stopped: released with work left
        assert "5 inboxes · 0 approvals waiting · 2 need a worker" in text
        # The timer comes due: nobody will fire it. Time alone changes the row.
        clock.advance(31)
        app.tick()
        await wait_for(
            pilot,
            lambda: (
                screen.rows.painted.get("timed.db", None) is not None
                and screen.rows.painted["timed.db"].style == "unserved"
            ),
            what="the due timer's inbox to need a worker",
        )
        assert names(screen)[:3] == ["fresh", "stopped", "timed"]
        await wait_for_text(pilot, "3 need a worker")
        # A worker takes fresh's lease: served again, out of the count.
        async with await Inbox.open(os.path.join(folder, "fresh.db"), clock=clock) as fresh:
            await fresh.acquire("w-4")
        await wait_for(
            pilot,
            lambda: (
                screen.rows.painted.get("fresh.db") is not None
                and screen.rows.painted["fresh.db"].style == "ok"
            ),
            what="fresh served",
        )
        await wait_for_text(pilot, "2 need a worker")
        await close(app)


async def test_an_empty_folder_says_how_to_make_an_inbox(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # as typed: `onwatch tui agents`
    folder = "agents"
    os.mkdir(folder)
    app = OnwatchApp(None, clock=FakeClock(T0), fleet=FolderFleet(folder))
    async with app.run_test(size=(80, 24), notifications=True) as pilot:
        await loaded(app, pilot)
        text = screen_text(app)
        assert "0 inboxes" in text and "No inbox in this folder yet" in text
        assert "onwatch init agents/NAME.db" in text
        # The first inbox appears: the hint goes, the row comes.
        async with await Inbox.open(os.path.join(folder, "ana.db")) as ana:
            await ana.ingest("chat", "m-1", {"text": "hi"})
        screen = app.screen
        await wait_for(pilot, lambda: names(screen) == ["ana"], what="ana's row")
        await pilot.pause()
        assert "No inbox in this folder yet" not in screen_text(app)
        await close(app)


async def test_escape_from_an_inbox_opened_from_all_approvals_goes_back_to_that_list(fleet):
    folder, clock = fleet
    app = make_app(folder, clock)
    async with app.run_test(size=(120, 40), notifications=True) as pilot:
        fleet_screen = await loaded(app, pilot)
        await pilot.press("A")
        await wait_for(pilot, lambda: isinstance(app.screen, ApprovalQueueScreen), what="queue")
        await pilot.press("down")  # alice's refund, the second by deadline
        assert app.screen.rows.selected[1].request_id == "refund-ord-991"
        await pilot.press("enter")
        await wait_for(
            pilot,
            lambda: (
                app.inbox is not None
                and app.inbox.path.endswith("alice.db")
                and not isinstance(app.screen, (FleetScreen, ApprovalQueueScreen))
            ),
            what="alice's panes",
        )
        await wait_for_text(pilot, "Approvals · 1 waiting")
        await pilot.press("escape")
        await wait_for(pilot, lambda: isinstance(app.screen, ApprovalQueueScreen), what="back")
        queue = app.screen
        await wait_for(pilot, lambda: bool(queue.items), what="the queue's rows")
        assert queue.rows.selected[1].request_id == "refund-ord-991"  # where it was
        # Escape there goes on back to the fleet; an inbox opened from the fleet goes back
        # to the fleet, and 0 always does.
        await pilot.press("escape")
        await wait_for(pilot, lambda: app.screen is fleet_screen, what="the fleet")
        await pilot.press("enter")
        await wait_for(pilot, lambda: app.screen is not fleet_screen, what="an inbox")
        await pilot.press("escape")
        await wait_for(pilot, lambda: app.screen is fleet_screen, what="the fleet again")
        await pilot.press("A")
        await wait_for(pilot, lambda: isinstance(app.screen, ApprovalQueueScreen), what="queue")
        await pilot.press("enter")
        await wait_for(
            pilot,
            lambda: not isinstance(app.screen, (FleetScreen, ApprovalQueueScreen)),
            what="an inbox from the queue",
        )
        await pilot.press("0")
        await wait_for(pilot, lambda: app.screen is fleet_screen, what="0: the fleet")
        assert len(app.screen_stack) == 2
        await close(app)


def test_a_connected_fleet_worker_answers_for_waiting_approvals_not_for_waiting_work():
    """needs_worker with `watched` (a fleet worker connected): approvals alone wait on their
    answer, which the fleet worker visits for; events or a due timer with nobody holding the
    lease still wait on a worker, and are still said to."""
    from onwatch.core.fleet import InboxSummary
    from onwatch.tui.fleet.desk import needs_worker

    asks = InboxSummary("asks", "asks", "asks", T0, waiting=1)
    assert needs_worker(asks, T0) and not needs_worker(asks, T0, watched=True)
    busy = InboxSummary("busy", "busy", "busy", T0, pending=1, oldest_pending=T0 - 5)
    assert needs_worker(busy, T0) and needs_worker(busy, T0, watched=True)
    due = InboxSummary("due", "due", "due", T0, waiting=1, next_timer_due=T0 - 1)
    assert needs_worker(due, T0, watched=True)


def test_work_waiting_under_a_connected_fleet_worker_waits_for_a_visit_not_a_worker():
    """The lease cell of an inbox whose work nobody holds: "no worker" while no fleet worker
    is connected; with one connected, the inbox waits for its visit (a free slot), and the
    cell said "no worker" all the same."""
    from onwatch.core.fleet import InboxSummary
    from onwatch.tui.fleet.screen import lease_cell

    busy = InboxSummary("busy", "busy", "busy", T0, pending=1, oldest_pending=T0 - 5)
    assert lease_cell(busy, T0, narrow=False).plain == "no worker · waiting 5s"
    assert lease_cell(busy, T0, narrow=False, watched=True).plain == "fleet · waiting 5s"
    assert lease_cell(busy, T0, narrow=True, watched=True).plain == "queued 5s"


async def test_a_clock_tick_that_lands_while_the_app_shuts_down_does_nothing(fleet):
    """The clock and the fleet's scan are timers: one can fire after the last screen has
    been popped on the way out. It must find nothing to move and return, never raise."""
    folder, clock = fleet
    app = make_app(folder, clock)
    async with app.run_test(size=(120, 40), notifications=True) as pilot:
        await loaded(app, pilot)
        await pilot.press("enter")  # an inbox open under the fleet: every pane is there
        await wait_for(pilot, lambda: app.inbox is not None, what="the drill-in")
    assert not app.screen_stack  # shut down: the stack is empty, as when the timer fired
    clock.advance(5)
    app.tick()
    assert app.fleet_desk.view() is None
    await close(app)
