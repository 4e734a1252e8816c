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
    cmd_show,
    cmd_status,
)
from onwatch.cli.commands.logs import cmd_logs
from onwatch.cli.commands.notify import cmd_notify
from onwatch.cli.commands.operator import act_command
from onwatch.cli.commands.runtime import cmd_dispatch, cmd_run, cmd_serve, cmd_worker
from onwatch.cli.output import BAD, PROG, CliError
from onwatch.cli.running import run_async
from onwatch.cli.values import amount, default_actor, inbox_path, port, seconds, whole
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
                            "delayed" (max_runs_per_day, max_spend_per_day), "refused"
                            (max_pending, max_followups_per_run) or "lost claim"
                            (max_run_seconds); max_spend_per_day's limit and used are
                            {unit: amount} (used: the last 24 h)
  spending                  {unit: {last_day, per_day (7 UTC days, oldest first), total,
                            limit}}: what runs spent (ctx.spend)
"""

CONFIG_EPILOG = """\
values are JSON where they parse (5, true, {"stripe": "interrupt"}), none/unlimited for no
limit, else plain text (interrupt). Budgets (docs/rules.md#budgets):
  max_runs_per_day=N         excess delayed: claims wait until the 24 h window frees a slot
  max_pending=N              excess refused: ingest exits 1 (BudgetExceeded)
  max_followups_per_run=N    excess refused: the run's finish fails, the event backs off
  max_run_seconds=N          excess treated as a lost claim (retry or interrupt)
  max_spend_per_day='{"usd": 5}'  per unit, the last 24 h: excess delayed like runs
  max_transcript_chars=N     a run's transcript kept (its beginning and end), 0 keeps none
examples:
  onwatch config alice.db
  onwatch config alice.db max_pending=1000 max_runs_per_day=200 on_lost_claim=interrupt
  onwatch config alice.db 'lost_claim_by_source={"stripe": "interrupt"}' max_pending=none
"""

NOTIFY_EPILOG = """\
What it says, each once (a restart of the notifier does not repeat it; what it had still to
say, it says):
  approval_waiting    an approval request waits for an answer
  approval_deadline   a waiting approval is within 10 minutes of its deadline
  event_dead          an event died (from when the notifier first watched its inbox)
  unattended          an inbox has work and no live worker for --unattended-after seconds
  digest              several of these at once, when --max-per-minute allows no more runs
The command gets one JSON object on stdin: {kind, key, inbox, target, at, ids, deadline,
text} (a digest's ids: {count, items}), and the same in $ONWATCH_KIND, $ONWATCH_INBOX,
$ONWATCH_TEXT (escaped, one line) and $ONWATCH_KEY. Exit 0 means said; anything else (or
running past --timeout) is logged and retried with backoff. The notifier only reads the
inboxes. SIGTERM or Ctrl-C: exit 0.

examples:
  onwatch notify alice.db --command 'notify-send "onwatch" "$ONWATCH_TEXT"'
  onwatch notify inboxes/ --command 'curl -fsS -d "$ONWATCH_TEXT" https://ntfy.sh/my-agent'
  onwatch notify postgresql://db/agents --command \\
      'jq -c "{text: .text}" | curl -fsS -H "Content-Type: application/json" -d @- "$HOOK_URL"'
"""

RAISE_EPILOG = """\
Runs a delaying budget holds back may start at once. Lowering a budget, or setting one, is
`onwatch config` (max_spend_per_day='{"usd": 5}', max_runs_per_day=200). Exit 1 (and why on
stderr) when it is not set, changed meanwhile (--expect), or the value would not raise it.

examples:
  onwatch raise-budget alice.db max_spend_per_day --unit usd --to 10 --reason "launch day"
  onwatch raise-budget alice.db max_runs_per_day --to 500 --expect 200
"""

LOGS_EPILOG = """\
The transcript of a run is what its agent said (ctx.log), what it logged through `logging`
while the run ran, and what it spent (ctx.spend); kept with the run, its beginning and end
past max_transcript_chars (the lines between are dropped and counted), pruned with the
payloads. Text is escaped: control characters print as \\x1b, \\u202e, ….

--json prints one object per line: {"type": "run", run, attempt, gen, holder, claimed_at,
finished_at, outcome, error, logged, dropped, dropped_chars, pruned}, then its
{"type": "line", run, seq, at, level, logger, text, fields}; {"type": "gap", run, after_seq,
dropped} where lines were dropped; {"type": "end", run, outcome, error} once a run ended.

examples:
  onwatch logs alice.db 42
  onwatch logs alice.db 42 --follow
  onwatch logs postgresql://db/agents --inbox alice 42 --run 7 --json | jq -r .text
"""

WORKER_EPILOG = """\
the agent is `async def handle(batch, ctx)` (or a plain def, run in a thread): batch is a list
of core.Event; ctx.reply(text, urgent=False), ctx.ask_approval(request_id, expires_in,
action), ctx.follow_up(timer_id, due, payload=None, every=None), ctx.result = …, and
`async with ctx.effect(name, detail) as key:` around an external effect.

SIGTERM, SIGHUP or Ctrl-C: the current run may finish within --grace seconds (else it is
abandoned and recovered by the next worker under the lost-claim policy), the lease is
released, exit 0. A second signal abandons the run at once. Exit 4: the worker ended itself
because an agent's code could not be stopped in its process (it swallowed its cancellation,
or stayed in a call or held the event loop past the grace): start it again (a service
manager's restart on failure does), or use --isolate.

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
        help="on SIGTERM, how long the current run may take to finish, and how long a run "
        "given up may take to end (default 10)",
    )
    agent.add_argument("--max-runs", type=whole(1), metavar="N", help="stop after N runs")
    agent.add_argument(
        "--isolate",
        action="store_true",
        help="run the agent in a process of its own, ended with SIGKILL when the worker "
        "gives a run up: nothing the agent does can hold or end the worker",
    )
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
        "logs",
        "an event's transcript: each attempt's lines under its run (--follow: live)",
        run_async(cmd_logs),
        (common, as_json),
        epilog=LOGS_EPILOG,
    )
    p.add_argument("event_id", type=whole(1), metavar="EVENT_ID")
    p.add_argument(
        "--run", type=whole(1), metavar="RUN_ID", help="only this run of the event (its id)"
    )
    p.add_argument(
        "--follow",
        "-f",
        action="store_true",
        help="keep printing lines and new attempts as they come, until the event is done, "
        "dead, interrupted or cancelled (or Ctrl-C)",
    )

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
        "notify",
        "run a command when the agent needs a person (approvals, deaths, no worker), once "
        "per thing",
        cmd_notify,
        (log_level,),
        path=False,
        epilog=NOTIFY_EPILOG,
    )
    p.add_argument(
        "target",
        type=inbox_path,
        metavar="TARGET",
        help="an inbox file, a folder of inbox files, or a postgresql:// database",
    )
    p.add_argument(
        "--inbox",
        metavar="NAME",
        help="only this inbox of a postgresql:// database (default: every inbox of it)",
    )
    p.add_argument(
        "--command",
        required=True,
        metavar="CMD",
        help="a shell command; it reads the JSON document on stdin (or $ONWATCH_TEXT, …)",
    )
    p.add_argument(
        "--state",
        metavar="FILE",
        help="where the notifier remembers what it said (default: one file per TARGET and "
        "CMD under $XDG_STATE_HOME/onwatch, ~/.local/state/onwatch)",
    )
    p.add_argument(
        "--max-per-minute",
        type=whole(1),
        default=10,
        metavar="N",
        help="commands run at most (default 10); more things at once go as one digest",
    )
    p.add_argument(
        "--timeout",
        type=seconds(),
        default=30.0,
        metavar="SECONDS",
        help="a command running longer is killed and counts as failed (default 30)",
    )
    p.add_argument(
        "--unattended-after",
        type=whole(0),
        default=60,
        metavar="SECONDS",
        help="say an inbox has work and no live worker once it has been so this long (default 60)",
    )
    p.add_argument(
        "--poll",
        type=seconds(),
        default=2.0,
        metavar="SECONDS",
        help="how often to look (default 2; an inbox file's writes wake it at once)",
    )
    p.add_argument(
        "--retry-base",
        type=seconds(),
        default=5.0,
        metavar="SECONDS",
        help="a failed command is run again after this, doubling each time up to 15 "
        "minutes (default 5)",
    )
    p.add_argument(
        "--max-attempts",
        type=whole(1),
        default=8,
        metavar="N",
        help="failed runs before a notice is given up, logged (default 8)",
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
            else (RAISE_EPILOG if action.target == "budget" else None),
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
        elif action.target == "budget":
            p.add_argument(
                "budget",
                metavar="BUDGET",
                choices=("max_spend_per_day", "max_runs_per_day"),
                help="max_spend_per_day (with --unit) or max_runs_per_day",
            )
            p.add_argument(
                "--to",
                required=True,
                type=amount,
                metavar="LIMIT",
                help="the new limit (an amount of the unit, or a number of runs)",
            )
            p.add_argument("--unit", metavar="UNIT", help="the spend unit (e.g. usd)")
            p.add_argument(
                "--expect",
                type=amount,
                metavar="LIMIT",
                help="only raise it if its limit is this now (what you saw)",
            )

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
exit 0 (SIGHUP too; exit 4 as for `onwatch worker`). Secrets come from the environment or
--config, as for `onwatch serve`.

examples:
  ONWATCH_HOOK_SECRET_CHAT=s3cret onwatch run alice.db --agent examples.refund_agent:handle
  onwatch run alice.db --agent my_agent:handle --config hooks.toml --port 9000 --file out.jsonl
"""
