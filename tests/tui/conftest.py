"""Shared fixtures for the TUI tests: a seeded inbox on a fake clock, screen text, waits."""

from __future__ import annotations

import asyncio
import io
from typing import Callable

from tests.waiting import until
import pytest
from rich.console import Console

from onwatch.tui.seed import T0, open_seeded, use_utc

use_utc()  # clock times in UTC: the same screen on every machine


@pytest.fixture
async def seeded(tmp_path):
    """(inbox, clock, path): the screenshots' seeded inbox, clock at T0."""
    path = str(tmp_path / "inbox.db")
    inbox, clock = await open_seeded(path)
    try:
        yield inbox, clock, path
    finally:
        await inbox.close()


def screen_text(app) -> str:
    """What a person would see: the whole screen (dialogs included) as plain text."""
    width, height = app.size
    console = Console(
        width=width,
        height=height,
        file=io.StringIO(),
        force_terminal=True,
        color_system="truecolor",
        record=True,
        legacy_windows=False,
        safe_box=False,
    )
    console.print(
        app.screen._compositor.render_update(full=True, screen_stack=app._background_screens)
    )
    return console.export_text(styles=False)


async def wait_for(
    pilot, predicate: Callable[[], bool], *, timeout: float = 5.0, what: str = "condition"
) -> None:
    """Let the app run until `predicate()` holds (bounded; never a bare sleep)."""
    await until(
        predicate,
        timeout=timeout,
        what=what,
        nap=pilot.pause,
        detail=lambda: screen_text(pilot.app),
    )


async def wait_for_text(pilot, text: str, *, timeout: float = 5.0) -> None:
    await wait_for(pilot, lambda: text in screen_text(pilot.app), timeout=timeout, what=repr(text))


async def started(app, pilot) -> None:
    await asyncio.wait_for(app.loaded.wait(), 10)
    await pilot.pause()


__all__ = ["T0", "screen_text", "started", "wait_for", "wait_for_text"]
