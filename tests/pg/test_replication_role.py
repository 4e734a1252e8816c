"""A role or database whose sessions start with session_replication_role = replica.

That is a logical replication apply worker's mode, and a bulk load's: PostgreSQL then fires
no ordinary trigger and checks no foreign key. onwatch's sessions took it as they found it,
so its triggers stopped without a word: the event counts no longer moved, no NOTIFY woke a
worker, and an inbox's row could be deleted under its events. Now each session takes
`origin` back where the role may, and is refused, saying why, where it may not.
"""

from __future__ import annotations

import psycopg
import pytest

from onwatch.core import Inbox, InboxError
from onwatch.core.pg.listen import Listener
from tests.worker.helpers import onwatch

pytestmark = pytest.mark.slow


async def test_a_database_set_to_replica_still_counts_and_wakes(pg):
    url = pg.new_database()
    name = psycopg.conninfo.conninfo_to_dict(url)["dbname"]
    with psycopg.connect(url, autocommit=True) as admin:
        admin.execute(f'ALTER DATABASE "{name}" SET session_replication_role = replica')
    async with await Inbox.open(url, name="a") as inbox:
        listener = await Listener.open(url)
        try:
            seen = listener.seen("a")
            assert await inbox.ingest("chat", "m1", {"text": "hi"})
            assert await listener.wait("a", seen, timeout=5), "no NOTIFY: the trigger did not fire"
        finally:
            await listener.close()
        assert (await inbox.counts()).get("pending") == 1


async def test_a_role_that_may_not_set_it_back_is_refused_saying_why(pg, tmp_path):
    url = pg.new_database(schema=False)
    with psycopg.connect(url, autocommit=True) as admin:
        admin.execute(
            "DO $$ BEGIN CREATE ROLE onwatch_replica LOGIN; "
            "EXCEPTION WHEN duplicate_object THEN NULL; END $$"
        )
        admin.execute("ALTER ROLE onwatch_replica SET session_replication_role = replica")
        admin.execute("GRANT CREATE ON SCHEMA public TO onwatch_replica")
    as_role = url.replace("postgres@", "onwatch_replica@", 1)
    with pytest.raises(InboxError, match="session_replication_role is replica"):
        await Inbox.open(as_role, name="a")
    done = onwatch("init", as_role, "--inbox", "a", test_dir=tmp_path)
    assert done.returncode not in (0, 3), (done.stdout, done.stderr)
    assert "session_replication_role is replica" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    with psycopg.connect(url, autocommit=True) as admin:
        tables = admin.execute(
            "SELECT count(*) FROM pg_tables WHERE schemaname = 'public'"
        ).fetchone()
    assert tables == (0,)  # nothing was created
