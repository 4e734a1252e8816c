"""Scenario 10: Restart during a run (policy interrupt)."""

from __future__ import annotations

from .stage import HOUR, MINUTE, START, Scenario, Stage, Step, plural


def build() -> Scenario:
    async def arrive(s: Stage) -> str:
        s.at(START)
        await s.inbox.ingest(
            "stripe", "evt_1PqR", {"type": "refund.requested", "amount": "$40", "order": 1182}
        )
        return (
            "A refund request arrives. This inbox uses lost-claim policy 'interrupt': a "
            "refund must never be paid twice."
        )

    async def run(s: Stage) -> str:
        s.later(5)
        worker = await s.worker_connection("worker-1")
        gen = await worker.acquire("worker-1")
        claimed = await worker.claim_batch("worker-1", gen) if gen else []
        s.results.update(event_id=claimed[0].id if claimed else None, gen=gen)
        return (
            f"worker-1 (generation {gen}) claims the refund and calls the payment API. "
            f"Did the money move? Only the payment provider knows now."
        )

    async def crash(s: Stage) -> str:
        s.later(3)
        await s.stop_worker("worker-1")  # dies before finish: no outcome recorded
        event = await s.event(s.results["event_id"])
        return (
            f"worker-1's process is killed before it records the outcome. The event is "
            f"still '{event.status}' under generation {event.claim_gen}."
        )

    async def restart(s: Stage) -> str:
        lease = await s.inbox.lease_info()
        s.at((lease.until if lease else s.now) + 1)
        worker = await s.worker_connection("worker-2")
        gen = await worker.acquire("worker-2")
        claimed = await worker.claim_batch("worker-2", gen) if gen else []
        event = await s.event(s.results["event_id"])
        s.results.update(gen2=gen, restart_claimed=len(claimed))
        return (
            f"The restarted worker takes over (generation {gen}) and claims "
            f"{plural(len(claimed), 'event')}. The refund is '{event.status}': completion "
            f"is uncertain, so it is not retried — a retry could pay twice."
        )

    async def still(s: Stage) -> str:
        s.later(HOUR)
        worker = await s.worker_connection("worker-2")
        gen = await worker.acquire("worker-2")
        claimed = await worker.claim_batch("worker-2", gen) if gen else []
        event = await s.event(s.results["event_id"])
        s.results["later_claimed"] = len(claimed)
        return (
            f"An hour later the worker claims {plural(len(claimed), 'event')}: the refund "
            f"is still '{event.status}', waiting in the Dead & interrupted pane for a "
            f"human."
        )

    async def resolve(s: Stage) -> str:
        s.later(5 * MINUTE)
        ok = await s.inbox.resolve(
            s.results["event_id"], actor="dana", reason="Stripe dashboard shows the refund was paid"
        )
        event = await s.event(s.results["event_id"])
        await s.close_workers()
        if not ok:
            return (
                f"resolve returned {ok}: the refund is already '{event.status}' (marked "
                f"from the Dead pane first). An action on a row that changed meanwhile "
                f"reports it instead of overwriting."
            )
        return (
            f"Dana checks the Stripe dashboard: the refund was paid. She marks it done "
            f"(resolve returned {ok}): now '{event.status}', attempts {event.attempts}, "
            f"paid once."
        )

    return Scenario(
        10,
        "interrupted",
        "Restart during a run (policy interrupt)",
        "A worker dies in the middle of a refund; nobody knows if it was paid.",
        (
            Step("A refund request arrives", arrive, "pending"),
            Step("worker-1 starts the refund", run, "running"),
            Step("worker-1 is killed", crash, "running"),
            Step("The restarted worker takes over", restart, "dead"),
            Step("It is never retried automatically", still, "dead"),
            Step("The operator resolves it", resolve, "dead"),
        ),
        settings={"on_lost_claim": "interrupt"},
        watch="Watch the Dead & interrupted pane: the refund waits there for a "
        "human (m marks it done).",
        focus="dead",
        moment=4,
    )
