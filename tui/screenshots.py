"""Generate screenshots/*.svg: the supervisor on a seeded inbox at a fixed time, and the demo.

    python -m onwatch.tui.screenshots [OUT_DIR]     (default: screenshots/ at the top)

The demo's own shots (screenshots/demo-*.svg) come from tui/demo/screenshots.py, called last.

The seeded inbox they show comes from tui/seed.py, the fleet's from tui/fleet/seed.py.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any, Awaitable, Callable

from .seed import open_seeded, use_utc

if TYPE_CHECKING:
    from textual.app import App
    from textual.pilot import Pilot

Step = Callable[[object], Awaitable[None]]


async def settle(app: App[Any], pilot: Pilot[Any], timeout: float = 5.0) -> None:
    """Wait (bounded) until every read and dialog load has finished; an action waiting on
    its confirmation dialog is left waiting."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while loop.time() < deadline:
        await pilot.pause()
        dialog = len(app.screen_stack) > 1
        busy = [
            w for w in app.workers if not w.is_finished and not (dialog and w.group == "actions")
        ]
        if not busy:
            break
        await asyncio.sleep(0.02)
    await pilot.pause()


async def _shoot(
    path: str, out: Path, name: str, size: tuple[int, int], keys: tuple[str, ...]
) -> Path:
    from onwatch.tui.app import OnwatchApp

    inbox, clock = await open_seeded(path)
    try:
        app = OnwatchApp(inbox, clock=clock)
        async with app.run_test(size=size) as pilot:
            await app.loaded.wait()
            for key in keys:
                await pilot.press(key)
                await pilot.pause()
            await settle(app, pilot)
            app.tick()
            await pilot.pause()
            target = out / f"{name}.svg"
            app.save_screenshot(filename=target.name, path=str(out))
            return target
    finally:
        await inbox.close()


SHOTS: tuple[tuple[str, tuple[int, int], tuple[str, ...]], ...] = (
    ("pending", (120, 40), ()),
    ("running", (120, 40), ("2",)),
    ("dead", (120, 40), ("3",)),
    ("approvals", (120, 40), ("4",)),
    ("timers", (120, 40), ("5",)),
    ("outbox", (120, 40), ("6",)),
    ("done", (120, 40), ("7",)),
    ("workers", (120, 40), ("W",)),
    ("confirm-approve", (120, 40), ("4", "a")),
    ("detail", (120, 40), ("3", "enter")),
    ("requeued", (120, 40), ("3", "down", "r")),
    ("help", (120, 40), ("question_mark",)),
    ("pending-80x24", (80, 24), ()),
    ("approvals-80x24", (80, 24), ("4",)),
)


# A running run's transcript, as a language-model agent's would read (screenshots/transcript.svg):
# (seconds before T0, level, logger, text, fields, spent in millionths of a usd).
TRANSCRIPT: tuple[tuple[int, str, str | None, str, dict[str, Any] | None, int], ...] = (
    (20, "log", None, "2 events: the calendar sync, an e-mail (Invoice 2231)", None, 0),
    (19, "info", "agent.tools", "calendar.list_events(since=2023-11-14) → 14 events", None, 0),
    (17, "log", None, "asked the model", {"model": "m-large", "tokens_in": 3812}, 0),
    (12, "spend", None, "spent 0.0421 usd: m-large, 3,812 in / 611 out", None, 42_100),
    (11, "warning", "httpx", "429 Too Many Requests from api.mail.example; retry in 2 s", None, 0),
    (8, "log", None, "drafting the reply to Invoice 2231", {"to": "ap@acme.example"}, 0),
    (3, "info", "agent.tools", "invoices.lookup('2231') → due 2023-11-30, 1,240.00 EUR", None, 0),
    (1, "log", None, "asked the model", {"model": "m-large", "tokens_in": 4630}, 0),
)


async def shoot_transcript(path: str, out: Path, size: tuple[int, int] = (120, 40)) -> Path:
    """screenshots/transcript.svg: the running event's detail, its run followed live."""
    from onwatch.tui.app import OnwatchApp
    from onwatch.tui.screens.detail import DetailScreen

    from .seed import T0

    inbox, clock = await open_seeded(path)
    try:
        [event] = [e for e in await inbox.events("running") if e.source == "email"]
        assert event.run_id is not None
        lines, spends = [], []
        for seq, (ago, level, logger, text, fields, micros) in enumerate(TRANSCRIPT):
            lines.append(
                (seq, T0 - ago, level, logger, text, None if fields is None else json.dumps(fields))
            )
            if micros:
                spends.append((seq, T0 - ago, "usd", micros, "m-large"))
        await inbox.append_transcript(event.run_id, lines, spends=spends, now=T0)
        app = OnwatchApp(inbox, clock=clock)
        async with app.run_test(size=size) as pilot:
            await app.loaded.wait()
            await pilot.press("2")
            await settle(app, pilot)
            table = app.pane("running").records()
            await pilot.press(*(["down"] * [e.id for e in table].index(event.id)), "enter")
            while not (isinstance(app.screen, DetailScreen) and app.screen.followed >= len(lines)):
                await pilot.pause(0.05)
            await pilot.press("tab", "end")  # to the live transcript, as one watching it
            await settle(app, pilot)
            app.tick()
            await pilot.pause()
            target = out / "transcript.svg"
            app.save_screenshot(filename=target.name, path=str(out))
            return target
    finally:
        await inbox.close()


FLEET_SHOTS: tuple[tuple[str, tuple[int, int], tuple[str, ...]], ...] = (
    ("fleet", (120, 40), ()),
    ("fleet-approvals", (120, 40), ("A",)),
    ("fleet-80x24", (80, 24), ()),
)


async def shoot_fleet(out: str, scratch: str) -> list[str]:
    """Save the fleet screenshots (FLEET_SHOTS) of the seeded fleet into `out`."""
    from onwatch.core.fleet import FolderFleet

    from .app import OnwatchApp
    from .fleet.seed import seed_fleet

    made = []
    for index, (name, size, keys) in enumerate(FLEET_SHOTS):
        folder = os.path.join(scratch, f"fleet-{index}", "agents")
        os.makedirs(folder)
        clock = await seed_fleet(folder)
        app = OnwatchApp(None, clock=clock, fleet=FolderFleet(folder, label="agents"))
        async with app.run_test(size=size, notifications=True) as pilot:
            while not (app.fleet_desk is not None and app.fleet_desk.loaded):
                await pilot.pause(0.05)
            for key in keys:
                await pilot.press(key)
                await settle(app, pilot)
            await settle(app, pilot)
            app.tick()
            await pilot.pause()
            app.save_screenshot(filename=f"{name}.svg", path=out)
            made.append(os.path.join(out, f"{name}.svg"))
            if app.inbox is not None:
                await app.inbox.close()
    return made


async def generate(out: Path) -> list[Path]:
    use_utc()
    out.mkdir(parents=True, exist_ok=True)
    made = []
    with tempfile.TemporaryDirectory() as scratch:
        for index, (name, size, keys) in enumerate(SHOTS):
            folder = os.path.join(scratch, str(index))
            os.mkdir(folder)
            path = os.path.join(folder, "alice.db")
            made.append(await _shoot(path, out, name, size, keys))
        made += [Path(p) for p in await shoot_fleet(str(out), scratch)]
        made.append(await shoot_transcript(os.path.join(scratch, "transcript.db"), out))
    return made


def main(argv: list[str]) -> int:
    """Write every screenshot: the supervisor's, then each demo scenario's key moment."""
    from .demo import screenshots as demo_screenshots

    out = Path(argv[0]) if argv else Path(__file__).resolve().parent.parent / "screenshots"
    for path in asyncio.run(generate(out)):
        print(path)
    for path in asyncio.run(demo_screenshots.capture_all(out)):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
