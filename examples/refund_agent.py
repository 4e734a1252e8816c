"""The example agent: chat echo, refunds behind an approval, and a daily digest.

Run it on an inbox:

    onwatch init alice.db
    onwatch worker alice.db --agent examples.refund_agent:handle \\
        --setup examples.refund_agent:ensure_digest
    onwatch ingest alice.db chat msg-1 '{"text": "hello"}'      # → "echo: hello"
    onwatch ingest alice.db chat msg-2 '{"text": "refund 5"}'   # asks for approval
    onwatch approve alice.db refund-msg-2                       # → refunds 5, replies

The refund goes through the run context's effect journal: the intent is stored before the
(fake) payment call and confirmed after, and the call gets the journal's idempotency key. Set
ONWATCH_EXAMPLE_LEDGER to a file path to see the refunds the fake payment tool performed.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import re
from typing import Any

from onwatch import Event, Inbox, RunContext

DAY = 86_400
APPROVAL_WINDOW = 4 * 3600
REFUND = re.compile(r"^\s*refund\s+(\d{1,9})\s*$", re.IGNORECASE)
LEDGER_ENV = "ONWATCH_EXAMPLE_LEDGER"


def message_text(payload: Any) -> str:
    """The text of a chat payload: {"text": ...} or a bare string."""
    if isinstance(payload, dict):
        return str(payload.get("text", ""))
    return "" if payload is None else str(payload)


def refund_request_id(event: Event) -> str:
    """The approval request id for a refund asked in `event` (stable across retries)."""
    return f"refund-{event.source_id}"


def fake_refund(amount: int, key: str) -> str:
    """A stand-in payment API: appends to the ledger file; dedupes on the idempotency key."""
    path = os.environ.get(LEDGER_ENV)
    if not path:
        return "refunded"
    try:
        with open(path, encoding="utf-8") as ledger:
            if any(json.loads(line).get("key") == key for line in ledger if line.strip()):
                return "already refunded"
    except FileNotFoundError:
        pass
    with open(path, "a", encoding="utf-8") as ledger:
        ledger.write(json.dumps({"amount": amount, "key": key}, sort_keys=True) + "\n")
        ledger.flush()
        os.fsync(ledger.fileno())
    return "refunded"


async def handle(batch: list[Event], ctx: RunContext) -> None:
    """The agent function: `onwatch worker PATH --agent examples.refund_agent:handle`."""
    handled: list[int] = []
    for event in batch:
        if event.source == "chat":
            await _chat(event, ctx)
        elif event.source == "approval":
            await _approval(event, ctx)
        elif (
            event.source == "timer"
            and isinstance(event.payload, dict)
            and event.payload.get("timer") == "digest"
        ):
            _digest(event, ctx)
        else:
            continue  # not ours: end silently
        handled.append(event.id)
    ctx.result = {"handled": handled}


async def _chat(event: Event, ctx: RunContext) -> None:
    text = message_text(event.payload)
    match = REFUND.match(text)
    if match is None:
        ctx.reply(f"echo: {text}")
        return
    amount = int(match.group(1))
    ctx.ask_approval(
        refund_request_id(event),
        APPROVAL_WINDOW,
        f"refund {amount} (asked in chat {event.source_id})",
    )
    ctx.reply(f"refund of {amount} is waiting for approval")


async def _approval(event: Event, ctx: RunContext) -> None:
    payload = event.payload if isinstance(event.payload, dict) else {}
    match = re.search(r"refund (\d+)", str(payload.get("action", "")))
    if not str(payload.get("request_id", "")).startswith("refund-") or match is None:
        return
    amount = int(match.group(1))
    answer = payload.get("answer")
    # The person who asked is waiting for the outcome: it bypasses the outbox gap.
    if answer == "yes":
        # The key is derived from the request, not the run: a retried run passes the same
        # key, so the payment API refunds once however often the run is repeated.
        request_id = payload["request_id"]
        async with ctx.effect(
            "refund",
            {"amount": amount, "request": request_id},
            key=f"refund:{request_id}",
            event=event,
        ) as key:
            outcome = fake_refund(amount, key)
        ctx.reply(f"{outcome} {amount} (reference {key})", urgent=True)
    elif answer == "no":
        ctx.reply(f"refund of {amount} was denied; nothing was refunded", urgent=True)
    else:
        ctx.reply(
            f"refund of {amount} expired without an answer; nothing was refunded", urgent=True
        )


def _digest(event: Event, ctx: RunContext) -> None:
    scheduled = event.payload.get("scheduled_for", ctx.now)
    day = dt.datetime.fromtimestamp(scheduled, dt.timezone.utc).date().isoformat()
    skipped = event.payload.get("skipped", 0)
    extra = f" (covers {skipped} missed day{'s' if skipped != 1 else ''})" if skipped else ""
    ctx.reply(f"daily digest for {day}{extra}")


async def ensure_digest(inbox: Inbox, *, hour: int = 8) -> int:
    """Register the daily "digest" timer (coalescing catch-up) unless it exists; return its
    next due time. Leaves an existing schedule alone, so restarts never move it."""
    for timer in await inbox.timers():
        if timer.id == "digest":
            return timer.due
    now = inbox.now()
    due = now - now % DAY + hour * 3600
    if due <= now:
        due += DAY
    await inbox.add_timer("digest", due, {"kind": "digest"}, every=DAY, catch_up="coalesce")
    return due
