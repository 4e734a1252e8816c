"""The whole database at once: every inbox with its counts, lease and waiting approvals, and
the inboxes with work for the fleet worker (core/runtime/fleet_worker.py)."""

from __future__ import annotations

import asyncio

import psycopg

from ..errors import InboxError
from . import redact, schema
from .store import InboxSummary, list_inboxes as _list_inboxes

__all__ = ["InboxSummary", "Looker", "list_inboxes"]


async def list_inboxes(url: str, *, after: str = "", limit: int = 1000) -> list[InboxSummary]:
    """A page of the database's inboxes by name, after `after`: one indexed query (the fleet
    desk's listing). Raises NotAnInbox for a database that is not an onwatch database."""

    def read() -> list[InboxSummary]:
        try:
            with psycopg.connect(url, autocommit=True, connect_timeout=10) as conn:
                if schema.inspect(conn, redact(url)) == 0:
                    return []
                return _list_inboxes(conn, after, limit)
        except psycopg.Error as exc:
            raise InboxError(f"{redact(url)}: {str(exc).strip()}") from None

    return await asyncio.to_thread(read)


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
            conn = self.conn = psycopg.connect(self.url, autocommit=True, connect_timeout=10)
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
