"""Crash at every statement of every write path (SQLite's own crash-test method), on both
backends: one harness, run once per backend.

For each path: count its statements (on PostgreSQL BEGIN with the inbox's row lock and
COMMIT included) in a clean run; then, for every N, start from the same inbox, let statement
N fail and every later one too (the process is as good as dead: not even its ROLLBACK runs;
on PostgreSQL the connection is closed under it and the server rolls back), reopen it
normally and check that

- the inbox is exactly as before the call (all or nothing: no half-finished run, no timer
  occurrence half fired, no event lost), and the invariants hold;
- running the same call again converges on exactly the clean run's rows.

Dispatch has two transactions around the send: a crash after the send is redelivered under
the same idempotency key (at-least-once), never lost.

What differs between the backends, and why the comparison allows it: on PostgreSQL, ids
drawn from a sequence (runs, deliveries, messages, audit, effects) are not given back by a
rolled-back transaction, so a recovered inbox may have gaps where the clean one has none.
Rows are compared with those ids replaced by their rank (references included), which is
what the rules promise; event ids count within their inbox and are compared as they are.
The inbox's `changes` column is its change token (a file keeps none in a table): a recovery
made of more commits moves it further, so it is left out.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import shutil
import sqlite3
from dataclasses import dataclass
from typing import Any, Awaitable, Callable

import psycopg
import pytest

from onwatch.core import ApprovalRequest, FakeClock, FollowUp, Inbox, InboxError, Reply
from onwatch.core.pg import db as pg_db, is_url

pytestmark = pytest.mark.slow

T = 1_000_000
DAY = 86_400


class Injector:
    """Counts the statements of an armed call and fails the N-th (and every one after)."""

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

    @classmethod
    def tick(cls, sql: object, error: type[Exception], die: Callable[[], None]) -> None:
        if not cls.armed:
            return
        if cls.dead:
            raise error("injected crash: the process is gone")
        cls.count += 1
        if cls.fail_at is not None and cls.count == cls.fail_at:
            cls.dead = True
            die()
            raise error(f"injected crash at statement {cls.count}: {str(sql)[:40]}")


class FaultyFile(sqlite3.Connection):
    def execute(self, sql, *args):  # type: ignore[override]
        Injector.tick(sql, sqlite3.OperationalError, lambda: None)
        return super().execute(sql, *args)

    def executemany(self, sql, *args):  # type: ignore[override]
        Injector.tick(sql, sqlite3.OperationalError, lambda: None)
        return super().executemany(sql, *args)


class FaultyServer(psycopg.Connection):
    def execute(self, query, params=None, **kwargs):  # type: ignore[override]
        Injector.tick(query, psycopg.OperationalError, self.close)
        return super().execute(query, params, **kwargs)


async def hand_edit(inbox: Inbox, statement: str, params: tuple = ()) -> None:
    """One statement written by hand through the inbox's own connection (`?` placeholders;
    on PostgreSQL each test's schema holds the one inbox it means)."""
    if is_url(inbox.path):
        statement = statement.replace("?", "%s")
    await inbox._db.write(lambda tx: tx.conn.execute(statement, params))


@dataclass
class Path:
    """A write path: how to set the file up, and the call to crash."""

    name: str
    setup: Callable[[Inbox], Awaitable[None]]
    call: Callable[[Inbox, list], Awaitable[object]]


async def _events(inbox: Inbox, n: int = 3) -> None:
    for i in range(n):
        await inbox.ingest("chat", f"m{i}", {"text": f"hello {i}"}, now=T)


async def setup_ingest(inbox: Inbox) -> None:
    await _events(inbox, 2)


async def call_ingest(inbox: Inbox, sent: list) -> object:
    return await inbox.ingest("chat", "new-1", {"a": 1}, now=T + 1)


async def call_ingest_duplicate(inbox: Inbox, sent: list) -> object:
    return await inbox.ingest("chat", "m0", {"dup": True}, now=T + 1)


async def call_ingest_group(inbox: Inbox, sent: list) -> object:
    """Several at once (group commit may split them over transactions)."""
    return await asyncio.gather(
        *(inbox.ingest("hook", f"g{i}", [i], now=T + 1) for i in range(6)),
        inbox.ingest("chat", "m0", None, now=T + 1),
        return_exceptions=True,
    )


async def setup_claim(inbox: Inbox) -> None:
    await inbox.configure(max_attempts=2)
    await _events(inbox, 3)
    gen = await inbox.acquire("A", now=T)
    await inbox.claim_batch("A", gen, now=T)  # A claims all three, then "dies"
    gen = await inbox.acquire("B", now=T + 200)
    batch = await inbox.claim_batch("B", gen, now=T + 200)  # B claims m0 alone, "dies"
    assert [e.source_id for e in batch] == ["m0"]
    await inbox.ingest("chat", "fresh", {"text": "new"}, now=T + 300)


async def call_claim(inbox: Inbox, sent: list) -> object:
    gen = 3
    return await inbox.claim_batch("C", gen, now=T + 500)


async def setup_claim_lease(inbox: Inbox) -> None:
    await setup_claim(inbox)
    assert await inbox.acquire("C", now=T + 500) == 3


async def setup_finish(inbox: Inbox) -> None:
    await _events(inbox, 3)
    gen = await inbox.acquire("A", now=T)
    await inbox.claim_batch("A", gen, now=T)


async def call_finish(inbox: Inbox, sent: list) -> object:
    return await inbox.finish(
        "A",
        1,
        [1, 2, 3],
        messages=["reply one", Reply("urgent two", urgent=True)],
        result={"ok": True},
        approvals=[ApprovalRequest("r-1", 3600, "refund 5")],
        timers=[FollowUp("check-later", T + 600, {"why": "follow up"})],
        now=T + 10,
    )


async def call_finish_error(inbox: Inbox, sent: list) -> object:
    return await inbox.finish("A", 1, [1, 2, 3], error="tool timed out", now=T + 10)


async def setup_scheduler(inbox: Inbox) -> None:
    await inbox.add_timer("digest", T - 3 * DAY - 600, {"kind": "digest"}, every=DAY)
    await inbox.add_timer("billing", T - 2 * DAY, None, every=DAY, catch_up="each")
    await inbox.add_timer("once", T - 5, {"one": "off"})
    await inbox.add_timer("later", T + DAY, None)
    await inbox.request_approval("r-1", 60, "refund 5", now=T - 120)  # expires at T - 60


async def call_scheduler(inbox: Inbox, sent: list) -> object:
    return await inbox.run_scheduler(now=T)


async def setup_answer(inbox: Inbox) -> None:
    await inbox.request_approval("r-1", 3600, "refund 5", now=T)


async def call_answer(inbox: Inbox, sent: list) -> object:
    return await inbox.answer_approval("r-1", "yes", now=T + 60, actor="ana")


async def call_answer_late(inbox: Inbox, sent: list) -> object:
    return await inbox.answer_approval("r-1", "yes", now=T + 7200, actor="ana")


async def setup_acquire(inbox: Inbox) -> None:
    await _events(inbox, 1)
    gen = await inbox.acquire("A", now=T)
    await inbox.claim_batch("A", gen, now=T)


async def call_acquire(inbox: Inbox, sent: list) -> object:
    return await inbox.acquire("B", now=T + 500)


async def call_requeue(inbox: Inbox, sent: list) -> object:
    return await inbox.cancel(2, actor="ana", reason="spam", now=T + 5)


async def setup_effect(inbox: Inbox) -> None:
    await setup_finish(inbox)


async def call_effect(inbox: Inbox, sent: list) -> object:
    return await inbox.intend_effect("A", 1, 1, "refund", {"amount": 5}, event=2, now=T + 5)


async def setup_broken_timer(inbox: Inbox) -> None:
    await setup_scheduler(inbox)
    await inbox.add_timer("hand-edited", T - 10, None, every=60)
    # A row no valid call could write: its next occurrence would overflow a 64-bit integer.
    await hand_edit(inbox, "UPDATE timers SET every = ? WHERE id = 'hand-edited'", (2**63 - 1,))


async def setup_uncertain(inbox: Inbox) -> None:
    await inbox.configure(delivery="at_most_once", outbox_gap=0)
    gen = await inbox.acquire("A", now=T)
    await _events(inbox, 1)
    [event] = await inbox.claim_batch("A", gen, now=T)
    await inbox.finish("A", gen, [event.id], ["pay 5"], now=T)

    async def cut_off(text):
        raise asyncio.CancelledError  # the dispatcher dies mid-send

    try:
        await inbox.dispatch(cut_off, now=T)
    except asyncio.CancelledError:
        pass


async def call_settle(inbox: Inbox, sent: list) -> object:
    return await inbox.settle_delivery(1, "send again", now=T + 400, actor="ann")


async def call_group_with_a_bad_item(inbox: Inbox, sent: list) -> object:
    from onwatch.core.engine import intake

    items = [("chat", "g1", "null", T), ("", "bad", "null", T), ("chat", "g2", "null", T)]
    results = await inbox._db.write(intake.ingest_many, items)
    return [r if isinstance(r, bool) else type(r).__name__ for r in results]


PATHS = [
    Path("ingest", setup_ingest, call_ingest),
    Path("ingest-duplicate", setup_ingest, call_ingest_duplicate),
    Path("claim", setup_claim_lease, call_claim),
    Path("finish", setup_finish, call_finish),
    Path("finish-error", setup_finish, call_finish_error),
    Path("scheduler", setup_scheduler, call_scheduler),
    Path("answer", setup_answer, call_answer),
    Path("answer-late", setup_answer, call_answer_late),
    Path("acquire", setup_acquire, call_acquire),
    Path("cancel", setup_ingest, call_requeue),
    Path("intend-effect", setup_effect, call_effect),
    Path("scheduler-sets-a-row-aside", setup_broken_timer, call_scheduler),
    Path("settle-uncertain-delivery", setup_uncertain, call_settle),
    Path("group-with-a-bad-item", setup_ingest, call_group_with_a_bad_item),
]


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
INVARIANTS = {
    "kept counts disagree with the rows": """
        SELECT status FROM (SELECT status, count(*) AS n FROM events GROUP BY status) a
        FULL OUTER JOIN (SELECT status, n FROM event_counts WHERE n > 0) k USING (status)
        WHERE a.n IS NULL OR k.n IS NULL OR a.n <> k.n""",
    "a running event without an open run": """
        SELECT e.id FROM events e LEFT JOIN runs r ON r.id = e.run_id
        WHERE e.status = 'running' AND (r.id IS NULL OR r.outcome IS NOT NULL)""",
    "a done run whose event is not done": """
        SELECT e.id FROM events e JOIN run_events re ON re.event_id = e.id
        JOIN runs r ON r.id = re.run_id WHERE r.outcome = 'done' AND e.status <> 'done'""",
    "a message of an unfinished run": """
        SELECT o.id FROM outbox o JOIN runs r ON r.id = o.run_id
        WHERE coalesce(r.outcome, '') <> 'done'""",
    "an answer without its resuming event": """
        SELECT a.request_id FROM approvals a WHERE a.answer IS NOT NULL AND NOT EXISTS
        (SELECT 1 FROM events e WHERE e.source = 'approval' AND e.source_id = a.request_id)""",
    "a waiting approval without its expiry timer": """
        SELECT a.request_id FROM approvals a WHERE a.answer IS NULL AND NOT EXISTS
        (SELECT 1 FROM timers t WHERE t.id = 'approval:' || a.request_id)""",
    "a message marked sent by a delivery that was not": """
        SELECT o.id FROM outbox o LEFT JOIN deliveries d ON d.id = o.delivery_id
        WHERE o.status = 'sent' AND coalesce(d.status, '') <> 'sent'""",
}


class Backend:
    """Where the harness makes its inboxes, and how it looks at them."""

    name: str

    async def base(self, p: Path) -> str:
        """The inbox to crash from, set up by the path (kept: every crash starts from it)."""
        raise NotImplementedError

    async def copy(self, base: str, p: Path) -> str:
        """A fresh inbox holding exactly what `base` holds."""
        raise NotImplementedError

    def query(self, target: str, statement: str) -> list[tuple[Any, ...]]:
        raise NotImplementedError

    def tables(self, target: str) -> list[str]:
        raise NotImplementedError

    async def run(self, target: str, p: Path, fail_at: int | None, sent: list) -> object:
        """The path's call on a faulty connection, crashed at statement `fail_at`."""
        inbox = await self.open(target)
        Injector.arm(fail_at)
        try:
            return await p.call(inbox, sent)
        finally:
            Injector.disarm()
            await inbox.close()

    async def open(self, target: str) -> Inbox:
        raise NotImplementedError

    def snapshot(self, target: str) -> dict[str, list]:
        """Every row of every table, sequence ids replaced by their rank (see the module)."""
        rows: dict[str, list[dict[str, Any]]] = {}
        for table in self.tables(target):
            names, values = self.columns(target, table)
            rows[table] = [dict(zip(names, row, strict=True)) for row in values]
        for row in rows.get("inboxes", []):
            del row["changes"]  # the change token, not state
        for table in rows.values():
            for row in table:
                if row.get("key_salt") is not None:
                    row["key_salt"] = "drawn"  # random by design: only whether it is set
        ranks = {
            t: {r["id"]: n for n, r in enumerate(sorted(rows[t], key=lambda r: r["id"]), 1)}
            for t in SEQUENCED
        }
        for table, columns in REFERENCES.items():
            for row in rows[table]:
                if table in ranks:
                    row["id"] = ranks[table][row["id"]]
                for column, target_table in columns.items():
                    if row.get(column) is not None:
                        row[column] = ranks[target_table].get(
                            row[column], f"dangling {row[column]}"
                        )
        return {
            t: sorted((tuple(sorted(r.items())) for r in rs), key=repr) for t, rs in rows.items()
        }

    def columns(self, target: str, table: str) -> tuple[list[str], list[tuple[Any, ...]]]:
        raise NotImplementedError

    def check_invariants(self, target: str) -> None:
        for broken, statement in INVARIANTS.items():
            assert self.query(target, statement) == [], broken


class File(Backend):
    name = "sqlite"

    def __init__(self, folder) -> None:
        self.folder = folder
        self.copies = 0

    async def base(self, p: Path) -> str:
        base = str(self.folder / f"{p.name}-base.db")
        inbox = await Inbox.open(base, clock=FakeClock(T))
        await p.setup(inbox)
        await inbox.close()  # the last connection's close checkpoints the WAL into the file
        return base

    async def copy(self, base: str, p: Path) -> str:
        self.copies += 1
        target = str(self.folder / f"copy-{self.copies}.db")
        shutil.copyfile(base, target)
        return target

    async def open(self, target: str) -> Inbox:
        return await Inbox.open(target, clock=FakeClock(T), connection_factory=FaultyFile)

    def query(self, target: str, statement: str) -> list[tuple[Any, ...]]:
        db = sqlite3.connect(target)
        try:
            return db.execute(statement).fetchall()
        finally:
            db.close()

    def tables(self, target: str) -> list[str]:
        return [
            r[0]
            for r in self.query(
                target,
                "SELECT name FROM sqlite_master WHERE type = 'table' "
                "AND name NOT LIKE 'sqlite_%' ORDER BY name",
            )
        ]

    def columns(self, target: str, table: str) -> tuple[list[str], list[tuple[Any, ...]]]:
        db = sqlite3.connect(target)
        try:
            cursor = db.execute(f"SELECT * FROM {table}")
            return [c[0] for c in cursor.description], cursor.fetchall()
        finally:
            db.close()


class Server(Backend):
    name = "postgresql"

    def __init__(self, cluster, monkeypatch) -> None:
        self.cluster = cluster

        def connect(url: str, busy_timeout: float) -> psycopg.Connection:
            conn = FaultyServer.connect(url, autocommit=True, connect_timeout=10)
            psycopg.Connection.execute(conn, f"SET lock_timeout = {int(busy_timeout * 1000)}")
            return conn

        monkeypatch.setattr(pg_db.Database, "_connect", staticmethod(connect))

    async def base(self, p: Path) -> str:
        """A fresh schema holding the path's inbox, set up; its uid and creation time fixed,
        so two schemas set up alike hold alike rows."""
        url = self.cluster.new_schema()
        inbox = await Inbox.open(url, clock=FakeClock(T))
        await p.setup(inbox)
        await inbox.close()
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("UPDATE inboxes SET uid = 'fixed', created = %s", (T,))
            # Key salts are drawn at random; fixed by rank here so that two schemas set up
            # alike hand out alike keys (a file's copy holds its base's salts already).
            for table in ("events", "deliveries"):
                conn.execute(
                    f"UPDATE {table} t SET key_salt = r.n FROM (SELECT id, row_number() "
                    f"OVER (ORDER BY id) AS n FROM {table}) r "
                    f"WHERE t.id = r.id AND t.key_salt IS NOT NULL"
                )
        return url

    async def copy(self, base: str, p: Path) -> str:
        return await self.base(p)  # the same setup in a new schema: the same rows

    async def open(self, target: str) -> Inbox:
        return await Inbox.open(target, clock=FakeClock(T))  # on FaultyServer (see __init__)

    def query(self, target: str, statement: str) -> list[tuple[Any, ...]]:
        with psycopg.connect(target, autocommit=True) as conn:
            return conn.execute(statement).fetchall()

    def tables(self, target: str) -> list[str]:
        return [
            r[0]
            for r in self.query(
                target,
                "SELECT table_name FROM information_schema.tables WHERE table_schema = "
                "current_schema() AND table_type = 'BASE TABLE' ORDER BY 1",
            )
        ]

    def columns(self, target: str, table: str) -> tuple[list[str], list[tuple[Any, ...]]]:
        with psycopg.connect(target, autocommit=True) as conn:
            cursor = conn.execute(f"SELECT * FROM {table}")
            return [c.name for c in cursor.description or ()], cursor.fetchall()


@pytest.fixture(params=["sqlite", "postgresql"])
def backend(request, tmp_path, monkeypatch) -> Backend:
    if request.param == "sqlite":
        return File(tmp_path)
    from tests.pg.server import cluster_or_skip

    return Server(cluster_or_skip(), monkeypatch)


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


@pytest.mark.parametrize("p", PATHS, ids=[p.name for p in PATHS])
async def test_crash_at_every_statement_of_a_write_path(backend, p):
    base = await backend.base(p)
    before = backend.snapshot(base)
    clean = await backend.copy(base, p)
    clean_outcome = outcome(await backend.run(clean, p, None, []))
    statements = Injector.count
    after = backend.snapshot(clean)
    assert statements >= 2
    backend.check_invariants(clean)
    print(f"{p.name}: crashed at each of its {statements} statements")
    for n in range(1, statements + 1):
        target = await backend.copy(base, p)
        with pytest.raises(InboxError, match="injected crash"):
            await backend.run(target, p, n, [])
        assert backend.snapshot(target) == before, f"statement {n} of {statements} left a trace"
        backend.check_invariants(target)
        # The same call after the restart converges on the clean run, outcome included.
        assert outcome(await backend.run(target, p, None, [])) == clean_outcome
        assert backend.snapshot(target) == after, f"recovery after statement {n} diverged"


async def setup_dispatch(inbox: Inbox) -> None:
    await setup_finish(inbox)
    await inbox.finish("A", 1, [1, 2, 3], messages=["update 0", "update 1"], now=T + 10)


async def test_crash_at_every_statement_of_a_dispatch(backend):
    """Before the send: nothing changed, nothing sent. After the send: the delivery stays
    'sending' and is sent again, under the same key, once the send timeout passed."""
    p = Path(
        "dispatch", setup_dispatch, lambda inbox, sent: inbox.dispatch(sent.append, now=T + 20)
    )
    base = await backend.base(p)
    before = backend.snapshot(base)
    clean_sent: list = []
    clean = await backend.copy(base, p)
    assert await backend.run(clean, p, None, clean_sent) == 2
    statements = Injector.count
    after = backend.snapshot(clean)
    assert [str(s) for s in clean_sent] == ["update 0\n\nupdate 1"]
    resends = 0
    for n in range(1, statements + 1):
        target = await backend.copy(base, p)
        sent: list = []
        with pytest.raises(InboxError, match="injected crash"):
            await backend.run(target, p, n, sent)
        backend.check_invariants(target)
        held = backend.query(target, "SELECT count(*) FROM outbox WHERE status = 'held'")
        assert held == [(2,)], "a crash lost or half-sent a message"
        if not sent:
            assert backend.snapshot(target) == before, f"statement {n} left a trace"
            assert await backend.run(target, p, None, []) == 2
            assert backend.snapshot(target) == after
            continue
        # Crashed after the send, before recording it: sent again later, same key.
        resends += 1
        inbox = await Inbox.open(target, clock=FakeClock(T))
        again: list = []
        timeout = inbox.settings.send_timeout
        assert await inbox.dispatch(again.append, now=T + 20) == 0  # still in flight
        assert await inbox.dispatch(again.append, now=T + 21 + timeout) == 2
        await inbox.close()
        assert [str(s) for s in again] == [str(sent[0])]
        assert again[0].key == sent[0].key, "a redelivery must keep its idempotency key"
        backend.check_invariants(target)
    assert resends >= 1  # the end-of-delivery transaction was crashed at least once


async def test_crash_at_every_statement_of_a_group_ingest(backend):
    """Each caller either got True and its event is stored, or got the error and nothing of
    its event is stored; retrying the failed ones converges on the clean run's rows."""
    p = Path("group", setup_ingest, call_ingest_group)
    base = await backend.base(p)
    clean = await backend.copy(base, p)
    assert await backend.run(clean, p, None, []) == [True] * 6 + [False]
    statements = Injector.count
    after = backend.snapshot(clean)
    for n in range(1, statements + 1):
        target = await backend.copy(base, p)
        outcomes = await backend.run(target, p, n, [])
        assert any(isinstance(o, InboxError) for o in outcomes), n
        rows = backend.query(target, "SELECT source_id FROM events WHERE source = 'hook'")
        stored = {r[0] for r in rows}
        for i, result in enumerate(outcomes[:6]):
            assert (result is True) == (f"g{i}" in stored), (n, i, result)
        backend.check_invariants(target)
        inbox = await Inbox.open(target, clock=FakeClock(T))
        for i, result in enumerate(outcomes[:6]):
            if result is not True:  # the caller saw an error: it retries, as a webhook would
                assert await inbox.ingest("hook", f"g{i}", [i], now=T + 1) is True
        assert await inbox.ingest("chat", "m0", None, now=T + 1) is False
        await inbox.close()
        assert backend.snapshot(target) == after, f"recovery after statement {n} diverged"


async def test_scheduler_pass_counts_every_occurrence_once(backend):
    """What the scheduler path's converged inbox holds: each missed occurrence has its own
    event or is counted in `skipped`; none twice."""
    p = next(p for p in PATHS if p.name == "scheduler")
    path = await backend.copy(await backend.base(p), p)
    with pytest.raises(InboxError):
        await backend.run(path, p, 9, [])  # crash in the middle of the pass
    assert await backend.run(path, p, None, []) == 4  # digest, billing, once, the expiry
    rows = backend.query(path, "SELECT source, source_id, payload FROM events ORDER BY id")
    keys = [f"{s}/{i}" for s, i, _ in rows]
    assert len(keys) == len(set(keys))
    digest = [json.loads(pl) for s, i, pl in rows if i.startswith("digest@")]
    assert len(digest) == 1 and digest[0]["skipped"] == 3 and digest[0]["late_by"] == 600
    billing = [i for _, i, _ in rows if i.startswith("billing@")]
    assert billing == [f"billing@{T - 2 * DAY}", f"billing@{T - DAY}", f"billing@{T}"]
    assert ("timer", "once@" + str(T - 5)) in [(s, i) for s, i, _ in rows]
    assert ("approval", "r-1") in [(s, i) for s, i, _ in rows]
    # A second pass at the same instant finds nothing due.
    assert await backend.run(path, p, None, []) == 0
