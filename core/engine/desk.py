"""What the desk's third round asks of the engine: run a backed-off event now, the timer
actions (fire now, pause, resume, delete), dead events grouped by the first line of their
error and requeued a group at a time, the worker processes of an inbox, and an approval's
trail (the run that asked, the event its answer became).

Each operator action here is conditional on the state the operator saw and audited under
its one name (core/actions.py), applied or not, like the event actions of operator.py.
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Sequence

from ..records import ApprovalTrail, AuditEntry, DeadGroup, Timer, Worker
from .decoding import checked_timer, event_ids, is_int, timer_from_row
from .decoding import reason as reason_of
from .journal import audit
from .operator import change_event
from .reads import audit_entries
from .switches import load_settings
from .timing import first_unfired, firing
from .tx import Tx

# --- run now --------------------------------------------------------------------------------


def run_now(
    tx: Tx,
    event_id: int,
    expect: str | None,
    now: int | None,
    actor: str,
    reason: str | None,
) -> bool:
    """Make a pending event waiting out its backoff available now (its attempts are kept:
    this is the same retry, sooner). True when applied; audited either way."""
    now = tx.now(now)
    row = tx.run("event_backoff", id=event_id).fetchone()
    before = None if row is None else row[0]
    applied, why = False, None
    if before is None:
        why = "no such event"
    elif expect is not None and before != expect:
        why = f"changed meanwhile: it is {before} now, not {expect}"
    elif before != "pending":
        why = f"cannot run now a {before} event (only a pending one waiting out its backoff)"
    elif not is_int(row[1], now + 1, 1 << 62):
        why = "not waiting out a backoff: it is available now"
    else:
        applied = tx.run("event_run_now", id=event_id, now=now).rowcount == 1
        if applied:  # a worker asleep until the old backoff wakes now
            tx.run("inbox_notify")
    why = reason if applied else why
    audit(tx, now, actor, "run_now", f"event {event_id}", before, before, applied, why)
    return applied


# --- timers ---------------------------------------------------------------------------------

# The state each timer action leaves (core/actions.py names them; "fired" and "deleted" are
# what the audit log says, the row itself is moved on or gone).
TIMER_AFTER = {
    "fire_timer": "fired",
    "pause_timer": "paused",
    "resume_timer": "scheduled",
    "delete_timer": "deleted",
}


def stored_timer(tx: Tx, timer_id: str) -> Timer | None:
    """A timer with its paused switch, or None."""
    row = tx.run("timer_get", id=timer_id).fetchone()
    return None if row is None else replace(timer_from_row(row[:12]), paused=bool(row[12]))


def timer_action(
    tx: Tx,
    name: str,
    allowed: Sequence[str],
    timer_id: str,
    expect: str | None,
    now: int | None,
    actor: str,
    reason: str | None,
) -> bool:
    """Fire, pause, resume or delete one timer, only from a state the action applies to and
    the operator saw; an approval's expiry is refused (answer or expire the approval). True
    when applied; audited either way."""
    now = tx.now(now)
    timer = stored_timer(tx, timer_id)
    before = None if timer is None else timer.state
    verb = name.removesuffix("_timer")
    why = None
    if timer is None:
        why = "no such timer"
    elif timer.kind == "approval":
        why = "it is an approval's deadline: answer or expire the approval instead"
    elif expect is not None and before != expect:
        why = f"changed meanwhile: it is {before} now, not {expect}"
    elif before not in allowed:
        why = f"cannot {verb} a {before} timer (only {' or '.join(allowed)})"
    elif name == "fire_timer":
        why = _fire_now(tx, timer, now, actor)
    elif name == "delete_timer":
        tx.run("timers_delete", ids=[timer_id])
    else:
        tx.run("timer_pause", id=timer_id, paused=name == "pause_timer")
        if name == "resume_timer":  # a worker asleep past its due wakes to fire it
            tx.run("inbox_notify")
    applied = why is None
    after = TIMER_AFTER[name] if applied else before
    why = reason if applied else why
    audit(tx, now, actor, name, f"timer {timer_id}", before, after, applied, why)
    return applied


def _fire_now(tx: Tx, timer: Timer, now: int, actor: str) -> str | None:
    """Fire the timer's next occurrence now, under that occurrence's own key (the scheduler
    will not fire it again), and move the timer on as the scheduler would; a paused timer
    stays paused. Returns why it cannot be fired, or None."""
    row = tx.run("timer_get", id=timer.id).fetchone()
    try:
        checked = checked_timer(row[:12])  # the stored row, not a decoded copy of it
    except tx.row_errors as exc:
        return f"it cannot be fired: {reason_of(exc)}"
    at = max(now, first_unfired(checked) if checked.every is not None else checked.due)
    plan = firing(checked, at, load_settings(tx).catch_up_limit)
    events = []
    for source, key, data in plan.events:
        # late_by is negative for an occurrence fired before its time; fired_by says who.
        data = {**data, "late_by": now - data["scheduled_for"], "fired_by": actor}
        events.append((source, key, json.dumps(data), now))
    tx.insert_events(events)
    if plan.due is None:
        tx.run("timers_delete", ids=[checked.id])
    else:
        tx.advance_timers([(checked.id, plan.due, plan.fired, plan.skipped, plan.overflow)])
    return None


def timers(tx: Tx, limit: int) -> list[Timer]:
    """Soonest first, each with its paused switch."""
    return [
        replace(timer_from_row(r[:12]), paused=bool(r[12]))
        for r in tx.run("timers_list_paused", limit=limit)
    ]


# --- dead events by error -------------------------------------------------------------------


def first_line(error: str | None) -> str:
    """What groups a dead event: the first line of its error (as the SQL computes it)."""
    return (error or "").split("\n", 1)[0]


def dead_groups(tx: Tx, limit: int) -> list[DeadGroup]:
    """The dead events grouped by the first line of their error, largest group first."""
    return [DeadGroup(str(r[0]), r[1], r[2], r[3]) for r in tx.run("dead_groups", limit=limit)]


def dead_group_ids(tx: Tx, line: str, limit: int) -> list[int]:
    return [r[0] for r in tx.run("dead_group_ids", line=line, limit=limit)]


def requeue_group(
    tx: Tx,
    line: str,
    ids: Sequence[int],
    now: int | None,
    actor: str,
    reason: str | None,
) -> list[AuditEntry]:
    """Requeue the events the operator saw in one group, in one transaction: each only if it
    is still dead with that first line (an event that was requeued and died of something
    else since is not touched). Each is audited under its own target, as a single requeue
    is; returns those audit entries, in the order of `ids`."""
    now = tx.now(now)
    entries = []
    for event_id in ids:
        target = f"event {event_id}"
        row = tx.run("event_error", id=event_id).fetchone()
        if row is not None and row[0] == "dead" and first_line(row[1]) != line:
            why = "no longer in this group: it died of something else since"
            audit(tx, now, actor, "requeue", target, "dead", "dead", False, why)
        else:
            change_event(tx, event_id, "requeue", ("dead",), "dead", "pending", now, actor, reason)
        entries.append(audit_entries(tx, 1, target)[0])
    return entries


# --- workers --------------------------------------------------------------------------------


# Each is one statement that commits by itself (a connection's `write_alone`).


def worker_seen(tx: Tx, holder: str, host: str, pid: int, now: int | None) -> None:
    """A worker's heartbeat: it runs on `host` as `pid` (a new pid restarts its `started`)."""
    tx.run("worker_seen", holder=holder, host=host, pid=pid, now=tx.statement_now(now))


def worker_gone(tx: Tx, holder: str) -> None:
    tx.run("worker_gone", holder=holder)


def workers(tx: Tx, limit: int, now: int | None) -> list[Worker]:
    """The worker processes last seen, the lease holder marked (with its generation and
    since when it holds it), oldest first."""
    now = tx.now(now)
    state = tx.state()
    live = type(state.until) is int and state.until >= now
    since = None
    if state.holder is not None and live:
        taken = tx.run("lease_taken_at", gen=state.gen).fetchone()
        since = None if taken is None else taken[0]
    found = []
    for holder, host, pid, started, seen in tx.run("workers_list", limit=limit):
        holds = live and holder == state.holder
        found.append(
            Worker(
                holder,
                host,
                pid,
                started,
                seen,
                holds,
                state.gen if holds else None,
                since if holds else None,
            )
        )
    return found


# --- an approval's trail --------------------------------------------------------------------


def approval_trail(tx: Tx, request_id: str) -> ApprovalTrail | None:
    """The run that asked for this approval and its events, and the event its answer
    became (None while it waits); None for a request never made."""
    row = tx.run("approval_run", id=request_id).fetchone()
    if row is None:
        return None
    run_id = row[0]
    asked_by: tuple[int, ...] = ()
    if run_id is not None:
        runs = tx.run("runs_by_ids", ids=[run_id]).fetchall()
        if runs:
            asked_by = event_ids(runs[0][3])
    answer = tx.run("event_by_key", source="approval", source_id=request_id).fetchone()
    return ApprovalTrail(request_id, run_id, asked_by, None if answer is None else answer[0])


def approvals_asked_by(tx: Tx, event_id: int) -> list[str]:
    """The approval requests the runs of this event asked for, oldest first."""
    runs = [r[0] for r in tx.run("runs_of_event", id=event_id)]
    if not runs:
        return []
    return [r[0] for r in tx.run("approvals_of_runs", ids=runs)]
