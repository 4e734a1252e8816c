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
