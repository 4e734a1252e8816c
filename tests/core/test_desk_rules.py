"""The engine's side of the desk's round three (docs/rules.md): who answered an approval and
why reaches the agent, messages leave in the order they were written, and an operator
action's outcome says exactly what its audit entry recorded."""

from __future__ import annotations

import pytest

from onwatch.core import Reply

from .conftest import T

pytestmark = pytest.mark.backends  # the conformance suite: once per backend


async def run_once(box, holder="W", now=None, **finish):
    gen = await box.acquire(holder, now=now)
    batch = await box.claim_batch(holder, gen, now=now)
    if batch:
        await box.finish(holder, gen, [e.id for e in batch], now=now, **finish)
    return gen, batch


async def queue(box, key, *bodies, now=None):
    await box.ingest("chat", key, None, now=now)
    await run_once(box, now=now, messages=list(bodies))


# --- the outcome follows the audit entry -----------------------------------------------------


async def test_act_applied_is_what_the_audit_entry_recorded(inbox):
    await inbox.request_approval("r1", 3600, "refund 5", now=T)
    first = await inbox.act("approve", "r1", now=T + 1, actor="ana")
    again = await inbox.act("approve", "r1", now=T + 2, actor="bo")
    entries = await inbox.audit(target="approval r1")
    assert [e.applied for e in reversed(entries)] == [True, False]
    assert (first.applied, again.applied) == (True, False)  # "yes" stands, but bo applied nothing
    assert not again and again.result == "yes" and again.reason == "already answered"
    expired = await inbox.act("expire", "r1", now=T + 3, actor="cy")
    assert not expired.applied and not (await inbox.audit(limit=1))[0].applied


async def test_a_late_approve_that_stores_expired_is_not_applied(inbox):
    await inbox.request_approval("r1", 60, "refund 5", now=T)
    outcome = await inbox.act("approve", "r1", now=T + 61, actor="ana")
    [entry] = await inbox.audit(target="approval r1")
    assert outcome.applied is entry.applied is False
    assert outcome.result == "expired" and outcome.after == "expired"


# --- the answer event ---------------------------------------------------------------------------


async def test_the_answer_event_says_who_answered_and_why(inbox):
    await inbox.request_approval("r1", 3600, "refund 5", now=T)
    await inbox.act("deny", "r1", now=T + 5, actor="ana", reason="duplicate order")
    [event] = await inbox.events("pending")
    assert event.payload == {
        "request_id": "r1",
        "answer": "no",
        "action": "refund 5",
        "answered_by": "ana",
        "reason": "duplicate order",
    }


async def test_an_answer_without_a_reason_carries_none(inbox):
    await inbox.request_approval("r1", 3600, "refund 5", now=T)
    assert await inbox.answer_approval("r1", "yes", now=T + 5, actor="bo") == "yes"
    [event] = await inbox.events("pending")
    assert (event.payload["answered_by"], event.payload["reason"]) == ("bo", None)


async def test_an_expiry_says_who_expired_it_and_why(inbox):
    await inbox.request_approval("late", 60, "refund 5", now=T)
    await inbox.request_approval("idle", 60, "refund 6", now=T)
    await inbox.request_approval("ops", 3600, "refund 7", now=T)
    assert await inbox.answer_approval("late", "yes", now=T + 61, actor="ana") == "expired"
    await inbox.run_scheduler(now=T + 61)  # expires "idle"; "late" has its answer already
    assert await inbox.expire_approval("ops", now=T + 62, actor="cy", reason="customer left")
    payloads = {e.source_id: e.payload for e in await inbox.events("pending")}
    assert {k: (p["answer"], p["answered_by"], p["reason"]) for k, p in payloads.items()} == {
        "late": ("expired", "ana", f"too late: deadline was {T + 60}"),
        "idle": ("expired", "scheduler", "no answer before the deadline"),
        "ops": ("expired", "cy", "customer left"),
    }


# --- written order ------------------------------------------------------------------------------


async def test_an_urgent_send_carries_what_was_held_before_it_in_order(inbox):
    """The refund agent's customer: "waiting for approval" is held inside the gap, then the
    denial is urgent. The customer must hear them in that order, in one send."""
    sent: list[str] = []
    await queue(inbox, "m0", "hello", now=T)
    assert await inbox.dispatch(sent.append, now=T) == 1  # the gap starts
    await queue(inbox, "m1", "waiting for approval", now=T + 60)
    assert await inbox.dispatch(sent.append, now=T + 60) == 0  # inside the gap: held
    await queue(inbox, "m2", Reply("denied", urgent=True), "anything else?", now=T + 120)
    assert await inbox.dispatch(sent.append, now=T + 120) == 2
    assert sent == ["hello", "waiting for approval\n\ndenied"]
    assert [m.body for m in await inbox.held_messages()] == ["anything else?"]
    assert await inbox.dispatch(sent.append, now=T + 180) == 0  # the gap did not restart…
    assert await inbox.dispatch(sent.append, now=T + 3600) == 1  # …and still holds
    assert sent[-1] == "anything else?"


async def test_a_failed_urgent_send_keeps_its_carried_messages_in_order(inbox):
    sent: list[str] = []
    await queue(inbox, "m0", "hello", now=T)
    await inbox.dispatch(sent.append, now=T)
    await queue(inbox, "m1", "first", Reply("second", urgent=True), now=T + 60)

    def down(text):
        raise OSError("no route")

    assert await inbox.dispatch(down, now=T + 60) == 0
    assert await inbox.dispatch(sent.append, now=T + 61) == 2
    assert sent[-1] == "first\n\nsecond"
