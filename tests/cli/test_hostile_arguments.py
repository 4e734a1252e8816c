"""Every subcommand, every argument, hostile values: one line, a known exit code, no trace.

The subcommands and their arguments are read from the parser itself, so a command added later
is fed the same values without anyone remembering to list it. Each call runs in-process (as
the console script does) and must end with an exit code in {0, 1, 2, 3}, at most one line on
stderr and never an "internal error" (an exception that escaped its handler); a refusal
(exit 2) must leave the inbox byte-identical and no file behind.
"""

from __future__ import annotations

import argparse
import base64
import dataclasses
import io
import json
import os
import signal
from collections import Counter
from pathlib import Path

import pytest

from onwatch.core import Inbox, Settings
from onwatch import cli

# Values an adversarial caller (or a script with a bug) passes. The surrogates are what Python
# makes of undecodable bytes in argv (os.fsdecode / surrogateescape); "\ud800" cannot come from
# argv but can from an in-process caller of main().
HOSTILE = [
    "",
    " ",
    "-1",
    "0",
    "1.5",
    str(2**63),
    str(2**63 - 1),
    str(-(2**63) - 1),
    "9" * 40,
    "9" * 5000,
    "1e300",
    "1e-300",
    "1e309",
    "NaN",
    "nan",
    "inf",
    "-Infinity",
    "true",
    "null",
    "[]",
    "{}",
    '{"a": NaN}',
    "-",
    "[" * 900 + "]" * 900,
    "[" * 3000 + "]" * 3000,
    "[" * 100_000 + "]" * 100_000,
    "x" * 1_000_000,
    "\x00",
    "a\x00b",
    os.fsdecode(b"\xff\xfe"),
    "\ud800",
    "line\nbreak",
    "\x1b]0;pwned\x07",
    "approval",
    "timer",
    "../../etc/passwd",
]
# Values for KEY=VALUE settings (init, config): every setting gets each of these.
SETTING_VALUES = [
    "0",
    "-1",
    "1.5",
    str(2**63),
    str(2**64),
    "9" * 5000,
    "1e309",
    "NaN",
    "Infinity",
    "true",
    "null",
    '"text"',
    "[1]",
    '{"a": "retry"}',
    '{"a": NaN}',
    "[" * 3000 + "]" * 3000,
    "[" * 100_000 + "]" * 100_000,
    os.fsdecode(b"\xff"),
    "\ud800",
    '{"\\ud800": "retry"}',
]
EXIT_CODES = {0, 1, 2, 3}
GOOD = {
    "source": "chat",
    "source_id": "m1",
    "payload": "{}",
    "event_id": "1",
    "request_id": "r1",
    "status": "pending",
}
STANDARD_SECRET = "whsec_" + base64.b64encode(b"k" * 24).decode()


def subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    [action] = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(action.choices)


def slots(sub: argparse.ArgumentParser) -> list[argparse.Action]:
    """The arguments that take a value (positionals and options), help excluded."""
    return [a for a in sub._actions if not isinstance(a, argparse._HelpAction) and a.nargs != 0]


def baseline(sub: argparse.ArgumentParser, path: str) -> dict[str, list[str]]:
    """A working value for each required argument: positionals, and required options."""
    values: dict[str, list[str]] = {}
    for action in sub._actions:
        if action.option_strings:
            if action.required:
                values[action.dest] = [action.option_strings[0], _good_option(action)]
        elif action.nargs not in ("?", "*") or action.dest in ("payload",):
            values[action.dest] = [path if action.dest == "path" else GOOD.get(action.dest, "x")]
    return values


def _good_option(action: argparse.Action) -> str:
    return {"agent": "examples.refund_agent:handle"}.get(action.dest, "1")


def argument_vectors(name: str, sub: argparse.ArgumentParser, path: str):
    """(label, argv) pairs: the baseline with one argument replaced by a hostile value."""
    base = baseline(sub, path)
    for action in slots(sub):
        if action.dest == "settings":
            values = [
                f"{field.name}={value}"
                for field in dataclasses.fields(Settings)
                for value in SETTING_VALUES
            ] + ["=1", "nokey", "max_attempts"]
        else:
            values = HOSTILE
        for value in values:
            argv_parts = dict(base)
            if action.option_strings:
                argv_parts[action.dest] = [action.option_strings[0], value]
            else:
                argv_parts[action.dest] = [value]
            argv = [name]
            positionals = [a.dest for a in sub._actions if not a.option_strings]
            for dest in positionals:
                argv += argv_parts.get(dest, [])
            for dest, part in argv_parts.items():
                if dest not in positionals:
                    argv += part
            yield f"{name} {action.dest}={value[:20]!r}", argv


CALL_LIMIT = 20  # seconds one in-process call may take before it counts as a hang


class TookTooLong(BaseException):
    """Raised into a call that ran past CALL_LIMIT (BaseException: main() must not catch it)."""


def _bounded(fn, *args):
    def expire(signum, frame):
        raise TookTooLong

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, CALL_LIMIT)
    try:
        return fn(*args)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def snapshot(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}


@pytest.fixture
def quick_long_runners(monkeypatch):
    """The long-running commands stop where they would start serving: argument handling,
    configuration and (for the worker) start-up and lease are what is checked here."""
    from onwatch.core.runtime import worker as worker_module
    from onwatch.core.webhooks import server as server_module

    real_run = worker_module.Worker.run

    async def stop_at_once(self):
        self.request_stop()
        return await real_run(self)

    monkeypatch.setattr(worker_module.Worker, "run", stop_at_once)
    from onwatch.core import notify as notify_module

    real_notify = notify_module.Notifier.run

    async def notify_once(self, stop):  # `onwatch notify` stops before its first look
        stop.set()
        return await real_notify(self, stop)

    monkeypatch.setattr(notify_module.Notifier, "run", notify_once)
    monkeypatch.setattr(server_module, "run", lambda *args, **kwargs: 0)
    for module_name in ("onwatch.tui.app", "onwatch.tui.demo"):
        module = pytest.importorskip(module_name)
        monkeypatch.setattr(module, "run", lambda *args, **kwargs: 0)
    web = pytest.importorskip("onwatch.tui.web")

    async def served(chosen):  # `onwatch web` checked up to the point it would listen
        return 0

    monkeypatch.setattr(web, "serve", served)
    for name in list(os.environ):
        if name.startswith("ONWATCH_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("ONWATCH_HOOK_SECRET_CI", STANDARD_SECRET)


@pytest.mark.slow
def test_every_subcommand_is_total_on_hostile_arguments(
    tmp_path, monkeypatch, capsys, quick_long_runners
):
    monkeypatch.chdir(tmp_path)  # relative hostile paths land here, and are checked
    # `onwatch notify` keeps its memory under $XDG_STATE_HOME: here, not in the home folder
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.setattr("sys.stdin", io.StringIO('{"from": "stdin"}'))  # for JSON '-'
    path = str(tmp_path / "inbox.db")
    assert cli.main(["init", path]) == 0
    assert cli.main(["ingest", path, "chat", "m0", "{}"]) == 0
    capsys.readouterr()
    commands = subcommands(cli.parser.build_parser())
    assert {"init", "ingest", "config", "worker", "serve", "dispatch"} <= set(commands)
    failures = []
    runs = 0
    codes: Counter[int] = Counter()
    for name, sub in sorted(commands.items()):
        for label, argv in argument_vectors(name, sub, path):
            before = snapshot(tmp_path)
            try:
                code = _bounded(cli.main, argv)
            except TookTooLong:
                failures.append(
                    f"{label}: still running after {CALL_LIMIT} s (a long-running "
                    f"command: stop it early in quick_long_runners)"
                )
                capsys.readouterr()
                continue
            out, err = capsys.readouterr()
            runs += 1
            codes[code] += 1
            problem = None
            if code not in EXIT_CODES:
                problem = f"exit {code}"
            elif err.count("\n") > 1 or (err and not err.endswith("\n")):
                problem = f"stderr is not one line: {err[:160]!r}"
            elif "internal error" in err or "Traceback" in err:
                problem = f"leaked: {err[:160]!r}"
            elif code == 2 and snapshot(tmp_path) != before:
                problem = "refused (2) but the folder changed"
            if problem:
                failures.append(f"{label}: {problem}")
    assert runs > 500 and codes[0] > 100 and codes[2] > 500, codes
    assert not failures, f"{len(failures)} of {runs}:\n" + "\n".join(failures[:60])


def _side_files(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


@pytest.mark.parametrize(
    "settings",
    [
        ["max_attempts=0"],
        ["lease_ttl=-1"],
        ["max_pending=1.5"],
        ["on_lost_claim=sometimes"],
        ["backoff_base=100", "backoff_cap=10"],
        ["max_batch=" + str(2**64)],
        ["nosuch=1"],
        ["lost_claim_by_source=" + "[" * 5000 + "]" * 5000],
        ["max_attempts"],
        ["max_attempts=3", "delivery=maybe"],
    ],
)
def test_a_refused_init_leaves_no_file_behind(tmp_path, capsys, settings):
    """Class 13: `init new.db max_attempts=0` used to exit 2 with new.db left behind."""
    path = tmp_path / "new.db"
    assert cli.main(["init", str(path), *settings]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("onwatch: "), err
    assert _side_files(tmp_path) == []  # no new.db, new.db-wal, new.db-shm, new.db-journal


def test_init_removes_what_it_created_when_the_engine_refuses_late(tmp_path, capsys, monkeypatch):
    """A refusal that only the open inbox can make (after the file exists) still leaves
    nothing: the engine may check more than the settings' own validation."""
    from onwatch.core import BadInput

    async def refuse(self, **changes):
        raise BadInput("refused by the engine")

    monkeypatch.setattr(Inbox, "configure", refuse)
    path = tmp_path / "late.db"
    assert cli.main(["init", str(path), "max_attempts=4"]) == 2
    assert "refused by the engine" in capsys.readouterr().err
    assert _side_files(tmp_path) == []


def test_a_refused_init_on_an_existing_inbox_changes_nothing(tmp_path, capsys):
    path = tmp_path / "kept.db"
    assert cli.main(["init", str(path), "max_attempts=5"]) == 0
    before = snapshot(tmp_path)
    for settings in (
        ["max_attempts=0"],
        ["backoff_base=100", "backoff_cap=10"],
        ["max_attempts=7", "delivery=maybe"],
    ):
        assert cli.main(["init", str(path), *settings]) == 2
        assert snapshot(tmp_path) == before, settings
    capsys.readouterr()
    assert cli.main(["config", str(path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["max_attempts"] == 5


def test_no_command_leaves_a_file_behind_when_refused(tmp_path, monkeypatch, capsys):
    """Class 13: every command that takes an inbox PATH, pointed at a missing one (and at a
    foreign file), with --file where it has one, is refused with exit 2 and creates nothing:
    not the inbox, not its -wal/-shm, not the --file channel's output."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("ONWATCH_HOOK_SECRET_CI", STANDARD_SECRET)  # serve gets to the inbox
    foreign = tmp_path / "notes.txt"
    foreign.write_text("not an inbox\n")
    checked = []
    for name, sub in sorted(subcommands(cli.parser.build_parser()).items()):
        dests = {a.dest for a in sub._actions}
        if "path" not in dests or name == "init":
            continue
        # (The TUI given a foreign file is the TUI's own affair; a missing one is checked.)
        targets = [tmp_path / "missing.db"] + ([foreign] if name != "tui" else [])
        for target in map(str, targets):
            argv = [name] + [value for part in baseline(sub, target).values() for value in part]
            if "file" in dests:
                argv += ["--file", str(tmp_path / "sent.jsonl")]
            before = snapshot(tmp_path)
            code = cli.main(argv)
            err = capsys.readouterr().err
            assert code == 2, (argv, err)
            assert err.count("\n") == 1, (argv, err)
            assert snapshot(tmp_path) == before, argv
        checked.append(name)
    assert {"status", "ingest", "dispatch", "worker", "serve", "tui", "config"} <= set(checked)


def test_listings_survive_rows_written_by_hand(tmp_path, capsys):
    """Class 2 (the command line's part): out-of-range instants and odd column types in rows
    written by another version or by hand are shown, never an 'internal error'. (Rows the
    engine itself cannot decode are the engine's to set aside.)"""
    import sqlite3

    path = str(tmp_path / "odd.db")
    assert cli.main(["init", path]) == 0
    assert cli.main(["ingest", path, "chat", "m1", "{}"]) == 0
    db = sqlite3.connect(path)
    with db:
        db.execute("UPDATE events SET error = x'00ff1b', attempts = ? WHERE id = 1", (2**63 - 1,))
        db.execute(
            "INSERT INTO timers (id, due, catch_up) VALUES ('t', ?, 'coalesce')", (2**63 - 1,)
        )
        db.execute(
            "INSERT INTO approvals (request_id, action, requested, due) VALUES ('r', 'act', 0, ?)",
            (-(2**63),),
        )
        db.execute(
            "INSERT INTO audit (at, actor, action, target, applied) VALUES (?, x'ff1b', 7, 'x', 1)",
            (2**63 - 1,),
        )
    db.close()
    capsys.readouterr()
    for argv in (
        ["status", path],
        ["status", path, "--json"],
        ["approvals", path],
        ["approvals", path, "--json"],
        ["events", path],
        ["show", path, "1"],
        ["events", path, "--json"],
        ["show", path, "1", "--json"],
        ["audit", path],
        ["audit", path, "--json"],
    ):
        code = cli.main(argv)
        out, err = capsys.readouterr()
        assert code == 0 and err == "", (argv, err)
        assert out
    cli.main(["status", path])
    assert "not a date" in capsys.readouterr().out
    cli.main(["audit", path, "--json"])
    [entry] = json.loads(capsys.readouterr().out)
    assert (entry["actor"], entry["action"], entry["at"]) == ("x'ff1b'", "7", 2**63 - 1)


def test_undecodable_bytes_in_a_real_argv_are_exit_2(tmp_path):
    """What a shell passes when a name is not UTF-8: Python decodes argv with
    surrogateescape; SQLite cannot take such text. One line, exit 2, nothing created."""
    import subprocess
    import sys

    from tests.worker.helpers import ROOT, env

    path = str(tmp_path / "inbox.db")
    assert cli.main(["init", path]) == 0
    before = snapshot(tmp_path)
    for argv in (
        [b"ingest", path.encode(), b"chat\xff", b"m1"],
        [b"ingest", path.encode(), b"chat", b"m1", b'{"a": "\xfe"}'],
        [b"init", str(tmp_path).encode() + b"/new\xff.db"],
        [b"approve", path.encode(), b"r\xff"],
    ):
        result = subprocess.run(
            [sys.executable, "-m", "onwatch", *argv],
            cwd=ROOT,
            env=env(tmp_path),
            capture_output=True,
            timeout=60,
        )
        err = result.stderr.decode("utf-8", "replace")
        assert result.returncode == 2, (argv, err)
        assert err.count("\n") == 1 and "not valid UTF-8" in err, (argv, err)
        assert snapshot(tmp_path) == before, argv


def test_an_in_process_worker_puts_signal_handling_back(tmp_path, capsys, quick_long_runners):
    path = str(tmp_path / "inbox.db")
    assert cli.main(["init", path]) == 0
    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    assert cli.main(["worker", path, "--agent", "examples.refund_agent:handle"]) == 0
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == before


def test_a_payload_on_stdin_that_is_not_utf8_is_exit_2(tmp_path):
    import subprocess
    import sys

    from tests.worker.helpers import ROOT, env

    path = str(tmp_path / "inbox.db")
    assert cli.main(["init", path]) == 0
    before = snapshot(tmp_path)
    for variables in ({}, {"LC_ALL": "C", "PYTHONUTF8": "0"}):
        result = subprocess.run(
            [sys.executable, "-m", "onwatch", "ingest", path, "chat", "s1", "-"],
            input=b'{"a": "\xff"}',
            cwd=ROOT,
            capture_output=True,
            env=env(tmp_path, **variables),
            timeout=60,
        )
        err = result.stderr.decode("utf-8", "replace")
        assert result.returncode == 2 and err.count("\n") == 1 and "not UTF-8" in err, err
        assert snapshot(tmp_path) == before
    result = subprocess.run(
        [sys.executable, "-m", "onwatch", "ingest", path, "chat", "s2", "-"],
        input='{"a": "é"}'.encode(),
        cwd=ROOT,
        capture_output=True,
        env=env(tmp_path),
        timeout=60,
    )
    assert result.returncode == 0 and result.stdout == b"stored\n"


def test_user_code_calling_sys_exit_is_one_line_and_exit_2(tmp_path, capsys):
    """An agent module or a --setup that calls sys.exit() must not choose onwatch's exit code
    (7 is none of 0-3) nor skip the one-line error."""
    path = str(tmp_path / "inbox.db")
    assert cli.main(["init", path]) == 0
    (tmp_path / "exits_at_import.py").write_text("import sys\nsys.exit(7)\n")
    (tmp_path / "exits_in_setup.py").write_text(
        "import sys\ndef handle(batch, ctx): pass\ndef setup(inbox): sys.exit(9)\n"
    )
    capsys.readouterr()
    for argv, words in (
        (["worker", path, "--agent", f"{tmp_path}/exits_at_import.py:handle"], "cannot import"),
        (
            [
                "worker",
                path,
                "--agent",
                f"{tmp_path}/exits_in_setup.py:handle",
                "--setup",
                f"{tmp_path}/exits_in_setup.py:setup",
            ],
            "failed: SystemExit: 9",
        ),
    ):
        before = snapshot(tmp_path)
        code = _bounded(cli.main, argv)
        err = capsys.readouterr().err
        assert code == 2 and words in err and err.count("\n") == 1, (argv, err)
        assert snapshot(tmp_path) == before, argv
