"""The scenario player: the real supervisor TUI over a scratch inbox, driven step by step.

`DemoApp` is the supervisor app (`tui.app.OnwatchApp`) with a player bar under its panes: the
scenario, the step, the simulated clock, the narration line and (on a wide terminal) the list of
steps; `ScenarioPicker` lists the scenarios. Each step drives only the core
API (`tui.demo.scenarios`); the panes then re-read the inbox like they would for a real agent,
so what the viewer sees is what the rules did. Every scenario (and every restart) plays on a
fresh scratch inbox file; the app is switched over to it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import tempfile
from dataclasses import dataclass

from rich.table import Table
from rich.text import Text
from textual import events
from textual.actions import SkipAction
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.timer import Timer
from textual.widget import Widget
from textual.widgets import Label, OptionList, Static
from textual.widgets.option_list import Option

from onwatch.core import FakeClock

from ..panes import Window
from ..safe import safe_content
from ..timefmt import Times
from .desk import DemoDesk
from .scenarios import SCENARIOS, START, Scenario, ScenarioRun, since_start

SPEEDS = (0.5, 1.0, 2.0, 3.0, 5.0, 8.0)  # seconds per step in autoplay
WIDE_BAR = (100, 30)  # the least size that shows the step list and the hints
DEFAULT_SPEED = 3  # index into SPEEDS: 3 s per step, time to read a narration line


class SimulatedTimes(Times):
    """The player's instants as offsets from the scenario's start ('t+2m11s'), as its bar
    shows the clock: that clock is simulated and starts in January 1970, so a date or a
    time of day would be noise (the detail view said 1970-01-12)."""

    def stamp(self, at: int | None) -> str:
        return "—" if at is None else since_start(at)

    def clock(self, at: int | None, *, seconds: bool = False) -> str:
        return "—" if at is None else since_start(at)


@dataclass(frozen=True, slots=True)
class PlayerView:
    """Everything the player bar shows, handed down by the app."""

    scenario: Scenario
    position: int
    now: int
    narration: str
    autoplay: bool
    speed: float
    busy: bool = False


def _count(total: int) -> str:
    return f"{total} scenario{'s' if total != 1 else ''}"


class StepList(Vertical):
    """The scenario's whole story, step by step, with where the player is."""

    def compose(self) -> ComposeResult:
        yield Static("", id="steps-body")

    def show(self, view: PlayerView) -> None:
        body = Table.grid(padding=(0, 1))
        body.add_column(width=1)
        body.add_column(width=2, justify="right")
        body.add_column(ratio=1)
        for index, step in enumerate(view.scenario.steps):
            if index < view.position:
                mark, style = "✓", "dim" if index < view.position - 1 else "bold"
            elif index == view.position:
                mark, style = "▶", ""
            else:
                mark, style = "", "dim"
            body.add_row(
                Text(mark, style=style),
                Text(str(index + 1), style=style),
                Text(step.title, style=style),
            )
        self.query_one("#steps-body", Static).update(body)


class PlayerBar(Horizontal):
    """Under the panes: which scenario and step, the simulated clock, the narration, and (on a
    wide terminal) the list of steps."""

    def compose(self) -> ComposeResult:
        with Vertical(id="demo-main"):
            yield Label("", id="demo-title")
            yield Label("", id="demo-state")
            yield Static("", id="demo-narration")
            yield Static("", id="demo-watch")
            yield Label("", id="demo-next")
        yield StepList(id="steps")

    def show(self, view: PlayerView) -> None:
        scenario = view.scenario
        steps = len(scenario.steps)
        title = Text(
            f"Scenario {scenario.number} of {len(SCENARIOS)}: {scenario.title}",
            no_wrap=True,
            overflow="ellipsis",
            end="",
        )
        self.query_one("#demo-title", Label).update(title)
        state = f"step {view.position} of {steps} · simulated clock {since_start(view.now)}"
        state += f" · ▶ autoplay, {view.speed:g} s a step" if view.autoplay else " · autoplay off"
        self.query_one("#demo-state", Label).update(
            Text(state, no_wrap=True, overflow="ellipsis", end="")
        )
        self.set_class(view.autoplay, "-autoplay")
        # The narration quotes inbox text (sources, errors): it goes through the safe helper.
        self.query_one("#demo-narration", Static).update(safe_content(view.narration, limit=1000))
        self.query_one("#demo-watch", Static).update(Text(scenario.watch))
        if view.busy:
            hint = "…"
        elif view.position < steps:
            hint = f"Next: {scenario.steps[view.position].title} — press space"
        else:
            hint = "End of this scenario — b plays it again, n the next one, l lists all"
        self.query_one("#demo-next", Label).update(
            Text(hint, no_wrap=True, overflow="ellipsis", end="")
        )
        self.query_one(StepList).show(view)


class ScenarioPicker(ModalScreen[int | None]):
    """The list of scenarios; Enter plays the highlighted one, Escape keeps the current one.
    Typing a scenario's number highlights it (1 then 2 is twelve; a digit that makes no
    scenario's number starts over), so the numbers shown are also the keys."""

    BINDINGS = [
        Binding("escape", "close", "Close", id="picker-close", key_display="esc"),
    ]

    def __init__(self, current: int, scenarios: tuple[Scenario, ...]) -> None:
        super().__init__(classes="dialog-screen")
        self.current = current
        self.scenarios = scenarios
        self.typed = ""  # the digits typed so far, while they name a scenario

    def compose(self) -> ComposeResult:
        options = []
        for item in self.scenarios:
            # The intro wraps under the title, indented past the number.
            label = Table.grid(padding=(0, 1))
            label.add_column(width=2, justify="right")
            label.add_column(ratio=1)
            label.add_row(Text(str(item.number), style="bold"), Text(item.title, style="bold"))
            label.add_row("", Text(item.intro, style="dim"))
            options.append(Option(label, id=str(item.number)))
        with Vertical(classes="dialog picker"):
            yield Label(
                Text(f"onwatch demo · pick one of {_count(len(self.scenarios))}"),
                classes="question",
            )
            yield Label(
                Text(
                    "Each plays how an always-on agent fails, step by step, on a "
                    "scratch inbox: the panes behind are the real supervisor."
                ),
                classes="note",
            )
            yield OptionList(*options, id="picker-list")
            yield Label(
                Text(
                    "↑↓ or a number choose · ↵ play · esc close — then space steps, g "
                    "autoplays. onwatch demo --live runs real worker processes."
                ),
                classes="keys",
            )

    def on_mount(self) -> None:
        listing = self.query_one(OptionList)
        numbers = [s.number for s in self.scenarios]
        listing.highlighted = numbers.index(self.current) if self.current in numbers else 0
        listing.focus()

    def on_key(self, event: events.Key) -> None:
        if event.character is None or event.character not in "0123456789":
            return
        event.stop()
        numbers = [str(s.number) for s in self.scenarios]
        typed = self.typed + event.character
        if typed not in numbers:
            typed = event.character
        if typed in numbers:
            self.typed = typed
            self.query_one(OptionList).highlighted = numbers.index(typed)
        else:
            self.typed = ""

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        event.stop()
        self.dismiss(int(event.option.id or 0))

    def action_close(self) -> None:
        self.dismiss(None)


SPEED = Binding.Group("Speed")


class DemoApp(DemoDesk):
    """The supervisor TUI with a scenario player: the panes are real, the clock simulated."""

    TITLE = "onwatch demo"
    TIMES = SimulatedTimes()

    BINDINGS = [
        Binding(
            "space",
            "step",
            "Step",
            priority=True,
            id="demo-step",
            tooltip="Play the scenario's next step",
        ),
        Binding(
            "g",
            "autoplay",
            "Autoplay",
            priority=True,
            id="demo-autoplay",
            tooltip="Play the steps one after another",
        ),
        Binding("g", "stop", "Stop", priority=True, id="demo-stop", tooltip="Stop autoplay"),
        Binding(
            "plus",
            "faster",
            "Faster",
            id="demo-faster",
            key_display="+",
            group=SPEED,
            tooltip="Autoplay: less time between steps",
        ),
        Binding(
            "minus",
            "slower",
            "Slower",
            id="demo-slower",
            key_display="-",
            group=SPEED,
            tooltip="Autoplay: more time between steps",
        ),
        Binding(
            "b",
            "restart",
            "Restart",
            id="demo-restart",
            tooltip="Play this scenario again from the start, on a fresh inbox",
        ),
        Binding(
            "n",
            "next_scenario",
            "Next scenario",
            id="demo-next",
            tooltip="Go on to the next scenario",
        ),
        Binding(
            "l", "pick", "Scenarios", id="demo-pick", tooltip="List every scenario and pick one"
        ),
    ]
    PLAYER_ACTIONS = frozenset(
        {"step", "autoplay", "stop", "faster", "slower", "restart", "next_scenario", "pick"}
    )
    FOOTER_FIRST = PLAYER_ACTIONS

    def __init__(
        self,
        run: ScenarioRun,
        scratch: str,
        *,
        scenarios: tuple[Scenario, ...] = SCENARIOS,
        pick_first: bool = True,
    ) -> None:
        super().__init__(run.stage.inbox, clock=run.stage.clock, read_only=False)
        self.sim_clock = run.stage.clock  # `clock` itself: every scenario is set on it anew
        self.playing = run  # the ScenarioRun on screen
        self.scratch = scratch
        self.scenarios = scenarios
        self.pick_first = pick_first
        self.narration = run.scenario.intro
        self.autoplaying = False
        self.speed_index = DEFAULT_SPEED
        self.busy = False  # a step or a switch is under way
        self._player_lock = asyncio.Lock()
        self._autoplay_timer: Timer | None = None
        self._runs_made = 0
        self._retired: list[ScenarioRun] = []

    @classmethod
    async def open(
        cls, scratch: str, first: Scenario = SCENARIOS[0], *, pick_first: bool = True
    ) -> "DemoApp":
        """A player whose scratch inboxes live under `scratch`, starting on `first`.

        With `pick_first`, the scenario list opens over it at once. Call `close_runs()` after
        the app exits.
        """
        folder = os.path.join(scratch, f"000-{first.key}")
        os.makedirs(folder, exist_ok=True)
        run = await ScenarioRun.open(first, os.path.join(folder, "demo.db"), FakeClock(START))
        return cls(run, scratch, pick_first=pick_first)

    async def close_runs(self) -> None:
        """Close every scratch inbox this player opened."""
        for run in [self.playing, *self._retired]:
            with contextlib.suppress(Exception):
                await run.close()
        self._retired.clear()

    # --- layout ---------------------------------------------------------------------------

    def make_bar(self) -> Widget:
        return PlayerBar(id="player")

    def on_resize(self, event: events.Resize) -> None:
        super().on_resize(event)
        # Below 100 columns (or 30 rows) the bar keeps to the narration: the panes need room.
        self.query_one(PlayerBar).set_class(
            event.size.width < WIDE_BAR[0] or event.size.height < WIDE_BAR[1], "-narrow"
        )

    def on_mount(self) -> None:
        super().on_mount()
        self._show_player()
        self.action_show_pane(self.playing.scenario.start_pane)
        if self.pick_first:
            self.action_pick()

    @property
    def speed(self) -> float:
        return SPEEDS[self.speed_index]

    @property
    def scenario(self) -> Scenario:
        return self.playing.scenario

    def _show_player(self) -> None:
        intro = self.narration
        if self.playing.position == 0:
            intro = f"{self.scenario.intro} Press space to play the first step."
        view = PlayerView(
            self.scenario,
            self.playing.position,
            self.clock.now(),
            intro,
            self.autoplaying,
            self.speed,
            self.busy,
        )
        self.query_one(PlayerBar).show(view)
        self.refresh_bindings()

    # --- keys -----------------------------------------------------------------------------

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action not in self.PLAYER_ACTIONS:
            return super().check_action(action, parameters)
        if self._dialog_open():
            return False  # space and friends belong to the dialog then
        if action == "step":
            return True if not self.playing.finished else None
        if action == "autoplay":
            return not self.autoplaying
        if action == "stop":
            return self.autoplaying
        if action == "faster":
            return True if self.speed_index > 0 else None
        if action == "slower":
            return True if self.speed_index < len(SPEEDS) - 1 else None
        return True

    def action_step(self) -> None:
        if self._dialog_open():
            raise SkipAction()
        if self.playing.finished:
            return
        self.run_worker(self.play_step(), group="demo", exit_on_error=False)

    async def play_step(self) -> str | None:
        """Play the next step, repaint from the inbox, and show its narration."""
        if self.busy or self.playing.finished:
            return None
        async with self._player_lock:
            run = self.playing
            step = run.next_step
            self.busy = True
            try:
                line = await run.step()
            except Exception as exc:  # a step must never take the viewer's desk down
                line = f"This step failed: {type(exc).__name__}: {exc}"
                run.position += 1
            finally:
                self.busy = False
            if run is not self.playing:  # switched meanwhile: this narration is stale
                return None
            self.narration = line
            if step is not None and step.pane:
                self.action_show_pane(step.pane)
            await self.reload()
            if run.finished and self.autoplaying:
                self._set_autoplay(False)
            self._show_player()
            return line

    def action_autoplay(self) -> None:
        self._set_autoplay(True)
        if not self.playing.finished:
            self.run_worker(self.play_step(), group="demo", exit_on_error=False)

    def action_stop(self) -> None:
        self._set_autoplay(False)

    def _set_autoplay(self, on: bool) -> None:
        if self._autoplay_timer is not None:
            self._autoplay_timer.stop()
            self._autoplay_timer = None
        self.autoplaying = on and not self.playing.finished
        if self.autoplaying:
            self._autoplay_timer = self.set_interval(
                self.speed, self._autoplay_tick, name="autoplay"
            )
        self._show_player()

    def _autoplay_tick(self) -> None:
        if self.playing.finished:
            self._set_autoplay(False)
        elif not self.busy and not self._dialog_open():
            self.run_worker(self.play_step(), group="demo", exit_on_error=False)

    def action_faster(self) -> None:
        self.speed_index = max(self.speed_index - 1, 0)
        self._set_autoplay(self.autoplaying)

    def action_slower(self) -> None:
        self.speed_index = min(self.speed_index + 1, len(SPEEDS) - 1)
        self._set_autoplay(self.autoplaying)

    def action_restart(self) -> None:
        self.run_worker(self.load(self.scenario), group="demo", exit_on_error=False)

    def action_next_scenario(self) -> None:
        numbers = [s.number for s in self.scenarios]
        index = (
            (numbers.index(self.scenario.number) + 1) % len(numbers)
            if self.scenario.number in numbers
            else 0
        )
        self.run_worker(self.load(self.scenarios[index]), group="demo", exit_on_error=False)

    def action_pick(self) -> None:
        def chosen(number: int | None) -> None:
            if number is None:
                return
            picked = next((s for s in self.scenarios if s.number == number), None)
            if picked is not None:
                self.run_worker(self.load(picked), group="demo", exit_on_error=False)

        self.push_screen(ScenarioPicker(self.scenario.number, self.scenarios), chosen)

    # --- switching scenarios --------------------------------------------------------------

    async def load(self, scenario: Scenario) -> None:
        """Start `scenario` from its beginning on a fresh scratch inbox (also: restart)."""
        self._set_autoplay(False)
        async with self._player_lock:
            self.busy = True
            try:
                self._runs_made += 1
                folder = os.path.join(self.scratch, f"{self._runs_made:03d}-{scenario.key}")
                os.makedirs(folder, exist_ok=True)
                run = await ScenarioRun.open(
                    scenario, os.path.join(folder, "demo.db"), self.sim_clock
                )
                old, self.playing = self.playing, run
                self.inbox = run.stage.inbox  # the reload below reads its change token
                for pane in self.panes:
                    pane.window = Window()
                    pane.clear_marks()
                    pane.show_outcome("", None)
                self.narration = scenario.intro
            finally:
                self.busy = False
            self.action_show_pane(scenario.start_pane)
            await self.reload()
            self._show_player()
        self._retired.append(old)
        self.run_worker(self._retire(), group="retire", exit_on_error=False)

    async def _retire(self) -> None:
        """Close the inboxes of earlier runs once no poll can still be reading them."""
        for _ in range(50):
            if not self._polling:
                break
            await asyncio.sleep(0.05)
        while self._retired:
            old = self._retired.pop()
            with contextlib.suppress(Exception):
                await old.close()

    async def action_quit(self) -> None:
        self._set_autoplay(False)
        self.exit(0)


async def _main(scratch: str, first: Scenario, pick_first: bool) -> int:
    app = await DemoApp.open(scratch, first, pick_first=pick_first)
    try:
        code = await app.run_async()
        return code if isinstance(code, int) else (app.return_code or 0)
    finally:
        await app.close_runs()


def main() -> int:
    """`onwatch demo`: the player on a scratch inbox (deleted on exit); 0 after a normal quit."""
    scratch = tempfile.mkdtemp(prefix="onwatch-demo-")
    try:
        return asyncio.run(_main(scratch, SCENARIOS[0], pick_first=True))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
