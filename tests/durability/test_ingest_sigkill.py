"""An acknowledged ingest survives SIGKILL of the process.

A child process ingests in a loop and prints each key only after `await inbox.ingest(...)`
returned — that print is the acknowledgement a webhook sender would get. The parent SIGKILLs
the child mid-stream (commits in flight), then checks that every printed key is in the inbox
and the file is intact. Run for one writer at a time and for many concurrent writers (the
group-commit path), with each commit on the connection's thread and, with `loop_writes`, a
lone ingest's on the event loop's own, and repeated on the same file so a kill also lands in
a reopened inbox.

SIGKILL proves the engine acknowledges only after COMMIT returned; power loss additionally
needs the fsync that `synchronous = FULL` performs (tests/core checks that pragma).
"""

from __future__ import annotations

import os
import random
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from onwatch.core import Inbox

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow

CHILD = r"""
import asyncio, sys
from onwatch.core import Inbox

async def main(path, prefix, writers, loop_writes):
    box = await Inbox.open(path)
    box.loop_writes = loop_writes == "loop"
    out = sys.stdout

    async def writer(w):
        i = 0
        while True:
            key = f"{prefix}-{w}-{i}"
            await box.ingest("kill", key, {"writer": w, "i": i, "pad": "x" * 200})
            out.write(key + "\n")   # the acknowledgement: only after ingest returned
            out.flush()
            i += 1

    print("ready", flush=True)
    await asyncio.gather(*(writer(w) for w in range(writers)))

asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]))
"""


def _kill_mid_stream(
    path: str,
    prefix: str,
    writers: int,
    acks_before_kill: int,
    rng: random.Random,
    commits: str = "thread",
) -> list[str]:
    acked: list[str] = []
    with subprocess.Popen(
        [sys.executable, "-c", CHILD, path, prefix, str(writers), commits],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    ) as child:
        try:
            assert child.stdout.readline() == b"ready\n", child.stderr.read().decode()
            deadline = time.monotonic() + 60
            while len(acked) < acks_before_kill:
                line = child.stdout.readline()
                assert line, f"child died early: {child.stderr.read().decode()}"
                acked.append(line.decode().strip())
                assert time.monotonic() < deadline, "child too slow"
            time.sleep(rng.uniform(0, 0.003))  # land the kill anywhere in a commit
            child.send_signal(signal.SIGKILL)
            rest = child.stdout.read()  # acknowledgements printed before the kill
        finally:
            if child.poll() is None:
                child.kill()
            child.wait()
    assert child.returncode == -signal.SIGKILL
    complete = rest.decode().split("\n")[:-1]  # a cut-off last line was never a whole ack
    return acked + complete


def _stored_keys(path: str) -> set[str]:
    db = sqlite3.connect(path)
    try:
        assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        return {r[0] for r in db.execute("SELECT source_id FROM events WHERE source = 'kill'")}
    finally:
        db.close()


@pytest.mark.parametrize("commits", ["thread", "loop"])
@pytest.mark.parametrize("writers", [1, 32], ids=["sequential", "32-concurrent"])
def test_acknowledged_ingest_survives_sigkill(tmp_path, writers, commits):
    path = str(tmp_path / "inbox.db")
    rng = random.Random(writers)
    all_acked: list[str] = []
    for attempt in range(3):
        acked = _kill_mid_stream(path, f"run{attempt}", writers, 150 + 50 * attempt, rng, commits)
        stored = _stored_keys(path)
        lost = [key for key in acked if key not in stored]
        assert not lost, f"attempt {attempt}: {len(lost)} acknowledged events lost: {lost[:5]}"
        all_acked += acked
    assert len(set(all_acked)) == len(all_acked)
    assert set(all_acked) <= _stored_keys(path)


async def test_the_killed_inbox_reopens_and_counts_match(tmp_path):
    path = str(tmp_path / "inbox.db")
    acked = _kill_mid_stream(path, "once", 8, 200, random.Random(1))
    box = await Inbox.open(path)
    try:
        counts = await box.counts()
        assert counts["pending"] >= len(acked)  # the trigger-kept counts survived too
        assert counts["pending"] == len(_stored_keys(path))
    finally:
        await box.close()
