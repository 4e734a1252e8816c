"""Chaos on a fleet: a fleet worker SIGKILLed mid-run and PostgreSQL itself restarted
(`pg_ctl restart -m immediate`) while two fleet processes serve 20 inboxes; afterwards the
invariants are checked from the database and the agents' ledger."""

from __future__ import annotations

import asyncio
import json
import signal

import psycopg
import pytest

from core import Inbox
from tests.pg.test_fleet import done, start_fleet
from tests.worker.helpers import wait_for

pytestmark = pytest.mark.slow
INBOXES, EVENTS = 20, 6


async def fill(url: str) -> None:
    for i in range(INBOXES):
        box = await Inbox.open(url, name=f"inbox-{i:02d}")
        # A short lease: a killed holder's inboxes are taken over within seconds.
        await box.configure(max_batch=1, lease_ttl=3)
        await box.ingest_batch([("chat", f"inbox-{i:02d}/{k}", None) for k in range(EVENTS)])
        await box.close()


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
        pg.pg_ctl("-w", "-m", "immediate", "restart")  # every connection cut at once
        fleets.append(start_fleet(url, tmp_path, "fleet-2"))  # the killed one's successor
        wait_for(lambda: done(url) == total, 120, what="every event done after the chaos")
    finally:
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
        audited = conn.execute("SELECT count(*) FROM audit WHERE action LIKE 'refused %%' "
                               "AND NOT applied").fetchone()[0]
        assert refused == audited  # every refused stale write is in the audit log
    runs = [json.loads(line) for line in (tmp_path / "ledger").read_text().splitlines()]
    assert {r["pid"] for r in runs} >= {fleets[1].pid, fleets[2].pid}
    print(f"chaos: {len(runs)} agent runs for {total} events, {refused} refused stale writes")
