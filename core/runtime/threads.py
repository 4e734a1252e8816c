"""A thread of its own for each piece of an agent's blocking code, never a shared pool.

A plain-def agent, and a plain function an agent hands to `ctx.perform`, run in a thread
started for that call alone. A shared pool (asyncio.to_thread) would lend its few threads to
runs the worker has already given up on: a call stuck past `max_run_seconds` keeps its
thread, and once every thread is held, healthy runs wait in the pool's queue until they too
are "past max_run_seconds" without the agent ever being called. A thread per call costs a
fraction of a millisecond to start (tests/bench/bench_isolation.py), which a run (a fsynced
database commit or two) does not notice.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import threading
from typing import Any, Callable


def start_thread(
    fn: Callable[..., Any], *args: Any, name: str
) -> tuple[threading.Thread, asyncio.Future[Any]]:
    """Start `fn(*args)` in a new thread; return the thread and a future of this loop that
    gets its result, or whatever it raised (BaseException included: a `sys.exit()` in the
    thread is handed to the awaiting code, not lost and not raised in the thread).

    The thread is not a daemon: a program that ends while agent code still runs must decide
    what to do with it (the command line says so and ends the process; see cli/running.py).
    Cancelling the future does not stop the thread; nothing in-process can.
    """
    loop = asyncio.get_running_loop()
    future: asyncio.Future[Any] = loop.create_future()
    context = contextvars.copy_context()  # as asyncio.to_thread: the caller's contextvars

    def hand_back(result: Any, error: BaseException | None) -> None:  # on the loop
        if future.done():  # cancelled meanwhile: the run was abandoned
            return
        if error is None:
            future.set_result(result)
        else:
            future.set_exception(error)

    def run() -> None:  # in the new thread
        try:
            result = context.run(fn, *args)
        except BaseException as exc:  # noqa: B036 - handed to the awaiting code, not lost
            outcome: tuple[Any, BaseException | None] = (None, exc)
        else:
            outcome = (result, None)
        # A loop closed meanwhile: the worker is gone and nobody awaits this any more.
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(hand_back, *outcome)

    thread = threading.Thread(target=run, name=name)
    thread.start()
    return thread, future
