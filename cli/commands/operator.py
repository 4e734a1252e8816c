"""The operator's actions from a shell, one subcommand per row of core.actions.ACTIONS
(requeue, cancel, resolve, bury, run-now, approve, deny, expire, mark-sent, send-again,
fire-timer, pause-timer, resume-timer, delete-timer, raise-budget, pause, resume, hold,
release), each audited with --actor and --reason. The exit code says what the audit log
says: 0 when this call changed something, 1 when it did not."""

from __future__ import annotations

import argparse
import sys
from typing import Callable

from onwatch.cli.output import NOT_APPLIED, OK, clip, emit_json, field, one_line
from onwatch.cli.running import open_inbox, run_async
from onwatch.cli.values import actor_of
from onwatch.core import ACTIONS, Outcome

_SWITCHED = {  # the state that stands after the switch, applied or already so
    "pause": "execution paused: claims return nothing, intake goes on",
    "resume": "execution resumed",
    "hold": "outbox held: nothing is sent until `release`",
    "release": "outbox released",
}


def applied(outcome: Outcome) -> bool:
    """Whether the action changed anything, as its audit entry says (`Inbox.act` reports
    what the entry recorded: approving a request already approved is not applied)."""
    return outcome.applied


async def _act(args: argparse.Namespace, name: str) -> int:
    action = ACTIONS[name]
    target = {
        "event": "event_id",
        "approval": "request_id",
        "delivery": "delivery_id",
        "timer": "timer_id",
    }.get(action.target)
    who = actor_of(args)  # a name the audit log refuses stops here, before the file opens
    async with await open_inbox(args) as inbox:
        if action.target == "budget":
            outcome = await inbox.raise_budget(
                args.budget,
                args.to,
                unit=args.unit,
                expect=args.expect,
                actor=who,
                reason=args.reason,
            )
        else:
            outcome = await inbox.act(
                name,
                None if target is None else getattr(args, target),
                expect=getattr(args, "expect", None),
                actor=who,
                reason=args.reason,
            )
    done = applied(outcome)
    if action.target == "approval":
        if args.json:
            emit_json({"applied": done, "request_id": args.request_id, "standing": outcome.result})
        else:
            print(field(outcome.result))
    elif action.target == "inbox":
        state = _SWITCHED[name]
        if args.json:
            emit_json({"changed": done, str(action.switch): outcome.after == "true"})
        else:
            print(state if done else f"already so: {state}")
    elif action.target == "budget":
        if args.json:
            emit_json(
                {
                    "action": name,
                    "applied": done,
                    "budget": outcome.target,
                    "before": outcome.before,
                    "after": outcome.after,
                    "reason": None if done else outcome.reason,
                }
            )
        elif done:
            print(
                f"raised {field(outcome.target)}: {field(outcome.before)} → {field(outcome.after)}"
            )
    elif args.json:
        assert target is not None  # only the inbox switches have none, handled above
        emit_json(
            {
                "action": name,
                "applied": done,
                target: getattr(args, target),
                "before": outcome.before,
                "reason": None if done else outcome.reason,
                "status": outcome.after,
            }
        )
    elif done:
        print(
            f"{name}: {field(outcome.target)} was {field(outcome.before)}, "
            f"is now {field(outcome.after)}"
        )
    if done:
        return OK
    if not args.json:
        if action.target == "approval":
            why = (
                "no such request"
                if outcome.result == "unknown"
                else f"the answer that stands is {outcome.result!r}"
            )
        elif action.target == "inbox":
            why = "it was already so; nothing changed"
        else:
            why = one_line(outcome.reason or "refused")
        shown = args.request_id if action.target == "approval" else outcome.target
        print(
            f"onwatch: {action.command} not applied to {clip(shown, 200)}: {why}", file=sys.stderr
        )
    return NOT_APPLIED


def act_command(name: str) -> Callable[[argparse.Namespace], int]:
    """The handler of the subcommand for ACTIONS[name]."""
    return run_async(lambda args: _act(args, name))
