"""The argument parser of `onwatch`: every subcommand, its options, help and examples;
the commands themselves live in cli/commands/."""

from __future__ import annotations

import argparse
from typing import Callable

from onwatch.cli.commands.desks import cmd_demo, cmd_tui, cmd_web
from onwatch.cli.commands.inbox import (
    cmd_approvals,
    cmd_audit,
    cmd_config,
    cmd_events,
    cmd_ingest,
    cmd_init,
    cmd_migrate,
    cmd_show,
    cmd_status,
)
from onwatch.cli.commands.operator import act_command
from onwatch.cli.commands.runtime import cmd_dispatch, cmd_run, cmd_serve, cmd_worker
from onwatch.cli.output import BAD, PROG, CliError
from onwatch.cli.running import run_async
from onwatch.cli.values import default_actor, inbox_path, port, seconds, whole
from onwatch.core import ACTIONS


class Parser(argparse.ArgumentParser):
    """argparse, but usage errors are one line on stderr and exit 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise CliError(f"{self.prog}: {message} (see `{self.prog} --help`)", BAD)


EPILOG = """\
examples:
  onwatch init alice.db
  onwatch ingest alice.db chat msg-1 '{"text": "hello"}'
  onwatch worker alice.db --agent examples.refund_agent:handle
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
limit, else plain text (interrupt). Budgets (docs/rules.md#budgets):
  max_runs_per_day=N         excess delayed: claims wait until the 24 h window frees a slot
  max_pending=N              excess refused: ingest exits 1 (BudgetExceeded)
  max_followups_per_run=N    excess refused: the run's finish fails, the event backs off
  max_run_seconds=N          excess treated as a lost claim (retry or interrupt)
examples:
  onwatch config alice.db
  onwatch config alice.db max_pending=1000 max_runs_per_day=200 on_lost_claim=interrupt
  onwatch config alice.db 'lost_claim_by_source={"stripe": "interrupt"}' max_pending=none
"""

MIGRATE_EPILOG = """\
No other command migrates an inbox: reads, ingests and the desk work on the previous
release's schema as it is. A worker of this release (worker, run) and init migrate too.
Refused (exit 1, nothing changed) while a worker holds the lease: stop the workers of the
older release first (each hands its lease back). See docs/rules.md, "Upgrading a running
deployment".

examples:
  onwatch migrate alice.db
  onwatch migrate postgresql://onwatch@db.example.org/agents
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
  onwatch worker alice.db --agent examples.refund_agent:handle \\
      --setup examples.refund_agent:ensure_digest
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
    common.add_argument(
        "--busy-timeout",
        type=seconds(),
        default=5.0,
        metavar="SECONDS",
        help="how long to wait for another process's write lock (default 5)",
    )
    as_json = Parser(add_help=False)
    as_json.add_argument(
        "--json", action="store_true", help="print one JSON object (sorted keys) instead of text"
    )
    operator = Parser(add_help=False)
    operator.add_argument(
        "--actor",
        default=default_actor(),
        help="who acts, for the audit log (default $ONWATCH_ACTOR or cli:USER)",
    )
    operator.add_argument("--reason", help="why, for the audit log")
    channel = Parser(add_help=False)
    group = channel.add_mutually_exclusive_group()
    group.add_argument(
        "--stdout", action="store_true", help="print each send to stdout (the default)"
    )
    group.add_argument(
        "--file",
        metavar="FILE",
        help="append each send to FILE as a JSON line {at, count, key, text}",
    )
    group.add_argument(
        "--command",
        metavar="CMD",
        help="pipe each send to a shell command (key in "
        "$ONWATCH_DELIVERY_KEY); non-zero exit = failed delivery",
    )

    # What a worker takes, alone (`worker`) or inside `run`.
    agent = Parser(add_help=False)
    agent.add_argument(
        "--agent",
        required=True,
        metavar="MODULE:FUNCTION",
        help="the agent function, e.g. examples.refund_agent:handle or ./a.py:handle",
    )
    agent.add_argument(
        "--setup",
        metavar="MODULE:FUNCTION",
        help="called once with the inbox before the first run (e.g. to register timers)",
    )
    agent.add_argument("--holder", help="lease holder name, unique per process (default host:pid)")
    agent.add_argument(
        "--no-dispatch",
        action="store_true",
        help="leave the outbox to another process (`onwatch dispatch`)",
    )
    agent.add_argument(
        "--poll",
        type=seconds(),
        default=0.5,
        metavar="SECONDS",
        help="how often an idle worker looks for other processes' commits where file "
        "notification is unavailable (default 0.5; with it, every 5 s as insurance)",
    )
    agent.add_argument(
        "--grace",
        type=seconds(allow_zero=True),
        default=10.0,
        metavar="SECONDS",
        help="on SIGTERM, how long the current run may take to finish (default 10)",
    )
    agent.add_argument("--max-runs", type=whole(1), metavar="N", help="stop after N runs")
    # What the webhook receiver takes, alone (`serve`) or inside `run`.
    receiver = Parser(add_help=False)
    receiver.add_argument(
        "--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)"
    )
    receiver.add_argument("--port", type=port, default=8787, help="port (default 8787)")
    receiver.add_argument("--config", metavar="FILE", help="sources and their secrets")
    receiver.add_argument(
        "--max-body", type=whole(1), metavar="BYTES", help="largest accepted body"
    )
    log_level = Parser(add_help=False)
    log_level.add_argument(
        "--log-level", default="info", choices=("debug", "info", "warning", "error")
    )

    parser = Parser(
        prog=PROG,
        description="A durable inbox and a supervision desk for an always-on AI agent.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    subs = parser.add_subparsers(dest="subcommand", metavar="COMMAND", parser_class=Parser)

    def sub(
        name: str,
        help_text: str,
        handler: Callable[[argparse.Namespace], int],
        parents: tuple[Parser, ...] = (common,),
        epilog: str | None = None,
        path: bool = True,
    ) -> Parser:
        p = subs.add_parser(
            name,
            help=help_text,
            description=help_text,
            parents=list(parents),
            epilog=epilog,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        if path:
            p.add_argument("path", type=inbox_path, metavar="PATH", help="the inbox file")
            p.add_argument(
                "--inbox",
                default="default",
                metavar="NAME",
                help="which inbox of a postgresql:// database PATH (a file is one inbox)",
            )
        p.set_defaults(handler=handler)
        return p

    p = sub(
        "init",
        "create an inbox file (or check an existing one), optionally with settings",
        run_async(cmd_init),
        (common, as_json),
    )
    p.add_argument("settings", nargs="*", metavar="KEY=VALUE", help="settings to store")

    p = sub(
        "migrate",
        "bring an inbox (or a postgresql:// database) to this release's schema",
        run_async(cmd_migrate),
        (common, as_json),
        epilog=MIGRATE_EPILOG,
        path=False,  # a database migrates as a whole: no --inbox
    )
    p.add_argument(
        "path", type=inbox_path, metavar="PATH", help="the inbox file or postgresql:// URL"
    )

    p = sub(
        "ingest",
        "store an event; prints 'stored' or 'duplicate' (both exit 0)",
        run_async(cmd_ingest),
        (common, as_json),
        epilog='example: onwatch ingest alice.db github delivery-42 \'{"action": '
        "\"opened\"}'\n(JSON '-' reads the payload from stdin)",
    )
    p.add_argument("source", metavar="SOURCE")
    p.add_argument("source_id", metavar="SOURCE_ID", help="dedupe key within SOURCE")
    p.add_argument("payload", nargs="?", metavar="JSON", help="payload (JSON; '-' for stdin)")

    sub(
        "status",
        "counts, lease, switches, next timer and send, budgets",
        run_async(cmd_status),
        (common, as_json),
        epilog=STATUS_EPILOG,
    )

    p = sub(
        "show", "one event with its runs and effect journal", run_async(cmd_show), (common, as_json)
    )
    p.add_argument("event_id", type=whole(1), metavar="EVENT_ID")

    p = sub(
        "events",
        "list events in one state (keyset pages by id)",
        run_async(cmd_events),
        (common, as_json),
    )
    p.add_argument(
        "status",
        nargs="?",
        default="pending",
        metavar="STATE",
        choices=("pending", "running", "done", "dead", "interrupted", "cancelled"),
    )
    p.add_argument("--limit", type=whole(1), default=50)
    p.add_argument("--after", type=whole(0), metavar="EVENT_ID", help="page after this id")

    p = sub(
        "approvals",
        "list approval requests (waiting first)",
        run_async(cmd_approvals),
        (common, as_json),
    )
    p.add_argument("--limit", type=whole(1), default=100)

    p = sub(
        "audit",
        "the audit log: every operator action and refused stale write, newest page",
        run_async(cmd_audit),
        (common, as_json),
    )
    p.add_argument("--limit", type=whole(1), default=50, help="how many entries (newest)")
    p.add_argument(
        "--target", metavar="TARGET", help="only this target: 'event 7', 'approval r1', 'paused'…"
    )

    p = sub(
        "tui",
        "open the supervisor TUI on an inbox (or the fleet desk on a folder of inbox files)",
        cmd_tui,
        (),
    )
    p.add_argument("--read-only", action="store_true", help="no actions, only watching")
    p.set_defaults(inbox=None)  # no --inbox on a database URL: the fleet desk over every inbox

    p = sub(
        "web",
        "serve the supervisor desk in a browser (token required)",
        cmd_web,
        (),
        path=False,
        epilog=WEB_EPILOG,
    )
    p.add_argument(
        "target",
        type=inbox_path,
        metavar="TARGET",
        help="an inbox file, or a folder of inbox files (the fleet desk)",
    )
    p.add_argument(
        "--inbox",
        metavar="NAME",
        help="the inbox to open in a PostgreSQL database (not for a file target)",
    )
    p.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to listen on (default 127.0.0.1; any other needs $ONWATCH_WEB_TOKEN)",
    )
    p.add_argument("--port", type=port, default=8000, help="port (default 8000)")
    p.add_argument("--read-only", action="store_true", help="no actions, only watching")
    p.add_argument(
        "--public-url",
        metavar="URL",
        help="the address browsers use, when behind a reverse proxy "
        "(e.g. https://desk.example.org)",
    )

    p = sub(
        "demo",
        "play every failure scenario in the TUI on a scratch inbox",
        cmd_demo,
        (),
        path=False,
    )
    p.add_argument(
        "--live",
        action="store_true",
        help="real worker processes running the example agent: kill the active one "
        "and watch the takeover",
    )

    p = sub(
        "worker",
        "run an agent on the inbox: lease, scheduler, claims, finishes, sends",
        cmd_worker,
        (common, channel, agent, log_level),
        epilog=WORKER_EPILOG,
    )
    p.add_argument(
        "--all-inboxes",
        action="store_true",
        help="serve every inbox of a postgresql:// database that has work",
    )
    p.add_argument(
        "--concurrency",
        type=whole(1),
        default=10,
        metavar="N",
        help="with --all-inboxes: inboxes served at once (default 10)",
    )
    p.add_argument(
        "--metrics-port",
        type=port,
        metavar="N",
        help="serve Prometheus metrics at http://127.0.0.1:N/metrics (default off; "
        "0 picks a free port, logged)",
    )

    p = sub(
        "dispatch",
        "send what the outbox allows now (one paced send)",
        run_async(cmd_dispatch),
        (common, as_json, channel, operator),
    )
    p.add_argument(
        "--now",
        action="store_true",
        help="send everything held now, ignoring the gap and a hold (audited)",
    )

    for action in ACTIONS.values():  # one subcommand per operator action, from the table
        p = sub(
            action.command,
            action.help,
            act_command(action.name),
            (common, as_json, operator),
            epilog="exit 0 if this answer stands, 1 if another one (or 'unknown') does"
            if action.target == "approval"
            else None,
        )
        if action.target == "event":
            p.add_argument("event_id", type=whole(1), metavar="EVENT_ID")
            p.add_argument(
                "--expect",
                metavar="STATE",
                help="only act if the event is in this state (what you saw)",
            )
        elif action.target == "approval":
            p.add_argument("request_id", metavar="REQUEST_ID")
        elif action.target == "delivery":
            p.add_argument("delivery_id", type=whole(1), metavar="DELIVERY_ID")

    p = sub(
        "config",
        "show settings, or set KEY=VALUE ones (budgets included)",
        run_async(cmd_config),
        (common, as_json),
        epilog=CONFIG_EPILOG,
    )
    p.add_argument("settings", nargs="*", metavar="KEY=VALUE")

    sub(
        "serve",
        "receive signed webhooks into the inbox (ack only once stored)",
        cmd_serve,
        (common, receiver),
    )

    sub(
        "run",
        "receiver, scheduler and worker in one process (serve + worker options)",
        cmd_run,
        (common, channel, agent, receiver, log_level),
        epilog=RUN_EPILOG,
    )
    return parser


RUN_EPILOG = """\
One process, one inbox: webhook deliveries are answered 2xx once committed, and the commit
wakes the worker in the same process at once. SIGTERM/SIGINT: the current run may finish
within --grace, the lease is released, then the server stops (requests in flight finish);
exit 0. Secrets come from the environment or --config, as for `onwatch serve`.

examples:
  ONWATCH_HOOK_SECRET_CHAT=s3cret onwatch run alice.db --agent examples.refund_agent:handle
  onwatch run alice.db --agent my_agent:handle --config hooks.toml --port 9000 --file out.jsonl
"""
