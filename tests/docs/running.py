"""Runs the blocks of one documentation page in order, as a reader would type them, against
real processes (tests/docs/test_blocks.py).

A page runs in a folder of its own, empty but for a link to examples/, with the `--help`
examples' environment (tests/cli/sandbox.py: this checkout's `onwatch` on $PATH, a web
token in ~/.onwatch-web-token) and the environment's `python3` on $PATH before the
system's, as in a reader's activated environment. Its blocks run in order, so one block's
files and inboxes are the next one's:

- a ```sh block runs line by line (a line ending in `\\` goes on). A command that ends must
  exit 0 without a traceback on stderr. `worker`, `serve`, `run`, `web` and `notify` keep
  running: each is started in the background, must come up (hold its lease, listen, print
  its address, say a first notice into the file its command appends to), and
  is stopped with SIGTERM when its block ends (exit 0, lease released). While one runs, a
  later command of the block that fails is tried again for a while: a reader waits for the
  worker too. `tui` and `demo` run in a real terminal (tmux) and must draw and quit on `q`.
  A variable set on a line of its own (`key=…`, `export …`) holds for the lines after it.
- a ```python block runs in a fresh interpreter in the page's folder; top-level `await`
  works, as in `python -m asyncio`.
- a block after `<!-- file: NAME -->` is written to NAME (Python is compiled first).

A comment `# → TEXT` at the end of a line is what that line must print (stdout or stderr); on
a command that keeps running, what it must have printed before it is stopped. In a Python
block each such comment must be printed by the block.

What is changed from the text, and only this: `python3 dev.py onwatch` is `onwatch` (the
checkout's, on $PATH); a server gets a free port (`--port N`, added or replaced) and later
lines' and the page's files' `:8787` or `:8000` follow it, since a test must not take a fixed
port on a machine shared with other work.
"""

from __future__ import annotations

import dataclasses
import os
import re
import signal
import subprocess
import sys
import uuid
from pathlib import Path

from tests.cli.sandbox import make_sandbox
from tests.cli.test_help_examples import (
    DESKS,
    EXIT_WITHIN,
    READY_WITHIN,
    RUNNING,
    SERVERS,
    command_of,
    free_port,
    lease_held,
    listening,
    onwatch_pid,
    run_in_a_terminal,
    wait_until,
)
from tests.docs.blocks import PYTHON, ROOT, SHELL, Block
from tests.waiting import until_sync

COMMAND_WITHIN = 60.0  # seconds for one command that ends by itself
RETRY_WITHIN = 30.0  # seconds a reader would wait for a running worker to catch up
DEFAULT_PORTS = {"serve": 8787, "run": 8787, "web": 8000}
ASSIGNMENT = re.compile(r"^(export\s+)?[A-Za-z_][A-Za-z0-9_]*=")
EXPECT = re.compile(r"\s#\s→\s(?P<text>.+?)\s*$")

PYTHON_RUNNER = """\
import ast, asyncio, sys
code = compile(sys.argv[1], sys.argv[2], "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
outcome = eval(code, {"__name__": "__main__"})
if asyncio.iscoroutine(outcome):
    asyncio.run(outcome)
"""


class BlockFailed(AssertionError):
    """A block did not do what its page says; the message names the page and line."""


@dataclasses.dataclass
class Command:
    line: str  # what bash runs: continuation lines joined, the trailing comment dropped
    expect: str | None  # from `# → TEXT`


def commands(text: str) -> list[Command]:
    """The commands of a shell block, in order."""
    found: list[Command] = []
    pending = ""
    for raw in text.splitlines():
        if not pending and (not raw.strip() or raw.lstrip().startswith("#")):
            continue
        if raw.rstrip().endswith("\\"):
            pending += raw.rstrip()[:-1] + " "
            continue
        whole = pending + raw
        pending = ""
        match = EXPECT.search(whole)
        expect = match["text"] if match else None
        found.append(Command(" ".join(strip_comment(whole).split()), expect))
    if pending:
        found.append(Command(" ".join(pending.split()), None))
    return found


def strip_comment(line: str) -> str:
    """The line without a trailing `# …` comment (a `#` inside quotes is text)."""
    quote: str | None = None
    for i, char in enumerate(line):
        if quote:
            if char == quote:
                quote = None
        elif char in "'\"":
            quote = char
        elif char == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i].rstrip()
    return line.rstrip()


def is_onwatch(line: str) -> bool:
    return "onwatch" in line.replace("|", " ").split()


class Background:
    """A command that keeps running, started by its block and stopped when it ends."""

    def __init__(self, command: Command, line: str, folder: Path, env: dict[str, str]):
        self.command = command
        self.line = line
        self.name = command_of(line)
        self.folder = folder
        self.out = folder / f".out-{uuid.uuid4().hex}"
        with open(self.out, "wb") as out:
            self.process = subprocess.Popen(
                ["bash", "-c", line], cwd=folder, env=env, stdout=out, stderr=subprocess.STDOUT
            )

    def output(self) -> str:
        return self.out.read_text(encoding="utf-8", errors="replace")

    def inbox(self) -> Path:
        words = self.line.split()
        return self.folder / words[words.index(self.name) + 1]

    def wait_up(self, port: int | None) -> None:
        ended = self.process.poll
        if self.name == "worker":
            wait_until(lambda: lease_held(str(self.inbox())) or ended() is not None, "a lease")
        elif self.name == "web":
            wait_until(lambda: "open http" in self.output() or ended() is not None, "web")
        elif self.name == "notify":  # up once its command has said something, into a file
            said = re.findall(r">>\s*([\w.]+)", self.line)
            if not said:
                raise BlockFailed(f"`{self.line}`: name the file its command appends to (>>)")
            notices = self.folder / said[-1]

            def noticed() -> bool:
                return notices.exists() and notices.stat().st_size > 0

            wait_until(lambda: noticed() or ended() is not None, f"a notice in {notices.name}")
        elif port is not None:
            wait_until(lambda: listening(port) or ended() is not None, f"port {port}")
        else:
            raise BlockFailed(f"no way to tell that `{self.line}` is up: teach tests/docs")
        if self.process.poll() is not None:
            raise BlockFailed(f"`{self.line}` ended at once:\n{self.output()}")

    def stop(self) -> None:
        try:
            if self.command.expect is not None:
                expect = self.command.expect
                wait_until(
                    lambda: expect in self.output() or self.process.poll() is not None,
                    f"`{self.line}` to print {expect!r}",
                    RETRY_WITHIN,
                )
                if expect not in self.output():
                    raise BlockFailed(f"`{self.line}` never printed {expect!r}:\n{self.output()}")
            if self.process.poll() is not None:
                raise BlockFailed(f"`{self.line}` ended before its block did:\n{self.output()}")
            os.kill(onwatch_pid(self.process.pid), signal.SIGTERM)
            code = self.process.wait(EXIT_WITHIN)
        finally:
            if self.process.poll() is None:
                self.process.kill()
                self.process.wait()
        if code != 0:  # (its log may hold the agent's tracebacks: a run that raised)
            raise BlockFailed(f"`{self.line}` stopped with exit {code}:\n{self.output()}")
        if self.name == "worker" and lease_held(str(self.inbox())):
            raise BlockFailed(f"`{self.line}` kept its lease after SIGTERM")


class PageRun:
    """One page's folder and environment, and its blocks run in order."""

    def __init__(self, folder: Path):
        home = folder / "home"
        home.mkdir(parents=True)
        self.env = make_sandbox(str(home))
        # `python3` is the one onwatch is installed in, as in a reader's activated environment
        # (after the sandbox's `onwatch`, which the --help machinery knows how to stop).
        shim, rest = self.env["PATH"].split(os.pathsep, 1)
        self.env["PATH"] = os.pathsep.join([shim, os.path.dirname(sys.executable), rest])
        self.folder = folder / "page"
        self.folder.mkdir()
        (self.folder / "examples").symlink_to(ROOT / "examples")
        # The page's files: {path: (the text on the page, the text last written)}.
        self.files: dict[Path, tuple[str, str]] = {}

    def run(self, block: Block) -> None:
        try:
            if block.file is not None:
                self.write(block)
            elif not block.runnable:
                return
            elif block.language in PYTHON:
                self.python(block)
            elif block.language in SHELL:
                self.shell(block)
        except BlockFailed as failed:
            raise BlockFailed(f"{block.where}: {failed}") from None
        except AssertionError as failed:  # a wait of the --help machinery timed out
            raise BlockFailed(f"{block.where}: {failed}") from None

    def write(self, block: Block) -> None:
        assert block.file is not None
        if block.language in PYTHON:
            try:
                compile(block.text, block.file, "exec")
            except SyntaxError as error:
                raise BlockFailed(f"{block.file} does not compile: {error}") from None
        path = self.folder / block.file
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(block.text, encoding="utf-8")
        self.files[path] = (block.text, block.text)

    def python(self, block: Block) -> None:
        result = subprocess.run(
            [sys.executable, "-c", PYTHON_RUNNER, block.text, block.where],
            cwd=self.folder,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=COMMAND_WITHIN,
        )
        said = result.stdout + result.stderr
        if result.returncode != 0:
            raise BlockFailed(f"the Python block exited {result.returncode}:\n{said}")
        for line in block.text.splitlines():
            match = EXPECT.search(line)
            if match and match["text"] not in said:
                raise BlockFailed(f"the Python block never printed {match['text']!r}:\n{said}")

    def shell(self, block: Block) -> None:
        env = dict(self.env)
        ports: dict[int, int] = {}
        running: list[Background] = []
        try:
            for command in commands(block.text):
                line = self.rewrite(command.line, ports)
                if ASSIGNMENT.match(line) and not is_onwatch(line):
                    env.update(self.assign(line, env))
                elif is_onwatch(line) and command_of(line) in DESKS:
                    run_in_a_terminal(line, str(self.folder), env)
                elif is_onwatch(line) and command_of(line) in RUNNING:
                    line, port = self.with_free_port(line, ports)
                    if port is not None:
                        self.follow_ports(ports)
                    background = Background(command, line, self.folder, env)
                    running.append(background)
                    background.wait_up(port)
                else:
                    self.run_to_the_end(command, line, env, retry=bool(running))
            for background in reversed(running):
                background.stop()
        finally:
            for background in running:
                if background.process.poll() is None:
                    background.process.kill()
                    background.process.wait()

    def rewrite(self, line: str, ports: dict[int, int]) -> str:
        line = re.sub(r"\bpython3 dev\.py onwatch\b", "onwatch", line)
        for written, used in ports.items():
            line = re.sub(rf":{written}\b", f":{used}", line)
        return line

    def follow_ports(self, ports: dict[int, int]) -> None:
        """The page's files name the servers' ports as the page does; a file a command has
        changed since (the reader's edit) is left as it is."""
        for path, (text, written) in self.files.items():
            if path.read_text(encoding="utf-8") == written:
                now = self.rewrite(text, ports)
                path.write_text(now, encoding="utf-8")
                self.files[path] = (text, now)

    def with_free_port(self, line: str, ports: dict[int, int]) -> tuple[str, int | None]:
        name = command_of(line)
        if name not in SERVERS:
            return line, None
        port = free_port()
        given = re.search(r"--port[ =](\d+)", line)
        if given:
            ports[int(given[1])] = port
            return line[: given.start()] + f"--port {port}" + line[given.end() :], port
        ports[DEFAULT_PORTS[name]] = port
        return f"{line} --port {port}", port

    def assign(self, line: str, env: dict[str, str]) -> dict[str, str]:
        """The variables a line sets, exported for the lines after it."""
        result = subprocess.run(
            ["bash", "-c", f"set -a\n{line}\nenv -0"],
            cwd=self.folder,
            env=env,
            capture_output=True,
            timeout=COMMAND_WITHIN,
        )
        if result.returncode != 0:
            raise BlockFailed(f"`{line}` failed: {result.stderr.decode(errors='replace')}")
        pairs = (item.split(b"=", 1) for item in result.stdout.split(b"\0") if b"=" in item)
        return {key.decode(): value.decode(errors="replace") for key, value in pairs}

    def run_to_the_end(self, command: Command, line: str, env: dict[str, str], retry: bool) -> None:
        why: list[str] = []

        def done() -> bool:
            result = subprocess.run(
                ["bash", "-c", f"set -o pipefail\n{line}"],
                cwd=self.folder,
                env=env,
                capture_output=True,
                text=True,
                timeout=COMMAND_WITHIN,
            )
            said = result.stdout + result.stderr
            if result.returncode != 0:
                why[:] = [f"exit {result.returncode}:\n{said}"]
            elif "Traceback" in result.stderr:  # stdout may show one the agent left
                why[:] = [f"a traceback:\n{said}"]
            elif command.expect is not None and command.expect not in said:
                why[:] = [f"no {command.expect!r} in what it printed:\n{said}"]
            else:
                return True
            return False

        try:
            until_sync(done, timeout=RETRY_WITHIN if retry else 0, what=line, interval=0.2)
        except AssertionError:
            raise BlockFailed(f"`{line}`: {why[0]}") from None


def run_page(blocks: list[Block], folder: Path) -> int:
    """Run a page's blocks in order in `folder`; return how many ran (BlockFailed on one
    that did not do what its page says)."""
    page = PageRun(folder)
    ran = 0
    for block in blocks:
        page.run(block)
        ran += block.runnable
    return ran


__all__ = ["BlockFailed", "PageRun", "commands", "run_page", "READY_WITHIN"]
