"""onwatch core: the durable inbox engine an always-on agent embeds (no UI imports here)."""

from .actions import ACTIONS, Action, Outcome
from .clock import MAX_DURATION, MAX_TIME, Clock, FakeClock, SystemClock
from .errors import (
    BadInput,
    BudgetExceeded,
    ConnectionLost,
    FileLost,
    InboxBusy,
    InboxError,
    NotAnInbox,
    ReadOnlyInbox,
    StorageFull,
    UpgradeRefused,
)
from .checks import MAX_DEPTH, RESERVED_SOURCES, RESERVED_TIMER_PREFIXES
from .inbox import Inbox, Outgoing
from .records import (
    ANSWERS,
    EVENT_STATES,
    Approval,
    ApprovalRequest,
    AuditEntry,
    Delivery,
    Effect,
    Event,
    FollowUp,
    Lease,
    LeaseChange,
    Message,
    Overview,
    Reply,
    Run,
    Timer,
)
from .engine.spend import Spend, Spending
from .engine.transcripts import LogLine, Transcript
from .records import ApprovalTrail, DeadGroup, Worker
from .runtime.context import RunContext
from .settings import Settings

__all__ = [
    "ACTIONS",
    "Action",
    "Outcome",
    "ANSWERS",
    "EVENT_STATES",
    "MAX_DEPTH",
    "MAX_DURATION",
    "MAX_TIME",
    "RESERVED_SOURCES",
    "RESERVED_TIMER_PREFIXES",
    "Approval",
    "ApprovalRequest",
    "AuditEntry",
    "BadInput",
    "BudgetExceeded",
    "ConnectionLost",
    "Clock",
    "Delivery",
    "Effect",
    "Event",
    "FakeClock",
    "FileLost",
    "FollowUp",
    "Inbox",
    "InboxBusy",
    "InboxError",
    "Lease",
    "LeaseChange",
    "LogLine",
    "Message",
    "NotAnInbox",
    "Outgoing",
    "Overview",
    "ReadOnlyInbox",
    "StorageFull",
    "Reply",
    "Run",
    "RunContext",
    "Settings",
    "Spend",
    "Spending",
    "SystemClock",
    "Timer",
    "Transcript",
    "UpgradeRefused",
    "ApprovalTrail",
    "DeadGroup",
    "Worker",
]
