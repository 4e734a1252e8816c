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


class ConnectionLost(InboxBusy):
    """The database server could not be reached (a restart, a network cut, a server that
    stopped answering). Like a lock held too long it is worth another try later, and
    everything that retries on InboxBusy retries on it; the connection is reopened at the
    next transaction. A write cut off may or may not have committed: the caller must find
    out, or act so that either way is safe (dedupe keys, fencing; docs/rules.md)."""
