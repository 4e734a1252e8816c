"""The job queues onwatch's fleet is compared with (pgqueuer, procrastinate), driven the way
tests/bench/bench_queues.py drives the fleet. Runs in the benchmark's own environment, where
those libraries are installed (never in onwatch's):

    PEERS_PYTHON queue_peers.py fill    KIND URL QUEUES JOBS
    PEERS_PYTHON queue_peers.py work    KIND URL QUEUES JOBS CONCURRENCY [BATCH]
    PEERS_PYTHON queue_peers.py produce KIND URL SAMPLES LEDGER
    PEERS_PYTHON queue_peers.py listen  KIND URL LEDGER

KIND is pgqueuer or procrastinate. `fill` installs the library's schema and enqueues JOBS
jobs spread over QUEUES queues ("q000", …); `work` runs one worker over every queue at
CONCURRENCY jobs at once until JOBS jobs ran (each job waits 50 ms), then exits (pgqueuer:
BATCH jobs a dequeue and completions written BATCH at a time, by default up to 10). `produce`
and `listen` measure a wake: `listen` serves the queue "wake" and writes "key time" when a
job's handler is called; `produce` enqueues SAMPLES jobs 60–120 ms apart, writing "key time"
once each enqueue has returned (committed).
"""

from __future__ import annotations

import asyncio
import random
import sys
import time

HANDLER_SECONDS = 0.05


def _ledger(path: str):
    return open(path, "a", buffering=1)


# --- pgqueuer --------------------------------------------------------------------------------


async def _pgqueuer(url: str):
    import asyncpg
    from pgqueuer import AsyncpgDriver, Queries

    conn = await asyncpg.connect(url)
    return conn, AsyncpgDriver(conn), Queries


async def pgqueuer_fill(url: str, queues: int, jobs: int) -> None:
    conn, driver, Queries = await _pgqueuer(url)
    queries = Queries(driver)
    await queries.install()
    names = [f"q{i % queues:03d}" for i in range(jobs)]
    for start in range(0, jobs, 1000):
        chunk = names[start : start + 1000]
        await queries.enqueue(chunk, [None] * len(chunk), [0] * len(chunk))
    await conn.close()


async def pgqueuer_work(
    url: str, queues: int, jobs: int, concurrency: int, batch: int | None = None
) -> None:
    """pgqueuer's worker; `batch` None: its batches as a team would set them for this
    concurrency (up to 10 jobs a dequeue, their completions buffered and written 10 at a
    time); 1: each job dequeued alone and its completion written as soon as it ends."""
    from pgqueuer import QueueManager

    conn, driver, Queries = await _pgqueuer(url)
    manager = QueueManager(Queries(driver))
    done = 0

    async def handler(job) -> None:
        nonlocal done
        await asyncio.sleep(HANDLER_SECONDS)
        done += 1
        if done >= jobs:
            manager.shutdown.set()

    for q in range(queues):
        manager.entrypoint(f"q{q:03d}")(handler)
    if batch is None:
        batch = max(1, min(10, concurrency // 2))
    await manager.run(batch_size=batch, max_concurrent_tasks=concurrency)
    await conn.close()


async def pgqueuer_listen(url: str, ledger: str) -> None:
    from pgqueuer import QueueManager

    conn, driver, Queries = await _pgqueuer(url)
    await Queries(driver).install()
    manager = QueueManager(Queries(driver))
    out = _ledger(ledger)

    @manager.entrypoint("wake")
    async def handler(job) -> None:
        out.write(f"{job.payload.decode()} {time.time()}\n")

    print("ready", flush=True)
    await manager.run(batch_size=1)


async def pgqueuer_produce(url: str, samples: int, ledger: str) -> None:
    conn, driver, Queries = await _pgqueuer(url)
    queries = Queries(driver)
    out = _ledger(ledger)
    for k in range(samples):
        await asyncio.sleep(random.uniform(0.06, 0.12))
        await queries.enqueue("wake", f"w{k}".encode())
        out.write(f"w{k} {time.time()}\n")
    await conn.close()


# --- procrastinate ---------------------------------------------------------------------------


def _procrastinate_app(url: str, queues: int, record=None):
    import procrastinate

    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=url))
    tasks = {}
    for q in range(queues):
        name = f"q{q:03d}"

        async def job(key: str | None = None) -> None:
            if record is not None:
                record(key)
            else:
                await asyncio.sleep(HANDLER_SECONDS)

        tasks[name] = app.task(name=name, queue=name)(job)
    return app, tasks


async def procrastinate_fill(url: str, queues: int, jobs: int) -> None:
    app, tasks = _procrastinate_app(url, queues)
    async with app.open_async():
        await app.schema_manager.apply_schema_async()
        per = [jobs // queues + (1 if q < jobs % queues else 0) for q in range(queues)]
        for q, count in enumerate(per):
            if count:
                await tasks[f"q{q:03d}"].batch_defer_async(*({} for _ in range(count)))


async def procrastinate_work(url: str, queues: int, jobs: int, concurrency: int) -> None:
    app, _ = _procrastinate_app(url, queues)
    async with app.open_async():
        # wait=False: it stops once every queue is empty (all JOBS ran).
        await app.run_worker_async(concurrency=concurrency, wait=False)


async def procrastinate_listen(url: str, ledger: str) -> None:
    out = _ledger(ledger)

    def record(key: str | None) -> None:
        out.write(f"{key} {time.time()}\n")

    app, _ = _procrastinate_app(url, 0)

    @app.task(name="wake", queue="wake")
    async def wake(key: str | None = None) -> None:
        record(key)

    async with app.open_async():
        await app.schema_manager.apply_schema_async()
        print("ready", flush=True)
        await app.run_worker_async(concurrency=1, queues=["wake"])


async def procrastinate_produce(url: str, samples: int, ledger: str) -> None:
    import procrastinate

    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=url))
    wake = app.task(name="wake", queue="wake")(lambda key=None: None)
    out = _ledger(ledger)
    async with app.open_async():
        for k in range(samples):
            await asyncio.sleep(random.uniform(0.06, 0.12))
            await wake.defer_async(key=f"w{k}")
            out.write(f"w{k} {time.time()}\n")


def main(argv: list[str]) -> int:
    command, kind, url, *rest = argv
    calls = {
        ("fill", "pgqueuer"): lambda: pgqueuer_fill(url, int(rest[0]), int(rest[1])),
        ("work", "pgqueuer"): lambda: pgqueuer_work(
            url, int(rest[0]), int(rest[1]), int(rest[2]), int(rest[3]) if rest[3:] else None
        ),
        ("listen", "pgqueuer"): lambda: pgqueuer_listen(url, rest[0]),
        ("produce", "pgqueuer"): lambda: pgqueuer_produce(url, int(rest[0]), rest[1]),
        ("fill", "procrastinate"): lambda: procrastinate_fill(url, int(rest[0]), int(rest[1])),
        ("work", "procrastinate"): lambda: procrastinate_work(
            url, int(rest[0]), int(rest[1]), int(rest[2])
        ),
        ("listen", "procrastinate"): lambda: procrastinate_listen(url, rest[0]),
        ("produce", "procrastinate"): lambda: procrastinate_produce(url, int(rest[0]), rest[1]),
    }
    asyncio.run(calls[(command, kind)]())
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
