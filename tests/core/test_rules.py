"""Each rule of docs/rules.md against the fault it exists for."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from onwatch.core import BadInput, BudgetExceeded, FakeClock, FollowUp, Inbox, Reply

from .conftest import DAY, T, is_postgresql

pytestmark = pytest.mark.backends  # the conformance suite: once per backend


async def run_once(box, holder="W", now=None, **finish):
    gen = await box.acquire(holder, now=now)
    batch = await box.claim_batch(holder, gen, now=now)
    if batch and finish is not None:
        await box.finish(holder, gen, [e.id for e in batch], now=now, **finish)
    return gen, batch


# --- intake ---------------------------------------------------------------------------------


async def test_dedupe_key_survives_payload_pruning(inbox):
    await inbox.ingest("github", "d-1", {"big": "x" * 1000}, now=T)
    await run_once(inbox, now=T)
    assert await inbox.prune_payloads(T + DAY, now=T + DAY) == 1
    event = (await inbox.events("done"))[0]
    assert event.payload is None and event.source_id == "d-1"
    assert await inbox.ingest("github", "d-1", {"big": "replayed"}, now=T + DAY) is False


async def test_concurrent_ingests_share_commits_with_per_caller_results(inbox):
    keys = [f"k{i % 40}" for i in range(100)]  # 60 duplicates among 100 calls
    results = await asyncio.gather(
        *(inbox.ingest("hook", k, {"i": i}) for i, k in enumerate(keys)), return_exceptions=True
    )
    assert sum(r is True for r in results) == 40 and sum(r is False for r in results) == 60
    assert (await inbox.counts())["pending"] == 40


async def test_max_pending_budget_refuses_only_the_excess(inbox):
    await inbox.configure(max_pending=2)
    results = await asyncio.gather(
        *(inbox.ingest("hook", f"k{i}", None) for i in range(4)), return_exceptions=True
    )
    assert results[:2] == [True, True]
    assert all(isinstance(r, BudgetExceeded) for r in results[2:])
    assert await inbox.ingest("hook", "k0", None) is False  # a duplicate is still a no-op
    assert (await inbox.counts())["pending"] == 2


# --- lease ----------------------------------------------------------------------------------


async def test_renewal_keeps_the_generation_and_takeover_by_the_same_holder_does_not(inbox):
    assert await inbox.acquire("A", now=T) == 1
    assert await inbox.acquire("A", now=T + 120) == 1  # until >= now: renewal
    assert (await inbox.lease_info()).until == T + 240
    assert await inbox.acquire("A", now=T + 241) == 2  # expired: even A starts a new one
    history = await inbox.lease_history()
    assert [(h.gen, h.how, h.previous_holder) for h in history] == [
        (2, "takeover", "A"),
        (1, "first", None),
    ]


async def test_a_fresh_acquire_never_continues_a_live_lease_even_under_its_own_name(inbox, path):
    # A starting worker (fresh=True) takes only a free or expired lease: two processes
    # started under one holder name must not both get generation 1.
    assert await inbox.acquire("A", now=T, fresh=True) == 1
    assert await inbox.acquire("A", now=T + 10, fresh=True) is None
    assert (await inbox.lease_info()).until == T + 120  # the live lease is left as it was
    assert await inbox.acquire("A", now=T + 10) == 1  # a renewal by the holder still renews
    assert await inbox.acquire("A", now=T + 131, fresh=True) == 2  # expired: a new one
    assert await inbox.release("A", 2, now=T + 140)
    assert await inbox.acquire("A", now=T + 140, fresh=True) == 3  # released: free
    assert [(h.gen, h.how) for h in await inbox.lease_history()] == [
        (3, "released"),
        (2, "takeover"),
        (1, "first"),
    ]
    with pytest.raises(BadInput, match="fresh"):
        await inbox.acquire("A", now=T + 141, fresh="yes")
    # Two starters at the same instant, each its own connection (its own process in the
    # worker): whatever the order, exactly one wins.
    others = [await Inbox.open(path, clock=FakeClock(T + 500)) for _ in range(2)]
    try:
        won = await asyncio.gather(*(o.acquire("B", fresh=True) for o in others))
    finally:
        for other in others:
            await other.close()
    assert sorted(won, key=str) == [4, None]


async def test_release_lets_a_successor_in_at_once_with_a_new_generation(inbox):
    gen = await inbox.acquire("A", now=T)
    assert await inbox.release("A", gen, now=T + 5)
    assert await inbox.acquire("B", now=T + 5) == 2
    assert await inbox.release("A", gen, now=T + 6) is False


async def test_a_routine_release_writes_no_audit_entry_and_stays_known(inbox):
    # A fleet worker releases an inbox after every visit: an audit row each time would
    # bury the operator's actions. The release is still known (overview, lease history).
    gen = await inbox.acquire("A", now=T)
    assert await inbox.release("A", gen, now=T + 5)
    assert await inbox.audit() == []
    assert (await inbox.overview(now=T + 6)).lease_released
    assert await inbox.acquire("B", now=T + 6) == 2
    assert [(c.gen, c.how) for c in await inbox.lease_history()] == [(2, "released"), (1, "first")]
    assert await inbox.audit() == []


async def test_renew_is_fenced_and_a_refused_renewal_is_audited(inbox):
    await inbox.acquire("A", now=T)
    assert await inbox.renew("A", 1, now=T + 100)
    assert await inbox.acquire("B", now=T + 221) == 2
    assert await inbox.renew("A", 1, now=T + 222) is False
    assert (await inbox.lease_info()).holder == "B"
    assert (await inbox.audit(limit=1))[0].action == "refused renew"


async def test_a_lapsed_lease_nobody_took_over_is_renewed_by_its_holder(inbox):
    """A late renewal (a stalled process, a wall clock stepped forward) keeps the generation
    when no other worker took the lease meanwhile: nobody else can have run its claims."""
    await inbox.ingest("chat", "m", None, now=T)
    gen = await inbox.acquire("A", now=T)
    [event] = await inbox.claim_batch("A", gen, now=T)
    later = T + 2 * 3600  # two hours on, far past the 120 s lease
    assert await inbox.renew("A", gen, now=later) is True
    assert (await inbox.lease_info()).until == later + 120
    assert await inbox.acquire("B", now=later + 1) is None  # renewed: B waits
    assert await inbox.finish("A", gen, [event.id], ["hi"], now=later + 1, run=event.run_id)
    view = await inbox.overview(now=later + 1)
    assert view.refused_writes == 0 and view.takeovers == 0


async def test_a_lease_handed_back_is_not_renewed(inbox):
    gen = await inbox.acquire("A", now=T)
    assert await inbox.release("A", gen, now=T + 1)
    assert await inbox.renew("A", gen, now=T + 2) is False
    assert await inbox.acquire("B", now=T + 2) == 2


async def test_a_stale_claim_writes_nothing_but_the_refusal(inbox):
    await inbox.ingest("chat", "m", None, now=T)
    await inbox.acquire("A", now=T)
    await inbox.acquire("B", now=T + 121)
    assert await inbox.claim_batch("A", 1, now=T + 122) == []
    assert (await inbox.counts())["pending"] == 1
    assert (await inbox.overview(now=T + 122)).refused_writes == 1


# --- claims ---------------------------------------------------------------------------------


async def test_max_batch_limits_one_run(inbox):
    await inbox.configure(max_batch=2)
    for i in range(5):
        await inbox.ingest("chat", f"m{i}", None)
    _, batch = await run_once(inbox)
    assert [e.source_id for e in batch] == ["m0", "m1"]


async def test_failed_run_backs_off_exponentially_and_dies_after_max_attempts(inbox):
    await inbox.configure(backoff_base=10, backoff_cap=15)
    await inbox.ingest("chat", "flaky", None, now=T)
    now = T
    waits = []
    for attempt in range(3):
        gen = await inbox.acquire("W", now=now)
        [event] = await inbox.claim_batch("W", gen, now=now)
        assert await inbox.finish("W", gen, [event.id], error=f"boom {attempt}", now=now)
        after = await inbox.get_event(event.id)
        if after.status == "pending":
            waits.append(after.available_at - now)
            assert await inbox.claim_batch("W", gen, now=after.available_at - 1) == []
            now = after.available_at
    assert waits == [10, 15]  # 10, then 20 capped at 15
    dead = await inbox.get_event(event.id)
    assert dead.status == "dead" and dead.error == "too many attempts (3/3): boom 2"


async def test_a_lowered_attempt_budget_buries_the_waiting_events_it_leaves_spent(inbox):
    await inbox.configure(backoff_base=10, backoff_cap=10)
    await inbox.ingest("chat", "flaky", None, now=T)
    gen = await inbox.acquire("W", now=T)
    for attempt in range(2):
        [event] = await inbox.claim_batch("W", gen, now=T + 10 * attempt)
        assert await inbox.finish("W", gen, [event.id], error=f"boom {attempt}", now=T)
    await inbox.configure(max_attempts=2)  # its two attempts are now all it had
    await inbox.ingest("chat", "fresh", None, now=T + 20)
    [claimed] = await inbox.claim_batch("W", gen, now=T + 20)
    assert claimed.source_id == "fresh"
    dead = await inbox.get_event(event.id)
    assert dead.status == "dead" and dead.error == "too many attempts (2/2): boom 1"


async def test_lost_claims_follow_the_per_source_policy(inbox):
    await inbox.configure(on_lost_claim="retry", lost_claim_by_source={"stripe": "interrupt"})
    await inbox.ingest("chat", "c1", None, now=T)
    await inbox.ingest("stripe", "s1", None, now=T)
    await inbox.acquire("A", now=T)
    await inbox.claim_batch("A", 1, now=T)
    await inbox.acquire("B", now=T + 121)
    [retried] = await inbox.claim_batch("B", 2, now=T + 121)
    assert retried.source == "chat" and retried.attempts == 2
    [stuck] = await inbox.events("interrupted")
    assert stuck.source == "stripe" and "generation 1" in stuck.error


async def test_a_lost_claim_out_of_attempts_is_buried_not_run_again(inbox):
    # Three workers in turn claim the same event and vanish (max_attempts 3, lease 120 s).
    # The fourth recovers it out of attempts: buried with why, and the fresh one runs.
    await inbox.ingest("chat", "worn", None, now=T)
    now = T
    for attempt in range(1, 4):
        gen = await inbox.acquire(f"W{attempt}", now=now)
        [claimed] = await inbox.claim_batch(f"W{attempt}", gen, now=now)
        assert (claimed.source_id, claimed.attempts) == ("worn", attempt)
        now += 121
    await inbox.ingest("chat", "fresh", None, now=now)
    gen = await inbox.acquire("W4", now=now)
    [claimed] = await inbox.claim_batch("W4", gen, now=now)
    assert claimed.source_id == "fresh"
    [dead] = await inbox.events("dead")
    assert dead.source_id == "worn" and dead.error.startswith("too many attempts (3/3): run lost")


async def test_run_longer_than_its_budget_is_treated_as_lost(inbox):
    await inbox.configure(max_run_seconds=60, lease_ttl=600)
    await inbox.ingest("chat", "slow", None, now=T)
    await inbox.acquire("W", now=T)
    [event] = await inbox.claim_batch("W", 1, now=T)
    assert await inbox.claim_batch("W", 1, now=T + 30) == []
    [again] = await inbox.claim_batch("W", 1, now=T + 61)
    assert again.id == event.id and again.attempts == 2
    assert await inbox.finish("W", 1, [event.id], now=T + 62)
    runs = await inbox.runs(event.id)
    assert [r.outcome for r in runs] == ["lost", "done"]


async def test_runs_per_day_budget_delays_the_excess(inbox):
    await inbox.configure(max_runs_per_day=2)
    for i in range(3):
        await inbox.ingest("chat", f"m{i}", None, now=T)
    await inbox.configure(max_batch=1)
    gen = await inbox.acquire("W", now=T)
    for _ in range(2):
        [e] = await inbox.claim_batch("W", gen, now=T)
        await inbox.finish("W", gen, [e.id], now=T)
    assert await inbox.claim_batch("W", gen, now=T + 60) == []  # delayed, not refused
    assert (await inbox.counts())["pending"] == 1
    gen = await inbox.acquire("W", now=T + DAY + 1)
    assert len(await inbox.claim_batch("W", gen, now=T + DAY + 1)) == 1


async def test_pause_stops_claims_but_never_intake(inbox):
    assert await inbox.pause(actor="ops", reason="investigating")
    assert await inbox.ingest("chat", "m", None) is True
    _, batch = await run_once(inbox)
    assert batch == []
    assert await inbox.resume(actor="ops")
    _, batch = await run_once(inbox)
    assert len(batch) == 1
    actions = [(a.action, a.actor, a.reason) for a in await inbox.audit()]
    assert ("pause", "ops", "investigating") in actions and ("resume", "ops", None) in actions


async def test_finish_changes_only_rows_still_running_under_that_generation(inbox):
    await inbox.ingest("chat", "a", None, now=T)
    await inbox.ingest("chat", "b", None, now=T)
    gen = await inbox.acquire("W", now=T)
    a, b = await inbox.claim_batch("W", gen, now=T)
    await inbox.finish("W", gen, [a.id], now=T)
    assert await inbox.finish("W", gen, [a.id], ["twice?"], now=T) is False
    assert await inbox.held_messages() == []
    assert await inbox.finish("W", gen, [a.id, b.id], ["once"], now=T)
    assert [m.body for m in await inbox.held_messages()] == ["once"]


async def test_finish_carries_follow_up_timers_atomically(inbox):
    await inbox.ingest("chat", "remind me", None, now=T)
    gen = await inbox.acquire("W", now=T)
    [e] = await inbox.claim_batch("W", gen, now=T)
    await inbox.acquire("X", now=T + 121)  # W lost the lease: nothing of its finish lands
    assert (
        await inbox.finish(
            "W",
            gen,
            [e.id],
            ["ok"],
            now=T + 121,
            timers=[FollowUp("remind", T + 3600, {"text": "ping"})],
        )
        is False
    )
    assert await inbox.timers() == [] and await inbox.held_messages() == []


# --- timers ---------------------------------------------------------------------------------


async def test_each_policy_makes_one_event_per_missed_occurrence(inbox):
    await inbox.add_timer("billing", T, None, every=DAY, catch_up="each")
    assert await inbox.run_scheduler(now=T + 3 * DAY + 5) == 1
    events = await inbox.events("pending")
    assert [e.source_id for e in events] == [f"billing@{T + i * DAY}" for i in range(4)]
    assert [e.payload["late_by"] for e in events] == [3 * DAY + 5, 2 * DAY + 5, DAY + 5, 5]


async def test_each_policy_caps_the_catch_up_and_counts_the_overflow(inbox):
    await inbox.configure(catch_up_limit=5)
    await inbox.add_timer("tick", T, None, every=60, catch_up="each")
    await inbox.run_scheduler(now=T + 60 * 99)  # 100 occurrences due
    events = await inbox.events("pending")
    assert len(events) == 5
    assert events[0].payload["overflow"] == 95
    [timer] = await inbox.timers()
    assert timer.overflow == 95 and timer.due == T + 60 * 100


async def test_a_one_off_with_a_fixed_key_dedupes_with_real_deliveries(inbox):
    await inbox.ingest("chat", "reminder-7", {"from": "user"})
    await inbox.add_timer("reminder", T, None, key=("chat", "reminder-7"))
    assert await inbox.run_scheduler(now=T) == 1
    assert (await inbox.counts())["pending"] == 1
    assert await inbox.timers() == []


async def test_cancel_timer_and_next_due(inbox):
    await inbox.add_timer("a", T + 50, None)
    await inbox.add_timer("b", T + 10, None)
    assert await inbox.next_timer_due() == T + 10
    assert await inbox.cancel_timer("b") is True
    assert await inbox.cancel_timer("b") is False
    assert await inbox.next_timer_due() == T + 50
    assert await inbox.run_scheduler(now=T + 49) == 0


async def test_a_clock_jump_backwards_fires_nothing_twice(inbox):
    await inbox.add_timer("digest", T, None, every=DAY)
    await inbox.run_scheduler(now=T + 5)
    assert await inbox.run_scheduler(now=T - 3600) == 0  # the clock went back an hour
    assert await inbox.run_scheduler(now=T + 5) == 0
    assert (await inbox.counts())["pending"] == 1


# --- approvals ------------------------------------------------------------------------------


async def test_asking_again_keeps_the_first_deadline(inbox):
    first = await inbox.request_approval("r", 3600, "refund 5", now=T)
    again = await inbox.request_approval("r", 7200, "refund 5", now=T + 600)
    assert first.due == again.due == T + 3600


async def test_operator_expiry_stores_expired_once(inbox):
    await inbox.request_approval("r", 3600, "refund 5", now=T)
    assert await inbox.expire_approval("r", now=T + 10, actor="ops") == "expired"
    assert await inbox.answer_approval("r", "yes", now=T + 11) == "expired"
    assert await inbox.expire_approval("r", now=T + 12) == "expired"
    assert await inbox.expire_approval("nope", now=T + 12) == "unknown"
    assert await inbox.timers() == []
    [event] = await inbox.events("pending")
    assert (event.source, event.source_id, event.payload["answer"]) == ("approval", "r", "expired")
    applied = [a for a in await inbox.audit() if a.applied]
    assert [(a.action, a.actor, a.before, a.after) for a in applied] == [
        ("expire", "ops", "waiting", "expired")
    ]


# --- outbox ---------------------------------------------------------------------------------


async def queue(box, *bodies, now=None):
    await box.ingest("chat", f"q{bodies}", None, now=now)
    await run_once(box, now=now, messages=list(bodies))


async def test_urgent_messages_bypass_the_gap_with_what_was_written_before_them(inbox):
    sent = []
    await queue(inbox, "routine", now=T)
    assert await inbox.dispatch(sent.append, now=T) == 1
    await queue(inbox, Reply("server down!", urgent=True), "details follow", now=T + 60)
    assert await inbox.dispatch(sent.append, now=T + 60) == 1
    assert sent == ["routine", "server down!"]  # what was written after it waits
    assert await inbox.dispatch(sent.append, now=T + 120) == 0
    assert await inbox.dispatch(sent.append, now=T + 3600) == 1
    assert sent[-1] == "details follow"


async def test_a_failing_channel_kills_the_delivery_after_too_many_attempts(inbox):
    await inbox.configure(max_delivery_attempts=2)
    await queue(inbox, "hello", now=T)

    def down(text):
        raise OSError("no route")

    assert await inbox.dispatch(down, now=T) == 0
    assert await inbox.dispatch(down, now=T + 1) == 0
    assert await inbox.held_messages() == []
    [delivery] = await inbox.deliveries()
    assert (delivery.status, delivery.attempts) == ("dead", 2)
    assert "no route" in delivery.last_error


async def test_at_most_once_never_resends(inbox):
    await inbox.configure(delivery="at_most_once")
    await queue(inbox, "only once", now=T)

    def down(text):
        raise OSError("lost")

    assert await inbox.dispatch(down, now=T) == 0
    calls = []
    assert await inbox.dispatch(calls.append, now=T + 7200) == 0 and calls == []


async def test_a_crash_between_send_and_record_resends_with_the_same_key(path, clock):
    box = await Inbox.open(path, clock=clock)
    await queue(box, "invoice ready", now=T)
    seen = []

    async def send_then_crash(text):
        seen.append(text.key)
        raise asyncio.CancelledError  # the process dies before recording the send

    with pytest.raises(asyncio.CancelledError):
        await box.dispatch(send_then_crash, now=T)
    await box.close()
    box = await Inbox.open(path, clock=clock)
    got = []
    assert await box.dispatch(got.append, now=T + 10) == 0  # still inside its send window
    assert await box.dispatch(got.append, now=T + 301) == 1
    assert got == ["invoice ready"] and got[0].key == seen[0]
    await box.close()


async def test_send_runs_without_holding_the_write_lock(inbox, path):
    await queue(inbox, "slow channel", now=T)
    release = asyncio.Event()
    other = await Inbox.open(path, busy_timeout=0.2)

    async def slow_send(text):
        # While the channel hangs, another process can still take webhooks.
        assert await other.ingest("hook", "during-send", None) is True
        release.set()

    assert await inbox.dispatch(slow_send, now=T) == 1
    assert release.is_set()
    await other.close()


async def test_hold_release_and_flush(inbox):
    sent = []
    await queue(inbox, "a", now=T)
    assert await inbox.hold_outbox(actor="ops")
    assert await inbox.dispatch(sent.append, now=T) == 0
    assert (await inbox.overview(now=T)).outbox_held
    assert await inbox.flush_outbox(sent.append, now=T, actor="ops") == 1
    await queue(inbox, "b", now=T + 1)
    assert await inbox.release_outbox(actor="ops")
    assert await inbox.dispatch(sent.append, now=T + 2) == 0  # the gap still applies
    assert await inbox.next_send_at() == T + 3600
    assert sent == ["a"]


# --- operator actions -----------------------------------------------------------------------


async def test_requeue_is_conditional_on_the_state_the_operator_saw(inbox):
    await inbox.configure(on_lost_claim="interrupt")
    await inbox.ingest("stripe", "s", None, now=T)
    gen = await inbox.acquire("A", now=T)
    [e] = await inbox.claim_batch("A", gen, now=T)
    await inbox.acquire("B", now=T + 121)
    await inbox.claim_batch("B", 2, now=T + 121)
    # The operator sees it interrupted; meanwhile someone marks it done.
    assert await inbox.resolve(e.id, expect="interrupted", actor="alice")
    assert await inbox.requeue(e.id, expect="interrupted", actor="bob") is False
    entry = (await inbox.audit(limit=1))[0]
    assert entry.reason == "changed meanwhile: it is done now, not interrupted"
    assert (await inbox.get_event(e.id)).status == "done"


async def test_a_buried_event_keeps_who_buried_it_and_why(inbox):
    await inbox.ingest("stripe", "b", None, now=T)
    await inbox.ingest("stripe", "c", None, now=T)
    first, second = await inbox.events("pending")
    assert await inbox.bury(first.id, expect="pending", actor="alice", reason="a test charge")
    assert await inbox.bury(second.id, expect="pending", actor="bob")
    # The Dead pane and `onwatch show` read the event's error: it says who and why.
    assert (await inbox.get_event(first.id)).error == "sent to dead by alice: a test charge"
    assert (await inbox.get_event(second.id)).error == "sent to dead by bob"


async def test_requeue_gives_a_fresh_attempt_budget(inbox):
    await inbox.configure(max_attempts=1)
    await inbox.ingest("chat", "p", None, now=T)
    gen = await inbox.acquire("W", now=T)
    [e] = await inbox.claim_batch("W", gen, now=T)
    await inbox.finish("W", gen, [e.id], error="bad", now=T)
    assert (await inbox.get_event(e.id)).status == "dead"
    assert await inbox.requeue(e.id, expect="dead", actor="ops", reason="fixed the bug")
    requeued = await inbox.get_event(e.id)
    assert (requeued.status, requeued.attempts, requeued.error) == ("pending", 0, None)
    [entry] = [a for a in await inbox.audit() if a.action == "requeue"]
    assert (entry.before, entry.after, entry.actor, entry.reason, entry.applied) == (
        "dead",
        "pending",
        "ops",
        "fixed the bug",
        True,
    )


async def test_effect_journal_shows_intended_and_confirmed(inbox):
    await inbox.ingest("stripe", "refund", None, now=T)
    gen = await inbox.acquire("W", now=T)
    [e] = await inbox.claim_batch("W", gen, now=T)
    k1 = await inbox.intend_effect("W", gen, e.run_id, "refund", {"amount": 5}, now=T)
    k2 = await inbox.intend_effect("W", gen, e.run_id, "email", {"to": "x"}, now=T)
    assert await inbox.settle_effect(k1, now=T + 1)
    await inbox.acquire("B", now=T + 121)
    # A stale worker may not start new effects.
    assert await inbox.intend_effect("W", gen, e.run_id, "sms", None, now=T + 122) is None
    journal = await inbox.effects(e.id)
    assert [(j.name, j.state) for j in journal] == [("refund", "confirmed"), ("email", "intended")]
    assert k1 != k2 and journal[0].key == k1


async def test_a_run_finished_in_parts_closes_with_its_last_event(inbox):
    await inbox.ingest("chat", "a", None, now=T)
    await inbox.ingest("chat", "b", None, now=T)
    gen = await inbox.acquire("W", now=T)
    a, b = await inbox.claim_batch("W", gen, now=T)
    assert await inbox.finish("W", gen, [a.id], now=T)
    [run] = await inbox.runs(a.id)
    assert run.outcome is None  # b is still running in it
    await inbox.acquire("X", now=T + 121)
    await inbox.claim_batch("X", 2, now=T + 121)  # b's claim is lost: so is the run
    [run] = await inbox.runs(a.id)
    assert run.outcome == "lost"


async def test_a_run_finished_in_parts_by_its_run_closes_done_with_its_last_part(inbox):
    await inbox.ingest("chat", "a", None, now=T)
    await inbox.ingest("chat", "b", None, now=T)
    gen = await inbox.acquire("W", now=T)
    a, b = await inbox.claim_batch("W", gen, now=T)
    assert await inbox.finish("W", gen, [a.id], now=T, run=a.run_id, result="first")
    [run] = await inbox.runs(a.id)
    assert run.outcome is None and (await inbox.get_event(a.id)).status == "done"
    assert await inbox.finish("W", gen, [b.id], now=T + 1, run=a.run_id, result="last")
    [run] = await inbox.runs(b.id)
    assert (run.outcome, run.result, run.finished_at) == ("done", "last", T + 1)
    # The same finish again (its answer lost): reported done, nothing written or audited.
    audited = len(await inbox.audit(limit=100))
    assert await inbox.finish("W", gen, [b.id], now=T + 2, run=a.run_id, result="again")
    [run] = await inbox.runs(b.id)
    assert (run.result, run.finished_at) == ("last", T + 1)
    assert len(await inbox.audit(limit=100)) == audited
    # A run id that names no run: refused, nothing changed.
    await inbox.ingest("chat", "c", None, now=T)
    [c] = await inbox.claim_batch("W", gen, now=T + 3)
    assert not await inbox.finish("W", gen, [c.id], now=T + 3, run=c.run_id + 1000)
    assert (await inbox.get_event(c.id)).status == "running"
    assert (await inbox.audit(limit=1))[0].reason == (
        f"run {c.run_id + 1000} is not an open run of this generation (recovered or finished)"
    )


async def test_default_effect_keys_survive_a_retry_of_the_same_batch(inbox):
    await inbox.ingest("stripe", "refund", None, now=T)
    gen = await inbox.acquire("A", now=T)
    [e] = await inbox.claim_batch("A", gen, now=T)
    first = await inbox.intend_effect("A", gen, e.run_id, "charge", None, now=T)
    gen = await inbox.acquire("B", now=T + 121)
    [again] = await inbox.claim_batch("B", gen, now=T + 121)
    second = await inbox.intend_effect("B", gen, again.run_id, "charge", None, now=T + 121)
    assert first == second  # the payment tool sees the same idempotency key
    # A worker may only journal effects for its own open run.
    assert await inbox.intend_effect("B", gen, e.run_id, "charge", None, now=T + 122) is None
    assert (await inbox.audit(limit=1))[
        0
    ].reason == f"run {e.run_id} is not an open run of this generation"


async def test_change_token_moves_on_own_and_other_commits(inbox, path):
    token = await inbox.change_token()
    assert await inbox.change_token() == token  # idle: nothing moves
    await inbox.ingest("chat", "mine", None)
    mine = await inbox.change_token()
    assert mine != token
    other = await Inbox.open(path)
    await other.ingest("chat", "theirs", None)
    await other.close()
    assert await inbox.change_token() != mine


async def test_next_wake_includes_a_send_left_half_done(inbox, path, clock):
    await queue(inbox, "hi", now=T)

    async def crash(text):
        raise asyncio.CancelledError

    with pytest.raises(asyncio.CancelledError):
        await inbox.dispatch(crash, now=T)
    assert await inbox.next_wake() == T + inbox.settings.send_timeout + 1


async def test_a_group_reports_repeats_within_it_and_stored_keys_as_duplicates(inbox):
    await inbox.ingest("hook", "old", None)
    keys = ["old", "new-1", "new-1", "new-2"] * 80  # 320 calls: more than one statement's worth
    results = await asyncio.gather(*(inbox.ingest("hook", k, None) for k in keys))
    assert sum(results) == 2
    firsts = {k: results[keys.index(k)] for k in set(keys)}
    assert firsts == {"old": False, "new-1": True, "new-2": True}
    assert (await inbox.counts())["pending"] == 3


async def test_a_list_without_payloads_reads_no_documents(inbox):
    await inbox.ingest("hook", "big", {"blob": "x" * 100_000})
    [row] = await inbox.events("pending", payload=False)
    assert row.payload is None and row.source_id == "big"
    [full] = await inbox.events("pending")
    assert full.payload == {"blob": "x" * 100_000}


async def test_a_batch_is_stored_all_or_none(inbox):
    assert await inbox.ingest_batch([("chat", "a", 1), ("chat", "b", 2), ("chat", "a", 3)]) == [
        True,
        True,
        False,
    ]
    await inbox.configure(max_pending=3)
    with pytest.raises(BudgetExceeded):
        await inbox.ingest_batch([("chat", "c", None), ("chat", "d", None)])
    assert (await inbox.counts())["pending"] == 2  # c was not kept either
    with pytest.raises(BadInput):
        await inbox.ingest_batch([("chat", "e", None), ("chat", "", None)])
    assert await inbox.ingest("chat", "e", None) is True


async def test_a_batch_the_database_refuses_stores_nothing_and_says_why(inbox, path):
    """A value the database itself refuses (here a rule another program added to the file or
    schema): the batch raises BadInput with the database's reason, none of it is kept, and
    the inbox goes on."""
    await inbox.ingest("chat", "before", None)
    _refuse_source_id(path, "poison")
    with pytest.raises(BadInput, match="event not stored: .*no poison here"):
        await inbox.ingest_batch([("chat", "ok", None), ("chat", "poison", None)])
    assert (await inbox.counts())["pending"] == 1
    assert await inbox.ingest_batch([("chat", "ok", None), ("chat", "fine", None)]) == [True, True]
    assert (await inbox.counts())["pending"] == 3


def _refuse_source_id(path: str, source_id: str) -> None:
    """Make the database refuse an event with this source id, as a CHECK would."""
    if is_postgresql(path):
        import psycopg

        with psycopg.connect(path, autocommit=True) as conn:
            conn.execute(
                "CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
                "RAISE EXCEPTION 'no poison here' USING ERRCODE = 'check_violation'; END $$"
            )
            conn.execute(
                "CREATE TRIGGER refuse BEFORE INSERT ON events FOR EACH ROW "
                f"WHEN (NEW.source_id = '{source_id}') EXECUTE FUNCTION refuse()"
            )
        return
    import sqlite3

    with contextlib.closing(sqlite3.connect(path)) as conn:
        conn.execute(
            f"CREATE TRIGGER refuse BEFORE INSERT ON events WHEN NEW.source_id = '{source_id}' "
            "BEGIN SELECT RAISE(ABORT, 'no poison here'); END"
        )
        conn.commit()
