"""What the command line prints: exit codes, one-line errors, --json, times for a person,
and a stdout/stderr that escapes control characters on the way out."""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import json
import logging
import sys
from typing import Any, Iterator

from onwatch.core.humanize import duration
from onwatch.core.text import LineFormatter, printable

PROG = "onwatch"
OK, NOT_APPLIED, BAD, BUSY = 0, 1, 2, 3


class CliError(Exception):
    """A one-line failure with its exit code."""

    def __init__(self, message: str, code: int = BAD) -> None:
        super().__init__(message)
        self.code = code


def one_line(text: object) -> str:
    return " ".join(str(text).split())


def field(value: object) -> str:
    """Inbox text as one field of a printed line (a column of `events`, a name in a header):
    every control character escaped, newlines and tabs too. The output stream keeps those
    two for the commands' own layout (_TerminalSafe), so a value printed raw could start a
    line of its own or shift the columns a script reads: a source id "x\\n7\\tchat..." from
    a webhook would print as an event that is not there."""
    return printable(str(value))


def emit_json(data: Any) -> None:
    # ASCII-only: every control or invisible character in inbox text stays a JSON escape.
    print(json.dumps(data, sort_keys=True, ensure_ascii=True, default=_json_default))


def _json_default(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    if isinstance(value, (set, tuple)):
        return list(value)
    if isinstance(value, (bytes, bytearray, memoryview)):  # a blob written by hand
        return f"x'{bytes(value).hex()}'"  # as SQLite would write it; JSON has no bytes
    raise TypeError(f"not JSON-serialisable: {type(value).__name__}")


def when(instant: int | None, now: int) -> str:
    """'in 3m20s (2026-11-29 19:40:00 UTC)' / '5s ago (…)' / 'none'."""
    if instant is None:
        return "none"
    try:
        stamp = dt.datetime.fromtimestamp(instant, dt.timezone.utc).strftime(
            "%Y-%m-%d %H:%M:%S UTC"
        )
    except (OverflowError, OSError, ValueError, TypeError):  # a row written by hand
        return f"at {instant!r} (not a date)"
    delta = instant - now
    if delta == 0:
        return f"now ({stamp})"
    length = duration(abs(delta))
    return f"in {length} ({stamp})" if delta > 0 else f"{length} ago ({stamp})"


def local_time(instant: int, now: int) -> str:
    """'2026-11-29 19:40:00 CET (3m20s ago)': local time for a person (--json keeps the
    raw seconds)."""
    try:
        stamp = dt.datetime.fromtimestamp(instant).astimezone().strftime("%Y-%m-%d %H:%M:%S %Z")
    except (OverflowError, OSError, ValueError, TypeError):  # a row written by hand
        return f"at {instant!r} (not a date)"
    delta = now - instant
    ago = (
        "now"
        if delta == 0
        else (f"{duration(delta)} ago" if delta > 0 else f"in {duration(-delta)}")
    )
    return f"{stamp} ({ago})"


def clip(text: str, limit: int = 40) -> str:
    """`text` for a one-line message: bounded, every control character escaped."""
    return printable(text if len(text) <= limit else text[:limit] + "…")


class _TerminalSafe:
    """A text stream that escapes control and invisible characters on the way out: what the
    commands print includes inbox text (sources, ids, actions, errors, message bodies)."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        written: int = self._stream.write(printable(text, keep="\n\t"))
        return written

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


@contextlib.contextmanager
def terminal_safe_output() -> Iterator[None]:
    saved = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = _TerminalSafe(sys.stdout), _TerminalSafe(sys.stderr)
    try:
        yield
    finally:
        sys.stdout, sys.stderr = saved


def log_to_stderr(level: str, who: str) -> None:
    """A long-running command's log on stderr: one line a record, each with the time and
    `who` (continuation lines indented: core/text.py LineFormatter)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(LineFormatter(f"%(asctime)s {who} %(levelname)s %(message)s"))
    logging.basicConfig(level=getattr(logging, level.upper()), handlers=[handler])


def fail(message: str) -> None:
    text = printable(one_line(message))
    print(text if text.startswith(PROG) else f"{PROG}: {text}", file=sys.stderr)
