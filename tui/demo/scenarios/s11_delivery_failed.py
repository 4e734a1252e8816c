"""Scenario 11: Result stored, delivery failed."""

from __future__ import annotations

from .stage import MINUTE, START, Scenario, Stage, Step, plural


def build() -> Scenario:
    async def run(s: Stage) -> str:
        s.at(START)
        await s.inbox.ingest("chat", "msg-41", {"from": "dana", "text": "summarise my inbox"})
        gen = await s.inbox.acquire("worker")
        claimed = await s.inbox.claim_batch("worker", gen) if gen else []
        s.later(40)
        ok = (
            await s.inbox.finish(
                "worker",
                gen,
                [e.id for e in claimed],
                ["You have 3 new mails; none urgent."],
                result={"summary": "3 new mails, none urgent"},
            )
            if gen and claimed
            else False
        )
        s.results["event_id"] = claimed[0].id if claimed else None
        runs = await s.inbox.runs(s.results["event_id"])
        return (
            f"The agent runs (40 s of model time) and finishes (finish returned {ok}): the "
            f"result is stored as run #{runs[0].id if runs else '?'}, its reply held in "
            f"the outbox, apart from delivery."
        )

    async def fail(s: Stage) -> str:
        s.later(2)

        def broken(text: str) -> None:
            s.results["attempts_to_send"] = s.results.get("attempts_to_send", 0) + 1
            raise ConnectionError("chat API answered 503")

        sent = await s.inbox.dispatch(broken)
        held = await s.held()
        delivery = (await s.inbox.deliveries(limit=1))[0]
        return (
            f"dispatch: the chat API answers 503, {sent} sent. Delivery is "
            f"'{delivery.status}' ({delivery.last_error}); the reply is still held "
            f"({plural(held, 'message')}) and the agent is not run again."
        )

    async def retry(s: Stage) -> str:
        s.later(5 * MINUTE)
        sent = await s.inbox.dispatch(s.channel)
        runs = await s.inbox.runs(s.results["event_id"])
        delivery = (await s.inbox.deliveries(limit=1))[0]
        s.results["runs"] = len(runs)
        return (
            f"Five minutes later the next dispatch delivers it ({sent} sent, delivery "
            f"'{delivery.status}', key {delivery.key}). The agent ran "
            f"{plural(len(runs), 'time')}: a delivery retry never re-runs the model."
        )

    return Scenario(
        11,
        "delivery-failed",
        "Result stored, delivery failed",
        "The run succeeds, then the chat channel is down when the reply goes out.",
        (
            Step("The run finishes", run, "outbox"),
            Step("The send fails", fail, "outbox"),
            Step("The next dispatch delivers it", retry, "outbox"),
        ),
        watch="Watch the Outbox pane: the reply stays held while the channel is down.",
        focus="outbox",
        moment=1,
    )
