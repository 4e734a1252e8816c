"""The operator's actions as data: one table drives the core entry (`Inbox.act`), the audit
log's action names, the CLI subcommands and the desk's confirmations; and the `Outcome` every
action returns, so nobody re-reads the audit log to learn what happened."""

from __future__ import annotations

import getpass
import os
from dataclasses import dataclass
from typing import Any, Mapping

from .errors import BadInput


@dataclass(frozen=True, slots=True)
class Action:
    """One operator action. `name` is its one name: the `Inbox.act` name, the audit log's
    action word (where the inbox writes it), the CLI subcommand (`_` shown as `-`) and the
    desk's action. `target` is what it acts on: "event", "approval", "delivery", "timer",
    "inbox" or "budget" (a delaying budget, raised to a value the operator gives).
    `allowed` are the states it applies to; `after` the state it leaves. An "inbox" action
    sets one of the inbox's switches, `switch` ("paused", "outbox_held"): its states are
    "true" and "false"."""

    name: str
    target: str
    allowed: tuple[str, ...]
    after: str | None
    help: str
    question: str  # the confirmation for one target
    question_many: str  # for several: formatted with {n}
    note: str = ""
    switch: str | None = None

    @property
    def command(self) -> str:
        """The CLI subcommand."""
        return self.name.replace("_", "-")


ACTIONS: dict[str, Action] = {
    a.name: a
    for a in (
        Action(
            "requeue",
            "event",
            ("dead", "interrupted", "cancelled"),
            "pending",
            "dead/interrupted/cancelled → pending, with fresh attempts",
            "Requeue this event?",
            "Requeue these {n} events?",
            "It runs again with a fresh attempt budget: any effect it had (a refund, a mail) "
            "may happen again.",
        ),
        Action(
            "cancel",
            "event",
            ("pending",),
            "cancelled",
            "pending → cancelled (a running event cannot be cancelled)",
            "Cancel this pending event?",
            "Cancel these {n} pending events?",
            "A cancelled event is never claimed; a running one cannot be cancelled.",
        ),
        Action(
            "resolve",
            "event",
            ("interrupted",),
            "done",
            "interrupted → done: the uncertain effect did happen",
            "Resolve this interrupted event as done?",
            "Resolve these {n} interrupted events as done?",
            "Only if you checked that its effect happened: it will not run again.",
        ),
        Action(
            "bury",
            "event",
            ("interrupted", "pending"),
            "dead",
            "interrupted or pending → dead, by hand",
            "Bury this event (send it to dead)?",
            "Bury these {n} events?",
            "It stays in Dead until requeued.",
        ),
        Action(
            "run_now",
            "event",
            ("pending",),
            "pending",
            "a pending event waiting out its backoff → available now (its attempts kept)",
            "Run this event now instead of waiting out its backoff?",
            "Run these {n} events now instead of waiting out their backoff?",
            "The worker may claim it at once; the attempts it used still count.",
        ),
        Action(
            "approve",
            "approval",
            ("waiting",),
            "yes",
            "answer yes; prints the answer that stands",
            "Approve this request?",
            "Approve these {n} requests?",
            "The agent resumes with the answer yes.",
        ),
        Action(
            "deny",
            "approval",
            ("waiting",),
            "no",
            "answer no; prints the answer that stands",
            "Deny this request?",
            "Deny these {n} requests?",
            "The agent resumes with the answer no.",
        ),
        Action(
            "expire",
            "approval",
            ("waiting",),
            "expired",
            "expire a waiting request now; prints the answer that stands",
            "Expire this request now?",
            "Expire these {n} requests now?",
            "The request ends as if nobody answered; the agent resumes with a refusal.",
        ),
        Action(
            "mark_sent",
            "delivery",
            ("uncertain",),
            "sent",
            "uncertain delivery → sent: it did reach the channel",
            "Mark this delivery as sent?",
            "Mark these {n} deliveries as sent?",
            "Its messages will not be sent again.",
        ),
        Action(
            "send_again",
            "delivery",
            ("uncertain",),
            "send again",
            "uncertain delivery → its messages back in the outbox, under a new key",
            "Send this delivery again?",
            "Send these {n} deliveries again?",
            "The recipient may get the messages twice.",
        ),
        Action(
            "fire_timer",
            "timer",
            ("scheduled", "paused"),
            "fired",
            "fire a timer's next occurrence now (a repeating one then moves on)",
            "Fire this timer's next occurrence now?",
            "Fire these {n} timers now?",
            "The agent runs on it as on any occurrence; the scheduler will not fire it again.",
        ),
        Action(
            "pause_timer",
            "timer",
            ("scheduled",),
            "paused",
            "pause a timer: the scheduler skips it until resumed",
            "Pause this timer?",
            "Pause these {n} timers?",
            "Nothing fires until you resume it; then what it missed catches up by its policy.",
        ),
        Action(
            "resume_timer",
            "timer",
            ("paused",),
            "scheduled",
            "resume a paused timer (what it missed catches up by its policy)",
            "Resume this timer?",
            "Resume these {n} timers?",
            "Occurrences it missed while paused fire at the next scheduler pass, by its policy.",
        ),
        Action(
            "delete_timer",
            "timer",
            ("scheduled", "paused", "set aside"),
            "deleted",
            "delete a timer (an agent that registers it again brings it back)",
            "Delete this timer?",
            "Delete these {n} timers?",
            "It never fires again unless the agent registers it again.",
        ),
        Action(
            "raise_budget",
            "budget",
            ("set",),
            None,
            "raise a delaying budget (max_spend_per_day of a unit, or max_runs_per_day)",
            "Raise this budget?",
            "Raise these {n} budgets?",
            "Runs it delays may start at once, and what they spend is spent.",
        ),
        Action(
            "pause",
            "inbox",
            ("false",),
            "true",
            "pause execution (claims return nothing; intake goes on)",
            "Pause execution?",
            "Pause execution?",
            switch="paused",
        ),
        Action(
            "resume",
            "inbox",
            ("true",),
            "false",
            "resume execution",
            "Resume execution?",
            "Resume execution?",
            switch="paused",
        ),
        Action(
            "hold",
            "inbox",
            ("false",),
            "true",
            "hold the outbox (nothing is sent)",
            "Hold the outbox?",
            "Hold the outbox?",
            switch="outbox_held",
        ),
        Action(
            "release",
            "inbox",
            ("true",),
            "false",
            "release the outbox",
            "Release the outbox?",
            "Release the outbox?",
            switch="outbox_held",
        ),
    )
}


@dataclass(frozen=True, slots=True)
class Outcome:
    """What an action did: `applied`, the audited `target` ("event 7", "approval r1",
    "paused"…), the state `before` → `after`, and the `reason` (why it was refused, or the
    operator's reason when applied). Truthy iff applied. `result` is what the action's own
    method returns (True/False, or the approval answer that stands)."""

    action: str
    target: str
    applied: bool
    before: str | None
    after: str | None
    reason: str | None
    result: Any = None

    def __bool__(self) -> bool:
        return self.applied


ACTOR_ENV = "ONWATCH_ACTOR"
MAX_ACTOR = 200  # characters: what the audit log takes (Inbox methods' `actor=`)


def check_actor(name: object, *, what: str = "actor") -> str:
    """`name` if the audit log takes it as an actor (non-empty text of at most MAX_ACTOR
    characters, no NUL, valid Unicode); raises BadInput saying what is wrong."""
    if not isinstance(name, str) or not name.strip():
        raise BadInput(f"{what} must be a non-empty name")
    if len(name) > MAX_ACTOR:
        raise BadInput(f"{what} is {len(name)} characters; the limit is {MAX_ACTOR}")
    if "\x00" in name:
        raise BadInput(f"{what} must not contain NUL characters")
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        raise BadInput(f"{what} is not valid Unicode text") from None
    return name


def operator_name(environ: Mapping[str, str] | None = None) -> str:
    """Who acts, for the audit log, when nobody says: `$ONWATCH_ACTOR`, else the operating
    system's user name (the uid where the system has no name for it), so that in a team the
    log tells who approved a refund. Raises BadInput for an `$ONWATCH_ACTOR` the audit log
    would refuse."""
    env = os.environ if environ is None else environ
    named = env.get(ACTOR_ENV)
    if named:
        return check_actor(named, what=f"${ACTOR_ENV}")
    try:
        return check_actor(getpass.getuser(), what="the user name")
    except (OSError, KeyError, BadInput):  # no passwd entry and no $USER (a bare container)
        return f"uid {os.getuid()}" if hasattr(os, "getuid") else "operator"


# The audit words older versions wrote for an operator action → the action's one name.
OLD_AUDIT_WORDS = {
    "answer yes": "approve",
    "answer no": "deny",
    "delivery sent": "mark_sent",
    "delivery send again": "send_again",
    "mark done": "resolve",
    "send to dead": "bury",
    "hold outbox": "hold",
    "release outbox": "release",
}
# The statements that rename them in an audit table (the same SQL on both backends; each
# schema runs them in the migration that introduced the one names).
AUDIT_RENAMES = "".join(
    f"UPDATE audit SET action = '{new}' WHERE action = '{old}';\n"
    for old, new in OLD_AUDIT_WORDS.items()
)
