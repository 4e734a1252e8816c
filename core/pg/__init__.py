"""The PostgreSQL backend: one database holds many inboxes (needs psycopg 3)."""

from typing import TypeGuard
from urllib.parse import urlsplit, urlunsplit

URL_PREFIXES = ("postgresql://", "postgres://")


def is_url(target: object) -> TypeGuard[str]:
    """Whether an `Inbox.open` target names a PostgreSQL database rather than a file."""
    return isinstance(target, str) and target.startswith(URL_PREFIXES)


def redact(url: str) -> str:
    """The URL without its password, for messages and `Inbox.path`."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.rsplit("@", 1)[1]
    user = parts.username or ""
    return urlunsplit(parts._replace(netloc=f"{user}:***@{netloc}" if user else netloc))
