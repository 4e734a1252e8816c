"""Scenario 1: Webhook delivered twice."""

from __future__ import annotations

from .stage import START, Scenario, Stage, Step, plural


def build() -> Scenario:
    async def first(s: Stage) -> str:
        s.at(START)
        stored = await s.inbox.ingest(
            "github", "delivery-7f3a", {"event": "push", "ref": "refs/heads/main"}
        )
        s.results["first"] = stored
        return (
            f"GitHub delivers webhook delivery-7f3a: ingest returned {stored} — stored "
            f"durably before the receiver answers 200."
        )

    async def retry(s: Stage) -> str:
        s.later(30)
        stored = await s.inbox.ingest(
            "github", "delivery-7f3a", {"event": "push", "ref": "refs/heads/main"}
        )
        s.results["retry"] = stored
        counts = await s.inbox.counts()
        total = sum(counts.values())
        return (
            f"GitHub never saw the 200 and redelivers the same id: ingest returned {stored}, "
            f"the inbox still has {plural(total, 'event')}. The unique key "
            f"(source, source_id) turns the retry into a no-op, not a second run."
        )

    async def run_once(s: Stage) -> str:
        s.later(5)
        gen = await s.inbox.acquire("worker")
        claimed = await s.inbox.claim_batch("worker", gen) if gen else []
        ok = (
            await s.inbox.finish("worker", gen, [e.id for e in claimed], ["Deployed main."])
            if gen and claimed
            else False
        )
        s.results["runs"] = len(claimed)
        return (
            f"The worker runs: {plural(len(claimed), 'event')} claimed, finish returned "
            f"{ok}. One delivery, one run, one reply — however often the provider retries."
        )

    return Scenario(
        1,
        "webhook-twice",
        "Webhook delivered twice",
        "A provider that gets no answer in time delivers the same webhook again.",
        (
            Step("GitHub delivers a webhook", first, "pending"),
            Step("GitHub retries the same delivery", retry, "pending"),
            Step("The worker runs it once", run_once, "outbox"),
        ),
        watch="Watch the Pending count: a redelivery never adds a row.",
        focus="pending",
        moment=1,
    )
