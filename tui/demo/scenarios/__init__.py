"""The twelve reference scenarios, one module each, as steps that drive only the public core API.

No UI here (no textual import): the same steps are played headless by the tests and on screen
by the player. Each step moves the fake clock, calls the inbox, and returns its narration line
built from what the inbox really answered, so the demo can never show an outcome the rules did
not produce. The rules and the figures each scenario must reproduce are in
docs/rules.md#the-reference-scenarios.
"""

from __future__ import annotations

import os
import tempfile
from typing import Any, Callable

from . import (
    s01_webhook_twice,
    s02_lease_race,
    s03_chat_batch,
    s04_takeover,
    s05_poison,
    s06_timers,
    s07_approvals,
    s08_outbox,
    s09_restart_before_claim,
    s10_restart_during_run,
    s11_delivery_failed,
    s12_cancel,
)
from .stage import (
    DAY,
    HOUR,
    MINUTE,
    SETTINGS,
    START,
    Scenario,
    ScenarioRun,
    Stage,
    Step,
    plural,
    since_start,
)

__all__ = [
    "DAY",
    "HOUR",
    "MINUTE",
    "SCENARIOS",
    "SETTINGS",
    "START",
    "Scenario",
    "ScenarioRun",
    "Stage",
    "Step",
    "find",
    "play",
    "plural",
    "scenario",
    "since_start",
]

SCENARIOS: tuple[Scenario, ...] = tuple(
    module.build()
    for module in (
        s01_webhook_twice,
        s02_lease_race,
        s03_chat_batch,
        s04_takeover,
        s05_poison,
        s06_timers,
        s07_approvals,
        s08_outbox,
        s09_restart_before_claim,
        s10_restart_during_run,
        s11_delivery_failed,
        s12_cancel,
    )
)


def find(key: str | int) -> Scenario:
    """The scenario with this key or number; raise KeyError naming the known ones."""
    for item in SCENARIOS:
        if key in (item.key, item.number, str(item.number)):
            return item
    raise KeyError(
        f"no scenario {key!r}; known: {', '.join(f'{s.number} {s.key}' for s in SCENARIOS)}"
    )


scenario = find  # the name the player and the tests know it by


async def play(
    scenario: Scenario | str | int,
    path: str | os.PathLike[str] | None = None,
    *,
    echo: Callable[[str], Any] | None = None,
) -> ScenarioRun:
    """Play a scenario headless to its end on a scratch inbox; return the (open) run.

    The caller closes it (`await run.close()`). Without `path`, a temporary file is used.
    """
    chosen = scenario if isinstance(scenario, Scenario) else find(scenario)
    if path is None:
        folder = tempfile.mkdtemp(prefix="onwatch-demo-")
        path = os.path.join(folder, f"{chosen.key}.db")
    run = await ScenarioRun.open(chosen, path)
    while not run.finished:
        line = await run.step()
        if echo is not None:
            echo(f"{since_start(run.stage.now):>12}  {line}")
    return run
