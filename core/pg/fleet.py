"""The whole database at once: every inbox with its counts, lease and waiting approvals."""

from __future__ import annotations

import asyncio

import psycopg

from ..errors import InboxError
from . import schema
from .db import redact
from .store import InboxSummary, list_inboxes as _list_inboxes

__all__ = ["InboxSummary", "list_inboxes"]


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
