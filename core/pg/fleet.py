"""The whole database at once: the inboxes with work for the fleet worker
(core/runtime/fleet_worker.py). (The fleet desk's listing is core/pg/summaries.py.)"""

from __future__ import annotations


import psycopg

from .connect import connect


__all__ = ["Looker"]


# Inboxes with work that nobody else holds: a pending event that is due, a due timer, or a
# claim left running under a lapsed lease (the next claim recovers it). Shuffled, so that
# several fleet workers starting at once spread over the fleet instead of all asking for the
# same inboxes first (the lease decides anyway).
WITH_WORK = """
SELECT i.name FROM inboxes i
WHERE NOT i.paused
  AND (i.lease_until IS NULL OR i.lease_until < %(now)s OR i.lease_holder = %(holder)s)
  AND (EXISTS (SELECT 1 FROM events e WHERE e.inbox_id = i.id AND e.status = 'pending'
               AND e.available_at <= %(now)s)
       OR EXISTS (SELECT 1 FROM timers t WHERE t.inbox_id = i.id AND t.due <= %(now)s)
       OR (i.lease_until < %(now)s AND EXISTS (SELECT 1 FROM events e WHERE
           e.inbox_id = i.id AND e.status = 'running')))
ORDER BY random()
LIMIT %(limit)s
"""


class Looker:
    """The fleet's look for inboxes with work, on one connection kept between looks (a new
    connection is a new server process each time); reopened after it broke."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.conn: psycopg.Connection | None = None

    def with_work(self, holder: str, now: int, limit: int) -> list[str]:
        conn = self.conn
        if conn is None or conn.closed or conn.broken:
            conn = self.conn = connect(self.url)
        try:
            return [
                r[0]
                for r in conn.execute(WITH_WORK, {"now": now, "holder": holder, "limit": limit})
            ]
        except psycopg.Error:
            conn.close()
            raise

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
