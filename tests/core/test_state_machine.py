"""A model-based Hypothesis state machine over the lease, fencing, claim and finish rules.

The model is a plain-Python restatement of SPEC §1.2–1.5 and §1.9 requeue/cancel. After every
step the real inbox must agree with it exactly: every return value, every event's state,
attempts and claim generation, the lease, the trigger-kept counts, and the outbox.
"""

from __future__ import annotations

import asyncio
import shutil
import sqlite3
import tempfile
from dataclasses import dataclass, field

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from core import FakeClock, Inbox

TTL, MAX_ATTEMPTS, MAX_BATCH, BASE, CAP = 120, 3, 3, 10, 40
HOLDERS = ("A", "B", "C")
SOURCES = ("chat", "stripe")  # stripe's lost claims are interrupted, chat's retried


@dataclass
class ModelEvent:
    source: str
    status: str = "pending"
    attempts: int = 0
    claim_gen: int | None = None
    available_at: int = 0


@dataclass
class Model:
    events: dict[int, ModelEvent] = field(default_factory=dict)
    keys: set[tuple[str, str]] = field(default_factory=set)
    holder: str | None = None
    gen: int = 0
    until: int = 0
    messages: int = 0
    refused: int = 0

    def holds(self, holder: str, gen: int, now: int) -> bool:
        return self.holder == holder and self.gen == gen and self.until >= now

    def acquire(self, holder: str, now: int) -> int | None:
        if self.holder is not None and self.until >= now:
            if self.holder != holder:
                return None
            self.until = now + TTL
            return self.gen
        self.holder, self.gen, self.until = holder, self.gen + 1, now + TTL
        return self.gen

    def claim(self, holder: str, gen: int, now: int) -> list[int]:
        if not self.holds(holder, gen, now):
            self.refused += 1
            return []
        for event in self.events.values():
            if event.status == "running" and event.claim_gen < gen:
                if event.source == "stripe":
                    event.status = "interrupted"
                else:
                    event.status, event.available_at = "pending", now
        for event in self.events.values():
            if event.status == "pending" and 0 < event.attempts and \
                    event.attempts >= MAX_ATTEMPTS:
                event.status = "dead"
        ready = [i for i, e in sorted(self.events.items())
                 if e.status == "pending" and e.available_at <= now]
        retried = [i for i in ready if self.events[i].attempts > 0]
        ids = retried[:1] if retried else ready[:MAX_BATCH]
        for i in ids:
            event = self.events[i]
            event.status, event.claim_gen = "running", gen
            event.attempts += 1
        return ids

    def finish(self, holder: str, gen: int, ids: list[int], ok: bool, now: int) -> bool:
        if not self.holds(holder, gen, now):
            self.refused += 1
            return False
        live = [i for i in ids if self.events[i].status == "running" and
                self.events[i].claim_gen == gen]
        if not live:
            self.refused += 1
            return False
        for i in live:
            event = self.events[i]
            if ok:
                event.status = "done"
            elif event.attempts >= MAX_ATTEMPTS:
                event.status = "dead"
            else:
                event.status = "pending"
                event.available_at = now + min(CAP, BASE * 2 ** (event.attempts - 1))
        self.messages += ok
        return True


class InboxMachine(RuleBasedStateMachine):
    backend = "sqlite"

    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.folder = tempfile.mkdtemp(prefix="onwatch-model-")
        self.path = f"{self.folder}/inbox.db" if self.backend == "sqlite" else \
            _pg_cluster().new_schema()
        self.clock = FakeClock(1_000_000)
        self.box = self.run(Inbox.open(self.path, clock=self.clock))
        self.run(self.box.configure(lease_ttl=TTL, max_attempts=MAX_ATTEMPTS,
                                    max_batch=MAX_BATCH, backoff_base=BASE, backoff_cap=CAP,
                                    lost_claim_by_source={"stripe": "interrupt"}))
        self.model = Model()
        self.claims: dict[str, tuple[int, list[int]]] = {}
        self.generations: dict[str, int] = {}
        self.serial = 0

    def run(self, coro):
        return self.loop.run_until_complete(coro)

    def teardown(self) -> None:
        self.run(self.box.close())
        self.loop.close()
        shutil.rmtree(self.folder, ignore_errors=True)

    @rule(source=st.sampled_from(SOURCES), replay=st.booleans())
    def ingest(self, source, replay):
        if replay and self.model.keys:
            key = sorted(self.model.keys)[0]
        else:
            self.serial += 1
            key = (source, f"e{self.serial}")
        stored = self.run(self.box.ingest(key[0], key[1], {"n": self.serial}))
        assert stored == (key not in self.model.keys)
        if stored:
            self.model.keys.add(key)
            self.model.events[len(self.model.events) + 1] = ModelEvent(
                key[0], available_at=self.clock.now())

    @rule(seconds=st.sampled_from([0, 1, 30, 119, 120, 121, 400]))
    def advance(self, seconds):
        self.clock.advance(seconds)

    @rule(holder=st.sampled_from(HOLDERS))
    def acquire(self, holder):
        gen = self.run(self.box.acquire(holder))
        assert gen == self.model.acquire(holder, self.clock.now())
        if gen is not None:
            self.generations[holder] = gen

    @rule(holder=st.sampled_from(HOLDERS))
    def crash_then_take_over_and_claim(self, holder):
        """The fault the lease exists for: a worker dies, the next one takes over."""
        self.advance(TTL + 1)
        self.acquire(holder)
        self._claim(holder)

    @precondition(lambda self: self.generations)
    @rule(data=st.data())
    def claim(self, data):
        self._claim(data.draw(st.sampled_from(sorted(self.generations))))

    def _claim(self, holder):
        gen = self.generations[holder]
        batch = self.run(self.box.claim_batch(holder, gen))
        expected = self.model.claim(holder, gen, self.clock.now())
        assert [e.id for e in batch] == expected
        if expected:
            self.claims[holder] = (gen, expected)

    @precondition(lambda self: self.claims)
    @rule(data=st.data(), ok=st.booleans())
    def finish(self, data, ok):
        holder = data.draw(st.sampled_from(sorted(self.claims)))
        gen, ids = self.claims[holder]
        accepted = self.run(self.box.finish(holder, gen, ids, ["reply"] if ok else (),
                                            error=None if ok else "agent failed"))
        assert accepted == self.model.finish(holder, gen, ids, ok, self.clock.now())

    @precondition(lambda self: self.model.events)
    @rule(data=st.data())
    def requeue(self, data):
        event_id = data.draw(st.sampled_from(sorted(self.model.events)))
        event = self.model.events[event_id]
        applied = self.run(self.box.requeue(event_id))
        assert applied == (event.status in ("dead", "interrupted", "cancelled"))
        if applied:
            event.status, event.attempts, event.claim_gen = "pending", 0, None
            event.available_at = self.clock.now()

    @precondition(lambda self: self.model.events)
    @rule(data=st.data())
    def cancel(self, data):
        event_id = data.draw(st.sampled_from(sorted(self.model.events)))
        event = self.model.events[event_id]
        applied = self.run(self.box.cancel(event_id))
        assert applied == (event.status == "pending")
        if applied:
            event.status = "cancelled"

    @invariant()
    def the_inbox_agrees_with_the_model(self):
        if self.backend == "postgresql":
            return self.agrees(*_read_postgresql(self.path))
        db = sqlite3.connect(self.path)
        try:
            rows = {r[0]: r[1:] for r in db.execute(
                "SELECT id, status, attempts, claim_gen FROM events")}
            counts = dict(db.execute("SELECT status, n FROM event_counts"))
            actual = dict(db.execute("SELECT status, count(*) FROM events GROUP BY status"))
            lease = db.execute("SELECT holder, gen, until FROM lease").fetchone()
            messages = db.execute("SELECT count(*) FROM outbox").fetchone()[0]
            refused = db.execute("SELECT value FROM meta WHERE key = 'refused_writes'"
                                 ).fetchone()[0]
            done_twice = db.execute(
                "SELECT value, count(*) FROM runs, json_each(runs.event_ids) "
                "WHERE outcome = 'done' GROUP BY value HAVING count(*) > 1").fetchall()
        finally:
            db.close()
        self.agrees(rows, counts, actual, lease, messages, refused, done_twice)

    def agrees(self, rows, counts, actual, lease, messages, refused, done_twice) -> None:
        for event_id, event in self.model.events.items():
            status, attempts, claim_gen = rows[event_id]
            assert (status, attempts) == (event.status, event.attempts), event_id
            if status == "running":
                assert claim_gen == event.claim_gen
        assert len(rows) == len(self.model.events)
        assert {k: v for k, v in counts.items() if v} == actual
        if self.model.holder is not None:
            assert lease == (self.model.holder, self.model.gen, self.model.until)
        assert messages == self.model.messages
        assert refused == self.model.refused
        requeued = any(e.attempts == 0 and e.status != "pending" for e in self.model.events.values())
        if not requeued:
            assert done_twice == []


InboxMachine.TestCase.settings = settings(
    max_examples=100, stateful_step_count=40, deadline=None,
    suppress_health_check=[HealthCheck.too_slow])
test_lease_and_claim_rules = InboxMachine.TestCase


def _pg_cluster():
    from tests.pg.server import Unavailable, cluster
    try:
        return cluster()
    except Unavailable as exc:
        pytest.skip(f"PostgreSQL tests skipped: {exc}")


def _read_postgresql(url: str) -> tuple:
    """What the invariant reads, from the PostgreSQL inbox (the only one in its schema)."""
    import psycopg
    with psycopg.connect(url) as db:
        rows = {r[0]: r[1:] for r in db.execute(
            "SELECT id, status, attempts, claim_gen FROM events")}
        counts = dict(db.execute("SELECT status, n FROM event_counts"))
        actual = dict(db.execute("SELECT status, count(*) FROM events GROUP BY status"))
        lease = db.execute("SELECT lease_holder, lease_gen, lease_until FROM inboxes").fetchone()
        messages = db.execute("SELECT count(*) FROM outbox").fetchone()[0]
        refused = db.execute("SELECT refused_writes FROM inboxes").fetchone()[0]
        done_twice = db.execute(
            "SELECT value, count(*) FROM runs, json_array_elements_text(event_ids::json) "
            "WHERE outcome = 'done' GROUP BY value HAVING count(*) > 1").fetchall()
    return rows, counts, actual, lease, messages, refused, done_twice


class PostgresInboxMachine(InboxMachine):
    """The same machine on a PostgreSQL inbox (fewer examples: each costs a schema)."""

    backend = "postgresql"


PostgresInboxMachine.TestCase.settings = settings(
    max_examples=30, stateful_step_count=40, deadline=None,
    suppress_health_check=[HealthCheck.too_slow])
test_lease_and_claim_rules_on_postgresql = PostgresInboxMachine.TestCase
