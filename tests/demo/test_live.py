"""The live demo with real worker processes: kill the active one, watch the takeover.

Real OS processes on a real clock (lease 5 s), so these take tens of seconds: marked slow.
"""

from __future__ import annotations


from tests.waiting import until
import pytest

from onwatch.tui.demo.live import LiveDemoApp, open_scratch_inbox

pytestmark = pytest.mark.slow


async def wait_for(pilot, condition, *, seconds: float, what: str) -> None:
    """Poll `condition` (an async callable) until true, for at most `seconds`."""
    await until(condition, timeout=seconds, what=what, interval=0.1, nap=pilot.pause)


async def test_kill_the_active_worker_under_both_policies(tmp_path):
    inbox = await open_scratch_inbox(str(tmp_path))
    # A run long enough to be seen running (and killed) on a loaded machine: pressing i
    # returns only after the desk has re-read every pane, which can take seconds there.
    app = LiveDemoApp(inbox, str(tmp_path), workers=2, agent_seconds=6)
    try:
        async with app.run_test(size=(120, 40)) as pilot:

            async def leased():
                lease = await inbox.lease_info()
                return lease is not None and lease.until >= inbox.now()

            await wait_for(pilot, leased, seconds=20, what="a worker to take the lease")
            first = await inbox.lease_info()

            # Policy retry: the killed run's events run again under the next generation.
            await pilot.press("i")

            async def running(n=3):
                return (await inbox.counts()).get("running", 0) == n

            async def offers_the_kill():
                # K applies once the desk has itself seen the live holder (it looks every
                # OBSERVE_SECONDS); pressed before that, the key is greyed and does nothing.
                return app.check_action("kill", ()) is True

            await wait_for(pilot, running, seconds=20, what="the run of three messages")
            await wait_for(pilot, offers_the_kill, seconds=5, what="the desk to offer K")
            await pilot.press("K")
            await wait_for(
                pilot,
                lambda: _true(any(p.killed for p in app.processes)),
                seconds=5,
                what="the kill",
            )

            async def taken_over():
                lease = await inbox.lease_info()
                return lease is not None and lease.gen == first.gen + 1

            await wait_for(pilot, taken_over, seconds=15, what="the takeover")
            second = await inbox.lease_info()
            assert second.holder != first.holder

            async def all_done():
                return (await inbox.counts()).get("done", 0) == 3

            await wait_for(pilot, all_done, seconds=20, what="the retried events")
            assert sorted(e.attempts for e in await inbox.events("done")) == [2, 2, 2]
            assert any("took over as generation" in line for line in app.story)

            # Policy interrupt: the same crash leaves the events for a human.
            await pilot.press("t")
            await wait_for(
                pilot,
                lambda: _true(inbox.settings.on_lost_claim == "interrupt"),
                seconds=5,
                what="the policy switch",
            )
            await pilot.press("i")
            await wait_for(pilot, running, seconds=20, what="the second run")
            await wait_for(pilot, offers_the_kill, seconds=5, what="the desk to offer K again")
            await pilot.press("K")
            await wait_for(
                pilot,
                lambda: _true(sum(p.killed for p in app.processes) == 2),
                seconds=5,
                what="the second kill",
            )
            await pilot.press("w")  # no standby left: start one

            async def interrupted():
                return (await inbox.counts()).get("interrupted", 0) == 3

            await wait_for(pilot, interrupted, seconds=20, what="the interrupted events")
            assert (await inbox.lease_info()).gen == second.gen + 1
            assert (await inbox.counts()).get("pending", 0) == 0
            await wait_for(
                pilot,
                lambda: _true(app.query_one("#panes").current == "dead"),
                seconds=5,
                what="the Dead & interrupted pane to be shown",
            )
            assert any("Policy interrupt" in line for line in app.story)
    finally:
        app.stop_workers()
        await inbox.close()
    assert not any(p.alive for p in app.processes)


async def _true(value: bool) -> bool:
    return value


async def test_the_live_narrator_does_not_read_under_a_dialog(tmp_path):
    """Like the desk's own poll, the narrator's look at the inbox waits while a dialog is
    open (no reads, no pane switched under the viewer's dialog)."""
    from onwatch.tui.screens.help import HelpScreen

    inbox = await open_scratch_inbox(str(tmp_path))
    app = LiveDemoApp(inbox, str(tmp_path), workers=0)  # no processes: only the narrator
    try:
        async with app.run_test(size=(120, 40)) as pilot:
            await app.loaded.wait()
            await pilot.press("question_mark")
            assert isinstance(app.screen, HelpScreen)
            await app.workers.wait_for_complete()
            reads = 0
            original = inbox.overview

            async def counting(*args, **kwargs):
                nonlocal reads
                reads += 1
                return await original(*args, **kwargs)

            inbox.overview = counting
            try:
                for _ in range(15):  # three narrator intervals
                    await pilot.pause(0.1)
            finally:
                del inbox.overview
            assert reads == 0
    finally:
        app.stop_workers()
        await inbox.close()
