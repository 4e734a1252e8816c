"""The reference inbox: the plain synchronous `inbox.py` a design article would show.

This is what the issue's speed targets are measured against. It is a straightforward,
honest durable inbox on one SQLite file with the standard library's `sqlite3`, used
synchronously on the caller's thread:

* WAL journal, `synchronous = FULL` (a commit is fsynced before it returns), the same busy
  timeout as the engine;
* one transaction per call, committed before the call returns (one per event for ingest);
* its own small schema: `events` with UNIQUE(source, source_id) and an index for the claim,
  a one-row `lease`, `timers` (one-shot or recurring), an `outbox`;
* plain SQL: ingest is `INSERT … ON CONFLICT DO NOTHING`; a claim checks the lease and marks
  the oldest pending events running with `UPDATE … RETURNING`; a finish checks the lease,
  marks the events done and queues the reply in the outbox; the scheduler pass selects the
  due timers and, per timer, inserts one event (the timer's payload decoded and wrapped in
  the occurrence) and advances or deletes the timer; a dispatch marks the held messages
  sending in one transaction, sends them joined, and marks them sent in a second one.

It writes the same rows per call as the engine does for the same workload (one event per
ingest or per due timer, one outbox row per reply, the timer advanced or removed), with the
same fsync policy. What it does not do, and the engine does on top:

* no event loop, no thread hand-off, no group commit (the caller's thread waits on fsyncs);
* no validation of its arguments (sizes, depth, reserved names, Unicode), no budgets;
* no run history (runs, run_events), lease history, audit rows, state counts kept by
  triggers, attempt limits, lost-claim recovery, back-off, pause, effect journal;
* no delivery records or idempotency keys, no pacing, no at-most-once mode;
* no catch-up policy for recurring timers (a late recurring timer fires once and moves on);
* no setting aside of a row it cannot process: a stored payload that is not JSON makes
  its scheduler pass raise and roll back.
"""

from __future__ import annotations

import json
import sqlite3
from typing import Any, Callable

SCHEMA = """
CREATE TABLE IF NOT EXISTS events (
    id INTEGER PRIMARY KEY,
    source TEXT NOT NULL,
    source_id TEXT NOT NULL,
    payload TEXT,
    status TEXT NOT NULL DEFAULT 'pending',
    attempts INTEGER NOT NULL DEFAULT 0,
    claim_gen INTEGER,
    available_at INTEGER NOT NULL,
    created INTEGER NOT NULL,
    updated INTEGER NOT NULL,
    UNIQUE (source, source_id)
);
CREATE INDEX IF NOT EXISTS events_by_status ON events(status, id);
CREATE TABLE IF NOT EXISTS lease (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    holder TEXT NOT NULL,
    gen INTEGER NOT NULL,
    until INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS timers (
    id TEXT PRIMARY KEY,
    due INTEGER NOT NULL,
    every INTEGER,
    payload TEXT
);
CREATE INDEX IF NOT EXISTS timers_by_due ON timers(due);
CREATE TABLE IF NOT EXISTS outbox (
    id INTEGER PRIMARY KEY,
    body TEXT NOT NULL,
    status TEXT NOT NULL DEFAULT 'held',
    created INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS outbox_by_status ON outbox(status, id);
"""

LEASE_TTL = 60
BATCH = 10


class ReferenceInbox:
    """One connection, autocommit mode; every method is one committed transaction."""

    def __init__(self, path: str, *, busy_timeout: float = 5.0) -> None:
        self.db = sqlite3.connect(path, isolation_level=None)
        self.db.execute(f"PRAGMA busy_timeout = {int(busy_timeout * 1000)}")
        self.db.execute("PRAGMA journal_mode = WAL")
        self.db.execute("PRAGMA synchronous = FULL")
        self.db.executescript(SCHEMA)

    def close(self) -> None:
        self.db.close()

    def __enter__(self) -> "ReferenceInbox":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _transaction(self, fn: Callable[[], Any]) -> Any:
        self.db.execute("BEGIN IMMEDIATE")
        try:
            result = fn()
        except BaseException:
            self.db.execute("ROLLBACK")
            raise
        self.db.execute("COMMIT")
        return result

    # --- intake ------------------------------------------------------------------------------

    def ingest(self, source: str, source_id: str, payload: Any, now: int) -> bool:
        """Store an event unless its key is known; True if it was new. One statement in
        autocommit mode: its own transaction, committed (fsynced) before returning."""
        cursor = self.db.execute(
            "INSERT INTO events(source, source_id, payload, available_at, created, updated) "
            "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT(source, source_id) DO NOTHING",
            (source, source_id, json.dumps(payload), now, now, now),
        )
        return cursor.rowcount == 1

    # --- lease, claim, finish ----------------------------------------------------------------

    def acquire(self, holder: str, now: int) -> int | None:
        """Renew our unexpired lease, take over an expired one (next generation), or None."""

        def tx() -> int | None:
            row = self.db.execute("SELECT holder, gen, until FROM lease WHERE id = 1").fetchone()
            if row is None:
                self.db.execute(
                    "INSERT INTO lease(id, holder, gen, until) VALUES (1, ?, 1, ?)",
                    (holder, now + LEASE_TTL),
                )
                return 1
            current, gen, until = row
            if until >= now and current != holder:
                return None
            if until < now:
                gen += 1
            self.db.execute(
                "UPDATE lease SET holder = ?, gen = ?, until = ? WHERE id = 1",
                (holder, gen, now + LEASE_TTL),
            )
            return gen

        return self._transaction(tx)

    def _holds(self, holder: str, gen: int, now: int) -> bool:
        row = self.db.execute("SELECT holder, gen, until FROM lease WHERE id = 1").fetchone()
        return row is not None and row[0] == holder and row[1] == gen and row[2] >= now

    def claim(self, holder: str, gen: int, now: int) -> list[tuple[int, str, str, Any]]:
        """Mark the oldest pending events running for this lease generation; return them."""

        def tx() -> list[tuple[int, str, str, Any]]:
            if not self._holds(holder, gen, now):
                return []
            rows = self.db.execute(
                "UPDATE events SET status = 'running', attempts = attempts + 1, claim_gen = ?, "
                "updated = ? WHERE id IN (SELECT id FROM events WHERE status = 'pending' AND "
                "available_at <= ? ORDER BY id LIMIT ?) "
                "RETURNING id, source, source_id, payload",
                (gen, now, now, BATCH),
            ).fetchall()
            return sorted((r[0], r[1], r[2], json.loads(r[3])) for r in rows)

        return self._transaction(tx)

    def finish(self, holder: str, gen: int, ids: list[int], replies: list[str], now: int) -> bool:
        """Mark claimed events done and queue the replies, fenced by the lease generation."""

        def tx() -> bool:
            if not self._holds(holder, gen, now):
                return False
            marks = ",".join("?" * len(ids))
            done = self.db.execute(
                f"UPDATE events SET status = 'done', updated = ? WHERE id IN ({marks}) "
                f"AND status = 'running' AND claim_gen = ?",
                (now, *ids, gen),
            ).rowcount
            if not done:
                return False
            for body in replies:
                self.db.execute("INSERT INTO outbox(body, created) VALUES (?, ?)", (body, now))
            return True

        return self._transaction(tx)

    # --- timers ------------------------------------------------------------------------------

    def add_timer(self, timer_id: str, due: int, payload: Any, every: int | None = None) -> None:
        self.db.execute(
            "INSERT INTO timers(id, due, every, payload) VALUES (?, ?, ?, ?) "
            "ON CONFLICT(id) DO UPDATE SET due = excluded.due, every = excluded.every, "
            "payload = excluded.payload",
            (timer_id, due, every, json.dumps(payload)),
        )

    def run_scheduler(self, now: int) -> int:
        """One transaction: each due timer becomes one event, then is advanced or removed."""

        def tx() -> int:
            due = self.db.execute(
                "SELECT id, due, every, payload FROM timers WHERE due <= ? ORDER BY due, id", (now,)
            ).fetchall()
            for timer_id, when, every, payload in due:
                occurrence = {
                    "timer": timer_id,
                    "scheduled_for": when,
                    "late_by": now - when,
                    "data": json.loads(payload),
                }
                self.db.execute(
                    "INSERT INTO events(source, source_id, payload, available_at, created, "
                    "updated) VALUES ('timer', ?, ?, ?, ?, ?) "
                    "ON CONFLICT(source, source_id) DO NOTHING",
                    (f"{timer_id}@{when}", json.dumps(occurrence), now, now, now),
                )
                if every is None:
                    self.db.execute("DELETE FROM timers WHERE id = ?", (timer_id,))
                else:
                    self.db.execute(
                        "UPDATE timers SET due = ? WHERE id = ?",
                        (when + ((now - when) // every + 1) * every, timer_id),
                    )
            return len(due)

        return self._transaction(tx)

    # --- outbox ------------------------------------------------------------------------------

    def dispatch(self, send: Callable[[str], Any]) -> int:
        """Send every held message as one text; mark them sent if the send returned."""
        picked = self._transaction(
            lambda: self.db.execute(
                "UPDATE outbox SET status = 'sending' WHERE status = 'held' RETURNING id, body"
            ).fetchall()
        )
        if not picked:
            return 0
        picked.sort()
        send("\n\n".join(body for _, body in picked))
        self._transaction(
            lambda: self.db.execute("UPDATE outbox SET status = 'sent' WHERE status = 'sending'")
        )
        return len(picked)

    # --- reads (the benchmark's self-checks) -------------------------------------------------

    def count(self, status: str) -> int:
        return self.db.execute(
            "SELECT count(*) FROM events WHERE status = ?", (status,)
        ).fetchone()[0]

    def held(self) -> int:
        return self.db.execute("SELECT count(*) FROM outbox WHERE status = 'held'").fetchone()[0]
