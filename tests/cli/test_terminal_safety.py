"""Inbox text printed by the command line never drives the reader's terminal."""

from __future__ import annotations

import asyncio
import json
import logging
import subprocess
import sys

import pytest

from onwatch.core import Inbox
from onwatch.core.text import LineFormatter, printable

HOSTILE = "x\x1b]0;pwned\x07 \x1b[2J\rback\b \u202eevil \x9b31m"


def onwatch(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "onwatch", *args], capture_output=True, text=True, timeout=60
    )


def test_printable_escapes_what_a_terminal_would_obey_and_is_idempotent():
    shown = printable(HOSTILE)
    assert "\x1b" not in shown and "\x07" not in shown and "\r" not in shown
    assert "\u202e" not in shown and "\x9b" not in shown
    assert "\\x1b]0;pwned\\x07" in shown and "\\u202e" in shown
    assert printable(shown) == shown
    assert printable("a\nb\tc", keep="\n\t") == "a\nb\tc"


def test_a_log_record_prints_its_further_lines_indented_and_escaped():
    """Every onwatch process that logs to stderr formats with LineFormatter: a record's text
    from outside (an agent's error, an inbox's name) cannot start a line of its own."""
    formatter = LineFormatter("%(levelname)s %(message)s")
    record = logging.LogRecord(
        "x", logging.WARNING, __file__, 1, "a %s", ("b\nINFO c" + HOSTILE,), None
    )
    shown = formatter.format(record)
    assert shown.splitlines()[0] == "WARNING a b"
    assert all(line.startswith("    ") for line in shown.splitlines()[1:])
    assert "\x1b" not in shown and "\r" not in shown and "\u202e" not in shown
    try:
        raise ValueError("one\ntwo")
    except ValueError:
        record.exc_info = sys.exc_info()
    record.exc_text = None
    lines = formatter.format(record).splitlines()
    assert lines[0] == "WARNING a b" and "Traceback" in lines[2]
    assert all(line.startswith("    ") for line in lines[1:])


@pytest.fixture
def inbox(tmp_path):
    path = str(tmp_path / "inbox.db")
    assert onwatch("init", path).returncode == 0
    assert onwatch("ingest", path, "hook", HOSTILE, json.dumps({"t": HOSTILE})).returncode == 0
    return path


def test_events_show_and_errors_print_escaped(inbox):
    for args in (
        ("events", inbox, "pending"),
        ("show", inbox, "1"),
        ("cancel", inbox, "1"),
        ("cancel", inbox, "1"),
    ):
        result = onwatch(*args)
        for stream in (result.stdout, result.stderr):
            assert "\x1b" not in stream and "\x07" not in stream and "\u202e" not in stream
    assert "\\x1b]0;pwned" in onwatch("events", inbox, "cancelled").stdout


def test_json_output_is_ascii_and_round_trips(inbox):
    result = onwatch("events", inbox, "pending", "--json")
    assert result.stdout.isascii()
    [event] = json.loads(result.stdout)
    assert event["source_id"] == HOSTILE and event["payload"] == {"t": HOSTILE}


# A source id a webhook sender chose: printed raw, `events` would show a second event that is
# not there, and `show` a header line of its own.
FORGED = "a\n7\tchat\tforged\tdone\tattempts 0"
SHOWN = "a\\n7\\tchat\\tforged\\tdone\\tattempts 0"


@pytest.fixture
def forging(tmp_path):
    path = str(tmp_path / "inbox.db")
    assert onwatch("init", path).returncode == 0
    assert onwatch("ingest", path, "ho\tok", FORGED, "{}").returncode == 0

    async def ask() -> None:  # an approval the agent asked for, under the same id
        async with await Inbox.open(path) as inbox:
            await inbox.request_approval(FORGED, 3600, "refund 5")

    asyncio.run(ask())
    return path


def test_newlines_and_tabs_in_inbox_text_forge_no_line_and_no_column(forging):
    assert onwatch("events", forging).stdout.splitlines() == [
        f"1\tho\\tok\t{SHOWN}\tpending\tattempts 0"
    ]
    show = onwatch("show", forging, "1").stdout.splitlines()
    assert show[0] == f"event 1  ho\\tok / {SHOWN}  pending  attempts 0"
    assert not any(line.startswith("7") for line in show)
    [approval] = onwatch("approvals", forging).stdout.splitlines()
    assert approval.split("\t")[:2] == [SHOWN, "refund 5"]
    approve = onwatch("approve", forging, FORGED)
    assert approve.returncode == 0 and approve.stdout == "yes\n"
    audit = onwatch("audit", forging).stdout.splitlines()
    assert len(audit) == 1 and audit[0].count("\t") == 5
