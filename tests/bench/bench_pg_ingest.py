#!/usr/bin/env python3
"""Where a lone PostgreSQL ingest's time goes: the server's part piece by piece, and the
engine's part around it.

    python3 tests/bench/bench_pg_ingest.py            3 rounds of 2,000 ingests a variant
    python3 tests/bench/bench_pg_ingest.py --quick    a smoke run, figures meaningless

The one row of the peers' table still under its goal is PostgreSQL's enqueue one at a time
(tests/bench/bench_peers.py, about 0.8× pgqueuer). There an `Inbox.ingest` is one statement,
core/pg/queries.sql `event_insert_alone`: the inbox's row locked, the event inserted under
its keys and into the claim's indexes, the events' counting trigger (the counts by status
and the NOTIFY), the change count. This script prices each part by taking it away, each
variant on a database of its own, the variants taking turns round by round.

The server's part: the statement sent by psycopg, prepared, on one session; its wall time
and the CPU of the server's backend (from /proc, so only for a server on this machine), an
ingest.

- **engine**: the statement as the engine sends it.
- **no counting trigger**: the events' INSERT trigger disabled; nothing counted or told.
- **counted by the statement**: the trigger disabled, the statement counting its event and
  sending the NOTIFY itself: what moving the trigger's work into the engine's own
  statements would leave.
- **... trigger kept for others**: the same, with the INSERT trigger made a row trigger
  that a transaction-local setting, set by the statement, turns off: what that move costs
  if a previous release's inserts (a receiver still running during an upgrade) must still
  be counted.
- **no lock, no change count**: the inbox's row neither locked nor its change count moved.
- **two indexes fewer**: events_by_status and events_pending_available dropped.
- **pgqueuer's enqueue**, for scale: the peer's whole call (asyncpg, its process of its own,
  tests/bench/peer_queues.py), on a fresh database each round; its wall time includes its
  client's part. Left out with `--no-peer`; the peers' environment is tests/bench/peers_env.py's.

The engine's part: `Inbox.ingest` on databases of their own, its wall time and this
process's CPU an ingest.

- **Inbox.ingest**: at its default, each commit on the inbox's connection thread;
- **Inbox.ingest, loop_writes**: each on the caller's event loop;
- **the statement alone**: the same statement on the inbox's own session from the loop's
  thread, by psycopg, with nothing of the engine around it.

After the runs, every variant's database holds every event it was given, and where the
variant counts (all but the two without the trigger) the counts by status equal the events.
Medians over rounds, min–max beside. The server is tests/pg/server.py's, restarted with
fsync on as the peers' table runs it (ONWATCH_TEST_DATABASE_URL names another, used as it
is; its fsync is printed).
"""

from __future__ import annotations

import argparse
import asyncio
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

from onwatch.core import Inbox  # noqa: E402
from onwatch.core.pg.listen import SCHEMA_CHANNEL  # noqa: E402
from onwatch.core.pg.tx import STATEMENTS  # noqa: E402
from tests.bench.peer_queues import backend_cpu  # noqa: E402

ENGINE = STATEMENTS["event_insert_alone"]
FLAG = "onwatch.counted"  # the transaction-local setting of the "trigger kept" variant


def _replaced(text: str, old: str, new: str) -> str:
    """`text` with `old` replaced once: an engine statement changed since this script was
    written fails here, rather than being measured as something else."""
    if text.count(old) != 1:
        raise SystemExit(
            f"the engine's event_insert_alone no longer has {old!r}: update {__file__}"
        )
    return text.replace(old, new)


_CHANGE_COUNT = (
    "UPDATE inboxes SET changes = changes + 1\nWHERE id = %(inbox)s AND EXISTS (SELECT FROM stored)"
)
# The event counted and its inbox told by the statement (RETURNING: once, if it stored one).
COUNTED = _replaced(
    _replaced(
        ENGINE,
        "    RETURNING 1\n)",
        "    RETURNING 1\n), counted AS (\n"
        "    UPDATE event_counts SET n = n + 1\n"
        "    WHERE inbox_id = %(inbox)s AND status = 'pending' AND EXISTS (SELECT FROM stored)\n)",
    ),
    _CHANGE_COUNT,
    _CHANGE_COUNT + "\nRETURNING pg_notify(%(channel)s, name)",
)
FLAGGED = _replaced(
    COUNTED, "SELECT id FROM inboxes", f"SELECT id, set_config('{FLAG}', 'on', true) FROM inboxes"
)
UNLOCKED = """
WITH stored AS (
    INSERT INTO events(inbox_id, id, source, source_id, payload, available_at, created,
                       updated)
    SELECT %(inbox)s, (SELECT coalesce(max(id), 0) + 1 FROM events WHERE inbox_id = %(inbox)s),
           %(source)s::text, %(source_id)s::text, %(payload)s::text, t.now, t.now, t.now
    FROM (SELECT coalesce(%(now)s::bigint,
                          floor(extract(epoch FROM clock_timestamp()))::bigint) AS now) AS t
    WHERE %(settings)s::text IS NULL
    ON CONFLICT DO NOTHING
    RETURNING 1
)
SELECT count(*) FROM stored"""

ROW_TRIGGER = f"""
CREATE FUNCTION bench_event_inserted() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE event_counts SET n = n + 1 WHERE inbox_id = NEW.inbox_id AND status = NEW.status;
    IF NEW.status = 'pending' THEN
        PERFORM pg_notify('onwatch.' || md5(TG_TABLE_SCHEMA), i.name) FROM inboxes i
        WHERE i.id = NEW.inbox_id;
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER bench_event_inserted AFTER INSERT ON events FOR EACH ROW
    WHEN (current_setting('{FLAG}', true) IS DISTINCT FROM 'on')
    EXECUTE FUNCTION bench_event_inserted();
"""

# variant: (its label, the DDL its database gets, the statement, whether it counts)
SERVER: dict[str, tuple[str, str, str, bool]] = {
    "engine": ("engine", "", ENGINE, True),
    "untriggered": (
        "no counting trigger",
        "ALTER TABLE events DISABLE TRIGGER events_counted_insert",
        ENGINE,
        False,
    ),
    "counted": (
        "counted by the statement",
        "ALTER TABLE events DISABLE TRIGGER events_counted_insert",
        COUNTED,
        True,
    ),
    "flagged": (
        "... trigger kept for others",
        "ALTER TABLE events DISABLE TRIGGER events_counted_insert;" + ROW_TRIGGER,
        FLAGGED,
        True,
    ),
    "unlocked": ("no lock, no change count", "", UNLOCKED, True),
    "indexes": (
        "two indexes fewer",
        "DROP INDEX events_by_status; DROP INDEX events_pending_available",
        ENGINE,
        True,
    ),
}
PEER = "pgqueuer"
CLIENT = {
    "thread": "Inbox.ingest",
    "loop": "Inbox.ingest, loop_writes",
    "alone": "the statement alone",
}


class Place:
    """One variant's database, its inbox open, and the number of events it was given."""

    def __init__(self, url: str, box: Inbox, inbox_id: int, channel: str) -> None:
        self.url, self.box, self.inbox_id, self.channel = url, box, inbox_id, channel
        self.given = 1  # the first ingest, which made the inbox
        self.session: psycopg.Connection[Any] | None = None


async def place(cluster: Any, ddl: str) -> Place:
    url = cluster.new_database()
    box = await Inbox.open(url, name="bench")
    await box.ingest("bench", "first")
    with psycopg.connect(url, autocommit=True) as conn:
        [(inbox_id,)] = conn.execute("SELECT id FROM inboxes").fetchall()
        [(channel,)] = conn.execute(SCHEMA_CHANNEL).fetchall()
        if ddl:
            conn.execute(ddl)
    return Place(url, box, inbox_id, channel)


def send(conn: psycopg.Connection[Any], statement: str, where: Place, n: int, tag: str) -> None:
    for k in range(n):
        conn.execute(
            statement,
            {
                "inbox": where.inbox_id,
                "settings": None,
                "source": "bench",
                "source_id": f"{tag}-{k}",
                "payload": "null",
                "now": None,
                "channel": where.channel,
            },
            prepare=True,
        )
    where.given += n


def server_round(where: Place, statement: str, n: int, tag: str) -> tuple[float, float | None]:
    """n statements on the variant's own session: µs of wall time and of the backend's CPU,
    an ingest."""
    if where.session is None:
        where.session = psycopg.connect(where.url, autocommit=True)
        send(where.session, statement, where, 5, f"{tag}-warm")  # prepared from here on
    conn = where.session
    pid = conn.info.backend_pid
    cpu, started = backend_cpu(pid), time.perf_counter()
    send(conn, statement, where, n, tag)
    wall, after = time.perf_counter() - started, backend_cpu(pid)
    spent = None if cpu is None or after is None else (after - cpu) / n * 1e6
    return wall / n * 1e6, spent


async def client_round(kind: str, where: Place, n: int, tag: str) -> tuple[float, float]:
    """n ingests by `kind`: µs of wall time and of this process's CPU, an ingest."""
    box = where.box
    box.loop_writes = kind == "loop"
    own = box._db._tx.conn  # the inbox's own session: idle between ingests
    cpu, started = time.process_time(), time.perf_counter()
    if kind == "alone":
        send(own, ENGINE, where, n, tag)
    else:
        for k in range(n):
            await box.ingest("bench", f"{tag}-{k}")
        where.given += n
    return (time.perf_counter() - started) / n * 1e6, (time.process_time() - cpu) / n * 1e6


def check(label: str, where: Place, counts: bool) -> None:
    with psycopg.connect(where.url, autocommit=True) as conn:
        [(stored,)] = conn.execute("SELECT count(*) FROM events").fetchall()
        counted = dict(conn.execute("SELECT status, n FROM event_counts WHERE n <> 0").fetchall())
    if stored != where.given:
        raise AssertionError(f"{label}: {stored} events stored of {where.given} given")
    if counts and counted != {"pending": stored}:
        raise AssertionError(f"{label}: counts {counted} for {stored} pending events")


def pgqueuer_round(peers: str, cluster: Any, n: int) -> tuple[float, float | None]:
    """n of pgqueuer's enqueues on a fresh database, in the peer's own process: µs of wall
    time and of its backend's CPU, an enqueue."""
    from tests.bench.bench_peers import PEER_SCRIPT, _json_line

    url = cluster.new_database(schema=False)
    try:
        figures = _json_line(
            [peers, str(PEER_SCRIPT), "enqueue", "pgqueuer", url, str(n), "direct"], "pgqueuer"
        )
    finally:
        cluster.drop_database(url)
    jobs, server = figures["jobs"], figures.get("server")
    return figures["seconds"] / jobs * 1e6, None if server is None else server / jobs * 1e6


async def run(cluster: Any, rounds: int, n: int, peers: str | None) -> None:
    places = {key: await place(cluster, ddl) for key, (_, ddl, _, _) in SERVER.items()}
    clients = {key: await place(cluster, "") for key in CLIENT}
    server: dict[str, list[tuple[float, float | None]]] = {key: [] for key in SERVER}
    if peers:
        server[PEER] = []
    client: dict[str, list[tuple[float, float]]] = {key: [] for key in CLIENT}
    try:
        for r in range(rounds):
            keys = list(server)
            for key in keys[r % len(keys) :] + keys[: r % len(keys)]:
                if key == PEER:
                    assert peers is not None
                    server[key].append(pgqueuer_round(peers, cluster, n))
                    continue
                figures = server_round(places[key], SERVER[key][2], n, f"r{r}")
                server[key].append(figures)
            kinds = list(CLIENT)
            for kind in kinds[r % len(kinds) :] + kinds[: r % len(kinds)]:
                client[kind].append(await client_round(kind, clients[kind], n, f"r{r}"))
            print(
                f"round {r + 1} of {rounds} done; load average {os.getloadavg()[0]:.1f}", flush=True
            )
    finally:
        for where in [*places.values(), *clients.values()]:
            await where.box.close()
            if where.session is not None:
                where.session.close()
    for key, (label, _, _, counts) in SERVER.items():
        check(label, places[key], counts)
    for kind, label in CLIENT.items():
        check(label, clients[kind], True)
    print(f"\nthe server's part{'':<22}{'wall µs an ingest':>22}{'server CPU µs':>22}")
    for key, figures in server.items():
        label = "pgqueuer's enqueue" if key == PEER else SERVER[key][0]
        print(
            f"{label:<39}{_spread([w for w, _ in figures]):>22}"
            f"{_spread([c for _, c in figures]):>22}"
        )
    print(f"\nthe engine's part{'':<22}{'wall µs an ingest':>22}{'this process CPU µs':>22}")
    for kind, label in CLIENT.items():
        print(
            f"{label:<39}{_spread([w for w, _ in client[kind]]):>22}"
            f"{_spread([c for _, c in client[kind]]):>22}"
        )


def _spread(values: list[float | None]) -> str:
    known = [v for v in values if v is not None]
    if not known:
        return "n/a"
    return f"{statistics.median(known):.0f} ({min(known):.0f}–{max(known):.0f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--ingests", type=int, default=2000, help="a variant's ingests a round")
    parser.add_argument("--quick", action="store_true", help="one round of 20: a smoke run")
    parser.add_argument("--peers-python", help="an interpreter with the peers installed")
    parser.add_argument("--no-peer", action="store_true", help="leave pgqueuer's row out")
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.ingests = 1, 20
    if args.rounds < 1 or args.ingests < 1:
        parser.error("--rounds and --ingests: at least 1")

    from tests.bench.bench_peers import durable_server
    from tests.pg.server import cluster

    server = cluster()
    if server.owned is not None:
        durable_server(server.owned)
    with server.admin() as conn:
        [(fsync,)] = conn.execute("SHOW fsync").fetchall()
    print(
        f"{len(SERVER)} server variants and {len(CLIENT)} client paths, {args.ingests} ingests "
        f"each a round, {args.rounds} round(s), taking turns; fsync={fsync}; "
        f"load average {os.getloadavg()[0]:.1f}",
        flush=True,
    )
    peers = None
    if not args.no_peer:
        from tests.bench.peers_env import peers_python

        peers = peers_python(args.peers_python)
    asyncio.run(run(server, args.rounds, args.ingests, peers))
    print(f"load average {os.getloadavg()[0]:.1f} after")


if __name__ == "__main__":
    main()
