"""The scheduler pass: due timers become inbox events (it never starts a run itself: an
occurrence goes through the inbox, deduplicated), approvals expire at their deadline."""

from __future__ import annotations

import json
import time
from typing import Any

from ..records import Timer
from .approvals import expire_waiting
from .decoding import checked_timer, not_fired
from .journal import set_aside
from .switches import load_settings
from .timing import firing, plain_occurrence, plain_recurring
from .tx import NewEvent, TimerAdvance, Tx

# Due timers read and fired together (one statement each way). A transaction fires
# chunks of them while the next chunk, taking as long as the last one, would end within
# TX_SECONDS of its start, then commits, and the pass pauses PAUSE_SECONDS before the
# next one: a storm of timers due at once (150,000 daily ones at 09:00) is fired in
# transactions of a few tens of milliseconds, each atomic, and an ingest from another
# process, which looks for the lock every millisecond while it waits (core/sqlite/db.py
# `_patiently`), gets in at the next pause instead of waiting behind the whole storm.
# (The pauses are what the pass pays for that: the shorter, the faster the pass, as long
# as a waiting writer's look lands in one.)
CHUNK = 500
TX_SECONDS = 0.035  # the bound, not overshot by a chunk
PAUSE_SECONDS = 0.0015


def nothing_due(
    tx: Tx, now: int | None, look: tuple[int, int, int] | None = None
) -> tuple[int, bool] | None:
    """A scheduler pass's answer without a write transaction when no timer is due (most
    passes of a busy worker): nothing fired, nothing more; None when there is. `look`: a
    claim's look comes next (Tx.timer_due)."""
    return None if tx.timer_due(tx.now(now), look) else (0, False)


def run_scheduler(
    tx: Tx, now: int | None, limit: int = CHUNK, seconds: float | None = TX_SECONDS
) -> tuple[int, bool]:
    """Turn due timers into inbox events and move them on, all in this one transaction (a
    second pass at the same instant finds them not due), in due order: chunks of `limit`
    until none is left or the next one would end more than `seconds` after the transaction
    began, judged by the last one's time (None: one chunk; the first one always fires). Returns
    how many were due and handled, and whether more are due (the caller runs another
    transaction).

    A run of plain timers (one event each, the stored payload spliced in: nearly every timer)
    is fired by the dialect's set statements (Tx.fire_plain_timers). The rest are planned
    here, consecutive plain ones written together with one statement per kind of write
    (events, recurring timers moved on, one-shot timers deleted) however many they are. An
    approval's expiry, a row that fails its checks, and every row of a batch the database
    refuses (a value no valid call could have stored) take the per-row path: each fires in
    its own savepoint, and a row the engine cannot process is set aside with the reason
    while the others fire.
    """
    now = tx.now(now)
    catch_up_limit = load_settings(tx).catch_up_limit
    started = chunk_started = time.monotonic()
    fired = 0
    while True:
        # The leading plain ones in set statements where the dialect can; the rest of the
        # chunk (from the first row that is not plain) planned here.
        plain = tx.fire_plain_timers(now, limit)
        rest = limit - plain
        due = tx.run("timers_due", now=now, limit=rest + 1).fetchall()
        more = len(due) > rest
        due = due[:rest]
        batch = _Batch()
        for row in due:
            if batch.plan(tx, row, now, catch_up_limit):
                continue
            batch.write(tx, now, catch_up_limit)
            _fire_alone(tx, row, now, catch_up_limit)
        batch.write(tx, now, catch_up_limit)
        fired += plain + len(due)
        # Each chunk moved every timer it read past `now` (or set it aside), so the next
        # read finds the next ones.
        if not more or seconds is None:
            return fired, more
        # Another chunk only if it should end within the bound, judged by the one just fired.
        ended = time.monotonic()
        if ended + (ended - chunk_started) - started > seconds:
            return fired, more
        chunk_started = ended


class _Batch:
    """Plain timers planned for one multi-row write, in due order."""

    def __init__(self) -> None:
        self.rows: list[Any] = []
        self.events: list[NewEvent] = []  # in firing order
        self.advanced: list[TimerAdvance] = []
        self.fired_once: list[str] = []

    def plan(self, tx: Tx, row: Any, now: int, catch_up_limit: int) -> bool:
        """Add `row`'s writes; False when it must take the per-row path instead."""
        # A one-shot timer whose stored payload the database proved to be JSON (the
        # statement's last column) fires without decoding and encoding it again.
        plain = plain_occurrence(row, now, row[-1] == 1)
        recurring = None if plain is not None else plain_recurring(row, now, row[-1] == 1)
        if plain is not None:
            self.events.append(plain)
            self.fired_once.append(row[0])
        elif recurring is not None:
            self.events.append(recurring[0])
            self.advanced.append(recurring[1])
        else:
            try:
                timer = checked_timer(row)
                if timer.kind == "approval":
                    return False
                plan = firing(timer, now, catch_up_limit)
            except tx.row_errors:
                return False
            self.events += [(s, key, json.dumps(data), now) for s, key, data in plan.events]
            if plan.due is None:
                self.fired_once.append(timer.id)
            else:
                self.advanced.append((timer.id, plan.due, plan.fired, plan.skipped, plan.overflow))
        self.rows.append(row)
        return True

    def write(self, tx: Tx, now: int, catch_up_limit: int) -> None:
        """Write what was planned (all or nothing); if the database refuses any of it, each
        planned row fires alone instead. Empties the batch."""
        rows, events, advanced, fired_once = self.rows, self.events, self.advanced, self.fired_once
        self.__init__()  # type: ignore[misc]
        if not rows:
            return
        try:
            with tx.savepoint("fire_timers"):
                if events:
                    tx.insert_events(events)
                if advanced:
                    tx.advance_timers(advanced)
                if fired_once:
                    tx.run("timers_delete", ids=fired_once)
        except tx.row_errors:
            for row in rows:
                _fire_alone(tx, row, now, catch_up_limit)


def _fire_alone(tx: Tx, row: Any, now: int, catch_up_limit: int) -> None:
    """Fire one due timer in its own savepoint; set it aside with the reason if the engine
    cannot process it."""
    try:
        with tx.savepoint("fire_timer"):
            _fire(tx, checked_timer(row), now, catch_up_limit)
    except tx.row_errors as exc:
        tx.run("timer_set_aside", id=row[0], why=not_fired(exc))
        set_aside(tx)


def _fire(tx: Tx, timer: Timer, now: int, catch_up_limit: int) -> None:
    """Write what timing.py plans for one due timer; an approval's expiry answers it."""
    if timer.every is None and timer.kind == "approval":
        expire_waiting(tx, timer.payload["request_id"], now, "scheduler")
        tx.run("timers_delete", ids=[timer.id])
        return
    plan = firing(timer, now, catch_up_limit)
    if plan.events:
        tx.insert_events([(s, key, json.dumps(data), now) for s, key, data in plan.events])
    if plan.due is None:
        tx.run("timers_delete", ids=[timer.id])
    else:
        tx.advance_timers([(timer.id, plan.due, plan.fired, plan.skipped, plan.overflow)])
