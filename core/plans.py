"""What a store decides, the same on every backend: the answer an approval request gets,
what a send's outcome does to its delivery, the idempotency keys, the words of a refusal.

Plain Python over rows a store has already read; each store (core/store.py for a file,
core/pg/store.py for PostgreSQL) reads, asks here, and writes the decision in its own SQL,
and keeps its audit() calls (their action names) itself. Nothing here imports a driver.
Timers have their own module, core/timing.py.
"""

from __future__ import annotations

from dataclasses import dataclass

from .clock import MAX_DURATION, MAX_TIME
from .decoding import is_int
from .records import Approval

# --- approvals ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Answering:
    """What answering (or expiring) one approval request does, and how it is audited."""

    stands: str  # the answer that stands after: returned to the caller ('unknown': no request)
    write: str | None  # the answer to store now (write-once); None: nothing is stored
    before: str | None  # audited before → after
    after: str | None
    refused: str | None  # why nothing was applied; None when it was

    def reason(self, given: str | None) -> str | None:
        """The audited reason: the operator's own, or else why it was refused."""
        return given if self.refused is None else given or self.refused


def _unanswerable(approval: Approval | None) -> Answering:
    """No such request, or one already answered: nothing changes, the answer stands."""
    if approval is None:
        return Answering("unknown", None, None, None, "no such request")
    answer = approval.answer
    assert answer is not None  # (called only for an answered one)
    return Answering(answer, None, answer, answer, "already answered")


def answering(approval: Approval | None, answer: str, now: int) -> Answering:
    """The first answer stands; one given at or after the deadline expires the request
    instead (a deadline that is not a time, written by hand, counts as passed)."""
    if approval is None or approval.answer is not None:
        return _unanswerable(approval)
    if not is_int(approval.due, 0, MAX_TIME + MAX_DURATION) or now >= approval.due:
        return Answering(
            "expired", "expired", "waiting", "expired", f"too late: deadline was {approval.due}"
        )
    return Answering(answer, answer, "waiting", answer, None)


def expiring(approval: Approval | None) -> Answering:
    """An operator expires a request still waiting."""
    if approval is None or approval.answer is not None:
        return _unanswerable(approval)
    return Answering("expired", "expired", "waiting", "expired", None)


def resumption(approval: Approval, answer: str) -> dict[str, str]:
    """The payload of the event that resumes the agent with an answer; its key is
    ('approval', request id), shared with the answer (write-once, deduped)."""
    return {"request_id": approval.request_id, "answer": answer, "action": approval.action}
