"""The worker's transcript writer: the agent's logging never waits for the database (it goes
on while another process holds the write lock), the lines waiting in memory stay within the
run's budget, and once the inbox takes them the transcript is exactly what the inbox's own
rule keeps: the beginning, the end, the count of what was dropped between."""

from __future__ import annotations

import asyncio
import sqlite3
import threading

from onwatch.core import FakeClock, Inbox
from onwatch.core.engine.transcripts import LINE_WEIGHT, budgets
from onwatch.core.runtime.transcript import TranscriptWriter

T = 1_000_000


async def until(predicate, timeout: float = 60.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not predicate():
        assert loop.time() < deadline, "timed out"
        await asyncio.sleep(0.01)


async def test_a_locked_inbox_holds_up_no_line_and_memory_stays_bounded(tmp_path):
    path = str(tmp_path / "inbox.db")
    async with await Inbox.open(path, clock=FakeClock(T), busy_timeout=0.05) as inbox:
        await inbox.configure(max_transcript_chars=20_000)
        await inbox.ingest("chat", "m-1", {})
        gen = await inbox.acquire("w")
        [event] = await inbox.claim_batch("w", gen)
        writer = TranscriptWriter(inbox)
        writer.start()
        run = writer.open(event.run_id, inbox.settings.max_transcript_chars)
        lock = sqlite3.connect(path, isolation_level=None)
        lock.execute("BEGIN IMMEDIATE")  # another process holds the write lock
        try:
            done = threading.Event()

            def agent() -> None:
                for i in range(20_000):
                    run.line("log", None, f"{i:05d} " + "x" * 30)
                done.set()

            thread = threading.Thread(target=agent)
            thread.start()
            await until(done.is_set)  # the loop runs meanwhile: the writer tries, and waits
            # All 20,000 calls returned while the inbox could take none of them.
            assert (await inbox.transcript(event.run_id)).logged == 0
            head, tail = budgets(20_000)
            size = 36 + LINE_WEIGHT
            assert run.waiting <= head // size + tail // size + 1  # bounded, not 20,000
            await until(lambda: writer.failures > 0)  # it tried, and waits for the lock
        finally:
            lock.execute("ROLLBACK")
            lock.close()
        assert await writer.flush(run, 30)
        await writer.close()
        whole = await inbox.transcript(event.run_id, limit=10_000)
        kept = [line.seq for line in whole.lines]
        assert kept == list(range(head // size)) + list(range(20_000 - tail // size, 20_000))
        assert whole.logged == 20_000 and whole.dropped == 20_000 - len(kept)
        assert whole.dropped_chars == whole.dropped * size
