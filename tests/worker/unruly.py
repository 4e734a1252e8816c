"""Agents written as people really write them, wrong (`--agent tests.worker.unruly:NAME`).

Each one misbehaves in one way the worker must contain (docs/rules.md#a-misbehaving-agent).
They talk to the test through files in $ONWATCH_TEST_DIR, as tests/worker/agents.py does:
`inside-<source_id>` says a run reached the point under test, `release` lets blocked code go
on, `ledger` records what really happened (one JSON line each, with the process id).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import resource
import signal
import sys
import time


def _path(name: str) -> str:
    return os.path.join(os.environ["ONWATCH_TEST_DIR"], name)


def _ledger(**entry: object) -> None:
    with open(_path("ledger"), "a", encoding="utf-8") as handle:
        handle.write(json.dumps({**entry, "pid": os.getpid()}, sort_keys=True) + "\n")
        handle.flush()
        os.fsync(handle.fileno())


def _mark(what: str) -> None:
    open(_path(f"inside-{what}"), "w").close()


def _released() -> bool:
    return os.path.exists(_path("release"))


def pays_in_a_plain_def(batch, ctx) -> None:
    """A plain def whose payment is slow (it waits for `release`): the effect runs inside
    ctx.perform, called without await, as a plain def does."""

    def pay(key: str, event=None) -> str:
        _ledger(effect="pay", event=event.source_id, key=key)
        _mark(event.source_id)
        while not _released():
            time.sleep(0.02)
        return "paid"

    for event in batch:
        outcome = ctx.perform(
            "pay", {"event": event.source_id}, lambda key, e=event: pay(key, e), event=event
        )
        ctx.reply(f"{outcome} {event.source_id}")


def hangs_in_a_call(batch, ctx) -> None:
    """A plain def stuck in a call for the events named stuck-*; quick for the others."""
    for event in batch:
        if event.source_id.startswith("stuck"):
            _mark(event.source_id)
            while True:  # a client without a timeout
                time.sleep(0.05)
        _ledger(called=event.source_id)
        ctx.reply(f"ok {event.source_id}")


def forks_a_helper(batch, ctx) -> None:
    """For the events named stuck-*, starts a helper by fork (as multiprocessing's default
    start method does on Linux), which would share every descriptor of the agent's process,
    the line to the worker too, and then hangs; a helper of stuck-*-leaves also leaves the
    process group. The others get a reply."""
    for event in batch:
        if event.source_id.startswith("stuck"):
            helper = os.fork()
            if helper == 0:
                if event.source_id.endswith("leaves"):
                    os.setsid()  # out of the agent's process group, as a daemon goes
                time.sleep(60)
                os._exit(0)
            _ledger(helper=helper)
            _mark(event.source_id)
            while True:
                time.sleep(0.05)
        _ledger(called=event.source_id)
        ctx.reply(f"ok {event.source_id}")


async def swallows_cancellation(batch, ctx) -> None:
    """A retry loop with a bare except: CancelledError is retried like any error."""
    _mark(batch[0].source_id)
    while True:
        try:
            await asyncio.sleep(3600)
        except:  # noqa: E722 - the point: it catches the cancellation too
            _ledger(swallowed=batch[0].source_id)


async def exits(batch, ctx) -> None:
    """Leaves the way a script would: sys.exit(0), KeyboardInterrupt, GeneratorExit (named
    by the event's id); any other event gets a reply."""
    for event in batch:
        _ledger(called=event.source_id)
        if event.source_id.startswith("exit"):
            sys.exit(0)
        if event.source_id.startswith("interrupt"):
            raise KeyboardInterrupt
        if event.source_id.startswith("generator-exit"):
            raise GeneratorExit
        ctx.reply(f"ok {event.source_id}")


def exits_in_a_plain_def(batch, ctx) -> None:
    for event in batch:
        _ledger(called=event.source_id)
        if event.source_id.startswith("exit"):
            sys.exit(3)
        ctx.reply(f"ok {event.source_id}")


async def changes_directory(batch, ctx) -> None:
    """Works in a folder of its own, and does not go back."""
    elsewhere = _path("elsewhere")
    os.makedirs(elsewhere, exist_ok=True)
    os.chdir(elsewhere)
    for event in batch:
        _ledger(called=event.source_id, cwd=os.getcwd())
        ctx.reply(f"ok {event.source_id}")


async def sleeps_in_async(batch, ctx) -> None:
    """time.sleep inside async def: the whole event loop stops for 1.5 s (3 s for the
    events named long-*)."""
    for event in batch:
        time.sleep(3.0 if event.source_id.startswith("long") else 1.5)  # the blocking line
        ctx.reply(f"slept {event.source_id}")


async def never_yields(batch, ctx) -> None:
    """Holds the event loop for good (a blocking call without a timeout, in async def)."""
    _mark(batch[0].source_id)
    time.sleep(3600)


async def pays_on_a_full_disk(batch, ctx) -> None:
    """The payment goes through; right after it, the file system refuses every write (a
    full disk at that moment: RLIMIT_FSIZE 0 makes every write fail), so the journal cannot
    record the outcome. Then the disk is back. The agent writes down what it was told."""
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a refused write fails, it does not kill
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)

    def pay(key: str) -> str:
        _ledger(effect="pay", key=key)
        resource.setrlimit(resource.RLIMIT_FSIZE, (0, hard))  # the disk fills up
        return "paid"

    try:
        outcome = await ctx.perform("pay", {"amount": 5}, pay)
    except Exception as exc:  # what a careful agent does with a failed payment
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        _ledger(told=f"failed: {type(exc).__name__}: {exc}")
        raise
    resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))  # space again
    _ledger(told=outcome)
    ctx.reply(f"payment {outcome}")


def meet_at_the_lease(inbox) -> None:
    """--setup for two workers started at once: each one's first look at the lease waits
    until both have looked, so both decide on what they saw before either took it (the
    interleaving that gave two processes under one --holder one generation together)."""
    read = inbox.lease_info
    first = [True]

    async def lease_info():
        lease = await read()
        if first[0]:
            first[0] = False
            open(_path(f"looked-{os.getpid()}"), "w").close()
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                looked = [n for n in os.listdir(os.environ["ONWATCH_TEST_DIR"]) if "looked-" in n]
                if len(looked) >= 2:
                    break
                await asyncio.sleep(0.01)
        return lease

    inbox.lease_info = lease_info


async def ends_its_process(batch, ctx) -> None:
    """os._exit for the events named hard-exit-*: no exception, no cleanup, no finally."""
    for event in batch:
        _ledger(called=event.source_id, pid_of_agent=os.getpid())
        if event.source_id.startswith("hard-exit"):
            os._exit(0)
        ctx.reply(f"ok {event.source_id}")


def checks_its_context(batch, ctx) -> None:
    """Uses the whole context from a plain def, a refused value included: under --isolate
    each call crosses to the worker's real context and back."""
    for event in batch:
        try:
            ctx.reply("")
        except ValueError as exc:  # BadInput is a ValueError
            _ledger(refused=type(exc).__name__)
        key = ctx.perform("notify", {"event": event.source_id}, lambda key: key)
        ctx.follow_up(f"check-{event.source_id}", ctx.now + 3600, {"n": 1})
        ctx.reply(f"ok {event.source_id} {key}")
        ctx.result = {"event": event.source_id, "pid": os.getpid()}


# What a worker's log line looks like: an agent's text that holds one must not print it as one.
FORGED = "2026-01-01 00:00:00,000 onwatch-worker INFO run 99 finished: done"


async def forges_log_lines(batch, ctx) -> None:
    """Logs, then raises, text from a payload (a newline, then what reads as a record of the
    worker's own), as an agent that quotes its input in its messages does."""
    logging.getLogger("agent").warning("quoting the input:\n%s", FORGED)
    raise ValueError(f"cannot handle:\n{FORGED}")
