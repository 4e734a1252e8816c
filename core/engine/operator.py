"""Operator actions on one event: each moves it from the state the operator saw, or reports
(and changes nothing) when the worker changed it meanwhile; audited either way."""

from __future__ import annotations

from typing import Sequence

from .journal import audit
from .plans import buried_by, change_refused
from .tx import Tx


def change_event(
    tx: Tx,
    event_id: int,
    action: str,
    allowed: Sequence[str],
    expect: str | None,
    after: str,
    now: int | None,
    actor: str,
    reason: str | None,
) -> bool:
    """Move one event from the state the operator saw to `after`; True when applied. Back to
    pending it gets a fresh attempt budget (never with a pruned payload: nothing to run on);
    to dead it keeps who sent it there and why."""
    now = tx.now(now)
    row = tx.run("event_status", id=event_id).fetchone()
    before = None if row is None else row[0]
    seen = expect if expect is not None else before
    applied = before is not None and before == seen and before in allowed
    pruned = applied and after == "pending" and bool(row[1])
    applied = applied and not pruned
    if applied:
        error = buried_by(actor, reason) if after == "dead" else None
        moved = tx.run("event_move", id=event_id, seen=seen, after=after, error=error, now=now)
        applied = moved.rowcount == 1
    why = reason if applied else change_refused(before, expect, bool(pruned), action, allowed)
    after_shown = after if applied else before
    audit(tx, now, actor, action, f"event {event_id}", before, after_shown, applied, why)
    return applied
