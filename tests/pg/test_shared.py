"""Inboxes that share connections (core/pg/shared.py): each job takes a session for its
duration, so many inboxes served at once keep at most `limit` sessions on the server; a job
that finds them all taken waits, and past the busy timeout fails as a busy inbox does,
having changed nothing."""

from __future__ import annotations

import asyncio
import threading
import time

import psycopg
import pytest

from onwatch.core import Inbox, InboxBusy
from onwatch.core.pg.shared import Connections

pytestmark = pytest.mark.slow


def sessions(url: str, admin: psycopg.Connection) -> int:
    """Client sessions on the test's database, other than `admin` itself."""
    database = psycopg.conninfo.conninfo_to_dict(url)["dbname"]
    return admin.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()"
        " AND backend_type = 'client backend'",
        (database,),
    ).fetchone()[0]


class Sampler:
    """The most sessions seen on the database beyond those there as it began, sampled every
    5 ms on a thread."""

    def __init__(self, url: str) -> None:
        self.url, self.most, self._stop = url, 0, threading.Event()
        with psycopg.connect(url, autocommit=True) as admin:
            self.before = sessions(url, admin)  # already there (idle ones kept by a pool)
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def __enter__(self) -> "Sampler":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _sample(self) -> None:
        with psycopg.connect(self.url, autocommit=True) as admin:
            while not self._stop.is_set():
                self.most = max(self.most, sessions(self.url, admin) - self.before)
                time.sleep(0.005)


async def open_all(url: str, names: list[str], shared: Connections) -> list[Inbox]:
    return [await Inbox.open(url, name=name, connections=shared) for name in names]


def test_many_inboxes_at_once_keep_at_most_the_limit_of_sessions(pg):
    """Twelve inboxes taking 30 events each at once, one at a time each (every ingest a
    job), over three shared connections: every event stored once, never more than three
    sessions on the server, and three opened in all (each job took an idle one)."""
    url = pg.new_database()
    names = [f"s{n}" for n in range(12)]
    shared = Connections(url, limit=3)

    async def main() -> None:
        boxes = await open_all(url, names, shared)
        with Sampler(url) as sampler:

            async def fill(box: Inbox) -> None:
                for k in range(30):
                    await box.ingest("chat", f"{box.name}/{k}")

            await asyncio.gather(*(fill(box) for box in boxes))
        for box in boxes:
            assert (await box.overview()).counts["pending"] == 30
            await box.close()
        shared.close()
        print(f"\nsessions at most {sampler.most}, opened {shared.opened}")
        assert 1 <= sampler.most <= 3
        assert shared.opened <= 3

    asyncio.run(main())


def test_a_job_waits_for_a_taken_connection_and_past_the_busy_timeout_changes_nothing(pg):
    """Both shared connections taken (as by two long transactions of other inboxes): an
    ingest waits for one. Given back in time, it commits; held past the busy timeout, it
    fails as a busy inbox does (InboxBusy, saying why) and stores nothing."""
    url = pg.new_database()
    shared = Connections(url, limit=2, busy_timeout=1.0)

    async def main() -> None:
        box = await Inbox.open(url, name="c", busy_timeout=1.0, connections=shared)
        for hold, busy in ((0.3, False), (2.0, True)):
            taken = [shared.take(0) for _ in range(2)]  # None: a slot reserved, unopened
            ingest = asyncio.ensure_future(box.ingest("chat", f"held-{hold}"))
            await asyncio.sleep(hold)
            assert ingest.done() is busy
            for conn in taken:
                shared.give(conn)
            if busy:
                with pytest.raises(InboxBusy, match="connections to PostgreSQL stayed busy"):
                    await ingest
            else:
                assert await ingest
        assert (await box.overview()).counts["pending"] == 1  # the first round's only
        assert await box.ingest("chat", "after")  # every slot was given back
        await box.close()
        shared.close()

    asyncio.run(main())


def test_a_shared_session_lost_while_idle_costs_one_retry_and_nothing_twice(pg):
    """The server ends every idle shared session (a restart, an idle timeout): the next job
    meets the dead session and fails as a lost connection does (try again); the retry takes
    a new session and commits once."""
    url = pg.new_database()
    shared = Connections(url, limit=2)

    async def main() -> None:
        box = await Inbox.open(url, name="a", connections=shared)
        await box.ingest("chat", "before")
        with psycopg.connect(url, autocommit=True) as admin:
            database = psycopg.conninfo.conninfo_to_dict(url)["dbname"]
            admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s"
                " AND pid <> pg_backend_pid() AND backend_type = 'client backend'",
                (database,),
            )
        for _ in range(3):
            try:
                await box.ingest("chat", "after")
                break
            except Exception as exc:  # noqa: BLE001 - the dead session's one failure
                assert type(exc).__name__ == "ConnectionLost", exc
        counts = (await box.overview()).counts
        assert counts["pending"] == 2
        await box.close()
        shared.close()

    asyncio.run(main())


def test_shared_connections_are_refused_for_a_file_and_another_url(pg, tmp_path):
    url = pg.new_database()
    shared = Connections(url, limit=1)

    async def main() -> None:
        from onwatch.core import BadInput

        with pytest.raises(BadInput, match="PostgreSQL database, not a file"):
            await Inbox.open(tmp_path / "a.db", connections=shared)
        with pytest.raises(BadInput, match="another URL or busy timeout"):
            await Inbox.open(url, name="a", busy_timeout=2.0, connections=shared)
        assert shared.opened == 0

    asyncio.run(main())
    shared.close()


def test_a_wait_for_a_shared_connection_is_not_taken_for_a_silent_server(pg, monkeypatch, caplog):
    """The watch that cuts a connection to a server that stopped answering times a job from
    when it has a connection, not from when it began to wait for one. Here its deadline is
    2 s; an ingest waits 3 s for the only shared connection, then waits for its inbox's row,
    which another session holds. The watch, run then, leaves it alone (no "did not answer",
    no cut), and the ingest commits once the row is free."""
    from onwatch.core.pg import db as pg_db

    busy = 5.0
    monkeypatch.setattr(pg_db, "JOB_GRACE", 2.0 - busy)  # the deadline: busy + JOB_GRACE
    url = pg.new_database()
    shared = Connections(url, limit=1, busy_timeout=busy)

    async def main() -> None:
        box = await Inbox.open(url, name="w", busy_timeout=busy, connections=shared)
        held = shared.take(0)  # the only slot (None: reserved, not opened)
        ingest = asyncio.ensure_future(box.ingest("chat", "waited"))
        await asyncio.sleep(3.0)
        assert not ingest.done()
        locker = psycopg.connect(url)  # a transaction, holding the inbox's row
        watcher = psycopg.connect(url, autocommit=True)  # each look a fresh snapshot
        with locker, watcher:
            locker.execute("SELECT 1 FROM inboxes WHERE name = 'w' FOR UPDATE")
            shared.give(held)
            for _ in range(400):  # the ingest now holds the connection, waiting for the row
                waiting = watcher.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                    " AND datname = current_database()"
                ).fetchone()[0]
                if waiting:
                    break
                await asyncio.sleep(0.025)
            assert waiting, "the ingest never waited for the row"
            box._db._check_overdue()  # the watch, as its timer would run it now
            locker.rollback()
        assert await ingest
        assert (await box.overview()).counts["pending"] == 1
        await box.close()
        shared.close()

    with caplog.at_level("WARNING", logger="onwatch"):
        asyncio.run(main())
    assert not [r for r in caplog.records if "did not answer" in r.getMessage()]
