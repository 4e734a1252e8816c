"""onwatch core: the durable inbox engine an always-on agent embeds (no UI imports here)."""

from .clock import Clock, FakeClock, SystemClock
from .errors import BadInput, BudgetExceeded, InboxBusy, InboxError, NotAnInbox
from .inbox import Inbox, Outgoing
from .records import (
    ANSWERS, EVENT_STATES, Approval, ApprovalRequest, AuditEntry, Delivery, Effect, Event,
    FollowUp, Lease, LeaseChange, Message, Overview, Reply, Run, Timer,
)
from .settings import Settings

__all__ = [
    "ANSWERS", "EVENT_STATES", "Approval", "ApprovalRequest", "AuditEntry", "BadInput",
    "BudgetExceeded", "Clock", "Delivery", "Effect", "Event", "FakeClock", "FollowUp", "Inbox",
    "InboxBusy", "InboxError", "Lease", "LeaseChange", "Message", "NotAnInbox", "Outgoing",
    "Overview", "Reply", "Run", "Settings", "SystemClock", "Timer",
]
