"""Scenario 9: Restart before claim."""

from __future__ import annotations

from .stage import START, Scenario, Stage, Step, plural


def build() -> Scenario:
    async def wake_up(s: Stage) -> str:
        s.at(START)
        await s.inbox.add_timer(
            "standup-reminder",
            START,
            {"text": "stand-up in 15 min"},
            key=("reminder", "standup-2024-05-06"),
        )
        worker = await s.worker_connection("worker")
        due = await worker.run_scheduler()
        pending = await s.inbox.events("pending")
        s.results["event_id"] = pending[0].id if pending else None
        return (
            f"The worker's scheduler turns a one-off reminder into an inbox event ({due} "
            f"due): {plural(len(pending), 'event')} pending."
        )

    async def restart(s: Stage) -> str:
        s.later(2)
        await s.stop_worker("worker")
        pending = await s.inbox.events("pending")
        return (
            f"The worker process is restarted (a deploy) before it claims anything. The "
            f"wake-up lived only in the database, not in the process: "
            f"{plural(len(pending), 'event')} still pending."
        )

    async def claim(s: Stage) -> str:
        s.later(20)
        worker = await s.worker_connection("worker")
        gen = await worker.acquire("worker")
        claimed = await worker.claim_batch("worker", gen) if gen else []
        s.results.update(gen=gen, claimed=[e.id for e in claimed])
        return (
            f"The new process acquires (generation {gen}) and claims "
            f"{plural(len(claimed), 'event')}: the reminder survived the restart."
        )

    async def finish(s: Stage) -> str:
        s.later(5)
        worker = await s.worker_connection("worker")
        ok = await worker.finish(
            "worker", s.results["gen"], s.results["claimed"], ["Stand-up in 15 minutes."]
        )
        again = await worker.claim_batch("worker", s.results["gen"])
        s.results["claimed_again"] = len(again)
        event = await s.event(s.results["event_id"])
        await s.stop_worker("worker")
        return (
            f"It finishes (finish returned {ok}); a further claim returns "
            f"{plural(len(again), 'event')}. The reminder ran once: {event.status}, "
            f"attempts {event.attempts}."
        )

    return Scenario(
        9,
        "restart-before-claim",
        "Restart before claim",
        "A wake-up is stored, then the worker restarts before claiming it.",
        (
            Step("A wake-up is stored", wake_up, "pending"),
            Step("The worker restarts", restart, "pending"),
            Step("The new process claims it", claim, "running"),
            Step("It runs once", finish, "running"),
        ),
        watch="Watch the Pending pane across the restart.",
        focus="pending",
        moment=1,
    )
