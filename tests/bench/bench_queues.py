#!/usr/bin/env python3
"""onwatch's fleet worker against the PostgreSQL job queues a team would pick instead
(pgqueuer, procrastinate), on one server, in one run, contestants taking turns.

    python3 tests/bench/bench_queues.py                   3 rounds (about 7 minutes)
    python3 tests/bench/bench_queues.py --rounds 1
    python3 tests/bench/bench_queues.py --quick           a smoke run, figures meaningless
    python3 tests/bench/bench_queues.py --contestants onwatch      onwatch alone
    python3 tests/bench/bench_queues.py --statements 12   and each run's 12 costliest statements
    python3 tests/bench/bench_queues.py --concurrency 100 100 jobs at once (default 25)

**The peers are never onwatch's dependencies.** On first use the script makes the
benchmarks' own virtual environment, `$XDG_CACHE_HOME/onwatch-bench/peers` (`~/.cache/…`
without it; tests/bench/peers_env.py, shared with tests/bench/bench_peers.py), and installs
into it with pip: pgqueuer, procrastinate, and their drivers (asyncpg, psycopg), among the
other peers. Their side runs as processes of that environment's Python
(tests/bench/queue_peers.py). Delete the folder to start over; `--peers-python` names
another interpreter that has them.

**The workload** (each contestant, each round, a fresh database): QUEUES queues — an inbox
each for onwatch, a queue (entrypoint / task) each for the peers — holding JOBS jobs in all,
spread evenly; the handler waits 50 ms (a model call, an HTTP request); one worker process
runs CONCURRENCY jobs at once, 25 unless `--concurrency` says (onwatch: `--concurrency`,
one event per run, max_batch 1; pgqueuer: max_concurrent_tasks; procrastinate:
concurrency). pgqueuer runs twice: `pgqueuer` with batches as a team would set them for this
concurrency (up to 10 jobs a dequeue, their completions kept in memory and written 10 at a
time, so a crash may run finished jobs again), and `pgqueuer-1` with batch_size 1: each job
dequeued alone, its completion written as soon as it ends, as onwatch claims one event and
commits each run's finish. Measured from the worker's start until every job is done:

- jobs/s;
- CPU seconds per 1,000 jobs: the worker process (start-up included) and the server (every
  backend of the database server, from /proc);
- the worker's context switches per job, over all its threads (getrusage of the finished
  child): in each round's line `switches` where a thread waited (for the server, a queue,
  Python's lock) and `preempted` where the kernel took its CPU; the table shows their sum;
- per job, from the server's own counters: statements (pg_stat_statements, loaded into the
  throwaway server this script starts), commits (pg_stat_database.xact_commit) and WAL
  records (pg_stat_wal); the script's own progress polls are subtracted;
- with `--statements N`, after each run: its N statements with the most server time
  (pg_stat_statements: calls and microseconds of execution per job, microseconds a call;
  `nested` for those a trigger or a foreign key ran). Execution time is the server's wall
  clock, so it holds waits for locks and for a CPU too, not only work;
- the CPU seconds the hypervisor gave this virtual machine's CPUs to other machines during
  the run (/proc/stat's steal; a round with many ran on a slower machine), and the load
  average before and after, printed with the table.

**A wake** (each contestant but `pgqueuer-1`, whose wake is pgqueuer's, each round): one
queue, its worker idle; another process enqueues a job every 60–120 ms and notes the time
each enqueue returned (committed); the handler notes when it is called. p50 / p99 of the
difference.

The server is a throwaway cluster of tests/pg/server.py (fsync off, as for the tests),
restarted once with pg_stat_statements loaded; ONWATCH_TEST_DATABASE_URL names another
(then no server CPU, and statements only if it has pg_stat_statements). The contestants
take turns in an order rotated each round, and each figure is the median over rounds.
Before each throughput run the server settles (`settle`: the filled tables vacuumed and
analysed, a CHECKPOINT, no autovacuum worker left running), so that no contestant is
charged the server's clean-up after the one before it; each run's database is dropped
once it is measured.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import resource
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import psycopg  # noqa: E402

from tests.bench.bench_fleet_worker import _postgres_cpu  # noqa: E402
from tests.bench.bench_peers import stolen  # noqa: E402
from tests.bench.peers_env import peers_python  # noqa: E402

CONTESTANTS = ("onwatch", "pgqueuer", "pgqueuer-1", "procrastinate")
# A contestant that is another's library set otherwise: its name there, and its extra
# arguments to PEERS_SCRIPT's `work`. Its wake would be that other's (pgqueuer's listener
# takes one job at a time already): not run again.
VARIANTS = {"pgqueuer-1": ("pgqueuer", ["1"])}
PEERS_SCRIPT = ROOT / "tests" / "bench" / "queue_peers.py"
LEDGER_ENV = "ONWATCH_BENCH_LEDGER"


# --- onwatch's side (also run as processes of this script) --------------------------------


async def stamp(batch, ctx) -> None:
    """The wake run's agent: "key time" for each event, the moment it is called."""
    with open(os.environ[LEDGER_ENV], "a") as out:
        for event in batch:
            out.write(f"{event.source_id} {time.time()}\n")


async def onwatch_fill(url: str, queues: int, jobs: int) -> None:
    from onwatch.core import Inbox

    for q in range(queues):
        box = await Inbox.open(url, name=f"q{q:03d}")
        await box.configure(max_batch=1)  # one job, one run: the peers' unit
        count = jobs // queues + (1 if q < jobs % queues else 0)
        await box.ingest_batch([("bench", f"{q}/{k}", None) for k in range(count)])
        await box.close()


async def onwatch_produce(url: str, samples: int, ledger: str) -> None:
    from onwatch.core import Inbox

    box = await Inbox.open(url, name="wake")
    with open(ledger, "a", buffering=1) as out:
        for k in range(samples):
            await asyncio.sleep(random.uniform(0.06, 0.12))
            await box.ingest("bench", f"w{k}")
            out.write(f"w{k} {time.time()}\n")
    await box.close()


# --- measuring ---------------------------------------------------------------------------------


class Server:
    def __init__(self) -> None:
        base = os.environ.get("ONWATCH_TEST_DATABASE_URL")
        from tests.pg.server import cluster

        self.cluster = cluster()
        self.data = None if base else self.cluster.owned.data
        if self.cluster.owned is not None:
            with self.cluster.admin() as conn:
                conn.execute("ALTER SYSTEM SET shared_preload_libraries = 'pg_stat_statements'")
                conn.execute("ALTER SYSTEM SET pg_stat_statements.track = 'all'")
            self.cluster.pg_ctl("-w", "-t", "60", "restart")
        # The statistics are the server's; the view lives in the `postgres` database (a
        # contestant's database holds only its own tables: onwatch refuses others').
        self.admin = self.cluster.url("postgres")
        with psycopg.connect(self.admin, autocommit=True) as conn:
            try:
                conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
            except psycopg.Error:
                pass  # not loaded on a server of ONWATCH_TEST_DATABASE_URL: no statements

    def database(self) -> str:
        return self.cluster.new_database(schema=False)

    def drop(self, url: str) -> None:
        """Drop a run's database once measured (its sessions ended, this process's pooled
        ones too): nothing of it is left for autovacuum to clean up while a later
        contestant is measured."""
        self.cluster.drop_database(url)


# One pg_stat_statements entry: (calls, milliseconds of execution, the statement's text).
Entry = tuple[int, float, str]
Times = dict[tuple[int, bool], Entry]  # by (queryid, toplevel)


def statement_times(conn: psycopg.Connection, database: str) -> Times | None:
    """pg_stat_statements' entries for `database`, by (queryid, toplevel), summed over
    roles, read on `conn` (autocommit); None where the view cannot be read (not loaded on a
    server of ONWATCH_TEST_DATABASE_URL)."""
    try:
        rows = conn.execute(
            "SELECT s.queryid, s.toplevel, s.calls, s.total_exec_time, s.query "
            "FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid "
            "WHERE d.datname = %s AND s.query NOT LIKE '%%onwatch-bench%%'",
            (database,),
        ).fetchall()
    except psycopg.Error:
        return None
    entries: Times = {}
    for queryid, toplevel, calls, ms, query in rows:
        was_calls, was_ms, _ = entries.get((queryid, toplevel), (0, 0.0, ""))
        entries[queryid, toplevel] = (was_calls + calls, was_ms + ms, query)
    return entries


def counters(admin: str, url: str) -> tuple[dict[str, float], Times | None]:
    """The server's counters for the database of `url`, read from the `admin` database, and
    the statement_times they count the statements from (None where unreadable)."""
    database = psycopg.conninfo.conninfo_to_dict(url)["dbname"]
    with psycopg.connect(admin, autocommit=True) as conn:
        commits = conn.execute(
            "SELECT xact_commit FROM pg_stat_database WHERE datname = %s", (database,)
        ).fetchone()[0]
        wal = conn.execute("SELECT wal_records FROM pg_stat_wal").fetchone()[0]
        times = statement_times(conn, database)
    statements = float("nan") if times is None else float(sum(c for c, _, _ in times.values()))
    return {"commits": commits, "wal": wal, "statements": statements}, times


def busiest(before: Times, after: Times, jobs: int, n: int) -> list[str]:
    """The `n` statements with the most execution time between two readings of
    statement_times, a line each, per job (a statement prepared with PREPARE is shown by
    that text: the server counts its EXECUTEs there)."""
    spent = []
    for key, (calls, ms, query) in after.items():
        was_calls, was_ms, _ = before.get(key, (0, 0.0, ""))
        if calls > was_calls:
            spent.append((ms - was_ms, calls - was_calls, key[1], " ".join(query.split())))
    spent.sort(reverse=True)
    return [
        f"  {calls / jobs:6.2f} a job {ms * 1000 / jobs:8.1f} µs a job {ms * 1000 / calls:9.1f} "
        f"µs a call  {'top   ' if toplevel else 'nested'}  {query[:100]}"
        for ms, calls, toplevel, query in spent[:n]
    ]


DONE = {
    "onwatch": "SELECT coalesce(sum(n), 0) FROM event_counts WHERE status = 'done'",
    "pgqueuer": "SELECT %(total)s - count(*) FROM pgqueuer",
    "procrastinate": "SELECT count(*) FROM procrastinate_jobs WHERE status = 'succeeded'",
}


def settle(url: str, admin: str) -> None:
    """Start each run from the same server state: the fill's tables vacuumed and analysed
    (what autovacuum would do at some moment of the run, with plans changing then), the
    dirty pages written (CHECKPOINT), and no autovacuum worker still cleaning up after an
    earlier contestant (its CPU would be counted as this one's). A server that refuses
    CHECKPOINT (not a superuser's, with ONWATCH_TEST_DATABASE_URL) is only vacuumed."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE")
        with contextlib.suppress(psycopg.Error):
            conn.execute("CHECKPOINT")
    with psycopg.connect(admin, autocommit=True) as conn:
        for _ in range(300):  # 30 s at most
            busy = conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'autovacuum worker'"
            ).fetchone()[0]
            if not busy:
                break
            time.sleep(0.1)
    time.sleep(1.0)  # let the fill's backends report their counters first


def run_throughput(
    kind: str,
    server: Server,
    peers: str,
    queues: int,
    jobs: int,
    concurrency: int,
    statements: int = 0,
) -> tuple[dict[str, float], list[str]]:
    """One contestant's run: its figures, and the lines of its `statements` costliest
    statements (busiest; none when 0, one line saying why when the server cannot tell)."""
    url, data = server.database(), server.data
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    library, extra = VARIANTS.get(kind, (kind, []))
    if kind == "onwatch":
        asyncio.run(onwatch_fill(url, queues, jobs))
        command = [
            sys.executable,
            "-m",
            "onwatch",
            "worker",
            url,
            "--all-inboxes",
            "--concurrency",
            str(concurrency),
            "--agent",
            "tests.pg.actors:io_bound",
            "--holder",
            "bench",
            "--no-dispatch",
            "--log-level",
            "warning",
        ]
    else:
        subprocess.run(
            [peers, str(PEERS_SCRIPT), "fill", library, url, str(queues), str(jobs)],
            check=True,
            env=env,
        )
        command = [
            peers,
            str(PEERS_SCRIPT),
            "work",
            library,
            url,
            str(queues),
            str(jobs),
            str(concurrency),
            *extra,
        ]
    settle(url, server.admin)
    before, times_before = counters(server.admin, url)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    pg_before = _postgres_cpu(data)
    started, taken = time.perf_counter(), stolen()
    worker = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.DEVNULL)
    polls = 0
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            deadline = time.monotonic() + 600
            while True:
                polls += 1
                # (onwatch-bench: the marker that leaves these polls out of the statements)
                done = conn.execute(
                    DONE[library] + " /* onwatch-bench */", {"total": jobs}
                ).fetchone()[0]
                if done >= jobs:
                    break
                if worker.poll() is not None and worker.returncode != 0:
                    raise RuntimeError(f"{kind}'s worker exited {worker.returncode}")
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{kind} did not finish in 10 minutes")
                time.sleep(0.1)
        elapsed, steal = time.perf_counter() - started, stolen() - taken
        pg_cpu = _postgres_cpu(data)
    finally:
        if worker.poll() is None and kind == "onwatch":
            worker.send_signal(signal.SIGTERM)
        worker.wait(timeout=120)
    after_children = resource.getrusage(resource.RUSAGE_CHILDREN)
    worker_cpu = (after_children.ru_utime + after_children.ru_stime) - (
        children.ru_utime + children.ru_stime
    )
    time.sleep(1.0)
    after, times_after = counters(server.admin, url)
    per_job = {k: (after[k] - before[k]) / jobs for k in after}
    per_job["commits"] -= polls / jobs  # the polls' own (one statement each)
    server.drop(url)
    lines: list[str] = []
    if statements:
        if times_before is None or times_after is None:
            lines = ["  (no statements: pg_stat_statements is not loaded on this server)"]
        else:
            lines = busiest(times_before, times_after, jobs, statements)
    return {
        "rate": jobs / elapsed,
        "worker_cpu": worker_cpu / jobs * 1000,
        # The kernel's context switches over all the worker's threads: each hand-off between
        # a thread and the event loop, each wait for a reply or for Python's lock, is one.
        "switches": (after_children.ru_nvcsw - children.ru_nvcsw) / jobs,
        "preempted": (after_children.ru_nivcsw - children.ru_nivcsw) / jobs,
        "server_cpu": float("nan") if pg_cpu is None else (pg_cpu - pg_before) / jobs * 1000,
        "steal_s": steal,  # CPU seconds the hypervisor gave to other machines meanwhile
        **per_job,
    }, lines


def run_wake(kind: str, url: str, peers: str, samples: int, folder: Path) -> list[float]:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    called, committed = folder / f"{kind}-called", folder / f"{kind}-committed"
    for path in (called, committed):
        path.unlink(missing_ok=True)
    if kind == "onwatch":

        async def create() -> None:
            from onwatch.core import Inbox

            await (await Inbox.open(url, name="wake")).close()

        asyncio.run(create())
        listener = subprocess.Popen(
            [sys.executable, "-m", "onwatch", "worker", url, "--inbox", "wake", "--agent",
             "tests.bench.bench_queues:stamp", "--no-dispatch", "--log-level", "warning"],
            cwd=ROOT, env=dict(env, **{LEDGER_ENV: str(called)}), stdout=subprocess.PIPE,
        )  # fmt: skip
        time.sleep(2.0)  # started and idle (it says nothing when ready)
        producer = [sys.executable, __file__, "produce", url, str(samples), str(committed)]
    else:
        listener = subprocess.Popen(
            [peers, str(PEERS_SCRIPT), "listen", kind, url, str(called)],
            cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert listener.stdout is not None
        if listener.stdout.readline().strip() != "ready":
            raise RuntimeError(f"{kind}'s listener did not start")
        time.sleep(1.0)
        producer = [peers, str(PEERS_SCRIPT), "produce", kind, url, str(samples), str(committed)]
    try:
        subprocess.run(producer, cwd=ROOT, env=env, check=True, timeout=600)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if called.exists() and len(called.read_text().splitlines()) >= samples:
                break
            time.sleep(0.1)
    finally:
        listener.send_signal(signal.SIGTERM)
        try:
            listener.wait(timeout=30)
        except subprocess.TimeoutExpired:
            listener.kill()
    times = {}
    for line in committed.read_text().splitlines():
        key, at = line.split()
        times[key] = float(at)
    waits = []
    for line in called.read_text().splitlines():
        key, at = line.split()
        if key in times:
            waits.append((float(at) - times[key]) * 1000)
    if len(waits) < samples:
        raise RuntimeError(f"{kind}: {len(waits)} of {samples} wakes seen")
    return sorted(waits)


def percentile(values: list[float], q: float) -> float:
    return values[min(len(values) - 1, int(q * len(values)))]


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "produce":  # a process of this script: the onwatch producer
        asyncio.run(onwatch_produce(argv[1], int(argv[2]), argv[3]))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--contestants", default=",".join(CONTESTANTS))
    parser.add_argument("--peers-python")
    parser.add_argument("--no-wake", action="store_true")
    parser.add_argument(
        "--concurrency",
        type=int,
        default=25,
        metavar="N",
        help="jobs each worker runs at once (default 25)",
    )
    parser.add_argument(
        "--statements",
        type=int,
        default=0,
        metavar="N",
        help="after each run, its N statements with the most server time, per job",
    )
    args = parser.parse_args(argv)
    contestants = [c for c in args.contestants.split(",") if c]
    unknown = set(contestants) - set(CONTESTANTS)
    if unknown:
        parser.error(f"unknown contestants {sorted(unknown)}; known: {', '.join(CONTESTANTS)}")
    queues, jobs, concurrency, samples, rounds = (
        (20, 200, 10, 20, 1) if args.quick else (200, 5000, args.concurrency, 200, args.rounds)
    )
    peers = peers_python(args.peers_python) if set(contestants) - {"onwatch"} else ""
    server = Server()
    load_before = os.getloadavg()
    print(
        f"queues: {queues} queues, {jobs} jobs, a {50} ms handler, concurrency {concurrency}, "
        f"{rounds} round(s), {os.cpu_count()} cores; wake: {samples} samples; load average "
        f"{load_before[0]:.1f}",
        flush=True,
    )
    results: dict[str, list[dict[str, float]]] = {c: [] for c in contestants}
    wakes: dict[str, list[float]] = {c: [] for c in contestants}
    folder = Path(os.environ.get("TMPDIR", "/tmp")) / f"onwatch-bench-{os.getpid()}"
    folder.mkdir(exist_ok=True)
    for r in range(rounds):
        order = contestants[r % len(contestants) :] + contestants[: r % len(contestants)]
        for kind in order:
            figures, busy = run_throughput(
                kind, server, peers, queues, jobs, concurrency, args.statements
            )
            results[kind].append(figures)
            shown = json.dumps({k: round(v, 3) for k, v in figures.items()})
            print(f"round {r + 1} {kind:13} {shown}", flush=True)
            if busy:
                print(f"round {r + 1} {kind:13} the costliest statements:", *busy, sep="\n")
            if not args.no_wake and kind not in VARIANTS:
                url = server.database()
                waits = run_wake(kind, url, peers, samples, folder)
                server.drop(url)
                wakes[kind] += waits
                print(f"round {r + 1} {kind:13} wake p50 {percentile(waits, 0.5):.1f} ms, "
                      f"p99 {percentile(waits, 0.99):.1f} ms", flush=True)  # fmt: skip
    print()
    header = (
        f"{'':14} {'jobs/s':>8} {'CPU s/1000 jobs: worker':>24} {'server':>7} {'total':>7}"
        f" {'switches':>9} {'statements':>11} {'commits':>8} {'WAL rec.':>9} {'wake p50':>9}"
        f" {'p99':>7}"
    )
    print(header)
    medians = {}
    for kind in contestants:
        m = {k: statistics.median(f[k] for f in results[kind]) for k in results[kind][0]}
        m["total_cpu"] = m["worker_cpu"] + m["server_cpu"]
        waits = sorted(wakes[kind])
        m["p50"], m["p99"] = (
            (percentile(waits, 0.5), percentile(waits, 0.99)) if waits else (float("nan"),) * 2
        )
        medians[kind] = m
        print(
            f"{kind:14} {m['rate']:8.0f} {m['worker_cpu']:24.2f} {m['server_cpu']:7.2f} "
            f"{m['total_cpu']:7.2f} {m['switches'] + m['preempted']:9.1f} "
            f"{m['statements']:11.2f} {m['commits']:8.2f} "
            f"{m['wal']:9.2f} {m['p50']:9.1f} {m['p99']:7.1f}"
        )
    steal = {kind: sum(f["steal_s"] for f in results[kind]) for kind in contestants}
    print(
        "CPU s stolen by the hypervisor during the throughput runs (a round with many ran on "
        "a slower machine): "
        + ", ".join(f"{kind} {seconds:.1f}" for kind, seconds in steal.items())
        + f"; load average {load_before[0]:.1f} before, {os.getloadavg()[0]:.1f} after"
    )
    if "onwatch" in medians:
        for peer in [c for c in contestants if c != "onwatch"]:
            o, p = medians["onwatch"], medians[peer]
            if peer in VARIANTS:
                wake = f"wake: {VARIANTS[peer][0]}'s"
            elif args.no_wake:
                wake = "no wake run"
            else:
                wake = f"wake p50 {o['p50'] / p['p50']:.2f}×, p99 {o['p99'] / p['p99']:.2f}×"
            print(
                f"onwatch / {peer}: throughput {o['rate'] / p['rate']:.2f}×, CPU per job "
                f"{o['total_cpu'] / p['total_cpu']:.2f}×, {wake}"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
