"""The PostgreSQL backend: one database holds many inboxes (needs psycopg 3)."""

from typing import TypeGuard
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

URL_PREFIXES = ("postgresql://", "postgres://")

# A fleet worker (core/pg/fleet.py) looks at least this often (seconds), whatever its poll
# interval: its look is what tells the desk (core/pg/summaries.py) that it is alive. A
# connected fleet worker whose session has been idle for SILENT_AFTER (three looks missed)
# is counted silent, not serving: stopped (SIGSTOP, a debugger), or its event loop blocked.
# Its session, and the lock that says it is connected, live on regardless.
LOOK_AT_LEAST_EVERY = 10.0
SILENT_AFTER = 3 * LOOK_AT_LEAST_EVERY


def is_url(target: object) -> TypeGuard[str]:
    """Whether an `Inbox.open` target names a PostgreSQL database rather than a file."""
    return isinstance(target, str) and target.startswith(URL_PREFIXES)


SECRET_PARAMETERS = ("password", "sslpassword")  # what the driver takes in a URL's query


def redact(url: str) -> str:
    """The URL without its passwords (in the user part or in the query), for messages and
    `Inbox.path`. (A password from $PGPASSWORD or a service file is never in the URL.)"""
    try:
        parts = urlsplit(url)
        password = parts.password
    except ValueError:  # not a URL urlsplit can take apart: show only its scheme
        return url.split(":", 1)[0] + "://***"
    if password is not None:
        netloc = parts.netloc.rsplit("@", 1)[1]
        user = parts.username or ""
        parts = parts._replace(netloc=f"{user}:***@{netloc}" if user else netloc)
    if parts.query:
        pairs = parse_qsl(parts.query, keep_blank_values=True)
        if any(key.lower() in SECRET_PARAMETERS for key, _ in pairs):
            shown = [(k, "***" if k.lower() in SECRET_PARAMETERS else v) for k, v in pairs]
            parts = parts._replace(query=urlencode(shown, safe="*"))
    return urlunsplit(parts)


def said(exc: BaseException) -> str:
    """What a driver's error says, on one line: its first (libpq adds hint lines, which
    would break a log record in several)."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
