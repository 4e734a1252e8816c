"""Reads: what the desk, the command line and the worker look at (each a read snapshot)."""

from __future__ import annotations

import string
from typing import Iterable

from ..records import (
    Approval,
    AuditEntry,
    Event,
    Lease,
    LeaseChange,
    Message,
    Overview,
    Run,
    Timer,
)
from . import plans, spend
from .decoding import (
    audit_entry_from_row,
    event_from_row,
    message_from_row,
    run_from_row,
    timer_from_row,
)
from .outbox import next_send_at
from .plans import DAY, earliest, when_runs_allow
from .runs import runs_since
from .switches import load_settings
from .timers import next_timer_due
from .tx import Tx


def change_token(tx: Tx) -> tuple[int, int]:
    """A value that moves whenever anything of this inbox committed (see Tx.change_token)."""
    return tx.change_token()


def settled_change_token(tx: Tx) -> tuple[int, int] | None:
    """change_token once no other connection is half-way through a commit, else None."""
    return tx.settled_change_token()


def get_event(tx: Tx, event_id: int) -> Event | None:
    row = tx.run("event_get", id=event_id).fetchone()
    return None if row is None else event_from_row(row)


def events(
    tx: Tx,
    status: str,
    limit: int,
    after: int | None,
    before: int | None,
    search: str | None,
    payload: bool = True,
) -> list[Event]:
    """A keyset page by id: ascending after `after`, or descending before `before`; without
    payloads (None) when `payload` is false, so a list never reads or decodes documents.
    `search` finds events whose source, source id or error contains it, the case of the
    letters A to Z ignored and every other character as it is (see `folded`)."""
    descending = before is not None and after is None
    rows = tx.run(
        "events_page_down" if descending else "events_page_up",
        status=status,
        after=after,
        before=before,
        search=folded(search) if search else None,
        payload=payload,
        limit=limit,
    )
    return [event_from_row(r) for r in rows]


_ASCII_LOWER = str.maketrans(string.ascii_uppercase, string.ascii_lowercase)


def folded(text: str) -> str:
    """`text` as a search compares it: A to Z lower-cased, every other character (É, ß,
    the Kelvin sign, a combining accent) as it is, in the form it is stored (no Unicode
    normalisation). Exactly what SQLite's lower() does and what PostgreSQL's statement does
    with translate(), whatever its locale: the two backends find the same events for every
    search, and an id is always found by itself (docs/rules.md#intake-and-deduplication)."""
    return text.translate(_ASCII_LOWER)


def counts(tx: Tx) -> dict[str, int]:
    return {status: n for status, n in tx.run("event_counts")}


def lease_info(tx: Tx) -> Lease | None:
    state = tx.state()
    return None if state.holder is None else Lease(state.holder, state.gen, state.until)


def lease_history(tx: Tx, limit: int) -> list[LeaseChange]:
    return [LeaseChange(*r) for r in tx.run("lease_history", limit=limit)]


def timers(tx: Tx, limit: int) -> list[Timer]:
    return [timer_from_row(r) for r in tx.run("timers_list", limit=limit)]


def approvals(tx: Tx, limit: int) -> list[Approval]:
    """Waiting ones first (soonest deadline first), then the latest answered."""
    waiting = tx.run("approvals_waiting", limit=limit).fetchall()
    answered = tx.run("approvals_answered", limit=max(limit - len(waiting), 0)).fetchall()
    return [Approval(*r) for r in waiting + answered]


def held_messages(tx: Tx, limit: int) -> list[Message]:
    return [message_from_row(r) for r in tx.run("outbox_held_list", limit=limit)]


def audit_entries(tx: Tx, limit: int, target: str | None) -> list[AuditEntry]:
    if target is None:
        rows = tx.run("audit_newest", limit=limit)
    else:
        rows = tx.run("audit_of_target", target=target, limit=limit)
    return [audit_entry_from_row(r) for r in rows]


def run_records(tx: Tx, ids: Iterable[int]) -> list[Run]:
    return [run_from_row(r) for r in tx.run("runs_by_ids", ids=list(ids))]


def runs_for_event(tx: Tx, event_id: int) -> list[Run]:
    """Every run that claimed this event (history for the detail view)."""
    return [run_from_row(r) for r in tx.run("runs_of_event", id=event_id)]


def run_activity(tx: Tx, since: int) -> tuple[tuple[int, int, int], ...]:
    """The runs claimed after `since`, per minute: (minute, runs, failed or lost runs)."""
    return tuple(
        (int(m), int(n), int(bad or 0)) for m, n, bad in tx.run("runs_per_minute", since=since)
    )


def held_back(tx: Tx) -> str | None:
    return tx.held_back()


def overview(tx: Tx, now: int | None) -> Overview:
    now = tx.now(now)
    settings = load_settings(tx)
    held, waiting, uncertain, timer_count = tx.one("overview_counts", now=now)
    runs_day = runs_since(tx, now - DAY)
    by_status = counts(tx)
    state = tx.state()
    released = state.holder is not None and tx.meta("released_gen") == state.gen
    return Overview(
        now=now,
        counts=by_status,
        lease=lease_info(tx),
        takeovers=tx.meta("takeovers") or 0,
        refused_writes=tx.meta("refused_writes") or 0,
        paused=bool(state.paused),
        outbox_held=bool(tx.meta("outbox_held")),
        held_messages=held,
        next_send_at=next_send_at(tx) if held else None,
        next_timer_due=next_timer_due(tx),
        waiting_approvals=waiting,
        runs_last_day=runs_day,
        budgets={
            **plans.budgets(settings, runs_day, by_status.get("pending", 0)),
            "max_spend_per_day": spend.budget_entry(tx, settings, now),
        },
        timers=timer_count,
        uncertain_deliveries=uncertain,
        set_aside=tx.meta("set_aside") or 0,
        lease_released=released,
    )


def next_wake(tx: Tx, now: int | None, sends: bool = True) -> int | None:
    """The earliest of: next timer, next backed-off pending event, next allowed send —
    counting only what can happen then. While the outbox is held no send is due; while
    paused no event is; while the runs-per-day budget is used up, events wait for the
    instant the window frees a slot; with sends=False (a worker with no channel to send
    through), no send at all. (A past instant nothing acts on would make a worker wait for
    its next renewal instead, and a timer due meanwhile would fire late.)"""
    now = tx.now(now)
    settings = load_settings(tx)
    candidates = [next_timer_due(tx)]
    if not tx.state().paused:
        pending = tx.one("pending_next_available")[0]
        limit = settings.max_runs_per_day
        if pending is not None and limit is not None:
            oldest = tx.run("runs_counted_oldest", since=now - DAY, offset=limit - 1).fetchone()
            pending = when_runs_allow(pending, oldest and oldest[0])
        if pending is not None and settings.max_spend_per_day:
            # Over a spend budget, events wait for the window to let go of enough spend.
            frees = spend.frees_at(tx, settings, now)
            if frees is not None:
                pending = max(pending, frees)
        candidates.append(pending)
    if sends and not tx.meta("outbox_held"):
        # A send that a crashed dispatcher left half-done may be retried from then on.
        candidates += [next_send_at(tx), tx.one("delivery_next_retry")[0]]
    return earliest(candidates)


def died_since(tx: Tx, since: int, limit: int) -> list[Event]:
    """Events that became dead at or after `since` (by when they last changed), oldest first,
    without payloads: what `onwatch notify` says once each."""
    return [event_from_row(r) for r in tx.run("events_died_since", since=since, limit=limit)]


def work_since(tx: Tx, now: int | None) -> int | None:
    """Since when this inbox has had work for a worker: its oldest pending event's arrival,
    or a timer's due instant once it is due (None: nothing to do)."""
    now = tx.now(now)
    oldest = tx.run("pending_oldest").fetchone()
    candidates = [None if oldest is None else oldest[0]]
    due = next_timer_due(tx)
    if type(due) is int and due <= now:
        candidates.append(due)
    return earliest(candidates)
