"""How a command runs: the inbox it opens, its event loop, the user's code it loads, and a
process that ends even when a thread it started does not."""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import contextlib
import functools
import importlib
import inspect
import logging
import os
import signal
import sys
import threading
import time
from typing import Any, Callable, Coroutine, TypeVar

from onwatch.cli.output import CliError, fail, one_line
from onwatch.core import Inbox, InboxError
from onwatch.core.runtime.loading import LoadError, load

T = TypeVar("T")

# The signals that ask a long-running command to stop: SIGTERM (a service manager, kill),
# SIGINT (Ctrl-C) and SIGHUP (the terminal closed, an ssh session dropped). SIGHUP's default
# would kill the worker outright, its run unfinished and its lease held for the whole TTL.
STOP_SIGNALS: tuple[signal.Signals, ...] = tuple(
    getattr(signal, name) for name in ("SIGTERM", "SIGINT", "SIGHUP") if hasattr(signal, name)
)
# Tasks that did not end when the command ended and were cancelled (an agent's task that
# swallows cancellation): kept here, so that they are not destroyed mid-way, until
# leave_no_thread_behind ends the process without them.
_stray_tasks: list[asyncio.Task[Any]] = []
_linger: list[float] = []  # set by expect_strays(): how long to wait for them, if not LINGER


async def open_inbox(
    args: argparse.Namespace, *, create: bool = False, migrate: bool = False
) -> Inbox:
    """The inbox the command names. Only `init`, `migrate` and the commands that run a
    worker migrate an inbox of an older schema (docs/rules.md#upgrading-a-running-
    deployment); every other command uses it as it is."""
    return await Inbox.open(
        args.path,
        name=getattr(args, "inbox", "default"),
        create=create,
        busy_timeout=args.busy_timeout,
        migrate=migrate,
    )


async def open_serving(args: argparse.Namespace, early: list[int]) -> Inbox | None:
    """The inbox a command that runs a worker serves (migrated, as a worker of this release
    does), waiting for a database server that does not answer yet
    (Inbox.open_when_reachable); None if a stop signal came first (`early`)."""
    return await Inbox.open_when_reachable(
        args.path,
        stopped=lambda: bool(early),
        name=getattr(args, "inbox", "default"),
        create=False,
        busy_timeout=args.busy_timeout,
        migrate=True,
    )


def run_async(
    coro_fn: Callable[[argparse.Namespace], Coroutine[Any, Any, int]],
) -> Callable[[argparse.Namespace], int]:
    def handler(args: argparse.Namespace) -> int:
        return run_loop(coro_fn(args))

    return handler


def run_loop(coro: Coroutine[Any, Any, T]) -> T:
    """asyncio.run, except that it never waits for ever: not for threads it handed work to
    (a channel run through asyncio.to_thread; asyncio.run joins them without a timeout, so
    one stuck in a call kept a stopped or crashed worker alive for ever), nor for tasks left
    running that ignore their cancellation (an agent that swallows CancelledError). Those
    get LINGER seconds, then are abandoned; main() makes sure the process ends."""
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
                loop.run_until_complete(asyncio.wait(tasks, timeout=_lingering()))
                for task in tasks:
                    if not task.done():
                        _stray_tasks.append(task)
                    elif not task.cancelled():
                        task.exception()  # retrieved: ended with an error while stopping
            loop.run_until_complete(_bounded(loop.shutdown_asyncgens()))
        finally:
            executor.shutdown(wait=False, cancel_futures=True)
            asyncio.set_event_loop(None)
            loop.close()


LINGER = 1.0  # seconds a finished command waits for stray threads before leaving without them


async def _bounded(coro: Coroutine[Any, Any, None]) -> None:
    with contextlib.suppress(asyncio.TimeoutError):
        await asyncio.wait_for(coro, _lingering())


def expect_strays() -> None:
    """The command knows that code it could not stop is still running (a worker ended
    itself for it): waiting LINGER for it would only give it more time to act."""
    _linger[:] = [0.1]


def _lingering() -> float:
    return _linger[0] if _linger else LINGER


def leave_no_thread_behind(code: int) -> None:
    """End the process now if threads that the command started are still running (an agent
    stuck in a call, a thread its code started), or tasks that would not be cancelled: the
    interpreter would otherwise wait for the threads at exit, and a stopped or crashed
    worker would never exit (and a destroyed task would run its agent's code once more)."""
    deadline = time.monotonic() + _lingering()
    for thread in threading.enumerate():
        if thread is threading.main_thread() or thread.daemon:
            continue
        thread.join(max(0.0, deadline - time.monotonic()))
    stray = [
        t.name
        for t in threading.enumerate()
        if t is not threading.main_thread() and not t.daemon and t.is_alive()
    ]
    tasks = [t for t in _stray_tasks if not t.done()]
    if not stray and not tasks:
        return
    left = []
    if tasks:
        left.append(f"{len(tasks)} task(s) that ignored their cancellation")
    if stray:
        left.append(f"{len(stray)} thread(s) still running ({', '.join(stray[:3])})")
    fail(f"leaving {' and '.join(left)}: the command ended, the process ends too")
    end_process(code)


def end_process(code: int) -> None:
    """Flush what was written and end the process with `code` at once: no thread is
    joined, no task is run again."""
    for handler in logging.getLogger().handlers:
        with contextlib.suppress(Exception):
            handler.flush()
    with contextlib.suppress(Exception):
        sys.stdout.flush()
        sys.stderr.flush()
    os._exit(code)


def early_stops() -> list[int]:
    """Record stop signals that arrive while a command starts up (before its loop can
    handle them): the command stops as soon as it can, and still cleanly."""
    early: list[int] = []
    for signum in STOP_SIGNALS:
        signal.signal(signum, lambda number, frame: early.append(number))
    return early


def stop_on_signals(request_stop: Callable[[], None], early: list[int]) -> None:
    """From now on every stop signal calls `request_stop` on the running loop (a second
    one means: now); one that came during start-up is acted on at once."""
    loop = asyncio.get_running_loop()
    for signum in STOP_SIGNALS:
        loop.add_signal_handler(signum, request_stop)
    if early:
        request_stop()


def load_callable(spec: str, what: str) -> Callable[..., Any]:
    """'package.module:function' or 'path/to/file.py:function' → the function (exit 2 with
    the reason when it is not one)."""
    try:
        return load(spec, what)
    except LoadError as exc:
        raise CliError(str(exc)) from None


def setup_step(setup: Callable[..., Any], spec: str) -> Callable[[Inbox], Any]:
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
            raise CliError(
                f"--setup {spec} failed: {type(exc).__name__}: {one_line(exc)}"
            ) from None

    return step


def restoring_signals(
    handler: Callable[[argparse.Namespace], int],
) -> Callable[[argparse.Namespace], int]:
    """Put the stop signals' handling back as it was when `handler` returns: main() may be
    called in-process (by a test, or a program embedding the command line)."""

    @functools.wraps(handler)
    def run(args: argparse.Namespace) -> int:
        saved = {signum: signal.getsignal(signum) for signum in STOP_SIGNALS}
        try:
            return handler(args)
        finally:
            for signum, previous in saved.items():
                signal.signal(signum, previous)

    return run


def lazy(module: str, what: str) -> Any:
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise CliError(f"{what} is not available in this build ({one_line(exc)})") from None
