"""Operator actions: run one core action per target and word the outcome that stands.

Every action is conditional on what the operator saw (`expect=` the status on screen), so a
row the worker changed meanwhile is reported, never overwritten. Each runs through
`Inbox.act`, which returns what happened in the action's own transaction (applied, before →
after, why refused); this module puts that in words a person can act on, without reading
the audit log again (a second operator acting meanwhile would blur that). The words of an
applied action come from the desk's table (tui/actions.py: `done`, `verb`, `already`).

Outcome texts are plain strings that may contain inbox text (ids, action texts, errors):
display them through tui.safe only.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Sequence

from onwatch.core import Approval, Event, Inbox, InboxError, Timer
from onwatch.core.pg import is_url

from .actions import KEYS
from .timefmt import WALL, Times

# What a change of state means, seen from the operator's chair.
_CHANGED = {
    "done": "the worker finished it",
    "running": "the worker claimed it",
    "pending": "it is pending again",
    "dead": "it went to dead",
    "interrupted": "its run was interrupted",
    "cancelled": "it was cancelled",
}


@dataclass(frozen=True, slots=True)
class Outcome:
    """What stands after one action on one target; `text` is for a person."""

    applied: bool
    text: str


def changed_meanwhile(seen: str, now: str | None) -> str:
    """Word a row that moved between the operator's look and the action."""
    if now is None:
        return "changed meanwhile: the event no longer exists"
    return f"changed meanwhile: {_CHANGED.get(now, f'it is {now} now')} (it was {seen})"


async def event_action(inbox: Inbox, action: str, event: Event, *, now: int, actor: str) -> Outcome:
    """Run an event action on one event, expecting the status the operator saw."""
    label = f"#{event.id}"
    try:
        outcome = await inbox.act(action, event.id, expect=event.status, now=now, actor=actor)
    except InboxError as exc:
        return Outcome(False, f"{label}: not done: {exc}")
    if outcome:
        return Outcome(True, KEYS[action].done.format(label=label))
    if outcome.before != event.status:  # the state found by the action itself
        return Outcome(False, f"{label}: {changed_meanwhile(event.status, outcome.before)}")
    if action == "cancel" and outcome.before == "running":
        return Outcome(False, f"{label}: cannot cancel a running event; it must finish or fail")
    why = outcome.reason or f"cannot {action.replace('_', ' ')} a {outcome.before} event"
    return Outcome(False, f"{label}: {why}")


async def timer_action(inbox: Inbox, action: str, timer: Timer, *, now: int, actor: str) -> Outcome:
    """Fire, pause, resume or delete one timer, expecting the state the operator saw."""
    label = timer.id
    try:
        outcome = await inbox.act(action, timer.id, expect=timer.state, now=now, actor=actor)
    except InboxError as exc:
        return Outcome(False, f"{label}: not done: {exc}")
    if outcome:
        return Outcome(True, KEYS[action].done.format(label=label))
    return Outcome(False, f"{label}: {outcome.reason or 'refused'}")


async def approval_action(
    inbox: Inbox, action: str, approval: Approval, *, now: int, actor: str, times: Times = WALL
) -> Outcome:
    """Approve, deny or expire one request; the outcome is the answer that stands (its
    instants worded by `times`)."""
    rid = approval.request_id
    try:
        outcome = await inbox.act(action, rid, now=now, actor=actor)
    except InboxError as exc:
        return Outcome(False, f"{rid}: not done: {exc}")
    # Applied is what the audit entry recorded: a "yes" given meanwhile by someone else
    # stands, but this call stored nothing.
    standing, applied = outcome.result, outcome.applied
    if standing == "unknown":
        return Outcome(False, f"{rid}: no such request")
    if applied:
        return Outcome(True, KEYS[action].done.format(label=rid))
    current = await inbox.get_approval(rid)
    due = current.due if current else approval.due
    if (
        standing == "expired"
        and action != "expire"
        and (current is None or current.answered_at is None or current.answered_at >= due)
    ):
        return Outcome(False, f"{rid}: too late: expired at {times.clock(due)}")
    by = ""
    if current is not None and current.answered_by:
        by = f" (by {current.answered_by} at {times.clock(current.answered_at)})"
    return Outcome(False, f"{rid}: already answered: {standing}{by}")


async def flag_action(inbox: Inbox, action: str, *, now: int, actor: str) -> Outcome:
    """Set one of the inbox's switches: pause/resume execution, hold/release the outbox."""
    try:
        changed = (await inbox.act(action, now=now, actor=actor)).applied
    except InboxError as exc:
        return Outcome(False, f"not done: {exc}")
    if changed:
        return Outcome(True, KEYS[action].done)
    return Outcome(False, f"changed meanwhile: {KEYS[action].already}; nothing changed")


def outbox_log_path(inbox: Inbox) -> str | None:
    """Where `s` writes held messages: a file next to the inbox file, since the desk has no
    channel to anyone; None for an inbox of a database (there is no file to be next to)."""
    if is_url(inbox.path):  # "postgresql://… inbox NAME"
        return None
    return f"{inbox.path}.outbox.log"


async def send_now(inbox: Inbox, *, now: int, actor: str) -> Outcome:
    """Write the held messages to the outbox log file and mark them sent (through
    `flush_outbox`: ignoring the gap and any hold, audited). Nobody receives them."""
    path = outbox_log_path(inbox)
    if path is None:
        return Outcome(False, "not written: a database's inbox has no file to write beside")

    def send(text: str) -> None:
        key = getattr(text, "key", "")
        with open(path, "a", encoding="utf-8", errors="backslashreplace") as log:
            log.write(f"--- {key} at {now}\n{text}\n")
            log.flush()
            os.fsync(log.fileno())

    try:
        sent = await inbox.flush_outbox(send, now=now, actor=actor)
    except InboxError as exc:
        return Outcome(False, f"not sent: {exc}")
    if sent:
        plural = "message" if sent == 1 else "messages"
        return Outcome(
            True,
            f"wrote {sent} held {plural} to {os.path.basename(path)} and marked "
            f"{'it' if sent == 1 else 'them'} sent (nobody received "
            f"{'it' if sent == 1 else 'them'})",
        )
    deliveries = await inbox.deliveries(limit=1)
    if deliveries and deliveries[0].status in ("failed", "dead") and deliveries[0].last_error:
        return Outcome(False, f"writing failed, the messages stay held: {deliveries[0].last_error}")
    return Outcome(False, "nothing was held: nothing written")


def summarize(action: str, outcomes: Sequence[Outcome]) -> Outcome:
    """One line for the outcome of an action over several marked rows."""
    if len(outcomes) == 1:
        return outcomes[0]
    applied = sum(o.applied for o in outcomes)
    desk = KEYS.get(action)
    verb = desk.verb if desk and desk.verb else action
    head = f"{verb} {applied} of {len(outcomes)}"
    refused = [o.text for o in outcomes if not o.applied]
    if not refused:
        return Outcome(True, head)
    tail = "; ".join(refused[:3]) + ("; …" if len(refused) > 3 else "")
    return Outcome(applied == len(outcomes), f"{head}; {tail}")


async def delivery_action(
    inbox: Inbox, action: str, delivery_id: int, *, now: int, actor: str
) -> Outcome:
    """Settle one uncertain delivery (an at-most-once send cut off mid-send): mark it sent,
    or put its messages back for a new send. Applied only while it is still uncertain."""
    label = f"send #{delivery_id}"
    try:
        outcome = await inbox.act(action, delivery_id, expect="uncertain", now=now, actor=actor)
    except InboxError as exc:
        return Outcome(False, f"{label}: not done: {exc}")
    if outcome:
        return Outcome(True, KEYS[action].done.format(label=label))
    return Outcome(False, f"{label}: {outcome.reason or 'it is no longer uncertain'}")
