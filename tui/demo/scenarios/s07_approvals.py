"""Scenario 7: Approvals."""

from __future__ import annotations

from onwatch.core import Event

from .stage import HOUR, START, Scenario, Stage, Step, plural

FOUR_HOURS = 4 * HOUR


def build() -> Scenario:
    async def ask(request_id: str, action: str, s: Stage) -> None:
        await s.inbox.request_approval(request_id, FOUR_HOURS, action)
        s.results[f"{request_id}_at"] = s.now

    async def request_1(s: Stage) -> str:
        s.at(START)
        await ask("refund-1", "Refund $40 to order 1182", s)
        return (
            "The agent asks: 'Refund $40 to order 1182?' (4-hour window) and its run ends "
            "there. The answer or the expiry will come back as an inbox event."
        )

    async def expire_1(s: Stage) -> str:
        s.at(s.results["refund-1_at"] + 5 * HOUR)
        due = await s.inbox.run_scheduler()
        approval = await s.approval("refund-1")
        if approval.answered_by != "scheduler":  # the viewer answered it from the pane
            return (
                f"At T+5h the scheduler runs ({due} due): refund-1 already has its answer "
                f"'{approval.answer}' (from {approval.answered_by}), so its expiry has "
                f"nothing to do."
            )
        return (
            f"Nobody answered. At T+5h the scheduler runs ({due} due): refund-1's expiry "
            f"timer stores '{approval.answer}', so the agent still wakes up, with a refusal."
        )

    async def late_yes_1(s: Stage) -> str:
        s.at(s.results["refund-1_at"] + 6 * HOUR)
        standing = await s.inbox.answer_approval("refund-1", "yes", actor="dana")
        s.results["refund-1_late_yes"] = standing
        return (
            f"Dana taps 'yes' at T+6h: the call returns '{standing}'. The answer that "
            f"stands is the one she is told — no refund the agent was told not to make."
        )

    async def request_2(s: Stage) -> str:
        await ask("refund-2", "Refund $15 to order 1190", s)
        return (
            "A second request, refund-2, with its own 4-hour window. This time the "
            "scheduler will not run before the answer comes."
        )

    async def late_yes_2(s: Stage) -> str:
        s.at(s.results["refund-2_at"] + 5 * HOUR)
        standing = await s.inbox.answer_approval("refund-2", "yes", actor="dana")
        s.results["refund-2_late_yes"] = standing
        if standing != "expired":
            return (
                f"'yes' arrives at T+5h: the call returns '{standing}', the answer given "
                f"in time from the Approvals pane. It stands."
            )
        return (
            f"'yes' arrives at T+5h, the expiry timer not yet fired: '{standing}'. The "
            f"deadline is checked in the answer's own transaction, not left to the "
            f"scheduler having run."
        )

    async def request_3(s: Stage) -> str:
        await ask("refund-3", "Refund $90 to order 1201", s)
        return "A third request, refund-3, 4-hour window."

    async def yes_3(s: Stage) -> str:
        s.at(s.results["refund-3_at"] + HOUR)
        standing = await s.inbox.answer_approval("refund-3", "yes", actor="dana")
        s.results["refund-3_yes"] = standing
        if standing != "yes":
            return (
                f"Dana answers 'yes' at T+1h: the call returns '{standing}', the answer "
                f"already given from the Approvals pane. She is told what stands."
            )
        return f"Dana answers 'yes' at T+1h, in time: '{standing}'. The agent resumes."

    async def no_3(s: Stage) -> str:
        s.at(s.results["refund-3_at"] + 2 * HOUR)
        standing = await s.inbox.answer_approval("refund-3", "no", actor="sam")
        s.results["refund-3_second_tap"] = standing
        return (
            f"Sam taps 'no' at T+2h: the call returns '{standing}'. Exactly one answer is "
            f"ever stored, and Sam is told which one stands."
        )

    async def expiry_3(s: Stage) -> str:
        s.at(s.results["refund-3_at"] + 5 * HOUR)
        due = await s.inbox.run_scheduler()
        approval = await s.approval("refund-3")
        s.results["refund-3_after_expiry"] = approval.answer
        return (
            f"T+5h, past refund-3's deadline, the scheduler runs ({due} due): the stored "
            f"answer is still '{approval.answer}' — an expiry never overwrites an answer."
        )

    async def unknown(s: Stage) -> str:
        s.later(60)
        standing = await s.inbox.answer_approval("refund-404", "yes", actor="dana")
        s.results["unknown"] = standing
        events = await _approval_events(s)
        return (
            f"An answer for refund-404, never requested: '{standing}'. Each request woke "
            f"the agent exactly once: {plural(len(events), 'approval event')}."
        )

    return Scenario(
        7,
        "approval-expiry",
        "Approvals with a 4-hour window",
        "The agent asks a human before refunding; answers come late, twice, or never.",
        (
            Step("refund-1 requested", request_1, "approvals"),
            Step("refund-1 expires", expire_1, "approvals"),
            Step("A late 'yes' for refund-1", late_yes_1, "approvals"),
            Step("refund-2 requested", request_2, "approvals"),
            Step("'yes' past the deadline, scheduler idle", late_yes_2, "approvals"),
            Step("refund-3 requested", request_3, "approvals"),
            Step("'yes' in time", yes_3, "approvals"),
            Step("A second tap: 'no'", no_3, "approvals"),
            Step("refund-3's deadline passes", expiry_3, "approvals"),
            Step("An answer for an unknown request", unknown, "approvals"),
        ),
        watch="Watch the Approvals pane: each request's answer. Press a yourself on a waiting one.",
        focus="approvals",
        moment=2,
    )


async def _approval_events(s: Stage) -> list[Event]:
    found: list[Event] = []
    for status in ("pending", "running", "done"):
        found += [e for e in await s.inbox.events(status) if e.source == "approval"]
    return found
