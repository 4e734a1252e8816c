"""Frozen records the inbox hands out; what the TUI, the CLI and tests read."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

EVENT_STATES = ("pending", "running", "done", "dead", "interrupted", "cancelled")
ANSWERS = ("yes", "no")


@dataclass(frozen=True, slots=True)
class Event:
    """One thing that woke (or will wake) the agent."""

    id: int
    source: str
    source_id: str
    payload: Any  # decoded JSON; None once pruned
    status: str
    attempts: int
    claim_gen: int | None
    error: str | None
    created: int = 0
    updated: int = 0
    available_at: int = 0  # pending: not claimed before this (retry backoff)
    claimed_at: int | None = None
    run_id: int | None = None


@dataclass(frozen=True, slots=True)
class Lease:
    """Who may run the agent now: holder, generation (fencing token), and expiry instant."""

    holder: str
    gen: int
    until: int


@dataclass(frozen=True, slots=True)
class LeaseChange:
    """One change of lease generation: who took it, from whom, when, and how."""

    gen: int
    holder: str
    previous_holder: str | None
    at: int
    how: str  # 'first' | 'takeover' | 'released' (the previous holder handed it back)


@dataclass(frozen=True, slots=True)
class Timer:
    """A durable timer; each occurrence becomes an inbox event keyed timer_id@scheduled_time."""

    id: str
    due: int
    every: int | None
    catch_up: str
    payload: Any
    key: tuple[str, str] | None = None
    last_fired: int | None = None  # scheduled time of the latest occurrence turned into an event
    last_skipped: int = 0  # occurrences the latest catch-up covered without their own event
    overflow: int = 0  # 'each' occurrences beyond the catch-up limit, counted over the life
    kind: str = "timer"  # 'timer' | 'approval' (an approval's expiry)
    broken: str | None = None  # why the scheduler set this row aside (it no longer fires)
    paused: bool = False  # an operator paused it: the scheduler skips it until resumed

    @property
    def state(self) -> str:
        """What the operator's timer actions are conditional on: 'scheduled', 'paused',
        or 'set aside' (the scheduler could not process it)."""
        if self.broken is not None:
            return "set aside"
        return "paused" if self.paused else "scheduled"


@dataclass(frozen=True, slots=True)
class Approval:
    """A deferred tool call waiting for (or holding) its one standing answer."""

    request_id: str
    action: str
    due: int
    answer: str | None  # None while waiting; 'yes' | 'no' | 'expired'
    requested: int = 0
    answered_at: int | None = None
    answered_by: str | None = None


@dataclass(frozen=True, slots=True)
class Message:
    """An outgoing message held in the outbox until a dispatch sends it."""

    id: int
    body: str
    urgent: bool
    created: int
    status: str = "held"  # 'held' | 'sent' | 'dead'
    run_id: int | None = None
    delivery_id: int | None = None


@dataclass(frozen=True, slots=True)
class Delivery:
    """One send of one or more coalesced messages, with its stable idempotency key."""

    id: int
    key: str
    # 'sending' | 'failed' | 'sent' | 'dead', or 'uncertain': an at-most-once send cut off
    # mid-send, which nobody re-sends until an operator settles it (Inbox.settle_delivery)
    status: str
    attempts: int
    created: int
    message_count: int
    sent_at: int | None = None
    last_error: str | None = None
    urgent: bool = False


@dataclass(frozen=True, slots=True)
class Run:
    """One claim of a batch of events and its outcome, kept apart from any delivery."""

    id: int
    holder: str
    gen: int
    event_ids: tuple[int, ...]
    claimed_at: int
    finished_at: int | None
    outcome: str | None  # None while running; 'done' | 'error' | 'lost'
    result: Any = None
    error: str | None = None
    traceback: str | None = None  # the agent's, for a failed run (bounded)


@dataclass(frozen=True, slots=True)
class Effect:
    """A journal line of an external effect: intended before it happens, confirmed after."""

    id: int
    run_id: int
    name: str
    key: str  # idempotency key a tool can pass on
    state: str  # 'intended' | 'confirmed' | 'failed'
    detail: Any
    intended_at: int
    settled_at: int | None = None


@dataclass(frozen=True, slots=True)
class AuditEntry:
    """An operator action or a refused stale write."""

    id: int
    at: int
    actor: str
    action: str
    target: str
    before: str | None
    after: str | None
    applied: bool
    reason: str | None = None


@dataclass(frozen=True, slots=True)
class Reply:
    """A message a run queues; `urgent` bypasses the outbox gap."""

    body: str
    urgent: bool = False


@dataclass(frozen=True, slots=True)
class ApprovalRequest:
    """An approval a run asks for as part of its finish."""

    request_id: str
    expires_in: int
    action: str


@dataclass(frozen=True, slots=True)
class FollowUp:
    """A timer a run schedules as part of its finish."""

    timer_id: str
    due: int
    payload: Any = None
    every: int | None = None
    key: tuple[str, str] | None = None
    catch_up: str = "coalesce"


@dataclass(frozen=True, slots=True)
class Overview:
    """Everything the status strip and `onwatch status` show, read in one transaction."""

    now: int
    counts: dict[str, int]
    lease: Lease | None
    takeovers: int
    refused_writes: int
    paused: bool
    outbox_held: bool
    held_messages: int
    next_send_at: int | None
    next_timer_due: int | None
    waiting_approvals: int
    runs_last_day: int
    budgets: dict[str, Any] = field(default_factory=dict)
    timers: int = 0  # registered timers, approval expiries included
    uncertain_deliveries: int = 0  # at-most-once sends cut off mid-send, awaiting an operator
    set_aside: int = 0  # stored rows the engine could not process, set aside with a reason
    lease_released: bool = False  # the current lease was handed back, not left to expire


@dataclass(frozen=True, slots=True)
class DeadGroup:
    """Dead events that share the first line of their error: how many, and the id range."""

    line: str  # the first line of the error ('' for none)
    count: int
    first_id: int
    last_id: int


@dataclass(frozen=True, slots=True)
class Worker:
    """A worker process of this inbox, as its last heartbeat recorded it. `holds` says
    whether it holds the lease now (generation `gen`, taken at `since`); otherwise it is
    standing by, or gone when `seen` is older than two lease TTLs."""

    holder: str
    host: str
    pid: int
    started: int
    seen: int
    holds: bool = False
    gen: int | None = None
    since: int | None = None  # when it took the lease it holds


@dataclass(frozen=True, slots=True)
class ApprovalTrail:
    """Where an approval came from and what it became: the run that asked (and its events)
    and the event its answer (or expiry) became, None while it waits."""

    request_id: str
    run_id: int | None
    asked_by: tuple[int, ...]
    answer_event: int | None
