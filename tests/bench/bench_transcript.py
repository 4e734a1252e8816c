#!/usr/bin/env python3
"""What the run's transcript costs (docs/performance.md, "A run's transcript").

    python3 dev.py bench                  every benchmark (this one included)
    python3 tests/bench/bench_transcript.py [--quick] [--rounds N]

On a file inbox in a temporary folder (never in the repository), in one process:

* lines an agent can log: `ctx.log` called in a tight loop by a running agent (the call only
  appends to memory), and how many lines per second the worker's writer then stores (every
  line kept: the budget is set large enough);
* the run cycle (tests/bench/bench_core.py's: ingest, acquire, claim, finish) without a
  transcript, and with one batch of 10 lines stored per run, as the worker's writer does;
* whole worker runs per second, the agent logging nothing or 10 lines a run;
* how long a line takes to reach the desk: a worker process logs, the desk (in this process)
  follows the running event's detail; from the agent's call to the line on screen.

Each figure is the median over the rounds, with the lowest and highest. Nothing is asserted:
figures on a shared machine are for reading, not for failing a build.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Awaitable, Callable

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from onwatch.core import FakeClock, Inbox  # noqa: E402
from onwatch.core.runtime.worker import run_worker  # noqa: E402

NOW = 1_700_000_000
LINE = "called the model: 812 tokens in, 214 out, finish_reason=stop"  # 60 characters


async def log_rate(folder: str, lines: int) -> tuple[float, float]:
    """(ctx.log calls/s in the agent, lines/s stored by the writer)."""
    path = os.path.join(folder, f"rate-{time.monotonic_ns()}.db")
    timing: dict[str, float] = {}

    async def agent(batch: list[Any], ctx: Any) -> None:
        start = time.perf_counter()
        for i in range(lines):
            ctx.log(LINE, i=i)
        timing["logged"] = time.perf_counter() - start
        timing["start"] = start

    async with await Inbox.open(path) as inbox:
        await inbox.configure(max_transcript_chars=lines * 200)
        await inbox.ingest("chat", "m", {})
        await run_worker(inbox, agent, max_runs=1, poll_interval=0.01)
        stored_at = time.perf_counter()  # the run's finish waited for its transcript
        [run] = await inbox.runs(1)
        transcript = await inbox.transcript(run.id, limit=1)
        if transcript.stored != lines:
            raise AssertionError(f"stored {transcript.stored} of {lines} lines")
    return lines / timing["logged"], lines / (stored_at - timing["start"])


async def cycles(folder: str, n: int, lines: int) -> float:
    """bench_core's run cycle, plus one 10-line transcript batch per run when `lines`."""
    box = await Inbox.open(
        os.path.join(folder, f"cycle-{lines}-{time.monotonic_ns()}.db"), clock=FakeClock(NOW)
    )
    batch = [(i, NOW, "log", None, LINE, None) for i in range(lines)]
    try:
        start = time.perf_counter()
        for i in range(n):
            await box.ingest("chat", f"msg-{i}", {"text": f"message {i}"}, now=NOW)
            gen = await box.acquire("worker", now=NOW)
            claimed = await box.claim_batch("worker", gen, now=NOW)
            if lines:
                await box.append_transcript(claimed[0].run_id, batch, now=NOW)
            if not await box.finish(
                "worker", gen, [e.id for e in claimed], [f"answer {i}"], now=NOW
            ):
                raise AssertionError("finish refused")
        return n / (time.perf_counter() - start)
    finally:
        await box.close()


async def worker_runs(folder: str, n: int, lines: int) -> float:
    """Whole worker runs per second (claim, agent, transcript, finish), `lines` per run."""
    path = os.path.join(folder, f"runs-{lines}-{time.monotonic_ns()}.db")

    async def agent(batch: list[Any], ctx: Any) -> None:
        for i in range(lines):
            ctx.log(LINE, i=i)
        ctx.reply("done")

    async with await Inbox.open(path) as inbox:
        await inbox.configure(max_batch=1)
        await inbox.ingest_batch([("chat", f"m-{i}", {}) for i in range(n)])
        start = time.perf_counter()
        await run_worker(inbox, agent, max_runs=n, poll_interval=0.01)
        return n / (time.perf_counter() - start)


def desk_latency(folder: str, steps: int) -> list[float]:
    """Seconds from a worker process's ctx.log to the line on the desk (another process)."""
    return asyncio.run(_desk_latency(Path(folder) / f"desk-{time.monotonic_ns()}", steps))


async def _desk_latency(test_dir: Path, steps: int) -> list[float]:
    from textual.widgets import RichLog

    from onwatch.tui.app import OnwatchApp
    from onwatch.tui.screens.detail import DetailScreen
    from tests.watch.helpers import say, said, start_worker

    test_dir.mkdir()
    path = str(test_dir / "inbox.db")
    async with await Inbox.open(path) as setup:
        await setup.ingest("chat", "m-1", {})
    worker = start_worker(path, "talker", test_dir)
    latencies = []
    try:
        inbox = await Inbox.open(path, create=False)
        app = OnwatchApp(inbox)
        async with app.run_test(size=(120, 40)) as pilot:
            await asyncio.wait_for(app.loaded.wait(), 30)
            await _until(pilot, lambda: _running(app), 30)
            await pilot.press("2")
            await _until(pilot, lambda: app.pane("running").records(), 30)
            await pilot.press("enter")
            await _until(
                pilot, lambda: isinstance(app.screen, DetailScreen) and app.screen.follow, 30
            )
            for n in range(1, steps + 1):
                text = f"line number {n} of the benchmark"
                say(test_dir, n, f"log {text}")

                def shown(text: str = text) -> bool:
                    log = app.screen.query_one("#live", RichLog)
                    return any(text in strip.text for strip in log.lines)

                await _until(pilot, shown, 30, step=0.001)
                seen = time.time()
                latencies.append(seen - (said(test_dir, n) or seen))
        await inbox.close()
        say(test_dir, steps + 1, "end")
    finally:
        worker.terminate()
        worker.wait(30)
    return latencies


def _running(app: Any) -> bool:
    overview = app.overview
    return overview is not None and overview.counts.get("running", 0) == 1


async def _until(
    pilot: Any, predicate: Callable[[], Any], timeout: float, step: float = 0.02
) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("benchmark: timed out waiting")
        await pilot.pause(step)


def _fmt(values: list[float], unit: str) -> str:
    med = statistics.median(values)
    return f"{med:>12,.0f} {unit:<10} ({min(values):,.0f}–{max(values):,.0f})"


async def _rounds(fn: Callable[[], Awaitable[Any]], rounds: int) -> list[Any]:
    return [await fn() for _ in range(rounds)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes: a smoke run")
    parser.add_argument("--rounds", type=int, default=None)
    args = parser.parse_args(argv)
    rounds = args.rounds or (1 if args.quick else 5)
    lines, n, runs, steps = (2_000, 50, 30, 5) if args.quick else (100_000, 500, 300, 40)
    folder = tempfile.mkdtemp(prefix="onwatch-bench-transcript-")
    try:
        rates = asyncio.run(_rounds(lambda: log_rate(folder, lines), rounds))
        print(f"lines an agent logs ({lines:,} lines of {len(LINE)} characters, one run)")
        print(f"  ctx.log calls in the agent   {_fmt([r[0] for r in rates], 'lines/s')}")
        print(f"  stored by the worker         {_fmt([r[1] for r in rates], 'lines/s')}")
        plain = asyncio.run(_rounds(lambda: cycles(folder, n, 0), rounds))
        logged = asyncio.run(_rounds(lambda: cycles(folder, n, 10), rounds))
        print(f"run cycle (ingest+acquire+claim+finish, {n} cycles)")
        print(f"  without a transcript         {_fmt(plain, 'cycles/s')}")
        print(f"  with 10 lines a run          {_fmt(logged, 'cycles/s')}")
        ratio = statistics.median(logged) / statistics.median(plain)
        print(f"  with / without              {ratio:>12.2f}")
        quiet = asyncio.run(_rounds(lambda: worker_runs(folder, runs, 0), rounds))
        talking = asyncio.run(_rounds(lambda: worker_runs(folder, runs, 10), rounds))
        print(f"worker runs ({runs} runs, each a reply)")
        print(f"  agent logs nothing           {_fmt(quiet, 'runs/s')}")
        print(f"  agent logs 10 lines a run    {_fmt(talking, 'runs/s')}")
        latencies = desk_latency(folder, steps)
        ms = sorted(1000 * x for x in latencies)
        p95 = ms[min(len(ms) - 1, int(0.95 * len(ms)))]
        print(f"a line to the desk (worker process → desk, {len(ms)} lines)")
        print(f"  median {statistics.median(ms):.1f} ms   p95 {p95:.1f} ms   max {ms[-1]:.1f} ms")
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
