"""Every SQL statement of a PostgreSQL inbox: the same functions as core/store.py.

Each function takes a `Tx` (core/pg/db.py: the connection and the id of the inbox it works
on) already inside the right transaction, and has the name and arguments of its twin in
core/store.py, so everything above the SQL (core/inbox.py, the worker) is shared, and so
are the decisions around it (core/decoding.py, core/timing.py, core/plans.py): here are the
statements and the glue. Every statement is scoped to `tx.inbox`: one database holds many
inboxes.

Isolation: READ COMMITTED plus one explicit row lock, not SERIALIZABLE plus retry.
Every write transaction starts with `SELECT … FROM inboxes WHERE id = … FOR UPDATE`
(core/pg/db.py, `write_transaction`): the inbox's row is its mutex, as the file's write lock
(BEGIN IMMEDIATE) is on SQLite. Writers of one inbox therefore run one after another, and each
statement after the lock sees everything committed before it was granted, so every rule is
checked and applied against the state it changes: fencing (`holds` then the write), claim
selection, the write-once approval answer, dedupe (also a UNIQUE key). Why not SERIALIZABLE:
its conflicts are detected at commit and need the whole transaction re-run; under the
contention a lease invites (every standby asking at once) that is a retry storm, and its
predicate locks on shared index pages make *different* inboxes of one database abort each
other. With the row lock, inboxes never wait for one another, a transaction never has to be
retried, and there is no deadlock: each transaction locks one inbox row first and then only
rows of that inbox. Reads run as one REPEATABLE READ snapshot and never block writers.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Sequence

import psycopg

from ..clock import MAX_COUNT
from ..decoding import (
    DECODE_ERRORS,
    EVENT_COLUMNS,
    TIMER_COLUMNS,
    audit_entry_from_row,
    checked_timer,
    delivery_from_row,
    effect_from_row,
    event_from_row,
    event_ids,
    message_from_row,
    not_fired,
    reason as _reason,
    run_from_row,
    settings_from,
    shown_status,
    timer_from_row,
)
from ..errors import BadInput, BudgetExceeded
from .. import plans
from ..plans import (
    Answering,
    DAY,
    answering,
    buried_by,
    change_refused,
    earliest,
    effect_event,
    expiring,
    late_outcome,
    next_paced_send,
    not_a_count,
    paced_now,
    resumption,
    send_outcome,
    settling,
    Unsendable,
    unsendable_attempt,
    unsendable_messages,
    when_runs_allow,
)
from ..records import (
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
from ..settings import Settings
from ..store import ingest_group  # the group commit's savepoints, the same on both
from ..timing import approval_timer, firing
from .db import Tx

# What makes a stored row one the engine cannot process (set aside, the pass goes on): the
# file backend's sqlite3.IntegrityError is never raised here, psycopg's own errors are.
ROW_ERRORS = DECODE_ERRORS + (psycopg.DataError, psycopg.IntegrityError)

# The SQLite file's `meta` keys are columns of the inbox's row here.
META_COLUMNS = {
    "paused",
    "outbox_held",
    "refused_writes",
    "takeovers",
    "last_paced_send",
    "uid",
    "set_aside",
}


# --- settings and flags ---------------------------------------------------------------------


def load_settings(db: Tx) -> Settings:
    row = db.row or db.execute("SELECT settings FROM inboxes WHERE id = %s", (db.inbox,)).fetchone()
    if row is None or row[0] is None:
        return Settings()
    return settings_from(row[0])


load_settings.one_statement = True  # type: ignore[attr-defined] # see db.read_transaction


def store_settings(db: Tx, settings: Settings) -> None:
    db.execute("UPDATE inboxes SET settings = %s WHERE id = %s", (settings.to_json(), db.inbox))


def get_meta(db: Tx, key: str) -> Any:
    if key not in META_COLUMNS:
        raise KeyError(key)
    if key == "paused" and db.row is not None:
        return db.row[4]
    return db.one(f"SELECT {key} FROM inboxes WHERE id = %s", (db.inbox,))[0]


def set_meta(db: Tx, key: str, value: Any) -> None:
    if key not in META_COLUMNS:
        raise KeyError(key)
    if key in ("paused", "outbox_held"):
        value = bool(value)
    db.execute(f"UPDATE inboxes SET {key} = %s WHERE id = %s", (value, db.inbox))


def _set_aside_counted(db: Tx) -> None:
    _bump(db, "set_aside")


def _bump(db: Tx, key: str) -> None:
    if key not in ("refused_writes", "takeovers", "set_aside"):
        raise KeyError(key)
    db.execute(f"UPDATE inboxes SET {key} = {key} + 1 WHERE id = %s", (db.inbox,))


def audit(
    db: Tx,
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
        "INSERT INTO audit(inbox_id, at, actor, action, target, before, after, applied, "
        "reason) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)",
        (db.inbox, now, actor, action, target, before, after, bool(applied), reason),
    )


# --- intake ---------------------------------------------------------------------------------


def ingest_many(db: Tx, items: Sequence[tuple[str, str, str, int]]) -> list[bool | Exception]:
    """Dedupe on (source, source_id): store each new event, report duplicates as False.

    Items that arrived together share this one transaction (group commit); a refused item
    (budget, or a value the database refuses) gets its own exception and does not fail its
    neighbours: if the group fails as a whole, each item is retried alone.
    """
    return ingest_group(db, items, _ingest_items, psycopg.OperationalError)


def _ingest_items(db: Tx, items: Sequence[tuple[str, str, str, int]]) -> list[bool | Exception]:
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
        results.append(_insert(db, source, source_id, payload, now))
    return results


def _ingest_group(
    db: Tx, items: Sequence[tuple[str, str, str, int]], settings: Settings
) -> list[bool | Exception]:
    """The same rule as the per-item path, for a group: one multi-row insert that skips the
    keys already stored and reports which it stored. Rows go in in order, so a repeat of a
    key within the group is a duplicate of its first copy."""
    results: list[bool | Exception] = [False] * len(items)
    wanted = []
    for index, (source, source_id, payload, now) in enumerate(items):
        if len(payload) > settings.max_payload_bytes:
            results[index] = BadInput(
                f"payload is over {settings.max_payload_bytes} bytes (max_payload_bytes)"
            )
        else:
            wanted.append((index, source, source_id, payload, now))
    if not wanted:
        return results
    columns = list(zip(*[(s, i, p, n) for _, s, i, p, n in wanted], strict=True))
    # The first copy of each key not stored yet, numbered on from the inbox's last id.
    stored = set(
        db.execute(
            "INSERT INTO events(inbox_id, id, source, source_id, payload, available_at, created, "
            "updated) SELECT %s, last.id + row_number() OVER (ORDER BY k.o), k.s, k.i, k.p, k.n, "
            "k.n, k.n FROM (SELECT DISTINCT ON (s, i) s, i, p, n, o FROM unnest(%s::text[], "
            "%s::text[], %s::text[], %s::bigint[]) WITH ORDINALITY AS u(s, i, p, n, o) "
            "ORDER BY s, i, o) AS k CROSS JOIN (SELECT coalesce(max(id), 0) AS id FROM events "
            "WHERE inbox_id = %s) AS last WHERE NOT EXISTS (SELECT 1 FROM events e WHERE "
            "e.inbox_id = %s AND e.source = k.s AND e.source_id = k.i) ORDER BY k.o "
            "RETURNING source, source_id",
            (
                db.inbox,
                list(columns[0]),
                list(columns[1]),
                list(columns[2]),
                list(columns[3]),
                db.inbox,
                db.inbox,
            ),
        )
    )
    for index, source, source_id, _, _ in wanted:
        if (source, source_id) in stored:
            stored.discard((source, source_id))
            results[index] = True
    return results


def _refuse_over_pending(db: Tx, settings: Settings, source: str, source_id: str) -> bool:
    pending = db.one(
        "SELECT n FROM event_counts WHERE inbox_id = %s AND status = 'pending'", (db.inbox,)
    )[0]
    if pending < settings.max_pending:
        return False
    duplicate = db.execute(
        "SELECT 1 FROM events WHERE inbox_id = %s AND source = %s AND source_id = %s",
        (db.inbox, source, source_id),
    ).fetchone()
    return duplicate is None  # a duplicate is still a harmless no-op, never a refusal


def _insert(db: Tx, source: str, source_id: str, payload: str, now: int) -> bool:
    """Store one event under the inbox's next id unless its key is stored; True if stored."""
    return (
        db.execute(
            "INSERT INTO events(inbox_id, id, source, source_id, payload, available_at, created, "
            "updated) SELECT %s, coalesce(max(id), 0) + 1, %s, %s, %s, %s, %s, %s FROM events "
            "WHERE inbox_id = %s ON CONFLICT (inbox_id, source, source_id) DO NOTHING",
            (db.inbox, source, source_id, payload, now, now, now, db.inbox),
        ).rowcount
        == 1
    )


def _insert_event(db: Tx, source: str, source_id: str, payload: Any, now: int) -> bool:
    return _insert(db, source, source_id, json.dumps(payload), now)


def prune_payloads(db: Tx, older_than: int, now: int) -> int:
    """Drop the bodies of finished events; their (source, source_id) keys keep deduping."""
    cursor = db.execute(
        "UPDATE events SET payload = NULL, updated = %s WHERE inbox_id = %s AND status IN "
        "('done', 'cancelled') AND updated < %s AND payload IS NOT NULL",
        (now, db.inbox, older_than),
    )
    return cursor.rowcount


# --- lease and fencing ----------------------------------------------------------------------


def _lease(db: Tx) -> Lease | None:
    """The inbox's lease; None before any worker took one (its three columns are set
    together: a holder always has a generation and an expiry)."""
    row = (
        db.row[1:4]
        if db.row is not None
        else db.one(
            "SELECT lease_holder, lease_gen, lease_until FROM inboxes WHERE id = %s", (db.inbox,)
        )
    )
    return None if row[0] is None else Lease(*row)


def acquire(db: Tx, holder: str, now: int, fresh: bool = False) -> int | None:
    """Renew an unexpired lease (same generation) or take over an expired one (next one).
    `fresh` (a starting worker): never continue a live lease, not even one under this
    holder's name; only a free or expired lease is taken, as a new generation."""
    ttl = load_settings(db).lease_ttl
    lease = _lease(db)
    if lease is None:
        db.execute(
            "UPDATE inboxes SET lease_holder = %s, lease_gen = 1, lease_until = %s WHERE id = %s",
            (holder, now + ttl, db.inbox),
        )
        db.execute(
            "INSERT INTO lease_history(inbox_id, gen, holder, previous_holder, at, how) "
            "VALUES (%s, 1, %s, NULL, %s, 'first')",
            (db.inbox, holder, now),
        )
        return 1
    current, gen, until = lease.holder, lease.gen, lease.until
    if until >= now:
        if current != holder or fresh:
            return None
        db.execute("UPDATE inboxes SET lease_until = %s WHERE id = %s", (now + ttl, db.inbox))
        return gen
    # A lease its holder handed back (a clean restart) is a succession, not a takeover: only
    # a lease left to expire means a worker died or stalled.
    released = db.one("SELECT released_gen FROM inboxes WHERE id = %s", (db.inbox,))[0] == gen
    gen += 1
    db.execute(
        "UPDATE inboxes SET lease_holder = %s, lease_gen = %s, lease_until = %s, "
        "takeovers = takeovers + %s WHERE id = %s",
        (holder, gen, now + ttl, 0 if released else 1, db.inbox),
    )
    db.execute(
        "INSERT INTO lease_history(inbox_id, gen, holder, previous_holder, at, how) "
        "VALUES (%s, %s, %s, %s, %s, %s)",
        (db.inbox, gen, holder, current, now, "released" if released else "takeover"),
    )
    return gen


def holds(db: Tx, holder: str, gen: int, now: int) -> bool:
    lease = _lease(db)
    return lease is not None and lease.holder == holder and lease.gen == gen and lease.until >= now


def refuse(db: Tx, what: str, holder: str, gen: int, now: int, reason: str | None = None) -> None:
    """Record a refused stale write: the only thing a refused write may change."""
    lease = _lease(db)
    seen = (
        "no lease" if lease is None else f"lease {lease.holder} gen {lease.gen} until {lease.until}"
    )
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


def renew(db: Tx, holder: str, gen: int, now: int) -> bool:
    """Extend the lease only for the exact unexpired generation (a fenced renewal)."""
    if not holds(db, holder, gen, now):
        refuse(db, "renew", holder, gen, now)
        return False
    db.execute(
        "UPDATE inboxes SET lease_until = %s WHERE id = %s",
        (now + load_settings(db).lease_ttl, db.inbox),
    )
    return True


def release(db: Tx, holder: str, gen: int, now: int) -> bool:
    """Hand the lease back so a successor need not wait for the TTL."""
    if not holds(db, holder, gen, now):
        return False
    db.execute(
        "UPDATE inboxes SET lease_until = %s, released_gen = %s WHERE id = %s",
        (now - 1, gen, db.inbox),
    )
    audit(db, now, holder, "release lease", f"gen {gen}", "held", "released", True)
    return True


# --- claiming -------------------------------------------------------------------------------


def claim_batch(db: Tx, holder: str, gen: int, now: int) -> list[Event]:
    """Claim the next run's events for the holder of exactly this generation."""
    if not holds(db, holder, gen, now):
        refuse(db, "claim", holder, gen, now)
        return []
    settings = load_settings(db)
    # Pending rows out of attempts are buried in the statement that looks for lost claims
    # (one round trip when nothing was lost, the usual case); claims recovered as pending
    # are buried by a second pass. Bury and recovery touch different rows (pending and
    # running), so this ends where recovery-then-bury ends.
    if recover_lost_claims(db, gen, now, settings, bury=True):
        bury_exhausted(db, now, settings)
    if get_meta(db, "paused"):
        return []
    if (
        settings.max_runs_per_day is not None
        and runs_since(db, now - DAY) >= settings.max_runs_per_day
    ):
        return []  # budget: excess runs are delayed until the day's window frees a slot
    for _ in range(100):  # each round sets aside what it cannot run; a pass never stops
        # The oldest attempted event and the first available ones, in one round trip (each
        # half walks its own index).
        found = db.execute(
            "(SELECT id, true FROM events WHERE inbox_id = %s AND status = 'pending' "
            "AND attempts > 0 AND available_at <= %s ORDER BY id LIMIT 1) UNION ALL "
            "(SELECT id, false FROM events WHERE inbox_id = %s AND status = 'pending' "
            "AND available_at <= %s ORDER BY id LIMIT %s)",
            (db.inbox, now, db.inbox, now, settings.max_batch),
        ).fetchall()
        retried = [event_id for event_id, attempted in found if attempted]
        if retried:
            ids = retried  # an attempted event runs alone: a poison event harms no other
        else:
            ids = sorted(event_id for event_id, _ in found)
        if not ids:
            return []
        events = _runnable(db, ids, now)
        if events:
            break
    else:
        return []
    ids = [e.id for e in events]
    # The run, its events' links and the claim itself in one statement (one round trip).
    # Attempts are counted here, at claim time: a worker that crashes never reports failure.
    run_id = db.one(
        "WITH run AS (INSERT INTO runs(inbox_id, holder, gen, event_ids, claimed_at) "
        "VALUES (%(inbox)s, %(holder)s, %(gen)s, %(json)s, %(now)s) RETURNING id), "
        "linked AS (INSERT INTO run_events(inbox_id, event_id, run_id) "
        "SELECT %(inbox)s, unnest(%(ids)s::bigint[]), run.id FROM run), "
        "claimed AS (UPDATE events SET status = 'running', attempts = attempts + 1, "
        "claim_gen = %(gen)s, claimed_at = %(now)s, run_id = (SELECT id FROM run), "
        "updated = %(now)s WHERE inbox_id = %(inbox)s AND id = ANY(%(ids)s)) "
        "SELECT id FROM run",
        {
            "inbox": db.inbox,
            "holder": holder,
            "gen": gen,
            "json": json.dumps(ids),
            "now": now,
            "ids": ids,
        },
    )[0]
    db.changed = True
    return [
        dataclasses.replace(
            e,
            status="running",
            attempts=e.attempts + 1,
            claim_gen=gen,
            claimed_at=now,
            run_id=run_id,
            updated=now,
        )
        for e in events
    ]


def _runnable(db: Tx, ids: Sequence[int], now: int) -> list[Event]:
    """The events among `ids` an agent can run; the others are set aside (dead, with the
    reason) so that one bad row never stops every claim: a pruned payload (nothing to run
    on), a payload that is not JSON."""
    runnable = []
    for row in db.execute(
        f"SELECT {EVENT_COLUMNS} FROM events WHERE inbox_id = %s AND id = ANY(%s) ORDER BY id",
        (db.inbox, list(ids)),
    ).fetchall():
        if row[3] is None:
            why = "its payload was pruned; there is nothing to run it on"
        else:
            try:
                runnable.append(event_from_row(row, strict=True))
                continue
            except ROW_ERRORS as exc:
                why = f"its payload cannot be read ({_reason(exc)})"
        db.execute(
            "UPDATE events SET status = 'dead', error = %s, updated = %s "
            "WHERE inbox_id = %s AND id = %s",
            ("set aside, not run: " + why, now, db.inbox, row[0]),
        )
        _set_aside_counted(db)
    return runnable


def recover_lost_claims(db: Tx, gen: int, now: int, settings: Settings, bury: bool = False) -> int:
    """Rows running under an older generation (or past the run budget) were lost. With
    bury=True the same statement also buries pending rows out of attempts (bury_exhausted)."""
    if bury:
        cursor = db.execute(
            "WITH buried AS (UPDATE events SET status = 'dead', updated = %s, error = "
            "'too many attempts (' || attempts || '/' || %s::bigint || ')' || "
            "coalesce(': ' || error, '') WHERE inbox_id = %s AND status = 'pending' AND "
            "attempts > 0 AND attempts >= %s RETURNING 1) "
            "SELECT id, source, claim_gen, run_id, (SELECT count(*) FROM buried) FROM events "
            "WHERE inbox_id = %s AND status = 'running' AND claim_gen < %s "
            "UNION ALL SELECT NULL, NULL, NULL, NULL, (SELECT count(*) FROM buried) "
            "ORDER BY 1",
            (now, settings.max_attempts, db.inbox, settings.max_attempts, db.inbox, gen),
        )
        found = cursor.fetchall()
        if found[-1][4]:
            db.changed = True  # rows were buried (the CTE's count; rowcount is the SELECT's)
        lost = [row[:4] for row in found if row[0] is not None]
    else:
        lost = db.execute(
            "SELECT id, source, claim_gen, run_id FROM events WHERE "
            "inbox_id = %s AND status = 'running' AND claim_gen < %s",
            (db.inbox, gen),
        ).fetchall()
    if settings.max_run_seconds is not None:
        lost += db.execute(
            "SELECT id, source, claim_gen, run_id FROM events WHERE inbox_id = %s "
            "AND status = 'running' AND claim_gen = %s AND claimed_at < %s",
            (db.inbox, gen, now - settings.max_run_seconds),
        ).fetchall()
    for event_id, source, claim_gen, run_id in lost:
        why = (
            f"generation {claim_gen} lost its lease"
            if claim_gen < gen
            else f"ran past max_run_seconds ({settings.max_run_seconds} s)"
        )
        if settings.lost_claim_policy(source) == "interrupt":
            db.execute(
                "UPDATE events SET status = 'interrupted', error = %s, updated = %s "
                "WHERE inbox_id = %s AND id = %s",
                ("completion uncertain: run lost, " + why, now, db.inbox, event_id),
            )
        else:
            # Not backed off: the lease expiry already delayed it.
            db.execute(
                "UPDATE events SET status = 'pending', available_at = %s, error = %s, "
                "updated = %s WHERE inbox_id = %s AND id = %s",
                (now, "run lost: " + why, now, db.inbox, event_id),
            )
        db.execute(
            "UPDATE runs SET outcome = 'lost', finished_at = %s, error = %s "
            "WHERE inbox_id = %s AND id = %s AND outcome IS NULL",
            (now, "run lost: " + why, db.inbox, run_id),
        )
    return len(lost)


def bury_exhausted(db: Tx, now: int, settings: Settings) -> int:
    """Pending rows out of attempts become dead, keeping why."""
    cursor = db.execute(
        "UPDATE events SET status = 'dead', updated = %s, error = 'too many attempts (' || "
        "attempts || '/' || %s::bigint || ')' || coalesce(': ' || error, '') "
        "WHERE inbox_id = %s AND status = 'pending' AND attempts > 0 AND attempts >= %s",
        (now, settings.max_attempts, db.inbox, settings.max_attempts),
    )
    return cursor.rowcount


def runs_since(db: Tx, since: int) -> int:
    runs: int = db.one(
        "SELECT count(*) FROM runs WHERE inbox_id = %s AND claimed_at > %s", (db.inbox, since)
    )[0]
    return runs


# --- finishing ------------------------------------------------------------------------------


def finish(
    db: Tx,
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
    if not holds(db, holder, gen, now):
        refuse(db, "finish", holder, gen, now)
        return False
    if (
        run is not None
        and db.execute(
            "SELECT 1 FROM runs WHERE inbox_id = %s AND id = %s AND gen = %s AND outcome IS NULL",
            (db.inbox, run, gen),
        ).fetchone()
        is None
    ):
        refuse(
            db,
            "finish",
            holder,
            gen,
            now,
            f"run {run} is not an open run of this generation (recovered or finished)",
        )
        return False
    settings = load_settings(db)
    if (
        settings.max_followups_per_run is not None
        and len(followups) > settings.max_followups_per_run
    ):
        raise BadInput(
            f"run asks for {len(followups)} follow-up timers; the budget "
            f"max_followups_per_run allows {settings.max_followups_per_run}"
        )
    rows = db.execute(
        "SELECT id, attempts, run_id FROM events WHERE inbox_id = %s AND id = ANY(%s) "
        "AND status = 'running' AND claim_gen = %s AND (%s::bigint IS NULL OR run_id = %s) "
        "ORDER BY id",
        (db.inbox, list(ids), gen, run, run),
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
    live = [r[0] for r in rows]
    run_ids = sorted({r[2] for r in rows if r[2] is not None})
    if error is None:
        db.execute(
            "UPDATE events SET status = 'done', error = NULL, updated = %s "
            "WHERE inbox_id = %s AND id = ANY(%s)",
            (now, db.inbox, live),
        )
        run_id = run_ids[0] if run_ids else None
        for reply in replies:
            db.execute(
                "INSERT INTO outbox(inbox_id, body, urgent, created, run_id) "
                "VALUES (%s, %s, %s, %s, %s)",
                (db.inbox, reply.body, bool(reply.urgent), now, run_id),
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
            if not 0 <= attempts <= MAX_COUNT or attempts >= settings.max_attempts:
                db.execute(
                    "UPDATE events SET status = 'dead', error = %s, updated = %s "
                    "WHERE inbox_id = %s AND id = %s",
                    (
                        f"too many attempts ({attempts}/{settings.max_attempts}): {error}",
                        now,
                        db.inbox,
                        event_id,
                    ),
                )
            else:
                db.execute(
                    "UPDATE events SET status = 'pending', error = %s, available_at = %s, "
                    "updated = %s WHERE inbox_id = %s AND id = %s",
                    (error, now + settings.backoff(attempts), now, db.inbox, event_id),
                )
        outcome = "error"
    if run_ids:
        # A run closes when its last event is finished (a run may be finished in parts);
        # until then a lost-claim recovery can still close it as lost.
        db.execute(
            "UPDATE runs r SET outcome = %s, finished_at = %s, result = %s, error = %s, "
            "traceback = %s WHERE r.inbox_id = %s AND r.id = ANY(%s) AND "
            "r.outcome IS NULL AND NOT EXISTS (SELECT 1 FROM events e WHERE "
            "e.inbox_id = r.inbox_id AND e.run_id = r.id AND e.status = 'running')",
            (outcome, now, result, error, traceback, db.inbox, run_ids),
        )
    return True


# --- timers ---------------------------------------------------------------------------------


def add_timer(
    db: Tx,
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
        "INSERT INTO timers(inbox_id, id, kind, due, every, catch_up, payload, key_source, "
        "key_id) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s) ON CONFLICT (inbox_id, id) DO "
        "UPDATE SET kind = excluded.kind, due = excluded.due, every = excluded.every, "
        "catch_up = excluded.catch_up, payload = excluded.payload, "
        "key_source = excluded.key_source, key_id = excluded.key_id, broken = NULL",
        (db.inbox, timer_id, kind, due, every, catch_up, payload, key_source, key_id),
    )


def cancel_timer(db: Tx, timer_id: str) -> bool:
    return (
        db.execute(
            "DELETE FROM timers WHERE inbox_id = %s AND id = %s", (db.inbox, timer_id)
        ).rowcount
        == 1
    )


def run_scheduler(db: Tx, now: int) -> int:
    """Turn every due timer into inbox events and advance it, all in this one transaction.

    The due timers are planned in Python and written in three statements whatever their
    number (events, advanced timers, fired one-offs): a statement per timer is a round trip
    per timer here. Approval expiries, and rows whose checks fail, take the per-row path
    below; if the database refuses the batch (a value no valid call could have stored, say
    a due that overflows), it is rolled back and every timer takes the per-row path, which
    sets the bad row aside with its reason while the others fire.
    """
    settings = load_settings(db)
    due = db.execute(
        f"SELECT {TIMER_COLUMNS} FROM timers WHERE inbox_id = %s AND due <= %s "
        f"AND broken IS NULL ORDER BY due, id",
        (db.inbox, now),
    ).fetchall()
    if len(due) > 1:
        db.execute("SAVEPOINT fire_timers")
        try:
            rest = _fire_batch(db, due, now, settings.catch_up_limit)
            db.execute("RELEASE fire_timers")
        except ROW_ERRORS:
            db.execute("ROLLBACK TO fire_timers")
            db.execute("RELEASE fire_timers")
            rest = due
    else:
        rest = due
    for row in rest:
        # Each timer fires in its own savepoint: a row the engine cannot process is rolled
        # back and set aside with the reason, and the other timers still fire.
        db.execute("SAVEPOINT fire_timer")
        try:
            _fire(db, checked_timer(row), now, settings.catch_up_limit)
            db.execute("RELEASE fire_timer")
        except ROW_ERRORS as exc:
            db.execute("ROLLBACK TO fire_timer")
            db.execute("RELEASE fire_timer")
            db.execute(
                "UPDATE timers SET broken = %s WHERE inbox_id = %s AND id = %s",
                (not_fired(exc), db.inbox, row[0]),
            )
            _set_aside_counted(db)
    return len(due)


def _nothing_due(db: Tx, now: int) -> int | None:
    """The scheduler pass's answer without a transaction when no timer is due (most passes
    of a busy worker): 0; None when there is something to fire."""
    found = db.execute(
        "SELECT 1 FROM timers WHERE inbox_id = %s AND due <= %s AND broken IS NULL LIMIT 1",
        (db.inbox, now),
    ).fetchone()
    return None if found else 0


run_scheduler.precheck = _nothing_due  # type: ignore[attr-defined] # see db.write_transaction


def _fire_batch(db: Tx, due: Sequence[Any], now: int, limit: int) -> list[Any]:
    """Fire the plain timers of `due` in three statements, the same rows as _fire would
    write one by one (core/timing.py's plans); return the rows left to the per-row path
    (approval expiries, rows that fail their checks)."""
    rest: list[Any] = []
    events: list[tuple[str, str, str]] = []  # (source, source_id, payload), in firing order
    advanced: list[tuple[str, int, int | None, int | None, int]] = []
    fired_once: list[str] = []
    for row in due:
        try:
            timer = checked_timer(row)
            if timer.kind == "approval":
                rest.append(row)
                continue
            plan = firing(timer, now, limit)
            events += [(source, key, json.dumps(data)) for source, key, data in plan.events]
            if plan.due is None:
                fired_once.append(timer.id)
            else:
                advanced.append((timer.id, plan.due, plan.fired, plan.skipped, plan.overflow))
        except ROW_ERRORS:
            rest.append(row)
    if events:
        # Numbered on from the inbox's last id in firing order; a key already stored (or
        # repeated in the batch) is a duplicate, as in _insert.
        db.execute(
            "INSERT INTO events(inbox_id, id, source, source_id, payload, available_at, "
            "created, updated) SELECT %s, last.id + row_number() OVER (ORDER BY k.o), k.s, "
            "k.i, k.p, %s, %s, %s FROM (SELECT DISTINCT ON (s, i) s, i, p, o FROM "
            "unnest(%s::text[], %s::text[], %s::text[]) WITH ORDINALITY AS u(s, i, p, o) "
            "ORDER BY s, i, o) AS k CROSS JOIN (SELECT coalesce(max(id), 0) AS id FROM events "
            "WHERE inbox_id = %s) AS last WHERE NOT EXISTS (SELECT 1 FROM events e WHERE "
            "e.inbox_id = %s AND e.source = k.s AND e.source_id = k.i) ORDER BY k.o",
            (
                db.inbox,
                now,
                now,
                now,
                [e[0] for e in events],
                [e[1] for e in events],
                [e[2] for e in events],
                db.inbox,
                db.inbox,
            ),
        )
    if advanced:
        columns = list(zip(*advanced, strict=True))
        db.execute(
            "UPDATE timers t SET due = u.due, last_fired = coalesce(u.fired, t.last_fired), "
            "last_skipped = coalesce(u.skipped, t.last_skipped), "
            "overflow = t.overflow + u.overflow FROM unnest(%s::text[], %s::bigint[], "
            "%s::bigint[], %s::bigint[], %s::bigint[]) AS u(id, due, fired, skipped, overflow) "
            "WHERE t.inbox_id = %s AND t.id = u.id",
            (
                list(columns[0]),
                list(columns[1]),
                list(columns[2]),
                list(columns[3]),
                list(columns[4]),
                db.inbox,
            ),
        )
    if fired_once:
        db.execute(
            "DELETE FROM timers WHERE inbox_id = %s AND id = ANY(%s)", (db.inbox, fired_once)
        )
    return rest


def _fire(db: Tx, timer: Timer, now: int, catch_up_limit: int) -> None:
    """Write what core/timing.py plans for one due timer; an approval's expiry answers it."""
    if timer.every is None and timer.kind == "approval":
        _expire(db, timer.payload["request_id"], now, "scheduler")
        db.execute("DELETE FROM timers WHERE inbox_id = %s AND id = %s", (db.inbox, timer.id))
        return
    plan = firing(timer, now, catch_up_limit)
    for source, source_id, payload in plan.events:
        _insert_event(db, source, source_id, payload, now)
    if plan.due is None:
        db.execute("DELETE FROM timers WHERE inbox_id = %s AND id = %s", (db.inbox, timer.id))
    elif plan.fired is None:
        db.execute(
            "UPDATE timers SET due = %s WHERE inbox_id = %s AND id = %s",
            (plan.due, db.inbox, timer.id),
        )
    else:
        db.execute(
            "UPDATE timers SET due = %s, last_fired = %s, last_skipped = %s, "
            "overflow = overflow + %s WHERE inbox_id = %s AND id = %s",
            (plan.due, plan.fired, plan.skipped, plan.overflow, db.inbox, timer.id),
        )


def next_timer_due(db: Tx) -> int | None:
    """The earliest due of the timers the scheduler can fire (set-aside ones never fire)."""
    # No typeof() filter as on SQLite: the column is bigint, a hand edit cannot store text.
    due: int | None = db.one(
        "SELECT min(due) FROM timers WHERE inbox_id = %s AND broken IS NULL", (db.inbox,)
    )[0]
    return due


# --- approvals ------------------------------------------------------------------------------


def request_approval(
    db: Tx, request_id: str, expires_in: int, action: str, now: int, run_id: int | None = None
) -> Approval:
    """Record a request; asking again never moves its deadline."""
    inserted = (
        db.execute(
            "INSERT INTO approvals(inbox_id, request_id, action, requested, due, run_id) "
            "VALUES (%s, %s, %s, %s, %s, %s) ON CONFLICT (inbox_id, request_id) DO NOTHING",
            (db.inbox, request_id, action, now, now + expires_in, run_id),
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


def get_approval(db: Tx, request_id: str) -> Approval | None:
    row = db.execute(
        "SELECT request_id, action, due, answer, requested, answered_at, "
        "answered_by FROM approvals WHERE inbox_id = %s AND request_id = %s",
        (db.inbox, request_id),
    ).fetchone()
    return None if row is None else Approval(*row)


def answer_approval(
    db: Tx, request_id: str, answer: str, now: int, actor: str, reason: str | None
) -> str:
    """Store the first answer unless the deadline has passed; return the answer that stands."""
    action = "approve" if answer == "yes" else "deny"  # the action's one name
    return _decide_approval(
        db, request_id, action, lambda a: answering(a, answer, now), now, actor, reason
    )


def expire_approval(db: Tx, request_id: str, now: int, actor: str, reason: str | None) -> str:
    return _decide_approval(db, request_id, "expire", expiring, now, actor, reason)


def _decide_approval(
    db: Tx,
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


def _expire(db: Tx, request_id: str, now: int, actor: str) -> None:
    approval = get_approval(db, request_id)
    if approval is not None and approval.answer is None:
        _store_answer(db, approval, "expired", now, actor)


def _store_answer(db: Tx, approval: Approval, answer: str, now: int, actor: str) -> None:
    """Write-once: the answer and its resuming event share one key, ('approval', id)."""
    db.execute(
        "UPDATE approvals SET answer = %s, answered_at = %s, answered_by = %s "
        "WHERE inbox_id = %s AND request_id = %s AND answer IS NULL",
        (answer, now, actor, db.inbox, approval.request_id),
    )
    _insert_event(
        db,
        "approval",
        approval.request_id,
        resumption(approval, answer),
        now,
    )
    db.execute(
        "DELETE FROM timers WHERE inbox_id = %s AND id = %s",
        (db.inbox, approval_timer(approval.request_id)),
    )


# --- outbox ---------------------------------------------------------------------------------

# An at-most-once delivery still 'sending' after its send_timeout was cut off mid-send: it
# may or may not have gone out. It is never sent again by itself; an operator settles it.
_UNCERTAIN = (
    "inbox_id = %s AND status IN ('sending', 'failed') AND status = 'sending' "
    "AND at_most_once AND retry_after < %s"
)


def begin_delivery(db: Tx, now: int, flush: bool) -> tuple[int, str, str, int, int] | None:
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
                "UPDATE deliveries SET status = 'dead', broken = %s, last_error = %s "
                "WHERE inbox_id = %s AND id = %s",
                (exc.why, exc.why, db.inbox, exc.delivery_id),
            )
            db.execute(
                "UPDATE outbox SET status = 'dead' WHERE inbox_id = %s AND delivery_id = %s",
                (db.inbox, exc.delivery_id),
            )
            _set_aside_counted(db)
    return None


def _begin_delivery(db: Tx, now: int, flush: bool) -> tuple[int, str, str, int, int] | None:
    settings = load_settings(db)
    held = bool(get_meta(db, "outbox_held"))
    if held and not flush:
        return None
    retry = db.execute(
        "SELECT id, attempts FROM deliveries WHERE inbox_id = %s AND status IN ('sending', "
        "'failed') AND NOT at_most_once AND (status = 'failed' OR retry_after < %s) "
        "ORDER BY id LIMIT 1",
        (db.inbox, now),
    ).fetchone()
    if retry is not None:
        delivery_id = retry[0]
        if not 0 <= retry[1] < MAX_COUNT:  # one more would overflow the column: an error
            raise Unsendable(delivery_id, not_a_count(retry[1]))
        attempt = db.one(
            "UPDATE deliveries SET status = 'sending', attempts = attempts + 1, "
            "retry_after = %s WHERE inbox_id = %s AND id = %s RETURNING attempts",
            (now + settings.send_timeout, db.inbox, delivery_id),
        )[0]
        unsendable = unsendable_attempt(attempt)
        if unsendable is not None:
            raise Unsendable(delivery_id, unsendable)
    else:
        attempt = 1
        last = get_meta(db, "last_paced_send")
        paced = paced_now(flush, last, settings.outbox_gap, now)
        waiting = "inbox_id = %s AND status = 'held' AND delivery_id IS NULL" + (
            "" if paced else " AND urgent"
        )
        if (
            db.execute(f"SELECT 1 FROM outbox WHERE {waiting} LIMIT 1", (db.inbox,)).fetchone()
            is None
        ):
            return None
        at_most_once = settings.delivery == "at_most_once"
        delivery_id = db.one(
            "INSERT INTO deliveries(inbox_id, status, attempts, paced, at_most_once, created, "
            "retry_after) VALUES (%s, 'sending', 1, %s, %s, %s, %s) RETURNING id",
            (db.inbox, paced, at_most_once, now, now + settings.send_timeout),
        )[0]
        db.execute(f"UPDATE outbox SET delivery_id = %s WHERE {waiting}", (delivery_id, db.inbox))
        if paced:
            set_meta(db, "last_paced_send", now)
    bodies = [
        r[0]
        for r in db.execute(
            "SELECT body FROM outbox WHERE inbox_id = %s AND delivery_id = %s ORDER BY id",
            (db.inbox, delivery_id),
        )
    ]
    unsendable = unsendable_messages(bodies)
    if unsendable is not None:
        raise Unsendable(delivery_id, unsendable)
    return (delivery_id, delivery_key(db, delivery_id), "\n\n".join(bodies), len(bodies), attempt)


def delivery_key(db: Tx, delivery_id: int) -> str:
    return plans.delivery_key(get_meta(db, "uid"), delivery_id)


def end_delivery(db: Tx, delivery_id: int, attempt: int, error: str | None, now: int) -> bool:
    """Record a send's outcome, owned by the attempt that made it: a failed one stays held
    for the next dispatch, or dies. A late outcome (another dispatcher re-sent meanwhile,
    or an operator settled it) is refused and audited like a stale generation."""
    settings = load_settings(db)
    row = db.execute(
        "SELECT status, attempts, at_most_once FROM deliveries WHERE inbox_id = %s AND id = %s",
        (db.inbox, delivery_id),
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
            "UPDATE deliveries SET status = 'sent', sent_at = %s, last_error = NULL "
            "WHERE inbox_id = %s AND id = %s",
            (now, db.inbox, delivery_id),
        )
        db.execute(
            "UPDATE outbox SET status = 'sent' WHERE inbox_id = %s AND delivery_id = %s",
            (db.inbox, delivery_id),
        )
        return True
    if outcome == "dead":
        db.execute(
            "UPDATE deliveries SET status = 'dead', last_error = %s "
            "WHERE inbox_id = %s AND id = %s",
            (error, db.inbox, delivery_id),
        )
        db.execute(
            "UPDATE outbox SET status = 'dead' WHERE inbox_id = %s AND delivery_id = %s",
            (db.inbox, delivery_id),
        )
    else:
        db.execute(
            "UPDATE deliveries SET status = 'failed', last_error = %s "
            "WHERE inbox_id = %s AND id = %s",
            (error, db.inbox, delivery_id),
        )
    return False


def settle_delivery(
    db: Tx, delivery_id: int, outcome: str, expect: str, now: int, actor: str, reason: str | None
) -> bool:
    """An operator settles an uncertain delivery: 'sent' (it went out) or 'send again' (its
    messages go back to the outbox, for a new delivery under a new key). Applied only if the
    delivery is uncertain and in the state the operator saw; audited either way."""
    before = delivery_state(db, delivery_id, now)
    applied, after, why = settling(before, expect, outcome)
    if applied and outcome == "sent":
        db.execute(
            "UPDATE deliveries SET status = 'sent', sent_at = %s, last_error = %s "
            "WHERE inbox_id = %s AND id = %s",
            (now, f"uncertain; marked sent by {actor}", db.inbox, delivery_id),
        )
        db.execute(
            "UPDATE outbox SET status = 'sent' WHERE inbox_id = %s AND delivery_id = %s",
            (db.inbox, delivery_id),
        )
    elif applied:
        db.execute(
            "UPDATE deliveries SET status = 'dead', last_error = %s "
            "WHERE inbox_id = %s AND id = %s",
            (f"uncertain; its messages sent again by {actor}", db.inbox, delivery_id),
        )
        db.execute(
            "UPDATE outbox SET delivery_id = NULL WHERE inbox_id = %s AND "
            "delivery_id = %s AND status = 'held'",
            (db.inbox, delivery_id),
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


def delivery_state(db: Tx, delivery_id: int, now: int) -> str | None:
    row = db.execute(
        "SELECT status, at_most_once, retry_after FROM deliveries WHERE inbox_id = %s AND id = %s",
        (db.inbox, delivery_id),
    ).fetchone()
    return None if row is None else shown_status(row[0], row[1], row[2], now)


def uncertain_deliveries(db: Tx, now: int, limit: int) -> list[Delivery]:
    ids = [
        r[0]
        for r in db.execute(
            f"SELECT id FROM deliveries WHERE {_UNCERTAIN} ORDER BY id LIMIT %s",
            (db.inbox, now, limit),
        )
    ]
    return deliveries(db, MAX_COUNT, now, ids)


def next_send_at(db: Tx) -> int | None:
    """When the next paced send is allowed (None when nothing is waiting)."""
    waiting = db.execute(
        "SELECT 1 FROM outbox WHERE inbox_id = %s AND status = 'held' "
        "AND delivery_id IS NULL LIMIT 1",
        (db.inbox,),
    ).fetchone()
    if waiting is None:
        return None
    return next_paced_send(get_meta(db, "last_paced_send"), load_settings(db).outbox_gap)


# --- operator actions -----------------------------------------------------------------------


def change_event(
    db: Tx,
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
    row = db.execute(
        "SELECT status FROM events WHERE inbox_id = %s AND id = %s", (db.inbox, event_id)
    ).fetchone()
    before = None if row is None else row[0]
    seen = expect if expect is not None else before
    applied = before is not None and before == seen and before in allowed
    pruned = (
        applied
        and after == "pending"
        and db.one(
            "SELECT payload IS NULL FROM events WHERE inbox_id = %s AND id = %s",
            (db.inbox, event_id),
        )[0]
    )
    applied = applied and not pruned
    if applied:
        extra = ", attempts = 0, error = NULL, claim_gen = NULL" if after == "pending" else ""
        args: tuple[str, ...] = ()
        if after == "dead":
            extra, args = ", error = %s", (buried_by(actor, reason),)
        cursor = db.execute(
            f"UPDATE events SET status = %s, available_at = %s, updated = %s{extra} "
            f"WHERE inbox_id = %s AND id = %s AND status = %s",
            (after, now, now, *args, db.inbox, event_id, seen),
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
    db: Tx, flag: str, value: bool, action: str, now: int, actor: str, reason: str | None
) -> bool:
    before = bool(get_meta(db, flag))
    if before != value:
        set_meta(db, flag, value)
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
    db: Tx,
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
        "SELECT event_ids FROM runs WHERE inbox_id = %s AND id = %s AND gen = %s "
        "AND outcome IS NULL",
        (db.inbox, run_id, gen),
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
        "INSERT INTO effects(inbox_id, run_id, name, key, state, detail, intended_at, "
        "event_id) VALUES (%s, %s, %s, %s, 'intended', %s, %s, %s) "
        "ON CONFLICT (inbox_id, run_id, key) DO NOTHING",
        (db.inbox, run_id, name, key, detail, now, event),
    )
    return key


def _default_effect_key(db: Tx, run_id: int, event: int, name: str) -> str:
    """The key core/plans.py derives from what the effect is for (`effect_key`)."""
    intended = db.one(
        "SELECT count(*) FROM effects WHERE inbox_id = %s AND run_id = %s AND "
        "name = %s AND event_id = %s",
        (db.inbox, run_id, name, event),
    )[0]
    return plans.effect_key(get_meta(db, "uid"), event, name, intended)


def settle_effect(db: Tx, key: str, state: str, now: int) -> bool:
    """Record that an intended effect happened (or failed); facts are recorded unfenced."""
    # The newest intent under this key is the one being settled (older ones belong to
    # earlier, lost runs of the same events and stay as they were left).
    return (
        db.execute(
            "UPDATE effects SET state = %s, settled_at = %s WHERE id = "
            "(SELECT max(id) FROM effects WHERE inbox_id = %s AND key = %s) "
            "AND state = 'intended'",
            (state, now, db.inbox, key),
        ).rowcount
        == 1
    )


# --- reads ----------------------------------------------------------------------------------


def get_event(db: Tx, event_id: int) -> Event | None:
    row = db.execute(
        f"SELECT {EVENT_COLUMNS} FROM events WHERE inbox_id = %s AND id = %s", (db.inbox, event_id)
    ).fetchone()
    return None if row is None else event_from_row(row)


def events(
    db: Tx,
    status: str,
    limit: int,
    after: int | None,
    before: int | None,
    search: str | None,
    payload: bool = True,
) -> list[Event]:
    """A keyset page by id: ascending after `after`, or descending before `before`; without
    payloads (None) when `payload` is false, so a list never reads or decodes documents."""
    clauses, params = ["inbox_id = %s", "status = %s"], [db.inbox, status]
    if after is not None:
        clauses.append("id > %s")
        params.append(after)
    if before is not None:
        clauses.append("id < %s")
        params.append(before)
    if search:
        clauses.append(
            "(strpos(lower(source), %s) > 0 OR strpos(lower(source_id), %s) > 0 "
            "OR strpos(lower(coalesce(error, '')), %s) > 0)"
        )
        params += [search.lower()] * 3
    order = "DESC" if before is not None and after is None else "ASC"
    columns = EVENT_COLUMNS if payload else EVENT_COLUMNS.replace("payload", "NULL")
    rows = db.execute(
        f"SELECT {columns} FROM events WHERE {' AND '.join(clauses)} ORDER BY id {order} LIMIT %s",
        (*params, limit),
    )
    return [event_from_row(r) for r in rows]


def counts(db: Tx) -> dict[str, int]:
    return dict(db.execute("SELECT status, n FROM event_counts WHERE inbox_id = %s", (db.inbox,)))


def lease_info(db: Tx) -> Lease | None:
    return _lease(db)


def lease_history(db: Tx, limit: int) -> list[LeaseChange]:
    return [
        LeaseChange(*r)
        for r in db.execute(
            "SELECT gen, holder, previous_holder, at, how FROM lease_history WHERE inbox_id = %s "
            "ORDER BY gen DESC LIMIT %s",
            (db.inbox, limit),
        )
    ]


def timers(db: Tx, limit: int) -> list[Timer]:
    return [
        timer_from_row(r)
        for r in db.execute(
            f"SELECT {TIMER_COLUMNS} FROM timers WHERE inbox_id = %s ORDER BY due, id LIMIT %s",
            (db.inbox, limit),
        )
    ]


def approvals(db: Tx, limit: int) -> list[Approval]:
    """Waiting ones first (soonest deadline first), then the latest answered."""
    columns = "request_id, action, due, answer, requested, answered_at, answered_by"
    waiting = db.execute(
        f"SELECT {columns} FROM approvals WHERE inbox_id = %s AND answer IS "
        f"NULL ORDER BY due LIMIT %s",
        (db.inbox, limit),
    ).fetchall()
    answered = db.execute(
        f"SELECT {columns} FROM approvals WHERE inbox_id = %s AND answer IS "
        f"NOT NULL ORDER BY answered_at DESC LIMIT %s",
        (db.inbox, max(limit - len(waiting), 0)),
    ).fetchall()
    return [Approval(*r) for r in waiting + answered]


def held_messages(db: Tx, limit: int) -> list[Message]:
    return [
        message_from_row(r)
        for r in db.execute(
            "SELECT id, body, urgent, created, status, run_id, delivery_id FROM outbox "
            "WHERE inbox_id = %s AND status = 'held' ORDER BY id LIMIT %s",
            (db.inbox, limit),
        )
    ]


def deliveries(
    db: Tx, limit: int, now: int | None = None, ids: Sequence[int] | None = None
) -> list[Delivery]:
    """Newest first (or the given ids, oldest first); with `now`, an at-most-once delivery
    cut off mid-send shows as 'uncertain'."""
    rows = db.execute(
        "SELECT d.id, d.status, d.attempts, d.created, (SELECT count(*) FROM outbox o "
        "WHERE o.inbox_id = d.inbox_id AND o.delivery_id = d.id), d.sent_at, d.last_error, "
        "NOT d.paced, d.at_most_once, d.retry_after, d.broken FROM deliveries d "
        "WHERE d.inbox_id = %s AND (%s::bigint[] IS NULL OR d.id = ANY(%s::bigint[])) "
        f"ORDER BY d.id {'ASC' if ids is not None else 'DESC'} LIMIT %s",
        (db.inbox, None if ids is None else list(ids), None if ids is None else list(ids), limit),
    ).fetchall()
    return [delivery_from_row(r, delivery_key(db, r[0]), now) for r in rows]


def audit_entries(db: Tx, limit: int, target: str | None) -> list[AuditEntry]:
    columns = "id, at, actor, action, target, before, after, applied, reason"
    if target is None:
        rows = db.execute(
            f"SELECT {columns} FROM audit WHERE inbox_id = %s ORDER BY id DESC LIMIT %s",
            (db.inbox, limit),
        )
    else:
        rows = db.execute(
            f"SELECT {columns} FROM audit WHERE inbox_id = %s AND target = %s "
            f"ORDER BY id DESC LIMIT %s",
            (db.inbox, target, limit),
        )
    return [audit_entry_from_row(r) for r in rows]


def run_records(db: Tx, ids: Iterable[int]) -> list[Run]:
    rows = db.execute(
        "SELECT id, holder, gen, event_ids, claimed_at, finished_at, outcome, result, error, "
        "traceback FROM runs WHERE inbox_id = %s AND id = ANY(%s) ORDER BY id",
        (db.inbox, list(ids)),
    )
    return [run_from_row(r) for r in rows]


def runs_for_event(db: Tx, event_id: int) -> list[Run]:
    """Every run that claimed this event (history for the detail view)."""
    ids = [
        r[0]
        for r in db.execute(
            "SELECT run_id FROM run_events WHERE inbox_id = %s AND event_id = %s ORDER BY run_id",
            (db.inbox, event_id),
        )
    ]
    return run_records(db, ids)


def effects_for_run(db: Tx, run_ids: Sequence[int]) -> list[Effect]:
    rows = db.execute(
        "SELECT id, run_id, name, key, state, detail, intended_at, settled_at FROM effects "
        "WHERE inbox_id = %s AND run_id = ANY(%s) ORDER BY id",
        (db.inbox, list(run_ids)),
    )
    return [effect_from_row(r) for r in rows]


def overview(db: Tx, now: int) -> Overview:
    settings = load_settings(db)
    takeovers, refused, paused, outbox_held, set_aside = db.one(
        "SELECT takeovers, refused_writes, paused, outbox_held, set_aside FROM inboxes "
        "WHERE id = %s",
        (db.inbox,),
    )
    uncertain = db.one(f"SELECT count(*) FROM deliveries WHERE {_UNCERTAIN}", (db.inbox, now))[0]
    held = db.one(
        "SELECT count(*) FROM outbox WHERE inbox_id = %s AND status = 'held'", (db.inbox,)
    )[0]
    waiting = db.one(
        "SELECT count(*) FROM approvals WHERE inbox_id = %s AND answer IS NULL", (db.inbox,)
    )[0]
    timer_count = db.one("SELECT count(*) FROM timers WHERE inbox_id = %s", (db.inbox,))[0]
    runs_day = runs_since(db, now - DAY)
    pending = counts(db)
    budgets = plans.budgets(settings, runs_day, pending.get("pending", 0))
    return Overview(
        now=now,
        counts=pending,
        lease=lease_info(db),
        takeovers=takeovers,
        refused_writes=refused,
        paused=bool(paused),
        outbox_held=bool(outbox_held),
        held_messages=held,
        next_send_at=next_send_at(db) if held else None,
        next_timer_due=next_timer_due(db),
        waiting_approvals=waiting,
        runs_last_day=runs_day,
        budgets=budgets,
        timers=timer_count,
        uncertain_deliveries=uncertain,
        set_aside=set_aside,
        lease_released=_lease_released(db),
    )


def _lease_released(db: Tx) -> bool:
    gen, released = db.one("SELECT lease_gen, released_gen FROM inboxes WHERE id = %s", (db.inbox,))
    return gen is not None and released == gen


def next_wake(db: Tx, now: int) -> int | None:
    """The earliest of: next timer, next backed-off pending event, next allowed send —
    counting only what can happen then (see core/store.py: nothing while paused or held;
    events wait for the runs-per-day window)."""
    settings = load_settings(db)
    candidates = [next_timer_due(db)]
    if not get_meta(db, "paused"):
        pending = db.one(
            "SELECT min(available_at) FROM events WHERE inbox_id = %s AND status = 'pending'",
            (db.inbox,),
        )[0]
        limit = settings.max_runs_per_day
        if pending is not None and limit is not None:
            oldest_counted = db.execute(
                "SELECT claimed_at FROM runs WHERE inbox_id = %s AND claimed_at > %s "
                "ORDER BY claimed_at DESC LIMIT 1 OFFSET %s",
                (db.inbox, now - DAY, limit - 1),
            ).fetchone()
            pending = when_runs_allow(pending, oldest_counted and oldest_counted[0])
        candidates.append(pending)
    if not get_meta(db, "outbox_held"):
        candidates += [
            next_send_at(db),
            # A send that a crashed dispatcher left half-done may be retried from then on.
            db.one(
                "SELECT min(retry_after) + 1 FROM deliveries WHERE inbox_id = %s "
                "AND status = 'sending' AND NOT at_most_once",
                (db.inbox,),
            )[0],
        ]
    return earliest(candidates)


# --- only on PostgreSQL ---------------------------------------------------------------------


def change_token(db: Tx) -> tuple[int, int]:
    """The inbox's change counter: one more for every commit that changed a row of it."""
    return db.one("SELECT changes, 0 FROM inboxes WHERE id = %s", (db.inbox,))


def key_stored(db: Tx, source: str, source_id: str) -> bool:
    return (
        db.execute(
            "SELECT 1 FROM events WHERE inbox_id = %s AND source = %s AND source_id = %s",
            (db.inbox, source, source_id),
        ).fetchone()
        is not None
    )


@dataclass(frozen=True, slots=True)
class InboxSummary:
    """One row of the fleet listing."""

    name: str
    counts: dict[str, int]
    lease: Lease | None
    paused: bool
    waiting_approvals: int
    soonest_deadline: int | None  # of the waiting approvals


LIST_INBOXES = """
SELECT i.name, i.lease_holder, i.lease_gen, i.lease_until, i.paused,
       c.pending, c.running, c.done, c.dead, c.interrupted, c.cancelled,
       w.waiting, w.soonest
FROM inboxes i
CROSS JOIN LATERAL (
    SELECT coalesce(sum(n) FILTER (WHERE status = 'pending'), 0) AS pending,
           coalesce(sum(n) FILTER (WHERE status = 'running'), 0) AS running,
           coalesce(sum(n) FILTER (WHERE status = 'done'), 0) AS done,
           coalesce(sum(n) FILTER (WHERE status = 'dead'), 0) AS dead,
           coalesce(sum(n) FILTER (WHERE status = 'interrupted'), 0) AS interrupted,
           coalesce(sum(n) FILTER (WHERE status = 'cancelled'), 0) AS cancelled
    FROM event_counts WHERE inbox_id = i.id) c
CROSS JOIN LATERAL (
    SELECT count(*) AS waiting, min(due) AS soonest
    FROM approvals WHERE inbox_id = i.id AND answer IS NULL) w
WHERE i.name > %s
ORDER BY i.name
LIMIT %s
"""


def list_inboxes(conn: Any, after: str, limit: int) -> list[InboxSummary]:
    """Every inbox of the database by name (a keyset page after `after`), with its counts,
    lease and waiting approvals: one query walking the name index, two index probes a row."""
    rows = conn.execute(LIST_INBOXES, (after, limit)).fetchall()
    states = ("pending", "running", "done", "dead", "interrupted", "cancelled")
    return [
        InboxSummary(
            r[0],
            dict(zip(states, (int(n) for n in r[5:11]), strict=True)),
            None if r[1] is None else Lease(r[1], r[2], r[3]),
            bool(r[4]),
            r[11],
            r[12],
        )
        for r in rows
    ]
