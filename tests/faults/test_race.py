"""Chaos: racing worker processes killed and stalled at random while another process ingests
(with duplicates) and another acts as the operator. Afterwards the file must tell a
consistent story."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter

import pytest

from onwatch.core.engine import plans
from tests.worker.helpers import (
    ROOT,
    env,
    log_of,
    onwatch,
    query,
    scalar,
    start_worker,
    stop,
    wait_for,
)

pytestmark = pytest.mark.slow
CHAOS_SECONDS = 8
WORKERS = 3
KEYS = 200


def actor(tmp_path, *args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.faults.actors", *args],
        cwd=ROOT,
        env=env(tmp_path),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_racing_workers_with_kills_stalls_duplicates_and_operators(tmp_path):
    seed = int(os.environ.get("ONWATCH_CHAOS_SEED", random.randrange(1 << 30)))
    rng = random.Random(seed)
    print(f"\nchaos seed {seed} (rerun with ONWATCH_CHAOS_SEED={seed})")
    path = str(tmp_path / "inbox.db")
    assert (
        onwatch(
            "init",
            path,
            "lease_ttl=2",
            "outbox_gap=0",
            "max_attempts=4",
            "max_batch=5",
            'lost_claim_by_source={"pay": "interrupt"}',
        ).returncode
        == 0
    )
    spawned = 0

    def spawn():
        nonlocal spawned
        spawned += 1
        return start_worker(
            path,
            "echo",
            tmp_path,
            "--file",
            str(tmp_path / "sent.jsonl"),
            holder=f"w{spawned}",
            name=f"w{spawned}",
        )

    workers = [spawn() for _ in range(WORKERS)]
    ingester = actor(tmp_path, "ingest", path, str(KEYS), str(seed), str(CHAOS_SECONDS))
    operator = actor(tmp_path, "operate", path, str(CHAOS_SECONDS - 1), str(seed + 1))
    kills = stalls = 0
    stalled: dict[int, float] = {}  # pid → when to SIGCONT it
    deadline = time.monotonic() + CHAOS_SECONDS
    try:
        while time.monotonic() < deadline:
            time.sleep(rng.uniform(0.1, 0.4))  # paces the chaos; the checks come after it
            for process in workers:
                if stalled.get(process.pid, float("inf")) <= time.monotonic():
                    process.send_signal(signal.SIGCONT)
                    del stalled[process.pid]
            # Mostly hit the lease holder: that is where a kill or stall does damage.
            holder = scalar(path, "SELECT holder FROM lease")
            names = [p.args[p.args.index("--holder") + 1] for p in workers]
            index = (
                names.index(holder)
                if holder in names and rng.random() < 0.7
                else rng.randrange(len(workers))
            )
            victim = workers[index]
            if victim.pid in stalled:
                continue  # let a stalled holder wake up to a successor: the fence's case
            is_holder = names[index] == holder
            roll = rng.random()
            if roll < (0.3 if is_holder else 0.5):
                victim.send_signal(signal.SIGKILL)
                victim.wait()
                workers[index] = spawn()
                kills += 1
            elif roll < 0.85:
                victim.send_signal(signal.SIGSTOP)
                # Often past the 2 s lease, so a successor takes over meanwhile.
                stalled[victim.pid] = time.monotonic() + rng.uniform(0.5, 5.0)
                stalls += 1
        for process in workers:  # the chaos is over: nobody stays stopped (or holds a lock)
            if process.pid in stalled:
                process.send_signal(signal.SIGCONT)
        ingested = json.loads(ingester.communicate(timeout=60)[0])
        operated = json.loads(operator.communicate(timeout=30)[0])
    finally:
        for process in workers:
            if process.poll() is None:
                stop(process, timeout=20)
        for process in (ingester, operator):
            if process.poll() is None:
                process.kill()
    print(
        f"kills {kills}, stalls {stalls}, workers spawned {spawned}, ingest busy retries "
        f"{ingested['busy']}, operator actions {len(operated['actions'])}"
    )

    # Drain what is left with one well-behaved worker, so liveness is checked too.
    onwatch("resume", path)
    onwatch("release", path)
    drain = spawn()
    try:
        wait_for(
            lambda: scalar(path, "SELECT holder FROM lease") == f"w{spawned}",
            timeout=10,
            what="the drain worker's lease",
        )
        wait_for(
            lambda: (
                scalar(path, "SELECT n FROM event_counts WHERE status = 'pending'") == 0
                and scalar(path, "SELECT n FROM event_counts WHERE status = 'running'") == 0
            ),
            timeout=30,
            what="the drain",
        )
    finally:
        assert stop(drain) == 0, log_of(tmp_path, f"w{spawned}")

    check_story(path, ingested["results"])
    # Delivery is at-least-once: every delivery recorded as sent is in the channel's file.
    uid = scalar(path, "SELECT value FROM meta WHERE key = 'uid'")
    sent = {
        plans.delivery_key(uid, i, salt)
        for i, salt in query(path, "SELECT id, key_salt FROM deliveries WHERE status = 'sent'")
    }
    lines = (tmp_path / "sent.jsonl").read_text().splitlines()
    assert sent <= {json.loads(line)["key"] for line in lines if line.strip()}
    stats = query(path, "SELECT key, value FROM meta WHERE key IN ('takeovers', 'refused_writes')")
    print(f"final: {dict(query(path, 'SELECT status, n FROM event_counts'))}, {dict(stats)}")


def check_story(path: str, results: dict[str, list[bool]]) -> None:
    # Dedupe held: each key was stored by exactly one of its two deliveries.
    assert all(sorted(r) == [False, True] for r in results.values()), {
        k: r for k, r in results.items() if sorted(r) != [False, True]
    }
    # No event lost, none invented: the rows are exactly the keys the ingester stored.
    stored = {f"{s}/{i}" for s, i in query(path, "SELECT source, source_id FROM events")}
    assert stored == set(results)
    # Every event is in exactly one known state, and the kept counts agree with the rows.
    actual = dict(query(path, "SELECT status, count(*) FROM events GROUP BY status"))
    kept = {s: n for s, n in query(path, "SELECT status, n FROM event_counts") if n}
    assert actual == kept
    assert set(actual) <= {"pending", "running", "done", "dead", "interrupted", "cancelled"}
    # No claim was finished by two generations: at most one 'done' run per event.
    twice = query(
        path,
        """SELECT event_id, count(*) FROM run_events JOIN runs
                           ON runs.id = run_events.run_id WHERE outcome = 'done'
                           GROUP BY event_id HAVING count(*) > 1""",
    )
    assert twice == []
    # Events of a done run are done (a done event can never move again).
    not_done = query(
        path,
        """SELECT e.id, e.status FROM events e JOIN run_events re
                              ON re.event_id = e.id JOIN runs r ON r.id = re.run_id
                              WHERE r.outcome = 'done' AND e.status <> 'done'""",
    )
    assert not_done == []
    # Every done event has its one done run, or was marked done by the operator.
    resolved = {
        int(t.split()[1])
        for (t,) in query(path, "SELECT target FROM audit WHERE action = 'resolve' AND applied = 1")
    }
    orphan = query(
        path,
        """SELECT id FROM events WHERE status = 'done' AND id NOT IN
                            (SELECT event_id FROM run_events
                             JOIN runs ON runs.id = run_events.run_id
                             WHERE outcome = 'done')""",
    )
    assert {i for (i,) in orphan} <= resolved
    # Outbox messages equal the accepted finishes' messages: one reply per event of each
    # done run, none for lost or failed runs, never a duplicate.
    expected = Counter()
    for (run_id,) in query(path, "SELECT id FROM runs WHERE outcome = 'done'"):
        for source, source_id in query(
            path,
            """SELECT source, source_id FROM events JOIN
                run_events ON events.id = event_id WHERE run_events.run_id = ?""",
            (run_id,),
        ):
            expected[(run_id, f"reply {source}/{source_id}")] += 1
    queued = Counter(query(path, "SELECT run_id, body FROM outbox"))
    assert queued == expected
    assert max(Counter(b for _, b in queued).values(), default=1) == 1
    # Lease generations form one unbroken history.
    gens = [g for (g,) in query(path, "SELECT gen FROM lease_history ORDER BY gen")]
    assert gens == list(range(1, len(gens) + 1))
    # A running row belongs to an open run (after the drain there are none).
    assert scalar(path, "SELECT count(*) FROM events WHERE status = 'running'") == 0
