"""Helpers for tests that run onwatch in real OS processes."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

from tests.waiting import until_sync

ROOT = Path(__file__).resolve().parents[2]


def env(test_dir: str | os.PathLike, **extra: str) -> dict[str, str]:
    values = dict(
        os.environ,
        ONWATCH_TEST_DIR=str(test_dir),
        PYTHONDONTWRITEBYTECODE="1",
        PYTHONPATH=str(ROOT),
    )
    values.update(extra)
    return values


def onwatch(
    *args: str, test_dir: str | os.PathLike = "/tmp", timeout: float = 20, input: str | None = None
) -> subprocess.CompletedProcess:
    """Run the `onwatch` command line in a fresh process."""
    return subprocess.run(
        [sys.executable, "-m", "onwatch", *map(str, args)],
        cwd=ROOT,
        env=env(test_dir),
        capture_output=True,
        text=True,
        timeout=timeout,
        input=input,
    )


def start_worker(
    path,
    agent: str,
    test_dir,
    *extra: str,
    holder: str | None = None,
    name: str = "worker",
    module: str = "tests.worker.agents",
) -> subprocess.Popen:
    """Start `onwatch worker` in its own process; its output goes to files in test_dir."""
    args = [
        sys.executable,
        "-m",
        "onwatch",
        "worker",
        str(path),
        "--agent",
        f"{module}:{agent}",
        "--poll",
        "0.1",
        *extra,
    ]
    if holder:
        args += ["--holder", holder]
    out = open(os.path.join(test_dir, f"{name}.out"), "ab")
    err = open(os.path.join(test_dir, f"{name}.err"), "ab")
    try:
        return subprocess.Popen(args, cwd=ROOT, env=env(test_dir), stdout=out, stderr=err)
    finally:
        out.close()
        err.close()


def wait_for(predicate, timeout: float = 10.0, interval: float = 0.05, what: str = "it"):
    """Poll `predicate` until it returns something truthy; fail after `timeout` seconds."""
    return until_sync(predicate, timeout=timeout, what=what, interval=interval)


SHOW_NAPS = ("--setup", "tests.worker.agents:show_naps")  # worker arguments for wait_asleep


def asleep(test_dir) -> bool:
    """True while a worker started with SHOW_NAPS sleeps in an idle nap."""
    return Path(test_dir, "signals", "asleep").exists()


def wait_asleep(test_dir, timeout: float = 10.0, what: str = "the worker to go idle") -> None:
    """Wait until a worker started with SHOW_NAPS has gone to sleep: it has done everything
    it had to do and waits for a wake-up (a run it finished before this is behind it)."""
    wait_for(lambda: asleep(test_dir), timeout=timeout, interval=0.01, what=what)


def stop(process: subprocess.Popen, timeout: float = 10.0) -> int:
    """SIGCONT then SIGTERM a process and wait for it; SIGKILL if it will not go."""
    if process.poll() is None:
        for signum in (signal.SIGCONT, signal.SIGTERM):
            try:
                process.send_signal(signum)
            except ProcessLookupError:
                pass
        try:
            return process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
            raise AssertionError(f"process {process.pid} ignored SIGTERM for {timeout} s") from None
    return process.returncode


def kill_listed(pid_file: Path) -> None:
    """SIGKILL the processes whose ids a test's command wrote to `pid_file`, one a line
    (daemons a command left behind), and remove the file."""
    if pid_file.exists():
        for pid in pid_file.read_text().split():
            try:
                os.kill(int(pid), signal.SIGKILL)
            except ProcessLookupError:
                pass
        pid_file.unlink()


def query(path, sql: str, params: tuple = ()) -> list[tuple]:
    """Read the inbox file directly (a separate connection, like any other process)."""
    db = sqlite3.connect(path, timeout=10)
    try:
        return db.execute(sql, params).fetchall()
    finally:
        db.close()


def scalar(path, sql: str, params: tuple = ()):
    rows = query(path, sql, params)
    return rows[0][0] if rows else None


def event_status(path, source_id: str):
    return scalar(path, "SELECT status FROM events WHERE source_id = ?", (source_id,))


def sent_lines(path) -> list[str]:
    """The whole lines a file channel has written so far: none while the file is missing, and
    never a line another process has opened the file for but not yet written."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        return []
    return text.split("\n")[:-1]  # (not splitlines: a reply's text may hold U+2028)


def log_of(test_dir, name: str = "worker") -> str:
    chunks = []
    for suffix in ("out", "err"):
        try:
            chunks.append(Path(test_dir, f"{name}.{suffix}").read_text(errors="replace"))
        except FileNotFoundError:
            pass
    return "\n".join(chunks)
