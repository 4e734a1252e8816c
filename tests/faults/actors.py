"""Processes the race tests start: `python -m tests.faults.actors ROLE TARGET ...`, where
TARGET is an inbox file or a PostgreSQL URL (its "default" inbox).

Each prints one JSON document on stdout when done, for the test to check against the inbox.
"""

from __future__ import annotations

import asyncio
import json
import random
import sys
import time

from onwatch.core import Inbox, InboxBusy, InboxError


async def acquire_rounds(
    target: str, holder: str, t0: float, rounds: int, gap: float, ttl: int
) -> list:
    """At t0 + k*gap every process asks for the lease at the same simulated instant (past
    the previous lease), or on the wall clock when `ttl` is 0."""
    inbox = await Inbox.open(target, create=False, busy_timeout=10)
    won = []
    try:
        for k in range(rounds):
            start = t0 + k * gap
            while (left := start - time.time()) > 0.003:
                time.sleep(min(left - 0.002, 0.05))
            while time.time() < start:
                pass
            now = None if ttl == 0 else 1_000_000 + k * (ttl + 1)
            won.append(await inbox.acquire(holder, now=now))
    finally:
        await inbox.close()
    return won


async def serve(target: str, holder: str, t0: float) -> dict:
    """Take the lease whenever it is free, claim, finish, release; until nothing is pending.
    Returns every generation won and every event this holder claimed under it."""
    box = await Inbox.open(target, create=False, busy_timeout=10)
    runs, refused = [], 0
    await asyncio.sleep(max(0.0, t0 - time.time()))
    try:
        idle_since = time.monotonic()
        while time.monotonic() - idle_since < 2.0:
            try:
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
            except InboxBusy:  # another process held the file's write lock too long: again
                continue
    finally:
        await box.close()
    return {"runs": runs, "refused": refused}


async def ingest(path: str, count: int, seed: int, seconds: float) -> dict:
    """Deliver every key twice (shuffled, some back to back); retry what a lock refused."""
    rng = random.Random(seed)
    keys = [("chat", f"k{i}") for i in range(count)] + [
        ("pay", f"p{i}") for i in range(count // 10)
    ]
    deliveries = keys * 2
    rng.shuffle(deliveries)
    results: dict[str, list[bool]] = {}
    busy = 0
    inbox = await Inbox.open(path, create=False, busy_timeout=2)
    try:
        for source, source_id in deliveries:
            while True:
                try:
                    stored = await inbox.ingest(source, source_id, {"text": source_id})
                    break
                except InboxBusy:
                    busy += 1
            results.setdefault(f"{source}/{source_id}", []).append(stored)
            # Paces the deliveries over the chaos; nothing is asserted on the timing.
            await asyncio.sleep(rng.uniform(0, 2 * seconds / len(deliveries)))
    finally:
        await inbox.close()
    return {"busy": busy, "results": results}


async def operate(path: str, seconds: float, seed: int) -> dict:
    """Random operator actions for `seconds`; each records whether it applied."""
    rng = random.Random(seed)
    done: list[list] = []
    inbox = await Inbox.open(path, create=False, busy_timeout=2)
    deadline = time.monotonic() + seconds
    try:
        while time.monotonic() < deadline:
            await asyncio.sleep(rng.uniform(0.05, 0.25))  # paces the operator, no check
            try:
                choice = rng.random()
                if choice < 0.3:
                    pending = await inbox.events("pending", limit=50)
                    if pending:
                        event = rng.choice(pending)
                        done.append(
                            ["cancel", event.id, await inbox.cancel(event.id, actor="chaos")]
                        )
                elif choice < 0.6:
                    for state in ("dead", "interrupted", "cancelled"):
                        rows = await inbox.events(state, limit=50)
                        if rows:
                            event = rng.choice(rows)
                            done.append(
                                [
                                    "requeue",
                                    event.id,
                                    await inbox.requeue(event.id, expect=state, actor="chaos"),
                                ]
                            )
                            break
                elif choice < 0.7:
                    rows = await inbox.events("interrupted", limit=50)
                    if rows:
                        event = rng.choice(rows)
                        done.append(
                            ["resolve", event.id, await inbox.resolve(event.id, actor="chaos")]
                        )
                elif choice < 0.8:
                    await inbox.pause(actor="chaos")
                    await asyncio.sleep(rng.uniform(0.1, 0.4))
                    await inbox.resume(actor="chaos")
                    done.append(["pause", None, True])
                elif choice < 0.9:
                    await inbox.hold_outbox(actor="chaos")
                    await asyncio.sleep(rng.uniform(0.1, 0.4))
                    await inbox.release_outbox(actor="chaos")
                    done.append(["hold", None, True])
                else:
                    rows = await inbox.events("running", limit=50)
                    if rows:  # must be refused: a running event cannot be cancelled
                        event = rng.choice(rows)
                        done.append(
                            [
                                "cancel-running",
                                event.id,
                                await inbox.cancel(event.id, expect="running", actor="chaos"),
                            ]
                        )
            except InboxBusy:
                done.append(["busy", None, False])
        await inbox.resume(actor="chaos")
        await inbox.release_outbox(actor="chaos")
    finally:
        await inbox.close()
    return {"actions": done}


def main(argv: list[str]) -> int:
    role, path, *rest = argv
    if role == "acquire":
        holder, t0, rounds, gap, ttl = rest
        out = asyncio.run(
            acquire_rounds(path, holder, float(t0), int(rounds), float(gap), int(ttl))
        )
    elif role == "serve":
        holder, t0 = rest
        out = asyncio.run(serve(path, holder, float(t0)))
    elif role == "ingest":
        out = asyncio.run(ingest(path, int(rest[0]), int(rest[1]), float(rest[2])))
    elif role == "operate":
        out = asyncio.run(operate(path, float(rest[0]), int(rest[1])))
    else:
        raise SystemExit(f"unknown role {role}")
    print(json.dumps(out, sort_keys=True))
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except InboxError as exc:
        print(f"actor failed: {exc}", file=sys.stderr)
        sys.exit(1)
