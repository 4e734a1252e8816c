"""A model-based Hypothesis state machine over the inbox's rules.

The model is a plain-Python restatement of docs/rules.md (#lease-and-fencing to
#finishing-a-run: lease, fencing, claim, finish, fenced by generation and run), timers and
the scheduler, approvals (request, answer, expiry),
outbox deliveries sent by two dispatchers whose sends hang past send_timeout and report late,
the effect journal (fenced intents, keys from the event), and operator actions with
`expect=`. After every step the real inbox must agree with it exactly: every return value,
every event's state, attempts and claim generation, the lease, the trigger-kept counts, the
outbox and its deliveries, timers, approvals, effects and the refused-write counter.
"""

from __future__ import annotations

import asyncio
import re
import shutil
import sqlite3
import tempfile
from dataclasses import dataclass, field

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from onwatch.core import FakeClock, Inbox

pytestmark = pytest.mark.backends  # the conformance suite: once per backend

TTL, MAX_ATTEMPTS, MAX_BATCH, BASE, CAP = 120, 3, 3, 10, 40
SEND_TIMEOUT, MAX_SENDS = 30, 3
DISPATCHERS = ("D1", "D2")
STATES = ("pending", "running", "done", "dead", "interrupted", "cancelled")
HOLDERS = ("A", "B", "C")
SOURCES = ("chat", "stripe")  # stripe's lost claims are interrupted, chat's retried


@dataclass
class ModelEvent:
    source: str
    status: str = "pending"
    attempts: int = 0
    claim_gen: int | None = None
    available_at: int = 0
    run: int | None = None


@dataclass
class ModelRun:
    gen: int
    events: list[int]
    open: bool = True
    outcome: str | None = None  # once closed: 'done', 'error' or 'lost'


@dataclass
class ModelDelivery:
    status: str
    attempts: int
    retry_after: int


@dataclass
class Model:
    events: dict[int, ModelEvent] = field(default_factory=dict)
    keys: set[tuple[str, str]] = field(default_factory=set)
    holder: str | None = None
    gen: int = 0
    until: int = 0
    messages: int = 0
    refused: int = 0
    runs: dict[int, ModelRun] = field(default_factory=dict)
    # outbox rows in order: [status, delivery id]
    outbox: list[list] = field(default_factory=list)
    deliveries: dict[int, ModelDelivery] = field(default_factory=dict)
    timers: dict[str, int] = field(default_factory=dict)  # id -> due (approval:… included)
    approvals: dict[str, list] = field(default_factory=dict)  # id -> [due, answer]
    effects: list[tuple[int, str]] = field(default_factory=list)  # (run, key)

    def add_event(self, source: str, source_id: str, now: int) -> bool:
        if (source, source_id) in self.keys:
            return False
        self.keys.add((source, source_id))
        self.events[len(self.events) + 1] = ModelEvent(source, available_at=now)
        return True

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
                self.runs[event.run].open = False
                self.runs[event.run].outcome = "lost"
        for event in self.events.values():
            if event.status == "pending" and 0 < event.attempts and event.attempts >= MAX_ATTEMPTS:
                event.status = "dead"
        ready = [
            i
            for i, e in sorted(self.events.items())
            if e.status == "pending" and e.available_at <= now
        ]
        retried = [i for i in ready if self.events[i].attempts > 0]
        ids = retried[:1] if retried else ready[:MAX_BATCH]
        if ids:
            self.runs[len(self.runs) + 1] = ModelRun(gen, ids)
        for i in ids:
            event = self.events[i]
            event.status, event.claim_gen = "running", gen
            event.attempts += 1
            event.run = len(self.runs)
        return ids

    def finish(
        self,
        holder: str,
        gen: int,
        ids: list[int],
        ok: bool,
        now: int,
        run: int | None = None,
        reply: bool = True,
    ) -> bool:
        if run is not None:
            # The same finish again (its answer lost): the run is closed as asked, by this
            # generation; the truth is reported, nothing is written or audited.
            closed = self.runs[run]
            if (
                not closed.open
                and closed.gen == gen
                and closed.outcome == ("done" if ok else "error")
            ):
                return True
        if not self.holds(holder, gen, now):
            self.refused += 1
            return False
        if run is not None and not (self.runs[run].open and self.runs[run].gen == gen):
            self.refused += 1
            return False
        live = [
            i
            for i in ids
            if self.events[i].status == "running"
            and self.events[i].claim_gen == gen
            and run in (None, self.events[i].run)
        ]
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
        if ok and reply:
            self.messages += 1
            self.outbox.append(["held", None])
        for run_id in {self.events[i].run for i in live}:
            if not any(e.status == "running" and e.run == run_id for e in self.events.values()):
                self.runs[run_id].open = False
                self.runs[run_id].outcome = "done" if ok else "error"
        return True

    # --- timers and approvals (one-off timers; an approval's expiry is one too) -----------

    def run_scheduler(self, now: int) -> int:
        due = sorted((d, i) for i, d in self.timers.items() if d <= now)
        for when, timer_id in due:
            del self.timers[timer_id]
            if timer_id.startswith("approval:"):
                self.store_answer(timer_id.split(":", 1)[1], "expired", now)
            else:
                self.add_event("timer", f"{timer_id}@{when}", now)
        return len(due)

    def store_answer(self, request_id: str, answer: str, now: int) -> None:
        approval = self.approvals[request_id]
        if approval[1] is None:
            approval[1] = answer
            self.add_event("approval", request_id, now)
            self.timers.pop(f"approval:{request_id}", None)

    def answer(self, request_id: str, answer: str, now: int) -> str:
        approval = self.approvals.get(request_id)
        if approval is None:
            return "unknown"
        if approval[1] is not None:
            return approval[1]
        if now >= approval[0]:
            self.store_answer(request_id, "expired", now)
            return "expired"
        self.store_answer(request_id, answer, now)
        return answer

    # --- the outbox: each attempt owns its outcome ----------------------------------------

    def begin_send(self, now: int) -> tuple[int, int, int] | None:
        retry = [
            i
            for i, d in sorted(self.deliveries.items())
            if d.status == "failed" or (d.status == "sending" and d.retry_after < now)
        ]
        if retry:
            delivery = self.deliveries[retry[0]]
            delivery.status, delivery.retry_after = "sending", now + SEND_TIMEOUT
            delivery.attempts += 1
            return retry[0], delivery.attempts, sum(1 for m in self.outbox if m[1] == retry[0])
        waiting = [m for m in self.outbox if m[0] == "held" and m[1] is None]
        if not waiting:
            return None
        delivery_id = len(self.deliveries) + 1
        self.deliveries[delivery_id] = ModelDelivery("sending", 1, now + SEND_TIMEOUT)
        for message in waiting:
            message[1] = delivery_id
        return delivery_id, 1, len(waiting)

    def end_send(self, delivery_id: int, attempt: int, ok: bool) -> bool:
        delivery = self.deliveries[delivery_id]
        if delivery.status != "sending" or delivery.attempts != attempt:
            self.refused += 1
            return False
        if ok:
            delivery.status = "sent"
        elif delivery.attempts >= MAX_SENDS:
            delivery.status = "dead"
        else:
            delivery.status = "failed"
            return False
        for message in self.outbox:
            if message[1] == delivery_id:
                message[0] = delivery.status
        return ok


class InboxMachine(RuleBasedStateMachine):
    backend = "sqlite"

    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.folder = tempfile.mkdtemp(prefix="onwatch-model-")
        self.path = (
            f"{self.folder}/inbox.db" if self.backend == "sqlite" else _pg_cluster().new_schema()
        )
        self.clock = FakeClock(1_000_000)
        self.box = self.run(Inbox.open(self.path, clock=self.clock))
        self.run(
            self.box.configure(
                lease_ttl=TTL,
                max_attempts=MAX_ATTEMPTS,
                max_batch=MAX_BATCH,
                backoff_base=BASE,
                backoff_cap=CAP,
                lost_claim_by_source={"stripe": "interrupt"},
                outbox_gap=0,
                send_timeout=SEND_TIMEOUT,
                max_delivery_attempts=MAX_SENDS,
            )
        )
        self.model = Model()
        self.uid = self.run(self.box._db.read(lambda tx: tx.meta("uid")))
        self.salts: dict[int, str] = {}  # each event's key salt, as its first key showed it
        # dispatcher -> (task, gate, what the model says it took: (delivery, attempt, count))
        self.sending: dict[str, tuple] = {}
        self.claims: dict[str, tuple[int, list[int], int]] = {}
        self.generations: dict[str, int] = {}
        self.serial = 0

    def run(self, coro):
        return self.loop.run_until_complete(coro)

    def teardown(self) -> None:
        for task, gate, _ in self.sending.values():
            if not gate.done():
                gate.set_result(False)
            self.run(asyncio.wait([task]))
        self.run(self.box.close())
        self.loop.close()
        shutil.rmtree(self.folder, ignore_errors=True)

    @rule(source=st.sampled_from(SOURCES), replay=st.booleans())
    def ingest(self, source, replay):
        replayable = sorted(k for k in self.model.keys if k[0] in SOURCES)
        if replay and replayable:
            key = replayable[0]
        else:
            self.serial += 1
            key = (source, f"e{self.serial}")
        stored = self.run(self.box.ingest(key[0], key[1], {"n": self.serial}))
        assert stored == self.model.add_event(key[0], key[1], self.clock.now())

    @rule(seconds=st.sampled_from([0, 1, 30, SEND_TIMEOUT + 1, 119, 120, 121, 400]))
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
            assert {e.run_id for e in batch} == {len(self.model.runs)}
            self.claims[holder] = (gen, expected, batch[0].run_id)

    @precondition(lambda self: self.claims)
    @rule(data=st.data(), ok=st.booleans(), by_run=st.booleans())
    def finish(self, data, ok, by_run):
        self._finish(data.draw(st.sampled_from(sorted(self.claims))), ok, by_run)

    def _finish(self, holder, ok, by_run):
        gen, ids, run_id = self.claims[holder]
        run = run_id if by_run else None
        accepted = self.run(
            self.box.finish(
                holder,
                gen,
                ids,
                ["reply"] if ok else (),
                error=None if ok else "agent failed",
                run=run,
            )
        )
        assert accepted == self.model.finish(holder, gen, ids, ok, self.clock.now(), run)

    @precondition(lambda self: self.claims)
    @rule(
        data=st.data(),
        ok=st.sampled_from([True, True, True, False]),
        reply=st.sampled_from([False, False, False, True]),
    )
    def finish_and_claim(self, data, ok, reply):
        """A worker's step from one run to the next: the finish (by run) and, if it was
        accepted, the next claim, in one transaction (on PostgreSQL, one message where the
        finish writes only its own rows and the claim is plain). The lease's holder is
        drawn more often than the others (theirs are refused)."""
        holders = sorted(self.claims)
        live = [h for h in holders if (h, self.claims[h][0]) == (self.model.holder, self.model.gen)]
        holder = data.draw(st.sampled_from(live * 3 + holders))
        gen, ids, run_id = self.claims[holder]
        accepted, claimed = self.run(
            self.box.finish_and_claim(
                holder,
                gen,
                ids,
                ["reply"] if ok and reply else (),
                error=None if ok else "agent failed",
                run=run_id,
                fire_timers=False,
                mark=False,
            )
        )
        now = self.clock.now()
        assert accepted == self.model.finish(holder, gen, ids, ok, now, run_id, reply)
        if not accepted:
            assert claimed is None
            return
        assert claimed is not None
        expected = self.model.claim(holder, gen, now)
        assert [e.id for e in claimed.events] == expected
        if expected:
            assert {e.run_id for e in claimed.events} == {len(self.model.runs)}
            self.claims[holder] = (gen, expected, claimed.events[0].run_id)

    @rule(holder=st.sampled_from(HOLDERS))
    def a_whole_run_that_replies(self, holder):
        """Ingest, take the lease, claim and finish with a reply: the outbox fills up."""
        self.ingest("chat", False)
        self.acquire(holder)
        if holder in self.generations:
            self.claims.pop(holder, None)
            self._claim(holder)
            if holder in self.claims:
                self._finish(holder, True, True)

    @precondition(lambda self: self.claims)
    @rule(data=st.data())
    def intend_effect(self, data):
        holder = data.draw(st.sampled_from(sorted(self.claims)))
        gen, ids, run_id = self.claims[holder]
        event = data.draw(st.sampled_from(ids))
        key = self.run(self.box.intend_effect(holder, gen, run_id, "pay", event=event))
        model = self.model
        run = model.runs[run_id]
        if model.holds(holder, gen, self.clock.now()) and run.open and run.gen == gen:
            nth = sum(1 for r, k in model.effects if r == run_id and f"-ev{event}." in k) + 1
            # The event's salt is random: learnt from its first key, the same in every
            # later one, and no other event's (docs/rules.md#effects-and-their-keys).
            pattern = f"onwatch-{self.uid}-ev{event}\\.([0-9a-f]{{16}})-pay-{nth}"
            found = re.fullmatch(pattern, key)
            assert found, key
            salt = self.salts.setdefault(event, found[1])
            assert found[1] == salt
            assert list(self.salts.values()).count(salt) == 1
            model.effects.append((run_id, key))
        else:
            assert key is None
            model.refused += 1

    # --- operator actions: applied only from the state the operator saw --------------------

    def _operator(self, data, method, allowed, after):
        event_id = data.draw(st.sampled_from(sorted(self.model.events)))
        event = self.model.events[event_id]
        expect = data.draw(st.sampled_from((None, event.status) + STATES))
        applied = self.run(method(event_id, expect=expect))
        assert applied == (event.status in allowed and expect in (None, event.status))
        if applied:
            event.status = after
        return applied, event

    @precondition(lambda self: self.model.events)
    @rule(data=st.data())
    def requeue(self, data):
        applied, event = self._operator(
            data, self.box.requeue, ("dead", "interrupted", "cancelled"), "pending"
        )
        if applied:
            event.attempts, event.claim_gen = 0, None
            event.available_at = self.clock.now()

    @precondition(lambda self: self.model.events)
    @rule(data=st.data())
    def cancel(self, data):
        self._operator(data, self.box.cancel, ("pending",), "cancelled")

    @precondition(lambda self: self.model.events)
    @rule(data=st.data())
    def resolve(self, data):
        self._operator(data, self.box.resolve, ("interrupted",), "done")

    @precondition(lambda self: self.model.events)
    @rule(data=st.data())
    def bury(self, data):
        self._operator(data, self.box.bury, ("interrupted", "pending"), "dead")

    # --- timers and approvals -------------------------------------------------------------

    @rule(timer_id=st.sampled_from(["t1", "t2"]), delay=st.sampled_from([0, 5, 200]))
    def add_timer(self, timer_id, delay):
        self.run(self.box.add_timer(timer_id, self.clock.now() + delay))
        self.model.timers[timer_id] = self.clock.now() + delay

    @rule(timer_id=st.sampled_from(["t1", "t2"]))
    def cancel_timer(self, timer_id):
        assert self.run(self.box.cancel_timer(timer_id)) == (
            self.model.timers.pop(timer_id, None) is not None
        )

    @rule()
    def run_scheduler(self):
        assert self.run(self.box.run_scheduler()) == self.model.run_scheduler(self.clock.now())

    @rule(request_id=st.sampled_from(["r1", "r2"]), expires_in=st.sampled_from([10, 300]))
    def request_approval(self, request_id, expires_in):
        approval = self.run(self.box.request_approval(request_id, expires_in, "do it"))
        if request_id not in self.model.approvals:
            due = self.clock.now() + expires_in
            self.model.approvals[request_id] = [due, None]
            self.model.timers[f"approval:{request_id}"] = due
        assert (approval.due, approval.answer) == tuple(self.model.approvals[request_id])

    @rule(
        request_id=st.sampled_from(["r1", "r2", "r3"]),
        answer=st.sampled_from(["yes", "no", "expire"]),
    )
    def answer_approval(self, request_id, answer):
        now = self.clock.now()
        if answer == "expire":
            got = self.run(self.box.expire_approval(request_id))
            approval = self.model.approvals.get(request_id)
            expected = "unknown" if approval is None else approval[1] or "expired"
            if approval is not None:
                self.model.store_answer(request_id, "expired", now)
        else:
            got = self.run(self.box.answer_approval(request_id, answer))
            expected = self.model.answer(request_id, answer, now)
        assert got == expected

    # --- outbox: two dispatchers, sends that hang past send_timeout and report late --------

    @precondition(lambda self: len(self.sending) < len(DISPATCHERS))
    @rule(data=st.data())
    def begin_send(self, data):
        dispatcher = data.draw(st.sampled_from([d for d in DISPATCHERS if d not in self.sending]))
        gate = self.loop.create_future()
        started: list[str] = []

        async def send(text):
            started.append(text)
            if not await gate:
                raise ConnectionError("the channel failed")

        task = self.loop.create_task(self.box.dispatch(send))

        async def until_sending():
            while not started and not task.done():
                await asyncio.sleep(0)

        self.run(until_sending())
        expected = self.model.begin_send(self.clock.now())
        assert bool(started) == (expected is not None)
        if expected is None:
            assert self.run(task) == 0
        else:
            assert started[0].count == expected[2]
            self.sending[dispatcher] = (task, gate, expected)

    @precondition(lambda self: self.sending)
    @rule(data=st.data(), ok=st.booleans())
    def end_send(self, data, ok):
        dispatcher = data.draw(st.sampled_from(sorted(self.sending)))
        task, gate, (delivery_id, attempt, count) = self.sending.pop(dispatcher)
        gate.set_result(ok)
        sent = self.run(task)
        assert sent == (count if self.model.end_send(delivery_id, attempt, ok) else 0)

    @invariant()
    def the_inbox_agrees_with_the_model(self):
        read = _read_postgresql if self.backend == "postgresql" else _read_sqlite
        (
            rows,
            counts,
            actual,
            lease,
            messages,
            outbox,
            deliveries,
            timers,
            approvals,
            effects,
            open_runs,
            refused,
            done_twice,
        ) = read(self.path)
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
        assert outbox == [tuple(m) for m in self.model.outbox]
        assert deliveries == [
            (i, d.status, d.attempts, d.retry_after)
            for i, d in sorted(self.model.deliveries.items())
        ]
        assert timers == self.model.timers
        assert approvals == self.model.approvals
        assert effects == self.model.effects
        assert open_runs == {i for i, r in self.model.runs.items() if r.open}
        assert refused == self.model.refused
        requeued = any(
            e.attempts == 0 and e.status != "pending" for e in self.model.events.values()
        )
        if not requeued:
            assert done_twice == []


InboxMachine.TestCase.settings = settings(
    max_examples=150,
    stateful_step_count=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_lease_and_claim_rules = InboxMachine.TestCase


def _read_sqlite(path: str) -> tuple:
    """What the invariant reads, from the inbox file."""
    db = sqlite3.connect(path)
    try:
        rows = {
            r[0]: r[1:] for r in db.execute("SELECT id, status, attempts, claim_gen FROM events")
        }
        counts = dict(db.execute("SELECT status, n FROM event_counts"))
        actual = dict(db.execute("SELECT status, count(*) FROM events GROUP BY status"))
        lease = db.execute("SELECT holder, gen, until FROM lease").fetchone()
        messages = db.execute("SELECT count(*) FROM outbox").fetchone()[0]
        outbox = db.execute("SELECT status, delivery_id FROM outbox ORDER BY id").fetchall()
        deliveries = db.execute(
            "SELECT id, status, attempts, retry_after FROM deliveries ORDER BY id"
        ).fetchall()
        timers = dict(db.execute("SELECT id, due FROM timers"))
        approvals = {
            r[0]: [r[1], r[2]] for r in db.execute("SELECT request_id, due, answer FROM approvals")
        }
        effects = db.execute("SELECT run_id, key FROM effects ORDER BY id").fetchall()
        open_runs = {r[0] for r in db.execute("SELECT id FROM runs WHERE outcome IS NULL")}
        refused = db.execute("SELECT value FROM meta WHERE key = 'refused_writes'").fetchone()[0]
        done_twice = db.execute(
            "SELECT value, count(*) FROM runs, json_each(runs.event_ids) "
            "WHERE outcome = 'done' GROUP BY value HAVING count(*) > 1"
        ).fetchall()
    finally:
        db.close()
    return (
        rows,
        counts,
        actual,
        lease,
        messages,
        outbox,
        deliveries,
        timers,
        approvals,
        effects,
        open_runs,
        refused,
        done_twice,
    )


def _pg_cluster():
    from tests.pg.server import cluster_or_skip

    return cluster_or_skip()


def _read_postgresql(url: str) -> tuple:
    """What the invariant reads, from the PostgreSQL inbox (the only one in its schema)."""
    import psycopg

    with psycopg.connect(url) as db:
        rows = {
            r[0]: r[1:] for r in db.execute("SELECT id, status, attempts, claim_gen FROM events")
        }
        counts = dict(db.execute("SELECT status, n FROM event_counts"))
        actual = dict(db.execute("SELECT status, count(*) FROM events GROUP BY status"))
        lease = db.execute("SELECT lease_holder, lease_gen, lease_until FROM inboxes").fetchone()
        messages = db.execute("SELECT count(*) FROM outbox").fetchone()[0]
        outbox = db.execute("SELECT status, delivery_id FROM outbox ORDER BY id").fetchall()
        deliveries = db.execute(
            "SELECT id, status, attempts, retry_after FROM deliveries ORDER BY id"
        ).fetchall()
        timers = dict(db.execute("SELECT id, due FROM timers"))
        approvals = {
            r[0]: [r[1], r[2]] for r in db.execute("SELECT request_id, due, answer FROM approvals")
        }
        effects = db.execute("SELECT run_id, key FROM effects ORDER BY id").fetchall()
        open_runs = {r[0] for r in db.execute("SELECT id FROM runs WHERE outcome IS NULL")}
        refused = db.execute("SELECT refused_writes FROM inboxes").fetchone()[0]
        done_twice = db.execute(
            "SELECT value, count(*) FROM runs, json_array_elements_text(event_ids::json) "
            "WHERE outcome = 'done' GROUP BY value HAVING count(*) > 1"
        ).fetchall()
    return (
        rows,
        counts,
        actual,
        lease,
        messages,
        outbox,
        deliveries,
        timers,
        approvals,
        effects,
        open_runs,
        refused,
        done_twice,
    )


class PostgresInboxMachine(InboxMachine):
    """The same machine on a PostgreSQL inbox (fewer examples: each costs a schema)."""

    backend = "postgresql"


PostgresInboxMachine.TestCase.settings = settings(
    max_examples=30,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_lease_and_claim_rules_on_postgresql = PostgresInboxMachine.TestCase
