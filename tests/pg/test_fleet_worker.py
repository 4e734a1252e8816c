"""The fleet worker as a scheduler over many inboxes (docs/rules.md#the-fleet-worker), with
real fleet processes on the test server: everything due gets done (held replies, failed
sends), no inbox starves, nothing spins, and a database it cannot serve is refused with the
single-inbox worker's words and exit codes.

"Nothing spins" is counted, never timed: over a few idle seconds, the server's own commit
counter for the database (pg_stat_database.xact_commit), the rows the visits would write
(lease history, audit) and the inboxes' change counters. The fleet's CPU time is printed.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import time

import psycopg
import pytest

from onwatch.core import Inbox
from tests.worker.helpers import ROOT, env, onwatch, wait_for

pytestmark = pytest.mark.slow
IDLE_SECONDS = 3.0  # how long an idle fleet is watched
MAX_IDLE_COMMITS_PER_SECOND = 20  # the looks, a listener, a renewal: not a loop


def start_fleet(url: str, test_dir, *extra: str, agent: str = "replier", holder: str = "fleet"):
    err = open(os.path.join(test_dir, f"{holder}.err"), "ab")
    try:
        return subprocess.Popen(
            [
                sys.executable,
                "-m",
                "onwatch",
                "worker",
                url,
                "--all-inboxes",
                "--agent",
                f"tests.pg.actors:{agent}",
                "--holder",
                holder,
                "--poll",
                "1",
                *extra,
            ],
            cwd=ROOT,
            env=env(test_dir),
            stdout=subprocess.DEVNULL,
            stderr=err,
        )
    finally:
        err.close()


def stop(fleet: subprocess.Popen) -> int:
    if fleet.poll() is None:
        fleet.send_signal(signal.SIGTERM)
    return fleet.wait(timeout=30)


def query(url: str, sql: str, *params):
    with psycopg.connect(url, autocommit=True) as conn:
        cursor = conn.execute(sql, params or None)
        return cursor.fetchall() if cursor.description else None


def cpu_seconds(pid: int) -> float:
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (float(fields[11]) + float(fields[12])) / os.sysconf("SC_CLK_TCK")


def counters(url: str) -> tuple[int, int, int, int]:
    """(server commits of this database, lease history rows, audit rows, change counters)."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SELECT pg_stat_clear_snapshot()")
        commits = conn.execute(
            "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()"
        ).fetchone()[0]
        rows = conn.execute(
            "SELECT (SELECT count(*) FROM lease_history), (SELECT count(*) FROM audit), "
            "(SELECT coalesce(sum(changes), 0) FROM inboxes)"
        ).fetchone()
    return (commits, *rows)


def watch_idle(url: str, fleet: subprocess.Popen, what: str) -> None:
    """Watch an idle fleet for IDLE_SECONDS: a few commits a second at most (its looks),
    no lease history, no audit entry, no change to any inbox. Printed: the figures."""
    wait_for(lambda: fleet.poll() is not None or time.sleep(1.5) or True, 5, what="settling")
    assert fleet.poll() is None, "the fleet ended"
    before, cpu_before, started = counters(url), cpu_seconds(fleet.pid), time.monotonic()
    time.sleep(IDLE_SECONDS)  # the window counted (nothing asserted about its length)
    after, cpu_after, elapsed = counters(url), cpu_seconds(fleet.pid), time.monotonic() - started
    commits, history, audit, changes = (a - b for a, b in zip(after, before, strict=True))
    print(
        f"\n{what}: {elapsed:.1f} s idle: {commits} server commits ({commits / elapsed:.1f}/s), "
        f"{history} lease history rows, {audit} audit rows, {changes} inbox changes; "
        f"fleet CPU {cpu_after - cpu_before:.3f} s"
    )
    assert commits / elapsed < MAX_IDLE_COMMITS_PER_SECOND, f"{commits} commits: it spins"
    assert (history, audit, changes) == (0, 0, 0)


async def make_inbox(url: str, name: str = "a", **settings) -> Inbox:
    box = await Inbox.open(url, name=name)
    if settings:
        await box.configure(**settings)
    return box


# --- everything due gets done ---------------------------------------------------------------


def test_a_reply_held_behind_the_gap_is_sent_when_the_gap_ends(pg, tmp_path):
    url = pg.new_database()
    sent = tmp_path / "sent"

    async def setup() -> None:
        box = await make_inbox(url, outbox_gap=3)
        await box.ingest("chat", "m1")
        await box.close()

    asyncio.run(setup())
    fleet = start_fleet(url, tmp_path, "--file", str(sent))
    try:
        wait_for(lambda: sent.exists() and "reply m1" in sent.read_text(), 20, what="m1's reply")
        assert onwatch("ingest", url, "chat", "m2", "--inbox", "a").returncode == 0
        # m2's reply is held until the gap ends; no event comes after it.
        wait_for(lambda: "reply m2" in sent.read_text(), 20, what="the held reply")
    finally:
        assert stop(fleet) == 0, (tmp_path / "fleet.err").read_text()
    assert query(url, "SELECT status, count(*) FROM outbox GROUP BY 1") == [("sent", 2)]


def test_a_failed_send_is_retried_without_another_event(pg, tmp_path):
    url = pg.new_database()
    sent, tries = tmp_path / "sent", tmp_path / "tries"
    # The channel is down for its first three sends (the first two within the visit
    # that ran m1, the third on the next).
    command = f"echo x >> {tries}; test $(wc -l < {tries}) -gt 3 || exit 1; cat >> {sent}"

    async def setup() -> None:
        box = await make_inbox(url)
        await box.ingest("chat", "m1")
        await box.close()

    asyncio.run(setup())
    fleet = start_fleet(url, tmp_path, "--command", command)
    try:
        wait_for(tries.exists, 20, what="the first, failing, send")
        wait_for(lambda: sent.exists() and "reply m1" in sent.read_text(), 60, what="the retry")
    finally:
        assert stop(fleet) == 0, (tmp_path / "fleet.err").read_text()
    assert query(url, "SELECT status, attempts FROM deliveries") == [("sent", 4)]


def test_quiet_inboxes_are_served_while_busy_ones_still_have_a_backlog(pg, tmp_path):
    """At --concurrency 2, two inboxes with 1,000 pending events each and 20 inboxes with
    one: every quiet inbox is served long before the busy ones are through (a busy inbox
    gives its slot back after its share while others wait). Printed: the quiet inboxes'
    waits, from the event's commit to its run."""
    url = pg.new_database()

    async def setup() -> None:
        for b in range(2):
            box = await make_inbox(url, f"busy-{b}", max_batch=1)
            await box.ingest_batch([("chat", f"busy-{b}/{k}", None) for k in range(1000)])
            await box.close()
        for q in range(20):
            box = await make_inbox(url, f"quiet-{q:02d}")
            await box.ingest("chat", f"quiet-{q:02d}/1")
            await box.close()

    asyncio.run(setup())
    fleet = start_fleet(url, tmp_path, "--concurrency", "2", "--no-dispatch", agent="timed")
    ledger = tmp_path / "ledger"

    def quiet_runs() -> list[dict]:
        if not ledger.exists():
            return []
        runs = [json.loads(line) for line in ledger.read_text().splitlines()]
        return [r for r in runs if r["inbox"].startswith("quiet")]

    try:
        wait_for(lambda: len(quiet_runs()) == 20, 60, interval=0.2, what="every quiet inbox")
        backlog = query(
            url,
            "SELECT i.name, c.n FROM event_counts c JOIN inboxes i ON i.id = c.inbox_id "
            "WHERE c.status = 'pending' AND i.name LIKE 'busy-%' ORDER BY 1",
        )
    finally:
        assert stop(fleet) == 0, (tmp_path / "fleet.err").read_text()
    waits = sorted(r["began"] - r["created"] for r in quiet_runs())
    print(
        f"\nquiet inboxes served after {waits[0]:.2f}–{waits[-1]:.2f} s "
        f"(median {waits[len(waits) // 2]:.2f} s); busy backlog then: {backlog}"
    )
    assert all(pending > 500 for _, pending in backlog), backlog


# --- nothing spins ----------------------------------------------------------------------------


def test_no_spin_while_a_predecessor_under_the_same_holder_name_holds_a_live_lease(pg, tmp_path):
    url = pg.new_database()

    async def setup() -> None:
        box = await make_inbox(url, lease_ttl=8)
        await box.ingest("chat", "m1")
        assert await box.acquire("fleet", fresh=True) == 1  # a predecessor, now dead
        await box.close()

    asyncio.run(setup())
    fleet = start_fleet(url, tmp_path, "--no-dispatch")
    try:
        watch_idle(url, fleet, "same holder, live lease")
        # Once the dead predecessor's lease lapses, the inbox is served.
        wait_for(lambda: query(url, "SELECT status FROM events") == [("done",)], 20, what="m1 done")
    finally:
        assert stop(fleet) == 0, (tmp_path / "fleet.err").read_text()
    assert [h[0] for h in query(url, "SELECT how FROM lease_history ORDER BY gen")] == [
        "first",
        "takeover",
    ]


def test_no_spin_on_a_timer_the_scheduler_set_aside(pg, tmp_path):
    url = pg.new_database()

    async def setup() -> None:
        box = await make_inbox(url)
        await box.add_timer("daily", box.now() - 60, {"x": 1}, every=86_400)
        await box.close()
        query(url, "UPDATE timers SET payload = '{not json'")  # damaged by hand
        box = await make_inbox(url)
        await box.run_scheduler()
        await box.close()

    asyncio.run(setup())
    assert query(url, "SELECT broken IS NOT NULL, due < extract(epoch FROM now()) FROM timers") == [
        (True, True)
    ]
    fleet = start_fleet(url, tmp_path, "--no-dispatch")
    try:
        watch_idle(url, fleet, "set-aside timer due in the past")
    finally:
        assert stop(fleet) == 0, (tmp_path / "fleet.err").read_text()


def test_no_spin_while_the_runs_per_day_budget_is_used_up(pg, tmp_path):
    url = pg.new_database()

    async def setup() -> None:
        box = await make_inbox(url, max_runs_per_day=1)
        await box.ingest("chat", "m1")
        gen = await box.acquire("setup")
        batch = await box.claim_batch("setup", gen)
        assert await box.finish("setup", gen, [e.id for e in batch])
        await box.release("setup", gen)
        await box.ingest_batch([("chat", "m2", None), ("chat", "m3", None)])
        await box.close()

    asyncio.run(setup())
    fleet = start_fleet(url, tmp_path, "--no-dispatch")
    try:
        watch_idle(url, fleet, "runs-per-day budget used up")
    finally:
        assert stop(fleet) == 0, (tmp_path / "fleet.err").read_text()
    assert query(url, "SELECT count(*) FROM events WHERE status = 'pending'") == [(2,)]


def test_the_look_reads_the_runs_per_day_budget_as_the_claim_does(pg):
    """No budget (the stored null), a budget with room left, a budget used up: the look
    returns the first two (read with and without its regular expression), not the third."""
    from onwatch.core.pg.fleet import Looker

    url = pg.new_database()

    async def setup() -> None:
        for name, budget in (("free", None), ("room", 2), ("spent", 1)):
            box = await make_inbox(url, name)
            if budget is not None:
                await box.configure(max_runs_per_day=budget)
            await box.ingest("chat", "m1")
            gen = await box.acquire("setup")
            batch = await box.claim_batch("setup", gen)
            assert await box.finish("setup", gen, [e.id for e in batch])
            await box.release("setup", gen)
            await box.ingest("chat", "m2")
            await box.close()

    asyncio.run(setup())
    looker = Looker(url)
    try:
        found = looker.with_work(10, taken=[], resting={}, sends=False)
    finally:
        looker.close()
    assert sorted(candidate.name for candidate in found) == ["free", "room"]


def test_the_look_holds_the_fleet_workers_lock_while_its_connection_lives(pg):
    """What the fleet desk counts as a connected fleet worker (core/pg/summaries.py): each
    Looker's connection holds the lock, shared; a closed one lets go; one cut under it takes
    the lock again with the connection it opens at the next look; a fleet worker of another
    database is not counted."""
    from onwatch.core.pg.fleet import Looker
    from onwatch.core.pg.summaries import fleet_workers

    url, other = pg.new_database(), pg.new_database()
    first, second, elsewhere = Looker(url), Looker(url), Looker(other)
    try:
        with psycopg.connect(url, autocommit=True) as desk:
            assert fleet_workers(desk) == (0, 0)
            first.check()
            second.with_work(10, taken=[], resting={}, sends=False)
            elsewhere.check()
            assert fleet_workers(desk) == (2, 0)
            second.close()  # its server process ends, and lets go, a moment after
            wait_for(
                lambda: fleet_workers(desk) == (1, 0), timeout=10, what="the closed one let go"
            )
            assert first.conn is not None
            desk.execute("SELECT pg_terminate_backend(%s)", (first.conn.info.backend_pid,))
            wait_for(lambda: fleet_workers(desk) == (0, 0), timeout=10, what="the cut session gone")
            with pytest.raises(psycopg.OperationalError):  # the look that finds it cut
                first.with_work(10, taken=[], resting={}, sends=False)
            first.with_work(10, taken=[], resting={}, sends=False)
            assert fleet_workers(desk) == (1, 0)
    finally:
        for looker in (first, second, elsewhere):
            looker.close()


def test_an_idle_fleet_worker_looks_at_least_every_few_seconds_whatever_its_poll(pg, monkeypatch):
    """Its look is what tells the desk it is alive (a silent one is flagged): with a poll
    interval of an hour and nothing to do, it still looks every LOOK_AT_LEAST_EVERY
    (shortened here), and its look's session is never idle for longer than that."""
    from onwatch.core.pg.fleet import Looker
    from onwatch.core.runtime import fleet_worker

    monkeypatch.setattr(fleet_worker, "LOOK_AT_LEAST_EVERY", 0.2)
    url = pg.new_database()
    looks = 0
    real = Looker.with_work

    def counted(self, *args, **kwargs):
        nonlocal looks
        looks += 1
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Looker, "with_work", counted)

    async def agent(batch, ctx) -> None:
        pass

    async def main() -> None:
        fleet = fleet_worker.FleetWorker(
            url, agent, holder="fleet", concurrency=2, poll_interval=3600
        )
        task = asyncio.create_task(fleet.run())
        try:
            for _ in range(3000):
                if looks >= 5 or task.done():
                    break
                await asyncio.sleep(0.01)
            assert looks >= 5, f"{looks} looks"
        finally:
            fleet.request_stop()
            await asyncio.wait_for(task, 30)

    asyncio.run(main())


def test_an_idle_fleet_worker_does_not_look_at_each_notify_of_another_schema(pg, monkeypatch):
    """Two schemas of one database, an inbox `support` in each: while events pour into the
    other schema one at a time, an idle fleet worker on this one looks a few times (its
    poll), not once per event (every schema sent on one channel: 916 looks for 2,000 events
    of the other schema). It still wakes at once for its own."""
    from onwatch.core.pg.fleet import Looker
    from onwatch.core.runtime.fleet_worker import FleetWorker

    here, there = pg.new_schema(), pg.new_schema()
    looks, ran = 0, []
    real = Looker.with_work

    def counted(self, *args, **kwargs):
        nonlocal looks
        looks += 1
        return real(self, *args, **kwargs)

    async def agent(batch, ctx) -> None:
        ran.extend(e.source_id for e in batch)

    async def main() -> int:
        for url in (here, there):
            await (await make_inbox(url, "support", max_batch=1)).close()
        fleet = FleetWorker(here, agent, holder="fleet", concurrency=2)
        task = asyncio.create_task(fleet.run())
        try:
            async with await Inbox.open(there, name="support") as other:
                await other.ingest("chat", "warm-up", None)
                await asyncio.sleep(0.5)  # the fleet started, and looked
                before = looks
                for k in range(300):
                    await other.ingest("chat", f"m{k}", None)
                during = looks - before
            async with await Inbox.open(here, name="support") as mine:
                await mine.ingest("chat", "mine", None)
            for _ in range(1000):
                if ran or task.done():
                    break
                await asyncio.sleep(0.01)
            assert ran == ["mine"]
            return during
        finally:
            fleet.request_stop()
            await asyncio.wait_for(task, 30)

    monkeypatch.setattr(Looker, "with_work", counted)
    during = asyncio.run(main())
    assert during < 30, f"{during} looks while 300 events came into the other schema"


@pytest.mark.parametrize("committed", [False, True], ids=["not committed", "committed"])
def test_a_lost_answer_to_its_own_release_neither_spins_nor_delays_the_next_event(pg, committed):
    """The release is cut off (the connection lost under it, before or after its commit):
    the fleet remembers the generation, releases again, and the next event is served at
    once, not after the lease's TTL (120 s); meanwhile it does not spin."""
    from onwatch.core.pg.db import ConnectionLost
    from onwatch.core.runtime.fleet_worker import FleetWorker

    url = pg.new_database()
    ran: list[str] = []

    async def agent(batch, ctx) -> None:
        ran.extend(e.source_id for e in batch)

    async def main() -> None:
        box = await make_inbox(url)
        await box.ingest("chat", "m1")
        original, cut = Inbox.release, []

        async def release(self, holder, gen, **kwargs):
            if not cut:  # the first release: its answer is lost
                cut.append(gen)
                if committed:
                    await original(self, holder, gen, **kwargs)
                raise ConnectionLost("lost the connection to PostgreSQL (test)")
            return await original(self, holder, gen, **kwargs)

        Inbox.release = release
        fleet = FleetWorker(url, agent, holder="fleet", concurrency=2)
        task = asyncio.create_task(fleet.run())
        try:
            for _ in range(200):
                if ran == ["m1"] and cut:
                    break
                await asyncio.sleep(0.05)
            assert ran == ["m1"] and cut
            before = counters(url)
            await asyncio.sleep(IDLE_SECONDS)  # the window counted
            after = counters(url)
            commits, history, audit, _ = (a - b for a, b in zip(after, before, strict=True))
            print(f"\nafter a lost release answer: {commits} commits in {IDLE_SECONDS} s")
            assert commits / IDLE_SECONDS < MAX_IDLE_COMMITS_PER_SECOND
            assert (history, audit) == (0, 0)
            await box.ingest("chat", "m2")
            for _ in range(200):  # bounded: 10 s, far below the lease's 120 s
                if ran == ["m1", "m2"]:
                    break
                await asyncio.sleep(0.05)
            assert ran == ["m1", "m2"]
        finally:
            Inbox.release = original
            fleet.request_stop()
            await task
            await box.close()

    asyncio.run(main())


def test_a_kept_lease_is_taken_up_again_and_holds_no_connection_meanwhile(pg):
    """Five inboxes, two slots, a share of nothing: every visit gives its slot back after
    one run and keeps its lease. The next visit of the inbox takes the generation up again
    (fewer lease history rows than visits, every event run once), and while the lease is
    kept its inbox is not open: no connection thread of it lives (its connection went back
    to the pool for whichever visit comes next). Sampled every 10 ms; a lease kept for
    less than `kept_for` seconds may still be closing its inbox."""
    import threading

    from onwatch.core.runtime.fleet_worker import FleetWorker

    kept_for = 0.3
    url = pg.new_database()
    names = [f"k{n}" for n in range(5)]
    ran: list[tuple[str, str]] = []

    async def agent(batch, ctx) -> None:
        ran.extend((e.source_id.split("/")[0], e.source_id) for e in batch)
        await asyncio.sleep(0.1)

    async def main() -> None:
        for name in names:
            box = await make_inbox(url, name, max_batch=1)
            await box.ingest_batch([("chat", f"{name}/{k}", None) for k in range(3)])
            await box.close()
        fleet = FleetWorker(url, agent, holder="fleet", concurrency=2, share=0.0)
        task = asyncio.create_task(fleet.run())
        kept_seen: set[str] = set()
        open_while_kept: list[str] = []
        try:
            for _ in range(3000):
                if len(ran) == 15 or task.done():
                    break
                alive = {t.name for t in threading.enumerate()}
                now = fleet._looker.now()
                for name, kept in list(fleet._kept.items()):
                    kept_seen.add(name)
                    if (
                        name not in fleet._workers
                        and now - kept.since > kept_for
                        and f"onwatch-pg-{name}" in alive
                    ):
                        open_while_kept.append(name)
                await asyncio.sleep(0.01)
        finally:
            fleet.request_stop()
            await task
        history = query(url, "SELECT count(*) FROM lease_history")[0][0]
        print(
            f"\n{fleet.visits} visits, {history} lease history rows, kept: {sorted(kept_seen)}; "
            f"samples of a kept lease's inbox still open: {len(open_while_kept)}"
        )
        assert sorted(ran) == sorted((n, f"{n}/{k}") for n in names for k in range(3))
        assert kept_seen and history < fleet.visits
        assert open_while_kept == []

    asyncio.run(main())


def test_the_visits_share_a_few_sessions_whatever_the_concurrency(pg):
    """Ten inboxes served ten at once over two shared connections: every event runs once,
    and the server never has more than four sessions of the fleet (the two shared, the
    look's and the listener's), where each visit held one of its own before."""
    from onwatch.core.runtime.fleet_worker import FleetWorker
    from tests.pg.test_shared import Sampler

    url = pg.new_database()
    names = [f"c{n}" for n in range(10)]
    ran: list[str] = []

    async def agent(batch, ctx) -> None:
        ran.extend(e.source_id for e in batch)
        await asyncio.sleep(0.02)

    async def main() -> None:
        for name in names:
            box = await make_inbox(url, name, max_batch=1)
            await box.ingest_batch([("chat", f"{name}/{k}", None) for k in range(8)])
            await box.close()
        fleet = FleetWorker(url, agent, holder="fleet", concurrency=10, connections=2)
        with Sampler(url) as sampler:
            task = asyncio.create_task(fleet.run())
            try:
                for _ in range(3000):
                    if len(ran) == 80 or task.done():
                        break
                    await asyncio.sleep(0.01)
            finally:
                fleet.request_stop()
                await task
        print(f"\nsessions at most {sampler.most}; {fleet.visits} visits")
        assert sorted(ran) == sorted(f"{n}/{k}" for n in names for k in range(8))
        assert fleet.visits >= 10
        assert sampler.most <= 4

    asyncio.run(main())


def test_a_kept_lease_whose_inbox_cannot_be_opened_again_is_released_not_left_to_lapse(pg):
    """The visit that would take a kept lease up cannot open its inbox (the server refused
    the connection, say): the generation is released as soon as an open succeeds, not
    left for the lease's TTL (120 s) to end, and every event is run once."""
    from onwatch.core.errors import InboxError
    from onwatch.core.runtime.fleet_worker import FleetWorker

    url = pg.new_database()
    ran: list[str] = []

    async def agent(batch, ctx) -> None:
        ran.extend(e.source_id for e in batch)
        await asyncio.sleep(0.1)

    async def main() -> None:
        for name in ("a", "b"):
            box = await make_inbox(url, name, max_batch=1)
            await box.ingest_batch([("chat", f"{name}/{k}", None) for k in range(2)])
            await box.close()
        fleet = FleetWorker(url, agent, holder="fleet", concurrency=1, share=0.0)
        original = Inbox.open.__func__
        kept: list[tuple[str, int]] = []  # the first lease kept: (inbox, generation)
        refused: list[str] = []

        async def open_(cls, *args, **kwargs):
            if kept and kwargs.get("name") == kept[0][0] and not refused:
                refused.append(kept[0][0])  # the open that would take it up
                raise InboxError("cannot connect (test)")
            return await original(cls, *args, **kwargs)

        def released() -> int | None:
            return query(url, "SELECT released_gen FROM inboxes WHERE name = %s", kept[0][0])[0][0]

        Inbox.open = classmethod(open_)
        task = asyncio.create_task(fleet.run())
        try:
            for _ in range(1000):
                if not kept and fleet._kept:
                    kept.append(next((n, k.gen) for n, k in fleet._kept.items()))
                if refused and released() == kept[0][1]:
                    break
                await asyncio.sleep(0.01)
            assert refused and released() == kept[0][1], (kept, refused)
            print(f"\nkept {kept[0]}, its take-up refused, released")
            for _ in range(600):  # the refused inbox rests (10 s at most), then is served
                if len(ran) == 4:
                    break
                await asyncio.sleep(0.05)
        finally:
            Inbox.open = classmethod(original)
            fleet.request_stop()
            await task
        assert sorted(ran) == ["a/0", "a/1", "b/0", "b/1"]

    asyncio.run(main())


def test_a_visit_that_runs_its_inbox_dry_looks_for_work_once_per_run_and_once_more(pg):
    """Each finish claims the next run in its own transaction; the one that finds nothing
    ends the visit. The visit does not claim again at once (that would fire no timer
    either: its claims fire them at most once a second), so a visit of N runs reads the
    inbox's events N + 1 times."""
    from onwatch.core.runtime.fleet_worker import FleetWorker

    url = pg.new_database()
    ran: list[str] = []
    looks: list[str] = []
    execute = psycopg.Connection.execute

    def counted(self, query, *args, **kwargs):
        text = str(query)
        if text.startswith("PREPARE"):
            pass  # a session statement prepared, not run
        elif "status = 'pending' AND attempts = 0" in text or any(
            f"EXECUTE {name}(" in text
            for name in ("onwatch_look", "onwatch_finish", "onwatch_take", "onwatch_finish_take")
        ):
            # A claim's look: alone, with the lock, with a finish, or with the claim made
            # with the lock (after a finish or not).
            looks.append(text)
        return execute(self, query, *args, **kwargs)

    async def agent(batch, ctx) -> None:
        ran.extend(e.source_id for e in batch)

    async def main() -> None:
        box = await make_inbox(url, max_batch=1)
        await box.ingest_batch([("chat", f"m{k}", None) for k in range(3)])
        fleet = FleetWorker(url, agent, holder="fleet", concurrency=1)
        psycopg.Connection.execute = counted
        task = asyncio.create_task(fleet.run())
        try:
            for _ in range(200):
                if len(ran) == 3 and fleet.visits == 1 and not fleet._workers:
                    break
                await asyncio.sleep(0.05)
        finally:
            psycopg.Connection.execute = execute
            fleet.request_stop()
            await task
            await box.close()
        assert ran == ["m0", "m1", "m2"] and fleet.visits == 1
        assert len(looks) == 4, f"{len(looks)} looks for 3 runs"

    asyncio.run(main())


def test_a_database_migrated_by_a_newer_onwatch_under_a_running_fleet_stops_it(pg, tmp_path):
    url = pg.new_database()

    async def setup() -> None:
        box = await make_inbox(url)
        await box.close()

    asyncio.run(setup())
    fleet = start_fleet(url, tmp_path, "--no-dispatch")
    try:
        wait_for(
            lambda: (
                query(
                    url,
                    "SELECT count(*) FROM pg_stat_activity WHERE "
                    "query LIKE 'LISTEN%' AND datname = current_database()",
                )[0][0]
                > 0
                or fleet.poll() is not None
            ),
            20,
            what="the fleet listening",
        )
        query(url, "UPDATE onwatch_schema SET version = version + 1")
        # Work only a newer onwatch could have written: the fleet must not serve it.
        query(
            url,
            "INSERT INTO events(inbox_id, id, source, source_id, payload, available_at, "
            "created, updated) SELECT id, 1, 'chat', 'm1', 'null', 0, 0, 0 FROM inboxes",
        )
        code = fleet.wait(timeout=30)
    finally:
        stop(fleet)
    err = (tmp_path / "fleet.err").read_text()
    assert code == 2, err
    assert "written by a newer onwatch" in err and "upgrade" in err
    assert query(url, "SELECT status FROM events") == [("pending",)]


# --- it refuses what it cannot serve -----------------------------------------------------------


def _database(pg, kind: str) -> str:
    if kind == "missing":
        return pg.url("onwatch_no_such_database")
    if kind == "empty":
        return pg.new_database(schema=False)
    url = pg.new_database()

    async def create() -> None:
        await (await make_inbox(url)).close()

    asyncio.run(create())  # an inbox "a", for the single-inbox worker
    if kind == "foreign":
        query(url, "DROP TABLE onwatch_schema CASCADE")
        query(url, "CREATE TABLE customers (id int)")
    elif kind == "newer":
        query(url, "UPDATE onwatch_schema SET version = version + 1")
    elif kind == "read-only":  # what a read replica's URL gives
        name = psycopg.conninfo.conninfo_to_dict(url)["dbname"]
        query(url, f'ALTER DATABASE "{name}" SET default_transaction_read_only = on')
    elif kind == "no privileges":
        query(
            url,
            "DO $$ BEGIN CREATE ROLE onwatch_reader LOGIN; "
            "EXCEPTION WHEN duplicate_object THEN NULL; END $$",
        )
        query(url, "GRANT SELECT ON ALL TABLES IN SCHEMA public TO onwatch_reader")
        return url.replace("postgres@", "onwatch_reader@", 1)
    return url


@pytest.mark.parametrize(
    "kind, code, words",
    [
        ("missing", 1, "does not exist"),
        ("empty", 2, "no onwatch database"),
        ("foreign", 2, "not an onwatch database"),
        ("newer", 2, "written by a newer onwatch"),
        ("no privileges", 1, "lacks privileges"),
        ("read-only", 1, "its transactions are read-only (a standby server"),
    ],
)
def test_a_database_it_cannot_serve_is_refused_at_start(pg, tmp_path, kind, code, words):
    url = _database(pg, kind)
    agent = ["--agent", "tests.pg.actors:replier", "--no-dispatch"]
    fleet = onwatch("worker", url, "--all-inboxes", *agent, timeout=30)
    single = onwatch("worker", url, "--inbox", "a", *agent, timeout=30)
    assert fleet.returncode == code, fleet.stderr
    assert words in fleet.stderr, fleet.stderr
    assert single.returncode == code, single.stderr  # the single-inbox worker's code
    assert len(fleet.stderr.strip().splitlines()) == 1, fleet.stderr  # one clear line


# --- inbox names come from outside -------------------------------------------------------------


def test_an_inbox_name_cannot_forge_a_log_line(pg, tmp_path):
    url = pg.new_database()
    name = "evil\n2026-01-01 00:00:00,000 onwatch-worker ERROR forged \x1b[31mred"

    async def setup() -> None:
        box = await make_inbox(url, name, max_attempts=1)
        await box.ingest("chat", "m1")
        await box.close()

    asyncio.run(setup())
    fleet = start_fleet(url, tmp_path, "--no-dispatch", "--log-level", "debug", agent="failing")
    try:
        wait_for(lambda: query(url, "SELECT status FROM events") == [("dead",)], 20, what="m1 dead")
    finally:
        assert stop(fleet) == 0
    err = (tmp_path / "fleet.err").read_text()
    assert "evil\\n2026" in err  # named, escaped
    assert not any(line.startswith("2026-01-01 00:00:00,000") for line in err.splitlines())
    assert "\x1b" not in err


def test_each_line_of_a_visit_names_its_inbox(pg, tmp_path):
    """A fleet serves many inboxes at once: "run 1 finished: done" said for each of them
    could not tell whose run it was. A visit's lines start with its inbox's name (a % in it
    kept as it is), and its start and lease, two lines per visit, are said at debug level."""
    url = pg.new_database()
    names = ["alpha", "50%off"]

    async def setup() -> None:
        for name in names:
            box = await make_inbox(url, name)
            await box.ingest("chat", "m1")
            await box.close()

    asyncio.run(setup())
    fleet = start_fleet(url, tmp_path, "--no-dispatch", "--log-level", "info")
    try:
        wait_for(
            lambda: query(url, "SELECT count(*) FROM events WHERE status = 'done'") == [(2,)],
            20,
            what="both events done",
        )
    finally:
        assert stop(fleet) == 0
    err = (tmp_path / "fleet.err").read_text()
    finished = [line for line in err.splitlines() if " finished: done" in line]
    said = sorted(re.sub(r"run \d+", "run N", line.split(" INFO ", 1)[1]) for line in finished)
    assert said == ["inbox 50%off: run N finished: done", "inbox alpha: run N finished: done"], err
    assert err.count("started on") == 1 and "fleet worker fleet started on" in err, err
    assert "lease acquired" not in err, err
