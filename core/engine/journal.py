"""What the engine writes about itself: the audit log (operator actions, refused stale
writes), and rows set aside because the engine cannot process them."""

from __future__ import annotations

from .tx import Tx


def audit(
    tx: Tx,
    now: int,
    actor: str,
    action: str,
    target: str,
    before: str | None,
    after: str | None,
    applied: bool,
    reason: str | None = None,
) -> None:
    tx.run(
        "audit_insert",
        at=now,
        actor=actor,
        action=action,
        target=target,
        before=before,
        after=after,
        applied=applied,
        reason=reason,
    )


def record(
    tx: Tx,
    now: int | None,
    actor: str,
    action: str,
    target: str,
    before: str | None,
    after: str | None,
    applied: bool,
    reason: str | None = None,
) -> None:
    """An audit entry at `now`, or at this transaction's time."""
    audit(tx, tx.now(now), actor, action, target, before, after, applied, reason)


def refuse(tx: Tx, what: str, holder: str, gen: int, now: int, reason: str | None = None) -> None:
    """Record a refused stale write: the only thing a refused write may change."""
    state = tx.state()
    seen = (
        "no lease"
        if state.holder is None
        else f"lease {state.holder} gen {state.gen} until {state.until}"
    )
    audit(
        tx,
        now,
        holder,
        f"refused {what}",
        f"gen {gen}",
        seen,
        None,
        False,
        reason or "caller does not hold this lease generation",
    )
    tx.bump("refused_writes")


def set_aside(tx: Tx) -> None:
    """Count a row set aside (the overview shows how many)."""
    tx.bump("set_aside")
