"""The fleet desk's reading of a database: which inboxes changed, and their summaries.

Two queries, both on one connection the desk keeps: `changes` lists every inbox with its
change counter (a walk of the small `inboxes` table), and `summaries` reads the full summary
of the inboxes whose counter moved — counts, lease, waiting approvals (the soonest ones with
their action text), the last run, the runs of the last hour, the outbox, the oldest pending
event and the soonest timer — in one statement with an index probe per figure, so a thousand
inboxes cost one round trip, not a thousand connections. The shape of each row is
`core.fleet.InboxSummary`'s.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

from . import SILENT_AFTER
from .fleet import FLEET_WORKER_LOCK
from .rows import Row, one

if TYPE_CHECKING:
    import psycopg

CHANGES = "SELECT id, name, changes FROM inboxes"

# The fleet workers connected to this database: each holds FLEET_WORKER_LOCK, shared
# (pg_locks lists every session's locks to every role); those whose session has been idle
# for `silent` seconds, counted apart. pg_stat_activity shows another role's sessions'
# state only to a member of pg_read_all_stats: a session whose state cannot be read counts
# as serving, as every connected one did before.
FLEET_WORKERS = """
SELECT count(*) FILTER (WHERE NOT w.silent), count(*) FILTER (WHERE w.silent)
FROM (SELECT coalesce(a.state = 'idle'
                      AND a.state_change < clock_timestamp() - make_interval(secs => %(silent)s),
                      false) AS silent
      FROM pg_locks AS l LEFT JOIN pg_stat_activity AS a ON a.pid = l.pid
      WHERE l.locktype = 'advisory' AND l.granted AND l.classid = 0 AND l.objsubid = 1
        AND l.objid::bigint = %(key)s
        AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
     ) AS w
"""

SUMMARIES = """
SELECT i.id, i.name, i.changes, i.lease_holder, i.lease_gen, i.lease_until, i.released_gen,
       i.paused, i.outbox_held, i.settings, i.last_paced_send,
       c.pending, c.running, c.dead, c.interrupted, w.waiting, a.list,
       r.claimed_at, r.finished_at, r.outcome, act.list, o.held, o.undelivered,
       (SELECT created FROM events WHERE inbox_id = i.id AND status = 'pending'
        ORDER BY id LIMIT 1) AS oldest_pending,
       (SELECT min(due) FROM timers WHERE inbox_id = i.id AND broken IS NULL)
           AS next_timer_due
FROM inboxes i
CROSS JOIN LATERAL (
    SELECT coalesce(sum(n) FILTER (WHERE status = 'pending'), 0) AS pending,
           coalesce(sum(n) FILTER (WHERE status = 'running'), 0) AS running,
           coalesce(sum(n) FILTER (WHERE status = 'dead'), 0) AS dead,
           coalesce(sum(n) FILTER (WHERE status = 'interrupted'), 0) AS interrupted
    FROM event_counts WHERE inbox_id = i.id) c
CROSS JOIN LATERAL (
    SELECT count(*) AS waiting FROM approvals WHERE inbox_id = i.id AND answer IS NULL) w
CROSS JOIN LATERAL (
    SELECT coalesce(json_agg(json_build_array(request_id, action, due, requested)
                             ORDER BY due, request_id), '[]') AS list
    FROM (SELECT request_id, substr(action, 1, %(chars)s) AS action, due, requested
          FROM approvals WHERE inbox_id = i.id AND answer IS NULL
          ORDER BY due, request_id LIMIT %(shown)s) x) a
LEFT JOIN LATERAL (
    SELECT claimed_at, finished_at, outcome FROM runs WHERE inbox_id = i.id
    ORDER BY claimed_at DESC, id DESC LIMIT 1) r ON true
CROSS JOIN LATERAL (
    SELECT coalesce(json_agg(json_build_array(minute, n, failed) ORDER BY minute), '[]')
           AS list
    FROM (SELECT claimed_at / 60 AS minute, count(*) AS n,
                 count(*) FILTER (WHERE outcome IN ('error', 'lost')) AS failed
          FROM runs WHERE inbox_id = i.id AND claimed_at > %(since)s GROUP BY 1) y) act
CROSS JOIN LATERAL (
    SELECT count(*) AS held, count(*) FILTER (WHERE delivery_id IS NULL) AS undelivered
    FROM outbox WHERE inbox_id = i.id AND status = 'held') o
WHERE i.id = ANY(%(ids)s)
"""


def fleet_workers(conn: psycopg.Connection[Row]) -> tuple[int, int]:
    """How many fleet workers (`onwatch worker URL --all-inboxes`) are connected now:
    (serving, silent), silent being those that have not looked for SILENT_AFTER seconds."""
    serving, silent = one(
        conn.execute(FLEET_WORKERS, {"key": FLEET_WORKER_LOCK, "silent": SILENT_AFTER})
    )
    return int(serving), int(silent)


def changes(conn: psycopg.Connection[Row]) -> list[tuple[int, str, int]]:
    """Every inbox of the database: (id, name, change counter)."""
    return [(int(r[0]), r[1], int(r[2])) for r in conn.execute(CHANGES).fetchall()]


def summaries(
    conn: psycopg.Connection[Row], ids: Sequence[int], since: int, shown: int, chars: int
) -> list[Row]:
    """The summary rows of inboxes `ids` (see SUMMARIES for the columns), runs counted
    after `since`, the `shown` soonest waiting approvals with `chars` of their action."""
    return conn.execute(
        SUMMARIES, {"ids": list(ids), "since": since, "shown": shown, "chars": chars}
    ).fetchall()


SPEND = """
SELECT inbox_id, unit, sum(micros) FROM spend
WHERE inbox_id = ANY(%(ids)s) AND at > %(since)s GROUP BY 1, 2
"""


def spend(
    conn: psycopg.Connection[Row], ids: Sequence[int], since: int
) -> dict[int, list[tuple[str, int]]]:
    """What inboxes `ids` spent after `since`, per unit: {inbox id: [(unit, millionths)]};
    nothing from a database of an older schema, which has no spend table yet (a reader
    never migrates)."""
    found: dict[int, list[tuple[str, int]]] = {}
    if not one(conn.execute("SELECT to_regclass('spend') IS NOT NULL"))[0]:
        return found
    for inbox_id, unit, micros in conn.execute(SPEND, {"ids": list(ids), "since": since}):
        found.setdefault(int(inbox_id), []).append((str(unit), int(micros)))
    return found
