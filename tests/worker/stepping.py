"""An agent on a machine whose wall clock steps: `--agent tests.worker.stepping:clock_stepper`.

Importing this module (as the worker does, for its agent) puts the process's time.time
behind an offset that the agent moves, as an NTP correction or a VM resumed after hours
moves a real machine's clock; time.monotonic is left alone, as the kernel leaves it.
"""

from __future__ import annotations

import asyncio
import os
import time

from tests.worker.agents import _ledger

_real_time = time.time
_step = [0.0]
time.time = lambda: _real_time() + _step[0]


async def clock_stepper(batch, ctx) -> None:
    """Steps the wall clock forward by $ONWATCH_TEST_STEP seconds (default two hours) in
    the middle of the run, goes on for $ONWATCH_TEST_AFTER seconds more (renewals come due
    meanwhile), then replies."""
    _ledger({"ran": [e.source_id for e in batch]})
    await asyncio.sleep(0.5)
    _step[0] += float(os.environ.get("ONWATCH_TEST_STEP", "7200"))
    await asyncio.sleep(float(os.environ.get("ONWATCH_TEST_AFTER", "3")))
    for event in batch:
        ctx.reply(f"done {event.source_id}")
