#!/usr/bin/env python3
"""onwatch against the queues a user would pick instead, on both backends, in one run.

    python3 dev.py bench peers                        3 rounds (about 15 minutes)
    python3 dev.py bench peers --rounds 5 --json peers.json
    python3 dev.py bench peers --quick                a smoke run, figures meaningless
    python3 dev.py bench peers --contestants onwatch  onwatch alone (no peers installed)
    python3 dev.py bench peers profile sqlite|postgresql [JOBS]
                                                      where onwatch's time goes, per job

**The peers are never onwatch's dependencies**: huey, persist-queue and litequeue (SQLite),
pgqueuer and procrastinate (PostgreSQL) run in processes of the benchmarks' own environment
(tests/bench/peers_env.py, made with pip on first use), driven by tests/bench/peer_queues.py;
onwatch runs from this interpreter, as processes of this script. Every contestant of every
row runs in a process of its own, on a fresh file or database; what is timed is the
workload, not the start-up.

**The rows** (the table of issue #28):

- SQLite, enqueue one at a time, each durable: onwatch `Inbox.ingest` awaited one by one
  with `loop_writes` on (each commit on the caller's event loop, as a peer's direct call
  holds the caller's thread for its commit); huey SqliteHuey's enqueue, persist-queue
  SQLiteAckQueue.put, litequeue put, called directly. Then onwatch at its default (each
  commit on the connection's thread, the loop free meanwhile) against the same peers
  called as an asyncio program calls a synchronous library, through `asyncio.to_thread`
  (the loop free meanwhile too).
- SQLite, enqueue 100 in one call: `ingest_batch`; litequeue's puts in one transaction of
  its own API (huey and SQLiteAckQueue have no batch put).
- SQLite, drain: a worker runs every queued job, one per run, the handler doing nothing;
  jobs/s and CPU per job of the worker's process (every thread). onwatch: a real `Worker`
  with `max_batch=1`; huey: its consumer (one thread worker); persist-queue and litequeue:
  a loop get → ack / pop → done.
- SQLite, wake: a worker idle, another process enqueues a job every 60–120 ms and notes when
  the enqueue returned (committed); the handler notes when it is called: p50 / p99 of the
  difference. onwatch's worker (`onwatch worker`, the file notifier) against huey's
  consumer at its defaults, and huey, persist-queue and litequeue polling every 10 ms.
- PostgreSQL (one inbox / one queue): enqueue one at a time (onwatch at its default, each
  commit on the connection's thread, then with `loop_writes` on, each on the caller's loop;
  pgqueuer and procrastinate are asynchronous: their calls wait on the loop either way);
  enqueue 100 in one call; drain
  one job per run (onwatch `max_batch=1`, pgqueuer batch_size=1, procrastinate's worker at
  concurrency 1, which takes one job at a time); drain with default batching (onwatch's
  `max_batch` 20, pgqueuer's defaults).

**Durability, per row**: SQLite runs at `synchronous=FULL` in WAL for everyone (onwatch's
own setting, core/sqlite/db.py; huey with fsync=True; persist-queue keeps SQLite's default,
FULL; litequeue is set to FULL after it opens, and shown again at its own default NORMAL,
where a commit is not fsynced). PostgreSQL: one throwaway server (tests/pg/server.py) shared
by all, restarted with fsync=on (the tests run it with fsync off), synchronous_commit on: the
server's defaults (with ONWATCH_TEST_DATABASE_URL, that server as it is; the table says
which); pgqueuer buffers its completions in memory and writes them in batches, so a job it
ran may run again after a crash.

The contestants of a row take turns in an order rotated each round, and every row runs in
every round. A rate is the median over rounds with the lowest and highest; a ratio is
onwatch's median over the peer's (higher is better; for a wake, the peer's p50 over
onwatch's). The machine's load (os.getloadavg) is printed before and after: figures taken on
a loaded machine are noisier, never more flattering. `--json PATH` writes the table as JSON
(what docs/performance.md is kept current from).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.bench.peers_env import PEER_PACKAGES, peers_python  # noqa: E402

PEER_SCRIPT = ROOT / "tests" / "bench" / "peer_queues.py"
BATCH = 100
FULL = "synchronous=FULL (WAL) for all"
FULL_BUT_NORMAL = "synchronous=FULL (WAL) for all but litequeue (NORMAL)"
LITEQUEUE_NORMAL = (
    "litequeue (NORMAL) is litequeue's own default: a commit is not fsynced, so the last ones "
    "are lost on a power cut; shown beside FULL for what the peer does out of the box"
)
PG_DURABLE = "one server (its fsync and synchronous_commit are read when the run starts)"
HUEY = "huey deletes a job when it takes it: at most once, no completion record"
PGQUEUER_BUFFERS = (
    "pgqueuer buffers completions in memory and writes them in batches: a crash may run a "
    "finished job again"
)


@dataclass
class Row:
    key: str
    title: str
    backend: str  # "sqlite" or "postgresql"
    kind: str  # "rate" (jobs/s) or "wake" (ms)
    contestants: list[str]
    durability: str
    notes: list[str] = field(default_factory=list)


ROWS = [
    Row(
        "sqlite-enqueue",
        "SQLite, enqueue one at a time, each durable",
        "sqlite",
        "rate",
        ["onwatch", "huey", "persist-queue", "litequeue-full", "litequeue-normal"],
        FULL_BUT_NORMAL,
        [
            "onwatch with Inbox.loop_writes on: its commits on the caller's loop, as the "
            "peers' direct calls",
            LITEQUEUE_NORMAL,
        ],
    ),
    Row(
        "sqlite-enqueue-thread",
        "SQLite, enqueue one at a time, the peers through asyncio.to_thread",
        "sqlite",
        "rate",
        ["onwatch", "huey", "persist-queue", "litequeue-full", "litequeue-normal"],
        FULL_BUT_NORMAL,
        [
            "onwatch at its default: its commits on the connection's thread, the caller's "
            "loop free meanwhile, as the peers' through asyncio.to_thread",
            LITEQUEUE_NORMAL,
        ],
    ),
    Row(
        "sqlite-batch",
        "SQLite, enqueue 100 in one call",
        "sqlite",
        "rate",
        ["onwatch", "litequeue-full", "litequeue-normal"],
        FULL_BUT_NORMAL,
        ["huey and persist-queue's SQLiteAckQueue have no batch put", LITEQUEUE_NORMAL],
    ),
    Row(
        "sqlite-drain",
        "SQLite, a worker drains no-op jobs, one per run",
        "sqlite",
        "rate",
        ["onwatch", "huey", "persist-queue", "litequeue-full", "litequeue-normal"],
        FULL_BUT_NORMAL,
        [HUEY, LITEQUEUE_NORMAL],
    ),
    Row(
        "sqlite-wake",
        "SQLite, wake (commit in one process → handler called in another)",
        "sqlite",
        "wake",
        ["onwatch", "huey", "huey-10ms", "persist-queue", "litequeue-full"],
        FULL,
        [
            "huey at its defaults (0.1 s poll, growing ×1.15 while idle); "
            "the others poll every 10 ms"
        ],
    ),
    Row(
        "pg-enqueue",
        "PostgreSQL, enqueue one at a time",
        "postgresql",
        "rate",
        ["onwatch", "pgqueuer", "procrastinate"],
        PG_DURABLE,
    ),
    Row(
        "pg-enqueue-loop",
        "PostgreSQL, enqueue one at a time, onwatch with loop_writes",
        "postgresql",
        "rate",
        ["onwatch", "pgqueuer", "procrastinate"],
        PG_DURABLE,
        [
            "onwatch with Inbox.loop_writes on: its commits on the caller's loop, where the "
            "peers' asynchronous calls wait too (the row above: at its default, on the "
            "connection's thread)"
        ],
    ),
    Row(
        "pg-batch",
        "PostgreSQL, enqueue 100 in one call",
        "postgresql",
        "rate",
        ["onwatch", "pgqueuer", "procrastinate"],
        PG_DURABLE,
    ),
    Row(
        "pg-drain",
        "PostgreSQL, drain, one job per run",
        "postgresql",
        "rate",
        ["onwatch", "pgqueuer", "procrastinate"],
        PG_DURABLE,
        [PGQUEUER_BUFFERS],
    ),
    Row(
        "pg-drain-batched",
        "PostgreSQL, drain, default batching",
        "postgresql",
        "rate",
        ["onwatch", "pgqueuer"],
        PG_DURABLE,
        ["procrastinate takes one job at a time (the row above)", PGQUEUER_BUFFERS],
    ),
]
CONTESTANTS = sorted({c for row in ROWS for c in row.contestants})
PEER_NAMES = {
    "huey": "huey",
    "huey-10ms": "huey (10 ms poll)",
    "persist-queue": "persist-queue",
    "litequeue-full": "litequeue (FULL)",
    "litequeue-normal": "litequeue (NORMAL)",
    "pgqueuer": "pgqueuer",
    "procrastinate": "procrastinate",
}

# onwatch's way of running a row, where it differs from the peers' (the row's notes say why).
ONWATCH_MODES = {
    "sqlite-enqueue": "loop",
    "sqlite-enqueue-thread": "direct",
    "pg-enqueue-loop": "loop",
}

# Jobs per contestant and round (wake: samples per contestant and round).
SIZES = {
    "sqlite-enqueue": 2000,
    "sqlite-enqueue-thread": 2000,
    "sqlite-batch": 20_000,
    "sqlite-drain": 5000,
    "sqlite-wake": 100,
    "pg-enqueue": 1000,
    "pg-enqueue-loop": 1000,
    "pg-batch": 10_000,
    "pg-drain": 2000,
    "pg-drain-batched": 5000,
}
QUICK_SIZES = {
    "sqlite-enqueue": 50,
    "sqlite-enqueue-thread": 50,
    "sqlite-batch": 300,
    "sqlite-drain": 60,
    "sqlite-wake": 5,
    "pg-enqueue": 30,
    "pg-enqueue-loop": 30,
    "pg-batch": 300,
    "pg-drain": 30,
    "pg-drain-batched": 100,
}


# --- onwatch's side: processes of this script ---------------------------------------------------


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _open(backend: str, where: str) -> Any:
    from onwatch.core import Inbox

    if backend == "sqlite":
        return Inbox.open(os.path.join(where, "inbox.db"))
    return Inbox.open(where, name="bench")


async def onwatch_enqueue(backend: str, where: str, jobs: int, mode: str) -> dict[str, float]:
    keys = [f"e{k}" for k in range(jobs)]
    async with await _open(backend, where) as box:
        if mode == "loop":  # each commit on the caller's loop, as a peer's direct call
            box.loop_writes = True
        started, cpu = time.perf_counter(), _cpu()
        if mode == "batch":
            for start in range(0, jobs, BATCH):
                await box.ingest_batch(
                    [("bench", key, None) for key in keys[start : start + BATCH]]
                )
        else:
            for key in keys:
                await box.ingest("bench", key)
        seconds, cpu = time.perf_counter() - started, _cpu() - cpu
        stored = (await box.counts()).get("pending", 0)
    if stored != jobs:
        raise RuntimeError(f"{jobs} ingested, {stored} pending")
    return {"jobs": jobs, "seconds": seconds, "cpu": cpu}


async def onwatch_drain(backend: str, where: str, jobs: int, batching: str) -> dict[str, float]:
    from onwatch.core.runtime import Worker

    async with await _open(backend, where) as box:
        if batching == "one":
            await box.configure(max_batch=1)  # one job, one run: the peers' unit
        for start in range(0, jobs, 1000):
            await box.ingest_batch(
                [("bench", f"e{k}", None) for k in range(start, min(jobs, start + 1000))]
            )
    box = await _open(backend, where)
    ran = 0
    worker: Worker

    async def agent(batch: Any, ctx: Any) -> None:  # the no-op job
        nonlocal ran
        ran += len(batch)
        if ran >= jobs:
            worker.request_stop()  # after this run's finish, which is measured

    if backend == "sqlite":
        worker = Worker(box, agent, holder="bench")
    else:
        from onwatch.core.runtime.listening_worker import ListeningWorker

        worker = ListeningWorker(box, agent, holder="bench")
    try:
        started, cpu = time.perf_counter(), _cpu()
        stats = await worker.run()
        seconds, cpu = time.perf_counter() - started, _cpu() - cpu
        done = (await box.counts()).get("done", 0)
    finally:
        await box.close()
    if done != jobs or stats.done != stats.runs:
        raise RuntimeError(f"{jobs} queued, {done} done; {stats}")
    return {"jobs": jobs, "seconds": seconds, "cpu": cpu, "runs": stats.runs}


# --- where onwatch's time goes -----------------------------------------------------------------

STEPS = (
    "finish_and_claim",
    "claim_next",
    "run_scheduler",
    "reload_settings",
    "change_token",
    "claim_batch",
    "finish",
    "renew",
    "lease_info",
    "acquire",
    "next_wake",
)


def _io_written() -> int:
    """Bytes this process handed to write system calls so far (/proc/self/io's wchar)."""
    try:
        with open("/proc/self/io") as io:
            return next(int(line.split()[1]) for line in io if line.startswith("wchar:"))
    except (OSError, StopIteration):
        return 0


def _count_pg_statements(seen: Any) -> None:
    """Call `seen()` for every statement psycopg sends from now on (BEGIN and COMMIT
    included: they are round trips too)."""
    import psycopg

    execute, commit = psycopg.Connection.execute, psycopg.Connection.commit

    def counted_execute(self: Any, *args: Any, **kwargs: Any) -> Any:
        seen()
        return execute(self, *args, **kwargs)

    def counted_commit(self: Any) -> None:
        seen()
        commit(self)

    psycopg.Connection.execute = counted_execute  # type: ignore[method-assign]
    psycopg.Connection.commit = counted_commit  # type: ignore[method-assign]


async def profile_drain(backend: str, where: str, jobs: int) -> dict[str, Any]:
    """The one-per-run drain with every inbox call of the worker timed (wall µs a job) and,
    on SQLite, its SQL statements counted; the rest of a job's time is the worker's own."""
    from onwatch.core.runtime import Worker

    async with await _open(backend, where) as box:
        await box.configure(max_batch=1)
        for start in range(0, jobs, 1000):
            chunk = range(start, min(jobs, start + 1000))
            await box.ingest_batch([("bench", f"e{k}", None) for k in chunk])
    box = await _open(backend, where)
    spent = dict.fromkeys(STEPS, 0.0)
    calls = dict.fromkeys(STEPS, 0)
    statements = dict.fromkeys((*STEPS, "other"), 0)
    current = ["other"]
    if backend == "sqlite":

        def traced(sql: str) -> None:
            statements[current[0]] += 1

        box._db._conn._connection.set_trace_callback(traced)
    else:
        _count_pg_statements(lambda: statements.__setitem__(current[0], statements[current[0]] + 1))

    def timed(name: str, call: Any) -> Any:
        async def wrapper(*args: Any, **kwargs: Any) -> Any:
            current[0] = name
            started = time.perf_counter()
            try:
                return await call(*args, **kwargs)
            finally:
                spent[name] += time.perf_counter() - started
                calls[name] += 1
                current[0] = "other"

        return wrapper

    for name in STEPS:
        setattr(box, name, timed(name, getattr(box, name)))
    ran = 0
    worker: Worker

    async def agent(batch: Any, ctx: Any) -> None:
        nonlocal ran
        ran += len(batch)
        if ran >= jobs:
            worker.request_stop()

    if backend == "sqlite":
        worker = Worker(box, agent, holder="bench")
    else:
        from onwatch.core.runtime.listening_worker import ListeningWorker

        worker = ListeningWorker(box, agent, holder="bench")
    written = _io_written()
    started, cpu = time.perf_counter(), _cpu()
    try:
        await worker.run()
        seconds, cpu = time.perf_counter() - started, _cpu() - cpu
        written = _io_written() - written
        # The hand-off alone: a call that does nothing on the connection's thread.
        hop_started = time.perf_counter()
        for _ in range(1000):
            await box._db.call(lambda tx: None)
        hop = (time.perf_counter() - hop_started) / 1000
    finally:
        await box.close()
    per_job = {name: spent[name] / jobs * 1e6 for name in STEPS if calls[name]}
    per_job["the worker's own (agent call, run record, loop)"] = seconds / jobs * 1e6 - sum(
        per_job.values()
    )
    return {
        "jobs": jobs,
        "rate": jobs / seconds,
        "cpu_us": cpu / jobs * 1e6,
        "us_per_job": per_job,
        "calls_per_job": {name: calls[name] / jobs for name in STEPS if calls[name]},
        "statements_per_job": {k: v / jobs for k, v in statements.items() if v},
        "written_kib_per_job": written / jobs / 1024,
        "hand_off_us": hop * 1e6,
    }


async def profile_enqueue(backend: str, where: str, jobs: int) -> dict[str, Any]:
    """Single ingests: wall and CPU µs each, statements and bytes written each, and the
    hand-off (a no-op call on the connection's thread) for scale."""
    async with await _open(backend, where) as box:
        count = [0]
        if backend == "sqlite":
            box._db._conn._connection.set_trace_callback(
                lambda sql: count.__setitem__(0, count[0] + 1)
            )
        else:
            _count_pg_statements(lambda: count.__setitem__(0, count[0] + 1))
        written = _io_written()
        started, cpu = time.perf_counter(), _cpu()
        for k in range(jobs):
            await box.ingest("bench", f"e{k}")
        seconds, cpu = time.perf_counter() - started, _cpu() - cpu
        written = _io_written() - written
        hop_started = time.perf_counter()
        for _ in range(1000):
            await box._db.call(lambda tx: None)
        hop = (time.perf_counter() - hop_started) / 1000
    return {
        "jobs": jobs,
        "rate": jobs / seconds,
        "us_per_ingest": seconds / jobs * 1e6,
        "cpu_us": cpu / jobs * 1e6,
        "statements_per_ingest": count[0] / jobs,
        "written_kib_per_ingest": written / jobs / 1024,
        "hand_off_us": hop * 1e6,
    }


def profile(argv: list[str]) -> int:
    """`profile BACKEND [JOBS]`: where onwatch's time goes on the slow rows, printed as JSON."""
    backend, jobs = argv[0], int(argv[1]) if len(argv) > 1 else 2000
    folder = Path(tempfile.mkdtemp(prefix="onwatch-bench-profile-"))
    try:
        if backend == "sqlite":
            places = [str(folder / "drain"), str(folder / "enqueue")]
            for place in places:
                os.mkdir(place)
        else:
            from tests.pg.server import cluster

            places = [cluster().new_database(schema=False) for _ in range(2)]
        report = {
            "drain, one per run": asyncio.run(profile_drain(backend, places[0], jobs)),
            "enqueue one at a time": asyncio.run(profile_enqueue(backend, places[1], jobs)),
        }
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    print(json.dumps(report, indent=2))
    return 0


def child(argv: list[str]) -> int:
    """`child enqueue|drain BACKEND WHERE JOBS MODE`: one onwatch contestant, a JSON line."""
    command, backend, where, jobs, mode = argv
    run = onwatch_enqueue if command == "enqueue" else onwatch_drain
    print(json.dumps(asyncio.run(run(backend, where, int(jobs), mode))), flush=True)
    return 0


# --- running a contestant ------------------------------------------------------------------------


def _env() -> dict[str, str]:
    return dict(os.environ, PYTHONDONTWRITEBYTECODE="1", PYTHONPATH=str(ROOT))


def _json_line(command: list[str], what: str) -> dict[str, float]:
    result = subprocess.run(
        command, cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=900
    )
    if result.returncode != 0:
        raise RuntimeError(f"{what} exited {result.returncode}:\n{result.stdout}{result.stderr}")
    for line in reversed(result.stdout.splitlines()):
        if line.startswith("{"):
            figures: dict[str, float] = json.loads(line)
            return figures
    raise RuntimeError(f"{what} printed no figures:\n{result.stdout}{result.stderr}")


class Bench:
    def __init__(self, peers: str, folder: Path, pg: Any) -> None:
        self.peers, self.folder, self.pg = peers, folder, pg
        self._n = 0

    def place(self, backend: str) -> str:
        """A fresh folder (SQLite) or an empty database's URL (PostgreSQL)."""
        if backend == "postgresql":
            url: str = self.pg.new_database(schema=False)
            return url
        self._n += 1
        path = self.folder / f"c{self._n}"
        path.mkdir()
        return str(path)

    def measure(self, row: Row, who: str, size: int, seed: int) -> dict[str, Any]:
        where = self.place(row.backend)
        try:
            if row.kind == "wake":
                waits = self.wake(who, where, size, seed)
                return {
                    "p50": _percentile(waits, 0.5),
                    "p99": _percentile(waits, 0.99),
                    "waits": waits,
                }
            command = {
                "sqlite-enqueue": ("enqueue", "direct"),
                "sqlite-enqueue-thread": ("enqueue", "thread"),
                "sqlite-batch": ("enqueue", "batch"),
                "sqlite-drain": ("drain", "one"),
                "pg-enqueue": ("enqueue", "direct"),
                "pg-enqueue-loop": ("enqueue", "direct"),
                "pg-batch": ("enqueue", "batch"),
                "pg-drain": ("drain", "one"),
                "pg-drain-batched": ("drain", "default"),
            }[row.key]
            if who == "onwatch":
                mode = ONWATCH_MODES.get(row.key, command[1])
                args = [
                    sys.executable,
                    __file__,
                    "child",
                    command[0],
                    row.backend,
                    where,
                    str(size),
                    mode,
                ]
            else:
                args = [self.peers, str(PEER_SCRIPT), command[0], who, where, str(size), command[1]]
            figures = _json_line(args, f"{who} ({row.key})")
            return {
                "rate": figures["jobs"] / figures["seconds"],
                "cpu_ms": figures["cpu"] / figures["jobs"] * 1000,
            }
        finally:
            if row.backend == "sqlite":
                shutil.rmtree(where, ignore_errors=True)

    def wake(self, who: str, where: str, samples: int, seed: int) -> list[float]:
        if who == "onwatch":
            from tests.bench.bench_wake import worker_wake

            return sorted(worker_wake(where, samples, True, seed))
        called, committed = os.path.join(where, "called"), os.path.join(where, "committed")
        listener = subprocess.Popen(
            [self.peers, str(PEER_SCRIPT), "listen", who, where, called],
            cwd=ROOT, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        )  # fmt: skip
        try:
            assert listener.stdout is not None
            if listener.stdout.readline().strip() != "ready":
                raise RuntimeError(f"{who}'s listener did not start")
            subprocess.run(
                [self.peers, str(PEER_SCRIPT), "produce", who, where, str(samples), committed,
                 str(seed)],
                cwd=ROOT, env=_env(), check=True, timeout=600,
            )  # fmt: skip
            deadline = time.monotonic() + 60
            while not (
                os.path.exists(called) and len(Path(called).read_text().splitlines()) >= samples
            ):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{who}: not every job was handled in 60 s")
                time.sleep(0.05)
        finally:
            listener.terminate()
            try:
                listener.wait(timeout=30)
            except subprocess.TimeoutExpired:
                listener.kill()
                listener.wait()
        at = dict(line.split() for line in Path(committed).read_text().splitlines())
        return sorted(
            (float(when) - float(at[key])) * 1000
            for key, when in (line.split() for line in Path(called).read_text().splitlines())
        )


def stolen() -> float:
    """CPU seconds the hypervisor has given this virtual machine's CPUs to other machines
    so far (/proc/stat's steal; 0 where there is none). A measurement during which many
    were stolen ran on a slower machine: its CPU time a job rises with its wall time."""
    try:
        with open("/proc/stat") as stat:
            fields = stat.readline().split()
        return int(fields[8]) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


# --- the table -----------------------------------------------------------------------------------


def summarize(row: Row, rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """Median, lowest and highest over the rounds, per figure."""
    out: dict[str, Any] = {}
    keys = ("p50", "p99") if row.kind == "wake" else ("rate", "cpu_ms")
    for key in keys:
        values = [r[key] for r in rounds]
        out[key] = {"median": statistics.median(values), "min": min(values), "max": max(values)}
    return out


def ratio(row: Row, onwatch: dict[str, Any], peer: dict[str, Any]) -> float:
    if row.kind == "wake":
        return float(peer["p50"]["median"] / onwatch["p50"]["median"])
    return float(onwatch["rate"]["median"] / peer["rate"]["median"])


def _rate(figures: dict[str, Any], row: Row) -> str:
    if row.kind == "wake":
        p50, p99 = figures["p50"], figures["p99"]
        spread = f"{p50['min']:.1f}–{p50['max']:.1f}"
        return f"p50 {p50['median']:.1f} ms ({spread}), p99 {p99['median']:.1f} ms"
    r = figures["rate"]
    text = f"{r['median']:,.0f}/s ({r['min']:,.0f}–{r['max']:,.0f})"
    if row.key.endswith("drain") or row.key.endswith("batched"):
        text += f", {figures['cpu_ms']['median']:.2f} ms CPU a job"
    return text


def table(rows: list[Row], summary: dict[str, dict[str, Any]]) -> list[str]:
    lines = [
        "| workload | onwatch | peers | onwatch's ratio | durability |",
        "|---|---|---|---|---|",
    ]
    for row in rows:
        figures = summary.get(row.key, {})
        if not figures:
            continue
        onwatch = figures.get("onwatch")
        peers = [c for c in row.contestants if c != "onwatch" and c in figures]
        peer_text = "; ".join(f"{PEER_NAMES[p]} {_rate(figures[p], row)}" for p in peers) or "—"
        ratios = (
            " / ".join(f"{ratio(row, onwatch, figures[p]):.2f}×" for p in peers)
            if onwatch and peers
            else "—"
        )
        onwatch_text = _rate(onwatch, row) if onwatch else "—"
        lines.append(
            f"| {row.title} | {onwatch_text} | {peer_text} | {ratios} | {row.durability} |"
        )
    notes: dict[str, list[str]] = {}  # each note once, with the rows it is about
    for row in rows:
        if row.key in summary:
            for note in row.notes:
                notes.setdefault(note, []).append(row.title)
    if notes:
        lines.append("")
        lines += [f"- {note} ({'; '.join(titles)})." for note, titles in notes.items()]
    return lines


# Rows whose figures are compared with each other run interleaved: the same peer called
# directly and through asyncio.to_thread (or onwatch with and without loop_writes), one
# right after the other (the disk's fsync time
# drifts by a factor of two over minutes on a shared machine, which would otherwise land on
# one row and not the other).
TOGETHER = [("sqlite-enqueue", "sqlite-enqueue-thread"), ("pg-enqueue", "pg-enqueue-loop")]


def schedule(rows: list[Row], n: int) -> list[tuple[Row, str]]:
    """Round n's measurements in order: each row's contestants in an order rotated by n;
    rows run together (TOGETHER) take turns per contestant, which of them first by n too."""
    by_key = {row.key: row for row in rows}
    grouped = {key for group in TOGETHER for key in group}
    out: list[tuple[Row, str]] = []
    for row in rows:
        group = [key for key in next((g for g in TOGETHER if row.key in g), ()) if key in by_key]
        if row.key in grouped and row.key != group[0]:
            continue  # run with its group's first row (of those asked for)
        members = [by_key[key] for key in group or [row.key]]
        members = members[n % len(members) :] + members[: n % len(members)]
        names = list(dict.fromkeys(c for member in members for c in member.contestants))
        for who in names[n % len(names) :] + names[: n % len(names)]:
            out += [(member, who) for member in members if who in member.contestants]
    return out


def durable_server(owned: Any) -> None:
    """Restart the tests' throwaway server (tests/pg/server.py) with fsync on: the tests run
    it with fsync off, set on its command line, which ALTER SYSTEM cannot override. Its
    other options stay (full_page_writes off and wal_level minimal change what a crash
    can tear, not what a commit waits for)."""
    opts = shlex.split((owned.data / "postmaster.opts").read_text())[1:]
    if "-D" in opts:
        at = opts.index("-D")
        del opts[at : at + 2]
    opts = ["fsync=on" if opt == "fsync=off" else opt for opt in opts]
    owned.pg_ctl("-w", "-t", "60", "-o", " ".join(shlex.quote(opt) for opt in opts), "restart")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "child":
        return child(argv[1:])
    if argv and argv[0] == "profile":
        return profile(argv[1:])
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, one round: a smoke run")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--contestants", default=",".join(CONTESTANTS))
    parser.add_argument(
        "--rows", default=",".join(r.key for r in ROWS), help="row keys, comma-separated"
    )
    parser.add_argument("--peers-python", help="an interpreter with the peers installed")
    parser.add_argument("--json", type=Path, help="also write the table here as JSON")
    args = parser.parse_args(argv)
    contestants = [c for c in args.contestants.split(",") if c]
    unknown = set(contestants) - set(CONTESTANTS)
    if unknown:
        parser.error(f"unknown contestants {sorted(unknown)}; known: {', '.join(CONTESTANTS)}")
    wanted_rows = [k for k in args.rows.split(",") if k]
    unknown = set(wanted_rows) - {r.key for r in ROWS}
    if unknown:
        parser.error(f"unknown rows {sorted(unknown)}; known: {', '.join(r.key for r in ROWS)}")
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    rows = [
        Row(
            r.key,
            r.title,
            r.backend,
            r.kind,
            [c for c in r.contestants if c in contestants],
            r.durability,
            r.notes,
        )
        for r in ROWS
        if r.key in wanted_rows
    ]
    rows = [r for r in rows if r.contestants]
    rounds, sizes = (1, QUICK_SIZES) if args.quick else (args.rounds, SIZES)
    peers = peers_python(args.peers_python) if set(contestants) - {"onwatch"} else ""
    pg = None
    if any(r.backend == "postgresql" for r in rows):
        from tests.pg.server import cluster

        pg = cluster()
        if pg.owned is not None:
            durable_server(pg.owned)
        with pg.admin() as conn:
            fsync = conn.execute("SHOW fsync").fetchone()[0]
            synchronous = conn.execute("SHOW synchronous_commit").fetchone()[0]
        pg_durability = f"one server, fsync={fsync}, synchronous_commit={synchronous}"
        rows = [
            replace(row, durability=pg_durability) if row.backend == "postgresql" else row
            for row in rows
        ]
    load_before = os.getloadavg()
    load = " ".join(f"{value:.2f}" for value in load_before)
    print(
        f"peers: {len(rows)} rows, {rounds} round(s), contestants alternated; "
        f"{os.cpu_count()} cores, load {load} (1/5/15 min) before",
        flush=True,
    )
    results: dict[str, dict[str, list[dict[str, Any]]]] = {
        r.key: {c: [] for c in r.contestants} for r in rows
    }
    folder = Path(tempfile.mkdtemp(prefix="onwatch-bench-peers-"))
    bench = Bench(peers, folder, pg)
    steal = 0.0  # CPU seconds the hypervisor took during the measurements (stolen)
    try:
        for n in range(rounds):
            for row, who in schedule(rows, n):
                taken = stolen()
                figures = bench.measure(row, who, sizes[row.key], seed=n)
                figures["steal_s"] = stolen() - taken
                steal += figures["steal_s"]
                results[row.key][who].append(figures)
                shown = {k: round(v, 2) for k, v in figures.items() if k != "waits"}
                print(f"round {n + 1} {row.key:22} {who:17} {json.dumps(shown)}", flush=True)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    load_after = os.getloadavg()
    summary = {r.key: {c: summarize(r, results[r.key][c]) for c in r.contestants} for r in rows}
    print()
    for line in table(rows, summary):
        print(line)
    print(
        f"\nload {load_after[0]:.2f} {load_after[1]:.2f} {load_after[2]:.2f} (1/5/15 min) after; "
        f"{steal:.1f} CPU s stolen by the hypervisor during the measurements (each round's "
        f"line says its own); "
        f"peers: {', '.join(PEER_PACKAGES)}"
    )
    if args.json:
        document = {
            "rounds": rounds,
            "quick": args.quick,
            "cores": os.cpu_count(),
            "load_before": load_before,
            "load_after": load_after,
            "steal_s": steal,
            "peers": PEER_PACKAGES,
            "rows": [
                {
                    "key": r.key,
                    "workload": r.title,
                    "backend": r.backend,
                    "unit": "ms" if r.kind == "wake" else "jobs/s",
                    "jobs": sizes[r.key],
                    "durability": r.durability,
                    "notes": r.notes,
                    "contestants": summary[r.key],
                    "per_round": {
                        c: [{k: v for k, v in f.items() if k != "waits"} for f in results[r.key][c]]
                        for c in r.contestants
                    },
                    "ratios": {
                        c: ratio(r, summary[r.key]["onwatch"], summary[r.key][c])
                        for c in r.contestants
                        if c != "onwatch" and "onwatch" in summary[r.key]
                    },
                }
                for r in rows
            ],
        }
        args.json.write_text(json.dumps(document, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
