"""The live demo's agent: it thinks for a while (as a model call does), then echoes each chat
message, so that a worker killed from the demo dies in the middle of a run."""

from __future__ import annotations

import asyncio
import os

from onwatch.core import Event, RunContext

THINK_SECONDS_ENV = "ONWATCH_DEMO_THINK_SECONDS"


async def think_then_echo(batch: list[Event], ctx: RunContext) -> None:
    """`onwatch worker PATH --agent onwatch.tui.demo.agent:think_then_echo`."""
    await asyncio.sleep(float(os.environ.get(THINK_SECONDS_ENV, "0")))
    for event in batch:
        text = event.payload.get("text", "") if isinstance(event.payload, dict) else ""
        ctx.reply(f"echo: {text}")
