"""Scenario 12: Cancel a waiting task."""

from __future__ import annotations

from .stage import START, Scenario, Stage, Step, plural


def build() -> Scenario:
    async def first_runs(s: Stage) -> str:
        s.at(START)
        await s.inbox.ingest("chat", "msg-50", {"from": "dana", "text": "draft the Q3 report"})
        gen = await s.inbox.acquire("worker")
        claimed = await s.inbox.claim_batch("worker", gen) if gen else []
        s.results.update(gen=gen, running_id=claimed[0].id if claimed else None)
        return "Dana asks for the Q3 report; the worker claims it and starts a long run."

    async def second_waits(s: Stage) -> str:
        s.later(30)
        await s.inbox.ingest("chat", "msg-51", {"from": "dana", "text": "also email it to Sam"})
        pending = await s.inbox.events("pending")
        s.results["pending_id"] = pending[0].id if pending else None
        return (
            f"She adds 'also email it to Sam': {plural(len(pending), 'event')} pending, "
            f"waiting for the next run."
        )

    async def cancel_pending(s: Stage) -> str:
        s.later(30)
        ok = await s.inbox.cancel(s.results["pending_id"], actor="dana", reason="changed my mind")
        s.results["cancel_pending"] = ok
        event = await s.event(s.results["pending_id"])
        return (
            f"She changes her mind and cancels msg-51 from the Pending pane: cancel "
            f"returned {ok}, it is now '{event.status}'."
        )

    async def cancel_running(s: Stage) -> str:
        s.later(10)
        ok = await s.inbox.cancel(s.results["running_id"], actor="dana")
        s.results["cancel_running"] = ok
        entry = (await s.inbox.audit(limit=1))[0]
        return (
            f"She tries to cancel the running report too: cancel returned {ok} "
            f"('{entry.reason}'). The run is already under way; the action says so "
            f"instead of pretending."
        )

    async def finish(s: Stage) -> str:
        s.later(30)
        ok = await s.inbox.finish(
            "worker", s.results["gen"], [s.results["running_id"]], ["Q3 report drafted: q3.md"]
        )
        claimed = await s.inbox.claim_batch("worker", s.results["gen"])
        s.results["claimed_after"] = [e.id for e in claimed]
        event = await s.event(s.results["pending_id"])
        return (
            f"The report run finishes ({ok}); the next claim returns "
            f"{plural(len(claimed), 'event')}. msg-51 stays '{event.status}' with "
            f"{plural(event.attempts, 'attempt')}: a cancelled event is never claimed."
        )

    return Scenario(
        12,
        "cancel",
        "Cancel a waiting task",
        "The operator cancels one waiting request and tries to cancel a running one.",
        (
            Step("A long run starts", first_runs, "running"),
            Step("A second request waits", second_waits, "pending"),
            Step("Cancel the waiting one", cancel_pending, "pending"),
            Step("Try to cancel the running one", cancel_running, "running"),
            Step("The worker never sees the cancelled one", finish, "pending"),
        ),
        watch="Watch Pending and Running, and what each cancel answers.",
        focus="pending",
        moment=3,
    )
