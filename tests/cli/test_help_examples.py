"""Every example in every `--help` is run, as written, and must do its job.

The examples are read back from the help text itself (what a person copies), and the ones of
one command run in order in a fresh sandbox (tests/cli/sandbox.py: alice.db and a folder of
inboxes in the states the examples name, hooks.toml, a web token in ~/.onwatch-web-token,
`onwatch` on $PATH). A command that ends by itself must exit 0 with no traceback. One that
keeps running (worker, serve, run, web, notify) must come up — hold the lease, listen, print
the address to open, say its first notice — and then stop cleanly on SIGTERM (exit 0). The
desks (tui, demo) run in a real terminal, tmux, must draw, and quit on `q` (exit 0).

One thing is changed from the text: a server's example gets `--port N` (a free port) added at
the end, since a test must not take a fixed port on a machine shared with other work.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import socket
import sqlite3
import subprocess
import time
import uuid

import pytest

from onwatch.cli.parser import build_parser
from tests.cli.sandbox import make_sandbox
from tests.terminal import Terminal

pytestmark = pytest.mark.slow

SERVERS = {"serve", "run", "web"}
RUNNING = SERVERS | {"worker", "notify"}
DESKS = {"tui", "demo"}
READY_WITHIN = 30.0  # seconds for a long-running command to come up
EXIT_WITHIN = 30.0


def subcommands() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    [group] = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(group.choices)


def examples_in(help_text: str) -> list[str]:
    """The command lines under the help's 'examples' heading (continuations joined)."""
    lines = help_text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("examples"))
    found: list[str] = []
    pending = ""
    for line in lines[start + 1 :]:
        if not line.startswith("  "):
            break
        text = pending + line.strip()
        if text.endswith("\\"):
            pending = text[:-1] + " "
            continue
        pending = ""
        found.append(text)
    return found


def command_of(example: str) -> str:
    """The subcommand an example runs: the word after `onwatch` (in the part of a pipeline
    that runs it)."""
    words = next(part.split() for part in example.split("|") if "onwatch" in part.split())
    return words[words.index("onwatch") + 1]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def onwatch_pid(pid: int) -> int:
    """The `python -m onwatch` process `pid` is, or runs (bash may exec it or fork it)."""
    for candidate in [pid, *children(pid)]:
        try:
            with open(f"/proc/{candidate}/cmdline", "rb") as handle:
                argv = handle.read().split(b"\0")
        except OSError:
            continue
        if b"onwatch" in argv and b"-m" in argv:
            return candidate
    raise AssertionError(f"no onwatch process under {pid}")


def children(pid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", encoding="utf-8") as handle:
                    parent = int(handle.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            if parent == pid:
                found.append(int(entry))
    return found


def wait_until(predicate, what: str, timeout: float = READY_WITHIN) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.1)


def lease_held(path: str) -> bool:
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as db:
        row = db.execute("SELECT until FROM lease").fetchone()
    return row is not None and row[0] >= int(time.time())


def listening(port: int) -> bool:
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) == 0


def run_to_the_end(example: str, folder: str, env: dict[str, str]) -> None:
    result = subprocess.run(
        ["bash", "-c", example],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=EXIT_WITHIN,
    )
    assert result.returncode == 0, (example, result.stdout, result.stderr)
    assert "Traceback" not in result.stderr, (example, result.stderr)


def run_then_stop(example: str, folder: str, env: dict[str, str]) -> None:
    command = command_of(example)
    port = free_port() if command in SERVERS else None
    bare = re.sub(r"\s+#\s[^'\"]*$", "", example)  # the option goes before a comment
    line = f"{bare} --port {port}" if port is not None else example
    out_path = os.path.join(folder, f".out-{uuid.uuid4().hex}")
    with open(out_path, "wb") as out:
        process = subprocess.Popen(
            ["bash", "-c", line], cwd=folder, env=env, stdout=out, stderr=subprocess.STDOUT
        )

    def output() -> str:
        with open(out_path, encoding="utf-8", errors="replace") as handle:
            return handle.read()

    try:
        if command == "worker":
            alice = os.path.join(folder, "alice.db")
            wait_until(lambda: lease_held(alice) or process.poll() is not None, "the lease")
        elif command == "web":
            wait_until(lambda: "open http" in output() or process.poll() is not None, "web")
        elif command == "notify":
            # Up once its command has said something: the sandbox has approvals waiting.
            [said] = re.findall(r">>\s*([\w.]+)", example)
            notices = os.path.join(folder, said)
            wait_until(
                lambda: (
                    os.path.exists(notices)
                    and os.path.getsize(notices) > 0
                    or process.poll() is not None
                ),
                "a notice",
            )
        else:
            assert port is not None
            wait_until(lambda: listening(port) or process.poll() is not None, "the port")
        assert process.poll() is None, (line, output())
        os.kill(onwatch_pid(process.pid), signal.SIGTERM)
        code = process.wait(EXIT_WITHIN)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert code == 0, (line, output())
    assert "Traceback" not in output(), (line, output())
    if command == "worker":
        assert not lease_held(os.path.join(folder, "alice.db"))  # released on the way out


def run_in_a_terminal(example: str, folder: str, env: dict[str, str]) -> None:
    if shutil.which("tmux") is None:
        pytest.skip("tmux is not installed: the desks' examples need a real terminal")
    terminal = Terminal(folder, env)
    exit_file = os.path.join(folder, f".exit-{uuid.uuid4().hex}")
    live = "--live" in example
    fleet = "inboxes/" in example
    drawn = (
        "Live: real worker processes"
        if live
        else "pick one of"
        if command_of(example) == "demo"
        else "Fleet"
        if fleet
        else "Pending"
    )
    try:
        terminal.start(example, exit_file)
        wait_until(lambda: drawn in terminal.screen(), f"the desk to draw {drawn!r}")
        if command_of(example) == "demo" and not live:
            terminal.keys("Escape")  # close the scenario list
            wait_until(lambda: "pick one of" not in terminal.screen(), "the list to close")
        terminal.keys("q")
        wait_until(
            lambda: os.path.exists(exit_file),
            f"{example!r} to quit on q; its screen:\n{terminal.screen()}",
            EXIT_WITHIN,
        )
        with open(exit_file, encoding="utf-8") as handle:
            code = handle.read().strip()
        assert code == "0", (example, terminal.screen())
    finally:
        terminal.close()


def run_examples(examples: list[str], folder: str) -> None:
    env = make_sandbox(folder)
    for example in examples:
        command = command_of(example)
        if command in DESKS:
            run_in_a_terminal(example, folder, env)
        elif command in RUNNING:
            run_then_stop(example, folder, env)
        else:
            run_to_the_end(example, folder, env)


def test_every_command_has_examples_in_its_help():
    for name, parser in subcommands().items():
        examples = examples_in(parser.format_help())
        assert examples, f"onwatch {name} --help has no example"
        assert all(command_of(e) == name or "onwatch" in e for e in examples), name


def test_the_examples_of_onwatch_help_run(tmp_path):
    examples = examples_in(build_parser().format_help())
    assert len(examples) >= 5
    run_examples(examples, str(tmp_path))


@pytest.mark.parametrize("name", sorted(subcommands()))
def test_the_examples_of_each_command_run(name, tmp_path):
    examples = examples_in(subcommands()[name].format_help())
    run_examples(examples, str(tmp_path))
