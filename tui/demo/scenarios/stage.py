"""The stage every scenario plays on (a scratch inbox on a fake clock), its steps, and a run."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Mapping

from onwatch.core import Approval, Event, FakeClock, Inbox

START = 1_000_000  # t of the reference scenarios (docs/rules.md#the-reference-scenarios)
DAY = 86_400
HOUR = 3_600
MINUTE = 60

# Every reference scenario runs with these settings.
SETTINGS: dict[str, Any] = {"lease_ttl": 120, "max_attempts": 3, "outbox_gap": 3600}


def since_start(now: int) -> str:
    """The simulated time as an offset from t, e.g. 't+2m11s', 't+4d00h10m'."""
    offset = now - START
    sign = "-" if offset < 0 else "+"
    offset = abs(offset)
    days, rest = divmod(offset, DAY)
    hours, rest = divmod(rest, HOUR)
    minutes, seconds = divmod(rest, MINUTE)
    if days:
        text = f"{days}d{hours:02d}h{minutes:02d}m" + (f"{seconds:02d}s" if seconds else "")
    elif hours:
        text = f"{hours}h{minutes:02d}m" + (f"{seconds:02d}s" if seconds else "")
    elif minutes:
        text = f"{minutes}m{seconds:02d}s"
    else:
        text = f"{seconds}s"
    return f"t{sign}{text}"


class Stage:
    """A scratch inbox on a fake clock, plus what the scenario's steps have seen so far.

    `inbox` is the connection the viewer (and the TUI) reads. A scenario that restarts a
    worker process opens a separate connection for it with `worker_connection`, so closing
    that connection is a real process restart as far as the file is concerned.
    """

    def __init__(self, inbox: Inbox, clock: FakeClock) -> None:
        self.inbox = inbox
        self.clock = clock
        self.results: dict[str, Any] = {}  # figures steps hand on (and tests read)
        self.sent: list[str] = []  # what the demo's chat channel received, in order
        self._workers: dict[str, Inbox] = {}

    @property
    def now(self) -> int:
        return self.clock.now()

    def at(self, when: int) -> int:
        """Move the simulated clock to `when` (never backwards) and return it."""
        if when < self.clock.now():
            raise ValueError(f"a scenario may not move the clock back ({when} < {self.now})")
        self.clock.set(when)
        return when

    def later(self, seconds: int) -> int:
        return self.clock.advance(seconds)

    def channel(self, text: str) -> None:
        """The demo's chat channel: it just keeps what it was given."""
        self.sent.append(str(text))

    async def worker_connection(self, name: str) -> Inbox:
        """The inbox as a worker process named `name` sees it (its own connection)."""
        if name not in self._workers:
            self._workers[name] = await Inbox.open(self.inbox.path, clock=self.clock)
        return self._workers[name]

    async def stop_worker(self, name: str) -> None:
        """The worker process exits: its connection closes, nothing in memory survives."""
        worker = self._workers.pop(name, None)
        if worker is not None:
            await worker.close()

    async def close_workers(self) -> None:
        for name in list(self._workers):
            await self.stop_worker(name)

    # Small reads the narrations share.

    async def event(self, event_id: int) -> Event:
        event = await self.inbox.get_event(event_id)
        assert event is not None, f"event {event_id} vanished"
        return event

    async def approval(self, request_id: str) -> Approval:
        approval = await self.inbox.get_approval(request_id)
        assert approval is not None, f"request {request_id} vanished"
        return approval

    async def held(self) -> int:
        return len(await self.inbox.held_messages())

    async def lease_until(self) -> str:
        lease = await self.inbox.lease_info()
        return "no lease" if lease is None else since_start(lease.until)


Action = Callable[[Stage], Awaitable[str]]


@dataclass(frozen=True)
class Step:
    """One thing that happens: `act` does it on the stage and returns the narration line."""

    title: str
    act: Action
    pane: str | None = None  # the pane that shows this step's outcome (player switches to it)


@dataclass(frozen=True)
class Scenario:
    """One reference scenario: its steps and how the player should present it."""

    number: int
    key: str  # short id: used for screenshots and the command line
    title: str
    intro: str  # what the viewer is about to see, shown before the first step
    steps: tuple[Step, ...]
    settings: Mapping[str, Any] = field(default_factory=dict)  # on top of SETTINGS
    focus: str = "pending"  # the pane that tells this story best
    watch: str = ""  # where on the screen the viewer should look
    moment: int = -1  # the step (index) whose outcome is the scenario's key picture

    @property
    def start_pane(self) -> str:
        """The pane shown before the first step: the one the first step will write to."""
        return self.steps[0].pane or self.focus if self.steps else self.focus


def plural(count: int, word: str, words: str | None = None) -> str:
    """'1 event', '3 events', 'no events'."""
    many = words or word + "s"
    if count == 0:
        return f"no {many}"
    return f"{count} {word if count == 1 else many}"


# --- playing ------------------------------------------------------------------------------------


class ScenarioRun:
    """One scenario being played on one stage, a step at a time."""

    def __init__(self, scenario: Scenario, stage: Stage) -> None:
        self.scenario = scenario
        self.stage = stage
        self.position = 0  # how many steps have been played
        self.narration: list[str] = []

    @classmethod
    async def open(
        cls, scenario: Scenario, path: str | os.PathLike[str], clock: FakeClock | None = None
    ) -> "ScenarioRun":
        """Open a fresh inbox at `path` on `clock` (reset to t) with the scenario's settings."""
        clock = clock or FakeClock(START)
        clock.set(START)
        inbox = await Inbox.open(path, clock=clock)
        await inbox.configure(**{**SETTINGS, **scenario.settings})
        return cls(scenario, Stage(inbox, clock))

    @property
    def finished(self) -> bool:
        return self.position >= len(self.scenario.steps)

    @property
    def next_step(self) -> Step | None:
        return None if self.finished else self.scenario.steps[self.position]

    async def step(self) -> str:
        """Play the next step; return its narration. Raises IndexError when finished."""
        if self.finished:
            raise IndexError(f"scenario {self.scenario.key} has no more steps")
        step = self.scenario.steps[self.position]
        line = await step.act(self.stage)
        self.position += 1
        self.narration.append(line)
        return line

    async def close(self) -> None:
        await self.stage.close_workers()
        await self.stage.inbox.close()
