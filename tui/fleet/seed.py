"""A seeded fleet folder for the fleet's tests, snapshots and screenshots (fake clock).

Every row state the Fleet view knows: an approval minutes from its deadline, approvals
waiting (one with no worker to act on the answer), work waiting with no worker (its lease
lost), dead and interrupted events, a lost lease with nothing waiting, a released one, a
busy healthy agent with runs and failures in the last hour and messages held, hostile inbox
names and action texts, and files that are not inboxes (foreign SQLite, not SQLite, empty).
"""

from __future__ import annotations

import os
import sqlite3

from onwatch.core import ApprovalRequest, FakeClock, Inbox

from ..seed import T0, lease, seed

HOSTILE_NAME = "[@click=app.quit]quit[b]x"  # a file name cannot hold a slash
ESCAPE_NAME = "\x1b]0;pwned\x07"
HOSTILE_ACTION = "[@click=app.quit]x[/] \x1b]0;pwned\x07 transfer everything"


async def _inbox(folder: str, name: str, clock: FakeClock) -> Inbox:
    return await Inbox.open(os.path.join(folder, f"{name}.db"), clock=clock)


async def _busy(
    inbox: Inbox, clock: FakeClock, holder: str, base: int, *, runs: int, failures: int
) -> None:
    """Runs spread over the last hour, some failing; leaves the lease held."""
    await inbox.configure(lease_ttl=600, backoff_base=1, max_attempts=100)
    step = 3000 // max(runs, 1)
    for i in range(runs):
        at = base - 3300 + i * step
        clock.set(at)
        await inbox.ingest("chat", f"{holder}-{i}", {"text": f"message {i}"}, now=at)
        gen = await lease(inbox, holder, now=at)
        batch = await inbox.claim_batch(holder, gen, now=at)
        every = max(runs // max(failures, 1), 1)
        error = "TimeoutError: the model did not answer" if i % every == 0 and failures else None
        await inbox.finish(
            holder,
            gen,
            [e.id for e in batch],
            now=at + 2,
            messages=[] if error else [f"reply {i}"],
            error=error,
        )
    clock.set(base)
    await inbox.acquire(holder, now=base - 60)


async def seed_fleet(folder: str, base: int = T0) -> FakeClock:
    """Fill `folder` with the fleet described above; return the clock (at `base`)."""
    clock = FakeClock(base)
    alice = await _inbox(folder, "alice", clock)
    await seed(alice, clock, base)
    await alice.close()

    bob = await _inbox(folder, "bob", clock)  # an approval seven minutes from its deadline
    await _busy(bob, clock, "worker-bob", base, runs=4, failures=0)
    await bob.request_approval(
        "wire-transfer-88", 420 + 600, "Wire $9,800 to ACME Ltd", now=base - 600
    )
    await bob.close()

    carol = await _inbox(folder, "carol", clock)  # a poison event went dead
    await carol.configure(max_attempts=1, backoff_base=1)
    await carol.ingest("webhook", "gh-poison-9", {"size": "huge"}, now=base - 900)
    gen = await lease(carol, "worker-carol", now=base - 900)
    claimed = await carol.claim_batch("worker-carol", gen, now=base - 900)
    await carol.finish(
        "worker-carol",
        gen,
        [e.id for e in claimed],
        now=base - 890,
        error="MemoryError: payload too large",
    )
    await carol.claim_batch("worker-carol", gen, now=base - 880)  # out of attempts: dead
    await carol.release("worker-carol", gen, now=base - 870)
    await carol.close()

    dave = await _inbox(folder, "dave", clock)  # its worker died: the lease lapsed, work waits
    await dave.ingest("chat", "d-1", {"text": "hello?"}, now=base - 400)
    await dave.acquire("worker-dave", now=base - 400)
    await dave.ingest("chat", "d-2", {"text": "anyone?"}, now=base - 100)
    await dave.close()

    gina = await _inbox(folder, "gina", clock)  # its worker died idle: nothing waits (yet)
    gen = await lease(gina, "worker-gina", now=base - 1500)
    await gina.ingest("chat", "g-1", {"text": "hi"}, now=base - 1500)
    batch = await gina.claim_batch("worker-gina", gen, now=base - 1500)
    await gina.finish("worker-gina", gen, [e.id for e in batch], now=base - 1490)
    await gina.close()

    erin = await _inbox(folder, "erin", clock)  # busy and healthy, with failures and held
    await _busy(erin, clock, "worker-erin", base, runs=24, failures=3)
    await erin.close()

    frank = await _inbox(folder, "frank", clock)  # quiet: released its lease on shutdown
    gen = await lease(frank, "worker-frank", now=base - 5000)
    await frank.release("worker-frank", gen, now=base - 4950)
    await frank.close()

    hostile = await _inbox(folder, HOSTILE_NAME, clock)
    await hostile.ingest("chat", "h-1", {"text": "hi"}, now=base - 300)
    gen = await lease(hostile, "[red]w[/red]", now=base - 300)
    batch = await hostile.claim_batch("[red]w[/red]", gen, now=base - 300)
    await hostile.finish(
        "[red]w[/red]",
        gen,
        [e.id for e in batch],
        now=base - 290,
        approvals=[ApprovalRequest("[@click=app.quit]go[/]", 86_400, HOSTILE_ACTION)],
    )
    await hostile.close()
    escaped = await _inbox(folder, ESCAPE_NAME, clock)
    await escaped.request_approval(
        "ok-\x1b[2J", 90_000, "\x1b]0;retitled\x07 reboot", now=base - 100
    )
    await escaped.close()

    foreign = sqlite3.connect(os.path.join(folder, "ledger.sqlite"))
    foreign.execute("CREATE TABLE entries (id INTEGER PRIMARY KEY, amount INTEGER)")
    foreign.commit()
    foreign.close()
    with open(os.path.join(folder, "notes.db"), "w", encoding="utf-8") as handle:
        handle.write("not a database\n")
    open(os.path.join(folder, "new.db"), "w").close()  # noqa: SIM115 - an empty file
    clock.set(base)
    return clock


__all__ = ["ESCAPE_NAME", "HOSTILE_ACTION", "HOSTILE_NAME", "seed_fleet"]
