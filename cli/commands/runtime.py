"""Commands that keep running: worker, serve, run (all three in one process) and dispatch."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import sys
from typing import TYPE_CHECKING, Any, AsyncIterator, Callable

from onwatch.cli import running
from onwatch.cli.output import NOT_APPLIED, OK, CliError, clip, emit_json, one_line, when
from onwatch.cli.running import load_callable, open_inbox, restoring_signals, run_loop, setup_step
from onwatch.core import Inbox, backends
from onwatch.core.pg import is_url as _is_postgres_url

if TYPE_CHECKING:  # annotations only: prometheus_client loads when --metrics-port asks
    from onwatch.core.worker import Worker
    from onwatch.core.inbox import SendFn
    from onwatch.core.metrics import WorkerMetrics


def _worker(
    cls: type[Worker],
    inbox: Inbox,
    agent: Callable[..., Any],
    setup: Callable[[Inbox], Any] | None,
    args: argparse.Namespace,
    metrics: WorkerMetrics | None = None,
) -> Worker:
    """A worker of `cls` configured by the options every worker takes (cli/parser.py's
    `agent` parent): the same for `worker` and `run`."""
    return cls(
        inbox,
        agent,
        holder=args.holder,
        send=_channel(args),
        poll_interval=args.poll,
        grace=args.grace,
        setup=setup,
        max_runs=args.max_runs,
        metrics=metrics,
    )


def _channel(args: argparse.Namespace) -> SendFn | None:
    """The send function chosen by --stdout / --file / --command (None for --no-dispatch)."""
    if getattr(args, "no_dispatch", False):
        return None
    return _send_channel(args)


def _send_channel(args: argparse.Namespace) -> SendFn:
    """The send function chosen by --stdout / --file / --command."""
    from onwatch.core.channels import command_channel, file_channel, stdout_channel

    if args.file:
        return file_channel(args.file)
    if args.command:
        return command_channel(args.command)
    return stdout_channel()


class _Recording:
    """Wraps a channel to remember a failure (dispatch itself reports 0 either way)."""

    def __init__(self, send: SendFn) -> None:
        self.send = send
        self.error: str | None = None

    async def __call__(self, text: str) -> None:
        try:
            outcome = self.send(text)
            if asyncio.iscoroutine(outcome):
                await outcome
        except Exception as exc:
            self.error = f"{type(exc).__name__}: {one_line(exc)}"
            raise


async def cmd_dispatch(args: argparse.Namespace) -> int:
    send = _Recording(_send_channel(args))  # dispatch has no --no-dispatch
    async with await open_inbox(args) as inbox:
        if args.now:
            sent = await inbox.flush_outbox(send, actor=args.actor, reason=args.reason)
        else:
            sent = await inbox.dispatch(send)
        next_send = await inbox.next_send_at()
        now = inbox.now()
    if args.json:
        emit_json({"error": send.error, "next_send_at": next_send, "sent": sent})
    elif send.error is None:
        note = f"{sent} message(s) sent" if sent else "nothing sent"
        if next_send is not None:
            note += f"; next send allowed {when(next_send, now)}"
        print(f"onwatch: {note}", file=sys.stderr)
    if send.error is not None:
        if not args.json:
            print(f"onwatch: delivery failed, messages stay held: {send.error}", file=sys.stderr)
        return NOT_APPLIED
    return OK


@restoring_signals
def cmd_worker(args: argparse.Namespace) -> int:
    # A stop asked for while starting up still means a clean exit 0.
    early: list[int] = []
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda number, frame: early.append(number))
    from onwatch.core.worker import Worker

    agent = load_callable(args.agent, "--agent")
    setup = setup_step(load_callable(args.setup, "--setup"), args.setup) if args.setup else None
    logging.basicConfig(
        level=getattr(logging, args.log_level.upper()),
        stream=sys.stderr,
        format="%(asctime)s onwatch-worker %(levelname)s %(message)s",
    )

    if _is_postgres_url(args.path):  # woken by NOTIFY, polling only as the fallback
        from onwatch.core.listening_worker import ListeningWorker as Worker
    if args.all_inboxes:
        return _fleet_worker(args, agent, early)

    async def main() -> int:
        # A worker of this release migrates (refused while an older one holds the lease).
        async with (
            await open_inbox(args, migrate=True) as inbox,
            _metrics_server(inbox, args) as metrics,
        ):
            worker = _worker(Worker, inbox, agent, setup, args, metrics)
            loop = asyncio.get_running_loop()
            for signum in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(signum, worker.request_stop)
            if early:
                worker.request_stop()
            stats = await worker.run()
        print(
            f"onwatch: worker {clip(worker.holder, 200)} stopped: {stats.runs} run(s), "
            f"{stats.done} done, {stats.failed} failed, {stats.abandoned} abandoned, "
            f"{stats.refused} refused, {stats.sent} message(s) sent",
            file=sys.stderr,
        )
        return OK

    return run_loop(main())


@contextlib.asynccontextmanager
async def _metrics_server(
    inbox: Inbox, args: argparse.Namespace
) -> AsyncIterator[WorkerMetrics | None]:
    """--metrics-port N: GET /metrics on 127.0.0.1:N for the worker's whole life; yields the
    worker's counters (None without the option)."""
    if args.metrics_port is None:
        yield None
        return
    from onwatch.core.metrics import InboxMetrics, start_metrics_server

    metrics = InboxMetrics(inbox)
    try:
        server = await start_metrics_server(metrics, host="127.0.0.1", port=args.metrics_port)
    except OSError as exc:
        raise CliError(
            f"--metrics-port: cannot listen on 127.0.0.1:{args.metrics_port}: "
            f"{getattr(exc, 'strerror', None) or exc}",
            NOT_APPLIED,
        ) from None
    logging.getLogger("onwatch.worker").info("metrics on %s", server.url)
    try:
        yield metrics.worker
    finally:
        await server.close()


def _fleet_worker(args: argparse.Namespace, agent: Callable[..., Any], early: list[int]) -> int:
    """`worker URL --all-inboxes`: every inbox of the database that has work, N at once."""
    if not _is_postgres_url(args.path):
        raise CliError("--all-inboxes serves a postgresql:// database (a file is one inbox)")
    if args.setup or args.max_runs or args.metrics_port is not None:
        raise CliError(
            "--setup, --max-runs and --metrics-port are for one inbox, not --all-inboxes"
        )
    from onwatch.core.fleet_worker import FleetWorker
    from onwatch.core.worker import default_holder

    async def main() -> int:
        # Workers of this release migrate the database first (refused while a worker of an
        # older release holds any inbox's lease); each inbox is then opened as it is.
        await backends.migrate(args.path, busy_timeout=args.busy_timeout)
        fleet = FleetWorker(
            args.path,
            agent,
            holder=args.holder or default_holder(),
            concurrency=args.concurrency,
            send=_channel(args),
            poll_interval=args.poll,
            grace=args.grace,
        )
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, fleet.request_stop)
        if early:
            fleet.request_stop()
        runs = await fleet.run()
        print(
            f"onwatch: fleet worker {clip(fleet.holder, 200)} stopped: {runs} run(s) over "
            f"{len(fleet.served)} inbox(es)",
            file=sys.stderr,
        )
        return OK

    return run_loop(main())


def cmd_serve(args: argparse.Namespace) -> int:
    webhooks = running.lazy("onwatch.core.webhooks", "the webhook receiver")
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
    from onwatch.core.webhooks import ConfigError, load_secrets, start_server
    from onwatch.core.webhooks.config import config_file_warning
    from onwatch.core.webhooks.arguments import check_serve_args
    from onwatch.core.worker import Worker

    try:
        check_serve_args(args)  # the receiver's own checks: host, port, body limit
        secrets = load_secrets(os.environ, args.config)
    except ConfigError as exc:
        raise CliError(str(exc)) from None
    if args.config is not None and (warning := config_file_warning(args.config)):
        print(f"onwatch: warning: {warning}", file=sys.stderr)
    agent = load_callable(args.agent, "--agent")
    setup = setup_step(load_callable(args.setup, "--setup"), args.setup) if args.setup else None
    logging.basicConfig(
        level=getattr(logging, args.log_level.upper()),
        stream=sys.stderr,
        format="%(asctime)s onwatch-run %(levelname)s %(message)s",
    )

    async def main() -> int:
        async with await open_inbox(args, migrate=True) as inbox:  # runs a worker: migrates
            worker = _worker(Worker, inbox, agent, setup, args)
            try:
                server = await start_server(
                    inbox, secrets=secrets, host=args.host, port=args.port, max_body=args.max_body
                )
            except (OSError, UnicodeError) as exc:  # UnicodeError: a host IDNA cannot encode
                raise CliError(
                    f"cannot listen on {args.host}:{args.port}: "
                    f"{getattr(exc, 'strerror', None) or exc}",
                    NOT_APPLIED,
                ) from None
            loop = asyncio.get_running_loop()
            for signum in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(signum, worker.request_stop)
            if early:
                worker.request_stop()
            logging.getLogger("onwatch.run").info(
                "listening on %s (%s); worker %s on %s",
                server.url,
                secrets.describe(),
                worker.holder,
                inbox.path,
            )
            try:
                stats = await worker.run()
            finally:
                await server.close()
        print(
            f"onwatch: run {worker.holder} stopped: {stats.runs} run(s), {stats.done} done, "
            f"{stats.failed} failed, {stats.abandoned} abandoned, {stats.sent} message(s) "
            f"sent",
            file=sys.stderr,
        )
        return OK

    return asyncio.run(main())
