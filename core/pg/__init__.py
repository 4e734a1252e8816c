"""The PostgreSQL backend: one database holds many inboxes (needs psycopg 3)."""

from typing import TypeGuard

URL_PREFIXES = ("postgresql://", "postgres://")


def is_url(target: object) -> TypeGuard[str]:
    """Whether an `Inbox.open` target names a PostgreSQL database rather than a file."""
    return isinstance(target, str) and target.startswith(URL_PREFIXES)
