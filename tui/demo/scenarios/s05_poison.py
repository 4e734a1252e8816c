"""Scenario 5: Poison event with a healthy one."""

from __future__ import annotations

from .stage import START, Action, Scenario, Stage, Step, plural


def build() -> Scenario:
    async def arrive(s: Stage) -> str:
        s.at(START)
        await s.inbox.ingest(
            "email", "mail-poison", {"subject": "Invoice", "attachment": "scan.pdf (412 MB)"}
        )
        await s.inbox.ingest("email", "mail-healthy", {"subject": "Lunch on Friday?"})
        return (
            "Two e-mails arrive: one has an attachment that crashes the agent every time "
            "(poison), the other is ordinary."
        )

    def crash_run(worker: str, index: int) -> Action:
        async def act(s: Stage) -> str:
            lease = await s.inbox.lease_info()
            s.at(lease.until + 1 if lease else START + 5)
            gen = await s.inbox.acquire(worker)
            claimed = await s.inbox.claim_batch(worker, gen) if gen else []
            s.results[f"{worker}_claimed"] = [e.source_id for e in claimed]
            names = ", ".join(f"{e.source_id} (attempt {e.attempts})" for e in claimed)
            if index == 0:
                why = (
                    "it claims both and crashes on the attachment before finishing. Attempts "
                    "are counted at claim time, so a crash still uses one up."
                )
            else:
                why = (
                    "an event that already failed runs alone, so the poison cannot take the "
                    "healthy e-mail down with it. It crashes again."
                )
            took = "takes the lease" if index == 0 else "takes over"
            return f"{worker} {took} (generation {gen}) and claims {names or 'nothing'}: {why}"

        return act

    async def w3(s: Stage) -> str:
        lease = await s.inbox.lease_info()
        s.at((lease.until if lease else s.now) + 1)
        gen = await s.inbox.acquire("W3")
        claimed = await s.inbox.claim_batch("W3", gen) if gen else []
        s.results["W3_claimed"] = [e.source_id for e in claimed]
        s.results["W3_gen"] = gen
        dead = await s.inbox.events("dead")
        poison = dead[0] if dead else None
        if poison is None:
            verdict = "Nothing is dead"
        else:
            verdict = (
                f"The poison e-mail is dead after {poison.attempts} attempts "
                f"('{(poison.error or '').split(';')[0]}'), kept for a human"
            )
        return (
            f"W3 takes over (generation {gen}). {verdict}; W3 claims "
            f"{', '.join(e.source_id for e in claimed) or 'nothing'} alone."
        )

    async def w3_finishes(s: Stage) -> str:
        s.later(5)
        healthy = await s.inbox.events("running")
        ok = await s.inbox.finish(
            "W3", s.results["W3_gen"], [e.id for e in healthy], ["Friday works, see you at noon."]
        )
        done = await s.inbox.events("done")
        attempts = done[0].attempts if done else 0
        return (
            f"W3 finishes it (finish returned {ok}): the healthy e-mail is done on attempt "
            f"{attempts}. It waited for two crashes, but it was never lost or dragged "
            f"to dead."
        )

    async def w4(s: Stage) -> str:
        lease = await s.inbox.lease_info()
        s.at((lease.until if lease else s.now) + 1)
        gen = await s.inbox.acquire("W4")
        claimed = await s.inbox.claim_batch("W4", gen) if gen else []
        s.results["W4_claimed"] = [e.source_id for e in claimed]
        counts = await s.inbox.counts()
        return (
            f"W4 takes over (generation {gen}) and claims {plural(len(claimed), 'event')}. "
            f"{counts.get('dead', 0)} dead for a human to look at, {counts.get('done', 0)} "
            f"done: the crash loop is over."
        )

    return Scenario(
        5,
        "poison",
        "Poison event with a healthy one",
        "One event crashes every worker that runs it; a healthy one waits behind it.",
        (
            Step("Two e-mails arrive", arrive, "pending"),
            Step("W0 claims both, crashes", crash_run("W0", 0), "running"),
            Step("W1 retries the poison alone, crashes", crash_run("W1", 1), "running"),
            Step("W2 retries the poison alone, crashes", crash_run("W2", 2), "running"),
            Step("The poison is dead; W3 claims the healthy one", w3, "dead"),
            Step("W3 finishes the healthy one", w3_finishes, "dead"),
            Step("W4 finds nothing to do", w4, "dead"),
        ),
        watch="Watch the tries column, then the Dead & interrupted pane.",
        focus="dead",
        moment=4,
    )
