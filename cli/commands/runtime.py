"""Commands that keep running: worker, serve, run (all three in one process) and dispatch."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import sys
from typing import TYPE_CHECKING, Any, AsyncIterator, Callable

from onwatch.cli import running
from onwatch.cli.output import (
    NOT_APPLIED,
    OK,
    CliError,
    clip,
    emit_json,
    fail,
    log_to_stderr,
    one_line,
    when,
)
from onwatch.cli.running import (
    early_stops,
    load_callable,
    open_inbox,
    open_serving,
    restoring_signals,
    run_loop,
    setup_step,
    stop_on_signals,
)
from onwatch.cli.values import actor_of
from onwatch.core import Inbox, backends
from onwatch.core.pg import is_url as _is_postgres_url

if TYPE_CHECKING:  # annotations only: prometheus_client loads when --metrics-port asks
    from onwatch.core.runtime.worker import Worker, WorkerStats
    from onwatch.core.inbox import SendFn
    from onwatch.core.metrics import WorkerMetrics

# The exit code of a worker that ended itself because an agent's code could not be stopped
# in its process (it swallowed its cancellation, its thread stayed in a call, it held the
# event loop past the lease, or it raised SystemExit outside its run). The lease was
# released where that was possible; a service manager restarting on failure starts a fresh
# process, whose new generation recovers the run. A worker that was asked to stop
# (SIGTERM, SIGINT, SIGHUP) exits 0 even so: it did what it was asked.
AGENT_STUCK = 4


def _resolve_paths(args: argparse.Namespace) -> None:
    """Make the inbox file and --file absolute, once, at start: an agent may change the
    working directory, and the worker must not then find its inbox "deleted" (and stop) or
    write its replies to another file."""
    if not _is_postgres_url(args.path):
        args.path = os.path.abspath(args.path)
    if getattr(args, "file", None):
        args.file = os.path.abspath(args.file)


def _stuck(reason: str) -> None:
    """The loop watch's last word (from its thread): the event loop is held past the lease
    and nothing on it can run any more, so the process ends here."""
    fail(f"ending the worker (exit {AGENT_STUCK}): {reason}")
    running.end_process(AGENT_STUCK)


def _escaped(exc: BaseException) -> int:
    """SystemExit or KeyboardInterrupt reached the command through the event loop: only an
    agent's own task can raise them there (the stop signals are the loop's). The worker
    stopped (its lease released on the way out); a clean exit would hide that."""
    fail(
        f"the agent's code raised {type(exc).__name__} outside its run (in a task it "
        f"started), which stopped the worker; exit {AGENT_STUCK}"
    )
    return AGENT_STUCK


def _wedged(worker: Worker) -> int:
    """The exit code for a worker.run() that raised AgentWedged (its lease released)."""
    running.expect_strays()
    if worker.stopping:  # asked to stop: it stopped, leaving code it could not stop
        return OK
    fail(f"ending the worker (exit {AGENT_STUCK}) so that a fresh process serves the inbox")
    return AGENT_STUCK


def _load_agent(args: argparse.Namespace) -> Callable[..., Any]:
    """--agent as a function of this process, or with --isolate as one that runs in a
    process of its own (core/runtime/isolation.py), started by _agent_processes."""
    if getattr(args, "isolate", False):
        from onwatch.core.runtime.isolation import IsolatedAgent

        return IsolatedAgent(args.agent)
    return load_callable(args.agent, "--agent")


@contextlib.asynccontextmanager
async def _agent_processes(agent: Callable[..., Any]) -> AsyncIterator[None]:
    """An isolated agent's first process is started before the worker takes the lease (an
    agent it cannot load is exit 2 at once); all of them are ended when the worker is."""
    from onwatch.core.runtime.isolation import IsolatedAgent
    from onwatch.core.runtime.loading import LoadError

    if not isinstance(agent, IsolatedAgent):
        yield
        return
    try:
        try:
            await agent.start()
        except LoadError as exc:
            raise CliError(str(exc)) from None
        yield
    finally:
        await agent.close()


def _summary(kind: str, worker: Worker, stats: WorkerStats, *, refused: bool = True) -> None:
    print(
        f"onwatch: {kind} {clip(worker.holder, 200)} stopped: {stats.runs} run(s), "
        f"{stats.done} done, {stats.failed} failed, {stats.abandoned} abandoned, "
        + (f"{stats.refused} refused, " if refused else "")
        + f"{stats.sent} message(s) sent",
        file=sys.stderr,
    )


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
        on_stuck=_stuck,
        loop_writes=not args.commits_off_loop,
    )


def _channel(args: argparse.Namespace) -> SendFn | None:
    """The send function chosen by --stdout / --file / --command (None for --no-dispatch)."""
    if getattr(args, "no_dispatch", False):
        return None
    return _send_channel(args)


def _send_channel(args: argparse.Namespace) -> SendFn:
    """The send function chosen by --stdout / --file / --command."""
    from onwatch.core.runtime.channels import command_channel, file_channel, stdout_channel

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
    who = actor_of(args) if args.now else None
    async with await open_inbox(args) as inbox:
        if who is not None:
            sent = await inbox.flush_outbox(send, actor=who, reason=args.reason)
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
            print(
                f"onwatch: delivery failed, messages stay held: {one_line(send.error)}",
                file=sys.stderr,
            )
        return NOT_APPLIED
    return OK


@restoring_signals
def cmd_worker(args: argparse.Namespace) -> int:
    # A stop asked for while starting up still means a clean exit 0.
    early = early_stops()
    from onwatch.core.runtime.worker import AgentWedged, Worker

    _resolve_paths(args)
    agent = _load_agent(args)
    setup = setup_step(load_callable(args.setup, "--setup"), args.setup) if args.setup else None
    log_to_stderr(args.log_level, "onwatch-worker")

    if _is_postgres_url(args.path):  # woken by NOTIFY, polling only as the fallback
        from onwatch.core.runtime.listening_worker import ListeningWorker as Worker
    if args.all_inboxes:
        return _fleet_worker(args, agent, early)
    if args.connections is not None:
        raise CliError("--connections is for --all-inboxes (one inbox holds one connection)")

    async def main() -> int:
        # A worker of this release migrates (refused while an older one holds the lease).
        inbox = await open_serving(args, early)
        if inbox is None:  # stopped while waiting for the database
            return OK
        async with (
            inbox,
            _metrics_server(inbox, args) as metrics,
            _agent_processes(agent),
        ):
            worker = _worker(Worker, inbox, agent, setup, args, metrics)
            stop_on_signals(worker.request_stop, early)
            try:
                stats = await worker.run()
            except AgentWedged:
                _summary("worker", worker, worker.stats)
                return _wedged(worker)
        _summary("worker", worker, stats)
        return OK

    try:
        return run_loop(main())
    except (SystemExit, KeyboardInterrupt) as exc:
        return _escaped(exc)


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
    from onwatch.core.runtime.fleet_worker import FleetWorker
    from onwatch.core.runtime.worker import AgentWedged, default_holder

    async def main() -> int:
        # Workers of this release migrate the database first (refused while a worker of an
        # older release holds any inbox's lease); each inbox is then opened as it is.
        await backends.migrate(args.path, busy_timeout=args.busy_timeout)
        fleet = FleetWorker(
            args.path,
            agent,
            holder=args.holder or default_holder(),
            concurrency=args.concurrency,
            connections=args.connections,
            send=_channel(args),
            poll_interval=args.poll,
            grace=args.grace,
            on_stuck=_stuck,
        )
        stop_on_signals(fleet.request_stop, early)
        try:
            async with _agent_processes(agent):
                runs = await fleet.run()
        except AgentWedged:
            running.expect_strays()
            stopping = fleet.stop_requested
            print(
                f"onwatch: fleet worker {clip(fleet.holder, 200)} stopped: {fleet.runs} "
                f"run(s) over {len(fleet.served)} inbox(es)",
                file=sys.stderr,
            )
            if stopping:
                return OK
            fail(f"ending the fleet worker (exit {AGENT_STUCK}) so that a fresh process serves")
            return AGENT_STUCK
        print(
            f"onwatch: fleet worker {clip(fleet.holder, 200)} stopped: {runs} run(s) over "
            f"{len(fleet.served)} inbox(es)",
            file=sys.stderr,
        )
        return OK

    try:
        return run_loop(main())
    except (SystemExit, KeyboardInterrupt) as exc:
        return _escaped(exc)


def cmd_serve(args: argparse.Namespace) -> int:
    webhooks = running.lazy("onwatch.core.webhooks", "the webhook receiver")
    main = getattr(webhooks, "main", None)
    if main is None:
        raise CliError("the webhook receiver is not available in this build")
    return main(args) or OK


@restoring_signals
def cmd_run(args: argparse.Namespace) -> int:
    """The receiver, the scheduler and the worker in one process on one inbox: a stored
    delivery wakes the worker directly; SIGTERM (SIGINT, SIGHUP) stops the worker (lease
    released), then the server (requests in flight finish)."""
    early = early_stops()
    from onwatch.core.webhooks import ConfigError, start_server, take_secrets
    from onwatch.core.webhooks.config import config_file_warning
    from onwatch.core.webhooks.arguments import check_serve_args
    from onwatch.core.runtime.worker import AgentWedged, Worker

    _resolve_paths(args)

    try:
        check_serve_args(args)  # the receiver's own checks: host, port, body limit
        secrets = take_secrets(os.environ, args.config)  # the reply channel must not inherit them
    except ConfigError as exc:
        raise CliError(str(exc)) from None
    if args.config is not None and (warning := config_file_warning(args.config)):
        print(f"onwatch: warning: {warning}", file=sys.stderr)
    agent = _load_agent(args)
    setup = setup_step(load_callable(args.setup, "--setup"), args.setup) if args.setup else None
    log_to_stderr(args.log_level, "onwatch-run")

    async def main() -> int:
        # Runs a worker: migrates.
        inbox = await open_serving(args, early)
        if inbox is None:  # stopped while waiting for the database
            return OK
        async with inbox, _agent_processes(agent):
            worker = _worker(Worker, inbox, agent, setup, args)
            try:
                server = await start_server(
                    inbox,
                    secrets=secrets,
                    host=args.host,
                    port=args.port,
                    max_body=args.max_body,
                    allow_hosts=args.allow_host or (),
                )
            except (OSError, UnicodeError) as exc:  # UnicodeError: a host IDNA cannot encode
                raise CliError(
                    f"cannot listen on {args.host}:{args.port}: "
                    f"{getattr(exc, 'strerror', None) or exc}",
                    NOT_APPLIED,
                ) from None
            stop_on_signals(worker.request_stop, early)
            logging.getLogger("onwatch.run").info(
                "listening on %s (%s); worker %s on %s",
                server.url,
                secrets.describe(),
                worker.holder,
                inbox.path,
            )
            try:
                stats = await worker.run()
            except AgentWedged:
                _summary("run", worker, worker.stats, refused=False)
                return _wedged(worker)
            finally:
                await server.close()
        _summary("run", worker, stats, refused=False)
        return OK

    try:
        return run_loop(main())
    except (SystemExit, KeyboardInterrupt) as exc:
        return _escaped(exc)
