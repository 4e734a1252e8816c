"""Every SQL statement of the inbox: one synchronous function per transaction or read.

Each function takes a `sqlite3.Connection` already inside the right transaction (see
core/db.py) and is named for the rule it enforces. Nothing here awaits, sends, or calls the
agent: a transaction is short by construction. What a function decides from the rows it read
is decided in core/decoding.py, core/timing.py and core/plans.py, shared with the
PostgreSQL store (core/pg/store.py): here are the statements and the glue.
"""

from __future__ import annotations

import json
import sqlite3
from typing import Any, Callable, Iterable, Sequence

from .clock import MAX_COUNT, MAX_DURATION, MAX_TIME
from .decoding import (
    DECODE_ERRORS,
    EVENT_COLUMNS,
    TIMER_COLUMNS,
    audit_entry_from_row,
    checked_timer,
    delivery_from_row,
    effect_from_row,
    event_from_row,
    event_ids,
    is_int as _is_int,
    message_from_row,
    not_fired,
    reason as _reason,
    run_from_row,
    settings_from as _settings_from,
    shown_status,
    timer_from_row,
)
from .errors import BadInput, BudgetExceeded, InboxError
from . import plans
from .plans import (
    Answering,
    DAY,
    DELIVERY_STATES as DELIVERY_STATES,  # the Inbox checks an operator's words against these
    SETTLE_OUTCOMES as SETTLE_OUTCOMES,
    answering,
    buried_by,
    change_refused,
    earliest,
    effect_event,
    expiring,
    late_outcome,
    next_paced_send,
    paced_now,
    resumption,
    send_outcome,
    settling,
    Unsendable,
    unsendable_attempt,
    unsendable_messages,
    when_runs_allow,
)
from .records import (
    Approval,
    AuditEntry,
    Delivery,
    Effect,
    Event,
    FollowUp,
    Lease,
    LeaseChange,
    Message,
    Overview,
    Reply,
    Run,
    Timer,
    ApprovalRequest,
)
from .settings import Settings
from .timing import approval_timer, EventRow, firing, plain_occurrence

# Row errors that mean "this stored row is not something the engine can process" (a row
# written by hand or by another version): the row is set aside with the reason, the pass
# goes on. Anything else (disk, locks) still stops the transaction.
ROW_ERRORS = DECODE_ERRORS + (sqlite3.IntegrityError,)
_JSON_STRING = json.encoder.encode_basestring_ascii  # what json.dumps does with a str
_JSON_DECODE = json.JSONDecoder().decode  # json.loads of a str, without its type checks


def _set_aside_counted(db: sqlite3.Connection) -> None:
    db.execute(
        "INSERT INTO meta(key, value) VALUES ('set_aside', 1) "
        "ON CONFLICT(key) DO UPDATE SET value = coalesce(value, 0) + 1"
    )


def _placeholders(values: Sequence[Any]) -> str:
    return ",".join("?" * len(values))


# --- settings and flags ---------------------------------------------------------------------


def load_settings(db: sqlite3.Connection) -> Settings:
    row = db.execute("SELECT json FROM settings WHERE id = 1").fetchone()
    if row is None:
        return Settings()
    return _settings_from(row[0])


def store_settings(db: sqlite3.Connection, settings: Settings) -> None:
    db.execute(
        "INSERT INTO settings(id, json) VALUES (1, ?) "
        "ON CONFLICT(id) DO UPDATE SET json = excluded.json",
        (settings.to_json(),),
    )


def get_meta(db: sqlite3.Connection, key: str) -> Any:
    row = db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
    return None if row is None else row[0]


def set_meta(db: sqlite3.Connection, key: str, value: Any) -> None:
    db.execute(
        "INSERT INTO meta(key, value) VALUES (?, ?) "
        "ON CONFLICT(key) DO UPDATE SET value = excluded.value",
        (key, value),
    )


def _bump(db: sqlite3.Connection, key: str) -> None:
    db.execute("UPDATE meta SET value = value + 1 WHERE key = ?", (key,))


def audit(
    db: sqlite3.Connection,
    now: int,
    actor: str,
    action: str,
    target: str,
    before: str | None,
    after: str | None,
    applied: bool,
    reason: str | None = None,
) -> None:
    db.execute(
        "INSERT INTO audit(at, actor, action, target, before, after, applied, reason) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
        (now, actor, action, target, before, after, int(applied), reason),
    )


# --- intake ---------------------------------------------------------------------------------


def ingest_many(
    db: sqlite3.Connection, items: Sequence[tuple[str, str, str, int]]
) -> list[bool | Exception]:
    """Dedupe on (source, source_id): store each new event, report duplicates as False.

    Items that arrived together share this one transaction (group commit); a refused item
    (budget, or a value the database refuses) gets its own exception and does not fail its
    neighbours: if the group fails as a whole, each item is retried alone.
    """
    return ingest_group(db, items, _ingest_items, sqlite3.OperationalError)


def ingest_group(
    db: Any,
    items: Sequence[tuple[str, str, str, int]],
    ingest_items: Callable[[Any, Sequence[tuple[str, str, str, int]]], list[bool | Exception]],
    operational: type[Exception],
) -> list[bool | Exception]:
    """The group commit's savepoints, the same on every backend: the whole group in one
    savepoint; if that fails, each item in its own, so a refused item fails alone (its
    driver's `operational` errors as InboxError, anything else as BadInput)."""
    if len(items) == 1:
        return ingest_items(db, items)
    db.execute("SAVEPOINT intake_group")
    try:
        results = ingest_items(db, items)
        db.execute("RELEASE intake_group")
        return results
    except Exception:  # noqa: BLE001 - retried item by item just below
        db.execute("ROLLBACK TO intake_group")
        db.execute("RELEASE intake_group")
    results = []
    for item in items:
        db.execute("SAVEPOINT intake_item")
        try:
            [result] = ingest_items(db, [item])
            db.execute("RELEASE intake_item")
        except Exception as exc:  # noqa: BLE001 - this item's own error, given to its caller
            db.execute("ROLLBACK TO intake_item")
            db.execute("RELEASE intake_item")
            result = (
                exc
                if isinstance(exc, InboxError)
                else InboxError(f"event not stored: {_reason(exc)}")
                if isinstance(exc, operational)
                else BadInput(f"event not stored: {_reason(exc)}")
            )
        results.append(result)
    return results


def ingest_alone(
    db: sqlite3.Connection,
    items: Sequence[tuple[str, str, str, int]],
    seen: dict[str, str | None],
) -> list[bool | Exception] | None:
    """One new event in one autocommit statement (no BEGIN, no COMMIT statement of its own),
    or None when that statement cannot decide: the caller then runs ingest_many in a write
    transaction. Called outside any transaction; `seen` is the caller's memory of the
    settings text (one per Inbox).

    The statement stores the event only if the stored settings are still the ones in `seen`
    and those allow it (no max_pending budget to count, the payload within
    max_payload_bytes): the same rule as ingest_many, checked at the statement's own instant
    (an autocommit INSERT takes the write lock, with the busy timeout, before it reads). A
    duplicate or settings changed elsewhere store nothing: `seen` is forgotten (read again
    next time) and the full rule answers.
    """
    if len(items) != 1:
        return None
    if "settings" not in seen:
        row = db.execute("SELECT json FROM settings WHERE id = 1").fetchone()
        seen["settings"] = None if row is None else row[0]
    text = seen["settings"]
    settings = Settings() if text is None else _settings_from(text)
    [(source, source_id, payload, now)] = items
    if settings.max_pending is not None or len(payload) > settings.max_payload_bytes:
        return None
    cursor = db.execute(
        "INSERT INTO events(source, source_id, payload, available_at, created, updated) "
        "SELECT ?, ?, ?, ?, ?, ? WHERE (SELECT json FROM settings WHERE id = 1) IS ? "
        "ON CONFLICT(source, source_id) DO NOTHING",
        (source, source_id, payload, now, now, now, text),
    )
    if cursor.rowcount == 1:
        return [True]
    seen.clear()
    return None


def _ingest_items(
    db: sqlite3.Connection, items: Sequence[tuple[str, str, str, int]]
) -> list[bool | Exception]:
    settings = load_settings(db)
    if settings.max_pending is None and len(items) > 1:
        return _ingest_group(db, items, settings)
    results: list[bool | Exception] = []
    for source, source_id, payload, now in items:
        if len(payload) > settings.max_payload_bytes:  # the limit may have changed elsewhere
            results.append(
                BadInput(f"payload is over {settings.max_payload_bytes} bytes (max_payload_bytes)")
            )
            continue
        if settings.max_pending is not None and _refuse_over_pending(
            db, settings, source, source_id
        ):
            results.append(
                BudgetExceeded(
                    f"inbox is full: {settings.max_pending} events pending (budget max_pending)"
                )
            )
            continue
        cursor = db.execute(
            "INSERT INTO events(source, source_id, payload, available_at, created, updated) "
            "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT(source, source_id) DO NOTHING",
            (source, source_id, payload, now, now, now),
        )
        results.append(cursor.rowcount == 1)
    return results


_GROUP_ROWS = 150  # keys per statement: well inside SQLite's limit on bound parameters


def _ingest_group(
    db: sqlite3.Connection, items: Sequence[tuple[str, str, str, int]], settings: Settings
) -> list[bool | Exception]:
    """The same rule as the per-item path, for a group: one multi-row insert stores the new
    keys and names them (RETURNING); a key already stored conflicts and is skipped, and so is
    a repeat within the group (the VALUES rows go in order: its first copy is stored)."""
    results: list[bool | Exception] = [False] * len(items)
    wanted = []
    for index, (source, source_id, payload, now) in enumerate(items):
        if len(payload) > settings.max_payload_bytes:
            results[index] = BadInput(
                f"payload is over {settings.max_payload_bytes} bytes (max_payload_bytes)"
            )
        else:
            wanted.append((index, source, source_id, payload, now))
    for start in range(0, len(wanted), _GROUP_ROWS):
        chunk = wanted[start : start + _GROUP_ROWS]
        rows: list[str | int] = []
        for _, source, source_id, payload, now in chunk:
            rows += (source, source_id, payload, now, now, now)
        stored = set(
            db.execute(
                "INSERT INTO events(source, source_id, payload, available_at, created, "
                "updated) VALUES "
                + ",".join(["(?, ?, ?, ?, ?, ?)"] * len(chunk))
                + " ON CONFLICT(source, source_id) DO NOTHING RETURNING source, source_id",
                rows,
            )
        )
        for index, source, source_id, _, _ in chunk:
            if (source, source_id) in stored:
                stored.discard((source, source_id))  # a later copy is a duplicate of this one
                results[index] = True
    return results


def _refuse_over_pending(
    db: sqlite3.Connection, settings: Settings, source: str, source_id: str
) -> bool:
    pending = db.execute("SELECT n FROM event_counts WHERE status = 'pending'").fetchone()[0]
    if pending < settings.max_pending:
        return False
    duplicate = db.execute(
        "SELECT 1 FROM events WHERE source = ? AND source_id = ?", (source, source_id)
    ).fetchone()
    return duplicate is None  # a duplicate is still a harmless no-op, never a refusal


def _insert_event(
    db: sqlite3.Connection, source: str, source_id: str, payload: Any, now: int
) -> bool:
    cursor = db.execute(
        "INSERT INTO events(source, source_id, payload, available_at, created, updated) "
        "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT(source, source_id) DO NOTHING",
        (source, source_id, json.dumps(payload), now, now, now),
    )
    return cursor.rowcount == 1


def prune_payloads(db: sqlite3.Connection, older_than: int, now: int) -> int:
    """Drop the bodies of finished events; their (source, source_id) keys keep deduping."""
    cursor = db.execute(
        "UPDATE events SET payload = NULL, updated = ? WHERE status IN ('done', 'cancelled') "
        "AND updated < ? AND payload IS NOT NULL",
        (now, older_than),
    )
    return cursor.rowcount


# --- lease and fencing ----------------------------------------------------------------------


def acquire(db: sqlite3.Connection, holder: str, now: int, fresh: bool = False) -> int | None:
    """Renew an unexpired lease (same generation) or take over an expired one (next one).
    `fresh` (a starting worker): never continue a live lease, not even one under this
    holder's name; only a free or expired lease is taken, as a new generation."""
    ttl = load_settings(db).lease_ttl
    row = db.execute("SELECT holder, gen, until FROM lease WHERE id = 1").fetchone()
    if row is None:
        db.execute(
            "INSERT INTO lease(id, holder, gen, until) VALUES (1, ?, 1, ?)", (holder, now + ttl)
        )
        db.execute(
            "INSERT INTO lease_history(gen, holder, previous_holder, at, how) "
            "VALUES (1, ?, NULL, ?, 'first')",
            (holder, now),
        )
        return 1
    gen: int  # once checked below: a lease row edited by hand may hold anything
    current, gen, until = row
    if not _is_int(gen, 1, 1 << 62):  # a lease row edited by hand: continue its history
        gen = db.execute("SELECT coalesce(max(gen), 0) FROM lease_history").fetchone()[0]
        until = now - 1
    elif not _is_int(until, -1, MAX_TIME + MAX_DURATION):
        until = now - 1  # an expiry that is not a time has expired: a takeover follows
    if until >= now:
        if current != holder or fresh:
            return None
        if until != now + ttl:  # renewing to the same expiry writes nothing (no fsync)
            db.execute("UPDATE lease SET until = ? WHERE id = 1", (now + ttl,))
        return gen
    # A lease its holder handed back (a clean restart) is a succession, not a takeover: only
    # a lease left to expire means a worker died or stalled.
    released = get_meta(db, "released_gen") == gen
    gen += 1
    db.execute(
        "UPDATE lease SET holder = ?, gen = ?, until = ? WHERE id = 1", (holder, gen, now + ttl)
    )
    db.execute(
        "INSERT INTO lease_history(gen, holder, previous_holder, at, how) VALUES (?, ?, ?, ?, ?)",
        (gen, holder, current, now, "released" if released else "takeover"),
    )
    if not released:
        _bump(db, "takeovers")
    return gen


def renewed_without_write(db: sqlite3.Connection, holder: str, now: int) -> int | None:
    """The generation `acquire(holder, now)` would return if it would change nothing (the
    holder renewing to the expiry it already has); None when a write transaction must
    decide. One statement, so one read snapshot."""
    row = db.execute(
        "SELECT holder, gen, until, (SELECT json FROM settings WHERE id = 1) "
        "FROM lease WHERE id = 1"
    ).fetchone()
    if row is None or row[0] != holder or not _is_int(row[1], 1, 1 << 62):
        return None
    ttl = Settings().lease_ttl if row[3] is None else _settings_from(row[3]).lease_ttl
    return row[1] if type(row[2]) is int and row[2] == now + ttl else None


def holds(db: sqlite3.Connection, holder: str, gen: int, now: int) -> bool:
    row = db.execute("SELECT holder, gen, until FROM lease WHERE id = 1").fetchone()
    return _holding(row, holder, gen, now)


def _holding(row: Sequence[Any] | None, holder: str, gen: int, now: int) -> bool:
    """The fencing rule on a lease row read as (holder, gen, until, …): exactly this holder
    and generation, and not expired (an expiry edited by hand into a non-integer is)."""
    return (
        row is not None
        and row[0] == holder
        and row[1] == gen
        and type(row[2]) is int
        and row[2] >= now
    )


def refuse(
    db: sqlite3.Connection, what: str, holder: str, gen: int, now: int, reason: str | None = None
) -> None:
    """Record a refused stale write: the only thing a refused write may change."""
    row = db.execute("SELECT holder, gen, until FROM lease WHERE id = 1").fetchone()
    seen = "no lease" if row is None else f"lease {row[0]} gen {row[1]} until {row[2]}"
    audit(
        db,
        now,
        holder,
        f"refused {what}",
        f"gen {gen}",
        seen,
        None,
        False,
        reason or "caller does not hold this lease generation",
    )
    _bump(db, "refused_writes")


def renew(db: sqlite3.Connection, holder: str, gen: int, now: int) -> bool:
    """Extend the lease only for the exact unexpired generation (a fenced renewal)."""
    if not holds(db, holder, gen, now):
        refuse(db, "renew", holder, gen, now)
        return False
    db.execute(
        "UPDATE lease SET until = ? WHERE id = 1 AND until IS NOT ?",
        (now + load_settings(db).lease_ttl,) * 2,
    )  # the same expiry writes nothing
    return True


def release(db: sqlite3.Connection, holder: str, gen: int, now: int) -> bool:
    """Hand the lease back so a successor need not wait for the TTL."""
    if not holds(db, holder, gen, now):
        return False
    db.execute("UPDATE lease SET until = ? WHERE id = 1", (now - 1,))
    set_meta(db, "released_gen", gen)
    db.execute(
        "INSERT INTO audit(at, actor, action, target, before, after, applied) "
        "VALUES (?, ?, 'release lease', ?, 'held', 'released', 1)",
        (now, holder, f"gen {gen}"),
    )
    return True


# --- claiming -------------------------------------------------------------------------------


# What a claim must know before it picks anything, in one statement (one read): the lease,
# the settings, the pause flag, and whether any lost claim or attempted pending row exists
# (two indexed existence checks: when neither does, recovery and burial have nothing to do
# and are skipped).
_CLAIM_STATE = (
    "SELECT holder, gen, until, (SELECT json FROM settings WHERE id = 1), "
    "(SELECT value FROM meta WHERE key = 'paused'), "
    "EXISTS (SELECT 1 FROM events INDEXED BY events_by_status "
    "WHERE status = 'running' AND claim_gen < ?), "
    "EXISTS (SELECT 1 FROM events INDEXED BY events_retried "
    "WHERE status = 'pending' AND attempts > 0) "
    "FROM lease WHERE id = 1"
)


def claim_batch(db: sqlite3.Connection, holder: str, gen: int, now: int) -> list[Event]:
    """Claim the next run's events for the holder of exactly this generation."""
    state = db.execute(_CLAIM_STATE, (gen,)).fetchone()
    if not _holding(state, holder, gen, now):
        refuse(db, "claim", holder, gen, now)
        return []
    settings = Settings() if state[3] is None else _settings_from(state[3])
    lost, attempted = state[5], state[6]
    if lost or settings.max_run_seconds is not None:
        lost = recover_lost_claims(db, gen, now, settings)
    attempted = attempted or lost  # a recovered claim is pending again with its attempts
    if attempted:
        bury_exhausted(db, now, settings)
    if state[4]:  # paused: recovery above still ran, nothing is claimed
        return []
    if (
        settings.max_runs_per_day is not None
        and runs_since(db, now - DAY) >= settings.max_runs_per_day
    ):
        return []  # budget: excess runs are delayed until the day's window frees a slot
    for _ in range(100):  # each round sets aside what it cannot run; a pass never stops
        rows = []
        if attempted:
            rows = db.execute(
                f"SELECT {EVENT_COLUMNS} FROM events INDEXED BY events_retried "
                "WHERE status = 'pending' AND attempts > 0 AND available_at <= ? "
                "ORDER BY id LIMIT 1",
                (now,),
            ).fetchall()  # an attempted event runs alone: a poison event harms no other
        if not rows:
            rows = db.execute(
                f"SELECT {EVENT_COLUMNS} FROM events INDEXED BY events_by_status "
                "WHERE status = 'pending' AND available_at <= ? ORDER BY id LIMIT ?",
                (now, settings.max_batch),
            ).fetchall()
        if not rows:
            return []
        runnable = _runnable_rows(db, rows, now)
        if runnable:
            break
    else:
        return []
    ids = [row[0] for row, _ in runnable]
    run_id = db.execute(
        "INSERT INTO runs(holder, gen, event_ids, claimed_at) VALUES (?,?,?,?)",
        (holder, gen, "[" + ", ".join(map(str, ids)) + "]", now),  # json.dumps(ids)
    ).lastrowid
    marks = _placeholders(ids)
    db.execute(
        "INSERT INTO run_events(event_id, run_id) VALUES " + ",".join(["(?, ?)"] * len(ids)),
        [value for event_id in ids for value in (event_id, run_id)],
    )
    # Attempts are counted here, at claim time: a worker that crashes never reports failure.
    db.execute(
        f"UPDATE events SET status = 'running', attempts = attempts + 1, claim_gen = ?, "
        f"claimed_at = ?, run_id = ?, updated = ? WHERE id IN ({marks})",
        (gen, now, run_id, now, *ids),
    )
    return [
        Event(
            row[0],
            row[1],
            row[2],
            payload,
            "running",
            row[5] + 1,
            gen,
            row[7],
            row[8],
            now,
            row[10],
            now,
            run_id,
        )
        for row, payload in runnable
    ]


def _runnable_rows(
    db: sqlite3.Connection, rows: Sequence[Sequence[Any]], now: int
) -> list[tuple[Sequence[Any], Any]]:
    """(row, decoded payload) for the rows an agent can run; the others are set aside (dead,
    with the reason) so that one bad row never stops every claim: a pruned payload (nothing
    to run on), a payload that is not JSON, an attempt count that is not a small integer."""
    runnable = []
    for row in rows:
        if row[3] is None:
            why = "its payload was pruned; there is nothing to run it on"
        elif not _is_int(row[5], 0, MAX_COUNT):
            why = f"attempts is {str(row[5])[:40]!r}, not a count"
        else:
            try:
                runnable.append((row, json.loads(row[3])))
                continue
            except ROW_ERRORS as exc:
                why = f"its payload cannot be read ({_reason(exc)})"
        db.execute(
            "UPDATE events SET status = 'dead', error = ?, updated = ? WHERE id = ?",
            ("set aside, not run: " + why, now, row[0]),
        )
        _set_aside_counted(db)
    return runnable


def recover_lost_claims(db: sqlite3.Connection, gen: int, now: int, settings: Settings) -> int:
    """Rows running under an older generation (or past the run budget) were lost."""
    lost = db.execute(
        "SELECT id, source, claim_gen, run_id FROM events INDEXED BY events_by_status "
        "WHERE status = 'running' AND claim_gen < ?",
        (gen,),
    ).fetchall()
    if settings.max_run_seconds is not None:
        lost += db.execute(
            "SELECT id, source, claim_gen, run_id FROM events INDEXED BY events_by_status "
            "WHERE status = 'running' AND claim_gen = ? AND claimed_at < ?",
            (gen, now - settings.max_run_seconds),
        ).fetchall()
    for event_id, source, claim_gen, run_id in lost:
        why = (
            f"generation {claim_gen} lost its lease"
            if claim_gen < gen
            else f"ran past max_run_seconds ({settings.max_run_seconds} s)"
        )
        # What matters most comes first: lists cut long reasons at their width.
        if settings.lost_claim_policy(source) == "interrupt":
            db.execute(
                "UPDATE events SET status = 'interrupted', error = ?, updated = ? WHERE id = ?",
                ("completion uncertain: run lost, " + why, now, event_id),
            )
        else:
            # Not backed off: the lease expiry already delayed it.
            db.execute(
                "UPDATE events SET status = 'pending', available_at = ?, error = ?, "
                "updated = ? WHERE id = ?",
                (now, "run lost: " + why, now, event_id),
            )
        db.execute(
            "UPDATE runs SET outcome = 'lost', finished_at = ?, error = ? "
            "WHERE id = ? AND outcome IS NULL",
            (now, "run lost: " + why, run_id),
        )
    return len(lost)


def bury_exhausted(db: sqlite3.Connection, now: int, settings: Settings) -> int:
    """Pending rows out of attempts become dead, keeping why."""
    cursor = db.execute(
        "UPDATE events INDEXED BY events_retried "  # only attempted rows: not every pending one
        "SET status = 'dead', updated = ?, error = 'too many attempts (' || "
        "attempts || '/' || ? || ')' || coalesce(': ' || error, '') "
        "WHERE status = 'pending' AND typeof(attempts) = 'integer' AND attempts > 0 "
        "AND attempts >= ?",
        (now, settings.max_attempts, settings.max_attempts),
    )
    return cursor.rowcount


def runs_since(db: sqlite3.Connection, since: int) -> int:
    runs: int = db.execute("SELECT count(*) FROM runs WHERE claimed_at > ?", (since,)).fetchone()[0]
    return runs


# --- finishing ------------------------------------------------------------------------------


def finish(
    db: sqlite3.Connection,
    holder: str,
    gen: int,
    ids: Sequence[int],
    replies: Sequence[Reply],
    error: str | None,
    result: str | None,
    approvals: Sequence[ApprovalRequest],
    followups: Sequence[FollowUp],
    now: int,
    run: int | None = None,
    traceback: str | None = None,
) -> bool:
    """Commit a run's outcome and everything it produced, fenced (by generation, and by run
    when `run` is given), all or nothing."""
    # The lease, the settings and (fenced by run) whether the run is open: one read.
    state = db.execute(
        "SELECT holder, gen, until, (SELECT json FROM settings WHERE id = 1), "
        "(SELECT 1 FROM runs WHERE id = ? AND gen = ? AND outcome IS NULL) "
        "FROM lease WHERE id = 1",
        (run, gen),
    ).fetchone()
    if not _holding(state, holder, gen, now):
        refuse(db, "finish", holder, gen, now)
        return False
    if run is not None and state[4] is None:
        refuse(
            db,
            "finish",
            holder,
            gen,
            now,
            f"run {run} is not an open run of this generation (recovered or finished)",
        )
        return False
    settings = Settings() if state[3] is None else _settings_from(state[3])
    if (
        settings.max_followups_per_run is not None
        and len(followups) > settings.max_followups_per_run
    ):
        raise BadInput(
            f"run asks for {len(followups)} follow-up timers; the budget "
            f"max_followups_per_run allows {settings.max_followups_per_run}"
        )
    marks = _placeholders(ids)
    still_claimed = f"WHERE id IN ({marks}) AND status = 'running' AND claim_gen = ?" + (
        "" if run is None else " AND run_id = ?"
    )
    fence = (*ids, gen) if run is None else (*ids, gen, run)
    if error is None:
        # Marked done and read back in one statement: the rows this run still held.
        rows = db.execute(
            f"UPDATE events SET status = 'done', error = NULL, updated = ? {still_claimed} "
            f"RETURNING id, attempts, run_id",
            (now, *fence),
        ).fetchall()
    else:
        rows = db.execute(
            f"SELECT id, attempts, run_id FROM events {still_claimed}", fence
        ).fetchall()
    if not rows:
        refuse(
            db,
            "finish",
            holder,
            gen,
            now,
            "none of these events is still claimed by this generation",
        )
        return False
    run_ids = sorted({r[2] for r in rows if r[2] is not None})
    if error is None:
        run_id = run_ids[0] if run_ids else None
        for reply in replies:
            db.execute(
                "INSERT INTO outbox(body, urgent, created, run_id) VALUES (?, ?, ?, ?)",
                (reply.body, int(reply.urgent), now, run_id),
            )
        for request in approvals:
            request_approval(
                db, request.request_id, request.expires_in, request.action, now, run_id
            )
        for timer in followups:
            add_timer(
                db,
                timer.timer_id,
                timer.due,
                timer.payload,
                timer.every,
                timer.key,
                timer.catch_up,
                "timer",
                encoded=True,
            )  # checked and encoded by Inbox
        outcome = "done"
    else:
        for event_id, attempts, _ in rows:
            if not _is_int(attempts, 0, MAX_COUNT) or attempts >= settings.max_attempts:
                db.execute(
                    "UPDATE events SET status = 'dead', error = ?, updated = ? WHERE id = ?",
                    (
                        f"too many attempts ({attempts}/{settings.max_attempts}): {error}",
                        now,
                        event_id,
                    ),
                )
            else:
                db.execute(
                    "UPDATE events SET status = 'pending', error = ?, available_at = ?, "
                    "updated = ? WHERE id = ?",
                    (error, now + settings.backoff(attempts), now, event_id),
                )
        outcome = "error"
    for run_id in run_ids:
        # A run closes when its last event is finished (a run may be finished in parts);
        # until then a lost-claim recovery can still close it as lost.
        db.execute(
            "UPDATE runs SET outcome = ?, finished_at = ?, result = ?, error = ?, "
            "traceback = ? WHERE id = ? AND outcome IS NULL AND NOT EXISTS "
            "(SELECT 1 FROM events WHERE run_id = ? AND status = 'running')",
            (outcome, now, result, error, traceback, run_id, run_id),
        )
    return True


# --- timers ---------------------------------------------------------------------------------


def add_timer(
    db: sqlite3.Connection,
    timer_id: str,
    due: int,
    payload: Any,
    every: int | None,
    key: tuple[str, str] | None,
    catch_up: str,
    kind: str,
    *,
    encoded: bool = False,
) -> None:
    """Register or replace a timer's definition (`payload` already JSON text when
    `encoded`); what it last fired is kept, and a definition replaced by a valid one is no
    longer set aside."""
    key_source, key_id = key if key is not None else (None, None)
    if not encoded:
        payload = json.dumps(payload)
    db.execute(
        "INSERT INTO timers(id, kind, due, every, catch_up, payload, key_source, key_id) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT(id) DO UPDATE SET kind = excluded.kind, "
        "due = excluded.due, every = excluded.every, catch_up = excluded.catch_up, "
        "payload = excluded.payload, key_source = excluded.key_source, key_id = excluded.key_id, "
        "broken = NULL",
        (timer_id, kind, due, every, catch_up, payload, key_source, key_id),
    )


def cancel_timer(db: sqlite3.Connection, timer_id: str) -> bool:
    return db.execute("DELETE FROM timers WHERE id = ?", (timer_id,)).rowcount == 1


def run_scheduler(db: sqlite3.Connection, now: int) -> int:
    """Turn every due timer into inbox events and advance it, all in this one transaction."""
    settings = load_settings(db)
    due = db.execute(
        f"SELECT {TIMER_COLUMNS}, json_valid(payload) FROM timers WHERE due <= ? "
        f"AND broken IS NULL ORDER BY due, id",
        (now,),
    ).fetchall()
    for row in _fire_plain_runs(db, due, now):
        # Each timer fires in its own savepoint: a row the engine cannot process is rolled
        # back and set aside with the reason, and the other timers still fire.
        db.execute("SAVEPOINT fire_timer")
        try:
            _fire(db, checked_timer(row), now, settings.catch_up_limit)
            db.execute("RELEASE fire_timer")
        except ROW_ERRORS as exc:
            db.execute("ROLLBACK TO fire_timer")
            db.execute("RELEASE fire_timer")
            db.execute("UPDATE timers SET broken = ? WHERE id = ?", (not_fired(exc), row[0]))
            _set_aside_counted(db)
    return len(due)


_INSERT_EVENTS_VALUES = (
    "INSERT INTO events(source, source_id, payload, available_at, created, updated) VALUES "
)
_ON_KEY_DO_NOTHING = " ON CONFLICT(source, source_id) DO NOTHING"
_INSERT_EVENTS = _INSERT_EVENTS_VALUES + "(?, ?, ?, ?, ?, ?)" + _ON_KEY_DO_NOTHING
# A timers row as read is a tuple[Any, ...]: checked before it is trusted.


def _fire_plain_runs(
    db: sqlite3.Connection, due: list[tuple[Any, ...]], now: int
) -> Iterable[tuple[Any, ...]]:
    """Fire each run of consecutive valid one-shot plain timers (the common case, thousands
    in a pass) with multi-row statements, and yield every other row, in order, to the
    per-row path. Rows are checked here first, the same checks as `checked_timer` (the
    payload proven to be JSON, see `plain_occurrence`); the occurrence's JSON is built
    around the payload's stored text instead of decoding and encoding it again. No
    savepoint around a run (it would double the cost of the inserts): if the events table
    refuses a row (say a key its CHECK forbids), the rows before it stand, the refused one
    goes to the per-row path, which sets it aside with the reason, and the rest of the run
    goes on."""
    batch: list[tuple[Any, ...]] = []
    events: list[EventRow] = []
    for index, row in enumerate(due):
        event = plain_occurrence(row, now, row[12] == 1)  # row[12]: json_valid(payload)
        if event is not None:
            batch.append(row)
            events.append(event)
            if index + 1 < len(due):
                continue
        while batch:
            stored = _insert_until_refused(db, events)
            for start in range(0, stored, _GROUP_ROWS):
                ids = [r[0] for r in batch[start : min(start + _GROUP_ROWS, stored)]]
                db.execute(f"DELETE FROM timers WHERE id IN ({_placeholders(ids)})", ids)
            if stored == len(batch):
                batch, events = [], []
            else:
                yield batch[stored]
                batch, events = batch[stored + 1 :], events[stored + 1 :]
        if event is None:
            yield row


def _insert_until_refused(db: sqlite3.Connection, events: list[EventRow]) -> int:
    """Insert `events` in order; return how many went in before a row the table refused
    (len(events) if none was); that row and the ones after it are not stored.

    _GROUP_ROWS rows per statement: an insert that fires a trigger keeps a statement
    journal, one per statement, so a row per statement costs twice as much. A statement
    that fails is rolled back whole (SQLite's default ABORT) and its rows are inserted again
    one statement each, counted, to find the refused one."""
    done = 0
    for start in range(0, len(events), _GROUP_ROWS):
        chunk = events[start : start + _GROUP_ROWS]
        try:
            db.execute(
                _INSERT_EVENTS_VALUES
                + ",".join(["(?, ?, ?, ?, ?, ?)"] * len(chunk))
                + _ON_KEY_DO_NOTHING,
                [value for event in chunk for value in event],
            )
        except ROW_ERRORS:
            fed = 0

            def feed() -> Iterable[EventRow]:
                nonlocal fed
                for event in chunk:  # executemany binds and steps one row, then the next  # noqa: B023 - called within this iteration
                    fed += 1
                    yield event

            try:
                db.executemany(_INSERT_EVENTS, feed())
            except ROW_ERRORS:
                return done + fed - 1
        done += len(chunk)
    return done


def _fire(db: sqlite3.Connection, timer: Timer, now: int, catch_up_limit: int) -> None:
    """Write what core/timing.py plans for one due timer; an approval's expiry answers it."""
    if timer.every is None and timer.kind == "approval":
        _expire(db, timer.payload["request_id"], now, "scheduler")
        db.execute("DELETE FROM timers WHERE id = ?", (timer.id,))
        return
    plan = firing(timer, now, catch_up_limit)
    for source, source_id, payload in plan.events:
        _insert_event(db, source, source_id, payload, now)
    if plan.due is None:
        db.execute("DELETE FROM timers WHERE id = ?", (timer.id,))
    elif plan.fired is None:
        db.execute("UPDATE timers SET due = ? WHERE id = ?", (plan.due, timer.id))
    else:
        db.execute(
            "UPDATE timers SET due = ?, last_fired = ?, last_skipped = ?, "
            "overflow = overflow + ? WHERE id = ?",
            (plan.due, plan.fired, plan.skipped, plan.overflow, timer.id),
        )


def next_timer_due(db: sqlite3.Connection) -> int | None:
    """The earliest due of the timers the scheduler can fire (set-aside ones never fire)."""
    due: int | None = db.execute(
        "SELECT min(due) FROM timers WHERE broken IS NULL AND typeof(due) = 'integer'"
    ).fetchone()[0]
    return due


# --- approvals ------------------------------------------------------------------------------


def request_approval(
    db: sqlite3.Connection,
    request_id: str,
    expires_in: int,
    action: str,
    now: int,
    run_id: int | None = None,
) -> Approval:
    """Record a request; asking again never moves its deadline."""
    inserted = (
        db.execute(
            "INSERT INTO approvals(request_id, action, requested, due, run_id) VALUES (?,?,?,?,?) "
            "ON CONFLICT(request_id) DO NOTHING",
            (request_id, action, now, now + expires_in, run_id),
        ).rowcount
        == 1
    )
    if inserted:
        add_timer(
            db,
            approval_timer(request_id),
            now + expires_in,
            {"request_id": request_id},
            None,
            ("approval", request_id),
            "coalesce",
            "approval",
        )
    approval = get_approval(db, request_id)
    assert approval is not None  # inserted above, or asked for before
    return approval


def get_approval(db: sqlite3.Connection, request_id: str) -> Approval | None:
    row = db.execute(
        "SELECT request_id, action, due, answer, requested, answered_at, "
        "answered_by FROM approvals WHERE request_id = ?",
        (request_id,),
    ).fetchone()
    return None if row is None else Approval(*row)


def answer_approval(
    db: sqlite3.Connection, request_id: str, answer: str, now: int, actor: str, reason: str | None
) -> str:
    """Store the first answer unless the deadline has passed; return the answer that stands."""
    action = "approve" if answer == "yes" else "deny"  # the action's one name
    return _decide_approval(
        db, request_id, action, lambda a: answering(a, answer, now), now, actor, reason
    )


def expire_approval(
    db: sqlite3.Connection, request_id: str, now: int, actor: str, reason: str | None
) -> str:
    return _decide_approval(db, request_id, "expire", expiring, now, actor, reason)


def _decide_approval(
    db: sqlite3.Connection,
    request_id: str,
    action: str,
    decide: Callable[[Approval | None], Answering],
    now: int,
    actor: str,
    reason: str | None,
) -> str:
    """Apply an answer's verdict (core/plans.py decides it) and audit it; return the
    answer that stands."""
    approval = get_approval(db, request_id)
    verdict = decide(approval)
    if approval is not None and verdict.write is not None:
        _store_answer(db, approval, verdict.write, now, actor)
    audit(
        db,
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


def _expire(db: sqlite3.Connection, request_id: str, now: int, actor: str) -> None:
    approval = get_approval(db, request_id)
    if approval is not None and approval.answer is None:
        _store_answer(db, approval, "expired", now, actor)


def _store_answer(
    db: sqlite3.Connection, approval: Approval, answer: str, now: int, actor: str
) -> None:
    """Write-once: the answer and its resuming event share one key, ('approval', id)."""
    db.execute(
        "UPDATE approvals SET answer = ?, answered_at = ?, answered_by = ? "
        "WHERE request_id = ? AND answer IS NULL",
        (answer, now, actor, approval.request_id),
    )
    _insert_event(
        db,
        "approval",
        approval.request_id,
        resumption(approval, answer),
        now,
    )
    db.execute("DELETE FROM timers WHERE id = ?", (approval_timer(approval.request_id),))


# --- outbox ---------------------------------------------------------------------------------

# An at-most-once delivery still 'sending' after its send_timeout was cut off mid-send: it
# may or may not have gone out. It is never sent again by itself; an operator settles it.
# (The IN term lets SQLite use the partial index of open deliveries, never a scan.)
_UNCERTAIN = (
    "status IN ('sending', 'failed') AND status = 'sending' AND at_most_once = 1 "
    "AND retry_after < ?"
)


def begin_delivery(
    db: sqlite3.Connection, now: int, flush: bool
) -> tuple[int, str, str, int, int] | None:
    """Pick what the next send carries and mark it sending; None when nothing may go now.

    Returns (delivery id, idempotency key, text, message count, attempt). The send itself
    happens after this transaction commits; its outcome is recorded only for this attempt.
    """
    for _ in range(100):  # each round sets aside a delivery it cannot send
        try:
            db.execute("SAVEPOINT begin_delivery")
            picked = _begin_delivery(db, now, flush)
            db.execute("RELEASE begin_delivery")
            return picked
        except Unsendable as exc:
            db.execute("ROLLBACK TO begin_delivery")
            db.execute("RELEASE begin_delivery")
            db.execute(
                "UPDATE deliveries SET status = 'dead', broken = ?, last_error = ? WHERE id = ?",
                (exc.why, exc.why, exc.delivery_id),
            )
            db.execute(
                "UPDATE outbox SET status = 'dead' WHERE delivery_id = ?", (exc.delivery_id,)
            )
            _set_aside_counted(db)
    return None


def _begin_delivery(
    db: sqlite3.Connection, now: int, flush: bool
) -> tuple[int, str, str, int, int] | None:
    settings = load_settings(db)
    held = bool(get_meta(db, "outbox_held"))
    if held and not flush:
        return None
    retry = db.execute(
        "SELECT id FROM deliveries WHERE status IN ('sending', 'failed') AND at_most_once = 0 "
        "AND (status = 'failed' OR retry_after < ?) ORDER BY id LIMIT 1",
        (now,),
    ).fetchone()
    if retry is not None:
        delivery_id = retry[0]
        db.execute(
            "UPDATE deliveries SET status = 'sending', attempts = attempts + 1, "
            "retry_after = ? WHERE id = ?",
            (now + settings.send_timeout, delivery_id),
        )
        attempt = db.execute(
            "SELECT attempts FROM deliveries WHERE id = ?", (delivery_id,)
        ).fetchone()[0]
        unsendable = unsendable_attempt(attempt)
        if unsendable is not None:
            raise Unsendable(delivery_id, unsendable)
    else:
        # A message row no valid call could have written (a body that is not text) is set
        # aside before it joins a delivery: it would fail every send of its neighbours.
        for (bad,) in db.execute(
            "SELECT id FROM outbox WHERE status = 'held' AND delivery_id "
            "IS NULL AND typeof(body) <> 'text'"
        ).fetchall():
            db.execute("UPDATE outbox SET status = 'dead' WHERE id = ?", (bad,))
            _set_aside_counted(db)
        attempt = 1
        last = get_meta(db, "last_paced_send")
        paced = paced_now(flush, last, settings.outbox_gap, now)
        waiting = "status = 'held' AND delivery_id IS NULL" + ("" if paced else " AND urgent = 1")
        if db.execute(f"SELECT 1 FROM outbox WHERE {waiting} LIMIT 1").fetchone() is None:
            return None
        at_most_once = settings.delivery == "at_most_once"
        delivery_id = db.execute(
            "INSERT INTO deliveries(status, attempts, paced, at_most_once, created, retry_after) "
            "VALUES ('sending', 1, ?, ?, ?, ?)",
            (int(paced), int(at_most_once), now, now + settings.send_timeout),
        ).lastrowid
        db.execute(f"UPDATE outbox SET delivery_id = ? WHERE {waiting}", (delivery_id,))
        if paced:
            set_meta(db, "last_paced_send", now)
    bodies = [
        r[0]
        for r in db.execute(
            "SELECT body FROM outbox WHERE delivery_id = ? ORDER BY id", (delivery_id,)
        )
    ]
    unsendable = unsendable_messages(bodies)
    if unsendable is not None:
        raise Unsendable(delivery_id, unsendable)
    return (delivery_id, delivery_key(db, delivery_id), "\n\n".join(bodies), len(bodies), attempt)


def delivery_key(db: sqlite3.Connection, delivery_id: int) -> str:
    return plans.delivery_key(get_meta(db, "uid"), delivery_id)


def end_delivery(
    db: sqlite3.Connection, delivery_id: int, attempt: int, error: str | None, now: int
) -> bool:
    """Record a send's outcome, owned by the attempt that made it: a failed one stays held
    for the next dispatch, or dies. A late outcome (another dispatcher re-sent meanwhile,
    or an operator settled it) is refused and audited like a stale generation."""
    settings = load_settings(db)
    row = db.execute(
        "SELECT status, attempts, at_most_once FROM deliveries WHERE id = ?", (delivery_id,)
    ).fetchone()
    outcome = send_outcome(row, attempt, error, settings.max_delivery_attempts)
    if outcome == "late":
        seen, why = late_outcome(row, attempt)
        audit(
            db,
            now,
            "dispatcher",
            f"refused {'sent' if error is None else 'failed'}",
            f"delivery {delivery_id}",
            seen,
            None,
            False,
            why,
        )
        _bump(db, "refused_writes")
        return False
    if outcome == "sent":
        db.execute(
            "UPDATE deliveries SET status = 'sent', sent_at = ?, last_error = NULL WHERE id = ?",
            (now, delivery_id),
        )
        db.execute("UPDATE outbox SET status = 'sent' WHERE delivery_id = ?", (delivery_id,))
        return True
    if outcome == "dead":
        db.execute(
            "UPDATE deliveries SET status = 'dead', last_error = ? WHERE id = ?",
            (error, delivery_id),
        )
        db.execute("UPDATE outbox SET status = 'dead' WHERE delivery_id = ?", (delivery_id,))
    else:
        db.execute(
            "UPDATE deliveries SET status = 'failed', last_error = ? WHERE id = ?",
            (error, delivery_id),
        )
    return False


def settle_delivery(
    db: sqlite3.Connection,
    delivery_id: int,
    outcome: str,
    expect: str,
    now: int,
    actor: str,
    reason: str | None,
) -> bool:
    """An operator settles an uncertain delivery: 'sent' (it went out) or 'send again' (its
    messages go back to the outbox, for a new delivery under a new key). Applied only if the
    delivery is uncertain and in the state the operator saw; audited either way."""
    before = delivery_state(db, delivery_id, now)
    applied, after, why = settling(before, expect, outcome)
    if applied and outcome == "sent":
        db.execute(
            "UPDATE deliveries SET status = 'sent', sent_at = ?, last_error = ? WHERE id = ?",
            (now, f"uncertain; marked sent by {actor}", delivery_id),
        )
        db.execute("UPDATE outbox SET status = 'sent' WHERE delivery_id = ?", (delivery_id,))
    elif applied:
        db.execute(
            "UPDATE deliveries SET status = 'dead', last_error = ? WHERE id = ?",
            (f"uncertain; its messages sent again by {actor}", delivery_id),
        )
        db.execute(
            "UPDATE outbox SET delivery_id = NULL WHERE delivery_id = ? AND status = 'held'",
            (delivery_id,),
        )
    audit(
        db,
        now,
        actor,
        "mark_sent" if outcome == "sent" else "send_again",  # the action's one name
        f"delivery {delivery_id}",
        before,
        after,
        applied,
        reason if applied else why,
    )
    return applied


def delivery_state(db: sqlite3.Connection, delivery_id: int, now: int) -> str | None:
    row = db.execute(
        "SELECT status, at_most_once, retry_after FROM deliveries WHERE id = ?", (delivery_id,)
    ).fetchone()
    if row is None:
        return None
    return shown_status(row[0], row[1], row[2], now)


def uncertain_deliveries(db: sqlite3.Connection, now: int, limit: int) -> list[Delivery]:
    ids = [
        r[0]
        for r in db.execute(
            f"SELECT id FROM deliveries WHERE {_UNCERTAIN} ORDER BY id LIMIT ?", (now, limit)
        )
    ]
    return [d for d in deliveries(db, MAX_COUNT, now, ids)]


def next_send_at(db: sqlite3.Connection) -> int | None:
    """When the next paced send is allowed (None when nothing is waiting)."""
    waiting = db.execute(
        "SELECT 1 FROM outbox WHERE status = 'held' AND delivery_id IS NULL LIMIT 1"
    ).fetchone()
    if waiting is None:
        return None
    return next_paced_send(get_meta(db, "last_paced_send"), load_settings(db).outbox_gap)


# --- operator actions -----------------------------------------------------------------------


def change_event(
    db: sqlite3.Connection,
    event_id: int,
    action: str,
    allowed: Sequence[str],
    expect: str | None,
    after: str,
    now: int,
    actor: str,
    reason: str | None,
) -> bool:
    """Move one event from the state the operator saw; report (and change nothing) otherwise."""
    row = db.execute("SELECT status FROM events WHERE id = ?", (event_id,)).fetchone()
    before = None if row is None else row[0]
    seen = expect if expect is not None else before
    applied = before is not None and before == seen and before in allowed
    pruned = (
        applied
        and after == "pending"
        and db.execute("SELECT payload IS NULL FROM events WHERE id = ?", (event_id,)).fetchone()[0]
    )
    applied = applied and not pruned
    if applied:
        extra = ", attempts = 0, error = NULL, claim_gen = NULL" if after == "pending" else ""
        args: tuple[str, ...] = ()
        if after == "dead":
            extra, args = ", error = ?", (buried_by(actor, reason),)
        cursor = db.execute(
            f"UPDATE events SET status = ?, available_at = ?, updated = ?{extra} "
            f"WHERE id = ? AND status = ?",
            (after, now, now, *args, event_id, seen),
        )
        applied = cursor.rowcount == 1
    why = reason if applied else change_refused(before, expect, bool(pruned), action, allowed)
    audit(
        db,
        now,
        actor,
        action,
        f"event {event_id}",
        before,
        after if applied else before,
        applied,
        why,
    )
    return applied


def set_flag(
    db: sqlite3.Connection,
    flag: str,
    value: bool,
    action: str,
    now: int,
    actor: str,
    reason: str | None,
) -> bool:
    before = bool(get_meta(db, flag))
    if before != value:
        set_meta(db, flag, int(value))
    audit(
        db,
        now,
        actor,
        action,
        flag,
        str(before).lower(),
        str(value).lower(),
        before != value,
        reason,
    )
    return before != value


# --- effect journal -------------------------------------------------------------------------


def intend_effect(
    db: sqlite3.Connection,
    holder: str,
    gen: int,
    run_id: int,
    name: str,
    detail: str,
    key: str | None,
    now: int,
    event: int | None = None,
) -> str | None:
    """Record an effect before it happens (fenced); return its idempotency key."""
    if not holds(db, holder, gen, now):
        refuse(db, f"effect {name}", holder, gen, now)
        return None
    run = db.execute(
        "SELECT event_ids FROM runs WHERE id = ? AND gen = ? AND outcome IS NULL", (run_id, gen)
    ).fetchone()
    if run is None:
        refuse(
            db,
            f"effect {name}",
            holder,
            gen,
            now,
            f"run {run_id} is not an open run of this generation",
        )
        return None
    event = effect_event(run_id, event_ids(run[0]), event, key, name)
    if key is None:
        assert event is not None  # no event and no key was refused above
        key = _default_effect_key(db, run_id, event, name)
    db.execute(
        "INSERT INTO effects(run_id, name, key, state, detail, intended_at, event_id) "
        "VALUES (?, ?, ?, 'intended', ?, ?, ?) ON CONFLICT(run_id, key) DO NOTHING",
        (run_id, name, key, detail, now, event),
    )
    return key


def _default_effect_key(db: sqlite3.Connection, run_id: int, event: int, name: str) -> str:
    """The key core/plans.py derives from what the effect is for (`effect_key`)."""
    intended = db.execute(
        "SELECT count(*) FROM effects WHERE run_id = ? AND name = ? AND event_id = ?",
        (run_id, name, event),
    ).fetchone()[0]
    return plans.effect_key(get_meta(db, "uid"), event, name, intended)


def settle_effect(db: sqlite3.Connection, key: str, state: str, now: int) -> bool:
    """Record that an intended effect happened (or failed); facts are recorded unfenced."""
    # The newest intent under this key is the one being settled (older ones belong to
    # earlier, lost runs of the same events and stay as they were left).
    return (
        db.execute(
            "UPDATE effects SET state = ?, settled_at = ? WHERE id = (SELECT max(id) "
            "FROM effects WHERE key = ?) AND state = 'intended'",
            (state, now, key),
        ).rowcount
        == 1
    )


# --- reads ----------------------------------------------------------------------------------


def get_event(db: sqlite3.Connection, event_id: int) -> Event | None:
    row = db.execute(f"SELECT {EVENT_COLUMNS} FROM events WHERE id = ?", (event_id,)).fetchone()
    return None if row is None else event_from_row(row)


def events(
    db: sqlite3.Connection,
    status: str,
    limit: int,
    after: int | None,
    before: int | None,
    search: str | None,
    payload: bool = True,
) -> list[Event]:
    """A keyset page by id: ascending after `after`, or descending before `before`; without
    payloads (None) when `payload` is false, so a list never reads or decodes documents."""
    clauses = ["status = ?"]
    params: list[str | int] = [status]
    if after is not None:
        clauses.append("id > ?")
        params.append(after)
    if before is not None:
        clauses.append("id < ?")
        params.append(before)
    if search:
        clauses.append(
            "(instr(lower(source), ?) > 0 OR instr(lower(source_id), ?) > 0 "
            "OR instr(lower(coalesce(error, '')), ?) > 0)"
        )
        params += [search.lower()] * 3
    order = "DESC" if before is not None and after is None else "ASC"
    columns = EVENT_COLUMNS if payload else EVENT_COLUMNS.replace("payload", "NULL")
    rows = db.execute(
        f"SELECT {columns} FROM events INDEXED BY events_by_status "
        f"WHERE {' AND '.join(clauses)} ORDER BY id {order} LIMIT ?",
        (*params, limit),
    )
    return [event_from_row(r) for r in rows]


def counts(db: sqlite3.Connection) -> dict[str, int]:
    return dict(db.execute("SELECT status, n FROM event_counts"))


def lease_info(db: sqlite3.Connection) -> Lease | None:
    row = db.execute("SELECT holder, gen, until FROM lease WHERE id = 1").fetchone()
    return None if row is None else Lease(*row)


def lease_history(db: sqlite3.Connection, limit: int) -> list[LeaseChange]:
    return [
        LeaseChange(*r)
        for r in db.execute(
            "SELECT gen, holder, previous_holder, at, how FROM lease_history ORDER BY gen DESC "
            "LIMIT ?",
            (limit,),
        )
    ]


def timers(db: sqlite3.Connection, limit: int) -> list[Timer]:
    return [
        timer_from_row(r)
        for r in db.execute(
            f"SELECT {TIMER_COLUMNS} FROM timers ORDER BY due, id LIMIT ?", (limit,)
        )
    ]


def approvals(db: sqlite3.Connection, limit: int) -> list[Approval]:
    """Waiting ones first (soonest deadline first), then the latest answered."""
    columns = "request_id, action, due, answer, requested, answered_at, answered_by"
    waiting = db.execute(
        f"SELECT {columns} FROM approvals WHERE answer IS NULL ORDER BY due LIMIT ?", (limit,)
    ).fetchall()
    answered = db.execute(
        f"SELECT {columns} FROM approvals WHERE answer IS NOT NULL "
        f"ORDER BY answered_at DESC LIMIT ?",
        (max(limit - len(waiting), 0),),
    ).fetchall()
    return [Approval(*r) for r in waiting + answered]


def held_messages(db: sqlite3.Connection, limit: int) -> list[Message]:
    return [
        message_from_row(r)
        for r in db.execute(
            "SELECT id, body, urgent, created, status, run_id, delivery_id FROM outbox "
            "WHERE status = 'held' ORDER BY id LIMIT ?",
            (limit,),
        )
    ]


def deliveries(
    db: sqlite3.Connection, limit: int, now: int | None = None, ids: Sequence[int] | None = None
) -> list[Delivery]:
    """Newest first (or the given ids, oldest first); with `now`, an at-most-once delivery
    cut off mid-send shows as 'uncertain'."""
    where, params = "", [limit]
    if ids is not None:
        where, params = f"WHERE d.id IN ({_placeholders(ids)})", [*ids, limit]
    rows = db.execute(
        "SELECT d.id, d.status, d.attempts, d.created, "
        "(SELECT count(*) FROM outbox o WHERE o.delivery_id = d.id), d.sent_at, d.last_error, "
        "NOT d.paced, d.at_most_once, d.retry_after, d.broken FROM deliveries d "
        f"{where} ORDER BY d.id {'ASC' if ids is not None else 'DESC'} LIMIT ?",
        params,
    ).fetchall()
    return [delivery_from_row(r, delivery_key(db, r[0]), now) for r in rows]


def audit_entries(db: sqlite3.Connection, limit: int, target: str | None) -> list[AuditEntry]:
    columns = "id, at, actor, action, target, before, after, applied, reason"
    if target is None:
        rows = db.execute(f"SELECT {columns} FROM audit ORDER BY id DESC LIMIT ?", (limit,))
    else:
        rows = db.execute(
            f"SELECT {columns} FROM audit WHERE target = ? ORDER BY id DESC LIMIT ?",
            (target, limit),
        )
    return [audit_entry_from_row(r) for r in rows]


def run_records(db: sqlite3.Connection, ids: Iterable[int]) -> list[Run]:
    ids = list(ids)
    rows = db.execute(
        f"SELECT id, holder, gen, event_ids, claimed_at, finished_at, outcome, result, error, "
        f"traceback FROM runs WHERE id IN ({_placeholders(ids)}) ORDER BY id",
        ids,
    )
    return [run_from_row(r) for r in rows]


def runs_for_event(db: sqlite3.Connection, event_id: int) -> list[Run]:
    """Every run that claimed this event (history for the detail view)."""
    ids = [
        r[0]
        for r in db.execute(
            "SELECT run_id FROM run_events WHERE event_id = ? ORDER BY run_id", (event_id,)
        )
    ]
    return run_records(db, ids)


def effects_for_run(db: sqlite3.Connection, run_ids: Sequence[int]) -> list[Effect]:
    rows = db.execute(
        f"SELECT id, run_id, name, key, state, detail, intended_at, settled_at FROM effects "
        f"WHERE run_id IN ({_placeholders(run_ids)}) ORDER BY id",
        list(run_ids),
    )
    return [effect_from_row(r) for r in rows]


def overview(db: sqlite3.Connection, now: int) -> Overview:
    settings = load_settings(db)
    meta = dict(db.execute("SELECT key, value FROM meta"))
    held = db.execute("SELECT count(*) FROM outbox WHERE status = 'held'").fetchone()[0]
    waiting = db.execute("SELECT count(*) FROM approvals WHERE answer IS NULL").fetchone()[0]
    uncertain = db.execute(
        f"SELECT count(*) FROM deliveries WHERE {_UNCERTAIN}", (now,)
    ).fetchone()[0]
    timer_count = db.execute("SELECT count(*) FROM timers").fetchone()[0]
    runs_day = runs_since(db, now - DAY)
    pending = counts(db)
    budgets = plans.budgets(settings, runs_day, pending.get("pending", 0))
    return Overview(
        now=now,
        counts=pending,
        lease=lease_info(db),
        takeovers=meta.get("takeovers") or 0,
        refused_writes=meta.get("refused_writes") or 0,
        paused=bool(meta.get("paused")),
        outbox_held=bool(meta.get("outbox_held")),
        held_messages=held,
        next_send_at=next_send_at(db) if held else None,
        next_timer_due=next_timer_due(db),
        waiting_approvals=waiting,
        runs_last_day=runs_day,
        budgets=budgets,
        timers=timer_count,
        uncertain_deliveries=uncertain,
        set_aside=meta.get("set_aside") or 0,
        lease_released=_lease_released(db),
    )


def _lease_released(db: sqlite3.Connection) -> bool:
    row = db.execute("SELECT gen FROM lease WHERE id = 1").fetchone()
    return row is not None and get_meta(db, "released_gen") == row[0]


def next_wake(db: sqlite3.Connection, now: int) -> int | None:
    """The earliest of: next timer, next backed-off pending event, next allowed send —
    counting only what can happen then. While the outbox is held no send is due; while
    paused no event is; while the runs-per-day budget is used up, events wait for the
    instant the window frees a slot. (A past instant nothing acts on would make a worker
    wait for its next renewal instead, and a timer due meanwhile would fire late.)"""
    settings = load_settings(db)
    candidates = [next_timer_due(db)]
    if not get_meta(db, "paused"):
        pending = db.execute(
            "SELECT min(available_at) FROM events INDEXED BY "
            "events_pending_available WHERE status = 'pending'"
        ).fetchone()[0]
        limit = settings.max_runs_per_day
        if pending is not None and limit is not None:
            oldest_counted = db.execute(
                "SELECT claimed_at FROM runs WHERE claimed_at > ? ORDER BY claimed_at DESC "
                "LIMIT 1 OFFSET ?",
                (now - DAY, limit - 1),
            ).fetchone()
            pending = when_runs_allow(pending, oldest_counted and oldest_counted[0])
        candidates.append(pending)
    if not get_meta(db, "outbox_held"):
        candidates += [
            next_send_at(db),
            # A send that a crashed dispatcher left half-done may be retried from then on.
            db.execute(
                "SELECT min(retry_after) + 1 FROM deliveries WHERE status = 'sending' "
                "AND at_most_once = 0"
            ).fetchone()[0],
        ]
    return earliest(candidates)
