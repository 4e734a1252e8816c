"""Waiting for a database server that does not answer yet, for the processes that serve an
inbox (a worker, a receiver, a notifier): a service started while its server is down,
starting up, mid-failover or at a connection limit waits for it rather than exit, since a
service manager that restarts it every few seconds stops trying after its start limit."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Awaitable, Callable, TypeVar

from .errors import ConnectionLost
from .humanize import duration
from .text import printable

T = TypeVar("T")

BACKOFF_FIRST, BACKOFF_MAX = 0.5, 5.0  # seconds between two tries: doubling, up to the max
SAID_EVERY = 60.0  # seconds between two log lines of one wait


async def until_reachable(
    attempt: Callable[[], Awaitable[T]], *, stopped: Callable[[], bool], logger: logging.Logger
) -> T | None:
    """`attempt()`, tried again while it raises ConnectionLost, with backoff, saying so once,
    then once a minute, and once more when it succeeds; None if `stopped()` became true
    first. Every other error raises at once."""
    backoff, since, said = 0.0, None, 0.0
    while True:
        try:
            result = await attempt()
        except ConnectionLost as exc:
            now = time.monotonic()
            if since is None:
                since = said = now
                logger.warning("%s; waiting for it", printable(str(exc)))
            elif now - said >= SAID_EVERY:
                said = now
                logger.warning(
                    "still waiting after %s: %s", duration(int(now - since)), printable(str(exc))
                )
            backoff = min(max(backoff * 2, BACKOFF_FIRST), BACKOFF_MAX)
        else:
            if since is not None:
                waited = duration(int(time.monotonic() - since))
                logger.warning("the database answers after %s", waited)
            return result
        until = time.monotonic() + backoff
        while time.monotonic() < until:
            if stopped():
                return None
            await asyncio.sleep(min(0.1, until - time.monotonic()))
