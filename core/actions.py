"""The operator's actions as data: one table drives the core entry (`Inbox.act`), the audit
log's action names, the CLI subcommands and the desk's confirmations; and the `Outcome` every
action returns, so nobody re-reads the audit log to learn what happened."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Action:
    """One operator action. `name` is its one name: the `Inbox.act` name, the audit log's
    action word (where the inbox writes it), the CLI subcommand (`_` shown as `-`) and the
    desk's action. `target` is what it acts on: "event", "approval", "delivery" or "inbox".
    `allowed` are the states it applies to; `after` the state it leaves (None: a switch)."""

    name: str
    target: str
    allowed: tuple[str, ...]
    after: str | None
    help: str
    question: str  # one target: formatted with {target}
    question_many: str  # several targets: formatted with {count}
    note: str = ""

    @property
    def command(self) -> str:
        """The CLI subcommand."""
        return self.name.replace("_", "-")


ACTIONS: dict[str, Action] = {a.name: a for a in (
    Action("requeue", "event", ("dead", "interrupted", "cancelled"), "pending",
           "dead/interrupted/cancelled → pending, with fresh attempts",
           "Requeue event {target}?", "Requeue {count} events?",
           "It runs again with a fresh attempt budget."),
    Action("cancel", "event", ("pending",), "cancelled",
           "pending → cancelled (a running event cannot be cancelled)",
           "Cancel event {target}?", "Cancel {count} events?", "It will not run."),
    Action("resolve", "event", ("interrupted",), "done",
           "interrupted → done: the uncertain effect did happen",
           "Resolve event {target} as done?", "Resolve {count} events as done?",
           "Only if the uncertain effect really happened: it will not run again."),
    Action("bury", "event", ("interrupted", "pending"), "dead",
           "interrupted or pending → dead, by hand",
           "Bury event {target} (send it to dead)?", "Bury {count} events?",
           "It stays in Dead until requeued."),
    Action("approve", "approval", ("waiting",), "yes",
           "answer yes; prints the answer that stands",
           "Approve request {target}?", "Approve {count} requests?"),
    Action("deny", "approval", ("waiting",), "no",
           "answer no; prints the answer that stands",
           "Deny request {target}?", "Deny {count} requests?"),
    Action("expire", "approval", ("waiting",), "expired",
           "expire a waiting request now; prints the answer that stands",
           "Expire request {target} now?", "Expire {count} requests now?"),
    Action("mark_sent", "delivery", ("uncertain",), "sent",
           "uncertain delivery → sent: it did reach the channel",
           "Mark delivery {target} as sent?", "Mark {count} deliveries as sent?",
           "Its messages will not be sent again."),
    Action("send_again", "delivery", ("uncertain",), "send again",
           "uncertain delivery → its messages back in the outbox, under a new key",
           "Send delivery {target} again?", "Send {count} deliveries again?",
           "The recipient may get the messages twice."),
    Action("pause", "inbox", ("false",), "true",
           "pause execution (claims return nothing; intake goes on)",
           "Pause execution?", "Pause execution?"),
    Action("resume", "inbox", ("true",), "false", "resume execution",
           "Resume execution?", "Resume execution?"),
    Action("hold", "inbox", ("false",), "true", "hold the outbox (nothing is sent)",
           "Hold the outbox?", "Hold the outbox?"),
    Action("release", "inbox", ("true",), "false", "release the outbox",
           "Release the outbox?", "Release the outbox?"),
)}


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
