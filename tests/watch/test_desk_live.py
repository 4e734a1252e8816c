"""The desk follows a running event's transcript live, written by a worker in another
process (ctx.log, logging, a thread the run started), and every line survives the worker's
SIGKILL: the next attempt's detail shows it next to the run that was lost."""

from __future__ import annotations

import signal

from onwatch.core import Inbox
from onwatch.tui.app import OnwatchApp
from onwatch.tui.screens.detail import DetailScreen, load_detail
from textual.widgets import RichLog

from tests.tui.conftest import screen_text, started, wait_for
from tests.worker.helpers import query, stop

from .helpers import say, said, start_worker
from .helpers import wait_for as wait_until

SIZE = (120, 40)
STEPS = (
    ("log", "hello from ctx.log"),
    ("logging", "hello from logging"),
    ("thread", "hello from a thread the run started"),
)


def live_text(app) -> str:
    screen = app.screen
    if not isinstance(screen, DetailScreen) or screen.follow is None:
        return ""
    return "\n".join(strip.text for strip in screen.query_one("#live", RichLog).lines)


async def _open_running_detail(app, pilot) -> None:
    await started(app, pilot)
    await pilot.press("2")
    await wait_for(pilot, lambda: app.pane("running").records(), what="the running event")
    await pilot.press("enter")
    await wait_for(
        pilot,
        lambda: isinstance(app.screen, DetailScreen) and app.screen.follow is not None,
        what="the running event's detail, following its run",
    )


async def test_lines_from_a_worker_process_reach_the_desk_live_and_survive_sigkill(tmp_path):
    path = str(tmp_path / "inbox.db")
    async with await Inbox.open(path) as setup:
        await setup.configure(lease_ttl=2)  # the successor takes over soon after the kill
        await setup.ingest("chat", "m-1", {"text": "hi"})
    worker = start_worker(path, "talker", tmp_path)
    try:
        wait_until(
            lambda: query(path, "SELECT status FROM events WHERE id = 1") == [("running",)],
            what="the worker to claim the event",
        )
        inbox = await Inbox.open(path, create=False)
        try:
            app = OnwatchApp(inbox)
            async with app.run_test(size=SIZE) as pilot:
                await _open_running_detail(app, pilot)
                for n, (kind, text) in enumerate(STEPS, 1):
                    assert text not in live_text(app)
                    say(tmp_path, n, f"{kind} {text}")
                    # No key pressed: the line comes to the screen by itself.
                    await wait_for(pilot, lambda t=text: t in live_text(app), what=text)
                    assert said(tmp_path, n) is not None
                assert "[agent.talker]" not in live_text(app)
                assert "agent.talker: hello from logging" in live_text(app)
                worker.send_signal(signal.SIGKILL)
                worker.wait(10)
        finally:
            await inbox.close()
        # What the desk showed was committed: another connection, after the kill, reads it.
        async with await Inbox.open(path, create=False) as reader:
            [run] = await reader.runs(1)
            lines = (await reader.transcript(run.id)).lines
            assert [(line.level, line.logger, line.text) for line in lines] == [
                ("log", None, STEPS[0][1]),
                ("warning", "agent.talker", STEPS[1][1]),
                ("warning", "agent.talker", STEPS[2][1]),
            ]
            assert lines[0].fields == {"step": 1}
        # The next worker recovers the lost run; its attempt ends, and the event's detail
        # shows both attempts, the lost one's transcript included.
        say(tmp_path, len(STEPS) + 1, "end")
        worker = start_worker(path, "talker", tmp_path, name="successor")
        wait_until(
            lambda: query(path, "SELECT status FROM events WHERE id = 1") == [("done",)],
            timeout=30,
            what="the second attempt to finish",
        )
        async with await Inbox.open(path, create=False) as inbox:
            runs = await inbox.runs(1)
            assert [r.outcome for r in runs] == ["lost", "done"]
            detail = await load_detail(inbox, await inbox.get_event(1), inbox.now())
            assert detail.follow is None  # done: nothing to follow
            body = detail.body.plain
            lost, done = body.index("→ lost"), body.index("→ done")
            for _, text in STEPS:  # each attempt's transcript under its own run
                assert lost < body.index(text) < done < body.rindex(text)
            app = OnwatchApp(inbox)
            async with app.run_test(size=SIZE) as pilot:
                await started(app, pilot)
                await app.push_screen(DetailScreen(detail.title, detail.body))
                await wait_for(pilot, lambda: "→ lost" in screen_text(app), what="the detail")
    finally:
        stop(worker)
