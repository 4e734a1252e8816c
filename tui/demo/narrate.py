"""`onwatch demo` without a terminal: every scenario played headless and narrated."""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
from typing import Any, Callable

from .scenarios import SCENARIOS, play


def narrate(echo: Callable[[str], Any] = print) -> int:
    """Play every scenario headless and print its narration (no terminal UI needed)."""

    async def everything() -> None:
        echo(
            "onwatch demo: no terminal here, so the scenarios are played headless and "
            "narrated (run it in a terminal for the player)."
        )
        scratch = tempfile.mkdtemp(prefix="onwatch-demo-")
        try:
            for item in SCENARIOS:
                echo(f"\n{item.number}. {item.title}\n   {item.intro}")
                run = await play(
                    item,
                    os.path.join(scratch, f"{item.key}.db"),
                    echo=lambda line: echo(f"  {line}"),
                )
                await run.close()
        finally:
            shutil.rmtree(scratch, ignore_errors=True)

    asyncio.run(everything())
    return 0
