"""Approvals: a run asks a human; the answer (or its expiry) comes back as an inbox event
under the key ('approval', request id). Exactly one answer is ever stored per request."""

from __future__ import annotations

import json
from typing import Callable

from ..records import Approval
from .journal import audit
from .plans import UNANSWERED, Answering, answering, expiring, resumption
from .timers import add_timer
from .timing import approval_timer
from .tx import Tx


def request_approval(
    tx: Tx,
    request_id: str,
    expires_in: int,
    action: str,
    now: int | None,
    run_id: int | None = None,
) -> Approval:
    """Record a request and the timer that expires it; asking again never moves its
    deadline."""
    now = tx.now(now)
    inserted = tx.run(
        "approval_insert", id=request_id, action=action, now=now, due=now + expires_in, run=run_id
    ).rowcount
    if inserted == 1:
        add_timer(
            tx,
            approval_timer(request_id),
            now + expires_in,
            json.dumps({"request_id": request_id}),
            None,
            ("approval", request_id),
            "coalesce",
            "approval",
        )
    approval = get_approval(tx, request_id)
    assert approval is not None  # inserted above, or asked for before
    return approval


def get_approval(tx: Tx, request_id: str) -> Approval | None:
    row = tx.run("approval_get", id=request_id).fetchone()
    return None if row is None else Approval(*row)


def answer_approval(
    tx: Tx, request_id: str, answer: str, now: int | None, actor: str, reason: str | None
) -> str:
    """Store the first answer unless the deadline has passed (checked here, in the same
    transaction, not left to the scheduler having run); return the answer that stands."""
    now = tx.now(now)
    action = "approve" if answer == "yes" else "deny"  # the action's one name
    return _decide(tx, request_id, action, lambda a: answering(a, answer, now), now, actor, reason)


def expire_approval(
    tx: Tx, request_id: str, now: int | None, actor: str, reason: str | None
) -> str:
    now = tx.now(now)
    return _decide(tx, request_id, "expire", expiring, now, actor, reason)


def _decide(
    tx: Tx,
    request_id: str,
    action: str,
    decide: Callable[[Approval | None], Answering],
    now: int,
    actor: str,
    reason: str | None,
) -> str:
    """Apply an answer's verdict (plans.py decides it) and audit it; return the answer
    that stands."""
    approval = get_approval(tx, request_id)
    verdict = decide(approval)
    if approval is not None and verdict.write is not None:
        # The agent hears why: the operator's reason, or why a late answer expired it.
        why = reason if verdict.refused is None else verdict.refused
        _store_answer(tx, approval, verdict.write, now, actor, why)
    audit(
        tx,
        now,
        actor,
        action,
        f"approval {request_id}",
        verdict.before,
        verdict.after,
        verdict.refused is None,
        verdict.reason(reason),
    )
    return verdict.stands


def expire_waiting(tx: Tx, request_id: str, now: int, actor: str) -> None:
    """The scheduler's expiry of a request still waiting at its deadline (not audited: it is
    the rule, not an action)."""
    approval = get_approval(tx, request_id)
    if approval is not None and approval.answer is None:
        _store_answer(tx, approval, "expired", now, actor, UNANSWERED)


def _store_answer(
    tx: Tx, approval: Approval, answer: str, now: int, actor: str, reason: str | None
) -> None:
    """Write-once: the answer and its resuming event share one key, ('approval', id)."""
    tx.run("approval_answer", id=approval.request_id, answer=answer, now=now, actor=actor)
    payload = json.dumps(resumption(approval, answer, actor, reason))
    tx.insert_events([("approval", approval.request_id, payload, now)])
    tx.run("timers_delete", ids=[approval_timer(approval.request_id)])
