"""How a command runs: the inbox it opens, its event loop, the user's code it loads, and a
process that ends even when a thread it started does not."""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import contextlib
import functools
import hashlib
import importlib
import importlib.util
import inspect
import os
import signal
import sys
import threading
import time
import types
from typing import Any, Callable, Coroutine, TypeVar

from onwatch.cli.output import CliError, fail, one_line
from onwatch.core import Inbox, InboxError

T = TypeVar("T")


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


def run_async(
    coro_fn: Callable[[argparse.Namespace], Coroutine[Any, Any, int]],
) -> Callable[[argparse.Namespace], int]:
    def handler(args: argparse.Namespace) -> int:
        return run_loop(coro_fn(args))

    return handler


def run_loop(coro: Coroutine[Any, Any, T]) -> T:
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


def leave_no_thread_behind(code: int) -> None:
    """End the process now if threads that the command started are still running (an agent
    stuck in a call, a thread its code started): the interpreter would otherwise wait for
    them at exit, and a stopped or crashed worker would never exit."""
    deadline = time.monotonic() + LINGER
    for thread in threading.enumerate():
        if thread is threading.main_thread() or thread.daemon:
            continue
        thread.join(max(0.0, deadline - time.monotonic()))
    stray = [
        t.name
        for t in threading.enumerate()
        if t is not threading.main_thread() and not t.daemon and t.is_alive()
    ]
    if not stray:
        return
    fail(
        f"leaving {len(stray)} thread(s) still running ({', '.join(stray[:3])}): the "
        f"command ended, the process ends too"
    )
    with contextlib.suppress(Exception):
        sys.stdout.flush()
        sys.stderr.flush()
    os._exit(code)


def load_callable(spec: str, what: str) -> Callable[..., Any]:
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
        raise CliError(
            f"{what}: cannot import {module_name}: {type(exc).__name__}: {one_line(exc)}"
        ) from None
    fn: object = getattr(module, attr, None)
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


def lazy(module: str, what: str) -> Any:
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise CliError(f"{what} is not available in this build ({one_line(exc)})") from None
