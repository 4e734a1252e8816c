"""Crash at every statement of every write path, on PostgreSQL (tests/faults' method).

The same write paths as tests/faults/test_fault_injection.py. For each: count its statements
(BEGIN, the inbox's row lock and COMMIT included) in a clean run; then, for every N, set the
same inbox up in a fresh schema, let statement N fail by closing the connection under it (the
process is as good as dead: the server rolls back, no ROLLBACK of ours runs, every later
statement fails too), reopen and check that the inbox's rows are exactly as before and the
invariants hold, and that running the call again converges on the clean run's rows.

What differs from a file, and why the comparison allows it: ids drawn from a sequence (runs,
deliveries, messages, audit, effects) are not given back by a rolled-back transaction, so a
recovered inbox may have gaps where the clean one has none. Rows are compared with those ids
replaced by their rank within the inbox (references included), which is what the rules
promise; event ids count within their inbox and are compared as they are. The inbox's
`changes` column is its change token (one more per changing commit, as PRAGMA data_version
is a file's, which no table holds): a recovery made of more commits moves it further, so it
is left out.
"""

from __future__ import annotations

import dataclasses

import psycopg
import pytest

from onwatch.core import FakeClock, Inbox, InboxError
from onwatch.core.pg import db as pg_db
from tests.faults import test_fault_injection as faults

T = faults.T
SEQUENCED = ("runs", "deliveries", "outbox", "audit", "effects")
REFERENCES = {  # table → {column: the sequenced table it points into}
    "events": {"run_id": "runs"},
    "run_events": {"run_id": "runs"},
    "approvals": {"run_id": "runs"},
    "effects": {"run_id": "runs"},
    "outbox": {"run_id": "runs", "delivery_id": "deliveries"},
    "runs": {},
    "audit": {},
    "deliveries": {},
}


class Faulty(psycopg.Connection):
    """A connection whose N-th statement (once armed) kills it, and every one after fails."""

    armed = False
    fail_at: int | None = None
    count = 0
    dead = False

    @classmethod
    def arm(cls, fail_at: int | None) -> None:
        cls.armed, cls.fail_at, cls.count, cls.dead = True, fail_at, 0, False

    @classmethod
    def disarm(cls) -> None:
        cls.armed = False

    def execute(self, query, params=None, **kwargs):  # type: ignore[override]
        cls = type(self)
        if cls.armed:
            if cls.dead:
                raise psycopg.OperationalError("injected crash: the process is gone")
            cls.count += 1
            if cls.fail_at is not None and cls.count == cls.fail_at:
                cls.dead = True
                self.close()  # the server rolls back whatever was open, as for a dead client
                raise psycopg.OperationalError(
                    f"injected crash at statement {cls.count}: {str(query)[:40]}"
                )
        return super().execute(query, params, **kwargs)


@pytest.fixture
def faulty_connections(monkeypatch):
    def connect(url: str, busy_timeout: float) -> psycopg.Connection:
        conn = Faulty.connect(url, autocommit=True, connect_timeout=10)
        psycopg.Connection.execute(conn, f"SET lock_timeout = {int(busy_timeout * 1000)}")
        return conn

    monkeypatch.setattr(pg_db.Database, "_connect", staticmethod(connect))


async def setup_broken_timer(inbox: Inbox) -> None:
    await faults.setup_scheduler(inbox)
    await inbox.add_timer("hand-edited", T - 10, None, every=60)
    # A row no valid call could write: its next occurrence would overflow a bigint.
    await inbox._db.write(
        lambda tx: tx.execute(
            "UPDATE timers SET every = %s WHERE inbox_id = %s AND id = 'hand-edited'",
            (2**63 - 1, tx.inbox),
        )
    )


PATHS = [p for p in faults.PATHS if p.name not in ("scheduler-sets-a-row-aside",)] + [
    faults.Path("scheduler-sets-a-row-aside", setup_broken_timer, faults.call_scheduler),
]


async def make_base(pg, p: faults.Path) -> str:
    """A fresh schema holding the path's inbox, set up; its uid and creation time fixed, so
    two schemas set up alike hold alike rows."""
    url = pg.new_schema()
    inbox = await Inbox.open(url, clock=FakeClock(T))
    await p.setup(inbox)
    await inbox.close()
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("UPDATE inboxes SET uid = 'fixed', created = %s", (T,))
    return url


async def run_call(url: str, p: faults.Path, fail_at: int | None, sent: list) -> object:
    inbox = await Inbox.open(url, clock=FakeClock(T))
    Faulty.arm(fail_at)
    try:
        return await p.call(inbox, sent)
    finally:
        Faulty.disarm()
        await inbox.close()


def outcome(value: object) -> object:
    """A call's result without the sequence-drawn run id (see the module docstring)."""
    if isinstance(value, list):
        return [
            dataclasses.replace(v, run_id=None)
            if dataclasses.is_dataclass(v) and hasattr(v, "run_id")
            else v
            for v in value
        ]
    return value


def snapshot(url: str) -> dict[str, list]:
    """Every row of every table, sequence ids replaced by their rank (see the docstring)."""
    with psycopg.connect(url, autocommit=True) as conn:
        tables = [
            r[0]
            for r in conn.execute(
                "SELECT table_name FROM information_schema.tables WHERE table_schema = "
                "current_schema() AND table_type = 'BASE TABLE' ORDER BY 1"
            )
        ]
        rows = {}
        for table in tables:
            cursor = conn.execute(f"SELECT * FROM {table}")
            names = [c.name for c in cursor.description]
            rows[table] = [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]
    for row in rows["inboxes"]:
        del row["changes"]  # the change token, not state (see the module docstring)
    ranks = {
        t: {r["id"]: n for n, r in enumerate(sorted(rows[t], key=lambda r: r["id"]), 1)}
        for t in SEQUENCED
    }
    for table, columns in REFERENCES.items():
        for row in rows[table]:
            if table in ranks:
                row["id"] = ranks[table][row["id"]]
            for column, target in columns.items():
                if row.get(column) is not None:
                    row[column] = ranks[target].get(row[column], f"dangling {row[column]}")
    return {t: sorted((tuple(sorted(r.items())) for r in rs), key=repr) for t, rs in rows.items()}


def check_invariants(url: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        q = lambda sql: conn.execute(sql).fetchall()  # noqa: E731
        actual = dict(q("SELECT status, count(*) FROM events GROUP BY status"))
        kept = {s: n for s, n in q("SELECT status, n FROM event_counts") if n}
        assert actual == kept, "kept counts disagree with the rows"
        assert (
            q("""SELECT e.id FROM events e LEFT JOIN runs r ON r.id = e.run_id
                    WHERE e.status = 'running' AND (r.id IS NULL OR r.outcome IS NOT NULL)""")
            == []
        ), "a running event without an open run"
        assert (
            q("""SELECT e.id FROM events e JOIN run_events re ON re.event_id = e.id
                    JOIN runs r ON r.id = re.run_id
                    WHERE r.outcome = 'done' AND e.status <> 'done'""")
            == []
        ), "a done run whose event is not done"
        assert (
            q("""SELECT o.id FROM outbox o JOIN runs r ON r.id = o.run_id
                    WHERE r.outcome IS DISTINCT FROM 'done'""")
            == []
        ), "a message of an unfinished run"
        assert (
            q("""SELECT a.request_id FROM approvals a WHERE a.answer IS NOT NULL AND NOT
                    EXISTS (SELECT 1 FROM events e WHERE e.source = 'approval'
                            AND e.source_id = a.request_id)""")
            == []
        ), "an answer without its resuming event"
        assert (
            q("""SELECT a.request_id FROM approvals a WHERE a.answer IS NULL AND NOT EXISTS
                    (SELECT 1 FROM timers t WHERE t.id = 'approval:' || a.request_id)""")
            == []
        ), "a waiting approval without its expiry timer"
        assert (
            q("""SELECT o.id FROM outbox o LEFT JOIN deliveries d ON d.id = o.delivery_id
                    WHERE o.status = 'sent' AND d.status IS DISTINCT FROM 'sent'""")
            == []
        ), "a message marked sent by a delivery that was not"


@pytest.mark.slow
@pytest.mark.parametrize("p", PATHS, ids=[p.name for p in PATHS])
async def test_crash_at_every_statement_of_a_write_path(pg, faulty_connections, p):
    clean = await make_base(pg, p)
    before = snapshot(clean)
    clean_outcome = outcome(await run_call(clean, p, None, []))
    statements = Faulty.count
    after = snapshot(clean)
    assert statements >= 3  # BEGIN with the row lock, the path's own, COMMIT
    check_invariants(clean)
    print(f"{p.name}: crashed at each of its {statements} statements")
    for n in range(1, statements + 1):
        target = await make_base(pg, p)
        assert snapshot(target) == before
        with pytest.raises(InboxError, match="injected crash"):
            await run_call(target, p, n, [])
        assert snapshot(target) == before, f"statement {n} of {statements} left a trace"
        check_invariants(target)
        assert outcome(await run_call(target, p, None, [])) == clean_outcome
        assert snapshot(target) == after, f"recovery after statement {n} diverged"


@pytest.mark.slow
async def test_crash_at_every_statement_of_a_dispatch(pg, faulty_connections):
    """Before the send: nothing changed, nothing sent. After it: sent again under the same
    key once the send timeout passed."""
    p = faults.Path(
        "dispatch",
        faults.setup_dispatch,
        lambda inbox, sent: inbox.dispatch(sent.append, now=T + 20),
    )
    clean = await make_base(pg, p)
    before = snapshot(clean)
    clean_sent: list = []
    assert await run_call(clean, p, None, clean_sent) == 2
    statements = Faulty.count
    after = snapshot(clean)
    resends = 0
    for n in range(1, statements + 1):
        target = await make_base(pg, p)
        sent: list = []
        with pytest.raises(InboxError, match="injected crash"):
            await run_call(target, p, n, sent)
        check_invariants(target)
        with psycopg.connect(target) as conn:
            held = conn.execute("SELECT count(*) FROM outbox WHERE status = 'held'").fetchone()
        assert held[0] == 2, "a crash lost or half-sent a message"
        if not sent:
            assert snapshot(target) == before, f"statement {n} left a trace before the send"
            assert await run_call(target, p, None, []) == 2
            assert snapshot(target) == after
            continue
        resends += 1
        inbox = await Inbox.open(target, clock=FakeClock(T))
        again: list = []
        timeout = inbox.settings.send_timeout
        assert await inbox.dispatch(again.append, now=T + 20) == 0  # still in flight
        assert await inbox.dispatch(again.append, now=T + 21 + timeout) == 2
        await inbox.close()
        assert [str(s) for s in again] == [str(sent[0])]
        assert again[0].key == sent[0].key, "a redelivery must keep its idempotency key"
        check_invariants(target)
    assert resends >= 1


def test_every_path_of_the_file_suite_is_run_here():
    assert [p.name for p in faults.PATHS] == sorted(
        (p.name for p in PATHS), key=[q.name for q in faults.PATHS].index
    )


@pytest.mark.slow
async def test_crash_at_every_statement_of_a_group_ingest(pg, faulty_connections):
    """Each caller either got True and its event is stored, or got the error and nothing of
    its event is stored; retrying the failed ones converges on the clean run's rows."""
    p = faults.Path("group", faults.setup_ingest, faults.call_ingest_group)
    clean = await make_base(pg, p)
    assert await run_call(clean, p, None, []) == [True] * 6 + [False]
    statements = Faulty.count
    after = snapshot(clean)
    for n in range(1, statements + 1):
        target = await make_base(pg, p)
        outcomes = await run_call(target, p, n, [])
        assert any(isinstance(o, InboxError) for o in outcomes), n
        with psycopg.connect(target) as conn:
            stored = {
                r[0] for r in conn.execute("SELECT source_id FROM events WHERE source = 'hook'")
            }
        for i, outcome in enumerate(outcomes[:6]):
            assert (outcome is True) == (f"g{i}" in stored), (n, i, outcome)
        check_invariants(target)
        inbox = await Inbox.open(target, clock=FakeClock(T))
        for i, outcome in enumerate(outcomes[:6]):
            if outcome is not True:  # the caller saw an error: it retries, as a webhook would
                assert await inbox.ingest("hook", f"g{i}", [i], now=T + 1) is True
        assert await inbox.ingest("chat", "m0", None, now=T + 1) is False
        await inbox.close()
        assert snapshot(target) == after, f"recovery after statement {n} diverged"
