"""Scenario 4: A stalls, B takes over, A wakes up."""

from __future__ import annotations

from .stage import START, Scenario, Stage, Step, plural, since_start


def build() -> Scenario:
    async def arrive(s: Stage) -> str:
        s.at(START)
        await s.inbox.ingest("chat", "msg-3", {"from": "dana", "text": "move my 3pm to 4pm"})
        return "Chat message msg-3 arrives: 'move my 3pm to 4pm'."

    async def a_claims(s: Stage) -> str:
        s.at(START + 10)
        gen = await s.inbox.acquire("worker-A")
        claimed = await s.inbox.claim_batch("worker-A", gen) if gen else []
        s.results.update(a_gen=gen, event_id=claimed[0].id if claimed else None)
        attempt = claimed[0].attempts if claimed else 0
        return (
            f"Worker A takes the lease (generation {gen}, until {await s.lease_until()}) "
            f"and claims msg-3 (attempt {attempt}). Then A stalls: its laptop lid closes "
            f"mid-run. It stops renewing."
        )

    async def b_refused(s: Stage) -> str:
        s.at(START + 60)
        gen = await s.inbox.acquire("worker-B")
        s.results["b_early"] = gen
        return (
            f"Standby worker B asks for the lease at {since_start(s.now)}: {gen}. A's lease "
            f"is valid until {await s.lease_until()}, and a stalled worker looks exactly "
            f"like a slow one."
        )

    async def b_takes_over(s: Stage) -> str:
        s.at(START + 10 + 121)
        gen = await s.inbox.acquire("worker-B")
        claimed = await s.inbox.claim_batch("worker-B", gen) if gen else []
        s.results.update(b_gen=gen, b_claimed=[e.source_id for e in claimed])
        attempt = claimed[0].attempts if claimed else 0
        return (
            f"A's lease expired. B takes over as generation {gen} and its claim returns "
            f"{', '.join(e.source_id for e in claimed) or 'nothing'} (attempt {attempt}): "
            f"A's lost claim went back to pending instead of being lost."
        )

    async def b_finishes(s: Stage) -> str:
        s.later(9)
        ok = await s.inbox.finish(
            "worker-B",
            s.results["b_gen"],
            [s.results["event_id"]],
            ["Done: your 3pm is now at 4pm."],
        )
        s.results["b_finish"] = ok
        return (
            f"B finishes msg-3: finish returned {ok}. 'done' and the reply are written in "
            f"one transaction: the outbox holds {plural(await s.held(), 'message')}."
        )

    async def a_wakes(s: Stage) -> str:
        lease = await s.inbox.lease_info()
        s.at((lease.until if lease else s.now) + 1)
        gen = await s.inbox.acquire("worker-A")
        s.results["a_new_gen"] = gen
        return (
            f"B goes idle and its lease lapses too. A wakes up, still in its old run, and "
            f"acquires: generation {gen}. By name, A is the lease holder again."
        )

    async def a_late_finish(s: Stage) -> str:
        s.later(1)
        ok = await s.inbox.finish(
            "worker-A",
            s.results["a_gen"],
            [s.results["event_id"]],
            ["Done: your 3pm is now at 5pm."],
        )
        s.results["a_late_finish"] = ok
        event = await s.event(s.results["event_id"])
        return (
            f"A reports its old generation-{s.results['a_gen']} run: finish returned {ok} "
            f"(refused and audited). msg-3 stays {event.status}, attempts "
            f"{event.attempts}, outbox {plural(await s.held(), 'message')}. A name check "
            f"alone would have let it through: only the generation tells A's runs apart."
        )

    return Scenario(
        4,
        "takeover",
        "A stalls, B takes over, A wakes up",
        "Worker A stalls mid-run; B takes over; then A wakes and tries to finish.",
        (
            Step("msg-3 arrives", arrive, "pending"),
            Step("A claims msg-3 and stalls", a_claims, "running"),
            Step("B asks too early", b_refused, "running"),
            Step("B takes over", b_takes_over, "running"),
            Step("B finishes", b_finishes, "outbox"),
            Step("A wakes up", a_wakes, "outbox"),
            Step("A's late finish", a_late_finish, "outbox"),
        ),
        watch="Watch the lease line at the top (holder, generation, takeovers, "
        "refused stale writes), then the Outbox.",
        focus="running",
        moment=6,
    )
