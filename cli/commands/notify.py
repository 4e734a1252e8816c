"""`onwatch notify TARGET --command CMD`: run a command when the agent needs a person (an
approval waits or nears its deadline, an event died, an inbox has work and no worker), each
thing once, across restarts (core/notify.py)."""

from __future__ import annotations

import argparse
import asyncio

from onwatch.cli.output import OK, log_to_stderr
from onwatch.cli.running import early_stops, restoring_signals, run_loop, stop_on_signals
from onwatch.core.notify import Notifier, Watched, default_state


@restoring_signals
def cmd_notify(args: argparse.Namespace) -> int:
    early = early_stops()
    log_to_stderr(args.log_level, "onwatch-notify")
    state = args.state or default_state(args.target, args.inbox, args.command)

    async def main() -> int:
        watched = await Watched.of(args.target, name=args.inbox, stopped=lambda: bool(early))
        if watched is None:  # stopped while waiting for the database
            return OK
        try:
            notifier = Notifier(
                watched,
                args.command,
                state=state,
                max_per_minute=args.max_per_minute,
                timeout=args.timeout,
                unattended_after=args.unattended_after,
                poll=args.poll,
                retry_base=args.retry_base,
                max_attempts=args.max_attempts,
            )
            stop = asyncio.Event()
            stop_on_signals(stop.set, early)
            await notifier.run(stop)
        finally:
            await watched.close()
        return OK

    return run_loop(main())
