"""Outbox channels: each returns a `send` for Inbox.dispatch and the Worker.

A send receives the joined text (an `Outgoing` str with `.key`, the delivery's idempotency
key, and `.count`) and raises if the delivery failed, which leaves the messages held for the
next dispatch.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any, Awaitable, Callable

from ..shell import run_shell
from ..text import printable


def stdout_channel(stream: Any = None) -> Callable[[str], None]:
    """Print each send's text to stdout (or `stream`), flushed at once, with control and
    invisible characters escaped: an agent's text must not drive the reader's terminal."""

    def send(text: str) -> None:
        out = stream or sys.stdout
        out.write(printable(text, keep="\n\t") + "\n")
        out.flush()

    return send


def file_channel(path: str | os.PathLike[str]) -> Callable[[str], None]:
    """Append one JSON line per send to `path`: {"at", "count", "key", "text"} (fsynced).

    A relative path is resolved now: an agent that changes the working directory later
    must not send the replies to another file."""
    path = os.path.abspath(path)

    def send(text: str) -> None:
        line = json.dumps(
            {
                "at": int(time.time()),
                "count": getattr(text, "count", 1),
                "key": getattr(text, "key", None),
                "text": str(text),
            },
            ensure_ascii=False,
            sort_keys=True,
        )
        with open(path, "a", encoding="utf-8") as handle:
            handle.write(line + "\n")
            handle.flush()
            os.fsync(handle.fileno())

    return send


def command_channel(command: str, *, timeout: float = 60.0) -> Callable[[str], Awaitable[None]]:
    """Run `command` through the shell for each send: the text on its stdin, the delivery's
    key in $ONWATCH_DELIVERY_KEY and the message count in $ONWATCH_MESSAGE_COUNT. A non-zero
    exit (or a timeout) is a failed delivery. It runs in today's working directory, whatever
    an agent changes it to later."""
    folder = os.getcwd()

    async def send(text: str) -> None:
        env = dict(
            os.environ,
            ONWATCH_DELIVERY_KEY=str(getattr(text, "key", "")),
            ONWATCH_MESSAGE_COUNT=str(getattr(text, "count", 1)),
        )
        finished = await run_shell(command, str(text), timeout=timeout, env=env, cwd=folder)
        if finished.code is None:
            raise RuntimeError(f"command took longer than {timeout:g} s")
        if not finished.ok:
            raise RuntimeError(
                f"command exited with {finished.code}"
                + (f": {finished.last_line[:200]}" if finished.last_line else "")
            )

    return send
