"""Scenario 6: Timers."""

from __future__ import annotations

from onwatch.core import Event
from onwatch.core.humanize import duration

from .stage import DAY, MINUTE, START, Scenario, Stage, Step, plural


def build() -> Scenario:
    async def register(s: Stage) -> str:
        s.at(START)
        await s.inbox.add_timer("digest", START, {"kind": "daily digest"}, every=DAY)
        return "The agent registers a daily digest timer, first due now (t), catch-up 'coalesce'."

    async def first_pass(s: Stage) -> str:
        due = await s.inbox.run_scheduler()
        s.results["first_pass"] = due
        return (
            f"Scheduler pass at t: {due} due. It does not run the agent; it writes the "
            f"occurrence to the inbox as event digest@{START}, which is what makes a "
            f"replay deduplicable."
        )

    async def second_pass(s: Stage) -> str:
        due = await s.inbox.run_scheduler()
        s.results["second_pass"] = due
        return (
            f"A second pass at the same instant: {due} due. The first pass advanced the "
            f"timer in the same transaction that wrote the event."
        )

    async def redeploy(s: Stage) -> str:
        s.later(20)
        await s.inbox.add_timer("digest", START, {"kind": "daily digest"}, every=DAY)
        due = await s.inbox.run_scheduler()
        digests = await _digests(s)
        s.results["redeploy_pass"] = due
        return (
            f"A deploy re-registers the schedule with its old due time t: {due} due, but "
            f"still {plural(len(digests), 'digest event')} — the occurrence key "
            f"digest@{START} was already taken."
        )

    async def outage(s: Stage) -> str:
        timer = next(t for t in await s.inbox.timers() if t.id == "digest")
        s.at(timer.due + 3 * DAY + 10 * MINUTE)
        due = await s.inbox.run_scheduler()
        digests = await _digests(s)
        newest = max(digests, key=lambda e: e.id)
        payload = newest.payload or {}
        timer = next(t for t in await s.inbox.timers() if t.id == "digest")
        s.results.update(outage_pass=due, next_due_in=timer.due - s.now)
        return (
            f"The machine was off for 3 days. Back at next due + 3 d 10 min: {due} due, "
            f"{plural(len(digests), 'digest event')} in total; the new one has skipped "
            f"{payload.get('skipped')}, late_by {payload.get('late_by')} s. Next due in "
            f"{timer.due - s.now:,} s ({duration(timer.due - s.now)}). One digest, not four."
        )

    return Scenario(
        6,
        "timer-coalesce",
        "Timers: replays and an outage",
        "A daily digest timer fires, is replayed by a deploy, then misses 3 days.",
        (
            Step("Register a daily timer", register, "timers"),
            Step("The scheduler fires it", first_pass, "pending"),
            Step("A second pass at the same instant", second_pass, "pending"),
            Step("A deploy replays the old due time", redeploy, "pending"),
            Step("Three days of outage", outage, "timers"),
        ),
        watch="Watch the Timers pane: next due, last fired, skipped.",
        focus="timers",
        moment=4,
    )


async def _digests(s: Stage) -> list[Event]:
    found: list[Event] = []
    for status in ("pending", "running", "done"):
        found += [e for e in await s.inbox.events(status) if e.source_id.startswith("digest@")]
    return found
