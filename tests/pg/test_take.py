"""A woken worker's claim in one round trip (core/pg/tx.py `TAKE_WITH_LOCK`, core/pg/db.py
`_take`): BEGIN, the lock, a statement that decides and makes the claim, and COMMIT, in one
message. It may claim only where the engine, deciding on the rows it read, claims exactly
that; anywhere else it changes nothing and the transaction runs as before.

Each case here is run twice on two inboxes of one database holding the same rows: once as a
worker claims (the statement sent with the lock), once with that statement switched off
(the engine's own transaction). Both must answer the same and leave the same rows behind;
the messages sent say which path was taken.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from typing import Any, Awaitable, Callable

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import onwatch.core.pg.db as pg_db
from onwatch.core import Inbox
from onwatch.core.pg.tx import TAKE_DIGITS

T = 1_000_000
ONE_MESSAGE = ["take"]  # BEGIN, the lock, the take and COMMIT
# The take found the case not plain (it changed nothing), then the engine's transaction:
# the lock with the look, then (when it claims) the claim with COMMIT.
MISSED = ["take", "look"]
_KINDS = ("take", "look", "claim", "finish")


@pytest.fixture
def record(monkeypatch) -> Callable[[], list[str]]:
    """`record()` starts recording each message any psycopg connection sends, as its kind:
    a transaction's first message by the session statement it executes with the lock
    (take, look), one that executes onwatch_claim "claim", else its first word. A session
    preparing its statements (its first use of each) is left out."""

    def start() -> list[str]:
        sent: list[str] = []
        execute = psycopg.Connection.execute

        def recorded(self, query, *args, **kwargs):
            text = str(query)
            if text.startswith(("PREPARE", "SELECT name FROM pg_prepared_statements")):
                return execute(self, query, *args, **kwargs)
            kind = next((k for k in _KINDS if f"EXECUTE onwatch_{k}" in text), None)
            sent.append(kind or text.split()[0].rstrip(";"))
            return execute(self, query, *args, **kwargs)

        monkeypatch.setattr(psycopg.Connection, "execute", recorded)
        return sent

    return start


# Columns that differ between two inboxes holding the same rows: their own ids and uids,
# the database-wide serial ids of runs and audit rows, a random salt.
_VOLATILE = {"inbox_id", "name", "uid", "key_salt", "run_id"}
_SERIAL = {"runs", "audit", "lease_history", "outbox", "deliveries", "approvals", "effects"}


def _rows(url: str, name: str) -> dict[str, list[tuple]]:
    """Every row of inbox `name`, table by table, without what differs between twins."""
    found: dict[str, list[tuple]] = {}
    with psycopg.connect(url, autocommit=True) as conn:
        [inbox] = conn.execute("SELECT id FROM inboxes WHERE name = %s", (name,)).fetchone()
        tables = conn.execute(
            "SELECT table_name, array_agg(column_name::text ORDER BY ordinal_position) "
            "FROM information_schema.columns WHERE table_schema = current_schema() "
            "GROUP BY 1 ORDER BY 1"
        ).fetchall()
        for table, columns in tables:
            if table == "inboxes":
                where = "id"
                columns = [c for c in columns if c != "created"]  # the server's clock
            elif "inbox_id" in columns:
                where = "inbox_id"
            else:
                continue
            kept = [
                c
                for c in columns
                if c not in _VOLATILE and not (c == "id" and table in _SERIAL | {"inboxes"})
            ]
            listed = ", ".join(kept)
            found[table] = conn.execute(
                f"SELECT {listed} FROM {table} WHERE {where} = %s ORDER BY {listed}", (inbox,)
            ).fetchall()
    return found


Setup = Callable[[Inbox, str, str, int], Awaitable[None]]


async def _twins(url, record, monkeypatch, setup: Setup, *, timers: bool = True):
    """Run `setup(inbox, url, name, gen)` on two inboxes, then one claim_next on each: the
    first as a worker makes it, the second with the take switched off. Returns what the
    first sent, and both answers."""
    answers, sent = [], []
    for name in ("taken", "engine"):
        box = await Inbox.open(url, name=name)
        try:
            await box.configure(max_batch=5, max_attempts=3)
            gen = await box.acquire("W", now=T)
            await setup(box, url, name, gen)
            if name == "engine":
                monkeypatch.setattr(pg_db, "TAKE_SERVER", 10**9)
            recorded = record()
            claimed = await box.claim_next("W", gen, fire_timers=timers, now=T + 10)
            sent = sent or list(recorded)
            monkeypatch.undo()
            answers.append(
                (
                    [(e.source_id, e.status, e.attempts, e.payload) for e in claimed.events],
                    claimed.token,
                    claimed.settings,
                    claimed.more_timers,
                )
            )
        finally:
            await box.close()
    assert _rows(url, "taken") == _rows(url, "engine")
    assert answers[0] == answers[1]
    return sent, answers[0]


def _sql(url: str, name: str, statement: str, params: tuple = ()) -> None:
    """`statement` on inbox `name`'s events ({inbox} stands for its id)."""
    with psycopg.connect(url, autocommit=True) as conn:
        [inbox] = conn.execute("SELECT id FROM inboxes WHERE name = %s", (name,)).fetchone()
        conn.execute(statement.format(inbox=inbox), params)


async def _events(box: Inbox, *payloads) -> None:
    await box.ingest_batch(
        [("hook", f"e{k}", p) for k, p in enumerate(payloads)] or [("hook", "e0", None)], now=T
    )


async def test_a_plain_claim_is_one_message_and_writes_what_the_engine_writes(
    url, record, monkeypatch
):
    async def setup(box, url, name, gen):
        await _events(box, {"n": 1}, [1, 2], "three", None)

    sent, (events, token, _, more) = await _twins(url, record, monkeypatch, setup)
    assert sent == ONE_MESSAGE
    assert [e[0] for e in events] == ["e0", "e1", "e2", "e3"]
    assert {e[1:3] for e in events} == {("running", 1)} and not more
    assert token is not None


async def test_nothing_to_claim_is_one_message_and_changes_nothing(url, record, monkeypatch):
    async def setup(box, url, name, gen):
        pass

    sent, (events, *_) = await _twins(url, record, monkeypatch, setup)
    assert events == [] and sent[-1:] == ONE_MESSAGE


async def test_a_retried_event_runs_alone_as_the_engine_picks_it(url, record, monkeypatch):
    async def setup(box, url, name, gen):
        await _events(box, 1, 2, 3)
        _sql(url, name, "UPDATE events SET attempts = 1 WHERE inbox_id = {inbox} AND id = 2")

    sent, (events, *_) = await _twins(url, record, monkeypatch, setup)
    assert events == [("e1", "running", 2, 2)] and sent[-1:] == ONE_MESSAGE


async def test_a_payload_nested_as_deep_as_the_bound_is_taken(url, record, monkeypatch):
    depth = sys.getrecursionlimit() // 2
    nested = "[" * depth + "]" * depth

    async def setup(box, url, name, gen):
        await _events(box, 1)
        _sql(url, name, "UPDATE events SET payload = %s WHERE inbox_id = {inbox}", (nested,))

    sent, (events, *_) = await _twins(url, record, monkeypatch, setup)
    assert len(events) == 1 and sent[-1:] == ONE_MESSAGE


# Each case the statement must leave to the engine: what makes it not plain, and what the
# engine then does (the twin shows it is the same as without the take).
NOT_PLAIN = {
    "a lease of another holder": "UPDATE inboxes SET lease_holder = 'X' WHERE id = {inbox}",
    "an expired lease": "UPDATE inboxes SET lease_until = 5 WHERE id = {inbox}",
    "a paused inbox": "UPDATE inboxes SET paused = true WHERE id = {inbox}",
    "settings changed by another process": (
        "UPDATE inboxes SET settings = replace(settings, '\"max_batch\": 5', "
        "'\"max_batch\": 2') WHERE id = {inbox}"
    ),
    "a claim lost by an older generation": (
        "UPDATE events SET status = 'running', claim_gen = 0, attempts = 1 "
        "WHERE inbox_id = {inbox} AND id = 1"
    ),
    "an event out of attempts": (
        "UPDATE events SET attempts = 3 WHERE inbox_id = {inbox} AND id = 2"
    ),
    "a pruned payload": "UPDATE events SET payload = NULL WHERE inbox_id = {inbox} AND id = 1",
    "a payload that is not JSON": (
        "UPDATE events SET payload = '{{\"a\": ' WHERE inbox_id = {inbox} AND id = 1"
    ),
    "a payload Python reads but the server does not": (
        "UPDATE events SET payload = 'NaN' WHERE inbox_id = {inbox} AND id = 1"
    ),
    "a payload nested deeper than Python reads": (
        "UPDATE events SET payload = repeat('[', 5000) || repeat(']', 5000) "
        "WHERE inbox_id = {inbox} AND id = 1"
    ),
    "an integer too long for Python": (
        f"UPDATE events SET payload = repeat('7', {TAKE_DIGITS * 20}) "
        "WHERE inbox_id = {inbox} AND id = 1"
    ),
}


@pytest.mark.parametrize("case", sorted(NOT_PLAIN))
async def test_a_case_that_is_not_plain_changes_nothing_and_the_engine_decides(
    url, record, monkeypatch, case
):
    async def setup(box, url, name, gen):
        await _events(box, 1, 2, 3)
        _sql(url, name, NOT_PLAIN[case])

    sent, _ = await _twins(url, record, monkeypatch, setup)
    assert sent[:2] == MISSED


async def test_a_due_timer_fires_in_the_engines_transaction_and_joins_the_claim(
    url, record, monkeypatch
):
    async def setup(box, url, name, gen):
        await _events(box, 1)
        await box.add_timer("tick", T + 5, {"t": 1})

    sent, (events, *_) = await _twins(url, record, monkeypatch, setup)
    assert sent[:2] == MISSED
    assert len(events) == 2  # the event and the timer's


async def test_a_due_timer_is_left_alone_by_a_claim_that_fires_none(url, record, monkeypatch):
    async def setup(box, url, name, gen):
        await _events(box, 1)
        await box.add_timer("tick", T + 5, {"t": 1})

    sent, (events, *_) = await _twins(url, record, monkeypatch, setup, timers=False)
    assert sent[-1:] == ONE_MESSAGE and [e[0] for e in events] == ["e0"]


async def test_settings_with_a_budget_never_send_the_take(url, record):
    box = await Inbox.open(url)
    try:
        await box.configure(max_runs_per_day=100)
        await _events(box, 1)
        gen = await box.acquire("W", now=T)
        sent = record()
        claimed = await box.claim_next("W", gen, now=T)
        assert len(claimed.events) == 1
        assert "take" not in sent and sent[0] == "look" and sent[-1] == "claim"
    finally:
        await box.close()


async def test_the_claim_after_a_case_not_plain_reads_its_look_then_takes_again(url, record):
    """A case not plain costs its message: the claim after it does not try again (the same
    case may hold); the one after that does."""
    box = await Inbox.open(url)
    try:
        await box.configure(max_batch=1)
        await _events(box, 1, 2, 3)
        gen = await box.acquire("W", now=T)
        await box.pause(actor="op", reason="test")
        sent = record()
        assert (await box.claim_next("W", gen, now=T)).events == []
        assert sent == [*MISSED, "COMMIT"]
        del sent[:]
        assert (await box.claim_next("W", gen, now=T)).events == []
        assert sent == ["look", "COMMIT"]  # nothing to claim
        await box.resume(actor="op", reason="test")
        del sent[:]
        claimed = await box.claim_next("W", gen, now=T)
        assert [e.source_id for e in claimed.events] == ["e0"] and sent == ONE_MESSAGE
    finally:
        await box.close()


async def test_a_take_made_for_a_claim_the_engine_does_not_make_is_said(url, monkeypatch):
    """The engine decides on the rows the statement read and must make the claim it made;
    if it asks for anything else, the transaction is over and the error says so."""
    from onwatch.core.engine import runs

    box = await Inbox.open(url)
    try:
        await _events(box, 1, 2)
        gen = await box.acquire("W", now=T)
        real = runs._claim

        def claims_one_less(tx, state, holder, gen, now):
            tx.claim(holder, gen, [1], now)
            raise AssertionError("unreachable")

        monkeypatch.setattr(runs, "_claim", claims_one_less)
        with pytest.raises(RuntimeError, match="not the engine's"):
            await box.claim_next("W", gen, now=T)
        monkeypatch.setattr(runs, "_claim", real)
    finally:
        await box.close()


# What the statement's check lets through must be JSON Python reads: hostile texts, and
# texts built from JSON's own pieces.
HOSTILE = [
    "NaN",
    "[Infinity]",
    "\ufeff{}",
    "[1,]",
    "{'a': 1}",
    '"\t"',
    '"\\ud800"',
    '"\\u0000"',
    "1" * 5000,
    "[" * 2000 + "]" * 2000,
    "{}" * 2,
    "  [1e999]  ",
    "-0",
    "01",
    '{"a": 1, "a": 2}',
    "\x0c[]",
    "[1]\x0b",
]
_PIECE = st.sampled_from(
    [
        "[",
        "]",
        "{",
        "}",
        ",",
        ":",
        '"',
        "\\",
        "u",
        "d800",
        "0",
        "1",
        "-",
        ".",
        "e",
        "+",
        "9" * 300,
        "true",
        "null",
        "NaN",
        " ",
        "\t",
        "\n",
        "\x0c",
        "\x00",
        "a",
        "é",
        "\ud800",
    ]
)


def _passes(conn, text: str, depth: int) -> bool:
    return conn.execute(
        "SELECT %(t)s IS JSON AND length(%(t)s) - length(translate(%(t)s, '[{', '')) <= %(d)s"
        f" AND %(t)s !~ '[0-9]{{{TAKE_DIGITS}}}'",
        {"t": text, "d": depth},
    ).fetchone()[0]


def test_what_the_payload_check_passes_python_reads(pg):
    url = pg.new_database(schema=False)
    depth = sys.getrecursionlimit() // 2
    with psycopg.connect(url, autocommit=True) as conn:
        for text in HOSTILE:
            if _passes(conn, text, depth):
                json.loads(text)

        @settings(max_examples=400, deadline=None, suppress_health_check=list(HealthCheck))
        @given(st.lists(_PIECE, max_size=40).map("".join))
        def passes_only_what_python_reads(text: str) -> None:
            text = text.replace("\x00", "")  # a text column cannot hold NUL
            try:
                text.encode()
            except UnicodeEncodeError:
                return  # a lone surrogate cannot be sent (nor stored by an ingest)
            if _passes(conn, text, depth):
                json.loads(text)

        passes_only_what_python_reads()


# Any state of an inbox's rows a claim may meet, drawn at random: both twins must answer
# the same and leave the same rows, whichever path the first one takes.
_EVENT = st.tuples(
    st.sampled_from(["pending", "running", "dead", "done"]),
    st.integers(0, 4),  # attempts (max_attempts is 3)
    st.sampled_from([None, 1, 2, 3]),  # claim_gen
    st.sampled_from([-5, 10, 100]),  # available_at, from the state's time (claimed at +10)
    st.sampled_from(["null", '{"a": [1]}', None, "{", "NaN"]),  # payload
)
_STATE = st.fixed_dictionaries(
    {
        "events": st.lists(_EVENT, max_size=6),
        "holder": st.sampled_from(["W", "X"]),
        "gen": st.integers(1, 3),
        "until": st.sampled_from([0, 100]),  # from the state's time
        "paused": st.booleans(),
        "timer": st.sampled_from([None, 0, 1000]),
        "server_clock": st.booleans(),  # the claim by the server's clock, not a given time
        "max_batch": st.integers(1, 3),
        "claim_gen": st.integers(1, 3),
        "timers": st.booleans(),
        "mark": st.booleans(),
    }
)


async def opened(url: str, name: str, state: dict, at: int) -> Inbox:
    """A new inbox `name` with `state`'s max_batch (max_attempts 3) and timer (due at `at`
    plus its value), whose connection has read its settings with a lock."""
    box = await Inbox.open(url, name=name)
    try:
        await box.configure(max_batch=state["max_batch"], max_attempts=3)
        await box.acquire("W", now=T)
        if state["timer"] is not None:
            await box.add_timer("tick", at + state["timer"], None)
    except BaseException:
        await box.close()
        raise
    return box


async def answered(one: bool, call: Awaitable[Any]) -> Any:
    """`call`'s answer, made with the one-message statements (`one`) or without them (as
    on a server before version 16); an error it raised as ("raised", its type, its text)."""
    saved = pg_db.TAKE_SERVER
    pg_db.TAKE_SERVER = saved if one else 10**9
    try:
        return await call
    except Exception as exc:  # noqa: BLE001 - compared between the twins
        return ("raised", type(exc).__name__, str(exc))
    finally:
        pg_db.TAKE_SERVER = saved


def hold(conn, inbox: int, state: dict, at: int, run: int | None = None) -> None:
    """Give inbox `inbox` the lease and pause switch of `state` and its events: status,
    attempts, claim_gen, available_at (counted from `at`), payload, and (optionally) whether
    it belongs to run `run`."""
    conn.execute(
        "UPDATE inboxes SET lease_holder = %s, lease_gen = %s, lease_until = %s, "
        "paused = %s WHERE id = %s",
        (state["holder"], state["gen"], at + state["until"], state["paused"], inbox),
    )
    for n, (status, attempts, gen, available, payload, *more) in enumerate(state["events"]):
        conn.execute(
            "INSERT INTO events(inbox_id, id, source, source_id, payload, status, "
            "attempts, claim_gen, claimed_at, available_at, created, updated, run_id) "
            "VALUES (%s, %s, 'hook', %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)",
            (
                inbox,
                n + 1,
                f"e{n}",
                payload,
                status,
                attempts,
                gen,
                None if gen is None else at,
                at + available,
                at,
                at,
                run if more and more[0] else None,
            ),
        )


async def _claim_in(url: str, name: str, state: dict, take: bool, at: int) -> tuple:
    """claim_next in a new inbox `name` holding `state`'s rows, its times counted from `at`
    (the claim is made at `at` + 10, or by the server's clock)."""
    box = await opened(url, name, state, at)
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            [inbox] = conn.execute("SELECT id FROM inboxes WHERE name = %s", (name,)).fetchone()
            hold(conn, inbox, state, at)
        claimed = await answered(
            take,
            box.claim_next(
                "W",
                state["claim_gen"],
                fire_timers=state["timers"],
                mark=state["mark"],
                now=None if state["server_clock"] else at + 10,
            ),
        )
        if isinstance(claimed, tuple):
            return claimed
        return (
            [(e.source_id, e.status, e.attempts, e.payload) for e in claimed.events],
            claimed.token,
            claimed.more_timers,
        )
    finally:
        await box.close()


def _timeless(answer: tuple) -> tuple:
    """A claim's answer without its events' payloads (a timer's says how late it fired)."""
    if answer[0] == "raised":
        return answer
    return ([event[:3] for event in answer[0]], *answer[1:])


def twins_agree(pg, states, twin, examples: int, rows=_rows, timeless=lambda a: a) -> None:
    """For each of `examples` states drawn from `states`, `twin(url, name, state, one, at)`
    run on two new inboxes, once with the one-message statement (`one` True) and once
    without, must answer the same and leave the same `rows`. By the server's clock
    (`state["server_clock"]`) the state's times are counted from a few seconds before it
    (both twins act within them) and the twins' times may differ by a second: their
    answers are compared `timeless`, their rows not at all."""
    url = pg.new_database()
    names = iter(range(10**6))

    @settings(max_examples=examples, deadline=None, suppress_health_check=list(HealthCheck))
    @given(states)
    def same(state: dict) -> None:
        n = next(names)
        at = int(time.time()) - 5 if state["server_clock"] else T
        one = asyncio.run(twin(url, f"o{n}", state, True, at))
        two = asyncio.run(twin(url, f"t{n}", state, False, at))
        if state["server_clock"]:
            one, two = timeless(one), timeless(two)
        assert one == two
        if not state["server_clock"]:
            assert rows(url, f"o{n}") == rows(url, f"t{n}")

    same()


def test_any_state_a_claim_meets_is_decided_the_same_with_or_without_the_take(pg):
    twins_agree(pg, _STATE, _claim_in, 150, timeless=_timeless)
