"""The seeded inbox the snapshot tests, the screenshots and the fleet's seed share.

`seed()` writes every state of every pane through the public Inbox API on a fake clock, so
the same file renders the same everywhere (`use_utc` for the clock times).
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

from onwatch.core.engine import intake as engine_intake
from onwatch.core import (
    RESERVED_SOURCES,
    ApprovalRequest,
    Event,
    FakeClock,
    FollowUp,
    Inbox,
    Reply,
)

T0 = 1_700_000_000  # 2023-11-14 22:13:20 UTC; screenshots and snapshots render in UTC


def use_utc() -> None:
    """Render clock times in UTC so screenshots and snapshots look the same everywhere."""
    os.environ["TZ"] = "UTC"
    if hasattr(time, "tzset"):
        time.tzset()


async def lease(inbox: Inbox, holder: str, *, now: int) -> int:
    """Take the lease for `holder` and return its generation; raise RuntimeError if it is
    refused (a seed writes its own file: a refusal means the seed's script is wrong)."""
    gen = await inbox.acquire(holder, now=now)
    if gen is None:
        raise RuntimeError(f"the seed's {holder} was refused the lease of {inbox.path}")
    return gen


async def seed(inbox: Inbox, clock: FakeClock, base: int = T0) -> None:
    """Fill `inbox` with one of everything: pending (one backing off, some hostile text),
    running, dead, interrupted, approvals waiting/answered/expired, timers, held and sent
    messages, a lease takeover and a refused stale write. Leaves the clock at `base` (T0
    by default; any instant, e.g. the wall clock's, to try it live)."""
    T0 = base  # noqa: N806  (every time below is relative to it)

    def at(t: int) -> int:
        clock.set(t)
        return t

    await inbox.configure(
        lost_claim_by_source={"stripe": "interrupt"}, lease_ttl=600, backoff_base=60
    )
    # A crash under generation 1: the stripe charge is interrupted, the poison event retried.
    now = at(T0 - 3000)
    await inbox.ingest(
        "stripe",
        "evt_1OqRm2",
        {"type": "charge.succeeded", "amount": 4200, "customer": "cus_Nf3"},
        now=now,
    )
    await inbox.ingest("webhook", "gh-poison-77", {"action": "opened", "size": "huge"}, now=now)
    gen_a = await lease(inbox, "worker-a", now=now)
    stale = await inbox.claim_batch("worker-a", gen_a, now=now)
    gen_b = await lease(inbox, "worker-b", now=at(T0 - 2390))  # takeover: generation 2

    async def run_b(t: int, **finish: Any) -> list[Event]:
        await inbox.acquire("worker-b", now=at(t))  # renews: same generation
        claimed = await inbox.claim_batch("worker-b", gen_b, now=t)
        if claimed and finish:
            await inbox.finish("worker-b", gen_b, [e.id for e in claimed], now=at(t + 5), **finish)
        return claimed

    for t in (T0 - 2390, T0 - 2260):  # the poison event's 2nd and 3rd attempts
        await run_b(t, error="MemoryError: payload too large to summarise")
    await inbox.finish(
        "worker-a", gen_a, [e.id for e in stale], messages=["late"], now=at(T0 - 2250)
    )  # worker-a wakes up: refused, fenced out
    # Timers, and an approval nobody answered (its expiry fires).
    await inbox.add_timer("sync-calendar", T0 - 9000, {"calendar": "team"}, every=3600)
    await inbox.add_timer(
        "billing-reconcile", T0 + 40_000, {"ledger": "eu"}, every=86_400, catch_up="each"
    )
    await inbox.add_timer("daily-digest", T0 + 3000, {"to": "alice"}, every=86_400)
    await inbox.request_approval(
        "delete-branch-old", 60, "git push origin --delete old-main", now=at(T0 - 2200)
    )
    await inbox.run_scheduler(now=at(T0 - 2100))
    # A run of three chat messages: replies, approvals, a follow-up timer.
    for i, text in enumerate(["can you refund order 991?", "it arrived broken", "thanks!"]):
        await inbox.ingest(
            "chat", f"msg-{i + 1}", {"from": "alice", "text": text}, now=at(T0 - 2000 + i * 5)
        )
    await run_b(
        T0 - 1900,
        messages=[
            "I've asked for approval to refund order 991.",
            Reply("Your refund is being reviewed.", urgent=True),
        ],
        approvals=[
            ApprovalRequest(
                "refund-ord-991",
                4 * 3600,
                "Refund $42.00 to alice@example.com for order 991 (arrived broken)",
            ),
            ApprovalRequest("deploy-prod-v2", 1800, "Deploy v2.3.1 to production"),
        ],
        timers=[FollowUp("check-refund-991", T0 + 7200, {"order": 991})],
    )
    await inbox.answer_approval("deploy-prod-v2", "yes", now=at(T0 - 1800))
    await inbox.dispatch(lambda text: None, now=at(T0 - 1700))  # the paced send goes out
    # More replies queue behind the gap.
    await inbox.ingest("chat", "msg-4", {"from": "alice", "text": "any news?"}, now=at(T0 - 1500))
    await run_b(
        T0 - 1400,
        messages=[
            "Still waiting on the refund approval.",
            "I'll tell you as soon as it is decided.",
        ],
    )
    await run_b(T0 - 900)
    await run_b(T0 - 400)
    # One event fails and backs off; one is running now under generation 2.
    await inbox.ingest("webhook", "gh-flaky-12", {"action": "synchronize"}, now=at(T0 - 45))
    await run_b(T0 - 40, error="ConnectionResetError: GitHub API closed the connection")
    await inbox.run_scheduler(now=at(T0 - 30))  # the calendar sync comes due
    await inbox.ingest(
        "email", "<CA+x91@mail.example.com>", {"subject": "Invoice 2231"}, now=at(T0 - 25)
    )
    await run_b(T0 - 20)
    # Pending: fresh arrivals, one of them hostile (shown literally, never interpreted).
    for i, (source, source_id, payload) in enumerate(
        [
            ("webhook", "gh-delivery-4411", {"action": "opened", "number": 4411}),
            ("chat", "msg-5", {"from": "bob", "text": "hello?"}),
            ("webhook", "[@click=app.quit]x[/]", {"text": "\x1b]0;pwned\x07 [bold red]z"}),
            ("timer", "daily-digest@1699920000", {"timer": "daily-digest"}),
        ]
    ):
        if source in RESERVED_SOURCES:  # an occurrence as the scheduler writes it: the
            # engine's own source, refused to outsiders, so written the way the engine does
            await inbox._db.write(
                engine_intake.ingest_many,
                [(source, source_id, json.dumps(payload), at(T0 - 15 + i * 3))],
            )
            continue
        await inbox.ingest(source, source_id, payload, now=at(T0 - 15 + i * 3))
    # Who watches: worker-b holds the lease; worker-c stands by on another machine.
    await inbox.worker_seen("worker-b", host="box-b", pid=4242, now=T0 - 2390)
    await inbox.worker_seen("worker-c", host="box-c", pid=77, now=T0 - 600)
    await inbox.worker_seen("worker-b", host="box-b", pid=4242, now=T0 - 20)
    await inbox.worker_seen("worker-c", host="box-c", pid=77, now=T0 - 10)
    clock.set(T0)


async def open_seeded(path: str, base: int = T0) -> tuple[Inbox, FakeClock]:
    """Create a fresh inbox at `path`, seed it, and return it with its clock (at `base`)."""
    clock = FakeClock(base)
    inbox = await Inbox.open(path, clock=clock)
    try:
        await seed(inbox, clock, base)
    except BaseException:
        await inbox.close()
        raise
    return inbox, clock
