"""`onwatch logs TARGET EVENT [--run N] [--follow] [--json]` in real processes: every attempt
under its run, escaped; JSON lines for a program; --follow prints a worker's lines as they
come, across a retry, and ends with the event."""

from __future__ import annotations

import json
import queue
import subprocess
import sys
import threading
import time

import pytest

from onwatch.core import FakeClock, Inbox

from tests.worker.helpers import ROOT, env, onwatch, stop

from .helpers import log_of, say, start_worker, wait_for

T = 1_000_000
HOSTILE = "evil \x1b]0;pwned\x07 [@click=app.quit]x[/] \u202eright"


async def _seeded(path: str) -> None:
    """Event 1: a failed attempt with a hostile line and a spend, then a done one; event 2
    never claimed."""
    async with await Inbox.open(path, clock=FakeClock(T)) as inbox:
        await inbox.configure(backoff_base=1)
        await inbox.ingest("chat", "m-1", {})
        gen = await inbox.acquire("w")
        [first] = await inbox.claim_batch("w", gen)
        await inbox.append_transcript(
            first.run_id,
            [
                (0, T, "log", None, "asked the model", json.dumps({"tokens": 812})),
                (1, T, "warning", "agent", HOSTILE, None),
                (2, T, "spend", None, "spent 0.25 usd", None),
            ],
            spends=[(2, T, "usd", 250_000, None)],
        )
        await inbox.finish("w", gen, [first.id], error="RuntimeError: boom", run=first.run_id)
        [second] = await inbox.claim_batch("w", gen, now=T + 60)
        await inbox.append_transcript(
            second.run_id, [(0, T + 60, "log", None, "second try", None)], upto=4
        )
        await inbox.finish("w", gen, [second.id], now=T + 61, run=second.run_id)
        await inbox.ingest("chat", "m-2", {})


async def test_every_attempt_is_printed_under_its_run_escaped(tmp_path):
    path = str(tmp_path / "inbox.db")
    await _seeded(path)
    shown = onwatch("logs", path, "1", test_dir=tmp_path)
    assert shown.returncode == 0, shown.stderr
    out = shown.stdout
    assert "\x1b" not in out and "\u202e" not in out and "\x07" not in out
    assert "evil \\x1b]0;pwned\\x07 [@click=app.quit]x[/] \\u202eright" in out
    lines = out.splitlines()
    assert lines[0].startswith("── run 1 · attempt 1 · gen 1 · w · claimed ")
    assert lines[0].endswith("· error: RuntimeError: boom · 0.25 usd ──")
    assert lines[1].endswith("log     asked the model  tokens=812")
    assert lines[2].endswith(
        "warning agent: " + "evil \\x1b]0;pwned\\x07 [@click=app.quit]x[/] \\u202eright"
    )
    assert lines[3].endswith("spend   spent 0.25 usd")
    assert lines[4].startswith("── run 2 · attempt 2 ·") and lines[4].endswith("· done ──")
    assert lines[5].endswith("log     second try")
    assert lines[6].startswith("… 3 lines dropped")

    only = onwatch("logs", path, "1", "--run", "2", "--json", test_dir=tmp_path)
    assert only.returncode == 0, only.stderr
    docs = [json.loads(line) for line in only.stdout.splitlines()]
    assert [d["type"] for d in docs] == ["run", "line", "gap", "end"]
    assert docs[0]["attempt"] == 2 and docs[0]["logged"] == 4 and docs[0]["dropped"] == 3
    assert docs[1]["text"] == "second try"
    assert docs[2] == {"type": "gap", "run": 2, "after_seq": 0, "dropped": 3}
    assert docs[3]["outcome"] == "done"
    hostile = onwatch("logs", path, "1", "--run", "1", "--json", test_dir=tmp_path).stdout
    assert json.loads(hostile.splitlines()[2])["text"] == HOSTILE
    assert hostile.isascii()

    never = onwatch("logs", path, "2", test_dir=tmp_path)
    assert never.returncode == 0 and "no run has claimed it yet" in never.stdout
    missing = onwatch("logs", path, "9", test_dir=tmp_path)
    assert missing.returncode == 1 and "no event 9" in missing.stderr
    other = onwatch("logs", path, "2", "--run", "1", test_dir=tmp_path)
    assert other.returncode == 1 and "run 1 did not claim event 2" in other.stderr


class Reader:
    """The lines a process prints, as they come (a thread reads its stdout)."""

    def __init__(self, process: subprocess.Popen) -> None:
        self.lines: queue.Queue[str] = queue.Queue()
        self.seen: list[str] = []
        threading.Thread(target=self._read, args=(process,), daemon=True).start()

    def _read(self, process: subprocess.Popen) -> None:
        for line in process.stdout:
            self.lines.put(line.rstrip("\n"))

    def until(self, text: str, timeout: float = 20.0) -> list[str]:
        deadline = time.monotonic() + timeout
        while not any(text in line for line in self.seen):
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"{text!r} not printed; got {self.seen}")
            try:
                self.seen.append(self.lines.get(timeout=left))
            except queue.Empty:
                pass
        return self.seen


@pytest.mark.slow
async def test_follow_prints_lines_as_they_come_across_a_retry_and_ends_with_the_event(
    tmp_path,
):
    path = str(tmp_path / "inbox.db")
    async with await Inbox.open(path) as inbox:
        await inbox.configure(backoff_base=1, lease_ttl=5)
        await inbox.ingest("chat", "m-1", {})
    worker = start_worker(path, "talker", tmp_path)
    follow = subprocess.Popen(
        [sys.executable, "-m", "onwatch", "logs", path, "1", "--follow"],
        cwd=ROOT,
        env=env(tmp_path),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        out = Reader(follow)
        out.until("── run 1 · attempt 1")
        say(tmp_path, 1, "log first words")
        out.until("first words")
        say(tmp_path, 2, "logging from logging")
        out.until("agent.talker: from logging")
        say(tmp_path, 3, "fail the first attempt fails")
        out.until("── run 1 ended: error")
        # The retry runs the steps again from the first (files say-1…): then it ends.
        say(tmp_path, 4, "end")
        lines = out.until("── run 2 ended: done")
        assert any(line.startswith("── run 2 · attempt 2") for line in lines)
        assert follow.wait(20) == 0, follow.stderr.read()
        assert sum("first words" in line for line in lines) == 2  # once per attempt
    finally:
        if follow.poll() is None:
            follow.kill()
        assert stop(worker) == 0, log_of(tmp_path)
    assert wait_for(lambda: follow.poll() is not None)
