"""What a store decides, the same on every backend: the answer an approval request gets,
what a send's outcome does to its delivery, the idempotency keys, the words of a refusal.

Plain Python over rows a transaction script has already read: the script reads, asks here,
and writes the decision. Nothing here imports a driver. Timers have their own module,
timing.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Sequence

from ..clock import MAX_COUNT, MAX_DURATION, MAX_TIME
from .decoding import is_int
from ..errors import BadInput
from ..records import Approval
from ..settings import Settings

DAY = 86_400  # the window of the runs-per-day budget
# The states a delivery is shown in, and what an operator may settle an uncertain one as.
DELIVERY_STATES = ("sending", "failed", "sent", "dead", "uncertain")
SETTLE_OUTCOMES = ("sent", "send again")

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


# Why a request expired by itself, in the answer event the agent receives.
UNANSWERED = "no answer before the deadline"


def resumption(
    approval: Approval, answer: str, answered_by: str, reason: str | None
) -> dict[str, str | None]:
    """The payload of the event that resumes the agent with an answer: the request, the
    answer, who gave it and why (the operator's reason, or why it expired). Its key is
    ('approval', request id), shared with the answer (write-once, deduped)."""
    return {
        "request_id": approval.request_id,
        "answer": answer,
        "action": approval.action,
        "answered_by": answered_by,
        "reason": reason,
    }


# --- deliveries -----------------------------------------------------------------------------


class Unsendable(Exception):
    """A delivery no valid call could have made (its attempts, its messages): the store
    rolls back what it began and sets the delivery aside with `why`."""

    def __init__(self, delivery_id: int, why: str) -> None:
        super().__init__(why)
        self.delivery_id, self.why = delivery_id, why


def salted(number: int, salt: object) -> str:
    """A row's id in a key, with the random salt stored in the row: ids are given again
    after a restore from a backup, and a copy of an inbox (a template) shares its uid, so
    uid and id alone could name a different effect or delivery than the one a channel or a
    payment API remembers under that key. A row stored before salts (None: schema 7 or
    older, or written by such a release) keeps the key it always had."""
    if type(salt) is not int:
        return str(number)
    return f"{number}.{salt & 0xFFFF_FFFF_FFFF_FFFF:016x}"


def delivery_key(uid: object, delivery_id: int, salt: object = None) -> str:
    """The idempotency key a send carries: this inbox's uid, the delivery's id and salt.
    Every attempt of one delivery carries it; no other delivery ever does."""
    return f"onwatch-{uid}-{salted(delivery_id, salt)}"


def paced_now(flush: bool, last_paced: int | None, gap: int, now: int) -> bool:
    """Whether a send now may carry the ordinary (not urgent) messages too: a flush, the
    first paced send, or `gap` seconds after the last one."""
    return flush or last_paced is None or now >= last_paced + gap


def next_paced_send(last_paced: int | None, gap: int) -> int:
    """When the next paced send is allowed (0: at once, nothing was sent paced yet)."""
    return 0 if last_paced is None else last_paced + gap


def not_a_count(attempts: object) -> str:
    """Why a delivery whose attempts column holds no count is set aside, not sent."""
    return f"set aside, not sent: attempts is {str(attempts)[:40]!r}, not a count"


def unsendable_attempt(attempt: object) -> str | None:
    """Why the attempt a retry has just counted cannot be sent (None when it can)."""
    return None if is_int(attempt, 1, MAX_COUNT) else not_a_count(attempt)


def unsendable_messages(bodies: Sequence[object]) -> str | None:
    """Why a delivery cannot be sent with these message bodies (None when it can)."""
    if bodies and all(isinstance(body, str) for body in bodies):
        return None
    return "set aside, not sent: its messages are missing or not text"


def send_outcome(
    row: Sequence[Any] | None, attempt: int, error: str | None, max_attempts: int
) -> str:
    """What a send's outcome does to its delivery, read as (status, attempts, at_most_once):
    'late' when it is not this attempt's to record (another dispatcher re-sent meanwhile, or
    an operator settled it), else 'sent'; a failure 'dead' (at most once, or out of
    attempts) or 'failed' (held for the next dispatch)."""
    if row is None or row[0] != "sending" or row[1] != attempt:
        return "late"
    if error is None:
        return "sent"
    if row[2] or row[1] >= max_attempts:
        return "dead"
    return "failed"


def late_outcome(row: Sequence[Any] | None, attempt: int) -> tuple[str, str]:
    """A late outcome's audit: the delivery as seen now, and why the outcome is refused."""
    seen = "no such delivery" if row is None else f"{row[0]}, attempt {row[1]}"
    return seen, f"late outcome of attempt {attempt}: the delivery is {seen} now"


def settling(before: str | None, expect: str, outcome: str) -> tuple[bool, str | None, str | None]:
    """An operator settles a delivery it saw `expect`: (applied, state after, why refused).
    Only an uncertain one, still as seen; 'sent' marks it sent, 'send again' puts its
    messages back for a new delivery under a new key."""
    if before == "uncertain" and before == expect:
        return True, ("sent" if outcome == "sent" else "sent again"), None
    why = (
        "no such delivery"
        if before is None
        else f"changed meanwhile: it is {before} now, not {expect}"
        if before != expect
        else f"only an uncertain delivery can be settled (this one is {before})"
    )
    return False, before, why


# --- effects --------------------------------------------------------------------------------


def effect_event(
    run_id: int, events: Sequence[int], event: int | None, key: str | None, name: str
) -> int | None:
    """The event of run `run_id` (its events `events`) an effect is for: the one given, or
    the run's only one; None only with a key of the caller's own. Raises BadInput for an
    event not in the run, or none named in a run of many without a key (the default key
    must not depend on how the events were batched)."""
    if event is None and len(events) == 1:
        return events[0]
    if event is None and key is None:
        raise BadInput(
            f"run {run_id} has {len(events)} events; say which one effect {name!r} "
            f"is for (event=), so that its key does not depend on the batch"
        )
    if event is not None and event not in events:
        raise BadInput(f"event {event} is not in run {run_id}")
    return event


def effect_key(uid: object, event: int, name: str, intended: int, salt: object = None) -> str:
    """An effect's default idempotency key, derived from what the effect is for (this inbox,
    the event with its salt, the effect's name, and how many times this run `intended` it
    for that event before), never from the run or how it was batched: a retry of the
    event, alone or in another batch, gets the same keys, so a tool that dedupes on them
    acts once; another event never does, even one given the same id after a restore."""
    return f"onwatch-{uid}-ev{salted(event, salt)}-{name}-{intended + 1}"


# --- operator actions -----------------------------------------------------------------------


def change_refused(
    before: str | None, expect: str | None, pruned: bool, action: str, allowed: Sequence[str]
) -> str:
    """Why an operator's change of an event was not applied (audited as the reason)."""
    if before is None:
        return "no such event"
    if expect is not None and before != expect:
        return f"changed meanwhile: it is {before} now, not {expect}"
    if pruned:
        return "its payload was pruned; an agent cannot run on nothing"
    return f"cannot {action} a {before} event (only {' or '.join(allowed)})"


def buried_by(actor: str, reason: str | None) -> str:
    """The error an event an operator sent to dead keeps: the Dead pane and `onwatch show`
    read it to say who buried it, and why."""
    return f"sent to dead by {actor}" + (f": {reason}" if reason else "")


# --- overview and wake-ups ------------------------------------------------------------------


def budgets(settings: Settings, runs_last_day: int, pending: int) -> dict[str, dict[str, Any]]:
    """The overview's budgets: each limit, what is used of it, and what happens to excess."""
    return {
        "max_runs_per_day": {
            "limit": settings.max_runs_per_day,
            "used": runs_last_day,
            "excess": "delayed",
        },
        "max_pending": {"limit": settings.max_pending, "used": pending, "excess": "refused"},
        "max_followups_per_run": {"limit": settings.max_followups_per_run, "excess": "refused"},
        "max_run_seconds": {"limit": settings.max_run_seconds, "excess": "lost claim"},
    }


def when_runs_allow(pending: Any, oldest_counted: Any) -> Any:
    """When the earliest pending event (available at `pending`) can run under the
    runs-per-day budget: once the oldest run still counted (claimed at `oldest_counted`,
    None when a slot is free) leaves the day's window."""
    if isinstance(oldest_counted, int):
        return max(pending, oldest_counted + DAY)
    return pending


def earliest(candidates: Iterable[Any]) -> int | None:
    """The earliest instant among `candidates`; a value that is not an instant (nothing
    pending, or a row edited by hand) is never a wake-up."""
    known = [c for c in candidates if type(c) is int]
    return min(known) if known else None
