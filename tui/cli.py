"""The `onwatch` command line: scripts and operators act on an inbox file from a shell.

Exit codes (every subcommand):
  0  done (an ingest that was a duplicate is still 0: the event is stored exactly once)
  1  the action was not applied or was refused (state changed meanwhile, budget, answer
     already stands, delivery failed)
  2  bad usage, bad input, or the file is not an onwatch inbox
  3  the inbox stayed locked by another process for longer than the busy timeout

Errors go to stderr as one line starting with "onwatch: ". The TUI (textual) is imported only
by `onwatch tui`, `onwatch demo` and `onwatch web`, so every other subcommand starts fast.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import contextlib
import dataclasses
import datetime as dt
import functools
import getpass
import hashlib
import importlib
import importlib.util
import inspect
import json
import logging
import math
import os
import signal
import sys
import threading
import time
import types
from typing import Any, Callable, Iterator

from core import BadInput, BudgetExceeded, Inbox, InboxBusy, InboxError, NotAnInbox, Settings
from core.pg import is_url as _is_postgres_url
from core.text import printable

PROG = "onwatch"
OK, NOT_APPLIED, BAD, BUSY = 0, 1, 2, 3


class CliError(Exception):
    """A one-line failure with its exit code."""

    def __init__(self, message: str, code: int = BAD) -> None:
        super().__init__(message)
        self.code = code


class Parser(argparse.ArgumentParser):
    """argparse, but usage errors are one line on stderr and exit 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise CliError(f"{self.prog}: {message} (see `{self.prog} --help`)", BAD)


# --- helpers --------------------------------------------------------------------------------

def _one_line(text: object) -> str:
    return " ".join(str(text).split())


def _emit_json(data: Any) -> None:
    # ASCII-only: every control or invisible character in inbox text stays a JSON escape.
    print(json.dumps(data, sort_keys=True, ensure_ascii=True, default=_json_default))


def _json_default(value: Any) -> Any:
    if dataclasses.is_dataclass(value):
        return dataclasses.asdict(value)
    if isinstance(value, (set, tuple)):
        return list(value)
    raise TypeError(f"not JSON-serialisable: {type(value).__name__}")


def _when(instant: int | None, now: int) -> str:
    """'in 3m 20s (2026-11-29 19:40:00 UTC)' / '5s ago (…)' / 'none'."""
    if instant is None:
        return "none"
    try:
        stamp = dt.datetime.fromtimestamp(instant, dt.timezone.utc).strftime(
            "%Y-%m-%d %H:%M:%S UTC")
    except (OverflowError, OSError, ValueError, TypeError):  # a row written by hand
        return f"at {instant!r} (not a date)"
    delta = instant - now
    if delta == 0:
        return f"now ({stamp})"
    span = _span(abs(delta))
    return f"in {span} ({stamp})" if delta > 0 else f"{span} ago ({stamp})"


def _local(instant: int, now: int) -> str:
    """'2026-11-29 19:40:00 CET (3m 20s ago)': local time for a person (--json keeps the
    raw seconds)."""
    stamp = dt.datetime.fromtimestamp(instant).astimezone().strftime("%Y-%m-%d %H:%M:%S %Z")
    delta = now - instant
    ago = "now" if delta == 0 else (f"{_span(delta)} ago" if delta > 0 else
                                   f"in {_span(-delta)}")
    return f"{stamp} ({ago})"


def _span(seconds: int) -> str:
    parts = []
    for unit, size in (("d", 86_400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            parts.append(f"{seconds // size}{unit}")
            seconds %= size
    if seconds or not parts:
        parts.append(f"{seconds}s")
    return " ".join(parts[:2])


def _parse_value(text: str, key: str = "value") -> Any:
    """A setting's value: JSON if it parses (5, true, {"a": "b"}), None for none/null/
    unlimited, else the bare string (interrupt). Raises CliError for a number past a 64-bit
    integer (SQLite's) or JSON nested too deeply; NaN and Infinity stay bare strings, which
    no setting takes."""
    if text.strip().lower() in ("none", "null", "unlimited", "off"):
        return None

    def whole(digits: str) -> int:
        value = int(digits) if len(digits) <= 20 else None
        if value is None or not -_MAX_INTEGER - 1 <= value <= _MAX_INTEGER:
            raise CliError(f"{key}: {_clip(digits)} is past a 64-bit integer")
        return value

    def not_a_number(name: str) -> Any:
        raise ValueError(name)
    try:
        return json.loads(text, parse_int=whole, parse_constant=not_a_number)
    except ValueError:
        return text
    except RecursionError:
        raise CliError(f"{key}: the value is nested too deeply") from None


def _clip(text: str, limit: int = 40) -> str:
    """`text` for a one-line message: bounded, every control character escaped."""
    return printable(text if len(text) <= limit else text[:limit] + "…")


def _assignments(pairs: list[str]) -> dict[str, Any]:
    changes: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise CliError(f"expected key=value, got {_clip(pair)!r}")
        changes[key.strip()] = _parse_value(value, key.strip())
    return changes


def _inbox_path(text: str) -> str:
    """argparse type of PATH: SQLite would take '' for a throwaway temporary database."""
    if not text:
        raise argparse.ArgumentTypeError("expected the inbox file's path, got ''")
    return text


_MAX_SECONDS = 86_400.0  # a day: SQLite's busy timeout is a 32-bit count of milliseconds


def _seconds(*, allow_zero: bool = False) -> Callable[[str], float]:
    """argparse type: a number of seconds up to a day, positive (or, allow_zero,
    non-negative)."""
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan  # refused below, as NaN is
        if not (0 <= value if allow_zero else 0 < value) or value > _MAX_SECONDS:
            kind = "non-negative" if allow_zero else "positive"
            raise argparse.ArgumentTypeError(f"expected a {kind} number of seconds up to "
                                             f"{_MAX_SECONDS:g}, got {_clip(text)!r}")
        return value
    return parse


_MAX_INTEGER = 2**63 - 1  # SQLite's largest INTEGER: ids and limits past it overflow


def _whole(minimum: int) -> Callable[[str], int]:
    """argparse type: an integer from `minimum` up to what SQLite can store."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or not minimum <= value <= _MAX_INTEGER:
            raise argparse.ArgumentTypeError(f"expected a whole number from {minimum} to "
                                             f"{_MAX_INTEGER}, got {_clip(text)!r}")
        return value
    return parse


def _port(text: str) -> int:
    """argparse type: a TCP port, 0 (any free one) to 65535."""
    value = _whole(0)(text)
    if value > 65535:
        raise argparse.ArgumentTypeError(f"expected a port from 0 to 65535, got {_clip(text)!r}")
    return value


def _default_actor() -> str:
    env = os.environ.get("ONWATCH_ACTOR")
    if env:
        return env
    try:
        return f"cli:{getpass.getuser()}"
    except Exception:  # no user name in this environment
        return "cli"


async def _open(args: argparse.Namespace, *, create: bool = False) -> Inbox:
    return await Inbox.open(args.path, name=getattr(args, "inbox", "default"), create=create,
                            busy_timeout=args.busy_timeout)


def _run(coro_fn: Callable[[argparse.Namespace], Any]) -> Callable[[argparse.Namespace], int]:
    def handler(args: argparse.Namespace) -> int:
        return _run_loop(coro_fn(args))
    return handler


def _run_loop(coro: Any) -> Any:
    """asyncio.run, except that it never waits for threads it handed work to (a plain-def
    agent or channel run through asyncio.to_thread): asyncio.run joins them without a
    timeout, so one stuck in a call kept a stopped or crashed worker alive for ever.
    Whatever still runs in them is abandoned; main() makes sure the process ends."""
    loop = asyncio.new_event_loop()
    executor = concurrent.futures.ThreadPoolExecutor(thread_name_prefix="onwatch-call")
    loop.set_default_executor(executor)
    try:
        asyncio.set_event_loop(loop)
        return loop.run_until_complete(coro)
    finally:
        try:
            tasks = [task for task in asyncio.all_tasks(loop) if not task.done()]
            for task in tasks:
                task.cancel()
            if tasks:
                loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
            loop.run_until_complete(loop.shutdown_asyncgens())
        finally:
            executor.shutdown(wait=False, cancel_futures=True)
            asyncio.set_event_loop(None)
            loop.close()


LINGER = 1.0  # seconds a finished command waits for stray threads before leaving without them


def _leave_no_thread_behind(code: int) -> None:
    """End the process now if threads that the command started are still running (an agent
    stuck in a call, a thread its code started): the interpreter would otherwise wait for
    them at exit, and a stopped or crashed worker would never exit."""
    deadline = time.monotonic() + LINGER
    for thread in threading.enumerate():
        if thread is threading.main_thread() or thread.daemon:
            continue
        thread.join(max(0.0, deadline - time.monotonic()))
    stray = [t.name for t in threading.enumerate()
             if t is not threading.main_thread() and not t.daemon and t.is_alive()]
    if not stray:
        return
    _fail(f"leaving {len(stray)} thread(s) still running ({', '.join(stray[:3])}): the "
          f"command ended, the process ends too")
    with contextlib.suppress(Exception):
        sys.stdout.flush()
        sys.stderr.flush()
    os._exit(code)


def _load_callable(spec: str, what: str) -> Callable:
    """'package.module:function' or 'path/to/file.py:function' → the function."""
    module_name, sep, attr = spec.rpartition(":")
    if not sep or not module_name or not attr:
        raise CliError(f"{what} must look like module:function, got {spec!r}")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        if module_name.endswith(".py") or os.sep in module_name:
            module = _load_file(module_name, what)
        else:
            module = importlib.import_module(module_name)
    except CliError:
        raise
    except FileNotFoundError:
        raise CliError(f"{what}: no file {module_name}") from None
    except (Exception, SystemExit) as exc:  # sys.exit() at import is a failed import too
        raise CliError(f"{what}: cannot import {module_name}: {type(exc).__name__}: "
                       f"{_one_line(exc)}") from None
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise CliError(f"{what}: {module_name} has no function {attr!r}")
    return fn


def _load_file(path: str, what: str) -> types.ModuleType:
    """Run a .py file as a module once, registered in sys.modules like any import: an
    agent and its setup from one file share its globals, and @dataclass (which looks its
    module up there) works in it."""
    name = "onwatch_file_" + hashlib.sha256(os.path.realpath(path).encode()).hexdigest()[:16]
    if name in sys.modules:
        return sys.modules[name]
    location = importlib.util.spec_from_file_location(name, path)
    if location is None or location.loader is None:
        raise CliError(f"{what}: cannot load {path}")
    module = importlib.util.module_from_spec(location)
    sys.modules[name] = module
    try:
        location.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


def _channel(args: argparse.Namespace):
    """The send function chosen by --stdout / --file / --command (None for --no-dispatch)."""
    from core.worker import command_channel, file_channel, stdout_channel
    if getattr(args, "no_dispatch", False):
        return None
    if args.file:
        return file_channel(args.file)
    if args.command:
        return command_channel(args.command)
    return stdout_channel()


class _Recording:
    """Wraps a channel to remember a failure (dispatch itself reports 0 either way)."""

    def __init__(self, send: Callable) -> None:
        self.send = send
        self.error: str | None = None

    async def __call__(self, text: str) -> None:
        try:
            outcome = self.send(text)
            if asyncio.iscoroutine(outcome):
                await outcome
        except Exception as exc:
            self.error = f"{type(exc).__name__}: {_one_line(exc)}"
            raise


# --- subcommands ----------------------------------------------------------------------------

_SQLITE_SIDE_FILES = ("", "-wal", "-shm", "-journal")


async def cmd_init(args: argparse.Namespace) -> int:
    existed = os.path.exists(args.path) and os.path.getsize(args.path) > 0
    changes = _assignments(args.settings)
    if changes and not existed:
        Settings().replace(changes)  # refused before any file exists (raises BadInput)
    # A refusal must leave nothing behind: whatever this call created goes again.
    files = [args.path + suffix for suffix in _SQLITE_SIDE_FILES]
    before = {name for name in files if os.path.lexists(name)}
    try:
        async with await _open(args, create=True) as inbox:
            if changes:
                await inbox.configure(**changes)
            settings = json.loads(inbox.settings.to_json())
    except BaseException:
        for name in files:
            if name not in before:
                with contextlib.suppress(FileNotFoundError):
                    os.remove(name)
        raise
    if args.json:
        _emit_json({"created": not existed, "path": args.path, "settings": settings})
    else:
        print(f"{'already an inbox' if existed else 'created'}: {args.path}")
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
    async with await _open(args) as inbox:
        stored = await inbox.ingest(args.source, args.source_id, payload)
    if args.json:
        _emit_json({"source": args.source, "source_id": args.source_id, "stored": stored})
    else:
        print("stored" if stored else "duplicate")
    return OK


async def cmd_status(args: argparse.Namespace) -> int:
    async with await _open(args) as inbox:
        view = await inbox.overview()
        settings = inbox.settings
    data = dataclasses.asdict(view)
    data["path"] = args.path
    data["lease_ttl"] = settings.lease_ttl
    data["on_lost_claim"] = settings.on_lost_claim
    if args.json:
        _emit_json(data)
        return OK
    now = view.now
    counts = " · ".join(f"{state} {view.counts.get(state, 0)}" for state in
                        ("pending", "running", "done", "dead", "interrupted", "cancelled"))
    print(f"inbox       {args.path}")
    print(f"events      {counts}")
    if view.lease is None:
        lease = "never taken"
    elif view.lease.until >= now:
        lease = (f"{view.lease.holder} generation {view.lease.gen}, "
                 f"{view.lease.until - now}s left")
    elif view.lease_released:
        lease = (f"free (last: {view.lease.holder} generation {view.lease.gen}, released "
                 f"{now - view.lease.until - 1}s ago)")
    else:
        lease = (f"free (last: {view.lease.holder} generation {view.lease.gen}, expired "
                 f"{now - view.lease.until}s ago)")
    print(f"lease       {lease}; takeovers {view.takeovers}, refused stale writes "
          f"{view.refused_writes}")
    print(f"execution   {'PAUSED' if view.paused else 'running'}; outbox "
          f"{'HELD' if view.outbox_held else 'sending'}; lost claims → {settings.on_lost_claim}")
    print(f"next timer  {_when(view.next_timer_due, now)}")
    send = _when(view.next_send_at, now) if view.held_messages else "nothing held"
    print(f"outbox      {view.held_messages} held; next send {send}")
    print(f"approvals   {view.waiting_approvals} waiting")
    print("budgets")
    for name, budget in sorted(view.budgets.items()):
        limit = "unlimited" if budget.get("limit") is None else budget["limit"]
        used = f"{budget['used']} / {limit}" if "used" in budget else f"limit {limit}"
        print(f"  {name:<22} {used:<18} excess {budget.get('excess')}")
    return OK


async def cmd_show(args: argparse.Namespace) -> int:
    async with await _open(args) as inbox:
        event = await inbox.get_event(args.event_id)
        if event is None:
            raise CliError(f"no event {args.event_id} in {args.path}", NOT_APPLIED)
        runs = await inbox.runs(args.event_id)
        effects = await inbox.effects(args.event_id)
        now = inbox.now()
    if args.json:
        _emit_json({"effects": effects, "event": event, "runs": runs})
        return OK
    print(f"event {event.id}  {event.source} / {event.source_id}  {event.status}  "
          f"attempts {event.attempts}")
    print(f"created     {_local(event.created, now)}")
    print(f"updated     {_local(event.updated, now)}")
    if event.error:
        print(f"error       {_one_line(event.error)}")
    print(f"payload     {json.dumps(event.payload, ensure_ascii=False, sort_keys=True)}")
    for run in runs:
        finished = f"  finished {_local(run.finished_at, now)}" if run.finished_at else ""
        print(f"run {run.id}  {run.holder} generation {run.gen}  claimed "
              f"{_local(run.claimed_at, now)}{finished}  outcome {run.outcome or 'running'}"
              + (f"  ({_one_line(run.error)})" if run.error else ""))
        if run.traceback:
            print("  traceback (the agent's, most recent call last):")
            for line in run.traceback.rstrip().splitlines():
                print(f"    {line}")
    for effect in effects:
        print(f"effect {effect.name}  {effect.state}  key {effect.key}  run {effect.run_id}  "
              f"detail {json.dumps(effect.detail, ensure_ascii=False, sort_keys=True)}")
    return OK


async def cmd_events(args: argparse.Namespace) -> int:
    async with await _open(args) as inbox:
        rows = await inbox.events(args.status, limit=args.limit, after=args.after)
    if args.json:
        _emit_json(rows)
        return OK
    for e in rows:
        error = f"  {_one_line(e.error)[:80]}" if e.error else ""
        print(f"{e.id}\t{e.source}\t{e.source_id}\t{e.status}\tattempts {e.attempts}{error}")
    return OK


async def cmd_approvals(args: argparse.Namespace) -> int:
    async with await _open(args) as inbox:
        rows = await inbox.approvals(limit=args.limit)
        now = inbox.now()
    if args.json:
        _emit_json(rows)
        return OK
    for a in rows:
        state = f"waiting, expires {_when(a.due, now)}" if a.answer is None else \
            f"{a.answer} by {a.answered_by}"
        print(f"{a.request_id}\t{_one_line(a.action)}\t{state}")
    return OK


async def _event_action(args: argparse.Namespace, name: str) -> int:
    async with await _open(args) as inbox:
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
        _emit_json({"action": name, "applied": applied, "event_id": args.event_id,
                    "reason": why, "status": status})
    elif applied:
        print(f"{name}: event {args.event_id} is now {status}")
    if not applied:
        if not args.json:
            print(f"onwatch: {name} not applied to event {args.event_id}: "
                  f"{_one_line(why or 'refused')}", file=sys.stderr)
        return NOT_APPLIED
    return OK


def _event_command(name: str) -> Callable[[argparse.Namespace], int]:
    return _run(lambda args: _event_action(args, name))


async def _answer(args: argparse.Namespace, answer: str) -> int:
    async with await _open(args) as inbox:
        if answer == "expired":
            standing = await inbox.expire_approval(args.request_id, actor=args.actor,
                                                   reason=args.reason)
        else:
            standing = await inbox.answer_approval(args.request_id, answer, actor=args.actor,
                                                   reason=args.reason)
    applied = standing == answer
    if args.json:
        _emit_json({"applied": applied, "request_id": args.request_id, "standing": standing})
    else:
        print(standing)
        if not applied:
            why = ("no such request" if standing == "unknown"
                   else f"the answer that stands is {standing!r}")
            print(f"onwatch: {args.subcommand} not applied to {_clip(args.request_id, 200)}: "
                  f"{why}", file=sys.stderr)
    return OK if applied else NOT_APPLIED


def _answer_command(answer: str) -> Callable[[argparse.Namespace], int]:
    return _run(lambda args: _answer(args, answer))


_FLAGS = {
    "pause": ("pause", "paused", "execution paused: claims return nothing, intake goes on"),
    "resume": ("resume", "paused", "execution resumed"),
    "hold": ("hold_outbox", "outbox_held", "outbox held: nothing is sent until `release`"),
    "release": ("release_outbox", "outbox_held", "outbox released"),
}


async def _flag(args: argparse.Namespace, name: str) -> int:
    method, field, message = _FLAGS[name]
    async with await _open(args) as inbox:
        changed = await getattr(inbox, method)(actor=args.actor, reason=args.reason)
        view = await inbox.overview()
    state = getattr(view, field)
    if args.json:
        _emit_json({"changed": changed, field: state})
    else:
        print(message if changed else f"already so: {message}")
    return OK


def _flag_command(name: str) -> Callable[[argparse.Namespace], int]:
    return _run(lambda args: _flag(args, name))


async def cmd_config(args: argparse.Namespace) -> int:
    changes = _assignments(args.settings)
    async with await _open(args) as inbox:
        before = json.loads(inbox.settings.to_json())
        if changes:
            await inbox.configure(**changes)
        after = json.loads(inbox.settings.to_json())
    if args.json:
        _emit_json(after)
        return OK
    keys = sorted(changes) if changes else sorted(after)
    for key in keys:
        value = json.dumps(after[key], sort_keys=True)
        was = f"   (was {json.dumps(before[key], sort_keys=True)})" if changes and \
            before[key] != after[key] else ""
        print(f"{key} = {value}{was}")
    return OK


async def cmd_dispatch(args: argparse.Namespace) -> int:
    send = _Recording(_channel(args))
    async with await _open(args) as inbox:
        if args.now:
            sent = await inbox.flush_outbox(send, actor=args.actor, reason=args.reason)
        else:
            sent = await inbox.dispatch(send)
        next_send = await inbox.next_send_at()
        now = inbox.now()
    if args.json:
        _emit_json({"error": send.error, "next_send_at": next_send, "sent": sent})
    elif send.error is None:
        note = f"{sent} message(s) sent" if sent else "nothing sent"
        if next_send is not None:
            note += f"; next send allowed {_when(next_send, now)}"
        print(f"onwatch: {note}", file=sys.stderr)
    if send.error is not None:
        if not args.json:
            print(f"onwatch: delivery failed, messages stay held: {send.error}",
                  file=sys.stderr)
        return NOT_APPLIED
    return OK


def _setup_step(setup: Callable, spec: str) -> Callable[[Inbox], Any]:
    """--setup as the worker calls it: if the user's function fails, say so (one line),
    rather than report an onwatch 'internal error'."""
    async def step(inbox: Inbox) -> None:
        try:
            outcome = setup(inbox)
            if inspect.isawaitable(outcome):
                await outcome
        except InboxError:
            raise  # reported like every inbox refusal
        except (Exception, SystemExit) as exc:
            raise CliError(f"--setup {spec} failed: {type(exc).__name__}: "
                           f"{_one_line(exc)}") from None
    return step


def _restoring_signals(handler: Callable[[argparse.Namespace], int]
                       ) -> Callable[[argparse.Namespace], int]:
    """Put SIGTERM/SIGINT handling back as it was when `handler` returns: main() may be
    called in-process (by a test, or a program embedding the command line)."""
    @functools.wraps(handler)
    def run(args: argparse.Namespace) -> int:
        saved = {signum: signal.getsignal(signum) for signum in (signal.SIGTERM, signal.SIGINT)}
        try:
            return handler(args)
        finally:
            for signum, previous in saved.items():
                signal.signal(signum, previous)
    return run


@_restoring_signals
def cmd_worker(args: argparse.Namespace) -> int:
    # A stop asked for while starting up still means a clean exit 0.
    early: list[int] = []
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda number, frame: early.append(number))
    from core.worker import Worker
    agent = _load_callable(args.agent, "--agent")
    setup = _setup_step(_load_callable(args.setup, "--setup"), args.setup) if args.setup \
        else None
    logging.basicConfig(level=getattr(logging, args.log_level.upper()), stream=sys.stderr,
                        format="%(asctime)s onwatch-worker %(levelname)s %(message)s")

    if _is_postgres_url(args.path):  # woken by NOTIFY, polling only as the fallback
        from core.pg.worker import ListeningWorker as Worker
    if args.all_inboxes:
        return _fleet_worker(args, agent, early)

    async def main() -> int:
        async with await _open(args) as inbox, _metrics_server(inbox, args) as metrics:
            worker = Worker(inbox, agent, holder=args.holder, send=_channel(args),
                            poll_interval=args.poll, grace=args.grace, setup=setup,
                            max_runs=args.max_runs, metrics=metrics)
            loop = asyncio.get_running_loop()
            for signum in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(signum, worker.request_stop)
            if early:
                worker.request_stop()
            stats = await worker.run()
        print(f"onwatch: worker {_clip(worker.holder, 200)} stopped: {stats.runs} run(s), "
              f"{stats.done} done, {stats.failed} failed, {stats.abandoned} abandoned, "
              f"{stats.refused} refused, {stats.sent} message(s) sent", file=sys.stderr)
        return OK
    return _run_loop(main())


@contextlib.asynccontextmanager
async def _metrics_server(inbox: Inbox, args: argparse.Namespace):
    """--metrics-port N: GET /metrics on 127.0.0.1:N for the worker's whole life; yields the
    worker's counters (None without the option)."""
    if args.metrics_port is None:
        yield None
        return
    from core.metrics import InboxMetrics, start_metrics_server
    metrics = InboxMetrics(inbox)
    try:
        server = await start_metrics_server(metrics, host="127.0.0.1", port=args.metrics_port)
    except OSError as exc:
        raise CliError(f"--metrics-port: cannot listen on 127.0.0.1:{args.metrics_port}: "
                       f"{exc.strerror or exc}", NOT_APPLIED) from None
    logging.getLogger("onwatch.worker").info("metrics on %s", server.url)
    try:
        yield metrics.worker
    finally:
        await server.close()


def _fleet_worker(args: argparse.Namespace, agent: Callable, early: list[int]) -> int:
    """`worker URL --all-inboxes`: every inbox of the database that has work, N at once."""
    if not _is_postgres_url(args.path):
        raise CliError("--all-inboxes serves a postgresql:// database (a file is one inbox)")
    if args.setup or args.max_runs or args.metrics_port is not None:
        raise CliError("--setup, --max-runs and --metrics-port are for one inbox, not "
                       "--all-inboxes")
    from core.pg.fleet import FleetWorker
    from core.worker import default_holder

    async def main() -> int:
        fleet = FleetWorker(args.path, agent, holder=args.holder or default_holder(),
                            concurrency=args.concurrency, send=_channel(args),
                            poll_interval=args.poll, grace=args.grace)
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, fleet.request_stop)
        if early:
            fleet.request_stop()
        runs = await fleet.run()
        print(f"onwatch: fleet worker {_clip(fleet.holder, 200)} stopped: {runs} run(s) over "
              f"{len(fleet.served)} inbox(es)", file=sys.stderr)
        return OK
    return _run_loop(main())


def _lazy(module: str, what: str) -> Any:
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise CliError(f"{what} is not available in this build ({_one_line(exc)})") from None


def cmd_tui(args: argparse.Namespace) -> int:
    url = args.path.startswith(("postgresql://", "postgres://"))
    if os.path.isdir(args.path) or (url and args.inbox is None):  # the fleet desk
        fleet = _lazy("tui.fleet", "the fleet desk")
        return fleet.run(args.path, read_only=args.read_only) or OK
    if url or args.inbox is not None:  # one inbox of a database (a file refuses --inbox)
        app = _lazy("tui.app", "the TUI")
        return app.run(args.path, read_only=args.read_only, name=args.inbox) or OK
    if not os.path.exists(args.path):
        raise CliError(f"no inbox at {args.path} (run `onwatch init {args.path}` first)")
    app = _lazy("tui.app", "the TUI")
    return app.run(args.path, read_only=args.read_only) or OK


def cmd_demo(args: argparse.Namespace) -> int:
    demo = _lazy("tui.demo", "the demo")
    return demo.run(live=args.live) or OK


def cmd_web(args: argparse.Namespace) -> int:
    web = _lazy("tui.web", "the browser desk")
    return web.main(args) or OK


def cmd_serve(args: argparse.Namespace) -> int:
    webhooks = _lazy("core.webhooks", "the webhook receiver")
    main = getattr(webhooks, "main", None)
    if main is None:
        raise CliError("the webhook receiver is not available in this build")
    return main(args) or OK


def cmd_run(args: argparse.Namespace) -> int:
    """The receiver, the scheduler and the worker in one process on one inbox: a stored
    delivery wakes the worker directly; SIGTERM stops the worker (lease released), then the
    server (requests in flight finish)."""
    early: list[int] = []
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda number, frame: early.append(number))
    from core.webhooks import (
        ConfigError, check_args, config_file_warning, load_secrets, start_server,
    )
    from core.worker import Worker
    try:
        check_args(args)  # the same checks as `onwatch serve`
        secrets = load_secrets(os.environ, args.config)
    except ConfigError as exc:
        raise CliError(str(exc)) from None
    if args.config is not None and (warning := config_file_warning(args.config)):
        print(f"onwatch: warning: {warning}", file=sys.stderr)
    agent = _load_callable(args.agent, "--agent")
    setup = _setup_step(_load_callable(args.setup, "--setup"), args.setup) if args.setup \
        else None
    logging.basicConfig(level=getattr(logging, args.log_level.upper()), stream=sys.stderr,
                        format="%(asctime)s onwatch-run %(levelname)s %(message)s")

    async def main() -> int:
        async with await _open(args) as inbox:
            worker = Worker(inbox, agent, holder=args.holder, send=_channel(args),
                            poll_interval=args.poll, grace=args.grace, setup=setup,
                            max_runs=args.max_runs)
            try:
                server = await start_server(inbox, secrets=secrets, host=args.host,
                                            port=args.port, max_body=args.max_body)
            except OSError as exc:
                raise CliError(f"cannot listen on {args.host}:{args.port}: "
                               f"{exc.strerror or exc}", NOT_APPLIED) from None
            loop = asyncio.get_running_loop()
            for signum in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(signum, worker.request_stop)
            if early:
                worker.request_stop()
            logging.getLogger("onwatch.run").info(
                "listening on %s (%s); worker %s on %s", server.url, secrets.describe(),
                worker.holder, inbox.path)
            try:
                stats = await worker.run()
            finally:
                await server.close()
        print(f"onwatch: run {worker.holder} stopped: {stats.runs} run(s), {stats.done} done, "
              f"{stats.failed} failed, {stats.abandoned} abandoned, {stats.sent} message(s) "
              f"sent", file=sys.stderr)
        return OK
    return asyncio.run(main())


# --- the parser -----------------------------------------------------------------------------

EPILOG = """\
examples:
  onwatch init alice.db
  onwatch ingest alice.db chat msg-1 '{"text": "hello"}'
  onwatch worker alice.db --agent core.example_agent:handle
  onwatch status alice.db --json
  onwatch approve alice.db refund-msg-2 --actor ana --reason "customer verified"
  onwatch tui alice.db

exit codes: 0 done · 1 not applied / refused · 2 bad usage, bad input or not an inbox ·
3 inbox locked by another process for longer than --busy-timeout
"""

STATUS_EPILOG = """\
--json prints one object (keys sorted):
  path, now                 the file and the instant read (Unix seconds)
  counts                    {state: number} for pending, running, done, dead, interrupted,
                            cancelled
  lease                     {holder, gen, until} or null; until < now means expired
  lease_ttl, on_lost_claim  the lease length (s) and the lost-claim policy
  takeovers, refused_writes generation changes by takeover; refused stale writes
  paused, outbox_held       operator switches
  held_messages, next_send_at
                            outbox messages waiting, and when the next paced send may go
  next_timer_due            the soonest timer (or null)
  waiting_approvals         approval requests without an answer
  runs_last_day             runs claimed in the last 24 h
  budgets                   {name: {limit, used (where counted), excess}}: excess is
                            "delayed" (max_runs_per_day), "refused" (max_pending,
                            max_followups_per_run) or "lost claim" (max_run_seconds)
"""

CONFIG_EPILOG = """\
values are JSON where they parse (5, true, {"stripe": "interrupt"}), none/unlimited for no
limit, else plain text (interrupt). Budgets (SPEC 1.9):
  max_runs_per_day=N         excess delayed: claims wait until the 24 h window frees a slot
  max_pending=N              excess refused: ingest exits 1 (BudgetExceeded)
  max_followups_per_run=N    excess refused: the run's finish fails, the event backs off
  max_run_seconds=N          excess treated as a lost claim (retry or interrupt)
examples:
  onwatch config alice.db
  onwatch config alice.db max_pending=1000 max_runs_per_day=200 on_lost_claim=interrupt
  onwatch config alice.db 'lost_claim_by_source={"stripe": "interrupt"}' max_pending=none
"""

WORKER_EPILOG = """\
the agent is `async def handle(batch, ctx)` (or a plain def, run in a thread): batch is a list
of core.Event; ctx.reply(text, urgent=False), ctx.ask_approval(request_id, expires_in,
action), ctx.follow_up(timer_id, due, payload=None, every=None), ctx.result = …, and
`async with ctx.effect(name, detail) as key:` around an external effect.

SIGTERM or Ctrl-C: the current run may finish within --grace seconds (else it is abandoned
and recovered by the next worker under the lost-claim policy), the lease is released, exit 0.
A second signal abandons the run at once.

examples:
  onwatch worker alice.db --agent core.example_agent:handle \\
      --setup core.example_agent:ensure_digest
  onwatch worker alice.db --agent my_agent:handle --command 'mail -s agent me@example.org'
  onwatch worker alice.db --agent ./agent.py:handle --file sent.jsonl --holder box-1
"""


WEB_EPILOG = """\
The browser gets the same app as `onwatch tui TARGET`, one process per browser tab. The door
is locked with a token: $ONWATCH_WEB_TOKEN (16 characters or more), or a new random one
printed at start as part of the URL to open. The first visit with ?token= sets a session
cookie and drops the token from the address bar. Listening beyond 127.0.0.1 needs
$ONWATCH_WEB_TOKEN; put a TLS reverse proxy in front (see the README).

examples:
  onwatch web alice.db
  onwatch web inboxes/ --read-only
  ONWATCH_WEB_TOKEN=$(cat ~/.onwatch-web-token) onwatch web alice.db \\
      --public-url https://desk.example.org
"""


def build_parser() -> Parser:
    common = Parser(add_help=False)
    common.add_argument("--busy-timeout", type=_seconds(), default=5.0, metavar="SECONDS",
                        help="how long to wait for another process's write lock (default 5)")
    as_json = Parser(add_help=False)
    as_json.add_argument("--json", action="store_true",
                         help="print one JSON object (sorted keys) instead of text")
    operator = Parser(add_help=False)
    operator.add_argument("--actor", default=_default_actor(),
                          help="who acts, for the audit log (default $ONWATCH_ACTOR or "
                               "cli:USER)")
    operator.add_argument("--reason", help="why, for the audit log")
    channel = Parser(add_help=False)
    group = channel.add_mutually_exclusive_group()
    group.add_argument("--stdout", action="store_true",
                       help="print each send to stdout (the default)")
    group.add_argument("--file", metavar="FILE",
                       help="append each send to FILE as a JSON line {at, count, key, text}")
    group.add_argument("--command", metavar="CMD",
                       help="pipe each send to a shell command (key in "
                            "$ONWATCH_DELIVERY_KEY); non-zero exit = failed delivery")

    parser = Parser(prog=PROG, description="A durable inbox and a supervision desk for an "
                    "always-on AI agent.", epilog=EPILOG,
                    formatter_class=argparse.RawDescriptionHelpFormatter)
    subs = parser.add_subparsers(dest="subcommand", metavar="COMMAND", parser_class=Parser)

    def sub(name: str, help_text: str, handler: Callable, parents: tuple = (common,),
            epilog: str | None = None, path: bool = True) -> Parser:
        p = subs.add_parser(name, help=help_text, description=help_text, parents=list(parents),
                            epilog=epilog, formatter_class=argparse.RawDescriptionHelpFormatter)
        if path:
            p.add_argument("path", type=_inbox_path, metavar="PATH", help="the inbox file")
            p.add_argument("--inbox", default="default", metavar="NAME",
                           help="which inbox of a postgresql:// database PATH (a file is one "
                                "inbox)")
        p.set_defaults(handler=handler)
        return p

    p = sub("init", "create an inbox file (or check an existing one), optionally with settings",
            _run(cmd_init), (common, as_json))
    p.add_argument("settings", nargs="*", metavar="KEY=VALUE", help="settings to store")

    p = sub("ingest", "store an event; prints 'stored' or 'duplicate' (both exit 0)",
            _run(cmd_ingest), (common, as_json),
            epilog="example: onwatch ingest alice.db github delivery-42 '{\"action\": "
                   "\"opened\"}'\n(JSON '-' reads the payload from stdin)")
    p.add_argument("source", metavar="SOURCE")
    p.add_argument("source_id", metavar="SOURCE_ID", help="dedupe key within SOURCE")
    p.add_argument("payload", nargs="?", metavar="JSON", help="payload (JSON; '-' for stdin)")

    sub("status", "counts, lease, switches, next timer and send, budgets",
        _run(cmd_status), (common, as_json), epilog=STATUS_EPILOG)

    p = sub("show", "one event with its runs and effect journal", _run(cmd_show),
            (common, as_json))
    p.add_argument("event_id", type=_whole(1), metavar="EVENT_ID")

    p = sub("events", "list events in one state (keyset pages by id)", _run(cmd_events),
            (common, as_json))
    p.add_argument("status", nargs="?", default="pending", metavar="STATE",
                   choices=("pending", "running", "done", "dead", "interrupted", "cancelled"))
    p.add_argument("--limit", type=_whole(1), default=50)
    p.add_argument("--after", type=_whole(0), metavar="EVENT_ID", help="page after this id")

    p = sub("approvals", "list approval requests (waiting first)", _run(cmd_approvals),
            (common, as_json))
    p.add_argument("--limit", type=_whole(1), default=100)

    p = sub("tui", "open the supervisor TUI on an inbox (or the fleet desk on a folder of "
                   "inbox files)", cmd_tui, ())
    p.add_argument("--read-only", action="store_true", help="no actions, only watching")
    p.set_defaults(inbox=None)  # no --inbox on a database URL: the fleet desk over every inbox

    p = sub("web", "serve the supervisor desk in a browser (token required)", cmd_web, (),
            path=False, epilog=WEB_EPILOG)
    p.add_argument("target", type=_inbox_path, metavar="TARGET",
                   help="an inbox file, or a folder of inbox files (the fleet desk)")
    p.add_argument("--inbox", metavar="NAME",
                   help="the inbox to open in a PostgreSQL database (not for a file target)")
    p.add_argument("--host", default="127.0.0.1",
                   help="address to listen on (default 127.0.0.1; any other needs "
                        "$ONWATCH_WEB_TOKEN)")
    p.add_argument("--port", type=_port, default=8000, help="port (default 8000)")
    p.add_argument("--read-only", action="store_true", help="no actions, only watching")
    p.add_argument("--public-url", metavar="URL",
                   help="the address browsers use, when behind a reverse proxy "
                        "(e.g. https://desk.example.org)")

    p = sub("demo", "play every failure scenario in the TUI on a scratch inbox", cmd_demo, (),
            path=False)
    p.add_argument("--live", action="store_true",
                   help="real worker processes running the example agent: kill the active one "
                        "and watch the takeover")

    p = sub("worker", "run an agent on the inbox: lease, scheduler, claims, finishes, sends",
            cmd_worker, (common, channel), epilog=WORKER_EPILOG)
    p.add_argument("--agent", required=True, metavar="MODULE:FUNCTION",
                   help="the agent function, e.g. core.example_agent:handle or ./a.py:handle")
    p.add_argument("--setup", metavar="MODULE:FUNCTION",
                   help="called once with the inbox before the first run (e.g. to register "
                        "timers)")
    p.add_argument("--holder", help="lease holder name, unique per process (default host:pid)")
    p.add_argument("--no-dispatch", action="store_true",
                   help="leave the outbox to another process (`onwatch dispatch`)")
    p.add_argument("--poll", type=_seconds(), default=0.5, metavar="SECONDS",
                   help="how often an idle worker checks for new commits (default 0.5)")
    p.add_argument("--grace", type=_seconds(allow_zero=True), default=10.0, metavar="SECONDS",
                   help="on SIGTERM, how long the current run may take to finish (default 10)")
    p.add_argument("--max-runs", type=_whole(1), metavar="N", help="stop after N runs")
    p.add_argument("--all-inboxes", action="store_true",
                   help="serve every inbox of a postgresql:// database that has work")
    p.add_argument("--concurrency", type=_whole(1), default=10, metavar="N",
                   help="with --all-inboxes: inboxes served at once (default 10)")
    p.add_argument("--metrics-port", type=_port, metavar="N",
                   help="serve Prometheus metrics at http://127.0.0.1:N/metrics (default off; "
                        "0 picks a free port, logged)")
    p.add_argument("--log-level", default="info",
                   choices=("debug", "info", "warning", "error"))

    p = sub("dispatch", "send what the outbox allows now (one paced send)", _run(cmd_dispatch),
            (common, as_json, channel, operator))
    p.add_argument("--now", action="store_true",
                   help="send everything held now, ignoring the gap and a hold (audited)")

    for name, help_text, expect_help in (
            ("requeue", "dead/interrupted/cancelled → pending, with fresh attempts", None),
            ("cancel", "pending → cancelled (a running event cannot be cancelled)", None),
            ("resolve", "interrupted → done: the uncertain effect did happen", None),
            ("bury", "interrupted or pending → dead, by hand", None)):
        p = sub(name, help_text, _event_command(name), (common, as_json, operator))
        p.add_argument("event_id", type=_whole(1), metavar="EVENT_ID")
        p.add_argument("--expect", metavar="STATE",
                       help="only act if the event is in this state (what you saw)")

    for name, answer, help_text in (
            ("approve", "yes", "answer yes; prints the answer that stands"),
            ("deny", "no", "answer no; prints the answer that stands"),
            ("expire", "expired", "expire a waiting request now; prints the answer that "
                                  "stands")):
        p = sub(name, help_text, _answer_command(answer), (common, as_json, operator),
                epilog="exit 0 if this answer stands, 1 if another one (or 'unknown') does")
        p.add_argument("request_id", metavar="REQUEST_ID")

    for name, help_text in (("pause", "pause execution (claims return nothing; intake goes on)"),
                            ("resume", "resume execution"),
                            ("hold", "hold the outbox (nothing is sent)"),
                            ("release", "release the outbox")):
        sub(name, help_text, _flag_command(name), (common, as_json, operator))

    p = sub("config", "show settings, or set KEY=VALUE ones (budgets included)",
            _run(cmd_config), (common, as_json), epilog=CONFIG_EPILOG)
    p.add_argument("settings", nargs="*", metavar="KEY=VALUE")

    p = sub("serve", "receive signed webhooks into the inbox (ack only once stored)",
            cmd_serve, (common,))
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default "
                   "127.0.0.1)")
    p.add_argument("--port", type=_port, default=8787, help="port (default 8787)")
    p.add_argument("--config", metavar="FILE", help="sources and their secrets")
    p.add_argument("--max-body", type=int, metavar="BYTES", help="largest accepted body")

    p = sub("run", "receiver, scheduler and worker in one process (serve + worker options)",
            cmd_run, (common, channel), epilog=RUN_EPILOG)
    p.add_argument("--agent", required=True, metavar="MODULE:FUNCTION",
                   help="the agent function, e.g. core.example_agent:handle or ./a.py:handle")
    p.add_argument("--setup", metavar="MODULE:FUNCTION",
                   help="called once with the inbox before the first run")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default "
                   "127.0.0.1)")
    p.add_argument("--port", type=int, default=8787, help="port (default 8787)")
    p.add_argument("--config", metavar="FILE", help="sources and their secrets")
    p.add_argument("--max-body", type=_whole(1), metavar="BYTES", help="largest accepted body")
    p.add_argument("--holder", help="lease holder name, unique per process (default host:pid)")
    p.add_argument("--no-dispatch", action="store_true",
                   help="leave the outbox to another process (`onwatch dispatch`)")
    p.add_argument("--poll", type=_seconds(), default=0.5, metavar="SECONDS",
                   help="the fallback poll for other processes' commits (default 0.5)")
    p.add_argument("--grace", type=_seconds(allow_zero=True), default=10.0, metavar="SECONDS",
                   help="on SIGTERM, how long the current run may take to finish (default 10)")
    p.add_argument("--max-runs", type=_whole(1), metavar="N", help="stop after N runs")
    p.add_argument("--log-level", default="info",
                   choices=("debug", "info", "warning", "error"))
    return parser


RUN_EPILOG = """\
One process, one inbox: webhook deliveries are answered 2xx once committed, and the commit
wakes the worker in the same process at once. SIGTERM/SIGINT: the current run may finish
within --grace, the lease is released, then the server stops (requests in flight finish);
exit 0. Secrets come from the environment or --config, as for `onwatch serve`.

examples:
  ONWATCH_HOOK_SECRET_CHAT=s3cret onwatch run alice.db --agent core.example_agent:handle
  onwatch run alice.db --agent my_agent:handle --config hooks.toml --port 9000 --file out.jsonl
"""


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `onwatch` console script; returns the exit code. With `argv`
    None the command line owns the process: it ends even if a thread is left running."""
    code = _main(argv)
    if argv is None:
        _leave_no_thread_behind(code)
    return code


def _main(argv: list[str] | None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        if getattr(args, "handler", None) is None:
            parser.print_help(sys.stderr)
            return BAD
        _check_text_arguments(args)
        if args.handler in (cmd_tui, cmd_demo):  # the app owns the terminal
            return int(args.handler(args) or OK)
        with _terminal_safe_output():
            return int(args.handler(args) or OK)
    except SystemExit as exc:  # --help, or argparse's own exit
        return exc.code if exc.code in (OK, NOT_APPLIED, BAD, BUSY) else BAD
    except CliError as exc:
        _fail(str(exc))
        return exc.code
    except InboxBusy as exc:
        _fail(str(exc))
        return BUSY
    except (BadInput, NotAnInbox) as exc:
        _fail(str(exc))
        return BAD
    except BudgetExceeded as exc:
        _fail(str(exc))
        return NOT_APPLIED
    except InboxError as exc:
        _fail(str(exc))
        return NOT_APPLIED
    except KeyboardInterrupt:
        _fail("interrupted")
        return 130
    except BrokenPipeError:
        return OK
    except OSError as exc:
        if exc.filename is None:  # not about a path the caller gave: a bug, below
            return _internal_error(exc)
        _fail(f"{exc.strerror or exc}: {_clip(os.fsdecode(exc.filename), 200)}")
        return BAD
    except Exception as exc:  # a bug: still one line, the traceback only on request
        return _internal_error(exc)


def _internal_error(exc: Exception) -> int:
    if os.environ.get("ONWATCH_DEBUG"):
        raise exc
    _fail(f"internal error: {type(exc).__name__}: {exc} (set ONWATCH_DEBUG=1 for the "
          f"traceback)")
    return NOT_APPLIED


def _check_text_arguments(args: argparse.Namespace) -> None:
    """Refuse (exit 2) any argument SQLite or the OS cannot take as text: a NUL (possible
    only in-process), or bytes that are not UTF-8 (argv decodes them to lone surrogates)."""
    for name, value in vars(args).items():
        for text in value if isinstance(value, list) else [value]:
            if not isinstance(text, str):
                continue
            if "\x00" in text:
                raise CliError(f"argument {name}: contains a NUL character")
            try:
                text.encode("utf-8")
            except UnicodeEncodeError:
                raise CliError(f"argument {name}: is not valid UTF-8 text "
                               f"({_clip(text)!r})") from None


class _TerminalSafe:
    """A text stream that escapes control and invisible characters on the way out: what the
    commands print includes inbox text (sources, ids, actions, errors, message bodies)."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        return self._stream.write(printable(text, keep="\n\t"))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


@contextlib.contextmanager
def _terminal_safe_output() -> Iterator[None]:
    saved = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = _TerminalSafe(sys.stdout), _TerminalSafe(sys.stderr)
    try:
        yield
    finally:
        sys.stdout, sys.stderr = saved


def _fail(message: str) -> None:
    text = printable(_one_line(message))
    print(text if text.startswith(PROG) else f"{PROG}: {text}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
