"""Commands on the inbox itself: init, migrate, ingest, status, show, events, approvals,
config."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import sys
from typing import Any

from onwatch.cli.output import (
    NOT_APPLIED,
    OK,
    CliError,
    clip,
    emit_json,
    field,
    local_time,
    one_line,
    when,
)
from onwatch.cli.running import open_inbox
from onwatch.cli.values import assignments
from onwatch.core import Settings, backends
from onwatch.core.pg import is_url, redact
from onwatch.core.settings import from_micros

_SQLITE_SIDE_FILES = ("", "-wal", "-shm", "-journal")


async def cmd_init(args: argparse.Namespace) -> int:
    existed = os.path.exists(args.path) and os.path.getsize(args.path) > 0
    changes = assignments(args.settings)
    if changes and not existed:
        Settings().replace(changes)  # refused before any file exists (raises BadInput)
    # A refusal must leave nothing behind: whatever this call created goes again.
    files = [args.path + suffix for suffix in _SQLITE_SIDE_FILES]
    before = {name for name in files if os.path.lexists(name)}
    try:
        # init brings an existing inbox to this release's schema (refused while a worker
        # of an older release holds its lease).
        async with await open_inbox(args, create=True, migrate=True) as inbox:
            if changes:
                await inbox.configure(**changes)
            settings = json.loads(inbox.settings.to_json())
            shown = inbox.path  # a URL's passwords left out
            schema, migrated_from = inbox.schema
            existed = not inbox.created  # a database's inbox: known only once opened
    except BaseException:
        for name in files:
            if name not in before:
                with contextlib.suppress(FileNotFoundError):
                    os.remove(name)
        raise
    if args.json:
        emit_json(
            {
                "created": not existed,
                "path": shown,
                "settings": settings,
                "schema": schema,
                "migrated_from": migrated_from,
            }
        )
    else:
        print(f"{'already an inbox' if existed else 'created'}: {shown}")
        if migrated_from is not None:
            print(f"migrated from schema {migrated_from} to schema {schema}")
    return OK


async def cmd_migrate(args: argparse.Namespace) -> int:
    """Bring an inbox file (or a PostgreSQL database, all its inboxes) to this release's
    schema. Refused (exit 1, nothing changed) while a worker holds a lease: a worker that
    has not been upgraded (docs/rules.md#upgrading-a-running-deployment)."""
    before, after = await backends.migrate(args.path, busy_timeout=args.busy_timeout)
    shown = redact(args.path) if is_url(args.path) else args.path
    if args.json:
        emit_json({"path": shown, "schema_before": before, "schema": after})
    elif before == after:
        print(f"already at schema {after}: {shown}")
    else:
        print(f"migrated: {shown} from schema {before} to schema {after}")
    return OK


def _payload(text: str | None) -> Any:
    if text is None:
        return None
    if text == "-":
        text = _read_stdin()
    try:
        return json.loads(text)
    except ValueError as exc:
        raise CliError(f"the payload is not valid JSON: {exc}") from None
    except RecursionError:
        raise CliError("the payload is nested too deeply") from None


def _read_stdin() -> str:
    """All of stdin as text; CliError unless it is UTF-8 (a terminal's or a C locale's
    decoding would otherwise turn stray bytes into lone surrogates or an exception)."""
    stream = getattr(sys.stdin, "buffer", None)
    try:
        text = stream.read().decode("utf-8") if stream is not None else sys.stdin.read()
        text.encode("utf-8")
    except UnicodeError:
        raise CliError("the payload on stdin is not UTF-8 text") from None
    return text


async def cmd_ingest(args: argparse.Namespace) -> int:
    payload = _payload(args.payload)
    async with await open_inbox(args) as inbox:
        stored = await inbox.ingest(args.source, args.source_id, payload)
    if args.json:
        emit_json({"source": args.source, "source_id": args.source_id, "stored": stored})
    else:
        print("stored" if stored else "duplicate")
    return OK


CLOCK_SKEW_SHOWN = 2.0  # seconds between this machine's clock and the server's worth saying


async def cmd_status(args: argparse.Namespace) -> int:
    async with await open_inbox(args) as inbox:
        view = await inbox.overview()
        workers = await inbox.workers(now=view.now)
        spending = await inbox.spending(days=SPEND_DAYS, now=view.now)
        settings = inbox.settings
        offset = inbox.clock_offset
        held_back = await inbox.held_back()
        shown = inbox.path  # a URL's passwords left out
    data = dataclasses.asdict(view)
    data["path"] = shown
    data["spending"] = {
        unit: {
            "last_day": from_micros(spending.last_day.get(unit, 0)),
            "per_day": [from_micros(m) for m in spending.per_day.get(unit, (0,) * SPEND_DAYS)],
            "total": from_micros(spending.total.get(unit, 0)),
            "limit": None if unit not in spending.limits else from_micros(spending.limits[unit]),
        }
        for unit in spending.units
    }
    data["clock_offset_seconds"] = round(offset, 3)
    data["lease_ttl"] = settings.lease_ttl
    data["on_lost_claim"] = settings.on_lost_claim
    data["workers"] = [dataclasses.asdict(w) for w in workers]
    data["held_back"] = held_back
    if args.json:
        emit_json(data)
        return OK
    now = view.now
    counts = " · ".join(
        f"{state} {view.counts.get(state, 0)}"
        for state in ("pending", "running", "done", "dead", "interrupted", "cancelled")
    )
    print(f"inbox       {shown}")
    print(f"events      {counts}")
    if view.lease is None:
        lease = "never taken"
    elif view.lease.until >= now:
        lease = f"{view.lease.holder} generation {view.lease.gen}, {view.lease.until - now}s left"
    elif view.lease_released:
        lease = (
            f"free (last: {view.lease.holder} generation {view.lease.gen}, released "
            f"{now - view.lease.until - 1}s ago)"
        )
    else:
        lease = (
            f"free (last: {view.lease.holder} generation {view.lease.gen}, expired "
            f"{now - view.lease.until}s ago)"
        )
    print(
        f"lease       {lease}; takeovers {view.takeovers}, refused stale writes "
        f"{view.refused_writes}"
    )
    for worker in sorted(workers, key=lambda w: (not w.holds, w.started)):
        if worker.holds:
            since = local_time(worker.since or worker.started, now)
            role = f"holds the lease (generation {worker.gen}) since {since}"
        elif now - worker.seen > 2 * settings.lease_ttl:
            role = f"gone? not seen for {now - worker.seen}s"
        else:
            role = f"standing by since {local_time(worker.started, now)}"
        print(
            f"worker      {clip(worker.holder, 80)} on {clip(worker.host, 80)} pid {worker.pid}: "
            f"{role}; seen {now - worker.seen}s ago"
        )
    print(
        f"execution   {'PAUSED' if view.paused else 'running'}; outbox "
        f"{'HELD' if view.outbox_held else 'sending'}; lost claims → {settings.on_lost_claim}"
    )
    print(f"next timer  {when(view.next_timer_due, now)}")
    send = when(view.next_send_at, now) if view.held_messages else "nothing held"
    print(
        f"outbox      {view.held_messages} held; next send {send}; "
        f"{view.uncertain_deliveries} uncertain (settle: mark-sent / send-again)"
    )
    print(f"approvals   {view.waiting_approvals} waiting")
    if abs(offset) > CLOCK_SKEW_SHOWN:
        side = "behind" if offset > 0 else "ahead of"
        print(
            f"clock       this machine is {abs(offset):.1f} s {side} the server's clock "
            f"(decisions follow the server's; check this machine's time synchronisation)"
        )
    if held_back is not None:
        print(f"held back   {held_back}")
    print(f"set aside   {view.set_aside} stored row(s) the engine could not process")
    for unit in spending.units:
        days = " ".join(
            _amount(from_micros(m)) for m in spending.per_day.get(unit, (0,) * SPEND_DAYS)
        )
        print(
            f"spend       {_amount(from_micros(spending.last_day.get(unit, 0)))} {unit} in "
            f"the last 24 h, {_amount(from_micros(spending.total.get(unit, 0)))} in all; "
            f"per day (UTC, oldest first): {days}"
        )
    print("budgets")
    for name, budget in sorted(view.budgets.items()):
        if name == "max_spend_per_day":
            for line in _spend_budget(budget):
                print(line)
            continue
        limit = "unlimited" if budget.get("limit") is None else budget["limit"]
        used = f"{budget['used']} / {limit}" if "used" in budget else f"limit {limit}"
        print(f"  {name:<22} {used:<18} excess {budget.get('excess')}")
    return OK


SPEND_DAYS = 7  # days of spend `status` shows


def _amount(value: float) -> str:
    return f"{value:,.6f}".rstrip("0").rstrip(".") if value != int(value) else f"{int(value):,}"


def _spend_budget(budget: dict[str, Any]) -> list[str]:
    """max_spend_per_day's lines: one per budgeted unit (its use in the last 24 h)."""
    limits = budget.get("limit") or {}
    if not limits:
        return [f"  {'max_spend_per_day':<22} {'unlimited':<18} excess {budget.get('excess')}"]
    lines = []
    for unit, limit in sorted(limits.items()):
        used = (budget.get("used") or {}).get(unit, 0)
        figure = f"{_amount(used)} / {_amount(limit)} {unit}"
        state = "  REACHED: runs wait (raise-budget)" if used >= limit else ""
        lines.append(f"  {'max_spend_per_day':<22} {figure:<18} excess delayed{state}")
    return lines


async def cmd_show(args: argparse.Namespace) -> int:
    async with await open_inbox(args) as inbox:
        event = await inbox.get_event(args.event_id)
        if event is None:
            raise CliError(f"no event {args.event_id} in {inbox.path}", NOT_APPLIED)
        runs = await inbox.runs(args.event_id)
        effects = await inbox.effects(args.event_id)
        now = inbox.now()
    if args.json:
        emit_json({"effects": effects, "event": event, "runs": runs})
        return OK
    print(
        f"event {event.id}  {field(event.source)} / {field(event.source_id)}  {event.status}  "
        f"attempts {event.attempts}"
    )
    print(f"created     {local_time(event.created, now)}")
    print(f"updated     {local_time(event.updated, now)}")
    if event.error:
        print(f"error       {one_line(event.error)}")
    print(f"payload     {json.dumps(event.payload, ensure_ascii=False, sort_keys=True)}")
    for run in runs:
        finished = f"  finished {local_time(run.finished_at, now)}" if run.finished_at else ""
        print(
            f"run {run.id}  {field(run.holder)} generation {run.gen}  claimed "
            f"{local_time(run.claimed_at, now)}{finished}  outcome {run.outcome or 'running'}"
            + (f"  ({one_line(run.error)})" if run.error else "")
        )
        if run.traceback:
            print("  traceback (the agent's, most recent call last):")
            for line in run.traceback.rstrip().splitlines():
                print(f"    {line}")
    for effect in effects:
        print(
            f"effect {field(effect.name)}  {effect.state}  key {field(effect.key)}  "
            f"run {effect.run_id}  "
            f"detail {json.dumps(effect.detail, ensure_ascii=False, sort_keys=True)}"
        )
    return OK


async def cmd_events(args: argparse.Namespace) -> int:
    async with await open_inbox(args) as inbox:
        rows = await inbox.events(args.status, limit=args.limit, after=args.after)
    if args.json:
        emit_json(rows)
        return OK
    for e in rows:
        error = f"  {one_line(e.error)[:80]}" if e.error else ""
        print(
            f"{e.id}\t{field(e.source)}\t{field(e.source_id)}\t{e.status}\t"
            f"attempts {e.attempts}{error}"
        )
    return OK


async def cmd_approvals(args: argparse.Namespace) -> int:
    async with await open_inbox(args) as inbox:
        rows = await inbox.approvals(limit=args.limit)
        now = inbox.now()
    if args.json:
        emit_json(rows)
        return OK
    for a in rows:
        state = (
            f"waiting, expires {when(a.due, now)}"
            if a.answer is None
            else f"{a.answer} by {a.answered_by}"
        )
        print(f"{field(a.request_id)}\t{one_line(a.action)}\t{state}")
    return OK


async def cmd_audit(args: argparse.Namespace) -> int:
    """The audit log, oldest of the page first (as a log reads): who did what to which
    target, the state before → after, and why a refused one was refused."""
    async with await open_inbox(args) as inbox:
        rows = await inbox.audit(limit=args.limit, target=args.target)
        now = inbox.now()
    if args.json:
        emit_json(rows)
        return OK
    for entry in reversed(rows):
        at = local_time(entry.at, now)
        if entry.applied:
            change = f"{field(entry.before)} → {field(entry.after)}"
            outcome = f"applied: {one_line(entry.reason)}" if entry.reason else "applied"
        else:
            change = f"{field(entry.before)} (unchanged)"
            outcome = f"refused: {one_line(entry.reason or 'no reason recorded')}"
        print(
            f"{at}\t{one_line(entry.actor)}\t{field(entry.action)}\t{one_line(entry.target)}"
            f"\t{change}\t{outcome}"
        )
    return OK


async def cmd_config(args: argparse.Namespace) -> int:
    changes = assignments(args.settings)
    async with await open_inbox(args) as inbox:
        before = json.loads(inbox.settings.to_json())
        if changes:
            await inbox.configure(**changes)
        after = json.loads(inbox.settings.to_json())
    if args.json:
        emit_json(after)
        return OK
    keys = sorted(changes) if changes else sorted(after)
    for key in keys:
        value = json.dumps(after[key], sort_keys=True)
        was = (
            f"   (was {json.dumps(before[key], sort_keys=True)})"
            if changes and before[key] != after[key]
            else ""
        )
        print(f"{key} = {value}{was}")
    return OK
