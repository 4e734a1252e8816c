"""Processes for the PostgreSQL chaos test: `python -m tests.pg.actors KIND URL ...`,
each printing one JSON document of what it saw."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time

from onwatch.core import Inbox

T = 1_000_000


def _append(name: str, line: str) -> None:
    """One line to a file of the test's folder in one write: a process killed between two
    writes leaves whole lines only."""
    fd = os.open(
        os.path.join(os.environ["ONWATCH_TEST_DIR"], name), os.O_WRONLY | os.O_APPEND | os.O_CREAT
    )
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


async def _until_acknowledged(call, what: str) -> object:
    """Retry a call through a lost connection or a busy inbox, as a webhook sender would."""
    from onwatch.core import InboxBusy, InboxError

    backoff = 0.05
    while True:
        try:
            return await call()
        except (InboxBusy, InboxError) as exc:
            if "not valid" in str(exc):
                raise
            print(f"{what}: {exc}; retrying", file=sys.stderr)
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, 1.0)


async def ingest_late(url: str, inboxes: int, count: int, gap: float) -> dict:
    """Ingest `count` events into random inboxes while the chaos goes on; each key is
    written to the file `acked` only once the ingest returned (acknowledged)."""
    import random

    rng = random.Random(7)
    acked = 0
    for k in range(count):
        name = f"inbox-{rng.randrange(inboxes):03d}"

        async def ingest() -> bool:
            box = await Inbox.open(url, name=name, create=False)  # noqa: B023 - called within this iteration
            try:
                return await box.ingest("chat", f"{name}/late-{k}", {"k": k})  # noqa: B023 - called within this iteration
            finally:
                await box.close()

        await _until_acknowledged(ingest, f"ingest {name}/late-{k}")
        _append("acked", f"{name}/late-{k}")
        acked += 1
        await asyncio.sleep(gap)  # paces the producer over the chaos; no check on it
    return {"acked": acked}


async def approve(url: str, expected: int, deadline: float) -> dict:
    """Answer every approval that is waiting, in any inbox, until `expected` were answered
    (each answer's standing outcome written to the file `answers`)."""
    import psycopg

    answered: set[tuple[str, str]] = set()
    while len(answered) < expected and time.time() < deadline:
        try:
            with psycopg.connect(url, autocommit=True, connect_timeout=5) as conn:
                waiting = conn.execute(
                    "SELECT i.name, a.request_id FROM approvals a JOIN inboxes i ON "
                    "i.id = a.inbox_id WHERE a.answer IS NULL ORDER BY a.due"
                ).fetchall()
        except psycopg.Error as exc:
            print(f"approver: {exc}; retrying", file=sys.stderr)
            await asyncio.sleep(0.2)
            continue
        for name, request_id in waiting:

            async def answer() -> str:
                box = await Inbox.open(url, name=name, create=False)  # noqa: B023 - called within this iteration
                try:
                    return await box.answer_approval(request_id, "yes", actor="approver")  # noqa: B023 - called within this iteration
                finally:
                    await box.close()

            outcome = await _until_acknowledged(answer, f"answer {request_id}")
            _append("answers", json.dumps([name, request_id, outcome]))
            answered.add((name, request_id))
        await asyncio.sleep(0.1)  # paces the approver's look-ups; no check on it
    return {"answered": len(answered)}


def main(argv: list[str]) -> int:
    kind, url = argv[:2]
    if kind == "ingest-late":
        print(json.dumps(asyncio.run(ingest_late(url, int(argv[2]), int(argv[3]), float(argv[4])))))
        return 0
    if kind == "approve":
        print(json.dumps(asyncio.run(approve(url, int(argv[2]), float(argv[3])))))
        return 0
    raise SystemExit(f"unknown actor {kind}")


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))


def wall() -> float:
    """This machine's real clock, also in a fleet whose `time.time` the test skewed: the
    ledgers of every process are compared on one time line."""
    return time.clock_gettime(time.CLOCK_REALTIME)


async def ledgered(batch, ctx) -> None:
    """An I/O-bound agent (50 ms) that notes when each run began and ended, per inbox (the
    part of the source id before '/'), so a test can check no inbox ran twice at once."""
    import os

    inbox = batch[0].source_id.split("/")[0]
    began = wall()
    await asyncio.sleep(0.05)
    ended = wall()
    for event in batch:
        ctx.reply(f"reply {event.source_id}")
    line = json.dumps(
        {
            "inbox": inbox,
            "began": began,
            "ended": ended,
            "pid": os.getpid(),
            "events": [e.source_id for e in batch],
        }
    )
    with open(os.path.join(os.environ["ONWATCH_TEST_DIR"], "ledger"), "a") as handle:
        handle.write(line + "\n")


async def chaos_agent(batch, ctx) -> None:
    """The chaos run's agent: 50 ms of I/O, then a line in the ledger naming the inbox, the
    generation it ran under and the events (one write, so a SIGKILL leaves whole lines).
    An event whose key ends in '/ask' asks for an approval instead of replying."""
    inbox = batch[0].source_id.split("/")[0]
    began = wall()
    await asyncio.sleep(0.05)
    ended = wall()
    for event in batch:
        if event.source == "chat" and event.source_id.endswith("/ask"):
            ctx.ask_approval(event.source_id, 3600, f"approve {event.source_id}")
        else:
            ctx.reply(f"reply {event.source_id}")
    _append(
        "ledger",
        json.dumps(
            {
                "inbox": inbox,
                "began": began,
                "ended": ended,
                "pid": os.getpid(),
                "gen": ctx.gen,
                "ids": [e.id for e in batch],
                "events": [f"{e.source}:{e.source_id}" for e in batch],
            }
        ),
    )


async def io_bound(batch, ctx) -> None:
    """The benchmark's agent: 50 ms of waiting (a model call, an HTTP request)."""
    await asyncio.sleep(0.05)


async def replier(batch, ctx) -> None:
    """Replies at once to each event ("reply <source_id>")."""
    for event in batch:
        ctx.reply(f"reply {event.source_id}")


async def timed(batch, ctx) -> None:
    """20 ms of I/O; one ledger line per run: the inbox (the source id before '/'), when
    the run began, and when its first event was stored."""
    began = time.time()
    await asyncio.sleep(0.02)
    _append(
        "ledger",
        json.dumps(
            {
                "inbox": batch[0].source_id.split("/")[0],
                "began": began,
                "created": batch[0].created,
                "events": [e.source_id for e in batch],
            }
        ),
    )


async def failing(batch, ctx) -> None:
    """Raises: every run fails (its error names the inbox's events)."""
    raise RuntimeError(f"cannot handle {[e.source_id for e in batch]}")
