"""Agents the transcript, spend and notify tests run in real worker processes
(`--agent tests.watch.agents:NAME`).

`talker` says what the test asks, one step at a time, through files in $ONWATCH_TEST_DIR: the
test writes `say-<n>` holding "log TEXT", "logging TEXT", "thread TEXT" or "end"; the agent
does it and writes `said-<n>` with the time it did (time.time(), so the test can tell how long
the line took to reach the desk), then waits for the next step.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time

log = logging.getLogger("agent.talker")


def _dir() -> str:
    return os.environ["ONWATCH_TEST_DIR"]


def _step(ctx, n: int, what: str, attempt: int = 1) -> bool:
    """Do one step; False at the end. `fail` fails the first attempt only."""
    kind, _, text = what.partition(" ")
    said = time.time()
    if kind == "end":
        return False
    if kind == "log":
        ctx.log(text, step=n)
    elif kind == "logging":
        log.warning(text)
    elif kind == "thread":
        ctx.thread(log.warning, text).join()
    elif kind == "spend":
        ctx.spend(float(text), "usd", f"step {n}")
    elif kind == "fail" and attempt == 1:
        raise RuntimeError(text)
    with open(os.path.join(_dir(), f"said-{n}.tmp"), "w") as handle:
        handle.write(repr(said))
    os.rename(os.path.join(_dir(), f"said-{n}.tmp"), os.path.join(_dir(), f"said-{n}"))
    return True


async def talker(batch, ctx) -> None:
    """Say what the test asks, step by step (see the module docstring)."""
    n = 1
    while True:
        path = os.path.join(_dir(), f"say-{n}")
        while not os.path.exists(path):
            await asyncio.sleep(0.002)
        with open(path) as handle:
            what = handle.read()
        if not _step(ctx, n, what, batch[0].attempts):
            return
        n += 1


def plain_talker(batch, ctx) -> None:
    """`talker` as a plain def (the worker runs it in a thread of its own)."""
    n = 1
    while True:
        path = os.path.join(_dir(), f"say-{n}")
        while not os.path.exists(path):
            time.sleep(0.002)
        with open(path) as handle:
            what = handle.read()
        if not _step(ctx, n, what, batch[0].attempts):
            return
        n += 1


async def chatty(batch, ctx) -> None:
    """A run that logs a million characters (1,000 lines of 1,000), then ends."""
    for i in range(1000):
        ctx.log(f"{i:04d} " + "x" * 995)


def spender(batch, ctx) -> None:
    """Spends 0.5 usd per attempt and fails until its third attempt."""
    ctx.spend(0.5, "usd", f"attempt {batch[0].attempts}")
    if batch[0].attempts < 3:
        raise RuntimeError(f"attempt {batch[0].attempts} fails")
