"""The queues onwatch is compared with, driven the way tests/bench/bench_peers.py drives onwatch.
Runs in the peers' own environment (tests/bench/peers_env.py), never in onwatch's:

    PEERS_PYTHON peer_queues.py enqueue PEER TARGET JOBS MODE     MODE: direct, thread, batch
    PEERS_PYTHON peer_queues.py drain   PEER TARGET JOBS BATCHING BATCHING: one, default
    PEERS_PYTHON peer_queues.py listen  PEER TARGET LEDGER
    PEERS_PYTHON peer_queues.py produce PEER TARGET SAMPLES LEDGER SEED

PEER is huey, persist-queue, litequeue-full, litequeue-normal (SQLite: TARGET is a folder of
its own) or pgqueuer, procrastinate (PostgreSQL: TARGET is an empty database's URL; no wake
here, that is the fleet's benchmark); for listen, huey-10ms too. `enqueue` and `drain` print
one JSON line: the jobs, the seconds the measured part took, and the CPU seconds of this
process over it (every thread). `enqueue` puts JOBS jobs one at a time (`direct`: the
synchronous call; `thread`: each call through asyncio.to_thread, as an asyncio program calls
a synchronous library) or in calls of 100 (`batch`). `drain` fills the queue with JOBS jobs
(not measured), then times a worker that runs them all, its handler doing nothing. `listen`
serves the queue, writing "key time" when the handler is called (after printing "ready");
`produce` enqueues SAMPLES jobs 60–120 ms apart, writing "key time" once each enqueue
returned (committed). For pgqueuer, `enqueue` also prints the CPU seconds of the server's
backend serving it over the measured part ("server"; null where the server runs elsewhere).
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import resource
import sys
import threading
import time
from typing import Any

BATCH = 100
POLL = 0.01  # the pollers' nap when the queue is empty, for the wake


def cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def backend_cpu(pid: int) -> float | None:
    """CPU seconds of the server's backend `pid` so far; None where it is not on this
    machine (or not readable)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            text = stat.read()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2 :].split()
    return (float(fields[11]) + float(fields[12])) / os.sysconf("SC_CLK_TCK")


def report(jobs: int, seconds: float, cpu_seconds: float, **more: Any) -> None:
    print(json.dumps({"jobs": jobs, "seconds": seconds, "cpu": cpu_seconds, **more}), flush=True)


class Timed:
    """Wall and CPU time of a `with` block."""

    def __enter__(self) -> Timed:
        self.wall, self.cpu = time.perf_counter(), cpu()
        return self

    def __exit__(self, *exc: object) -> None:
        self.wall, self.cpu = time.perf_counter() - self.wall, cpu() - self.cpu


# --- SQLite peers ------------------------------------------------------------------------------


def huey_app(folder: str, record: Any = None, done: Any = None):
    from huey import SqliteHuey

    # fsync=True: synchronous=FULL (WAL), onwatch's setting.
    huey = SqliteHuey("bench", filename=os.path.join(folder, "huey.db"), fsync=True)

    @huey.task(name="job")
    def job(key: str) -> None:
        if record is not None:
            record(key)
        if done is not None:
            done()

    return huey, job


def persist_queue(folder: str):
    from persistqueue import SQLiteAckQueue

    # Its connections keep SQLite's default, synchronous=FULL, in WAL.
    return SQLiteAckQueue(os.path.join(folder, "pq"), multithreading=True)


def litequeue(folder: str, synchronous: str):
    from litequeue import LiteQueue

    queue = LiteQueue(os.path.join(folder, "lq.db"))
    # LiteQueue sets NORMAL (a commit is not fsynced: the last ones are lost on a power cut).
    queue.conn.execute(f"PRAGMA synchronous = {synchronous}")
    return queue


def sqlite_putter(peer: str, folder: str):
    """(put one job, put a list of jobs or None, close) for a SQLite peer."""
    if peer == "huey":
        _, job = huey_app(folder)
        return (lambda key: job(key)), None, (lambda: None)
    if peer == "persist-queue":
        queue = persist_queue(folder)
        return queue.put, None, queue.close  # SQLiteAckQueue has no batch put
    if peer.startswith("litequeue"):
        lq = litequeue(folder, "FULL" if peer == "litequeue-full" else "NORMAL")

        def put_many(keys: list[str]) -> None:
            with lq.transaction(mode="IMMEDIATE"):  # its own API for several puts in one commit
                for key in keys:
                    lq.put(json.dumps({"key": key}))

        return (lambda key: lq.put(json.dumps({"key": key}))), put_many, lq.close
    raise SystemExit(f"unknown SQLite peer {peer}")


def sqlite_enqueue(peer: str, folder: str, jobs: int, mode: str) -> None:
    put, put_many, close = sqlite_putter(peer, folder)
    keys = [f"e{k}" for k in range(jobs)]
    if mode == "batch":
        if put_many is None:
            raise SystemExit(f"{peer} has no batch put")
        with Timed() as t:
            for start in range(0, jobs, BATCH):
                put_many(keys[start : start + BATCH])
    elif mode == "thread":

        async def main() -> None:
            for key in keys:
                await asyncio.to_thread(put, key)

        with Timed() as t:
            asyncio.run(main())
    else:
        with Timed() as t:
            for key in keys:
                put(key)
    close()
    report(jobs, t.wall, t.cpu)


def sqlite_drain(peer: str, folder: str, jobs: int) -> None:
    keys = [f"e{k}" for k in range(jobs)]
    if peer == "huey":
        finished = threading.Event()
        count = 0

        def done() -> None:
            nonlocal count
            count += 1
            if count >= jobs:
                finished.set()

        huey, job = huey_app(folder, done=done)
        for key in keys:
            job(key)
        consumer = huey.create_consumer(workers=1, periodic=False)
        with Timed() as t:
            consumer.start()
            finished.wait()
        consumer.stop(graceful=True)
        report(jobs, t.wall, t.cpu)
        return
    if peer == "persist-queue":
        queue = persist_queue(folder)
        for key in keys:
            queue.put(key)
        with Timed() as t:
            for _ in range(jobs):
                item = queue.get(block=False, raw=True)
                queue.ack(id=item["pqid"])
        queue.close()
        report(jobs, t.wall, t.cpu)
        return
    if peer.startswith("litequeue"):
        lq = litequeue(folder, "FULL" if peer == "litequeue-full" else "NORMAL")
        with lq.transaction():
            for key in keys:
                lq.put(key)
        with Timed() as t:
            for _ in range(jobs):
                message = lq.pop()
                lq.done(message.message_id)
        lq.close()
        report(jobs, t.wall, t.cpu)
        return
    raise SystemExit(f"unknown SQLite peer {peer}")


def sqlite_listen(peer: str, folder: str, ledger: str) -> None:
    out = open(ledger, "a", buffering=1)

    def record(key: str) -> None:
        out.write(f"{key} {time.time()!r}\n")

    if peer.startswith("huey"):
        huey, _ = huey_app(folder, record=record)
        options = {} if peer == "huey" else {"initial_delay": POLL, "backoff": 1, "max_delay": POLL}
        consumer = huey.create_consumer(workers=1, periodic=False, **options)
        print("ready", flush=True)
        consumer.run()  # until SIGINT / SIGTERM
        return
    if peer == "persist-queue":
        queue = persist_queue(folder)

        def take() -> bool:
            from persistqueue import Empty

            try:
                item = queue.get(block=False, raw=True)
            except Empty:
                return False
            record(str(item["data"]))  # the handler runs, then the job is acknowledged
            queue.ack(id=item["pqid"])
            return True

    elif peer.startswith("litequeue"):
        lq = litequeue(folder, "FULL" if peer == "litequeue-full" else "NORMAL")

        def take() -> bool:
            message = lq.pop()
            if message is None:
                return False
            record(str(json.loads(message.data)["key"]))
            lq.done(message.message_id)
            return True

    else:
        raise SystemExit(f"unknown SQLite peer {peer}")
    print("ready", flush=True)
    while True:  # until SIGTERM
        if not take():
            time.sleep(POLL)


def sqlite_produce(peer: str, folder: str, samples: int, ledger: str, seed: int) -> None:
    put, _, close = sqlite_putter("huey" if peer.startswith("huey") else peer, folder)
    rng = random.Random(seed)
    with open(ledger, "a", buffering=1) as out:
        for k in range(samples):
            time.sleep(rng.uniform(0.06, 0.12))
            put(f"w{k}")
            out.write(f"w{k} {time.time()!r}\n")
    close()


# --- PostgreSQL peers ---------------------------------------------------------------------------


async def pgqueuer_queries(url: str):
    import asyncpg
    from pgqueuer import AsyncpgDriver, Queries

    conn = await asyncpg.connect(url)
    return conn, Queries(AsyncpgDriver(conn))


def procrastinate_app(url: str, record: Any = None, done: Any = None):
    import procrastinate

    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=url))

    @app.task(name="job", queue="bench")
    async def job(key: str | None = None) -> None:
        if record is not None:
            record(key)
        if done is not None:
            done()

    return app, job


async def pg_enqueue(peer: str, url: str, jobs: int, mode: str) -> None:
    keys = [f"e{k}" for k in range(jobs)]
    more: dict[str, Any] = {}
    if peer == "pgqueuer":
        conn, queries = await pgqueuer_queries(url)
        await queries.install()
        pid = conn.get_server_pid()
        server = backend_cpu(pid)
        with Timed() as t:
            if mode == "batch":
                for start in range(0, jobs, BATCH):
                    chunk = keys[start : start + BATCH]
                    await queries.enqueue(
                        ["bench"] * len(chunk), [key.encode() for key in chunk], [0] * len(chunk)
                    )
            else:
                for key in keys:
                    await queries.enqueue("bench", key.encode())
        after = backend_cpu(pid)
        await conn.close()
        more["server"] = None if server is None or after is None else after - server
    elif peer == "procrastinate":
        app, job = procrastinate_app(url)
        async with app.open_async():
            await app.schema_manager.apply_schema_async()
            with Timed() as t:
                if mode == "batch":
                    for start in range(0, jobs, BATCH):
                        chunk = keys[start : start + BATCH]
                        await job.batch_defer_async(*({"key": key} for key in chunk))
                else:
                    for key in keys:
                        await job.defer_async(key=key)
    else:
        raise SystemExit(f"unknown PostgreSQL peer {peer}")
    report(jobs, t.wall, t.cpu, **more)


async def pg_drain(peer: str, url: str, jobs: int, batching: str) -> None:
    keys = [f"e{k}" for k in range(jobs)]
    if peer == "pgqueuer":
        from pgqueuer import QueueManager

        conn, queries = await pgqueuer_queries(url)
        await queries.install()
        for start in range(0, jobs, 1000):
            chunk = keys[start : start + 1000]
            await queries.enqueue(
                ["bench"] * len(chunk), [key.encode() for key in chunk], [0] * len(chunk)
            )
        manager = QueueManager(queries)
        count = 0

        @manager.entrypoint("bench")
        async def handler(job: Any) -> None:
            nonlocal count
            count += 1
            if count >= jobs:
                manager.shutdown.set()

        options = {"batch_size": 1} if batching == "one" else {}
        with Timed() as t:
            await manager.run(**options)
        await conn.close()
    elif peer == "procrastinate":
        app, job = procrastinate_app(url)
        async with app.open_async():
            await app.schema_manager.apply_schema_async()
            for start in range(0, jobs, 1000):
                await job.batch_defer_async(*({"key": key} for key in keys[start : start + 1000]))
            with Timed() as t:
                # wait=False: it stops once the queue is empty (every job ran).
                await app.run_worker_async(concurrency=1, wait=False, queues=["bench"])
    else:
        raise SystemExit(f"unknown PostgreSQL peer {peer}")
    report(jobs, t.wall, t.cpu)


PG = {"pgqueuer", "procrastinate"}


def main(argv: list[str]) -> int:
    command, peer, target, *rest = argv
    if command == "enqueue":
        if peer in PG:
            asyncio.run(pg_enqueue(peer, target, int(rest[0]), rest[1]))
        else:
            sqlite_enqueue(peer, target, int(rest[0]), rest[1])
    elif command == "drain":
        if peer in PG:
            asyncio.run(pg_drain(peer, target, int(rest[0]), rest[1]))
        else:
            sqlite_drain(peer, target, int(rest[0]))
    elif command == "listen" and peer not in PG:
        sqlite_listen(peer, target, rest[0])
    elif command == "produce" and peer not in PG:
        sqlite_produce(peer, target, int(rest[0]), rest[1], int(rest[2]))
    else:
        raise SystemExit(f"unknown command {command}")
    sys.stdout.flush()
    # huey's consumer threads and the drivers' pools: nothing is left to do, so end now.
    os._exit(0)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
