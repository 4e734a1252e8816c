"""Chaos on a fleet: a fleet worker SIGKILLed mid-run and PostgreSQL itself restarted
(`pg_ctl restart -m immediate`) while two fleet processes serve 20 inboxes; afterwards the
invariants are checked from the database and the agents' ledger."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time

import psycopg
import pytest

from onwatch.core import Inbox
from tests.pg.test_fleet import done, start_fleet
from tests.worker.helpers import ROOT, env, wait_for

pytestmark = pytest.mark.slow
INBOXES, EVENTS = 20, 6


async def fill(url: str) -> None:
    for i in range(INBOXES):
        box = await Inbox.open(url, name=f"inbox-{i:02d}")
        # A short lease: a killed holder's inboxes are taken over within seconds.
        await box.configure(max_batch=1, lease_ttl=3)
        await box.ingest_batch([("chat", f"inbox-{i:02d}/{k}", None) for k in range(EVENTS)])
        await box.close()


def ran(folder, /) -> set[int]:
    """The processes the agents' ledger has a run of."""
    ledger = folder / "ledger"
    lines = ledger.read_text().splitlines() if ledger.exists() else []
    return {json.loads(line)["pid"] for line in lines if line.endswith("}")}


def test_sigkill_and_a_server_restart_lose_nothing_and_fence_the_rest(pg, tmp_path):
    if pg.owned is None:
        pytest.skip("needs a server the tests started (it is restarted)")
    url = pg.new_database()
    asyncio.run(fill(url))
    total = INBOXES * EVENTS
    fleets = [start_fleet(url, tmp_path, f"fleet-{n}") for n in range(2)]
    try:
        wait_for(lambda: done(url) >= total // 4, 60, what="a quarter done")
        fleets[0].send_signal(signal.SIGKILL)  # mid-run: its claims are left running
        wait_for(lambda: done(url) >= total // 2, 60, what="half done")
        # The survivor is held still from here until the killed one's successor has run
        # something: on a loaded machine it could otherwise finish the rest while the
        # successor is still starting, and the successor's part would go unchecked. (Held
        # before the restart, so that its runs are cut once, by the hold or the restart.)
        fleets[1].send_signal(signal.SIGSTOP)
        pg.pg_ctl("-w", "-m", "immediate", "restart")  # every connection cut at once
        fleets.append(start_fleet(url, tmp_path, "fleet-2"))
        wait_for(lambda: fleets[2].pid in ran(tmp_path), 60, what="the successor's first run")
        fleets[1].send_signal(signal.SIGCONT)
        wait_for(lambda: done(url) == total, 120, what="every event done after the chaos")
    finally:
        fleets[1].send_signal(signal.SIGCONT)
        for fleet in fleets[1:]:
            fleet.send_signal(signal.SIGTERM)
        codes = [fleet.wait(timeout=60) for fleet in fleets[1:]]
        fleets[0].wait(timeout=10)
    logs = "\n".join((tmp_path / f"fleet-{n}.err").read_text() for n in (1, 2))
    assert codes == [0, 0], logs
    assert "cannot reach" in logs or "lost the connection" in logs  # the restart was seen
    with psycopg.connect(url) as conn:
        states = dict(conn.execute("SELECT status, count(*) FROM events GROUP BY 1"))
        assert states == {"done": total}  # nothing acknowledged lost
        assert conn.execute("SELECT max(attempts) FROM events").fetchone()[0] <= 3
        # Every run that finished 'done' finished each of its events exactly once.
        twice = conn.execute(
            "SELECT r.inbox_id, v, count(*) FROM runs r, json_array_elements_text("
            "r.event_ids::json) v WHERE r.outcome = 'done' GROUP BY 1, 2 HAVING count(*) > 1"
        ).fetchall()
        assert twice == []
        refused = conn.execute("SELECT sum(refused_writes) FROM inboxes").fetchone()[0]
        audited = conn.execute(
            "SELECT count(*) FROM audit WHERE action LIKE 'refused %%' AND NOT applied"
        ).fetchone()[0]
        assert refused == audited  # every refused stale write is in the audit log
    runs = [json.loads(line) for line in (tmp_path / "ledger").read_text().splitlines()]
    assert {r["pid"] for r in runs} >= {fleets[1].pid, fleets[2].pid}
    print(f"chaos: {len(runs)} agent runs for {total} events, {refused} refused stale writes")


# --- the size: 4 fleets × 25 over 200 inboxes, with ingesters and approvers ----------

FLEET_INBOXES, FIRST_EVENTS, LATE_EVENTS, MAX_ATTEMPTS = 200, 3, 150, 5


async def fill_fleet(url: str) -> None:
    for i in range(FLEET_INBOXES):
        name = f"inbox-{i:03d}"
        box = await Inbox.open(url, name=name)
        # A short lease: a killed or stopped holder's inboxes are taken over within seconds.
        await box.configure(max_batch=1, lease_ttl=3, max_attempts=MAX_ATTEMPTS)
        await box.ingest_batch(
            [("chat", f"{name}/{k}", None) for k in range(FIRST_EVENTS)]
            + [("chat", f"{name}/ask", None)]
        )
        await box.close()


def start_actor(test_dir, name: str, *args: str) -> subprocess.Popen:
    out = open(os.path.join(test_dir, f"{name}.err"), "ab")
    try:
        return subprocess.Popen(
            [sys.executable, "-m", "tests.pg.actors", *args],
            cwd=ROOT,
            env=env(test_dir),
            stdout=subprocess.DEVNULL,
            stderr=out,
        )
    finally:
        out.close()


def settled(url: str) -> tuple[int, int]:
    """(events not yet done, approvals not yet answered)."""
    with psycopg.connect(url, connect_timeout=5) as conn:
        return (
            conn.execute("SELECT count(*) FROM events WHERE status <> 'done'").fetchone()[0],
            conn.execute("SELECT count(*) FROM approvals WHERE answer IS NULL").fetchone()[0],
        )


def test_four_fleets_over_two_hundred_inboxes_under_chaos(pg, tmp_path):
    """4 fleet processes (as if on 4 machines, two with clocks 90 s off), --concurrency 25,
    serve 200 inboxes while an ingester adds events and an approver answers the agents'
    approval requests; the test
    SIGKILLs one fleet (a successor starts, as a supervisor would), SIGSTOPs another past
    its lease and SIGCONTs it (its late finishes must be refused), and restarts PostgreSQL
    with `pg_ctl restart -m immediate`. Then, from the database and the agents' ledger:
    no inbox had two runs at once that both counted, no acknowledged event was lost, no
    event ran more often than max_attempts, every refused stale write is audited."""
    if pg.owned is None:
        pytest.skip("needs a server the tests started (it is restarted)")
    url = pg.new_database()
    asyncio.run(fill_fleet(url))
    started = time.monotonic()
    # Two of the machines' clocks are off by far more than the lease TTL (3 s): one 90 s
    # ahead, one 90 s behind. On PostgreSQL time comes from the server, so they must take
    # no live lease early and hold none past its expiry.
    skews = {2: 90.0, 3: -90.0}
    fleets = {
        n: start_fleet(
            url, tmp_path, f"fleet-{n}", concurrency=25, agent="chaos_agent", skew=skews.get(n, 0)
        )
        for n in range(4)
    }
    ingester = start_actor(
        tmp_path, "ingester", "ingest-late", url, str(FLEET_INBOXES), str(LATE_EVENTS), "0.02"
    )
    approver = start_actor(
        tmp_path, "approver", "approve", url, str(FLEET_INBOXES), str(time.time() + 90)
    )
    ledger = tmp_path / "ledger"

    def runs_so_far() -> int:
        return len(ledger.read_text().splitlines()) if ledger.exists() else 0

    stopped = None
    try:
        wait_for(lambda: runs_so_far() >= 150, 30, what="the fleet under way")
        fleets[0].send_signal(signal.SIGKILL)  # mid-run: its claims are left running
        fleets[4] = start_fleet(url, tmp_path, "fleet-4", concurrency=25, agent="chaos_agent")
        # The others may make the first runs alone while this one is still starting (a
        # loaded machine): it is frozen only once it runs, so that it holds leases to lose.
        wait_for(
            lambda: ": events [" in (tmp_path / "fleet-1.err").read_text(),
            30,
            what="fleet-1 running",
        )
        stopped = fleets[1]
        stopped.send_signal(signal.SIGSTOP)  # frozen mid-run, holding up to 25 leases
        frozen_at = time.monotonic()
        mark = runs_so_far()
        wait_for(lambda: runs_so_far() >= mark + 150, 30, what="runs while one is frozen")
        # The successor is serving before the restart (one that first connects while the
        # server is starting up is refused and exits 1, for its supervisor to start again).
        wait_for(
            lambda: "started on" in (tmp_path / "fleet-4.err").read_text(),
            60,
            what="the successor serving",
        )
        pg.pg_ctl("-w", "-m", "immediate", "restart")  # every connection cut at once
        # Thawed only once its leases lapsed (lease_ttl 3 s) and others took its inboxes.
        wait_for(lambda: time.monotonic() - frozen_at > 4, 10, what="the lease to lapse")
        stopped.send_signal(signal.SIGCONT)
        stopped = None
        assert ingester.wait(timeout=60) == 0, (tmp_path / "ingester.err").read_text()
        assert approver.wait(timeout=60) == 0, (tmp_path / "approver.err").read_text()
        wait_for(
            lambda: settled(url) == (0, 0),
            60,
            interval=0.2,
            what="every event done and every approval answered",
        )
    finally:
        if stopped is not None:
            stopped.send_signal(signal.SIGCONT)
        for n, fleet in fleets.items():
            if n != 0:
                fleet.send_signal(signal.SIGTERM)
        for process in (ingester, approver):
            if process.poll() is None:
                process.kill()
        codes = {n: fleets[n].wait(timeout=60) for n in fleets}
    elapsed = time.monotonic() - started
    logs = "\n".join((tmp_path / f"fleet-{n}.err").read_text() for n in (1, 2, 3, 4))
    assert [codes[n] for n in (1, 2, 3, 4)] == [0, 0, 0, 0], logs[-3000:]
    assert "cannot reach" in logs or "lost the connection" in logs  # the restart was seen
    for n, word in ((2, "ahead of"), (3, "behind")):  # each skewed machine said so
        assert (
            f"clock is {word} the PostgreSQL server's" in (tmp_path / f"fleet-{n}.err").read_text()
        )

    acked = (tmp_path / "acked").read_text().split()
    assert len(acked) == LATE_EVENTS
    runs = [json.loads(line) for line in ledger.read_text().splitlines()]
    with psycopg.connect(url) as conn:
        names = dict(conn.execute("SELECT id, name FROM inboxes"))
        events = {
            (names[i], s, k): (status, attempts)
            for i, s, k, status, attempts in conn.execute(
                "SELECT inbox_id, source, source_id, status, attempts FROM events"
            )
        }
        # Nothing acknowledged lost: the first events, every late one, every answer.
        total = FLEET_INBOXES * (FIRST_EVENTS + 2) + LATE_EVENTS
        assert len(events) == total
        for key in acked:
            assert events[(key.split("/")[0], "chat", key)][0] == "done", key
        assert {status for status, _ in events.values()} == {"done"}
        assert (
            conn.execute("SELECT count(*) FROM approvals WHERE answer = 'yes'").fetchone()[0]
            == FLEET_INBOXES
        )
        # Within the policy: attempts counted at claim never pass max_attempts, and no event
        # reached an agent more often than its attempts say.
        assert max(attempts for _, attempts in events.values()) <= MAX_ATTEMPTS
        reached: dict[tuple, int] = {}
        for run in runs:
            for event in run["events"]:
                source, key = event.split(":", 1)
                reached[(run["inbox"], source, key)] = (
                    reached.get((run["inbox"], source, key), 0) + 1
                )
        for key, count in reached.items():
            assert count <= events[key][1], (key, count, events[key])
        # Each event finished done exactly once.
        twice = conn.execute(
            "SELECT r.inbox_id, v, count(*) FROM runs r, json_array_elements_text("
            "r.event_ids::json) v WHERE r.outcome = 'done' GROUP BY 1, 2 HAVING count(*) > 1"
        ).fetchall()
        assert twice == []
        counted = {
            (names[i], gen, tuple(json.loads(ids)))
            for i, gen, ids in conn.execute(
                "SELECT inbox_id, gen, event_ids FROM runs WHERE outcome = 'done'"
            )
        }
        refused = conn.execute("SELECT sum(refused_writes) FROM inboxes").fetchone()[0]
        audited = conn.execute(
            "SELECT count(*) FROM audit WHERE action LIKE 'refused %%' AND NOT applied"
        ).fetchone()[0]
        assert refused == audited  # every refused stale write is in the audit log
        # The frozen fleet met a fence on waking: a late finish refused, or (the server was
        # restarted while it slept) its connections gone and its generations handed back.
        frozen = (tmp_path / "fleet-1.err").read_text()
        assert refused > 0 or "handed back" in frozen or "lost the connection" in frozen
    # No inbox had two runs at once that both counted: two agent runs of one inbox that
    # overlap in time ran under different generations, and the older one's finish was
    # refused (it belonged to a frozen or killed holder whose lease had lapsed).
    by_inbox: dict[str, list] = {}
    for run in runs:
        by_inbox.setdefault(run["inbox"], []).append(run)
    overlaps = 0
    for inbox, spans in by_inbox.items():
        spans.sort(key=lambda r: r["began"])
        for i, early in enumerate(spans):
            for late in spans[i + 1 :]:
                if late["began"] >= early["ended"]:
                    break
                overlaps += 1
                assert early["gen"] != late["gen"], (inbox, early, late)
                older = min(early, late, key=lambda r: r["gen"])
                assert (inbox, older["gen"], tuple(older["ids"])) not in counted, (
                    inbox,
                    early,
                    late,
                )
    print(
        f"chaos at scale: {len(runs)} agent runs for {total} events in {elapsed:.1f} s, "
        f"{refused} refused stale writes, {overlaps} overlapping runs fenced"
    )
