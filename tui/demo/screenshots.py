"""Generate screenshots/demo-*.svg: each scenario's key moment in the demo player.

    python -m tui.demo.screenshots [OUT_DIR]     (default: screenshots/ at the repository root)

Each scenario is played headless in the real player (`DemoApp`) up to its `moment` step (the
takeover refused, the poison event dead, the timer coalesced, the approval expired, the outbox
coalesced, the run interrupted…), then the screen is saved with `app.save_screenshot()`. Plus
`demo-picker.svg`, the list a newcomer sees first. Times render in UTC, so the files are the
same on every machine (but for the outbox's random idempotency keys).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .scenarios import SCENARIOS, Scenario

if TYPE_CHECKING:
    from textual.app import App
    from textual.pilot import Pilot

SIZE = (120, 40)
ROOT = Path(__file__).resolve().parents[2]


def use_utc() -> None:
    os.environ["TZ"] = "UTC"
    if hasattr(time, "tzset"):
        time.tzset()


async def settle_footer(app: App[Any], pilot: Pilot[Any]) -> None:
    """Wait (bounded) until the footer has re-laid out its keys after the last step."""
    from textual.widgets import Footer

    footer = app.query_one(Footer)  # the main screen's, also under a dialog
    for _ in range(60):
        await pilot.pause(0.05)
        keys = list(footer.children)
        if keys and all(key.region.width > 0 for key in keys):
            break
    await pilot.pause(0.1)


async def capture(
    scenario: Scenario, out_dir: Path, *, size: tuple[int, int] = SIZE, picker: bool = False
) -> Path:
    """Play `scenario` to its key moment in the player and save the screen; return the file."""
    from .player import DemoApp, ScenarioPicker

    scratch = tempfile.mkdtemp(prefix="onwatch-shot-")
    app = await DemoApp.open(scratch, scenario, pick_first=picker)
    name = "demo-picker.svg" if picker else f"demo-{scenario.key}.svg"
    try:
        async with app.run_test(size=size) as pilot:
            await app.loaded.wait()
            if picker:
                for _ in range(100):
                    await pilot.pause()
                    if isinstance(app.screen, ScenarioPicker):
                        break
            else:
                moment = scenario.moment % len(scenario.steps)
                for _ in range(moment + 1):
                    await app.play_step()
            await settle_footer(app, pilot)
            app.save_screenshot(filename=name, path=str(out_dir))
    finally:
        await app.close_runs()
        shutil.rmtree(scratch, ignore_errors=True)
    return out_dir / name


async def capture_all(out_dir: Path) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    made = [await capture(SCENARIOS[0], out_dir, picker=True)]
    for scenario in SCENARIOS:
        made.append(await capture(scenario, out_dir))
    return made


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    out_dir = Path(argv[0]) if argv else ROOT / "screenshots"
    use_utc()
    for path in asyncio.run(capture_all(out_dir)):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
