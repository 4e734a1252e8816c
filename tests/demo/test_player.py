"""Pilot tests for the scenario player: real keys, bounded waits, the inbox checked too."""

from __future__ import annotations


from tests import waiting
import pytest

from textual.widgets import Footer

from onwatch.tui.demo.player import SPEEDS, DemoApp, ScenarioPicker
from onwatch.tui.demo.scenarios import SCENARIOS, START, scenario
from onwatch.tui.screens.confirm import ConfirmScreen

SIZE = (120, 40)


@pytest.fixture
async def demo(tmp_path):
    """A player started on scenario 4 (takeover), no picker over it."""
    app = await DemoApp.open(str(tmp_path), scenario("takeover"), pick_first=False)
    yield app
    await app.close_runs()


async def settle(pilot, app, *, until=lambda: True, seconds: float = 15.0) -> None:
    """Let the app finish what a key started: no step running and `until()` true (bounded)."""
    await pilot.pause()
    await waiting.until(
        lambda: not app.busy and until(),
        timeout=seconds,
        what="the player to settle",
        interval=0.01,
        nap=pilot.pause,
    )


def narration(app) -> str:
    return str(app.query_one("#demo-narration").render())


def head(app) -> str:
    return str(app.query_one("#demo-state").render())


async def test_space_steps_and_the_panes_read_the_real_inbox(demo):
    async with demo.run_test(size=SIZE) as pilot:
        await demo.loaded.wait()
        assert "Press space" in narration(demo)
        await pilot.press("space")
        await settle(pilot, demo, until=lambda: demo.playing.position == 1)
        assert (await demo.inbox.counts())["pending"] == 1
        assert narration(demo) == demo.playing.narration[-1]
        assert "msg-3" in narration(demo)
        for _ in range(3):
            await pilot.press("space")
            await settle(pilot, demo)
        await settle(pilot, demo, until=lambda: demo.playing.position == 4)
        lease = await demo.inbox.lease_info()
        assert (lease.holder, lease.gen) == ("worker-B", 2)
        assert "generation 2" in narration(demo)
        assert "clock t+2m11s" in head(demo)  # the simulated clock is shown
        assert demo.query_one("#panes").current == "running"  # the step's pane is shown
        running = demo.pane("running")
        assert [r.source_id for r in running.records()] == ["msg-3"]


async def test_space_marks_nothing_in_a_pane_while_the_player_runs(demo):
    async with demo.run_test(size=SIZE) as pilot:
        await demo.loaded.wait()
        await pilot.press("space")
        await settle(pilot, demo, until=lambda: demo.playing.position == 1)
        assert "marked" not in str(demo.active_pane.border_subtitle or "")


async def test_autoplay_plays_to_the_end_and_stops(demo):
    async with demo.run_test(size=SIZE) as pilot:
        await demo.loaded.wait()
        for _ in range(len(SPEEDS)):
            await pilot.press("plus")
        assert demo.speed == SPEEDS[0]
        await pilot.press("g")
        assert demo.autoplaying
        assert "autoplay" in head(demo)
        await settle(
            pilot, demo, until=lambda: demo.playing.finished and not demo.autoplaying, seconds=30
        )
        event = (await demo.inbox.events("done"))[0]
        assert (event.source_id, event.attempts) == ("msg-3", 2)
        assert (await demo.inbox.lease_info()).gen == 3
        assert len(await demo.inbox.held_messages()) == 1
        assert demo.playing.stage.results["a_late_finish"] is False
        assert "End of this scenario" in str(demo.query_one("#demo-next").render())


async def test_autoplay_stops_on_g_and_speed_keys_move_the_interval(demo):
    async with demo.run_test(size=SIZE) as pilot:
        await demo.loaded.wait()
        start = demo.speed
        await pilot.press("minus")
        assert demo.speed > start
        await pilot.press("plus", "plus")
        assert demo.speed < start
        await pilot.press("g")
        assert demo.autoplaying
        await pilot.press("g")
        await settle(pilot, demo)
        assert not demo.autoplaying


async def test_restart_replays_on_a_fresh_inbox(demo):
    async with demo.run_test(size=SIZE) as pilot:
        await demo.loaded.wait()
        for _ in range(4):
            await pilot.press("space")
            await settle(pilot, demo)
        await settle(pilot, demo, until=lambda: demo.playing.position == 4)
        first_path = demo.inbox.path
        await pilot.press("b")
        await settle(pilot, demo, until=lambda: demo.playing.position == 0)
        assert demo.inbox.path != first_path
        assert demo.clock.now() == START
        assert await demo.inbox.lease_info() is None
        assert sum((await demo.inbox.counts()).values()) == 0
        assert "step 0 of 7" in head(demo)
        await pilot.press("space")
        await settle(pilot, demo, until=lambda: demo.playing.position == 1)
        assert (await demo.inbox.counts())["pending"] == 1


async def test_pick_a_scenario_from_the_list(tmp_path):
    app = await DemoApp.open(str(tmp_path), SCENARIOS[0], pick_first=True)
    try:
        async with app.run_test(size=SIZE) as pilot:
            await app.loaded.wait()
            await settle(pilot, app, until=lambda: isinstance(app.screen, ScenarioPicker))
            await pilot.press("space")  # belongs to the list, not to the player
            await pilot.pause()
            assert app.playing.position == 0
            await pilot.press("down", "down", "down", "down", "enter")  # 1 → 5
            await settle(pilot, app, until=lambda: app.scenario.key == "poison")
            assert not isinstance(app.screen, ScenarioPicker)
            assert app.query_one("#panes").current == "pending"
            for _ in range(len(app.scenario.steps)):
                await pilot.press("space")
                await settle(pilot, app)
            await settle(pilot, app, until=lambda: app.playing.finished)
            [dead] = await app.inbox.events("dead")
            assert (dead.source_id, dead.attempts) == ("mail-poison", 3)
            assert app.query_one("#panes").current == "dead"
            assert [r.source_id for r in app.pane("dead").records()] == ["mail-poison"]
            # l opens the list again; escape keeps the current scenario.
            await pilot.press("l")
            await settle(pilot, app, until=lambda: isinstance(app.screen, ScenarioPicker))
            await pilot.press("escape")
            await settle(pilot, app, until=lambda: not isinstance(app.screen, ScenarioPicker))
            assert app.scenario.key == "poison" and app.playing.finished
    finally:
        await app.close_runs()


async def test_a_scenario_is_picked_by_typing_its_number(tmp_path):
    app = await DemoApp.open(str(tmp_path), SCENARIOS[0], pick_first=True)
    try:
        async with app.run_test(size=SIZE) as pilot:
            await app.loaded.wait()
            await settle(pilot, app, until=lambda: isinstance(app.screen, ScenarioPicker))
            picker = app.screen
            listing = picker.query_one("#picker-list")
            await pilot.press("4")
            assert listing.highlighted == 3
            await pilot.press("1", "2")  # twelve: both digits name one scenario
            assert listing.highlighted == 11
            await pilot.press("9")  # "129" is none: the 9 starts over
            assert listing.highlighted == 8
            await pilot.press("0")  # "90" and "0" are none: the highlight stays
            assert listing.highlighted == 8
            await pilot.press("1", "1", "enter")
            await settle(pilot, app, until=lambda: app.scenario.number == 11)
            assert not isinstance(app.screen, ScenarioPicker)
    finally:
        await app.close_runs()


async def test_next_scenario_key(demo):
    async with demo.run_test(size=SIZE) as pilot:
        await demo.loaded.wait()
        await pilot.press("n")
        await settle(pilot, demo, until=lambda: demo.scenario.number == 5)
        assert "Scenario 5 of 12" in str(demo.query_one("#demo-title").render())


async def test_player_keys_are_bindings_listed_first_in_the_footer(demo):
    async with demo.run_test(size=SIZE) as pilot:
        await demo.loaded.wait()
        await pilot.pause()
        actions = [a.binding.action for a in demo.screen.active_bindings.values() if a.binding.show]
        assert actions[:7] == [
            "step",
            "autoplay",
            "faster",
            "slower",
            "restart",
            "next_scenario",
            "pick",
        ]
        for binding in DemoApp.BINDINGS:
            assert binding.description and binding.id


async def test_times_are_the_simulated_clocks_never_1970_dates(demo):
    """The player's clock is simulated and starts in January 1970: the detail, the Timers
    pane and the confirmations word its instants as the bar does ('t+2m11s')."""
    from onwatch.tui.screens.detail import DetailScreen

    async with demo.run_test(size=SIZE) as pilot:
        await demo.loaded.wait()
        for _ in range(4):
            await pilot.press("space")
            await settle(pilot, demo)
        await settle(pilot, demo, until=lambda: demo.playing.position == 4)
        assert demo.query_one("#panes").current == "running"
        await pilot.press("enter")
        await settle(pilot, demo, until=lambda: isinstance(demo.screen, DetailScreen))
        body = demo.screen.body.plain
        assert "1970" not in body
        assert "created     t+0s" in body  # msg-3 arrived at the scenario's start
        assert "claimed t+10s" in body and "claimed t+2m11s" in body  # A's run, then B's
        await pilot.press("escape")
        await settle(pilot, demo, until=lambda: not isinstance(demo.screen, DetailScreen))


async def test_viewer_can_act_on_the_demo_inbox(tmp_path):
    """The desk's own keys work in the demo: the viewer approves refund-1 in time."""
    app = await DemoApp.open(str(tmp_path), scenario("approval-expiry"), pick_first=False)
    try:
        async with app.run_test(size=SIZE) as pilot:
            await app.loaded.wait()
            await pilot.press("space")
            await settle(pilot, app, until=lambda: app.playing.position == 1)
            assert app.query_one("#panes").current == "approvals"
            await settle(pilot, app, until=lambda: len(list(app.pane("approvals").records())))
            await pilot.press("a")
            await settle(pilot, app, until=lambda: isinstance(app.screen, ConfirmScreen))
            # The deadline in the simulated clock's words, as the player's bar shows it.
            left = str(app.screen.query_one("#left-0").render())
            assert "(expires at t+4h00m)" in left, left
            await pilot.press("y")

            async def answered():
                approval = await app.inbox.get_approval("refund-1")
                return approval if approval.answer is not None else None

            approval = await waiting.until(
                answered, timeout=15, what="the approval answered", nap=pilot.pause
            )
            assert approval.answer == "yes" and approval.answered_by == "viewer"
            await pilot.press("space")  # the expiry timer has nothing left to expire
            await settle(pilot, app, until=lambda: app.playing.position == 2)
            assert "'yes'" in narration(app)
    finally:
        await app.close_runs()


async def test_narration_is_shown_literally(tmp_path):
    """Narrations quote inbox text: markup and control characters must not come alive."""
    from onwatch.tui.demo.scenarios import Scenario, Step

    hostile = "[@click=app.quit]quit[/] [bold]x[/bold] \x1b]0;pwned\x07"

    async def act(stage):
        await stage.inbox.ingest("webhook", hostile, {"text": hostile})
        return f"stored {hostile}"

    trap = Scenario(99, "hostile", "Hostile text", "Text from a webhook.", (Step("x", act),))
    app = await DemoApp.open(str(tmp_path), trap, pick_first=False)
    try:
        async with app.run_test(size=SIZE) as pilot:
            await app.loaded.wait()
            await pilot.press("space")
            await settle(pilot, app, until=lambda: app.playing.position == 1)
            shown = narration(app)
            assert "[@click=app.quit]quit[/]" in shown and "[bold]x[/bold]" in shown
            assert "\x1b" not in shown and "\\x1b" in shown
            assert app.is_running  # the "button" did not quit the app
    finally:
        await app.close_runs()


async def test_screenshot_script_captures_the_key_moment(tmp_path):
    from onwatch.tui.demo.screenshots import capture

    path = await capture(scenario("poison"), tmp_path)
    svg = path.read_text()
    assert path.name == "demo-poison.svg"
    assert "mail-poison" in svg and "dead" in svg and "Scenario&#160;5" in svg


async def test_at_80_columns_no_key_shows_through_beside_the_command_palette_key(demo):
    """The player's keys run past 80 columns, under the command palette's key docked at the
    footer's right end. Its last column is the palette key's own: a key beneath it once
    showed through there ("^p palettee")."""
    async with demo.run_test(size=(80, 24)) as pilot:
        await demo.loaded.wait()
        await pilot.press("g")  # autoplay: the footer's longest set of keys
        await pilot.pause()
        footer = demo.screen.query_one(Footer)
        palette = footer.query_one("FooterKey.-command-palette")
        widget, _ = demo.get_widget_at(footer.region.right - 1, footer.region.y)
        assert widget is palette
