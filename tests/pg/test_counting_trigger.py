"""The events' counting trigger (core/pg/schema.py, schema 9 `_events_counted`): every
statement that changes events leaves `event_counts` equal to a count of the rows, per inbox
and status, and a row that becomes pending is heard by its inbox's listeners. Since schema
9 an UPDATE moves the counts by one statement of net changes: a status that loses and gains
as many rows in one statement (`running` in a finish that claims the next run) is not
written at all."""

from __future__ import annotations

import psycopg

from onwatch.core import Inbox
from onwatch.core.pg import schema
from onwatch.core.pg.listen import SCHEMA_CHANNEL


def counts(conn: psycopg.Connection) -> dict[tuple[str, str], int]:
    """event_counts, by inbox name and status, leaving out the zeros."""
    rows = conn.execute(
        "SELECT i.name, c.status, c.n FROM event_counts c JOIN inboxes i ON i.id = c.inbox_id"
    ).fetchall()
    return {(name, status): n for name, status, n in rows if n}


def counted(conn: psycopg.Connection) -> dict[tuple[str, str], int]:
    """The same, counted from the events themselves."""
    rows = conn.execute(
        "SELECT i.name, e.status, count(*) FROM events e JOIN inboxes i ON i.id = e.inbox_id "
        "GROUP BY 1, 2"
    ).fetchall()
    return {(name, status): n for name, status, n in rows}


def running_version(conn: psycopg.Connection, name: str) -> str:
    """The row version (xmin) of an inbox's count of running events: it moves when the row
    is written."""
    [(xmin,)] = conn.execute(
        "SELECT c.xmin::text FROM event_counts c JOIN inboxes i ON i.id = c.inbox_id "
        "WHERE i.name = %s AND c.status = 'running'",
        (name,),
    ).fetchall()
    return xmin


async def two_inboxes(url: str) -> None:
    for name in ("a", "b"):
        async with await Inbox.open(url, name=name) as box:
            await box.ingest_batch([("chat", f"{name}{k}", None) for k in range(4)])


def ids(conn: psycopg.Connection, name: str) -> list[int]:
    return [
        r[0]
        for r in conn.execute(
            "SELECT e.id FROM events e JOIN inboxes i ON i.id = e.inbox_id WHERE i.name = %s "
            "ORDER BY e.id",
            (name,),
        )
    ]


async def test_statements_over_several_inboxes_and_statuses_keep_the_counts_exact(url):
    await two_inboxes(url)
    with psycopg.connect(url, autocommit=True) as conn:
        assert counts(conn) == counted(conn) == {("a", "pending"): 4, ("b", "pending"): 4}
        # One statement over both inboxes: each loses pending rows and gains running ones.
        conn.execute("UPDATE events SET status = 'running', claim_gen = 1 WHERE id <= 2")
        assert counts(conn) == counted(conn)
        # One statement moving rows between four statuses, some back to pending.
        conn.execute(
            "UPDATE events SET status = CASE id WHEN 1 THEN 'done' WHEN 2 THEN 'pending' "
            "WHEN 3 THEN 'running' ELSE 'cancelled' END"
        )
        assert counts(conn) == counted(conn)
        conn.execute("UPDATE events SET status = status")  # every row, no status changed
        assert counts(conn) == counted(conn)
        conn.execute("DELETE FROM events WHERE status = 'cancelled'")
        assert counts(conn) == counted(conn)
        assert sum(counts(conn).values()) == 6


async def test_a_finish_that_claims_the_next_run_leaves_the_running_count_unwritten(url):
    await two_inboxes(url)
    with psycopg.connect(url, autocommit=True) as conn:
        first, second = ids(conn, "a")[:2]
        inbox_a = "(SELECT id FROM inboxes WHERE name = 'a')"
        conn.execute(
            f"UPDATE events SET status = 'running' WHERE inbox_id = {inbox_a} AND id = %s",
            (first,),
        )
        before = running_version(conn, "a")
        # One statement: the run's event done, the next one claimed (as onwatch_finish_take).
        conn.execute(
            f"UPDATE events SET status = CASE id WHEN %s THEN 'done' ELSE 'running' END "
            f"WHERE inbox_id = {inbox_a} AND id IN (%s, %s)",
            (first, first, second),
        )
        assert running_version(conn, "a") == before  # one out, one in: not written
        assert counts(conn) == counted(conn)
        assert counts(conn)[("a", "running")] == 1


async def test_the_migration_to_schema_9_replaces_the_trigger_of_schema_8(url):
    with psycopg.connect(url, autocommit=True) as conn:
        schema.migrate(conn, "test", target=8)
    await two_inboxes(url)  # (opening never migrates)
    with psycopg.connect(url, autocommit=True) as conn:
        assert schema.inspect(conn, "test") == 8

        def finish_and_claim(first: int, second: int) -> bool:
            """True if the running count was written by the statement."""
            before = running_version(conn, "b")
            conn.execute(
                "UPDATE events SET status = CASE id WHEN %s THEN 'done' ELSE 'running' END "
                "WHERE inbox_id = (SELECT id FROM inboxes WHERE name = 'b') AND id IN (%s, %s)",
                (first, first, second),
            )
            return running_version(conn, "b") != before

        b = ids(conn, "b")
        conn.execute(
            "UPDATE events SET status = 'running' "
            "WHERE inbox_id = (SELECT id FROM inboxes WHERE name = 'b') AND id = %s",
            (b[0],),
        )
        assert finish_and_claim(b[0], b[1])  # schema 8: counted down, then up
        schema.migrate(conn, "test")
        assert schema.inspect(conn, "test") == schema.SCHEMA_VERSION == 9
        assert not finish_and_claim(b[1], b[2])
        assert counts(conn) == counted(conn)


async def test_a_row_made_pending_is_heard_and_a_claim_is_not(url):
    await two_inboxes(url)
    with psycopg.connect(url, autocommit=True) as listener:
        [(channel,)] = listener.execute(SCHEMA_CHANNEL).fetchall()  # the trigger's channel
        listener.execute(psycopg.sql.SQL("LISTEN {}").format(psycopg.sql.Identifier(channel)))
        with psycopg.connect(url, autocommit=True) as conn:
            first = ids(conn, "a")[0]
            where = "inbox_id = (SELECT id FROM inboxes WHERE name = 'a') AND id = %s"
            conn.execute(f"UPDATE events SET status = 'running' WHERE {where}", (first,))
            listener.execute("SELECT 1")  # takes in what arrived
            assert [n.payload for n in listener.notifies(timeout=0.2)] == []
            conn.execute(f"UPDATE events SET status = 'pending' WHERE {where}", (first,))
            heard = [n.payload for n in listener.notifies(timeout=5, stop_after=1)]
            assert heard == ["a"]
