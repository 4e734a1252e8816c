"""The whole database at once: the inboxes with work for the fleet worker
(core/runtime/fleet_worker.py), and the check that the database is one it can serve. (The
fleet desk's listing is core/pg/summaries.py.)"""

from __future__ import annotations

import time
from dataclasses import dataclass

import psycopg

from ..errors import InboxError, NotAnInbox
from ..settings import Settings
from . import redact, schema
from .connect import READ_ONLY_SERVER, connect, not_yet
from .tx import held_open

__all__ = ["Looker", "Candidate", "Unreachable", "WITH_WORK", "FLEET_WORKER_LOCK"]

# Every fleet worker holds this advisory lock, shared, on its look's connection for as long
# as that connection lives: a process that ends, or is killed, lets go of it with its
# session. The fleet desk counts its holders (core/pg/summaries.py), so that an inbox
# between two of a fleet worker's visits is not taken for one that nobody serves. Any fixed
# number below 2**31 (pg_locks then shows it whole in `objid`), apart from schema.py's.
FLEET_WORKER_LOCK = 0x6F6E7766

# One setting read from the stored JSON text without decoding it: the engine writes it as
# json.dumps does ("name": 123). A value written otherwise by hand is not matched, and the
# engine then falls back to the default as well (Settings.from_json); a mismatch left over
# only costs the fleet one visit that finds nothing, then a rest (fleet_worker.py).
_SETTING = "substring(i.settings FROM '\"{name}\": ([0-9]{{1,18}})')::bigint"
_RUNS_PER_DAY = _SETTING.format(name="max_runs_per_day")
# The default, no budget, told without the regular expression (which cost 14 µs an inbox,
# most of a look's time): the engine writes it so, and a JSON string value cannot contain
# it (its quotes would be escaped).
_NO_RUNS_BUDGET = "strpos(i.settings, '\"max_runs_per_day\": null') > 0"
_OUTBOX_GAP = f"coalesce({_SETTING.format(name='outbox_gap')}, {Settings().outbox_gap})"

# Inboxes with work that nobody holds, exactly what a visit can then do (docs/rules.md):
# - an available pending event, unless paused or the runs-per-day budget is used up (the
#   claim would return nothing);
# - a due timer the scheduler has not set aside (a set-aside one never fires);
# - a claim left running under a lapsed lease (the next claim recovers it);
# - with a channel to send on: a send that is due (a held message once the outbox's gap
#   has passed, an urgent one at once) or a delivery waiting for its retry (a failed send,
#   or one a crashed dispatcher left unreported past send_timeout), unless the outbox is
#   held.
# A live lease is never returned, not even one under this holder's name: a live
# generation of this process is the fleet's to remember, one of another process under the
# same name is not ours to continue.
#
# Least recently served first: an inbox's place is when its last lease ended (released
# or lapsed; an inbox never served comes first), so a busy inbox that has just given its
# slot back waits behind every inbox that has been waiting longer. Ties are shuffled, so
# that fleet workers starting together spread over the fleet. `resting` names inboxes
# this process visited and found nothing to do in; they are left out while their change
# counter is where it was (fleet_worker.py decides when else a rest ends).
WITH_WORK = f"""
WITH clock AS (SELECT extract(epoch FROM clock_timestamp()) AS exact,
                      extract(epoch FROM clock_timestamp())::bigint AS now),
found AS (
SELECT i.name, i.changes, coalesce(i.lease_until + 1, 0) AS since, random() AS shuffled
FROM clock, inboxes i
LEFT JOIN unnest(%(resting)b::text[], %(resting_changes)b::bigint[]) AS r(name, changes)
       ON r.name = i.name
WHERE (i.lease_until IS NULL OR i.lease_until < clock.now)
  AND NOT (i.name = ANY(%(taken)b::text[]))
  AND (r.name IS NULL OR r.changes <> i.changes)
  AND ((NOT i.paused
        AND EXISTS (SELECT 1 FROM events e WHERE e.inbox_id = i.id AND e.status = 'pending'
                    AND e.available_at <= clock.now)
        AND ({_NO_RUNS_BUDGET} OR {_RUNS_PER_DAY} IS NULL
             OR NOT EXISTS (SELECT 1 FROM runs u WHERE u.inbox_id = i.id
                            AND u.claimed_at > clock.now - 86400
                            ORDER BY u.claimed_at DESC
                            OFFSET greatest({_RUNS_PER_DAY} - 1, 0) LIMIT 1)))
       OR EXISTS (SELECT 1 FROM timers t WHERE t.inbox_id = i.id AND t.due <= clock.now
                  AND t.broken IS NULL)
       OR (i.lease_until IS NOT NULL
           AND EXISTS (SELECT 1 FROM events e WHERE e.inbox_id = i.id
                       AND e.status = 'running'))
       OR (%(sends)s AND NOT i.outbox_held
           AND (EXISTS (SELECT 1 FROM deliveries d WHERE d.inbox_id = i.id
                        AND d.status IN ('sending', 'failed') AND NOT d.at_most_once
                        AND (d.status = 'failed' OR d.retry_after < clock.now))
                OR EXISTS (SELECT 1 FROM outbox o WHERE o.inbox_id = i.id
                           AND o.status = 'held' AND o.delivery_id IS NULL
                           AND (o.urgent OR i.last_paced_send IS NULL
                                OR clock.now >= i.last_paced_send + {_OUTBOX_GAP})))))
ORDER BY since, shuffled
LIMIT %(limit)s)
SELECT clock.exact, found.name, found.changes, found.since
FROM clock LEFT JOIN found ON true
ORDER BY found.since, found.shuffled
"""

# The privileges a worker uses on every table (and its id's sequence; the schema's version
# it only reads): a role short of one would fail at its first write there, inbox after inbox.
_MISSING_PRIVILEGES = """
SELECT c.relname FROM pg_class c
WHERE c.relnamespace = current_schema()::regnamespace
  AND ((c.relkind = 'r' AND c.relname = ANY(%(tables)b::text[])
        AND NOT (has_table_privilege(c.oid, 'SELECT')
                 AND (c.relname = 'onwatch_schema'  -- only read, once migrated
                      OR (has_table_privilege(c.oid, 'INSERT')
                          AND has_table_privilege(c.oid, 'UPDATE')
                          AND has_table_privilege(c.oid, 'DELETE')))))
       OR (c.relkind = 'S' AND split_part(c.relname, '_', 1) = ANY(%(tables)b::text[])
           AND NOT has_sequence_privilege(c.oid, 'USAGE')))
ORDER BY 1
"""


class Unreachable(InboxError):
    """The server did not answer, or answered that it accepts no connections now (starting,
    stopping, recovering, at a connection limit): worth another try, unlike a server that
    refused this database or this role."""


@dataclass(frozen=True, slots=True)
class Candidate:
    """An inbox with work: its name, its change counter, and its place in the queue (the
    server's time its last lease ended; 0 for one never served)."""

    name: str
    changes: int
    since: int


class Looker:
    """The fleet's look for inboxes with work, on one connection kept between looks (a new
    connection is a new server process each time); reopened after it broke. The connection
    holds FLEET_WORKER_LOCK: this process is a fleet worker of the database while it lives."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.where = redact(url)
        self.conn: psycopg.Connection | None = None
        self.offset = 0.0  # the server's clock minus this process's, as last read

    def now(self) -> float:
        """The server's time as this process last knew it (seconds)."""
        return time.time() + self.offset

    def check(self) -> None:
        """Refuse, with the single-inbox worker's words, what the fleet cannot serve: a
        database that cannot be reached (InboxError), one that is not onwatch's, empty or
        of a newer schema (NotAnInbox), a role short of privileges (InboxError). An older
        schema is migrated, as a worker of this release does for its inbox."""
        try:
            conn = self._connection()
        except psycopg.Error as exc:
            message = f"cannot connect to {self.where}: {str(exc).strip()}"
            if not_yet(exc, self.url) is None:
                raise InboxError(message) from None
            raise Unreachable(message) from None
        try:
            version = schema.inspect(conn, self.where)
            if version < schema.SCHEMA_VERSION:
                if schema.migrate(conn, self.where, create=False) == 0:
                    raise NotAnInbox(
                        f"no onwatch database at {self.where} (run `onwatch init "
                        f"{self.where} --inbox NAME` to create one)"
                    )
            tables = {"tables": list(schema.TABLES)}
            missing = [r[0] for r in conn.execute(_MISSING_PRIVILEGES, tables)]
            server = conn.execute(
                "SELECT extract(epoch FROM clock_timestamp()), "
                "current_setting('transaction_read_only') = 'on'"
            ).fetchone()
            self.offset = float(server[0]) - time.time() if server else 0.0
        except psycopg.Error as exc:
            self.close()
            raise InboxError(f"cannot serve {self.where}: {str(exc).strip()}") from None
        if server is not None and server[1]:
            self.close()
            raise InboxError(
                f"cannot serve {self.where}: its transactions are read-only "
                f"({READ_ONLY_SERVER}); a worker must write"
            )
        if missing:
            user = conn.info.user
            raise InboxError(
                f"cannot serve {self.where}: role {user!r} lacks privileges on "
                f"{', '.join(missing)}; a worker needs SELECT, INSERT, UPDATE and DELETE "
                f"on every onwatch table and USAGE on their sequences"
            )

    def with_work(
        self,
        limit: int,
        *,
        taken: list[str],
        resting: dict[str, int],
        sends: bool,
    ) -> list[Candidate]:
        """Up to `limit` inboxes with work, least recently served first; `taken` (served or
        held by this process) and `resting` (name → its change counter when its rest
        began) left out."""
        conn = self._connection()
        try:
            rows = conn.execute(
                WITH_WORK,
                {
                    "limit": limit,
                    "taken": taken,
                    "resting": list(resting),
                    "resting_changes": list(resting.values()),
                    "sends": sends,
                },
            ).fetchall()
        except psycopg.Error:
            conn.close()
            raise
        # The server's clock comes with every look (one row even when none has work).
        self.offset = float(rows[0][0]) - time.time()
        return [Candidate(name, changes, since) for _, name, changes, since in rows if name]

    def held_back(self) -> str | None:
        """Inbox.held_back for the whole database (None also when it cannot be asked now:
        the next look says why)."""
        try:
            return held_open(self._connection().execute)
        except psycopg.Error:
            return None

    def _connection(self) -> psycopg.Connection:
        conn = self.conn
        if conn is None or conn.closed or conn.broken:
            conn = connect(self.url, waits=True)
            try:
                conn.execute("SELECT pg_advisory_lock_shared(%s)", (FLEET_WORKER_LOCK,))
            except BaseException:
                conn.close()
                raise
            self.conn = conn
        return conn

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
