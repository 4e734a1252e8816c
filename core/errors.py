"""The one error hierarchy of the inbox engine, rooted at InboxError."""

from __future__ import annotations


class InboxError(Exception):
    """Anything the inbox refuses or cannot do; the message is meant for a person."""


class BadInput(InboxError, ValueError):
    """An argument was wrong (type, range, size); nothing was written."""


class NotAnInbox(InboxError):
    """The file is not an onwatch inbox (foreign, corrupt, or from a newer schema); untouched."""


class InboxBusy(InboxError):
    """Another process kept the database locked for longer than the busy timeout."""


class BudgetExceeded(InboxError):
    """An operational budget refuses this write (e.g. too many pending events)."""


class ReadOnlyInbox(InboxError):
    """The inbox was opened read-only, or cannot be written (file permissions, a read-only
    file system or folder, a database role that may only read); nothing was written."""


class FileLost(InboxError):
    """The inbox file, or its `-wal` or `-shm` file, is no longer the one this process's
    connection uses (deleted or replaced under it): the connection has stopped; nothing it
    writes from now on would be seen by any other process."""

    # Whether what this connection had committed was copied into the inbox file at once
    # (core/sqlite/files.py `recover`): then the write that found out stands.
    recovered = False


class UpgradeRefused(InboxError):
    """A schema migration was refused: a worker that has not been upgraded still holds the
    inbox's lease, or the inbox cannot be written. Nothing was changed."""


class WritesRefused(InboxBusy):
    """The store takes no writes for now (one of the kinds below): nothing was written.
    Like a lock held too long it is worth another try later, and everything that retries on
    InboxBusy retries on it; reads still answer meanwhile, so only a write that commits
    tells that it is over."""


class StorageFull(WritesRefused):
    """The disk holding the inbox (a SQLite file's file system, or the PostgreSQL server's)
    had no room for a write: nothing was written, until space is freed."""


class ServerReadOnly(WritesRefused):
    """The PostgreSQL server stopped taking writes after the inbox was opened on it (a
    primary demoted in a failover, or default_transaction_read_only turned on for
    maintenance): nothing was written. The session is dropped, so the next try opens a new
    one, which reaches the new primary where the URL names it (a DNS name, a pooler, several
    hosts with target_session_attrs=read-write). A URL that gives a read-only server from
    the start opens the inbox read-only instead (ReadOnlyInbox)."""


class ConnectionLost(InboxBusy):
    """The database server could not be reached (a restart, a network cut, a server that
    stopped answering, or one that turned the connection away at a connection limit). Like
    a lock held too long it is worth another try later, and everything that retries on
    InboxBusy retries on it; the connection is reopened at the next transaction. A write
    cut off may or may not have committed: the caller must find out, or act so that either
    way is safe (dedupe keys, fencing; docs/rules.md)."""
