#!/usr/bin/env python3
"""Bootstrap: make the project's virtual environment on first use, then run a command in it.

    python3 dev.py demo       the demo on a scratch inbox
    python3 dev.py test       the static checks, then the whole test suite (what CI runs)
    python3 dev.py test -k x  the static checks, then pytest with these arguments
    python3 dev.py test --no-lint -k x
                              pytest only (a quick loop while editing; CI never passes it)
    python3 dev.py bench      the benchmark suite (prints figures)
    python3 dev.py bench peers [--rounds N] [--quick] [--json PATH]
                              onwatch against the queues people would pick instead
    python3 dev.py docs       write docs/cli.md from the argument parser
    python3 dev.py onwatch …  any onwatch command

Needs only Python 3.11+. The environment lives in .venv/ and is rebuilt when pyproject.toml
changes.

Signals pass through: an onwatch command replaces this process (exec), so SIGTERM, SIGHUP and
Ctrl-C reach it as if it had been started directly, and its exit code is this command's; the
test and bench children get SIGTERM and SIGHUP forwarded, and this command returns their
exit code.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import signal
import subprocess
import sys
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = ROOT / ".venv"
BIN = VENV / ("Scripts" if os.name == "nt" else "bin")
PYTHON = BIN / ("python.exe" if os.name == "nt" else "python")
STAMP = VENV / ".onwatch-installed"


def ensure_env() -> None:
    if sys.version_info < (3, 11):
        sys.exit(f"onwatch needs Python 3.11 or newer; this is {sys.version.split()[0]}")
    wanted = hashlib.sha256((ROOT / "pyproject.toml").read_bytes()).hexdigest()
    if STAMP.exists() and STAMP.read_text() == wanted and PYTHON.exists():
        return
    if not PYTHON.exists():
        print("onwatch: creating .venv (first run only) …", file=sys.stderr)
        venv.EnvBuilder(with_pip=True, clear=True).create(VENV)
    print("onwatch: installing dependencies into .venv …", file=sys.stderr)
    subprocess.run(
        [
            str(PYTHON),
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            "-e",
            f"{ROOT}[test]",
        ],
        check=True,
    )
    STAMP.write_text(wanted)


def static_checks(env: dict[str, str]) -> bool:
    """Run every static check, one line each; True when all pass (all run even after a failure)."""
    checks = [
        ("mypy (strict)", [str(PYTHON), "-m", "mypy"]),
        ("import-linter (layers)", [str(BIN / "lint-imports"), "--no-cache"]),
        ("ruff (lint)", [str(BIN / "ruff"), "check", "--no-cache", "."]),
        ("ruff (format)", [str(BIN / "ruff"), "format", "--check", "--no-cache", "."]),
    ]
    passed = True
    for name, command in checks:
        result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
        if result.returncode == 0:
            print(f"onwatch: {name}: ok", file=sys.stderr)
            continue
        passed = False
        print(f"onwatch: {name}: FAILED", file=sys.stderr)
        sys.stderr.write(result.stdout + result.stderr)
    return passed


def run_child(command: list[str], *, env: dict[str, str], cwd: Path | None = None) -> int:
    """Run `command` to its end and return its exit code (128 + N if signal N ended it, as
    a shell says), passing signals through: SIGTERM and SIGHUP sent to this process are
    forwarded to the child, which stops as it would have alone (a worker finishes or
    abandons its run and releases its lease); this process waits for it instead of dying
    first and leaving it behind. Ctrl-C is not forwarded when the terminal already sent it
    to the child (same foreground process group): twice would mean "stop now" to a worker."""
    child = subprocess.Popen(command, cwd=cwd, env=env)

    def forward(signum: int, frame: object) -> None:
        with contextlib.suppress(ProcessLookupError):
            child.send_signal(signum)

    def interrupted(signum: int, frame: object) -> None:
        if not _terminal_sent_it_too():
            forward(signum, frame)

    saved = {}
    for name, handler in (("SIGTERM", forward), ("SIGHUP", forward), ("SIGINT", interrupted)):
        if hasattr(signal, name):
            signum = getattr(signal, name)
            saved[signum] = signal.signal(signum, handler)
    try:
        code: int = child.wait()
    finally:
        for signum, previous in saved.items():
            signal.signal(signum, previous)
    return 128 - code if code < 0 else code


def _terminal_sent_it_too() -> bool:
    """True when this process is in its terminal's foreground process group: a Ctrl-C there
    reaches every process of the group, the child included (on Windows, every process of
    the console)."""
    if os.name == "nt":
        return True
    try:
        with open("/dev/tty", "rb") as tty:
            return os.tcgetpgrp(tty.fileno()) == os.getpgrp()
    except (OSError, AttributeError):
        return False


def run_onwatch(args: list[str], env: dict[str, str]) -> int:
    """The onwatch command in place of this process (POSIX): every signal reaches it as if
    it had been started directly, and its exit code is ours. Elsewhere, as a child."""
    program = str(BIN / ("onwatch.exe" if os.name == "nt" else "onwatch"))
    if os.name == "nt":
        return run_child([program, *args], env=env)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(program, [program, *args], env)
    raise AssertionError("unreachable: execve returns only by raising")


def main(argv: list[str]) -> int:
    command, *rest = argv or ["demo"]
    ensure_env()
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    if command == "test":
        lint = "--no-lint" not in rest
        rest = [arg for arg in rest if arg != "--no-lint"]
        if lint and not static_checks(env):
            print("onwatch: static checks failed; not running pytest", file=sys.stderr)
            return 1
        code = run_child([str(PYTHON), "-m", "pytest", *rest], cwd=ROOT, env=env)
        if code == 5:
            print("onwatch: pytest collected no tests; treating that as a failure", file=sys.stderr)
            return 1
        return code
    if command == "bench" and rest[:1] == ["peers"]:
        script = ROOT / "tests" / "bench" / "bench_peers.py"
        return run_child([str(PYTHON), str(script), *rest[1:]], cwd=ROOT, env=env)
    if command == "bench":
        return run_child(
            [str(PYTHON), str(ROOT / "tests" / "bench" / "run_all.py"), *rest], cwd=ROOT, env=env
        )
    if command == "docs":
        return run_child(
            [str(PYTHON), "-m", "tests.docs.cli_page", "--write", *rest], cwd=ROOT, env=env
        )
    if command == "onwatch":
        return run_onwatch(rest, env)
    return run_onwatch([command, *rest], env)


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except KeyboardInterrupt:  # Ctrl-C while setting up or in the static checks
        print("onwatch: interrupted", file=sys.stderr)
        sys.exit(130)
