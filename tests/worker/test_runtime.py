"""The worker runtime in-process, on a fake clock: runs, failures, budgets, lease loss, stop."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import threading
import time

import pytest

from onwatch.core import BudgetExceeded, Inbox
from onwatch.core.runtime.channels import command_channel
from onwatch.core.runtime.context import LeaseLost, RunAbandoned
from onwatch.core.runtime.worker import AgentWedged, Worker, run_worker

from .conftest import DAY, T, asleep, status, until
from .helpers import kill_listed


async def echo(batch, ctx):
    for event in batch:
        ctx.reply(f"echo {event.source_id}")
    ctx.result = {"ids": [e.id for e in batch]}


async def test_a_run_finishes_once_with_its_replies_and_result(inbox, start):
    for i in range(3):
        await inbox.ingest("chat", f"m{i}", {"text": i})
    sent = []
    running = start(echo, send=sent.append)
    await until(lambda: sent, what="the send")
    stats = await running.stop()
    assert [str(s) for s in sent] == ["echo m0\n\necho m1\n\necho m2"]
    assert (stats.runs, stats.done, stats.sent, stats.generations) == (1, 1, 3, [1])
    runs = await inbox.runs(1)
    assert [(r.outcome, r.result, r.event_ids) for r in runs] == [
        ("done", {"ids": [1, 2, 3]}, (1, 2, 3))
    ]
    lease = await inbox.lease_info()
    assert lease.until < inbox.now()  # released on stop


async def test_an_agent_that_raises_is_recorded_with_backoff_and_the_worker_goes_on(
    inbox, start, clock
):
    calls = []

    async def flaky(batch, ctx):
        calls.append(clock.now())
        if len(calls) < 3:
            raise RuntimeError(f"boom {len(calls)}")
        ctx.reply("third time lucky")

    await inbox.configure(backoff_base=10, backoff_cap=100)
    await inbox.ingest("chat", "m1", "x")
    running = start(flaky)
    await until(lambda: len(calls) == 1)
    event = await until(lambda: _pending_with_error(inbox, 1), what="the error recorded")
    assert event.error == "RuntimeError: boom 1" and event.available_at == T + 10
    clock.advance(10)
    await until(lambda: len(calls) == 2)
    event = await until(lambda: _pending_with_error(inbox, 1))
    assert event.error == "RuntimeError: boom 2" and event.available_at == T + 10 + 20
    clock.advance(20)
    await until(lambda: _status_is(inbox, 1, "done"))
    stats = await running.stop()
    assert (stats.runs, stats.failed, stats.done) == (3, 2, 1)
    assert [m.body for m in await inbox.held_messages()] == ["third time lucky"]


async def test_an_agent_error_the_inbox_would_refuse_to_store_is_stored_escaped(inbox, start):
    async def agent(batch, ctx):
        raise ValueError("bad byte \x00, lone \ud800, line\nbreak")

    await inbox.ingest("chat", "m1", "x")
    running = start(agent)
    event = await until(lambda: _pending_with_error(inbox, 1), what="the error recorded")
    assert event.error == "ValueError: bad byte \\x00, lone \\ud800, line\nbreak"
    assert not running.task.done()  # the worker goes on
    stats = await running.stop()
    assert (stats.runs, stats.failed) == (1, 1)


async def test_an_agent_that_raises_cancelled_error_is_a_failed_run_not_a_crash(inbox, start):
    async def agent(batch, ctx):
        raise asyncio.CancelledError()  # e.g. a sub-task's cancellation let through

    await inbox.ingest("chat", "m1", "x")
    running = start(agent)
    event = await until(lambda: _pending_with_error(inbox, 1), what="the error recorded")
    assert event.error.startswith("CancelledError: ")
    assert not running.task.done()
    stats = await running.stop()
    assert (stats.runs, stats.failed, stats.abandoned) == (1, 1, 0)


async def _pending_with_error(inbox, event_id):
    event = await inbox.get_event(event_id)
    return event if event.status == "pending" and event.error else None


async def _status_is(inbox, event_id, state):
    event = await inbox.get_event(event_id)
    return event is not None and event.status == state


async def test_a_plain_def_agent_runs_in_a_thread_and_can_perform_effects(inbox, start):
    performed = []

    def agent(batch, ctx):
        outcome = ctx.perform("notify", {"n": 1}, lambda key: performed.append(key) or "ok")
        ctx.reply(f"plain {outcome}")

    await inbox.ingest("chat", "m1", "x")
    running = start(agent)
    await until(lambda: _status_is(inbox, 1, "done"))
    await running.stop()
    [effect] = await inbox.effects(1)
    assert (effect.name, effect.state, effect.key) == ("notify", "confirmed", performed[0])
    assert [m.body for m in await inbox.held_messages()] == ["plain ok"]


async def test_the_effect_journal_records_intent_then_outcome(inbox, start):
    async def agent(batch, ctx):
        async with ctx.effect("send-mail", {"to": "a@example.org"}) as key:
            assert key.startswith("onwatch-")
        with pytest.raises(ValueError):
            async with ctx.effect("charge", {"amount": 5}):
                raise ValueError("card declined")
        assert await ctx.perform("sms", None, lambda key: "sent") == "sent"

    await inbox.ingest("chat", "m1", "x")
    running = start(agent)
    await until(lambda: _status_is(inbox, 1, "done"))
    await running.stop()
    assert [(e.name, e.state) for e in await inbox.effects(1)] == [
        ("send-mail", "confirmed"),
        ("charge", "failed"),
        ("sms", "confirmed"),
    ]


async def test_a_run_past_max_run_seconds_is_abandoned_and_recovered_as_lost(inbox, start, clock):
    await inbox.configure(max_run_seconds=30)
    calls = []
    gate = asyncio.Event()

    async def agent(batch, ctx):
        calls.append(ctx.run_id)
        if len(calls) == 1:
            try:
                await gate.wait()  # never set: the budget must cut this run
            except asyncio.CancelledError:
                with pytest.raises(RunAbandoned):
                    ctx.reply("too late")
                raise
        ctx.reply("second try")

    await inbox.ingest("chat", "m1", "x")
    running = start(agent)
    await until(lambda: calls)
    clock.advance(30)
    await until(lambda: running.worker.stats.abandoned == 1, what="the abandon")
    assert await status(inbox, 1) == "running"
    clock.advance(1)  # the core treats the claim as lost once it is past the budget
    await until(lambda: _status_is(inbox, 1, "done"), what="the retry")
    stats = await running.stop()
    assert (stats.runs, stats.abandoned, stats.done) == (2, 1, 1)
    runs = await inbox.runs(1)
    assert [r.outcome for r in runs] == ["lost", "done"]
    assert "max_run_seconds" in runs[0].error


async def test_over_budget_under_interrupt_waits_for_the_operator(inbox, start, clock):
    await inbox.configure(max_run_seconds=30, on_lost_claim="interrupt")

    async def agent(batch, ctx):
        async with ctx.effect("charge", {"amount": 5}):
            await asyncio.sleep(3600)

    await inbox.ingest("chat", "m1", "x")
    running = start(agent)
    await until(lambda: _status_is(inbox, 1, "running"))
    await until(lambda: inbox.effects(1))
    clock.advance(31)
    await until(lambda: _status_is(inbox, 1, "interrupted"), what="interrupted")
    await running.stop()
    # The charge was cancelled mid-way: the journal keeps it 'intended' (it may have gone).
    assert [(e.name, e.state) for e in await inbox.effects(1)] == [("charge", "intended")]


async def test_a_lost_lease_abandons_the_run_and_the_successor_recovers_it(inbox, start, clock):
    gate = asyncio.Event()
    seen = []

    async def agent(batch, ctx):
        seen.append(ctx.gen)
        await gate.wait()
        ctx.reply("late")

    await inbox.ingest("chat", "m1", "x")
    running = start(agent, holder="A")
    await until(lambda: seen)
    clock.advance(121)  # A stalls past its lease (no renewal happened: the clock jumped)
    assert await inbox.acquire("B") == 2
    await until(lambda: running.worker.stats.abandoned == 1, what="A to notice")
    gate.set()
    assert await inbox.claim_batch("B", 2) != []  # B recovers and re-claims the event
    assert await inbox.held_messages() == []
    audit = await inbox.audit(limit=5)
    assert any(a.action == "refused renew" and a.actor == "A" for a in audit)
    stats = await running.stop()
    assert stats.done == 0 and stats.refused == 0


async def test_an_effect_after_the_lease_was_lost_is_never_performed(inbox, start, clock):
    performed = []
    go = asyncio.Event()
    outcome = []

    async def agent(batch, ctx):
        await go.wait()
        try:
            await ctx.perform("refund", {"amount": 5}, lambda key: performed.append(key))
        except LeaseLost as exc:
            outcome.append(str(exc))
            raise

    await inbox.ingest("chat", "m1", "x")
    running = start(agent, holder="A", poll_interval=5)  # no renewal check in between
    await until(lambda: _status_is(inbox, 1, "running"))
    clock.advance(121)
    assert await inbox.acquire("B") == 2
    go.set()
    await until(lambda: outcome, what="the refused intent")
    await until(lambda: running.worker.stats.abandoned == 1)
    await running.stop(force=True)
    assert performed == [] and await inbox.effects(1) == []
    assert any(a.action == "refused effect refund" for a in await inbox.audit(limit=5))


async def test_stop_lets_the_current_run_finish_within_grace(inbox, start, clock):
    release = asyncio.Event()

    async def agent(batch, ctx):
        await release.wait()
        ctx.reply("finished cleanly")

    await inbox.ingest("chat", "m1", "x")
    running = start(agent, grace=5)
    await until(lambda: _status_is(inbox, 1, "running"))
    running.worker.request_stop()
    # The run loop reads the clock on every pass: three passes since the stop have each
    # had the chance to abandon the run, and none may (the grace is 5 s).
    reads = clock.reads
    await until(lambda: clock.reads >= reads + 3 or running.task.done(), what="three passes")
    assert not running.task.done() and running.worker.stats.abandoned == 0
    release.set()
    stats = await asyncio.wait_for(running.task, 5)
    assert stats.done == 1 and stats.abandoned == 0
    assert await status(inbox, 1) == "done"
    assert (await inbox.lease_info()).until < inbox.now()


async def test_a_stop_ends_an_idle_workers_nap_at_once(inbox, start):
    """The nap lasts an hour (a fake clock keeps the poll interval): only the stop can end
    it within the 10 s Running.stop gives, and the wait it ended is gone."""

    async def agent(batch, ctx):
        raise AssertionError("nothing to run")

    running = start(agent, poll_interval=3600)
    await asleep(running, inbox)
    stats = await running.stop()
    assert stats.runs == 0 and inbox.wake.waiting == 0


async def test_a_second_stop_abandons_the_run_at_once(inbox, start):
    async def agent(batch, ctx):
        await asyncio.sleep(3600)

    await inbox.ingest("chat", "m1", "x")
    running = start(agent, grace=60)
    await until(lambda: _status_is(inbox, 1, "running"))
    running.worker.request_stop()
    running.worker.request_stop()
    stats = await asyncio.wait_for(running.task, 2)
    assert stats.abandoned == 1
    # Released: the next worker takes over at once and recovers the claim.
    assert await inbox.acquire("next") == 2
    assert [e.id for e in await inbox.claim_batch("next", 2)] == [1]


async def test_cancelling_the_worker_mid_run_cancels_the_agent_too(inbox, start):
    started, cancelled = asyncio.Event(), asyncio.Event()

    async def agent(batch, ctx):
        started.set()
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    await inbox.ingest("chat", "m1", "x")
    running = start(agent)
    await asyncio.wait_for(started.wait(), 5)
    running.task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await running.task
    # Not left running on its own after the worker released the lease.
    await asyncio.wait_for(cancelled.wait(), 2)


async def test_a_restarted_process_with_the_same_holder_name_does_not_adopt_stuck_claims(
    inbox, start, clock, caplog
):
    await inbox.ingest("chat", "m1", "x")
    assert await inbox.acquire("box") == 1
    await inbox.claim_batch("box", 1)  # ... and the process died
    running = start(echo, holder="box")
    # It looked at the lease, said why it will not adopt it, and went to sleep on it.
    await until(lambda: "held under this holder name" in caplog.text, what="the refusal")
    await asleep(running, inbox)
    assert await status(inbox, 1) == "running"
    assert (await inbox.lease_info()).gen == 1
    clock.advance(121)
    await until(lambda: _status_is(inbox, 1, "done"), what="the takeover")
    await running.stop()
    assert running.worker.stats.generations == [2]


async def test_a_standby_worker_waits_on_reads_without_write_transactions(
    inbox, start, clock, monkeypatch
):
    assert await inbox.acquire("A") == 1  # the active worker, elsewhere
    calls = {"acquire": 0, "lease_info": 0, "change_token": 0}
    for name in calls:

        def spy(*args, _real=getattr(inbox, name), _name=name, **kwargs):  # noqa: B008 - evaluated once, on purpose
            calls[_name] += 1
            return _real(*args, **kwargs)

        monkeypatch.setattr(inbox, name, spy)
    running = start(echo, holder="B")
    for i in range(3):  # commits by others wake the standby; each costs it one read
        await until(lambda: inbox.wake.waiting, what="B idle")  # B sleeps on its token
        seen = calls["lease_info"]
        await inbox.ingest("chat", f"m{i}", "x")
        await until(lambda: calls["lease_info"] > seen, what="B to wake")  # noqa: B023 - called within this iteration
    assert calls["acquire"] == 0  # no BEGIN IMMEDIATE against the active worker's writes
    clock.advance(121)  # A's lease lapses: B takes over
    await until(lambda: _status_is(inbox, 3, "done"), what="B's takeover and run")
    await running.stop()
    assert calls["acquire"] >= 1 and running.worker.stats.generations == [2]


async def test_an_event_committed_between_an_empty_claim_and_the_nap_is_run(inbox, start, clock):
    other = await Inbox.open(inbox.path, clock=clock)  # another connection: another process
    next_wake, committed = inbox.next_wake, asyncio.Event()

    async def commit_then_next_wake(**options):  # _idle asks after the claim, before the nap
        if not committed.is_set():
            await other.ingest("chat", "between", "x")
            committed.set()
        return await next_wake(**options)

    inbox.next_wake = commit_then_next_wake
    try:
        running = start(echo)
        await asyncio.wait_for(committed.wait(), 5)
        await asleep(running, inbox)
        await until(lambda: _status_is(inbox, 1, "done"), timeout=5, what="the event's run")
    finally:
        await other.close()


async def test_idle_worker_wakes_for_new_events_answers_and_timers(inbox, start, clock):
    running = start(echo)
    await until(lambda: inbox.lease_info())
    await asleep(running, inbox)  # idle: only a wake-up brings it to the new event
    await inbox.ingest("chat", "late", "x")
    await until(lambda: _status_is(inbox, 1, "done"), timeout=2, what="the new event")
    idle = await asleep(running, inbox)
    await inbox.add_timer("ping", T + 50, None)
    # Woken by the new timer, it looked and went back to sleep: not due yet, nothing ran.
    await until(lambda: running.worker.stats.idle > idle and inbox.wake.waiting, what="a look")
    assert (await inbox.counts())["done"] == 1
    clock.advance(50)
    await until(lambda: _status_is(inbox, 2, "done"), timeout=2, what="the timer")
    await running.stop()


async def test_paused_inbox_is_not_claimed_until_resumed(inbox, start):
    await inbox.pause()
    await inbox.ingest("chat", "m1", "x")
    running = start(echo)
    await until(lambda: running.worker.stats.idle >= 1, what="a claim that found nothing")
    assert await status(inbox, 1) == "pending"
    await inbox.resume()
    await until(lambda: _status_is(inbox, 1, "done"), timeout=2)
    await running.stop()


# --- budgets (docs/rules.md#budgets): each says whether excess is delayed or refused ------


async def test_budget_runs_per_day_delays_the_excess(inbox, start, clock):
    await inbox.configure(max_runs_per_day=2, max_batch=1)
    for i in range(3):
        await inbox.ingest("chat", f"m{i}", "x")
    running = start(echo)
    stats = running.worker.stats
    await until(
        lambda: stats.runs == 2 and stats.idle >= 1,
        what="a claim after the second run that found nothing",
    )
    assert await _status_is(inbox, 2, "done")
    assert await status(inbox, 3) == "pending"  # delayed, not refused
    overview = await inbox.overview()
    assert overview.budgets["max_runs_per_day"] == {"limit": 2, "used": 2, "excess": "delayed"}
    clock.advance(DAY)
    await until(lambda: _status_is(inbox, 3, "done"), timeout=3, what="the next day's run")
    await running.stop()


async def test_budget_max_pending_refuses_the_excess(inbox):
    await inbox.configure(max_pending=2)
    assert await inbox.ingest("chat", "m1", "x") is True
    assert await inbox.ingest("chat", "m2", "x") is True
    with pytest.raises(BudgetExceeded, match="max_pending"):
        await inbox.ingest("chat", "m3", "x")
    assert await inbox.ingest("chat", "m1", "x") is False  # a duplicate is never refused
    assert (await inbox.counts())["pending"] == 2


async def test_budget_followups_per_run_refuses_the_run_outcome(inbox, start, clock):
    await inbox.configure(max_followups_per_run=1, backoff_base=10)

    async def agent(batch, ctx):
        ctx.follow_up("a", ctx.now + 60)
        ctx.follow_up("b", ctx.now + 120)
        ctx.reply("never queued")

    await inbox.ingest("chat", "m1", "x")
    running = start(agent)
    event = await until(lambda: _pending_with_error(inbox, 1), what="the refused outcome")
    await running.stop()
    assert "max_followups_per_run" in event.error and event.available_at == T + 10
    assert await inbox.timers() == [] and await inbox.held_messages() == []


async def test_a_failed_delivery_is_logged_by_the_worker(inbox, start, caplog):
    def broken(text):
        raise ConnectionError("smtp refused")

    await inbox.ingest("chat", "m1", "x")
    running = start(echo, send=broken)
    await until(lambda: _status_is(inbox, 1, "done"))
    await until(
        lambda: any("smtp refused" in r.getMessage() for r in caplog.records),
        what="the failure in the log",
    )
    await running.stop()
    line = next(r.getMessage() for r in caplog.records if "smtp refused" in r.getMessage())
    assert line.startswith("delivery onwatch-") and "ConnectionError: smtp refused" in line
    assert [d.status for d in await inbox.deliveries()][-1] in ("failed", "dead")


async def test_run_worker_opens_a_path_and_stops_on_the_event(tmp_path):
    path = str(tmp_path / "w.db")
    inbox = await Inbox.open(path)
    await inbox.ingest("chat", "m1", "x")
    await inbox.close()
    stop = asyncio.Event()
    sent = []
    task = asyncio.create_task(
        run_worker(path, echo, stop=stop, send=sent.append, poll_interval=0.02)
    )
    await until(lambda: sent)
    stop.set()
    stats = await asyncio.wait_for(task, 5)
    assert stats.done == 1 and [str(s) for s in sent] == ["echo m1"]


async def test_worker_refuses_a_non_callable_agent_and_bad_options(inbox):
    with pytest.raises(ValueError):
        Worker(inbox, "not a function")
    for options in (
        {"poll_interval": 0},
        {"poll_interval": float("nan")},
        {"poll_interval": float("inf")},
        {"grace": -1},
        {"grace": float("nan")},
        {"max_runs": 0},
        {"max_runs": 1.5},
    ):
        with pytest.raises(ValueError, match=next(iter(options))):
            Worker(inbox, echo, **options)


async def test_run_worker_closes_the_inbox_it_opened_when_the_worker_is_refused(
    tmp_path, monkeypatch
):
    path = str(tmp_path / "w.db")
    await (await Inbox.open(path)).close()
    closed = []
    real_close = Inbox.close

    async def close(self):
        closed.append(self)
        await real_close(self)

    monkeypatch.setattr(Inbox, "close", close)
    with pytest.raises(ValueError, match="agent must be callable"):
        await run_worker(path, "not a function")
    assert len(closed) == 1  # else its connection thread keeps the process from exiting


async def test_command_channel_never_leaves_its_command_running(tmp_path):
    with pytest.raises(RuntimeError, match="longer than 0.2 s"):
        # Within 15 s, not 30: the shell's child went with it (else it holds the pipes open).
        await asyncio.wait_for(command_channel("sleep 30; true", timeout=0.2)("hello"), 15)
    pid_file = tmp_path / "pid"
    task = asyncio.create_task(command_channel(f"echo $$ > {pid_file}; exec sleep 30")("hi"))
    pid = int(
        await until(
            lambda: pid_file.exists() and pid_file.read_text().strip(), what="the command to start"
        )
    )
    task.cancel()  # e.g. the dispatching worker is cancelled
    with pytest.raises(asyncio.CancelledError):
        await task
    try:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)  # killed and reaped
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


async def test_command_channel_waits_for_its_command_not_for_what_it_left_running(tmp_path):
    """A command that starts a daemon (one that leaves its process group and keeps the
    command's stderr, as a session bus started by `notify-send` may) and exits 0 has sent:
    the send succeeds when the command exits. (Reading its stderr through a pipe, the send
    waited for the daemon, ran past its timeout and failed: the reply was sent again.)"""
    daemons, got = tmp_path / "daemons", tmp_path / "got.txt"
    send = command_channel(f"setsid sleep 60 & echo $! >> {daemons}; cat > {got}", timeout=30)
    try:
        await send("hello")
        assert got.read_text() == "hello"
    finally:
        kill_listed(daemons)
    failing = command_channel(f"setsid sleep 60 & echo $! >> {daemons}; echo no >&2; exit 4")
    try:
        with pytest.raises(RuntimeError, match="command exited with 4: no"):
            await failing("hello")
    finally:
        kill_listed(daemons)
    # Five megabytes on stderr, then the line that says why: only the end is kept.
    chatty = command_channel(
        r"head -c 5000000 /dev/zero | tr '\0' x >&2; printf '\nwhy\n' >&2; exit 6"
    )
    with pytest.raises(RuntimeError, match="command exited with 6: why$"):
        await chatty("hello")


# --- a misbehaving agent, in-process (docs/rules.md#a-misbehaving-agent) -------------------
# The real-process tests are in test_misbehaving.py; these pin the runtime's own decisions.


async def test_code_that_outlives_its_grace_raises_agent_wedged_after_releasing(inbox, start):
    await inbox.configure(max_run_seconds=30)
    let_go, swallowed = asyncio.Event(), []

    async def agent(batch, ctx):
        while not let_go.is_set():  # a retry loop that swallows the cancellation
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                swallowed.append(ctx.run_id)
                await let_go.wait()

    await inbox.ingest("chat", "m1", "x")
    running = start(agent, grace=0.1)
    await until(lambda: _status_is(inbox, 1, "running"))
    running.worker.request_stop()  # grace 0.1 s to finish, then 0.1 s to end: it will not
    with pytest.raises(AgentWedged, match="did not end when cancelled"):
        await asyncio.wait_for(running.task, 5)
    assert swallowed == [1]
    assert (await inbox.lease_info()).until < inbox.now()  # released before raising
    assert await status(inbox, 1) == "running"  # left for the next generation
    let_go.set()


async def test_an_agent_that_ends_within_the_grace_lets_the_worker_go_on(inbox, start, clock):
    await inbox.configure(max_run_seconds=30)
    calls = []

    def agent(batch, ctx):  # a plain def: its thread cannot be cancelled, only waited for
        calls.append(ctx.run_id)
        if len(calls) == 1:
            while ctx._closed is None:  # keeps going until given up, then returns soon
                time.sleep(0.01)
            return
        ctx.reply("second")

    await inbox.ingest("chat", "m1", "x")
    running = start(agent, grace=5)
    await until(lambda: calls)
    clock.advance(30)
    await until(lambda: running.worker.stats.abandoned == 1, what="the abandon")
    clock.advance(1)
    await until(lambda: _status_is(inbox, 1, "done"), what="the retry by the same worker")
    stats = await running.stop()
    assert (stats.runs, stats.abandoned, stats.done) == (2, 1, 1)


@pytest.mark.parametrize("raised", [SystemExit(0), KeyboardInterrupt(), GeneratorExit()])
@pytest.mark.parametrize("plain", [False, True])
async def test_an_agent_raising_a_base_exception_fails_its_run_only(inbox, start, raised, plain):
    async def async_agent(batch, ctx):
        raise raised

    def plain_agent(batch, ctx):
        raise raised

    await inbox.ingest("chat", "m1", "x")
    running = start(plain_agent if plain else async_agent)
    event = await until(lambda: _pending_with_error(inbox, 1), what="the failure recorded")
    assert event.error.startswith(type(raised).__name__)
    assert not running.task.done()
    stats = await running.stop()
    assert (stats.runs, stats.failed) == (1, 1)


async def test_a_plain_def_perform_leaves_the_loop_free(inbox, start):
    """The effect blocks its thread only: the loop turns meanwhile (it ran on the loop)."""
    paying, release, turns = threading.Event(), threading.Event(), []

    def agent(batch, ctx):
        def pay(key):
            paying.set()
            release.wait(10)
            paying.clear()
            return "paid"

        ctx.reply(ctx.perform("pay", None, pay))

    await inbox.ingest("chat", "m1", "x")
    running = start(agent)
    await until(paying.is_set, what="the payment to start")
    for _ in range(3):
        await asyncio.sleep(0)  # the loop turns while the payment still runs
        turns.append(paying.is_set())
    release.set()
    await until(lambda: _status_is(inbox, 1, "done"))
    await running.stop()
    assert turns == [True, True, True]
    assert [e.state for e in await inbox.effects(1)] == ["confirmed"]


async def test_the_loop_watch_names_the_run_that_blocks_the_loop(tmp_path, caplog):
    path = str(tmp_path / "w.db")
    async with await Inbox.open(path) as box:
        await box.configure(lease_ttl=1, outbox_gap=0)  # a stall is worth a word at 0.25 s
        await box.ingest("chat", "m1", "x")

    async def agent(batch, ctx):
        time.sleep(0.6)  # blocks the loop

    caplog.set_level(logging.WARNING, "onwatch.worker")
    stats = await run_worker(path, agent, max_runs=1, poll_interval=0.02)
    assert stats.done == 1
    await until(lambda: "turned again" in caplog.text, what="the end of the stall")
    blocked = next(r.getMessage() for r in caplog.records if "has been blocked" in r.getMessage())
    assert "run 1 (events [1], gen 1)" in blocked and "test_runtime.py" in blocked


async def test_run_worker_resolves_a_relative_path_once(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    async with await Inbox.open("w.db") as box:
        await box.ingest("chat", "m1", "x")
        await box.ingest("chat", "m2", "x")
        await box.configure(max_batch=1)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()

    async def agent(batch, ctx):
        os.chdir(elsewhere)
        ctx.reply("moved")

    stats = await run_worker("w.db", agent, max_runs=2, poll_interval=0.02)
    assert stats.done == 2
    assert not (elsewhere / "w.db").exists()
