"""The fleet desk over every inbox of one PostgreSQL database, against a real server (skipped,
with the reason, where none can be had): 50 inboxes listed, another process's approval raising
the alarm, an answer from the `A` queue landing in that inbox, a new inbox showing up live,
drilling into one inbox, and `onwatch tui postgresql://…` choosing the fleet or one inbox."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys

import pytest

from onwatch.core import Inbox, SystemClock
from onwatch.core.fleet import DatabaseFleet
from tests.pg.server import cluster_or_skip
from tests.worker.helpers import env
from onwatch.tui.app import OnwatchApp
from onwatch.tui.fleet import FleetScreen
from onwatch.tui.fleet.queue import ApprovalQueueScreen
from onwatch.tui.screens.confirm import ConfirmScreen

from .conftest import screen_text, wait_for, wait_for_text

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
INBOXES = 50

AGENT = """
import asyncio, sys
sys.path.insert(0, {root!r})
from onwatch.core import Inbox
async def main():
    async with await Inbox.open({url!r}, name={name!r}, create=False) as inbox:
        await inbox.request_approval("from-afar", 3600, "ship the release")
asyncio.run(main())
"""


@pytest.fixture
def database() -> str:
    """A fresh onwatch database with 50 inboxes, agent-00 … agent-49 (one event each)."""
    url = cluster_or_skip().new_database()

    async def fill() -> None:
        for i in range(INBOXES):
            async with await Inbox.open(url, name=f"agent-{i:02}") as inbox:
                await inbox.ingest("chat", "m-1", {"text": "hello"})

    asyncio.run(fill())
    return url


async def loaded(app, pilot) -> FleetScreen:
    await wait_for(
        pilot,
        lambda: (
            app.fleet_desk is not None
            and app.fleet_desk.loaded
            and isinstance(app.screen, FleetScreen)
        ),
        what="the first scan",
        timeout=15,
    )
    await pilot.pause()
    return app.screen


async def waiting(url: str, name: str) -> list:
    async with await Inbox.open(url, name=name, create=False) as inbox:
        return await inbox.approvals()


async def test_50_inboxes_listed_and_another_process_raises_the_alarm(database):
    source = DatabaseFleet(database, label="fleet-db")
    app = OnwatchApp(None, clock=SystemClock(), fleet=source)
    bells = []
    app.bell = lambda: bells.append(1)
    try:
        async with app.run_test(size=(120, 40), notifications=True) as pilot:
            screen = await loaded(app, pilot)
            assert len(screen.order) == INBOXES and app.title == "onwatch"
            assert "50 inboxes · 0 approvals waiting · 50 need a worker" in screen_text(app)
            script = AGENT.format(root=ROOT, url=database, name="agent-37")
            process = await asyncio.create_subprocess_exec(sys.executable, "-c", script)
            assert await asyncio.wait_for(process.wait(), 30) == 0
            await wait_for_text(pilot, "New approval in agent-37: ship the release", timeout=10)
            assert bells == [1] and app.title == "onwatch · 1 approval waiting"
            assert screen.order[0].name == "agent-37"
            assert [a.request_id for a in await waiting(database, "agent-37")] == ["from-afar"]
            # Drilling in opens that inbox of the database, by name (the cursor stays on the
            # inbox it was on: home moves it to the first row).
            await pilot.press("home")
            assert screen.rows.selected.name == "agent-37"
            await pilot.press("enter")
            await wait_for(
                pilot,
                lambda: (
                    app.inbox is not None
                    and app.inbox.name == "agent-37"
                    and not isinstance(app.screen, FleetScreen)
                ),
                what="agent-37's panes",
            )
            await pilot.press("4")
            await wait_for_text(pilot, "from-afar", timeout=10)
            # No file beside a database's inbox: s (write held messages to one) is not there.
            assert app.check_action("send_now", ()) is False
            assert "Write out" not in screen_text(app)
            await app.inbox.close()
            app.inbox = None
    finally:
        source.close()


async def test_an_answer_from_the_queue_lands_in_its_inbox(database):
    async with await Inbox.open(database, name="agent-12", create=False) as inbox:
        await inbox.request_approval("refund-7", 3600, "Refund $40 [b]now[/b]")
    source = DatabaseFleet(database)
    app = OnwatchApp(None, clock=SystemClock(), fleet=source, actor="ana")
    try:
        async with app.run_test(size=(120, 40), notifications=True) as pilot:
            await loaded(app, pilot)
            await pilot.press("A")
            await wait_for(
                pilot, lambda: isinstance(app.screen, ApprovalQueueScreen), what="the queue"
            )
            queue = app.screen
            assert [(s.name, a.request_id) for s, a in queue.items] == [("agent-12", "refund-7")]
            await pilot.press("a")
            await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen), what="confirm")
            assert "Refund $40 [b]now[/b]" in screen_text(app)  # literal, never markup
            await pilot.press("y")
            await wait_for_text(pilot, "agent-12: approved refund-7")
            [approval] = await waiting(database, "agent-12")
            assert approval.answer == "yes" and approval.answered_by == "ana"
            await wait_for(pilot, lambda: not queue.items, what="the request leaving the queue")
            row = app.fleet_desk.summaries["agent-12"]
            assert row.waiting == 0 and row.pending == 2  # the answer is an event of its own
    finally:
        source.close()


async def test_a_new_inbox_shows_up_live(database):
    source = DatabaseFleet(database)
    app = OnwatchApp(None, clock=SystemClock(), fleet=source)
    try:
        async with app.run_test(size=(120, 40), notifications=True) as pilot:
            screen = await loaded(app, pilot)
            assert "zz-late" not in {s.name for s in screen.order}
            async with await Inbox.open(database, name="zz-late") as late:
                await late.ingest("chat", "m-1", {"text": "hi"})
            await wait_for(
                pilot,
                lambda: "zz-late" in {s.name for s in screen.order},
                what="the new inbox",
                timeout=10,
            )
            assert len(screen.order) == INBOXES + 1
            assert app.fleet_desk.summaries["zz-late"].pending == 1
    finally:
        source.close()


async def test_a_lost_connection_is_said_once_and_the_fleet_is_read_again(database):
    """The desk's connection is cut (its server process terminated) and the database turns
    new ones away for a while: one toast says so, the rows read before stay, and the scan
    after connections are taken again reads the fleet and says that too. (A session ended
    while idle and replaced at once says nothing: test_idle_sessions.py.)"""
    import psycopg

    name = psycopg.conninfo.conninfo_to_dict(database)["dbname"]
    elsewhere = database.rsplit("/", 1)[0] + "/postgres"  # the server's own database

    source = DatabaseFleet(database)
    app = OnwatchApp(None, clock=SystemClock(), fleet=source)
    # Every toast the desk asks for, in order: the app's own list is filled by a message that
    # arrives a turn later, and drops a toast whose time is up (a slow reconnection).
    toasts: list[str] = []
    notify = app.notify

    def recorded(message, *args, **kwargs):
        toasts.append(str(message))
        return notify(message, *args, **kwargs)

    app.notify = recorded
    try:
        async with app.run_test(size=(120, 40), notifications=True) as pilot:
            await loaded(app, pilot)
            desk = app.fleet_desk
            with psycopg.connect(elsewhere, autocommit=True) as admin:
                admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS false')
                admin.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE datname = %s AND pid <> pg_backend_pid()",
                    (name,),
                )
            await wait_for(
                pilot, lambda: desk.failure is not None, what="the lost connection", timeout=10
            )
            assert "lost the connection" in desk.failure
            assert len(desk.summaries) == INBOXES  # what was read last stays on screen
            with psycopg.connect(elsewhere, autocommit=True) as admin:
                admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true')
            await wait_for(pilot, lambda: desk.failure is None, what="the reconnection", timeout=15)
            assert sum("cannot scan the fleet" in m for m in toasts) == 1
            assert sum("read again" in m for m in toasts) == 1
            await wait_for(
                pilot,
                lambda: any("read again" in str(n.message) for n in app._notifications),
                what="the toast on screen",
            )
    finally:
        source.close()


def test_tui_on_a_url_opens_the_fleet_or_one_inbox(database, monkeypatch):
    from onwatch import cli
    from onwatch.tui import app as app_module

    calls = []
    monkeypatch.setattr(
        app_module,
        "run_fleet",
        lambda target, read_only=False, actor=None: calls.append(("fleet", target, actor)) or 0,
    )
    monkeypatch.setattr(
        app_module,
        "run",
        lambda path, read_only=False, name="default", actor=None: (
            calls.append(("inbox", path, name, actor)) or 0
        ),
    )
    monkeypatch.setenv("ONWATCH_ACTOR", "ana")
    assert cli.main(["tui", database]) == 0
    assert cli.main(["tui", database, "--inbox", "agent-03", "--actor", "bo"]) == 0
    assert calls == [("fleet", database, "ana"), ("inbox", database, "agent-03", "bo")]


def test_a_database_that_is_not_onwatch_is_refused_in_one_line(capsys):
    url = cluster_or_skip().new_database(schema=False)
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE TABLE ledger (x int)")
    from onwatch.tui import app as app_module

    assert app_module.run_fleet(url) == 2
    err = capsys.readouterr().err
    assert err.startswith("onwatch: ") and "not an onwatch database" in err
    assert err.count("\n") == 1
    with psycopg.connect(url) as conn:  # untouched: no onwatch table was made
        assert conn.execute("SELECT to_regclass('onwatch_schema')").fetchone()[0] is None


async def test_summaries_say_how_long_work_waits_for_a_worker(database):
    """The database's summary carries what the file's does: the oldest pending event's
    arrival and the soonest timer, so the desk can say that nobody serves the work."""
    async with await Inbox.open(database, name="agent-03", create=False) as inbox:
        first = (await inbox.events("pending"))[0]
        await inbox.ingest("chat", "m-2", {"text": "later"}, now=first.created + 500)
        await inbox.add_timer("digest", 2_000_000_000, {"to": "ana"})
    source = DatabaseFleet(database)
    try:
        scan = await asyncio.to_thread(source.scan, first.created + 600, {})
    finally:
        source.close()
    summary = scan.summaries["agent-03"]
    assert summary.pending == 2 and summary.oldest_pending == first.created
    assert summary.next_timer_due == 2_000_000_000
    assert summary.waiting_since(first.created + 600) == first.created
    assert not summary.served(first.created + 600)
    idle = scan.summaries["agent-04"]
    assert idle.next_timer_due is None and idle.oldest_pending is not None


def lease_of(app, name: str) -> str:
    """The lease cell of inbox `name`'s row, as on screen."""
    line = next(line for line in screen_text(app).splitlines() if line.split()[:1] == [name])
    start = screen_text(app).splitlines()[2].index("lease")
    return line[start : start + 26].strip()


def start_fleet_worker(url: str, tmp_path) -> subprocess.Popen:
    """`onwatch worker URL --all-inboxes` in a process of its own."""
    return subprocess.Popen(
        [sys.executable, "-m", "onwatch", "worker", url, "--all-inboxes"]
        + ["--agent", "tests.pg.actors:io_bound", "--holder", "fleet-1"],
        cwd=ROOT,
        env=env(tmp_path),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


async def test_an_inbox_between_a_fleet_workers_visits_is_not_taken_for_one_nobody_serves(
    tmp_path,
):
    """A fleet worker lets go of an inbox's lease between visits. An inbox whose approval
    waits (nothing to run until the answer or the deadline) is then unleased, yet served: while
    a fleet worker is connected the desk says so, and does not count the inbox as needing a
    worker. A fleet worker killed with SIGKILL stops counting with its session, and the inbox
    is flagged again."""
    url = cluster_or_skip().new_database()
    async with await Inbox.open(url, name="asks") as inbox:
        await inbox.request_approval("refund-1", 3600, "refund 40")
    source = DatabaseFleet(url, label="fleet-db")
    app = OnwatchApp(None, clock=SystemClock(), fleet=source)
    fleet = None
    try:
        async with app.run_test(size=(120, 40)) as pilot:
            await loaded(app, pilot)
            await wait_for_text(pilot, "1 needs a worker")
            assert lease_of(app, "asks") == "no worker · never started"
            fleet = start_fleet_worker(url, tmp_path)
            await wait_for_text(pilot, "1 fleet worker", timeout=30)
            text = screen_text(app)
            assert "need" not in text.splitlines()[0]
            assert lease_of(app, "asks") == "none"
            fleet.send_signal(signal.SIGKILL)
            fleet.wait(timeout=10)
            await wait_for_text(pilot, "1 needs a worker", timeout=15)
            assert "fleet worker" not in screen_text(app).splitlines()[0]
            assert lease_of(app, "asks") == "no worker · never started"
    finally:
        if fleet is not None and fleet.poll() is None:
            fleet.kill()
            fleet.wait(timeout=10)
        source.close()


async def test_a_stopped_fleet_worker_is_said_silent_and_serves_nothing(tmp_path, monkeypatch):
    """A fleet worker stopped with SIGSTOP (a debugger, a frozen container) keeps its session
    and its lock: the kernel still answers for its socket. Counted as connected, it hid the
    inboxes it no longer serves. Its look stops, and with it the session's activity: once
    idle for SILENT_AFTER (shortened here), the desk says it is silent and flags the inbox as
    needing a worker again; resumed (SIGCONT), it serves and is counted again."""
    monkeypatch.setattr("onwatch.core.pg.summaries.SILENT_AFTER", 5.0)
    url = cluster_or_skip().new_database()
    async with await Inbox.open(url, name="asks") as inbox:
        await inbox.request_approval("refund-1", 3600, "refund 40")
    source = DatabaseFleet(url, label="fleet-db")
    app = OnwatchApp(None, clock=SystemClock(), fleet=source)
    fleet = start_fleet_worker(url, tmp_path)
    try:
        async with app.run_test(size=(120, 40)) as pilot:
            await loaded(app, pilot)
            await wait_for_text(pilot, "1 fleet worker connected", timeout=30)
            assert "need" not in screen_text(app).splitlines()[0]
            fleet.send_signal(signal.SIGSTOP)
            await wait_for_text(pilot, "1 fleet worker silent", timeout=30)
            header = screen_text(app).splitlines()[0]
            assert "1 needs a worker" in header and "connected" not in header
            assert lease_of(app, "asks") == "no worker · never started"
            fleet.send_signal(signal.SIGCONT)
            await wait_for_text(pilot, "1 fleet worker connected", timeout=30)
            header = screen_text(app).splitlines()[0]
            assert "silent" not in header and "need" not in header
    finally:
        fleet.send_signal(signal.SIGCONT)
        fleet.kill()
        fleet.wait(timeout=10)
        source.close()
