"""Scenario 3: Three quick chat messages."""

from __future__ import annotations

from .stage import START, Scenario, Stage, Step, plural


def build() -> Scenario:
    texts = ("hi", "are you there?", "can you check order 1182?")

    async def arrive(s: Stage) -> str:
        s.at(START)
        for number, text in enumerate(texts, 1):
            await s.inbox.ingest("chat", f"msg-{number}", {"from": "dana", "text": text})
            s.later(1)
        pending = (await s.inbox.counts()).get("pending", 0)
        return f"Dana types three messages in three seconds: {plural(pending, 'event')} pending."

    async def claim(s: Stage) -> str:
        s.later(2)
        gen = await s.inbox.acquire("worker")
        claimed = await s.inbox.claim_batch("worker", gen) if gen else []
        s.results["claimed"] = [e.id for e in claimed]
        s.results["gen"] = gen
        return (
            f"The worker claims: one run takes {plural(len(claimed), 'event')} "
            f"({', '.join(e.source_id for e in claimed)}). One agent run reads the whole "
            f"conversation instead of three runs answering fragments."
        )

    async def finish(s: Stage) -> str:
        s.later(8)
        ok = await s.inbox.finish(
            "worker",
            s.results["gen"],
            s.results["claimed"],
            ["Hi Dana! Order 1182 shipped this morning."],
        )
        done = (await s.inbox.counts()).get("done", 0)
        return (
            f"The run finishes (finish returned {ok}): {plural(done, 'event')} done, "
            f"{plural(await s.held(), 'reply', 'replies')} in the outbox."
        )

    return Scenario(
        3,
        "chat-batch",
        "Three quick chat messages",
        "A person sends three short messages back to back.",
        (
            Step("Three messages arrive", arrive, "pending"),
            Step("One run claims all three", claim, "running"),
            Step("One reply", finish, "outbox"),
        ),
        watch="Watch the Running pane: three rows, one run number.",
        focus="running",
        moment=1,
    )
