"""The twelve reference scenarios (docs/rules.md#the-reference-scenarios), each with its
exact expected outcome."""

from __future__ import annotations

import pytest

from onwatch.core import FakeClock, Inbox

from .conftest import DAY, T

pytestmark = pytest.mark.backends  # the conformance suite: once per backend


async def test_1_webhook_delivered_twice(inbox):
    assert await inbox.ingest("github", "delivery-1", {"n": 1}) is True
    assert await inbox.ingest("github", "delivery-1", {"n": 1}) is False
    assert (await inbox.counts())["pending"] == 1
    assert len(await inbox.events("pending")) == 1


async def test_2_two_workers_ask_at_the_same_instant(inbox):
    assert await inbox.acquire("A", now=T) == 1
    assert await inbox.acquire("B", now=T) is None
    lease = await inbox.lease_info()
    assert (lease.holder, lease.gen, lease.until) == ("A", 1, T + 120)


async def test_3_three_quick_chat_messages_make_one_run(inbox):
    for i in range(3):
        await inbox.ingest("chat", f"msg-{i}", {"text": f"hi {i}"}, now=T)
    gen = await inbox.acquire("W", now=T)
    batch = await inbox.claim_batch("W", gen, now=T)
    assert [e.source_id for e in batch] == ["msg-0", "msg-1", "msg-2"]
    assert all(e.status == "running" and e.attempts == 1 for e in batch)


async def test_4_stall_takeover_and_the_late_finish_is_refused(inbox):
    await inbox.ingest("chat", "msg-3", {"text": "hello"}, now=T)
    assert await inbox.acquire("A", now=T + 10) == 1
    [claimed] = await inbox.claim_batch("A", 1, now=T + 10)
    assert claimed.source_id == "msg-3"
    # A stalls. B asks too early, then after A's lease lapsed.
    assert await inbox.acquire("B", now=T + 60) is None
    assert await inbox.acquire("B", now=T + 10 + 121) == 2
    [again] = await inbox.claim_batch("B", 2, now=T + 10 + 121)
    assert again.id == claimed.id and again.attempts == 2
    assert await inbox.finish("B", 2, [again.id], ["reply to msg-3"], now=T + 10 + 122)
    # B's lease lapses too; A wakes up and takes over: a new generation, not its old one.
    late = T + 10 + 121 + 121
    assert await inbox.acquire("A", now=late) == 3
    assert await inbox.finish("A", 1, [claimed.id], ["duplicate reply"], now=late) is False
    event = await inbox.get_event(claimed.id)
    assert (event.status, event.attempts) == ("done", 2)
    assert [m.body for m in await inbox.held_messages()] == ["reply to msg-3"]
    refused = [a for a in await inbox.audit() if not a.applied]
    assert refused and refused[0].action == "refused finish" and refused[0].target == "gen 1"
    assert (await inbox.overview(now=late)).refused_writes == 1


async def test_5_poison_event_is_isolated_and_dies(inbox):
    await inbox.ingest("chat", "poison", {"text": "crashes the agent"}, now=T)
    await inbox.ingest("chat", "healthy", {"text": "fine"}, now=T)
    now = T

    async def next_worker(name):
        nonlocal now
        gen = await inbox.acquire(name, now=now)
        assert gen is not None
        batch = await inbox.claim_batch(name, gen, now=now)
        return gen, batch

    gen, batch = await next_worker("W0")
    assert [e.source_id for e in batch] == ["poison", "healthy"]
    for name in ("W1", "W2"):  # each crashes; the next starts after its lease expired
        now += 121
        gen, batch = await next_worker(name)
        assert [e.source_id for e in batch] == ["poison"]
    now += 121
    gen, batch = await next_worker("W3")
    assert [e.source_id for e in batch] == ["healthy"]
    assert await inbox.finish("W3", gen, [batch[0].id], now=now)
    poison, healthy = await inbox.events("dead"), await inbox.get_event(batch[0].id)
    assert [e.source_id for e in poison] == ["poison"]
    assert poison[0].attempts == 3 and "too many attempts" in poison[0].error
    assert (healthy.status, healthy.attempts) == ("done", 2)
    now += 121
    gen, batch = await next_worker("W4")
    assert batch == []


async def test_6_timers_fire_once_dedupe_and_coalesce(inbox):
    await inbox.add_timer("digest", T, {"kind": "daily digest"}, every=DAY)
    assert await inbox.run_scheduler(now=T) == 1
    assert await inbox.run_scheduler(now=T) == 0
    # A deploy re-registers the schedule with its old due time: the replay is a duplicate.
    await inbox.add_timer("digest", T, {"kind": "daily digest"}, every=DAY)
    assert await inbox.run_scheduler(now=T) == 1
    assert (await inbox.counts())["pending"] == 1
    [timer] = await inbox.timers()
    next_due = timer.due
    assert next_due == T + DAY
    outage_end = next_due + 3 * DAY + 600
    assert await inbox.run_scheduler(now=outage_end) == 1
    events = await inbox.events("pending")
    assert len(events) == 2
    newest = events[-1].payload
    assert newest["skipped"] == 3 and newest["late_by"] == 600
    assert newest["scheduled_for"] == next_due + 3 * DAY
    [timer] = await inbox.timers()
    assert timer.due - outage_end == 23 * 3600 + 50 * 60  # 23.8 hours later
    assert timer.last_skipped == 3


async def test_7_approvals_with_a_four_hour_window(inbox):
    hour = 3600
    # Expiry timer ran at T+5h, then "yes" at T+6h.
    await inbox.request_approval("r1", 4 * hour, "refund 40 EUR", now=T)
    assert await inbox.run_scheduler(now=T + 5 * hour) == 1
    assert await inbox.answer_approval("r1", "yes", now=T + 6 * hour) == "expired"
    # "yes" at T+5h with the scheduler not yet run: the deadline is checked at answer time.
    await inbox.request_approval("r2", 4 * hour, "refund 50 EUR", now=T)
    assert await inbox.answer_approval("r2", "yes", now=T + 5 * hour) == "expired"
    # In time: the first answer stands, a second tap and the expiry timer change nothing.
    await inbox.request_approval("r3", 4 * hour, "refund 60 EUR", now=T)
    assert await inbox.answer_approval("r3", "yes", now=T + hour) == "yes"
    assert await inbox.answer_approval("r3", "no", now=T + 2 * hour) == "yes"
    await inbox.run_scheduler(now=T + 5 * hour)
    assert (await inbox.get_approval("r3")).answer == "yes"
    assert await inbox.answer_approval("never-asked", "yes", now=T) == "unknown"
    # Every request resumed the session exactly once, under ('approval', request_id).
    answers = {
        e.source_id: e.payload["answer"]
        for e in await inbox.events("pending")
        if e.source == "approval"
    }
    assert answers == {"r1": "expired", "r2": "expired", "r3": "yes"}


async def test_8_outbox_paces_and_coalesces(inbox):
    sent: list[str] = []
    gen = await inbox.acquire("W", now=T - 7200)
    await inbox.ingest("chat", "earlier", None, now=T - 7200)
    [e] = await inbox.claim_batch("W", gen, now=T - 7200)
    await inbox.finish("W", gen, [e.id], ["earlier update"], now=T - 7200)
    assert await inbox.dispatch(sent.append, now=T - 7200) == 1
    sends_per_minute = {}
    for minute in (0, 10, 20):
        now = T + minute * 60
        gen = await inbox.acquire("W", now=now)
        await inbox.ingest("chat", f"u{minute}", None, now=now)
        [e] = await inbox.claim_batch("W", gen, now=now)
        await inbox.finish("W", gen, [e.id], [f"update {minute // 10}"], now=now)
        sends_per_minute[minute] = await inbox.dispatch(sent.append, now=now)
    sends_per_minute[61] = await inbox.dispatch(sent.append, now=T + 61 * 60)
    assert sends_per_minute == {0: 1, 10: 0, 20: 0, 61: 2}
    assert sent[1:] == ["update 0", "update 1\n\nupdate 2"]
    assert await inbox.held_messages() == []


async def test_9_restart_before_claim(path, clock):
    async with await Inbox.open(path, clock=clock) as box:
        await box.ingest("cron", "wake-1", {"tick": 1})
    async with await Inbox.open(path, clock=clock) as box:
        gen = await box.acquire("W")
        assert [e.source_id for e in await box.claim_batch("W", gen)] == ["wake-1"]
        assert await box.claim_batch("W", gen) == []


async def test_10_restart_during_a_run_under_interrupt(path):
    clock = FakeClock(T)
    async with await Inbox.open(path, clock=clock) as box:
        await box.configure(on_lost_claim="interrupt")
        await box.ingest("stripe", "refund-7", {"amount": 70})
        gen = await box.acquire("A")
        [event] = await box.claim_batch("A", gen)
    clock.advance(121)  # A is gone (process restart); its lease lapses
    async with await Inbox.open(path, clock=clock) as box:
        gen = await box.acquire("B")
        assert gen == 2
        assert await box.claim_batch("B", gen) == []
        interrupted = await box.get_event(event.id)
        assert interrupted.status == "interrupted" and "uncertain" in interrupted.error
        clock.advance(10_000)  # never retried automatically
        gen = await box.acquire("B")
        assert await box.claim_batch("B", gen) == []
        assert [e.id for e in await box.events("interrupted")] == [event.id]
        assert await box.resolve(event.id, actor="ops", reason="refund was made")
        assert (await box.get_event(event.id)).status == "done"


async def test_11_result_stored_delivery_failed(inbox):
    await inbox.ingest("chat", "q1", {"text": "status?"})
    gen = await inbox.acquire("W")
    [event] = await inbox.claim_batch("W", gen)
    assert await inbox.finish("W", gen, [event.id], ["all good"], result={"answer": "all good"})
    calls: list[str] = []

    def broken(text):
        calls.append(text)
        raise ConnectionError("channel down")

    assert await inbox.dispatch(broken) == 0
    assert [m.body for m in await inbox.held_messages()] == ["all good"]
    delivered: list[str] = []
    assert await inbox.dispatch(delivered.append) == 1
    assert delivered == ["all good"] and delivered[0].key == calls[0].key
    [run] = await inbox.runs(event.id)
    assert run.outcome == "done" and run.result == {"answer": "all good"}
    assert len(await inbox.runs(event.id)) == 1  # the agent never ran again


async def test_12_cancel_a_waiting_task(inbox):
    await inbox.ingest("chat", "wait", None)
    await inbox.ingest("chat", "busy", None)
    gen = await inbox.acquire("W")
    batch = await inbox.claim_batch("W", gen)
    await inbox.ingest("chat", "later", None)
    [later] = await inbox.events("pending")
    assert await inbox.cancel(later.id, actor="ops")
    assert await inbox.cancel(batch[0].id, actor="ops") is False
    entry = (await inbox.audit(limit=1))[0]
    assert not entry.applied and "running" in entry.reason
    assert (await inbox.get_event(batch[0].id)).status == "running"
    assert await inbox.finish("W", gen, [e.id for e in batch])
    assert await inbox.claim_batch("W", gen) == []
    assert (await inbox.get_event(later.id)).status == "cancelled"
