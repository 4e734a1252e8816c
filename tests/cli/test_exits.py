"""Class 14 for the command line: a long-running command that stops or crashes exits.

Each test runs `onwatch` in its own OS process with code that leaves a thread running (an
agent stuck in a call, a thread an agent or its setup started) and waits, bounded, for the
process to end. Before, asyncio.run and the interpreter joined those threads for ever.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import textwrap

from onwatch.core import Inbox
from tests.worker.helpers import ROOT, env, wait_for

AGENTS = textwrap.dedent("""\
    import threading, time

    def stuck(batch, ctx):  # a plain def blocked in a call that never returns
        time.sleep(3600)

    def leaves_a_thread(batch, ctx):  # returns, but a non-daemon thread keeps running
        threading.Thread(target=time.sleep, args=(3600,), name="agent-helper").start()

    def handle(batch, ctx):
        ctx.result = "ok"

    def setup_then_crash(inbox):
        threading.Thread(target=time.sleep, args=(3600,), name="setup-helper").start()
        raise RuntimeError("setup crashed")
""")
EXIT_WITHIN = 20.0  # seconds; a hang is what these tests catch


def onwatch(tmp_path, *args: str) -> subprocess.Popen:
    err = open(tmp_path / "stderr.txt", "ab")
    try:
        return subprocess.Popen(
            [sys.executable, "-m", "onwatch", *args],
            cwd=ROOT,
            env=env(tmp_path),
            stdout=subprocess.DEVNULL,
            stderr=err,
        )
    finally:
        err.close()


def wait_exit(process: subprocess.Popen) -> int:
    try:
        return process.wait(EXIT_WITHIN)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
        raise AssertionError(f"the process did not exit within {EXIT_WITHIN} s") from None


def prepare(tmp_path) -> str:
    (tmp_path / "agents.py").write_text(AGENTS)
    path = str(tmp_path / "inbox.db")

    async def seed() -> None:
        async with await Inbox.open(path) as inbox:
            await inbox.ingest("chat", "m1", {"text": "hi"})

    asyncio.run(seed())
    return path


async def read(path: str):
    async with await Inbox.open(path, create=False) as inbox:
        return await inbox.get_event(1), await inbox.lease_info(), inbox.now()


def test_sigterm_with_the_agent_stuck_in_a_call_exits(tmp_path):
    path = prepare(tmp_path)
    agent = str(tmp_path / "agents.py") + ":stuck"
    worker = onwatch(
        tmp_path,
        "worker",
        path,
        "--agent",
        agent,
        "--grace",
        "0.5",
        "--no-dispatch",
        "--poll",
        "0.1",
    )
    wait_for(
        lambda: b"run 1:" in (tmp_path / "stderr.txt").read_bytes(),
        timeout=15,
        what="the run to start",
    )
    worker.send_signal(signal.SIGTERM)
    assert wait_exit(worker) == 0
    err = (tmp_path / "stderr.txt").read_text()
    assert "abandoned" in err and "leaving 1 thread(s) still running" in err, err
    event, lease, now = asyncio.run(read(path))
    assert event.status == "running" and event.attempts == 1  # left for recovery
    assert lease.until < now  # released on the way out
    # The next worker recovers the abandoned run (lost claim → pending → done).
    good = onwatch(
        tmp_path,
        "worker",
        path,
        "--agent",
        str(tmp_path / "agents.py") + ":handle",
        "--max-runs",
        "1",
        "--no-dispatch",
        "--poll",
        "0.1",
    )
    assert wait_exit(good) == 0
    event, _, _ = asyncio.run(read(path))
    assert (event.status, event.attempts) == ("done", 2)


def test_a_thread_left_by_the_agent_does_not_keep_the_worker_alive(tmp_path):
    path = prepare(tmp_path)
    worker = onwatch(
        tmp_path,
        "worker",
        path,
        "--agent",
        str(tmp_path / "agents.py") + ":leaves_a_thread",
        "--max-runs",
        "1",
        "--no-dispatch",
        "--poll",
        "0.1",
    )
    assert wait_exit(worker) == 0
    assert "agent-helper" in (tmp_path / "stderr.txt").read_text()
    event, lease, now = asyncio.run(read(path))
    assert event.status == "done" and lease.until < now


def test_a_setup_that_crashes_after_starting_a_thread_exits_2(tmp_path):
    path = prepare(tmp_path)
    worker = onwatch(
        tmp_path,
        "worker",
        path,
        "--agent",
        str(tmp_path / "agents.py") + ":handle",
        "--setup",
        str(tmp_path / "agents.py") + ":setup_then_crash",
        "--poll",
        "0.1",
    )
    assert wait_exit(worker) == 2
    err = (tmp_path / "stderr.txt").read_text()
    assert "setup crashed" in err and "setup-helper" in err, err
    event, _, _ = asyncio.run(read(path))
    assert event.status == "pending" and event.attempts == 0  # nothing ran
