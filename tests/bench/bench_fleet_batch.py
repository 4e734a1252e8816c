#!/usr/bin/env python3
"""What a fleet job would cost the server if one statement finished and claimed for many
inboxes at once: a model of a design the fleet does not have, sized with the engine's own
checks, before anyone builds it.

    python3 tests/bench/bench_fleet_batch.py               2 rounds, 200 inboxes of 25 jobs
    python3 tests/bench/bench_fleet_batch.py --sizes 1,2,5 batches of 1, 2 and 5 inboxes
    python3 tests/bench/bench_fleet_batch.py --quick       a smoke run, figures meaningless

Today a fleet job ends with one message per inbox: BEGIN, the inbox's lock, the run's finish
and the next claim in one statement (`onwatch_finish_take`, core/pg/tx.py), COMMIT. pgqueuer,
the peer the fleet is compared with (tests/bench/bench_queues.py), claims and completes jobs
of many queues in one statement each. This script measures the server's CPU a job both ways
on one session, with no agent and no wait between jobs (each inbox holds one claimed run at a
time, as in the fleet):

- **engine**: every inbox's run finished and its next event claimed by `Inbox.finish_and_claim`,
  inbox after inbox, through the engine as the fleet calls it (its sessions shared, one here);
- **batch of k**: BEGIN, the k inboxes' rows locked in id order, one statement (BATCH below)
  that finishes their k runs and claims their next events, COMMIT. BATCH is the engine's plain
  finish-and-take made set-based: for each inbox, the same checks (the lease held by this
  holder and generation and not expired, the inbox not paused, its settings those the caller
  read, no claim lost by an older generation, no event out of attempts, no timer due, the
  candidates' payloads runnable, the run this generation's and open, its event still claimed)
  and the same writes (the event done, the run closed, a new run, its link, the next event
  claimed, the change count). The session runs it with a generic plan (planning it for every
  call costs more than its execution at these sizes).

Each contestant takes a fresh database (200 inboxes of 25 events, max_batch 1), the same
holder's lease on every inbox and one claimed run in each; then runs until every event is
done. Measured: the CPU of the server's backend process serving that session (from /proc,
so only where the server runs on this machine), and this process's CPU, a job; every event
done, every run closed and the counts of the events' table right are checked after each run.
Contestants take turns, in an order rotated each round; medians over rounds, min–max beside.
The server is tests/pg/server.py's (ONWATCH_TEST_DATABASE_URL names another).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import psycopg  # noqa: E402
import psycopg.sql  # noqa: E402

from tests.bench.peer_queues import backend_cpu  # noqa: E402

HOLDER = "bench"
MAX_ATTEMPTS = 3  # Settings' default: what BATCH is given for every inbox

# $1 the inboxes' ids, $2 their generations, $3 their runs, $4 each run's event, $5
# max_attempts, $6 the batch's limit (max_batch), $7 the holder, $8 the settings the caller
# read. The engine's statement checks each payload's nesting against the thread's stack; the
# model checks a fixed 500.
BATCH = """
WITH clock AS MATERIALIZED (
    SELECT floor(extract(epoch FROM clock_timestamp()))::bigint AS now),
b AS MATERIALIZED (
    SELECT * FROM unnest($1::bigint[], $2::bigint[], $3::bigint[], $4::bigint[])
                  AS b(inbox, gen, run, event)),
known AS MATERIALIZED (
    SELECT b.inbox, r.gen, r.outcome FROM b JOIN runs r ON r.inbox_id = b.inbox AND r.id = b.run),
look AS MATERIALIZED (
    SELECT b.inbox, l.* FROM b CROSS JOIN LATERAL (
     (SELECT id, payload, attempts, 1 AS tag FROM events
      WHERE inbox_id = b.inbox AND status = 'pending' AND attempts > 0 AND attempts < $5
        AND available_at <= (SELECT now FROM clock) ORDER BY id + 0 LIMIT 1)
     UNION ALL
     (SELECT id, payload, attempts, 0 FROM events
      WHERE inbox_id = b.inbox AND status = 'pending' AND attempts = 0
        AND available_at <= (SELECT now FROM clock) ORDER BY id LIMIT $6)
     UNION ALL
     (SELECT id, NULL, NULL, 2 FROM events
      WHERE inbox_id = b.inbox AND status = 'running' AND claim_gen < b.gen)
     UNION ALL
     (SELECT count(*), NULL, NULL, 3 FROM (SELECT 1 FROM events
        WHERE inbox_id = b.inbox AND status = 'pending' AND attempts > 0 AND attempts >= $5
        LIMIT 1) AS spent)
     UNION ALL
     (SELECT count(*), NULL, NULL, 20 FROM (SELECT 1 FROM timers
        WHERE inbox_id = b.inbox AND due <= (SELECT now FROM clock) AND broken IS NULL
          AND NOT paused LIMIT 1) AS due)) AS l),
candidates AS MATERIALIZED (
    SELECT inbox, id, payload, attempts FROM look WHERE tag = 1
    UNION ALL
    SELECT l.inbox, l.id, l.payload, l.attempts FROM look l
    WHERE tag = 0 AND NOT EXISTS (SELECT FROM look m WHERE m.inbox = l.inbox AND m.tag = 1)),
plain AS MATERIALIZED (
    SELECT b.inbox, b.gen, b.run, b.event,
      EXISTS (SELECT FROM inboxes i
              WHERE i.id = b.inbox AND i.lease_holder = $7 AND i.lease_gen = b.gen
                AND i.lease_until >= (SELECT now FROM clock) AND NOT i.paused
                AND i.settings IS NOT DISTINCT FROM $8)
      AND NOT EXISTS (SELECT FROM look WHERE inbox = b.inbox AND tag = 2)
      AND NOT EXISTS (SELECT FROM look WHERE inbox = b.inbox AND tag = 3 AND id > 0)
      AND NOT EXISTS (SELECT FROM look WHERE inbox = b.inbox AND tag = 20 AND id > 0)
      AND NOT EXISTS (
          SELECT FROM candidates c
          WHERE c.inbox = b.inbox AND (c.payload IS NULL OR c.payload IS NOT JSON
             OR c.attempts >= 2147483648
             OR length(c.payload) - length(translate(c.payload, '[{', '')) > 500
             OR c.payload ~ '[0-9]{255}'))
      AND EXISTS (SELECT FROM events e
         WHERE e.inbox_id = b.inbox AND e.id = b.event AND e.status = 'running'
           AND e.claim_gen = b.gen AND e.run_id = b.run
           AND EXISTS (SELECT FROM known k WHERE k.inbox = b.inbox AND k.gen = b.gen
                       AND k.outcome IS NULL)) AS yes
    FROM b),
taking AS MATERIALIZED (
    SELECT p.inbox, p.gen, array_agg(c.id ORDER BY c.id) AS ids
    FROM plain p JOIN candidates c ON c.inbox = p.inbox WHERE p.yes GROUP BY p.inbox, p.gen),
done AS (
    UPDATE events e SET status = 'done', error = NULL, updated = (SELECT now FROM clock)
    FROM plain p
    WHERE p.yes AND e.inbox_id = p.inbox AND e.id = p.event AND e.status = 'running'
      AND e.claim_gen = p.gen AND e.run_id = p.run
    RETURNING e.inbox_id, e.id, e.run_id),
closed AS (
    UPDATE runs r SET outcome = 'done', finished_at = (SELECT now FROM clock), result = NULL,
           error = NULL, traceback = NULL
    FROM done d
    WHERE r.inbox_id = d.inbox_id AND r.id = d.run_id AND r.outcome IS NULL
      AND NOT EXISTS (SELECT FROM events e WHERE e.inbox_id = r.inbox_id
                      AND e.run_id = r.id AND e.status = 'running'
                      AND e.id NOT IN (SELECT id FROM done))),
run AS (
    INSERT INTO runs(inbox_id, holder, gen, event_ids, claimed_at)
    SELECT inbox, $7, gen, '[' || array_to_string(ids, ', ') || ']', (SELECT now FROM clock)
    FROM taking RETURNING inbox_id, id),
linked AS (
    INSERT INTO run_events(inbox_id, event_id, run_id)
    SELECT t.inbox, unnest(t.ids), r.id FROM taking t JOIN run r ON r.inbox_id = t.inbox),
claimed AS (
    UPDATE events e SET status = 'running', attempts = e.attempts + 1, claim_gen = t.gen,
           claimed_at = (SELECT now FROM clock), run_id = r.id,
           updated = (SELECT now FROM clock),
           key_salt = coalesce(e.key_salt, CASE WHEN e.run_id IS NULL
                                          THEN floor(random() * 9007199254740992)::bigint
                                          END)
    FROM taking t JOIN run r ON r.inbox_id = t.inbox
    WHERE e.inbox_id = t.inbox AND e.id = ANY(t.ids)),
counted AS (
    UPDATE inboxes i SET changes = changes + 1 WHERE i.id IN (SELECT inbox_id FROM done))
SELECT b.inbox, p.yes, r.id, t.ids[1]
FROM b JOIN plain p ON p.inbox = b.inbox
LEFT JOIN taking t ON t.inbox = b.inbox LEFT JOIN run r ON r.inbox_id = b.inbox
"""
LOCK = "SELECT id FROM inboxes WHERE id = ANY($1) ORDER BY id FOR UPDATE"

Claims = dict[int, tuple[Any, int, int, int]]  # inbox id -> (Inbox, generation, run, event)


async def prepare(url: str, inboxes: int, per: int) -> tuple[Any, Claims]:
    """The contestant's database: `inboxes` inboxes of `per` events each, max_batch 1, this
    holder's lease on each (an hour long), and one claimed run in each; all the inboxes on
    one shared session."""
    from onwatch.core import Inbox
    from onwatch.core.pg.shared import Connections

    shared = Connections(url, limit=1)
    claims: Claims = {}
    for q in range(inboxes):
        box = await Inbox.open(url, name=f"q{q:03d}", connections=shared)
        await box.configure(max_batch=1, lease_ttl=3600)
        await box.ingest_batch([("bench", f"{q}/{k}", None) for k in range(per)])
        gen = await box.acquire(HOLDER, fresh=True)
        assert gen is not None
        event = (await box.claim_next(HOLDER, gen)).events[0]
        assert event.run_id is not None
        claims[q] = (box, gen, event.run_id, event.id)
    return shared, claims


def backend_of(shared: Any) -> int:
    conn = _taken(shared)
    try:
        pid: int = conn.info.backend_pid
    finally:
        shared.give(conn)
    return pid


def _taken(shared: Any) -> Any:
    """The shared session the inboxes opened (prepare left it idle)."""
    conn = shared.take(5.0)
    if conn is None:
        shared.give(None)
        raise AssertionError("the inboxes' shared session is gone")
    return conn


async def by_engine(shared: Any, claims: Claims) -> int:
    """Every run finished and the next claimed inbox by inbox, as the fleet does; the jobs."""
    jobs = 0
    while claims:
        for q, (box, gen, run, event) in list(claims.items()):
            accepted, claimed = await box.finish_and_claim(HOLDER, gen, [event], run=run)
            assert accepted and claimed is not None, f"inbox {q}: the finish was refused"
            jobs += 1
            if claimed.events:
                nxt = claimed.events[0]
                assert nxt.run_id is not None
                claims[q] = (box, gen, nxt.run_id, nxt.id)
            else:
                del claims[q]
    return jobs


async def by_batch(shared: Any, claims: Claims, size: int) -> int:
    """Runs finished and the next claimed `size` inboxes a statement; the jobs."""
    conn = _taken(shared)
    try:
        return _batches(conn, claims, size)
    finally:
        conn.rollback()
        shared.give(conn)


def _batches(conn: Any, claims: Claims, size: int) -> int:
    row = conn.execute("SELECT settings FROM inboxes LIMIT 1").fetchone()
    settings = psycopg.sql.Literal(row[0]).as_string(conn)
    holder = psycopg.sql.Literal(HOLDER).as_string(conn)
    conn.rollback()
    conn.autocommit = True
    try:
        names = dict(conn.execute("SELECT name, id FROM inboxes").fetchall())
        conn.execute("SET plan_cache_mode = force_generic_plan")
        conn.execute(
            "PREPARE bench_batch(bigint[], bigint[], bigint[], bigint[], bigint, bigint, text,"
            f" text) AS {BATCH}"
        )
        conn.execute(f"PREPARE bench_lock(bigint[]) AS {LOCK}")
        held = {names[box.name]: (gen, run, event) for box, gen, run, event in claims.values()}
        jobs = 0
        while held:
            order = sorted(held)
            for start in range(0, len(order), size):
                group = order[start : start + size]
                gens, runs, events = zip(*(held[i] for i in group), strict=True)
                ids = _array(group)
                cursor = conn.execute(
                    f"BEGIN; EXECUTE bench_lock({ids}); EXECUTE bench_batch({ids}, "
                    f"{_array(gens)}, {_array(runs)}, {_array(events)}, {MAX_ATTEMPTS}, 1, "
                    f"{holder}, {settings}); COMMIT",
                    prepare=False,
                )
                cursor.nextset()
                cursor.nextset()
                for inbox, plain, run, event in cursor.fetchall():
                    if not plain:
                        raise AssertionError(f"inbox {inbox}: the batch found it not plain")
                    jobs += 1
                    if run is None:
                        del held[inbox]
                    else:
                        held[inbox] = (held[inbox][0], run, event)
        return jobs
    finally:
        # The session goes back to the engine as it was (its own statements kept).
        conn.execute("SET plan_cache_mode = DEFAULT")
        for name in ("bench_batch", "bench_lock"):
            with contextlib.suppress(psycopg.errors.InvalidSqlStatementName):
                conn.execute(f"DEALLOCATE {name}")
        conn.autocommit = False


def _array(values: Any) -> str:
    return "ARRAY[" + ", ".join(str(int(v)) for v in values) + "]::bigint[]"


def check(url: str, jobs: int, expected: int) -> None:
    """Every event done, every run closed as done, one run a job, the counts right."""
    with psycopg.connect(url) as conn:
        statuses = dict(conn.execute("SELECT status, count(*) FROM events GROUP BY 1").fetchall())
        outcomes = dict(conn.execute("SELECT outcome, count(*) FROM runs GROUP BY 1").fetchall())
        counted = dict(
            conn.execute(
                "SELECT status, sum(n)::bigint FROM event_counts GROUP BY 1 HAVING sum(n) <> 0"
            ).fetchall()
        )
    want = {"done": expected}
    if jobs != expected or statuses != want or outcomes != want or counted != want:
        raise AssertionError(
            f"after {jobs} jobs of {expected}: events {statuses}, runs {outcomes}, counts {counted}"
        )


def measure(cluster: Any, kind: str, inboxes: int, per: int) -> tuple[float | None, float]:
    """One contestant's run on a fresh database: the server's CPU and this process's, in µs
    a job."""
    url = cluster.new_database()

    async def run() -> tuple[float | None, float]:
        shared, claims = await prepare(url, inboxes, per)
        try:
            pid = backend_of(shared)
            server, client = backend_cpu(pid), time.process_time()
            if kind == "engine":
                jobs = await by_engine(shared, claims)
            else:
                jobs = await by_batch(shared, claims, int(kind))
            after = backend_cpu(pid)
            client = time.process_time() - client
            spent = None if server is None or after is None else after - server
        finally:
            for box, *_ in claims.values():
                await box.close()
            shared.close()
        check(url, jobs, inboxes * per)
        return (None if spent is None else spent / jobs * 1e6), client / jobs * 1e6

    try:
        return asyncio.run(run())
    finally:
        cluster.drop_database(url)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--inboxes", type=int, default=200)
    parser.add_argument("--per", type=int, default=25, help="events an inbox")
    parser.add_argument("--sizes", default="1,2,5,10,25", help="inboxes a batch, comma-separated")
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.inboxes, args.per, args.sizes = 1, 6, 3, "1,4"
    sizes = [int(s) for s in args.sizes.split(",")]
    if not sizes or min(sizes) < 1:
        parser.error("--sizes: each a whole number of at least 1")

    from tests.pg.server import cluster

    server = cluster()
    kinds = ["engine", *map(str, sizes)]
    figures: dict[str, list[tuple[float | None, float]]] = {k: [] for k in kinds}
    print(
        f"{args.inboxes} inboxes of {args.per} jobs, one session, {args.rounds} round(s); "
        f"load average {os.getloadavg()[0]:.1f}",
        flush=True,
    )
    for r in range(args.rounds):
        shift = r % len(kinds)
        for kind in kinds[shift:] + kinds[:shift]:
            server_us, client_us = measure(server, kind, args.inboxes, args.per)
            figures[kind].append((server_us, client_us))
            shown = "n/a" if server_us is None else f"{server_us:.0f}"
            print(
                f"round {r + 1} {_label(kind):<14} server {shown} µs a job, "
                f"this process {client_us:.0f}",
                flush=True,
            )
    print(f"\n{'':<16}{'server µs a job':>22}{'this process µs a job':>26}")
    for kind in kinds:
        print(
            f"{_label(kind):<16}{_spread([s for s, _ in figures[kind]]):>22}"
            f"{_spread([c for _, c in figures[kind]]):>26}"
        )
    print(f"load average {os.getloadavg()[0]:.1f} after")


def _label(kind: str) -> str:
    return "engine" if kind == "engine" else f"batch of {kind}"


def _spread(values: list[float | None]) -> str:
    known = [v for v in values if v is not None]
    if not known:
        return "n/a"
    return f"{statistics.median(known):.0f} ({min(known):.0f}–{max(known):.0f})"


if __name__ == "__main__":
    main()
