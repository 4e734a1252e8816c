"""Scenario 2: Two workers, one instant."""

from __future__ import annotations

from .stage import START, Scenario, Stage, Step, since_start


def build() -> Scenario:
    async def both_ask(s: Stage) -> str:
        s.at(START)
        a = await s.inbox.acquire("worker-A")
        b = await s.inbox.acquire("worker-B")
        s.results.update(a=a, b=b)
        return (
            f"A and B start at the same instant t. A's acquire returned generation {a}, "
            f"B's returned {b}: one worker per inbox, so two never run the agent at once."
        )

    async def b_again(s: Stage) -> str:
        s.later(60)
        b = await s.inbox.acquire("worker-B")
        s.results["b_later"] = b
        return (
            f"B tries again at {since_start(s.now)}: {b}. A's lease runs until "
            f"{await s.lease_until()}; B must wait for it to expire or be released."
        )

    async def a_renews(s: Stage) -> str:
        s.later(40)
        a = await s.inbox.acquire("worker-A")
        s.results["a_renewed"] = a
        return (
            f"A renews before expiry: still generation {a}, now until "
            f"{await s.lease_until()}. Renewing never changes the generation; only a "
            f"takeover does."
        )

    return Scenario(
        2,
        "lease-race",
        "Two workers ask for the lease at once",
        "Two worker processes start together on the same inbox file.",
        (
            Step("A and B ask at the same instant", both_ask, "running"),
            Step("B asks again", b_again, "running"),
            Step("A renews its lease", a_renews, "running"),
        ),
        watch="Watch the lease line at the top: holder, generation, time left.",
        focus="running",
        moment=0,
    )
