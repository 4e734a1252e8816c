"""A worker going from one run to the next commits once: the run's finish claims the next
run in the same transaction (Inbox.finish_and_claim), and the step before a claim (the
change token, due timers, the settings) is part of the claim's transaction
(Inbox.claim_next). What that must never change: no claimed batch is left behind, a stop
still lets what was claimed run, a budget of runs still holds.
"""

from __future__ import annotations

import asyncio

from onwatch.core.runtime.worker import Worker

from .conftest import T, until


class Commits:
    """Counts the COMMITs the inbox's connection runs (SQLite's statement trace)."""

    def __init__(self, inbox) -> None:
        self.count = 0
        inbox._db._conn._connection.set_trace_callback(self._seen)

    def _seen(self, sql: str) -> None:
        if sql == "COMMIT":
            self.count += 1


async def test_from_one_run_to_the_next_a_worker_commits_once(inbox, start):
    await inbox.configure(max_batch=1)
    await inbox.ingest_batch([("chat", f"m{i}", {"i": i}) for i in range(12)])
    commits = Commits(inbox)
    ran: list[str] = []
    seen: list[int] = []  # the commits counted as each run began

    async def agent(batch, ctx) -> None:
        ran.extend(e.source_id for e in batch)
        seen.append(commits.count)
        ctx.result = {"seen": batch[0].source_id}

    running = start(agent)
    await until(lambda: len(ran) == 12, what="every event run")
    await running.stop()
    statuses = {(await inbox.get_event(i)).status for i in range(1, 13)}
    assert statuses == {"done"} and ran == [f"m{i}" for i in range(12)]
    # Between two runs, one commit: the finish of the one that ended, with the claim of the
    # next (before: a claim and a finish, two commits a run, and three more calls).
    assert [b - a for a, b in zip(seen[1:-1], seen[2:], strict=True)] == [1] * 10


async def test_a_stop_right_after_a_finish_that_claimed_runs_the_claimed_batch(inbox, start):
    """SIGTERM lands just after the commit that finished run 1 and claimed run 2: run 2 is
    this worker's, as a run in progress is; it runs and finishes, nothing is left running
    for a successor to recover as lost."""
    await inbox.configure(max_batch=1)
    await inbox.ingest_batch([("chat", "m1", {}), ("chat", "m2", {}), ("chat", "m3", {})])
    ran: list[str] = []
    running: list = []

    async def agent(batch, ctx) -> None:
        ran.extend(e.source_id for e in batch)

    real = inbox.finish_and_claim

    async def stop_after_commit(*args, **kwargs):
        outcome = await real(*args, **kwargs)
        running[0].worker.request_stop()
        return outcome

    inbox.finish_and_claim = stop_after_commit
    running.append(start(agent))
    stats = await asyncio.wait_for(running[0].task, 10)
    assert ran == ["m1", "m2"] and stats.done == 2
    assert [(await inbox.get_event(i)).status for i in (1, 2, 3)] == ["done", "done", "pending"]
    assert [(await inbox.get_event(i)).attempts for i in (1, 2, 3)] == [1, 1, 0]
    assert [r.outcome for r in await inbox.runs(2)] == ["done"]


async def test_max_runs_never_claims_a_run_past_its_budget(inbox):
    await inbox.configure(max_batch=1)
    await inbox.ingest_batch([("chat", f"m{i}", {}) for i in range(5)])

    async def agent(batch, ctx) -> None:
        pass

    stats = await Worker(inbox, agent, holder="w", max_runs=3, poll_interval=0.02).run()
    assert stats.runs == 3
    assert [(await inbox.get_event(i)).status for i in range(1, 6)] == ["done"] * 3 + [
        "pending"
    ] * 2
    assert (await inbox.get_event(4)).attempts == 0  # never claimed, never counted


async def test_timers_due_join_the_claim_that_fires_them(inbox, start, clock):
    """The step before a run fires due timers in the claim's own transaction: a timer due
    while the worker is busy runs as the very next run."""
    ran: list[str] = []

    async def agent(batch, ctx) -> None:
        ran.extend(e.source for e in batch)
        if batch[0].source == "chat":
            clock.advance(61)

    await inbox.add_timer("follow-up", T + 60, {"n": 1})
    await inbox.ingest("chat", "m1", {})
    running = start(agent)
    await until(lambda: ran == ["chat", "timer"], what="the timer run right after")
    await running.stop()
    assert await inbox.timers() == []


async def test_a_stop_with_the_lease_unheld_leaves_the_claimed_batch_to_recovery(inbox, start):
    """Stopping, with a batch claimed by the last finish, while the lease cannot be renewed
    (the database stays locked): the worker stops rather than wait on the lock, and the
    batch stays claimed under its generation for a successor to recover."""
    from onwatch.core import InboxBusy

    await inbox.configure(max_batch=1)
    await inbox.ingest_batch([("chat", "m1", {}), ("chat", "m2", {})])
    ran: list[str] = []
    running: list = []

    async def agent(batch, ctx) -> None:
        ran.extend(e.source_id for e in batch)

    real = inbox.finish_and_claim

    async def locked_after_commit(*args, **kwargs):
        outcome = await real(*args, **kwargs)
        worker = running[0].worker
        worker._renew_due = lambda: True  # the renewal is due now ...
        tries = 0

        async def busy(*args, **kwargs):
            nonlocal tries
            tries += 1
            # A stopping worker that kept on trying would never yield the loop: end it.
            assert tries < 50, "the stopping worker keeps trying to renew its lease"
            raise InboxBusy("inbox stayed locked by another process for more than 5 s")

        inbox.renew = busy  # ... and the database stays locked
        worker.request_stop()
        return outcome

    inbox.finish_and_claim = locked_after_commit
    running.append(start(agent))
    stats = await asyncio.wait_for(running[0].task, 10)
    assert ran == ["m1"] and stats.done == 1
    m2 = await inbox.get_event(2)
    assert (m2.status, m2.attempts) == ("running", 1)  # the successor's claim recovers it
