"""Scenario 8: Outbox pacing."""

from __future__ import annotations

from onwatch.core.humanize import duration

from .stage import (
    HOUR,
    MINUTE,
    START,
    Action,
    Scenario,
    Stage,
    Step,
    plural,
    since_start,
)


async def _run_with_reply(s: Stage, source_id: str, body: str, worker: str = "worker") -> bool:
    """Ingest one event, let `worker` claim it and finish with `body` as its reply."""
    await s.inbox.ingest("build", source_id, {"step": source_id})
    gen = await s.inbox.acquire(worker)
    claimed = await s.inbox.claim_batch(worker, gen) if gen else []
    ok = (
        await s.inbox.finish(worker, gen, [e.id for e in claimed], [body])
        if gen and claimed
        else False
    )
    if gen:
        await s.inbox.release(worker, gen)  # the worker goes idle between events
    return ok


def build() -> Scenario:
    minute0 = START + 2 * HOUR

    async def earlier(s: Stage) -> str:
        s.at(START)
        await _run_with_reply(s, "briefing", "morning briefing")
        sent = await s.inbox.dispatch(s.channel)
        return (
            f"Two hours before this story starts, the morning briefing went out ({sent} "
            f"sent). The gap between paced sends is one hour."
        )

    def update(number: int) -> Action:
        async def act(s: Stage) -> str:
            s.at(minute0 + 10 * number * MINUTE)
            first = len(s.sent)
            await _run_with_reply(s, f"update-{number}", f"update {number}")
            sent = await s.inbox.dispatch(s.channel)
            s.results.setdefault("dispatched", []).append(sent)
            held = await s.held()
            next_at = await s.inbox.next_send_at()
            if sent:
                what = (
                    f"dispatch sent {sent}: {s.sent[first]!r} (the last send was "
                    f"{duration(s.now - START)} ago)."
                )
            else:
                what = (
                    f"dispatch sent 0: inside the gap. {plural(held, 'message')} held, "
                    f"next send at {since_start(next_at) if next_at else '-'}."
                )
            return f"Minute {10 * number}: a run queues 'update {number}'; {what}"

        return act

    async def minute61(s: Stage) -> str:
        s.at(minute0 + 61 * MINUTE)
        first = len(s.sent)
        sent = await s.inbox.dispatch(s.channel)
        s.results.setdefault("dispatched", []).append(sent)
        s.results["sends"] = s.sent[s.sent.index("update 0") :] if "update 0" in s.sent else []
        text = s.sent[first] if len(s.sent) > first else ""
        return (
            f"Minute 61, the gap is over: dispatch sent {sent} in one message, "
            f"{text!r}. Two sends in the hour instead of three pings."
        )

    return Scenario(
        8,
        "outbox-pacing",
        "Outbox with a one-hour gap",
        "Progress updates arrive every 10 minutes; the person gets at most one message an hour.",
        (
            Step("The last send, two hours ago", earlier, "outbox"),
            Step("Minute 0: update 0", update(0), "outbox"),
            Step("Minute 10: update 1", update(1), "outbox"),
            Step("Minute 20: update 2", update(2), "outbox"),
            Step("Minute 61: the gap is over", minute61, "outbox"),
        ),
        watch="Watch the Outbox pane: what is held, when the next send is allowed, what was sent.",
        focus="outbox",
        moment=4,
    )
