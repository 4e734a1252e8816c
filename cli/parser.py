"""The argument parser of `onwatch`: every subcommand, its options, help and examples;
the commands themselves live in cli/commands/."""

from __future__ import annotations

import argparse
import textwrap
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
from onwatch.cli.commands.logs import cmd_logs
from onwatch.cli.commands.notify import cmd_notify
from onwatch.cli.commands.operator import act_command
from onwatch.cli.commands.runtime import cmd_dispatch, cmd_run, cmd_serve, cmd_worker
from onwatch.cli.output import BAD, PROG, CliError
from onwatch.cli.running import run_async
from onwatch.cli.values import amount, inbox_path, port, seconds, whole
from onwatch.cli.version import version_text
from onwatch.core import ACTIONS


class Parser(argparse.ArgumentParser):
    """argparse, but usage errors are one line on stderr and exit 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise CliError(f"{self.prog}: {message} (see `{self.prog} --help`)", BAD)


EPILOG = """\
examples (every command's --help has its own):
  onwatch init alice.db
  onwatch ingest alice.db chat msg-11 '{"text": "hello"}'
  onwatch worker alice.db --agent examples.refund_agent:handle
  onwatch status alice.db --json
  onwatch approve alice.db refund-msg-2 --actor ana --reason "customer verified"
  onwatch tui alice.db

exit codes: 0 done · 1 not applied / refused (what stands is printed) · 2 bad usage, bad
input or not an inbox · 3 inbox locked by another process for longer than --busy-timeout, no
room on its disk, or a database server that does not answer or takes no writes for now
(nothing was written: try again)
"""

# Every example below is run by tests/cli/test_help_examples.py, in order per command, in a
# sandbox holding the files they name (tests/cli/sandbox.py): each must do its job (exit 0).
EXAMPLES: dict[str, tuple[str, ...]] = {
    "init": (
        "onwatch init alice.db",
        "onwatch init bob.db max_attempts=5 on_lost_claim=interrupt",
    ),
    "migrate": ("onwatch migrate alice.db", "onwatch migrate alice.db --json"),
    "ingest": (
        'onwatch ingest alice.db chat msg-11 \'{"text": "hello"}\'',
        'echo \'{"action": "opened"}\' | onwatch ingest alice.db github delivery-42 -',
    ),
    "status": ("onwatch status alice.db", "onwatch status alice.db --json"),
    "show": ("onwatch show alice.db 9", "onwatch show alice.db 9 --json"),
    "events": (
        "onwatch events alice.db                    # the pending ones",
        "onwatch events alice.db dead",
        "onwatch events alice.db done --after 2 --limit 3 --json",
    ),
    "logs": (
        "onwatch logs alice.db 9                    # each attempt, then how it ended",
        "onwatch logs alice.db 9 --follow           # live while it runs, like tail -f",
        "onwatch logs alice.db 9 --run 4 --json | jq -r 'select(.type == \"line\") | .text'",
    ),
    "approvals": ("onwatch approvals alice.db", "onwatch approvals alice.db --json"),
    "audit": (
        "onwatch audit alice.db",
        "onwatch audit alice.db --target 'event 7' --json",
    ),
    "tui": (
        "onwatch tui alice.db",
        "onwatch tui inboxes/                       # the fleet desk: every inbox in the folder",
        "onwatch tui alice.db --read-only",
        "ONWATCH_ACTOR=ana onwatch tui alice.db",
    ),
    "demo": ("onwatch demo", "onwatch demo --live"),
    "worker": (
        "onwatch worker alice.db --agent examples.refund_agent:handle \\\n"
        "    --setup examples.refund_agent:ensure_digest",
        "onwatch worker alice.db --agent examples.refund_agent:handle --command 'cat >> out.txt'",
        "onwatch worker alice.db --agent ./examples/refund_agent.py:handle --file sent.jsonl \\\n"
        "    --holder box-1",
    ),
    "dispatch": (
        "onwatch dispatch alice.db                  # one paced send, printed",
        "onwatch dispatch alice.db --file sent.jsonl",
        "onwatch dispatch alice.db --now --command 'cat >> out.txt' --reason 'customer waiting'",
    ),
    "requeue": ("onwatch requeue alice.db 7 --expect dead --reason 'parser fixed'",),
    "cancel": ("onwatch cancel alice.db 8 --expect pending",),
    "resolve": ("onwatch resolve alice.db 9 --reason 'the charge is in Stripe'",),
    "bury": ("onwatch bury alice.db 10 --reason 'spam'",),
    "approve": ("onwatch approve alice.db refund-msg-2 --actor ana --reason 'customer verified'",),
    "deny": ("onwatch deny alice.db refund-msg-3 --reason 'over the limit'",),
    "expire": ("onwatch expire alice.db refund-msg-4 --json",),
    "mark-sent": ("onwatch mark-sent alice.db 1 --reason 'the customer has it'",),
    "send-again": ("onwatch send-again alice.db 2",),
    "run-now": ("onwatch run-now alice.db 8 --expect pending --reason 'the API is back'",),
    "fire-timer": ("onwatch fire-timer alice.db nightly-report --expect scheduled",),
    "pause-timer": ("onwatch pause-timer alice.db nightly-report --reason 'month-end freeze'",),
    "resume-timer": (
        "onwatch pause-timer alice.db nightly-report",
        "onwatch resume-timer alice.db nightly-report --expect paused",
    ),
    "delete-timer": ("onwatch delete-timer alice.db nightly-report --reason 'replaced'",),
    "raise-budget": (
        "onwatch config alice.db max_runs_per_day=200 'max_spend_per_day={\"usd\": 5}'",
        "onwatch raise-budget alice.db max_spend_per_day --unit usd --to 10 --reason 'launch day'",
        "onwatch raise-budget alice.db max_runs_per_day --to 500 --expect 200",
    ),
    "pause": ("onwatch pause alice.db --reason 'deploying the new agent'",),
    "resume": ("onwatch pause alice.db", "onwatch resume alice.db"),
    "hold": ("onwatch hold alice.db --reason 'quiet hours'",),
    "release": ("onwatch hold alice.db", "onwatch release alice.db"),
    "config": (
        "onwatch config alice.db",
        "onwatch config alice.db max_pending=1000 max_runs_per_day=200 on_lost_claim=interrupt",
        'onwatch config alice.db \'lost_claim_by_source={"stripe": "interrupt"}\' max_pending=none',
    ),
    "serve": (
        "ONWATCH_GITHUB_SECRET='the secret typed into GitHub' onwatch serve alice.db",
        'ONWATCH_HOOK_SECRET_CHAT="whsec_$(head -c 32 /dev/urandom | base64)" \\\n'
        "    onwatch serve alice.db --port 9000",
        "onwatch serve alice.db --config hooks.toml",
    ),
    "run": (
        'ONWATCH_HOOK_SECRET_CHAT="whsec_$(head -c 32 /dev/urandom | base64)" \\\n'
        "    onwatch run alice.db --agent examples.refund_agent:handle",
        "onwatch run alice.db --agent examples.refund_agent:handle --config hooks.toml \\\n"
        "    --port 9000 --file out.jsonl",
    ),
    "notify": (
        "onwatch notify alice.db --command 'cat >> notices.jsonl'",
        "onwatch notify inboxes/ --command 'jq -r .text >> notices.txt' --max-per-minute 4",
    ),
    "web": (
        "onwatch web alice.db",
        "onwatch web inboxes/ --read-only",
        "ONWATCH_WEB_TOKEN=$(cat ~/.onwatch-web-token) onwatch web alice.db \\\n"
        "    --public-url https://desk.example.org",
    ),
}


def with_examples(command: str, epilog: str | None = None) -> str | None:
    """`epilog` followed by the command's examples (EXAMPLES), as its --help ends. A new
    action row without examples yet gets none (tests/cli/test_help_examples.py fails)."""
    examples = EXAMPLES.get(command, ())
    if not examples:
        return epilog
    lines = "\n".join(f"  {example}" for example in examples)
    return (epilog.rstrip("\n") + "\n\n" if epilog else "") + f"examples:\n{lines}\n"


JSON_OBJECT = "print one JSON object (sorted keys) instead of text"


def add_settings(p: argparse.ArgumentParser) -> None:
    """The KEY=VALUE settings of init and config (cli/entry.py also takes them after an
    option)."""
    p.add_argument(
        "settings",
        nargs="*",
        metavar="KEY=VALUE",
        help="settings to store (before or after options)",
    )


# What an operator action's exit code says, by what it acts on.
ACTION_EXITS = {
    "event": "exit 0 if this call changed the event; 1 if it did not (it was not in a state "
    "this action applies to, or not in --expect's): what it is now is printed",
    "approval": "exit 0 if this call's answer was stored; 1 if an answer already stood, the "
    "deadline had passed (expired) or there is no such request (unknown): what stands is "
    "printed",
    "delivery": "exit 0 if this call settled the send; 1 if it was no longer uncertain",
    "timer": "exit 0 if this call changed the timer; 1 if it did not (no such timer, an "
    "approval's deadline, or not in a state this action applies to, or not in --expect's)",
    "inbox": "exit 0 if this call changed the switch; 1 if it was already so (nothing "
    "changed, as the audit log says)",
    "budget": "exit 0 if this call raised the budget; 1 (and why on stderr) if it is not set, "
    "it changed meanwhile (--expect), or the value would not raise it",
}

STATUS_EPILOG = """\
--json prints one object (keys sorted):
  path, now                 the file and the instant read (Unix seconds)
  counts                    {state: number} for pending, running, done, dead, interrupted,
                            cancelled
  lease                     {holder, gen, until} or null; until < now means expired
  lease_ttl, on_lost_claim  the lease length (s) and the lost-claim policy
  workers                   [{holder, host, pid, started, seen, holds, gen, since}]: the
                            worker processes by their heartbeat; holds marks the lease holder
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
  uncertain_deliveries      at-most-once sends cut off mid-send (settle: mark-sent /
                            send-again)
  set_aside                 stored rows the engine could not process
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

a desktop notification, a phone (ntfy), a chat room (a webhook):
  onwatch notify alice.db --command 'notify-send "onwatch" "$ONWATCH_TEXT"'
  onwatch notify inboxes/ --command 'curl -fsS -d "$ONWATCH_TEXT" https://ntfy.sh/my-agent'
  onwatch notify postgresql://db/agents --command \\
      'jq -c "{text: .text}" | curl -fsS -H "Content-Type: application/json" -d @- "$HOOK_URL"'
"""

RAISE_EPILOG = """\
Runs a delaying budget holds back may start at once. Lowering a budget, or setting one, is
`onwatch config` (max_spend_per_day='{"usd": 5}', max_runs_per_day=200).
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
An inbox of a database: onwatch logs postgresql://db/agents --inbox alice 42
"""

MIGRATE_EPILOG = """\
No other command migrates an inbox: reads, ingests and the desk work on the previous
release's schema as it is. A worker of this release (worker, run) and init migrate too.
Refused (exit 1, nothing changed) while a worker holds the lease: stop the workers of the
older release first (each hands its lease back). See docs/rules.md, "Upgrading a running
deployment". A postgresql:// URL migrates every inbox of that database at once.
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
"""


WEB_EPILOG = """\
The browser gets the same app as `onwatch tui TARGET`, one process per browser tab. It is
served under a name of its own (http://desk-<random>.localhost:PORT; browsers resolve it to
this machine) and opened with the link printed at start, whose login code works once. The
login form takes the token: $ONWATCH_WEB_TOKEN (16 characters or more, not guessable), or the
random one printed at start. Listening beyond 127.0.0.1 needs $ONWATCH_WEB_TOKEN and
--public-url; put a TLS reverse proxy in front (see docs/operating.md).
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
    operator = Parser(add_help=False)
    operator.add_argument(
        "--actor",
        metavar="NAME",
        help="who acts, for the audit log (default: $ONWATCH_ACTOR, else your user name)",
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
        "--commits-off-loop",
        action="store_true",
        help="commit every claim, finish and ingest on the connection's thread, never on "
        "the worker's event loop (by default they commit on the loop while that is quick "
        "and the inbox is not locked: for a loop that must never wait for a disk or a "
        "server)",
    )
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
    receiver.add_argument(
        "--allow-host",
        action="append",
        metavar="NAME",
        help="a name /metrics may be reached under besides addresses, localhost and this "
        "machine's name (repeatable; other names are refused, against DNS rebinding)",
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
    parser.add_argument(
        "--version",
        action="version",
        version=version_text(),
        help="print the version and the schema versions it reads and writes",
    )
    subs = parser.add_subparsers(dest="subcommand", metavar="COMMAND", parser_class=Parser)

    def sub(
        name: str,
        help_text: str,
        handler: Callable[[argparse.Namespace], int],
        parents: tuple[Parser, ...] = (common,),
        epilog: str | None = None,
        path: bool = True,
        json: str | None = None,
        path_help: str = "the inbox: a file, or a postgresql:// URL with --inbox NAME",
    ) -> Parser:
        """A subcommand; its --help ends with its EXAMPLES. `json` adds --json, saying
        what it prints."""
        p = subs.add_parser(
            name,
            help=help_text,
            description=help_text,
            parents=list(parents),
            epilog=with_examples(name, epilog),
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        if path:
            p.add_argument("path", type=inbox_path, metavar="PATH", help=path_help)
            p.add_argument(
                "--inbox",
                default="default",
                metavar="NAME",
                help="which inbox of a postgresql:// database PATH (a file is one inbox)",
            )
        if json is not None:
            p.add_argument("--json", action="store_true", help=json)
        p.set_defaults(handler=handler)
        return p

    p = sub(
        "init",
        "create an inbox file (or check an existing one), optionally with settings",
        run_async(cmd_init),
        json=JSON_OBJECT,
    )
    add_settings(p)

    p = sub(
        "migrate",
        "bring an inbox (or a postgresql:// database) to this release's schema",
        run_async(cmd_migrate),
        epilog=MIGRATE_EPILOG,
        json=JSON_OBJECT,
        path=False,  # a database migrates as a whole: no --inbox
    )
    p.add_argument(
        "path", type=inbox_path, metavar="PATH", help="the inbox file or postgresql:// URL"
    )

    p = sub(
        "ingest",
        "store an event; prints 'stored' or 'duplicate' (both exit 0)",
        run_async(cmd_ingest),
        json=JSON_OBJECT,
    )
    p.add_argument("source", metavar="SOURCE")
    p.add_argument("source_id", metavar="SOURCE_ID", help="dedupe key within SOURCE")
    p.add_argument("payload", nargs="?", metavar="JSON", help="payload (JSON; '-' for stdin)")

    sub(
        "status",
        "counts, lease, switches, next timer and send, budgets",
        run_async(cmd_status),
        epilog=STATUS_EPILOG,
        json=JSON_OBJECT,
    )

    p = sub(
        "show",
        "one event with its runs and effect journal",
        run_async(cmd_show),
        json="print one JSON object {event, runs, effects} (sorted keys) instead of text",
    )
    p.add_argument("event_id", type=whole(1), metavar="EVENT_ID")

    p = sub(
        "logs",
        "an event's transcript: each attempt's lines under its run (--follow: live)",
        run_async(cmd_logs),
        epilog=LOGS_EPILOG,
        json="print one JSON object per line (run, line, gap, end; keys sorted) instead of text",
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
        "list the events in one state, oldest id first (a page of --limit; --after pages on)",
        run_async(cmd_events),
        json="print one JSON list of events, oldest id first (keys sorted) instead of text",
    )
    p.add_argument(
        "status",
        nargs="?",
        default="pending",
        metavar="STATE",
        choices=("pending", "running", "done", "dead", "interrupted", "cancelled"),
        help="pending (the default), running, done, dead, interrupted or cancelled",
    )
    p.add_argument(
        "--limit", type=whole(1), default=50, metavar="N", help="events per page (default 50)"
    )
    p.add_argument(
        "--after", type=whole(0), metavar="EVENT_ID", help="the page after this event id"
    )

    p = sub(
        "approvals",
        "list approval requests: the waiting ones first (soonest deadline), then answered",
        run_async(cmd_approvals),
        json="print one JSON list of requests (keys sorted) instead of text",
    )
    p.add_argument(
        "--limit", type=whole(1), default=100, metavar="N", help="how many (default 100)"
    )

    p = sub(
        "audit",
        "the audit log: every operator action and refused stale write, newest page",
        run_async(cmd_audit),
        json="print one JSON list of entries, newest first (keys sorted) instead of text",
    )
    p.add_argument(
        "--limit",
        type=whole(1),
        default=50,
        metavar="N",
        help="how many entries, the newest (default 50); text lists them oldest first",
    )
    p.add_argument(
        "--target", metavar="TARGET", help="only this target: 'event 7', 'approval r1', 'paused'…"
    )

    p = sub(
        "tui",
        "open the supervisor desk on an inbox, or the fleet desk on many",
        cmd_tui,
        (),
        path_help="an inbox file; a folder of inbox files (the fleet desk); or a "
        "postgresql:// URL (the fleet desk over every inbox in it, or --inbox NAME for one)",
    )
    p.add_argument("--read-only", action="store_true", help="no actions, only watching")
    p.add_argument(
        "--actor",
        metavar="NAME",
        help="who the desk's actions are audited as (default: $ONWATCH_ACTOR, else your user name)",
    )
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
        help="an inbox file; a folder of inbox files (the fleet desk); or a postgresql:// "
        "URL (the fleet desk over every inbox in it, or --inbox NAME for one)",
    )
    p.add_argument(
        "--inbox",
        metavar="NAME",
        help="the inbox to open in a PostgreSQL database (not for a file target)",
    )
    p.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to listen on (default 127.0.0.1; any other needs $ONWATCH_WEB_TOKEN "
        "and --public-url)",
    )
    p.add_argument("--port", type=port, default=8000, help="port (default 8000)")
    p.add_argument("--read-only", action="store_true", help="no actions, only watching")
    p.add_argument(
        "--public-url",
        metavar="URL",
        help="the address browsers use, when behind a reverse proxy "
        "(e.g. https://desk.example.org); the desk answers under that name only",
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
        "--connections",
        type=whole(1),
        metavar="N",
        help="with --all-inboxes: sessions on the server the inboxes served share, one per "
        "transaction in flight (default --concurrency, at most 8)",
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
        (common, channel, operator),
        json="print one JSON object {sent, next_send_at, error} (sorted keys) instead of text",
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
            (common, operator),
            epilog=textwrap.fill(ACTION_EXITS[action.target], 88)
            + ("\n\n" + RAISE_EPILOG if action.target == "budget" else ""),
            json=JSON_OBJECT,
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
        elif action.target == "timer":
            p.add_argument("timer_id", metavar="TIMER_ID")
            p.add_argument(
                "--expect",
                metavar="STATE",
                help="only act if the timer is in this state (scheduled, paused, set aside)",
            )
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
        epilog=CONFIG_EPILOG,
        json="print the settings as one JSON object (sorted keys) instead of text",
    )
    add_settings(p)

    sub(
        "serve",
        "receive signed webhooks into the inbox (ack only once stored)",
        cmd_serve,
        (common, receiver),
        epilog=SERVE_EPILOG,
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
--config, as for `onwatch serve` (see its --help).
"""

SERVE_EPILOG = """\
Each route needs a secret, from the environment (a comma-separated list is several, for a
rotation) or from --config FILE; never from the command line, where ps shows it:
  ONWATCH_GITHUB_SECRET         POST /hooks/github   (X-Hub-Signature-256)
  ONWATCH_STRIPE_SECRET         POST /hooks/stripe   (Stripe-Signature; the whsec_… secret)
  ONWATCH_HOOK_SECRET_<SOURCE>  POST /hooks/<source> (Standard Webhooks: whsec_ and the
                                base64 of 16 random bytes or more; <source> lower-cased)
Without any secret serve refuses to start (exit 2). A delivery is answered 2xx only once
its event is on disk (202 new, 200 duplicate); see docs/operating.md, "Receiving webhooks".
"""
