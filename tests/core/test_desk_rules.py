"""The engine's side of the desk's round three (docs/rules.md): who answered an approval and
why reaches the agent, messages leave in the order they were written, and an operator
action's outcome says exactly what its audit entry recorded."""

from __future__ import annotations

import pytest

from onwatch.core import BadInput, Reply

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


# --- run now ------------------------------------------------------------------------------------


async def fail_once(box, key, now):
    """One event failed once: pending again, waiting out its backoff (10 s after attempt 1)."""
    await box.ingest("chat", key, None, now=now)
    gen = await box.acquire("W", now=now)
    [event] = await box.claim_batch("W", gen, now=now)
    await box.finish("W", gen, [event.id], error="TimeoutError: the API did not answer", now=now)
    return event.id


async def test_run_now_ends_a_backoff_and_keeps_the_attempts(inbox):
    await inbox.configure(backoff_base=600)
    event_id = await fail_once(inbox, "m1", T)
    gen = await inbox.acquire("W", now=T + 5)
    assert await inbox.claim_batch("W", gen, now=T + 5) == []  # waiting out its backoff
    outcome = await inbox.act(
        "run_now", event_id, expect="pending", now=T + 6, actor="ana", reason="API is back"
    )
    assert outcome.applied and (outcome.before, outcome.after) == ("pending", "pending")
    [event] = await inbox.claim_batch("W", gen, now=T + 6)
    assert (event.id, event.attempts) == (event_id, 2)  # the same retry, sooner
    [entry] = await inbox.audit(target=f"event {event_id}", limit=1)
    assert (entry.action, entry.actor, entry.applied, entry.reason) == (
        "run_now",
        "ana",
        True,
        "API is back",
    )


async def test_run_now_refuses_what_is_not_waiting_and_changes_nothing(inbox):
    await inbox.ingest("chat", "fresh", None, now=T)
    fresh = await inbox.act("run_now", 1, expect="pending", now=T)
    assert not fresh and fresh.reason == "not waiting out a backoff: it is available now"
    await inbox.bury(1, now=T)
    dead = await inbox.act("run_now", 1, expect="pending", now=T)
    assert not dead and dead.reason == "changed meanwhile: it is dead now, not pending"
    assert (await inbox.get_event(1)).status == "dead"
    missing = await inbox.act("run_now", 99, now=T)
    assert not missing and missing.reason == "no such event"
    runs = [e for e in await inbox.audit() if e.action == "run_now"]
    assert [e.applied for e in runs] == [False, False, False]


# --- timer actions ------------------------------------------------------------------------------


async def test_fire_a_timer_now_fires_its_next_occurrence_once(inbox):
    await inbox.add_timer("digest", T + 3600, {"kind": "digest"}, every=86_400)
    outcome = await inbox.act("fire_timer", "digest", expect="scheduled", now=T, actor="ana")
    assert outcome.applied and (outcome.before, outcome.after) == ("scheduled", "fired")
    [event] = await inbox.events("pending")
    assert (event.source, event.source_id) == ("timer", f"digest@{T + 3600}")
    assert event.payload["late_by"] == -3600 and event.payload["fired_by"] == "ana"
    assert event.available_at == T  # runs now, not at its scheduled time
    [timer] = await inbox.timers()
    assert timer.due == T + 3600 + 86_400  # moved on: the scheduler will not fire it again
    assert await inbox.run_scheduler(now=T + 3600) == 0
    assert (await inbox.counts())["pending"] == 1


async def test_a_one_off_timer_fired_now_is_gone(inbox):
    await inbox.add_timer("remind", T + 60, None)
    assert await inbox.act("fire_timer", "remind", expect="scheduled", now=T)
    assert await inbox.timers() == []
    [event] = await inbox.events("pending")
    assert event.source_id == f"remind@{T + 60}"


async def test_a_paused_timer_does_not_fire_until_resumed(inbox):
    await inbox.add_timer("digest", T + 60, None, every=3600)
    assert (await inbox.act("pause_timer", "digest", expect="scheduled", now=T)).applied
    [timer] = await inbox.timers()
    assert (timer.paused, timer.state) == (True, "paused")
    assert await inbox.run_scheduler(now=T + 7200) == 0
    assert await inbox.next_timer_due() is None  # nothing to wake a worker for
    # A deploy registering the schedule again does not undo the operator's pause.
    await inbox.add_timer("digest", T + 60, None, every=3600)
    assert (await inbox.timers())[0].paused
    again = await inbox.act("pause_timer", "digest", expect="scheduled", now=T + 7200)
    assert not again and again.reason == "changed meanwhile: it is paused now, not scheduled"
    assert (await inbox.act("resume_timer", "digest", expect="paused", now=T + 7200)).applied
    assert await inbox.run_scheduler(now=T + 7200) == 1  # what it missed, coalesced
    [event] = await inbox.events("pending")
    assert event.payload["skipped"] == 1


async def test_delete_a_timer_and_refuse_an_approval_deadline(inbox):
    await inbox.add_timer("digest", T + 60, None, every=3600)
    await inbox.request_approval("r1", 3600, "refund 5", now=T)
    assert (await inbox.act("delete_timer", "digest", expect="scheduled", now=T)).after == (
        "deleted"
    )
    [deadline] = await inbox.timers()
    refused = await inbox.act("delete_timer", deadline.id, now=T)
    assert not refused and "answer or expire the approval" in refused.reason
    gone = await inbox.act("fire_timer", "digest", now=T)
    assert not gone and gone.reason == "no such timer"
    assert [t.id for t in await inbox.timers()] == [deadline.id]


# --- dead events grouped by error --------------------------------------------------------------


async def bury_with(box, key, error, now):
    await box.ingest("hook", key, None, now=now)
    gen = await box.acquire("W", now=now)
    [event] = await box.claim_batch("W", gen, now=now)
    await box.finish("W", gen, [event.id], error=error, now=now)
    return event.id


async def test_dead_events_group_by_the_first_line_and_requeue_as_shown(inbox):
    await inbox.configure(max_attempts=1)
    parse = [
        await bury_with(inbox, f"p{i}", f"ValueError: bad json\nline {i}", T) for i in range(3)
    ]
    other = await bury_with(inbox, "t0", "TimeoutError: slow", T)
    groups = await inbox.dead_groups()
    lines = [(g.line, g.count) for g in groups]
    assert lines == [
        ("too many attempts (1/1): ValueError: bad json", 3),
        ("too many attempts (1/1): TimeoutError: slow", 1),
    ]
    line = groups[0].line
    shown = await inbox.dead_group_ids(line)
    assert shown == parse
    # Meanwhile another event dies of the same error: it was not shown, it is not touched.
    late = await bury_with(inbox, "p9", "ValueError: bad json\nlater", T + 1)
    outcomes = await inbox.requeue_group(line, shown, now=T + 2, actor="ana", reason="fixed")
    assert [o.applied for o in outcomes] == [True, True, True]
    assert {e.id for e in await inbox.events("pending")} == set(parse)
    assert {e.id for e in await inbox.events("dead")} == {other, late}
    for event_id in parse:
        [entry] = await inbox.audit(target=f"event {event_id}", limit=1)
        assert (entry.action, entry.actor, entry.reason) == ("requeue", "ana", "fixed")


async def test_a_group_requeue_skips_what_left_the_group_since(inbox):
    await inbox.configure(max_attempts=1)
    first = await bury_with(inbox, "a", "ValueError: one", T)
    second = await bury_with(inbox, "b", "ValueError: one", T)
    [group] = await inbox.dead_groups()
    shown = await inbox.dead_group_ids(group.line)
    await inbox.requeue(second, now=T + 1)  # someone requeued it; it died of another error
    gen = await inbox.acquire("W", now=T + 2)
    await inbox.claim_batch("W", gen, now=T + 2)
    await inbox.finish("W", gen, [second], error="KeyError: two", now=T + 2)
    outcomes = await inbox.requeue_group(group.line, shown, now=T + 3)
    assert [(o.target, o.applied) for o in outcomes] == [
        (f"event {first}", True),
        (f"event {second}", False),
    ]
    assert outcomes[1].reason == "no longer in this group: it died of something else since"
    assert (await inbox.get_event(second)).status == "dead"


# --- workers ------------------------------------------------------------------------------------


async def test_workers_say_who_holds_the_lease_and_who_stands_by(inbox):
    await inbox.worker_seen("box-1:11", host="box-1", pid=11, now=T)
    await inbox.worker_seen("box-2:22", host="box-2", pid=22, now=T + 5)
    assert await inbox.acquire("box-1:11", now=T + 10) == 1
    await inbox.worker_seen("box-1:11", host="box-1", pid=11, now=T + 20)  # a heartbeat
    holder, standby = await inbox.workers(now=T + 30)
    assert (holder.holder, holder.holds, holder.gen, holder.since) == ("box-1:11", True, 1, T + 10)
    assert (holder.host, holder.pid, holder.started, holder.seen) == ("box-1", 11, T, T + 20)
    assert (standby.holder, standby.holds, standby.gen, standby.started) == (
        "box-2:22",
        False,
        None,
        T + 5,
    )
    await inbox.worker_gone("box-2:22")
    assert [w.holder for w in await inbox.workers(now=T + 30)] == ["box-1:11"]
    # A restarted process under the same name starts again.
    await inbox.worker_seen("box-1:11", host="box-1", pid=99, now=T + 40)
    [again] = await inbox.workers(now=T + 40)
    assert (again.pid, again.started) == (99, T + 40)


async def test_a_renewal_carries_the_holders_heartbeat_in_its_transaction(inbox):
    gen = await inbox.acquire("box-1:11", now=T)
    assert await inbox.renew("box-1:11", gen, now=T + 10, host="box-1", pid=11) is True
    [holder] = await inbox.workers(now=T + 10)
    assert (holder.holds, holder.host, holder.pid, holder.started, holder.seen) == (
        True,
        "box-1",
        11,
        T + 10,
        T + 10,
    )
    assert (await inbox.lease_info()).until == T + 10 + inbox.settings.lease_ttl
    # A renewal refused (another generation holds now) still says the process is there.
    assert await inbox.acquire("box-2:22", now=T + 10_000) == gen + 1
    assert await inbox.renew("box-1:11", gen, now=T + 10_001, host="box-1", pid=11) is False
    seen = {w.holder: w.seen for w in await inbox.workers(now=T + 10_001)}
    assert seen == {"box-1:11": T + 10_001}
    # Half a heartbeat is refused, and nothing is written.
    with pytest.raises(BadInput, match="host and pid"):
        await inbox.renew("box-2:22", gen + 1, now=T + 10_002, host="box-2")
    assert (await inbox.lease_info()).until == T + 10_000 + inbox.settings.lease_ttl
    assert {w.holder for w in await inbox.workers(now=T + 10_002)} == {"box-1:11"}


# --- an approval's trail ------------------------------------------------------------------------


async def test_an_approval_links_the_event_that_asked_and_the_answer_event(inbox):
    from onwatch.core import ApprovalRequest

    await inbox.ingest("chat", "m1", {"text": "refund 5"}, now=T)
    gen = await inbox.acquire("W", now=T)
    [event] = await inbox.claim_batch("W", gen, now=T)
    await inbox.finish(
        "W", gen, [event.id], approvals=[ApprovalRequest("refund-m1", 3600, "refund 5")], now=T
    )
    trail = await inbox.approval_trail("refund-m1")
    assert (trail.asked_by, trail.answer_event) == ((event.id,), None)
    assert await inbox.approvals_asked_by(event.id) == ["refund-m1"]
    await inbox.act("approve", "refund-m1", now=T + 5)
    [answer] = await inbox.events("pending")
    trail = await inbox.approval_trail("refund-m1")
    assert trail.answer_event == answer.id and trail.run_id == event.run_id
    assert await inbox.approval_trail("never") is None
    assert await inbox.approvals_asked_by(answer.id) == []
