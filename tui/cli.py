"""The `onwatch` command line: scripts and operators act on an inbox file from a shell.

Exit codes (every subcommand):
  0  done (an ingest that was a duplicate is still 0: the event is stored exactly once)
  1  the action was not applied or was refused (state changed meanwhile, budget, answer
     already stands, delivery failed)
  2  bad usage, bad input, or the file is not an onwatch inbox
  3  the inbox stayed locked by another process for longer than the busy timeout

Errors go to stderr as one line starting with "onwatch: ". The TUI (textual) is imported only
by `onwatch tui` and `onwatch demo`, so every other subcommand starts fast.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import datetime as dt
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
import types
from typing import Any, Callable, Iterator

from core import BadInput, BudgetExceeded, Inbox, InboxBusy, InboxError, NotAnInbox
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
    stamp = dt.datetime.fromtimestamp(instant, dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    delta = instant - now
    if delta == 0:
        return f"now ({stamp})"
    span = _span(abs(delta))
    return f"in {span} ({stamp})" if delta > 0 else f"{span} ago ({stamp})"


def _span(seconds: int) -> str:
    parts = []
    for unit, size in (("d", 86_400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            parts.append(f"{seconds // size}{unit}")
            seconds %= size
    if seconds or not parts:
        parts.append(f"{seconds}s")
    return " ".join(parts[:2])


def _parse_value(text: str) -> Any:
    """A setting's value: JSON if it parses (5, true, {"a": "b"}), None for none/null/
    unlimited, else the bare string (interrupt)."""
    if text.strip().lower() in ("none", "null", "unlimited", "off"):
        return None
    try:
        return json.loads(text)
    except ValueError:
        return text


def _assignments(pairs: list[str]) -> dict[str, Any]:
    changes: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise CliError(f"expected key=value, got {pair!r}")
        changes[key.strip()] = _parse_value(value)
    return changes


def _inbox_path(text: str) -> str:
    """argparse type of PATH: SQLite would take '' for a throwaway temporary database."""
    if not text:
        raise argparse.ArgumentTypeError("expected the inbox file's path, got ''")
    return text


def _seconds(*, allow_zero: bool = False) -> Callable[[str], float]:
    """argparse type: a finite number of seconds, positive (or, allow_zero, non-negative)."""
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan  # refused below, as NaN is
        if not (0 <= value if allow_zero else 0 < value) or value == math.inf:
            kind = "non-negative" if allow_zero else "positive"
            raise argparse.ArgumentTypeError(f"expected a {kind} number of seconds, got "
                                             f"{text!r}")
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
                                             f"{_MAX_INTEGER}, got {text!r}")
        return value
    return parse


def _default_actor() -> str:
    env = os.environ.get("ONWATCH_ACTOR")
    if env:
        return env
    try:
        return f"cli:{getpass.getuser()}"
    except Exception:  # no user name in this environment
        return "cli"


async def _open(args: argparse.Namespace, *, create: bool = False) -> Inbox:
    return await Inbox.open(args.path, create=create, busy_timeout=args.busy_timeout)


def _run(coro_fn: Callable[[argparse.Namespace], Any]) -> Callable[[argparse.Namespace], int]:
    def handler(args: argparse.Namespace) -> int:
        return asyncio.run(coro_fn(args))
    return handler


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
    except Exception as exc:
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

async def cmd_init(args: argparse.Namespace) -> int:
    existed = os.path.exists(args.path) and os.path.getsize(args.path) > 0
    changes = _assignments(args.settings)
    inbox = await _open(args, create=True)
    async with inbox:
        if changes:
            await inbox.configure(**changes)
        if args.json:
            _emit_json({"created": not existed, "path": args.path,
                        "settings": json.loads(inbox.settings.to_json())})
        else:
            print(f"{'already an inbox' if existed else 'created'}: {args.path}")
    return OK


def _payload(text: str | None) -> Any:
    if text is None:
        return None
    if text == "-":
        text = sys.stdin.read()
    try:
        return json.loads(text)
    except ValueError as exc:
        raise CliError(f"the payload is not valid JSON: {exc}") from None
    except RecursionError:
        raise CliError("the payload is nested too deeply") from None


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
    if args.json:
        _emit_json({"effects": effects, "event": event, "runs": runs})
        return OK
    print(f"event {event.id}  {event.source} / {event.source_id}  {event.status}  "
          f"attempts {event.attempts}")
    if event.error:
        print(f"error       {_one_line(event.error)}")
    print(f"payload     {json.dumps(event.payload, ensure_ascii=False, sort_keys=True)}")
    for run in runs:
        print(f"run {run.id}  {run.holder} generation {run.gen}  claimed {run.claimed_at}  "
              f"outcome {run.outcome or 'running'}" + (f"  ({_one_line(run.error)})"
                                                       if run.error else ""))
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
            print(f"onwatch: {args.subcommand} not applied to {args.request_id}: {why}",
                  file=sys.stderr)
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
        except Exception as exc:
            raise CliError(f"--setup {spec} failed: {type(exc).__name__}: "
                           f"{_one_line(exc)}") from None
    return step


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

    async def main() -> int:
        async with await _open(args) as inbox:
            worker = Worker(inbox, agent, holder=args.holder, send=_channel(args),
                            poll_interval=args.poll, grace=args.grace, setup=setup,
                            max_runs=args.max_runs)
            loop = asyncio.get_running_loop()
            for signum in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(signum, worker.request_stop)
            if early:
                worker.request_stop()
            stats = await worker.run()
        print(f"onwatch: worker {worker.holder} stopped: {stats.runs} run(s), {stats.done} "
              f"done, {stats.failed} failed, {stats.abandoned} abandoned, {stats.refused} "
              f"refused, {stats.sent} message(s) sent", file=sys.stderr)
        return OK
    return asyncio.run(main())


def _lazy(module: str, what: str) -> Any:
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise CliError(f"{what} is not available in this build ({_one_line(exc)})") from None


def cmd_tui(args: argparse.Namespace) -> int:
    if os.path.isdir(args.path):  # a folder of inboxes: the fleet desk
        fleet = _lazy("tui.fleet", "the fleet desk")
        return fleet.run(args.path, read_only=args.read_only) or OK
    if not os.path.exists(args.path):
        raise CliError(f"no inbox at {args.path} (run `onwatch init {args.path}` first)")
    app = _lazy("tui.app", "the TUI")
    return app.run(args.path, read_only=args.read_only) or OK


def cmd_demo(args: argparse.Namespace) -> int:
    demo = _lazy("tui.demo", "the demo")
    return demo.run(live=args.live) or OK


def cmd_serve(args: argparse.Namespace) -> int:
    webhooks = _lazy("core.webhooks", "the webhook receiver")
    main = getattr(webhooks, "main", None)
    if main is None:
        raise CliError("the webhook receiver is not available in this build")
    return main(args) or OK


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
    p.add_argument("--port", type=int, default=8787, help="port (default 8787)")
    p.add_argument("--config", metavar="FILE", help="sources and their secrets")
    p.add_argument("--max-body", type=int, metavar="BYTES", help="largest accepted body")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `onwatch` console script; returns the exit code."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        if getattr(args, "handler", None) is None:
            parser.print_help(sys.stderr)
            return BAD
        if args.handler in (cmd_tui, cmd_demo):  # the app owns the terminal
            return int(args.handler(args) or OK)
        with _terminal_safe_output():
            return int(args.handler(args) or OK)
    except SystemExit as exc:  # --help, or argparse's own exit
        return exc.code if isinstance(exc.code, int) else BAD
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
    except Exception as exc:  # a bug: still one line, the traceback only on request
        if os.environ.get("ONWATCH_DEBUG"):
            raise
        _fail(f"internal error: {type(exc).__name__}: {exc} (set ONWATCH_DEBUG=1 for the "
              f"traceback)")
        return NOT_APPLIED


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
