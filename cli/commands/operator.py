"""The operator's actions from a shell: requeue, cancel, resolve, bury, approve, deny,
expire, pause, resume, hold, release (each audited with --actor and --reason)."""

from __future__ import annotations

import argparse
import sys
from typing import Any, Callable

from cli.output import NOT_APPLIED, OK, clip, emit_json, one_line
from cli.running import open_inbox, run_async


async def _event_action(args: argparse.Namespace, name: str) -> int:
    async with await open_inbox(args) as inbox:
        action = getattr(inbox, name)
        kwargs: dict[str, Any] = {"actor": args.actor, "reason": args.reason}
        if args.expect is not None:
            kwargs["expect"] = args.expect
        applied = await action(args.event_id, **kwargs)
        why = None
        if not applied:
            entries = await inbox.audit(limit=1, target=f"event {args.event_id}")
            why = entries[0].reason if entries else None
        event = await inbox.get_event(args.event_id)
    status = None if event is None else event.status
    if args.json:
        emit_json({"action": name, "applied": applied, "event_id": args.event_id,
                    "reason": why, "status": status})
    elif applied:
        print(f"{name}: event {args.event_id} is now {status}")
    if not applied:
        if not args.json:
            print(f"onwatch: {name} not applied to event {args.event_id}: "
                  f"{one_line(why or 'refused')}", file=sys.stderr)
        return NOT_APPLIED
    return OK


def event_command(name: str) -> Callable[[argparse.Namespace], int]:
    return run_async(lambda args: _event_action(args, name))


async def _answer(args: argparse.Namespace, answer: str) -> int:
    async with await open_inbox(args) as inbox:
        if answer == "expired":
            standing = await inbox.expire_approval(args.request_id, actor=args.actor,
                                                   reason=args.reason)
        else:
            standing = await inbox.answer_approval(args.request_id, answer, actor=args.actor,
                                                   reason=args.reason)
    applied = standing == answer
    if args.json:
        emit_json({"applied": applied, "request_id": args.request_id, "standing": standing})
    else:
        print(standing)
        if not applied:
            why = ("no such request" if standing == "unknown"
                   else f"the answer that stands is {standing!r}")
            print(f"onwatch: {args.subcommand} not applied to {clip(args.request_id, 200)}: "
                  f"{why}", file=sys.stderr)
    return OK if applied else NOT_APPLIED


def answer_command(answer: str) -> Callable[[argparse.Namespace], int]:
    return run_async(lambda args: _answer(args, answer))


_FLAGS = {
    "pause": ("pause", "paused", "execution paused: claims return nothing, intake goes on"),
    "resume": ("resume", "paused", "execution resumed"),
    "hold": ("hold_outbox", "outbox_held", "outbox held: nothing is sent until `release`"),
    "release": ("release_outbox", "outbox_held", "outbox released"),
}


async def _flag(args: argparse.Namespace, name: str) -> int:
    method, field, message = _FLAGS[name]
    async with await open_inbox(args) as inbox:
        changed = await getattr(inbox, method)(actor=args.actor, reason=args.reason)
        view = await inbox.overview()
    state = getattr(view, field)
    if args.json:
        emit_json({"changed": changed, field: state})
    else:
        print(message if changed else f"already so: {message}")
    return OK


def flag_command(name: str) -> Callable[[argparse.Namespace], int]:
    return run_async(lambda args: _flag(args, name))
