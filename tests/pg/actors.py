"""Processes for the PostgreSQL race tests: `python -m tests.pg.actors KIND URL NAME ...`,
each printing one JSON document of what it saw."""

from __future__ import annotations

import asyncio
import json
import sys
import time

from core import Inbox

T = 1_000_000


async def acquire_rounds(url: str, name: str, holder: str, t0: float, rounds: int,
                         gap: float) -> list:
    """At each round's wall-clock instant, ask for the lease at that round's simulated instant
    (past the previous lease): every process asks at once."""
    box = await Inbox.open(url, name=name)
    got = []
    try:
        for k in range(rounds):
            await asyncio.sleep(max(0.0, t0 + k * gap - time.time()))
            got.append(await box.acquire(holder, now=T + k * 1000))
    finally:
        await box.close()
    return got


async def serve(url: str, name: str, holder: str, t0: float) -> dict:
    """Take the lease whenever it is free, claim, finish, release; until nothing is pending.
    Returns every generation won and every event this holder claimed under it."""
    box = await Inbox.open(url, name=name)
    runs, refused = [], 0
    await asyncio.sleep(max(0.0, t0 - time.time()))
    try:
        idle_since = time.monotonic()
        while time.monotonic() - idle_since < 2.0:
            gen = await box.acquire(holder)
            if gen is None:
                await asyncio.sleep(0)
                continue
            batch = await box.claim_batch(holder, gen)
            if batch:
                idle_since = time.monotonic()
                if not await box.finish(holder, gen, [e.id for e in batch], [f"{holder} ran"]):
                    refused += 1
                runs.append([gen, [e.id for e in batch]])
            await box.release(holder, gen)
    finally:
        await box.close()
    return {"runs": runs, "refused": refused}


def main(argv: list[str]) -> int:
    kind, url, name, holder, t0 = argv[:5]
    if kind == "acquire":
        result = asyncio.run(acquire_rounds(url, name, holder, float(t0), int(argv[5]),
                                            float(argv[6])))
    elif kind == "serve":
        result = asyncio.run(serve(url, name, holder, float(t0)))
    else:
        raise SystemExit(f"unknown actor {kind}")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))


async def ledgered(batch, ctx) -> None:
    """An I/O-bound agent (50 ms) that notes when each run began and ended, per inbox (the
    part of the source id before '/'), so a test can check no inbox ran twice at once."""
    import os
    inbox = batch[0].source_id.split("/")[0]
    began = time.time()
    await asyncio.sleep(0.05)
    ended = time.time()
    for event in batch:
        ctx.reply(f"reply {event.source_id}")
    line = json.dumps({"inbox": inbox, "began": began, "ended": ended, "pid": os.getpid(),
                       "events": [e.source_id for e in batch]})
    with open(os.path.join(os.environ["ONWATCH_TEST_DIR"], "ledger"), "a") as handle:
        handle.write(line + "\n")


async def io_bound(batch, ctx) -> None:
    """The benchmark's agent: 50 ms of waiting (a model call, an HTTP request)."""
    await asyncio.sleep(0.05)
