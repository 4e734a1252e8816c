"""The engine against hostile input and timing: one test (or more) per class of fault.

Each test creates the fault: a value at or past a bound, a row written by hand with plain
sqlite3, a send that hangs past send_timeout while another dispatcher re-sends, a run
recovered for max_run_seconds whose old caller finishes late. Times come from a fake clock.
"""

from __future__ import annotations

import asyncio
import json

import re

import pytest

from onwatch.core import (
    RESERVED_SOURCES,
    ApprovalRequest,
    BadInput,
    FakeClock,
    FollowUp,
    Inbox,
)
from onwatch.core.engine import intake

from .conftest import DAY, T, dump, is_postgresql, raw_sql

pytestmark = pytest.mark.backends  # the conformance suite: once per backend

BIG = 2**63 - 1


def deep(levels: int) -> list:
    value: list = []
    for _ in range(levels):
        value = [value]
    return value


sql = raw_sql  # a statement outside the engine, on either backend


def corrupt(path: str, statement: str, params: tuple = ()) -> bool:
    """Write a broken value by hand: True if it was written, False if PostgreSQL's typed
    column refused it (a file's column takes any value; there that fault cannot exist)."""
    if not is_postgresql(path):
        sql(path, statement, params)
        return True
    import psycopg

    try:
        sql(path, statement, params)
    except psycopg.errors.DataError:
        return False
    return True


# --- class 1: no integer can wedge the engine -------------------------------------------------

WEDGES = [
    ("every", lambda b: b.add_timer("t", T, every=BIG)),
    ("due", lambda b: b.add_timer("t", BIG)),
    ("due past 2**63", lambda b: b.add_timer("t", 2**63)),
    ("negative due", lambda b: b.add_timer("t", -1)),
    ("now", lambda b: b.ingest("chat", "x", None, now=2**63)),
    ("now int64 max", lambda b: b.acquire("W", now=BIG)),
    ("expires_in", lambda b: b.request_approval("r", BIG, "refund")),
    ("event id", lambda b: b.get_event(2**64)),
    ("after", lambda b: b.events("pending", after=2**64)),
    ("limit", lambda b: b.timers(limit=2**64)),
    ("lease_ttl", lambda b: b.configure(lease_ttl=BIG)),
    ("backoff_cap", lambda b: b.configure(backoff_cap=BIG)),
    ("outbox_gap", lambda b: b.configure(outbox_gap=BIG)),
    ("send_timeout", lambda b: b.configure(send_timeout=BIG)),
    ("max_run_seconds", lambda b: b.configure(max_run_seconds=BIG)),
    ("max_batch", lambda b: b.configure(max_batch=10**6)),
    ("catch_up_limit", lambda b: b.configure(catch_up_limit=10**9)),
    ("gen", lambda b: b.renew("W", 2**64)),
    ("older_than", lambda b: b.prune_payloads(2**64)),
    ("followup every", lambda b: b.finish("W", 1, [1], timers=[FollowUp("f", T, every=BIG)])),
    (
        "approval expires_in",
        lambda b: b.finish("W", 1, [1], approvals=[ApprovalRequest("r", BIG, "refund")]),
    ),
]


@pytest.mark.parametrize("name,call", WEDGES, ids=[w[0] for w in WEDGES])
async def test_class1_an_integer_out_of_bounds_is_refused_and_nothing_wedges(
    inbox, path, name, call
):
    await inbox.ingest("chat", "m1", None)
    await inbox.add_timer("good", T + 10)
    before = dump(path)
    with pytest.raises(BadInput):
        await call(inbox)
    assert dump(path) == before
    # The engine goes on: the scheduler fires, the lease is taken, a claim works.
    assert await inbox.run_scheduler(now=T + 10) == 1
    gen = await inbox.acquire("W", now=T + 10)
    assert [e.source_id for e in await inbox.claim_batch("W", gen, now=T + 10)] == [
        "m1",
        "good@1000010",
    ]


async def test_class1_the_largest_accepted_values_still_add_up(inbox):
    from onwatch.core import MAX_DURATION, MAX_TIME

    await inbox.configure(
        lease_ttl=MAX_DURATION,
        backoff_base=MAX_DURATION,
        backoff_cap=MAX_DURATION,
        send_timeout=MAX_DURATION,
        max_run_seconds=MAX_DURATION,
        outbox_gap=MAX_DURATION,
    )
    await inbox.add_timer("far", MAX_TIME, every=MAX_DURATION)
    await inbox.ingest("chat", "m1", None, now=MAX_TIME)
    assert await inbox.run_scheduler(now=MAX_TIME) == 1
    gen = await inbox.acquire("W", now=MAX_TIME)
    batch = await inbox.claim_batch("W", gen, now=MAX_TIME)
    assert await inbox.finish("W", gen, [e.id for e in batch], error="boom", now=MAX_TIME)
    assert await inbox.next_wake(now=MAX_TIME) is not None


# --- class 2: a stored row never stops a pass -------------------------------------------------


async def test_class2_broken_timers_are_set_aside_and_the_others_fire(inbox, path):
    await inbox.add_timer("good", T + 5, {"n": 1})
    await inbox.add_timer("huge-every", T, every=10)
    await inbox.add_timer("garbage", T)
    await inbox.add_timer("approval-ish", T + 1)
    sql(path, "UPDATE timers SET every = ? WHERE id = 'huge-every'", (2**63 - 5,))
    sql(path, "UPDATE timers SET payload = '{not json' WHERE id = 'garbage'")
    sql(path, "UPDATE timers SET kind = 'approval', payload = '[1]' WHERE id = 'approval-ish'")
    assert await inbox.run_scheduler(now=T + 5) == 4
    assert [e.source_id for e in await inbox.events("pending")] == ["good@1000005"]
    timers = {t.id: t for t in await inbox.timers()}
    assert set(timers) == {"huge-every", "garbage", "approval-ish"}
    for timer in timers.values():
        assert timer.broken.startswith("set aside, not fired")
    assert "every is" in timers["huge-every"].broken
    assert (await inbox.overview(now=T + 5)).set_aside == 3
    assert await inbox.next_timer_due() is None  # set-aside timers never wake anyone
    assert await inbox.run_scheduler(now=T + 100) == 0
    # Registering a valid definition again takes the timer back.
    await inbox.add_timer("garbage", T + 200)
    assert await inbox.run_scheduler(now=T + 200) == 1


async def test_class2_broken_events_are_set_aside_and_the_others_run(inbox, path):
    for key in ("bad-json", "pruned", "good", "attempts"):
        await inbox.ingest("chat", key, {"k": key})
    sql(path, "UPDATE events SET payload = '{nope' WHERE source_id = 'bad-json'")
    sql(path, "UPDATE events SET payload = NULL WHERE source_id = 'pruned'")
    typed = not corrupt(path, "UPDATE events SET attempts = 'many' WHERE source_id = 'attempts'")
    sql(
        path, "UPDATE events SET payload = ? WHERE source_id = 'good'", (json.dumps({"k": "good"}),)
    )
    gen = await inbox.acquire("W")
    batch = await inbox.claim_batch("W", gen)
    runnable = [("attempts", {"k": "attempts"})] if typed else []  # attempts is a bigint
    assert [(e.source_id, e.payload) for e in batch] == [("good", {"k": "good"})] + runnable
    dead = {e.source_id: e.error for e in await inbox.events("dead")}
    assert set(dead) == {"bad-json", "pruned"} | (set() if typed else {"attempts"})
    assert all(why.startswith("set aside, not run") for why in dead.values())
    assert (await inbox.overview()).set_aside == len(dead)


async def test_class2_broken_outbox_rows_are_set_aside_and_the_others_sent(inbox, path):
    await inbox.configure(outbox_gap=0)
    # On PostgreSQL every row names its inbox, flags are booleans and text cannot hold NUL.
    pg = is_postgresql(path)
    inbox_id = ("inbox_id, ", "(SELECT id FROM inboxes), ") if pg else ("", "")
    blob = "INSERT INTO outbox({0}body, created) VALUES ({1}?, ?)".format(*inbox_id)
    blob_stored = corrupt(path, blob, ("\x00blob" if pg else b"\x00blob", T))
    if pg:
        assert not blob_stored  # the text column refuses a NUL: that fault cannot exist
    sql(path, "INSERT INTO outbox({0}body, created) VALUES ({1}'fine', ?)".format(*inbox_id), (T,))
    sent = []
    assert await inbox.dispatch(sent.append) == 1
    assert sent == ["fine"]
    # A delivery row with nonsense in it: retried, it is set aside, never a crash.
    flags = ("true", "false") if pg else ("1", "0")
    sql(
        path,
        "INSERT INTO deliveries({0}status, attempts, paced, at_most_once, created, "
        "retry_after) VALUES ({1}'failed', ?, {2}, {3}, 0, 0)".format(*inbox_id, *flags),
        (2**63 - 1,),
    )
    sql(
        path,
        "INSERT INTO outbox({0}body, created, delivery_id) VALUES ({1}'orphan', ?, "
        "(SELECT max(id) FROM deliveries))".format(*inbox_id),
        (T,),
    )
    sql(path, "INSERT INTO outbox({0}body, created) VALUES ({1}'after', ?)".format(*inbox_id), (T,))
    assert await inbox.dispatch(sent.append) == 1
    assert sent[-1] == "after"
    assert (await inbox.overview()).set_aside == 1 + blob_stored


async def test_class2_a_worker_survives_broken_rows(path):
    from onwatch.core.runtime.worker import run_worker

    clock = FakeClock(T)
    box = await Inbox.open(path, clock=clock)
    await box.add_timer("bad", T, every=10)
    await box.ingest("chat", "bad-payload", None)
    await box.ingest("chat", "good", {"ok": 1})
    await box.close()
    sql(path, "UPDATE timers SET every = ? WHERE id = 'bad'", (2**63 - 1,))
    sql(path, "UPDATE events SET payload = '[[[' WHERE source_id = 'bad-payload'")
    seen = []

    async def agent(batch, ctx):
        seen.extend(e.source_id for e in batch)

    stats = await asyncio.wait_for(
        run_worker(path, agent, holder="W", clock=clock, max_runs=1, poll_interval=0.01), 20
    )
    assert seen == ["good"] and stats.done == 1
    rows = dict(sql(path, "SELECT source_id, status FROM events"))
    assert rows == {"bad-payload": "dead", "good": "done"}


# --- class 3: a late delivery outcome is refused ----------------------------------------------


async def test_class3_a_hanging_send_cannot_overwrite_a_later_attempt(inbox, clock):
    await inbox.configure(outbox_gap=0, send_timeout=30)
    gen = await inbox.acquire("W")
    await inbox.ingest("chat", "m", None)
    [event] = await inbox.claim_batch("W", gen)
    assert await inbox.finish("W", gen, [event.id], ["hello"])
    gate = asyncio.Event()
    sends = []

    async def hanging(text):
        sends.append(("A", text.key))
        await gate.wait()
        raise ConnectionError("A's channel finally failed")

    a = asyncio.create_task(inbox.dispatch(hanging, now=T))
    while not sends:
        await asyncio.sleep(0)
    clock.advance(31)  # A is past send_timeout: B may re-send
    assert await inbox.dispatch(lambda text: sends.append(("B", text.key)), now=T + 31) == 1
    gate.set()
    assert await a == 0
    [delivery] = await inbox.deliveries()
    assert (delivery.status, delivery.attempts) == ("sent", 2)
    assert await inbox.dispatch(lambda text: sends.append(("C", text.key)), now=T + 40) == 0
    assert [who for who, _ in sends] == ["A", "B"]  # never a third time
    [refusal] = [a for a in await inbox.audit() if a.action.startswith("refused")]
    assert (refusal.action, refusal.target, refusal.applied) == (
        "refused failed",
        f"delivery {delivery.id}",
        False,
    )
    assert (await inbox.overview()).refused_writes == 1


async def test_class3_a_late_success_cannot_settle_a_redelivered_attempt(inbox, clock):
    await inbox.configure(outbox_gap=0, send_timeout=30)
    gen = await inbox.acquire("W")
    await inbox.ingest("chat", "m", None)
    [event] = await inbox.claim_batch("W", gen)
    assert await inbox.finish("W", gen, [event.id], ["hello"])
    gate, sending = asyncio.Event(), asyncio.Event()

    async def slow_ok(text):
        sending.set()
        await gate.wait()

    a = asyncio.create_task(inbox.dispatch(slow_ok, now=T))
    await asyncio.wait_for(sending.wait(), 5)  # A's attempt 1 is in its channel

    def b_fails(text):
        raise ConnectionError("B failed")

    assert await inbox.dispatch(b_fails, now=T + 31) == 0
    gate.set()
    assert await a == 0  # A's late 'sent' belongs to attempt 1; attempt 2 owns the row
    [delivery] = await inbox.deliveries()
    assert delivery.status == "failed"


# --- class 4: finish is fenced by run as well as generation -----------------------------------


async def test_class4_a_recovered_run_cannot_be_finished_by_its_old_caller(inbox, clock):
    await inbox.configure(max_run_seconds=60)
    await inbox.ingest("chat", "m", None)
    gen = await inbox.acquire("W")
    [old] = await inbox.claim_batch("W", gen)
    clock.advance(61)
    assert await inbox.renew("W", gen)
    [new] = await inbox.claim_batch("W", gen)  # same generation, a new run
    assert new.run_id != old.run_id
    assert not await inbox.finish("W", gen, [old.id], ["from the lost run"], run=old.run_id)
    assert await inbox.held_messages() == []
    assert (await inbox.get_event(new.id)).status == "running"
    refusal = (await inbox.audit(limit=1))[0]
    assert refusal.action == "refused finish" and f"run {old.run_id}" in refusal.reason
    assert await inbox.intend_effect("W", gen, old.run_id, "pay") is None
    assert await inbox.finish("W", gen, [new.id], ["from the new run"], run=new.run_id)
    assert [m.run_id for m in await inbox.held_messages()] == [new.run_id]


async def test_class4_the_worker_finishes_with_its_run(inbox, clock, monkeypatch):
    from onwatch.core.runtime.worker import run_worker

    calls = []
    original = Inbox.finish

    async def spy(self, *args, **kwargs):
        calls.append(kwargs.get("run"))
        return await original(self, *args, **kwargs)

    monkeypatch.setattr(Inbox, "finish", spy)
    await inbox.ingest("chat", "m", None)
    await run_worker(inbox, lambda batch, ctx: None, holder="W", max_runs=1, poll_interval=0.01)
    [run] = await inbox.runs(1)
    assert calls == [run.id]


# --- class 5: reserved names ------------------------------------------------------------------

RESERVED_CALLS = [
    ("ingest approval", lambda b: b.ingest("approval", "refund-7", {"answer": "yes"})),
    ("ingest timer", lambda b: b.ingest("timer", "x@1", None)),
    ("batch", lambda b: b.ingest_batch([("chat", "a", None), ("approval", "refund-7", 1)])),
    ("timer id", lambda b: b.add_timer("approval:refund-7", T + 5)),
    ("timer key", lambda b: b.add_timer("t", T + 5, key=("approval", "refund-7"))),
    ("cancel", lambda b: b.cancel_timer("approval:refund-7")),
    ("followup", lambda b: b.finish("W", 1, [1], timers=[FollowUp("approval:refund-7", T)])),
    (
        "followup key",
        lambda b: b.finish("W", 1, [1], timers=[FollowUp("t", T, key=("timer", "x"))]),
    ),
]


@pytest.mark.parametrize("name,call", RESERVED_CALLS, ids=[c[0] for c in RESERVED_CALLS])
async def test_class5_reserved_names_are_refused(inbox, path, name, call):
    assert RESERVED_SOURCES == ("approval", "timer")
    await inbox.request_approval("refund-7", 600, "refund 7")
    await inbox.ingest("chat", "m", None)
    gen = await inbox.acquire("W")
    await inbox.claim_batch("W", gen)
    before = dump(path)
    with pytest.raises(BadInput, match="reserved"):
        await call(inbox)
    assert dump(path) == before
    assert await inbox.answer_approval("refund-7", "no") == "no"
    assert (await inbox.get_event(2)).payload["answer"] == "no"


# --- class 6: effect keys ---------------------------------------------------------------------


async def test_class6_an_effect_key_does_not_change_when_the_batch_does(inbox, clock):
    await inbox.configure(max_batch=3)
    for i in range(3):
        await inbox.ingest("chat", f"m{i}", None)
    gen = await inbox.acquire("W")
    batch = await inbox.claim_batch("W", gen)
    assert len(batch) == 3
    with pytest.raises(BadInput, match="say which one"):
        await inbox.intend_effect("W", gen, batch[0].run_id, "refund")
    first = await inbox.intend_effect("W", gen, batch[0].run_id, "refund", event=batch[0])
    # The run crashes after the intent; the retry runs the first event alone.
    assert await inbox.finish("W", gen, [e.id for e in batch], error="crashed")
    clock.advance(3600)
    gen = await inbox.acquire("W")
    [again] = await inbox.claim_batch("W", gen)
    assert again.id == batch[0].id
    retried = await inbox.intend_effect("W", gen, again.run_id, "refund")  # alone: no event=
    assert retried == first
    assert re.search(f"-ev{batch[0].id}\\.[0-9a-f]{{16}}-refund-1$", first), first


# --- class 7: one bad item in a group commit fails alone --------------------------------------


async def test_class7_a_bad_item_in_a_group_fails_alone(inbox):
    calls = [
        inbox.ingest("chat", "good-1", None),
        inbox.ingest("chat", "bad", None, now=2**63),
        inbox.ingest("chat", "good-2", None),
        inbox.ingest("chat", "deep", deep(10_000)),
        inbox.ingest("chat", "good-3", {"n": 3}),
    ]
    results = await asyncio.gather(*calls, return_exceptions=True)
    assert results[0] is True and results[2] is True and results[4] is True
    assert isinstance(results[1], BadInput) and isinstance(results[3], BadInput)
    assert [e.source_id for e in await inbox.events("pending")] == ["good-1", "good-2", "good-3"]


async def test_class7_a_row_the_database_refuses_fails_alone(path):
    """Rows no valid call could make, handed to the engine itself (past the Inbox's checks):
    each is refused alone, its neighbours stored, on both backends."""
    async with await Inbox.open(path) as inbox:
        items = [
            ("chat", "a", "null", T),
            ("chat", "b", "null", 2**63),  # not a 64-bit integer
            ("", "c", "null", T),  # an empty source: the table's CHECK
            ("chat", "d", "null", T),
        ]
        results = await inbox._db.write(intake.ingest_many, items)
        assert results[0] is True and results[3] is True
        assert all(isinstance(r, BadInput) for r in results[1:3]), results
        assert [e.source_id for e in await inbox.events("pending")] == ["a", "d"]


# --- class 9: deep JSON is refused, never recursed into ---------------------------------------

DEEP_CALLS = [
    ("ingest", lambda b: b.ingest("chat", "x", deep(100_000))),
    ("batch", lambda b: b.ingest_batch([("chat", "x", deep(100_000))])),
    ("timer", lambda b: b.add_timer("t", T, {"a": deep(100_000)})),
    ("finish result", lambda b: b.finish("W", 1, [1], result=deep(100_000))),
    ("followup payload", lambda b: b.finish("W", 1, [1], timers=[FollowUp("t", T, deep(100_000))])),
    ("effect detail", lambda b: b.intend_effect("W", 1, 1, "pay", deep(100_000))),
    ("just over", lambda b: b.ingest("chat", "x", deep(101))),
    ("circular", lambda b: b.ingest("chat", "x", (lambda a: (a.append(a), a)[1])([]))),
]


@pytest.mark.parametrize("name,call", DEEP_CALLS, ids=[c[0] for c in DEEP_CALLS])
async def test_class9_deep_json_is_refused(inbox, path, name, call):
    await inbox.ingest("chat", "m", None)
    gen = await inbox.acquire("W")
    await inbox.claim_batch("W", gen)
    before = dump(path)
    with pytest.raises(BadInput):
        await call(inbox)
    assert dump(path) == before
    assert await inbox.ingest("chat", "ok", deep(99)) is True


async def test_class9_a_deep_result_fails_the_run_and_never_leaves_it_running(inbox):
    from onwatch.core.runtime.worker import run_worker

    await inbox.ingest("chat", "m", None)

    def agent(batch, ctx):
        ctx.result = deep(100_000)

    stats = await asyncio.wait_for(
        run_worker(inbox, agent, holder="W", max_runs=1, poll_interval=0.01), 20
    )
    event = await inbox.get_event(1)
    assert event.status == "pending" and "nested deeper" in event.error
    assert stats.failed == 1
    [run] = await inbox.runs(1)
    assert run.outcome == "error"


# --- class 10: next_wake is never a past instant nothing acts on ------------------------------


async def test_class10_a_held_outbox_does_not_hide_a_timer(inbox, clock):
    await inbox.configure(outbox_gap=10)
    gen = await inbox.acquire("W")
    await inbox.ingest("chat", "m", None)
    [event] = await inbox.claim_batch("W", gen)
    assert await inbox.finish("W", gen, [event.id], ["one", "two"])
    assert await inbox.dispatch(lambda text: None) == 2  # the gap starts now
    await inbox.hold_outbox()
    await inbox.ingest("chat", "m2", None)
    [event2] = await inbox.claim_batch("W", gen)
    assert await inbox.finish("W", gen, [event2.id], ["three"])
    clock.advance(40)  # past the gap, the outbox still held
    await inbox.add_timer("soon", clock.now() + 5)
    assert await inbox.next_wake() == clock.now() + 5


async def test_class10_paused_and_the_daily_budget_are_not_past_wakeups(inbox, clock):
    await inbox.ingest("chat", "m", None)
    await inbox.pause()
    clock.advance(10)
    assert await inbox.next_wake() is None
    await inbox.resume()
    assert await inbox.next_wake() == T
    await inbox.configure(max_runs_per_day=1)
    gen = await inbox.acquire("W")
    [event] = await inbox.claim_batch("W", gen)
    assert await inbox.finish("W", gen, [event.id])
    await inbox.ingest("chat", "m2", None)
    assert await inbox.claim_batch("W", gen) == []  # the budget delays it
    assert await inbox.next_wake() == T + 10 + DAY


async def test_class10_a_worker_fires_a_timer_on_time_while_the_outbox_is_held(path):
    from onwatch.core.runtime.worker import Worker

    clock = FakeClock(T)
    box = await Inbox.open(path, clock=clock)
    await box.configure(outbox_gap=10, lease_ttl=120)
    box_sends = []
    gen = await box.acquire("seed")
    await box.ingest("chat", "m", None)
    [event] = await box.claim_batch("seed", gen)
    await box.finish("seed", gen, [event.id], ["held"])
    await box.release("seed", gen)
    await box.hold_outbox()
    clock.advance(40)
    fired = []

    async def agent(batch, ctx):
        fired.extend((e.source, clock.now()) for e in batch)

    worker = Worker(box, agent, holder="W", send=box_sends.append, poll_interval=0.01)
    task = asyncio.create_task(worker.run())
    try:
        await box.add_timer("soon", T + 45)
        # Let the worker settle into its idle wait: a wait begun before the timer's commit
        # was ended by it, so one in progress now was planned with the timer in view.
        for _ in range(5000):
            if worker.stats.idle >= 1 and box.wake.waiting:
                break
            await asyncio.sleep(0.002)
        else:
            raise AssertionError("the worker never went idle")
        clock.set(T + 45)
        for _ in range(2000):
            if fired:
                break
            await asyncio.sleep(0.005)
        assert fired == [("timer", T + 45)]
        assert box_sends == []
    finally:
        worker.request_stop(force=True)
        await asyncio.wait_for(task, 10)
        await box.close()


# --- class 11: an at-most-once send cut off mid-send is uncertain -----------------------------


async def _cut_off(inbox: Inbox, clock: FakeClock) -> int:
    await inbox.configure(delivery="at_most_once", outbox_gap=0, send_timeout=30)
    gen = await inbox.acquire("W")
    await inbox.ingest("chat", "m", None)
    [event] = await inbox.claim_batch("W", gen)
    assert await inbox.finish("W", gen, [event.id], ["pay 5"])

    async def crash(text):
        raise asyncio.CancelledError  # the dispatcher dies mid-send

    with pytest.raises(asyncio.CancelledError):
        await inbox.dispatch(crash)
    clock.advance(31)
    [delivery] = await inbox.deliveries()
    return delivery.id


async def test_class11_an_interrupted_at_most_once_send_is_uncertain(inbox, clock):
    delivery_id = await _cut_off(inbox, clock)
    assert (await inbox.overview()).uncertain_deliveries == 1
    assert [d.status for d in await inbox.deliveries()] == ["uncertain"]
    assert [d.id for d in await inbox.uncertain_deliveries()] == [delivery_id]
    sent = []
    assert await inbox.dispatch(sent.append) == 0
    assert await inbox.flush_outbox(sent.append) == 0
    assert sent == []
    wake = await inbox.next_wake()
    assert wake is None or wake > clock.now()
    assert not await inbox.settle_delivery(delivery_id, "sent", expect="sending")
    assert await inbox.settle_delivery(delivery_id, "sent", actor="ann", reason="seen in app")
    assert [d.status for d in await inbox.deliveries()] == ["sent"]
    assert await inbox.held_messages() == []
    assert not await inbox.settle_delivery(delivery_id, "send again")
    entries = [
        (a.action, a.before, a.after, a.applied)
        for a in await inbox.audit(target=f"delivery {delivery_id}")
    ]
    assert entries == [
        ("send_again", "sent", "sent", False),
        ("mark_sent", "uncertain", "sent", True),
        ("mark_sent", "uncertain", "uncertain", False),
    ]


async def test_class11_send_again_puts_the_messages_back_under_a_new_key(inbox, clock):
    delivery_id = await _cut_off(inbox, clock)
    old_key = (await inbox.deliveries())[0].key
    assert await inbox.settle_delivery(delivery_id, "send again")
    sent = []
    assert await inbox.dispatch(sent.append) == 1
    assert sent == ["pay 5"] and sent[0].key != old_key
    assert (await inbox.overview()).uncertain_deliveries == 0


# --- class 12: a pruned event cannot run on nothing -------------------------------------------


async def test_class12_a_pruned_event_cannot_be_requeued(inbox, clock):
    await inbox.ingest("chat", "m", {"text": "hello"})
    assert await inbox.cancel(1)
    clock.advance(10)
    assert await inbox.prune_payloads(clock.now()) == 1
    assert not await inbox.requeue(1, expect="cancelled")
    assert (await inbox.get_event(1)).status == "cancelled"
    [entry] = await inbox.audit(target="event 1", limit=1)
    assert "pruned" in entry.reason and not entry.applied
    gen = await inbox.acquire("W")
    assert await inbox.claim_batch("W", gen) == []


# --- class 13: refused or repeated calls leave no debris --------------------------------------


async def test_class13_registering_an_each_timer_again_does_not_count_overflow_twice(inbox, clock):
    await inbox.configure(catch_up_limit=2)
    await inbox.add_timer("tick", T, every=10, catch_up="each")
    assert await inbox.run_scheduler(now=T + 100) == 1
    [timer] = await inbox.timers()
    assert timer.overflow == 9
    await inbox.add_timer("tick", T, every=10, catch_up="each")  # the agent starts again
    await inbox.run_scheduler(now=T + 100)
    [timer] = await inbox.timers()
    assert (timer.overflow, timer.due) == (9, T + 110)
    assert (await inbox.counts())["pending"] == 2


async def test_class13_an_open_with_a_bad_busy_timeout_creates_nothing(tmp_path):
    path = tmp_path / "new.db"
    for bad in (float("nan"), float("inf"), 0, -1, "5", True):
        with pytest.raises(BadInput):
            await Inbox.open(path, busy_timeout=bad)
    assert not path.exists()


async def test_class2_a_broken_lease_row_is_taken_over_not_a_wedge(inbox, path):
    gen = await inbox.acquire("W")
    if is_postgresql(path):  # the lease's columns are bigints: the fault cannot be written
        assert not corrupt(path, "UPDATE inboxes SET lease_until = 'soon'")
        assert not corrupt(path, "UPDATE inboxes SET lease_gen = 'x'")
        assert await inbox.renew("W", gen)
        return
    sql(path, "UPDATE lease SET until = 'soon'")
    # An expiry that is not a time has passed; nobody took over, so its holder renews it
    # (docs/rules.md#lease-and-fencing), and the expiry is a time again.
    assert await inbox.renew("W", gen)
    assert await inbox.acquire("V") is None
    sql(path, "UPDATE lease SET until = 'soon'")
    assert await inbox.acquire("V") == gen + 1  # and another takes it over
    sql(path, "UPDATE lease SET gen = 'x'")
    assert await inbox.acquire("U") == gen + 2  # the history continues
    await inbox.ingest("chat", "m", None)
    assert len(await inbox.claim_batch("U", gen + 2)) == 1


async def test_class2_a_broken_approval_or_running_row_fails_nothing_else(inbox, path):
    await inbox.request_approval("r", 600, "do")
    if not corrupt(path, "UPDATE approvals SET due = 'later'"):  # a bigint on PostgreSQL
        sql(path, "UPDATE approvals SET due = ?", (T - 1,))  # the nearest: already past
    assert await inbox.answer_approval("r", "yes") == "expired"
    await inbox.ingest("chat", "m", None)
    gen = await inbox.acquire("W")
    batch = await inbox.claim_batch("W", gen)  # the expiry's event and the chat one
    [event] = [e for e in batch if e.source == "chat"]
    if not corrupt(path, "UPDATE events SET attempts = 'x' WHERE id = ?", (event.id,)):
        sql(path, "UPDATE events SET attempts = ? WHERE id = ?", (2**63 - 1, event.id))
    assert await inbox.finish("W", gen, [e.id for e in batch], error="boom")
    assert (await inbox.get_event(event.id)).status == "dead"


async def test_class2_a_broken_settings_row_falls_back_to_defaults(path, clock):
    async with await Inbox.open(path, clock=clock) as box:
        await box.configure(max_attempts=7, lease_ttl=300)
    if is_postgresql(path):  # the settings are a JSON text column of the inbox's row
        sql(
            path,
            "UPDATE inboxes SET settings = jsonb_set(settings::jsonb, '{lease_ttl}', "
            "'9223372036854775807')::text",
        )
    else:
        sql(path, "UPDATE settings SET json = json_set(json, '$.lease_ttl', 9223372036854775807)")
    async with await Inbox.open(path, clock=clock) as box:
        assert (box.settings.max_attempts, box.settings.lease_ttl) == (7, 120)
        assert await box.acquire("W") == 1  # now + lease_ttl cannot overflow
    sql(
        path,
        "UPDATE inboxes SET settings = '{not json'"
        if is_postgresql(path)
        else "UPDATE settings SET json = '{not json'",
    )
    async with await Inbox.open(path, clock=clock) as box:
        assert box.settings.max_attempts == 3
        assert await box.renew("W", 1)
