"""Every connection onwatch opens to PostgreSQL, opened one way: bounded so that neither a
stalled client nor a silent server can hold an inbox for longer than a lease lasts.

- A client that stalls inside a transaction (a process stopped, a VM paused, a network cut)
  would keep its inbox's row lock for as long as the server keeps its session: for hours,
  with default TCP settings. The server ends such a session after IDLE_IN_TRANSACTION
  seconds without a statement (onwatch's transactions never wait on anything but the
  database between two statements), and notices a peer gone silent within seconds through
  TCP keepalives and a user timeout on its side.
- A server that stops answering (it accepts the connection, then nothing) is noticed on this
  side too: keepalives and a user timeout on every socket, a connect timeout, and a
  deadline on every job (core/pg/db.py cuts the socket of a job past it).

A value the URL sets itself (e.g. `?keepalives_idle=60`) is kept.
"""

from __future__ import annotations

import select
from typing import Any

import psycopg
from psycopg import conninfo, pq

from .rows import Row

CONNECT_TIMEOUT = 10  # seconds to open a connection
IDLE_IN_TRANSACTION = 3  # seconds a transaction may sit without a statement, server side
STATEMENT_TIMEOUT = 60  # seconds one statement may run, server side
# Client-side TCP: probe an idle connection after 10 s, every 5 s, 3 times; give up on data
# unacknowledged for 30 s.
CLIENT_TCP = {
    "keepalives": 1,
    "keepalives_idle": 10,
    "keepalives_interval": 5,
    "keepalives_count": 3,
    "tcp_user_timeout": 30_000,
}
# The same on the server's side of the socket (settable by any role, per session).
SERVER_SETTINGS = {
    # The engine's transactions are READ COMMITTED with one row lock, whatever a database's
    # or role's default (a stricter one fails a writer that waited for that lock, and lets
    # a batch's function read through a snapshot taken before it); its reads say their own.
    "default_transaction_isolation": "read committed",
    "idle_in_transaction_session_timeout": f"{IDLE_IN_TRANSACTION}s",
    "statement_timeout": f"{STATEMENT_TIMEOUT}s",
    "tcp_keepalives_idle": "10",
    "tcp_keepalives_interval": "5",
    "tcp_keepalives_count": "3",
    "tcp_user_timeout": "30000",
}

# A commit is acknowledged once it is durable (an ingest's answer, a webhook's 200 say so):
# a default of synchronous_commit off, where a commit is acknowledged before its WAL is
# written and a server crash loses the last ones, is raised to on for onwatch's sessions;
# every other level (local, remote_write, on, remote_apply) is the database's to choose.
DURABLE_COMMITS = (
    "set_config('synchronous_commit', CASE current_setting('synchronous_commit') "
    "WHEN 'off' THEN 'on' ELSE current_setting('synchronous_commit') END, false)"
)


# Why a server's transactions are read-only, as far as a client can tell.
READ_ONLY_SERVER = (
    "a standby server, such as a read replica, or default_transaction_read_only on for this "
    "database or role"
)


# A server's idle_session_timeout (PostgreSQL 14 and later; any role may set it for its own
# session) ends a session that waits between statements. Most of onwatch's sessions take it
# as it is meant: an inbox's session ended while idle is opened again before its next job
# (`ended_while_idle`, core/pg/db.py). A session whose work is to wait is exempt (`waits`):
# the listener's (ended, it would lose the notifications sent until it is back) and the
# fleet worker's look, whose lock tells the desk that a fleet worker is there.
IDLE_SESSION_SERVER = 140000


def connect(url: str, *, waits: bool = False, **settings: str) -> "psycopg.Connection[Row]":
    """An autocommit connection with the bounds above, plus these session `settings`;
    `waits`: a session idle by design, exempt from the server's idle_session_timeout."""
    given = conninfo.conninfo_to_dict(url)
    options: dict[str, Any] = {k: v for k, v in CLIENT_TCP.items() if k not in given}
    if "connect_timeout" not in given:
        options["connect_timeout"] = CONNECT_TIMEOUT
    # Text crosses as UTF-8 whatever the database's or the role's default client encoding
    # (psycopg encodes every string, onwatch's own statements included, in that encoding).
    conn = psycopg.connect(url, autocommit=True, client_encoding="UTF8", **options)
    encoding = conn.info.parameter_status("server_encoding")  # sent with the greeting
    if encoding != "UTF8":
        conn.close()
        raise psycopg.NotSupportedError(
            f"the database's encoding is {encoding}, and onwatch stores its text as UTF-8 "
            f"(payloads, keys and errors in any language); use a database created with "
            f"ENCODING 'UTF8'"
        )
    session = {**SERVER_SETTINGS, **settings}
    if waits and conn.info.server_version >= IDLE_SESSION_SERVER:
        session["idle_session_timeout"] = "0"
    try:
        # set_config, not SET: each name and value is a parameter, never SQL text; all of
        # them in one statement, one round trip (a fleet opens a connection per inbox).
        calls = ", ".join(["set_config(%s, %s, false)"] * len(session))
        calls += f", {DURABLE_COMMITS}, current_setting('session_replication_role')"
        row = conn.execute(
            f"SELECT {calls}", [part for pair in session.items() for part in pair]
        ).fetchone()
        if row is not None and row[-1] == "replica":
            _fire_triggers(conn)
    except BaseException:
        conn.close()
        raise
    return conn


def _fire_triggers(conn: "psycopg.Connection[Row]") -> None:
    """A session whose role or database says session_replication_role = replica (a
    replication apply worker's mode, a bulk load's) fires no ordinary trigger and checks no
    foreign key: onwatch's event counts, its wake-ups and the guard on an inbox's row would
    silently stop. Take `origin` back for this session, or refuse where the role may not."""
    try:
        conn.execute("SELECT set_config('session_replication_role', 'origin', false)")
    except psycopg.errors.InsufficientPrivilege:
        raise psycopg.NotSupportedError(
            "this role's or database's session_replication_role is replica, under which "
            "PostgreSQL fires none of onwatch's triggers (its event counts, its wake-ups), "
            "and this role may not set it back; reset it for this role or database "
            "(ALTER ROLE … RESET session_replication_role)"
        ) from None


# What a server says (in English, its messages' usual language) when it turns a connection
# away for now because it is at a connection cap (SQLSTATE 53300, of the server, a database
# or a role): a ping calls such a server up, and a failed connection's error carries no
# SQLSTATE, so its words are all there is to tell it from a refusal for good.
AT_CAPACITY = ("too many connections", "too many clients", "connection slots are reserved")


def not_yet(exc: BaseException, url: str) -> str | None:
    """After a connection to `url` failed with `exc`: why another try later may succeed (the
    server is at a connection cap; it does not answer: down, starting up, shutting down or
    out of reach), or None when a server that answers refused this database, role or
    password, which will not change by itself."""
    if any(words in str(exc) for words in AT_CAPACITY):
        return "the server is at a connection limit"
    target = conninfo.make_conninfo(url, connect_timeout=CONNECT_TIMEOUT)
    if pq.PGconn.ping(target.encode()) != pq.Ping.OK:
        return "the server does not answer: down, starting up or out of reach"
    return None


def ended_while_idle(conn: "psycopg.Connection[Row]") -> bool:
    """Whether the server ended this idle session since it was last used: it says why
    (idle_session_timeout, a terminated backend, a restart) and closes, so the socket is
    readable while nothing was asked. One poll without waiting. The caller opens a new
    session where sending on this one would fail as a lost connection with nothing lost.
    (A socket readable for another reason, a notice, keeps its session.)"""
    try:
        fd = conn.pgconn.socket
        for _ in range(3):  # what the server said, then its end (libpq raises at the end)
            if not select.select([fd], [], [], 0)[0]:
                return False
            conn.pgconn.consume_input()
    except (OSError, ValueError, psycopg.OperationalError):
        return True
    return conn.pgconn.status != pq.ConnStatus.OK
