"""A run's finish and the claim after it in one round trip (core/pg/tx.py
`FINISH_AND_TAKE_WITH_LOCK`, core/pg/db.py `_take`): BEGIN, the lock, a statement that
finishes the run and decides and makes the next claim, and COMMIT, in one message. It may
write only where the engine, deciding on the rows it read, writes exactly that; anywhere
else it changes nothing and the transaction runs as before (the finish with the lock, the
claim with the COMMIT).

Each case is run on twins, two inboxes of one database holding the same rows: once as a
worker finishes, once with the one-message statement switched off (the engine's own
transaction). Both must answer the same and leave the same rows behind.
"""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

import psycopg
import pytest
from hypothesis import strategies as st

import onwatch.core.pg.db as pg_db
from onwatch.core import Inbox
from onwatch.core.engine import runs
from onwatch.core.records import Reply
from tests.pg.test_take import _rows, answered, hold, opened, twins_agree

T = 1_000_000


def _record(monkeypatch) -> list[str]:
    """What every psycopg connection of this process sends from now on, as its kind: a
    transaction's first message by the session statement it executes with the lock,
    EXECUTE onwatch_claim "claim", else its first word (a session's PREPAREs left out)."""
    sent: list[str] = []
    execute = psycopg.Connection.execute
    kinds = ("finish_take", "take", "finish", "look", "claim")

    def recorded(self, query, *args, **kwargs):
        text = str(query)
        if not text.startswith(("PREPARE", "SELECT name FROM pg_prepared_statements")):
            kind = next((k for k in kinds if f"EXECUTE onwatch_{k}(" in text), None)
            sent.append(kind or text.split()[0].rstrip(";"))
        return execute(self, query, *args, **kwargs)

    monkeypatch.setattr(psycopg.Connection, "execute", recorded)
    return sent


def _sql(url: str, name: str, statement: str, params: tuple = ()) -> list[tuple]:
    """`statement` on inbox `name` ({inbox} stands for its id); its rows, if any."""
    with psycopg.connect(url, autocommit=True) as conn:
        [inbox] = conn.execute("SELECT id FROM inboxes WHERE name = %s", (name,)).fetchone()
        cursor = conn.execute(statement.format(inbox=inbox), params)
        return cursor.fetchall() if cursor.description else []


async def _twin(url: str, monkeypatch, name: str, one_message: bool, setup, finish) -> tuple:
    """In a new inbox `name`: `setup(box, gen)` after one run of three events was claimed,
    then `finish(box, gen, event)` (the claimed event); its answer, and what it sent."""
    box = await Inbox.open(url, name=name)
    try:
        await box.configure(max_batch=1, max_attempts=3)
        await box.ingest_batch([("hook", f"e{k}", {"k": k}) for k in range(3)], now=T)
        gen = await box.acquire("W", now=T)
        [event] = (await box.claim_next("W", gen, mark=False, now=T)).events
        await setup(box, gen)
        if not one_message:
            monkeypatch.setattr(pg_db, "TAKE_SERVER", 10**9)
        sent = _record(monkeypatch)
        try:
            answer = await finish(box, gen, event)
        except Exception as exc:  # noqa: BLE001 - compared between the twins
            answer = ("raised", type(exc).__name__, str(exc))
        finally:
            monkeypatch.undo()
        return _plain(answer), sent
    finally:
        await box.close()


def _plain(answer: Any) -> Any:
    """finish_and_claim's answer as comparable values: its claimed events without run ids."""
    if isinstance(answer, tuple) and len(answer) == 2 and answer[1] is not None:
        accepted, claimed = answer
        events = [(e.source_id, e.status, e.attempts, e.payload) for e in claimed.events]
        return accepted, events, claimed.token, claimed.more_timers
    return answer


async def _twins(url, monkeypatch, setup=None, finish=None) -> tuple[Any, list[str]]:
    """The same case on twins; asserts they answer the same and leave the same rows.
    Returns the answer and what the first (one-message) twin sent."""

    async def nothing(box, gen):
        return None

    async def finish_done(box, gen, event):
        return await box.finish_and_claim(
            "W", gen, [event.id], run=event.run_id, fire_timers=False, now=T + 10
        )

    setup, finish = setup or nothing, finish or finish_done
    first, sent = await _twin(url, monkeypatch, "one", True, setup, finish)
    second, _ = await _twin(url, monkeypatch, "two", False, setup, finish)
    assert first == second
    assert _same_rows(url, "one") == _same_rows(url, "two")
    return first, sent


def _same_rows(url: str, name: str) -> dict[str, list[tuple]]:
    """_rows, with run ids in texts (a refusal names the run) left out: they are the
    database's serial numbers, not the twins' own."""
    return {
        table: [
            tuple(re.sub(r"run \d+", "run N", v) if isinstance(v, str) else v for v in row)
            for row in rows
        ]
        for table, rows in _rows(url, name).items()
    }


async def test_a_plain_finish_and_claim_is_one_message_and_writes_what_the_engine_writes(
    url, monkeypatch
):
    answer, sent = await _twins(url, monkeypatch)
    assert sent == ["finish_take"]
    accepted, events, token, _ = answer
    assert accepted and [e[:3] for e in events] == [("e1", "running", 1)]
    assert token is not None


async def test_the_last_finish_claims_nothing_in_the_same_one_message(url, monkeypatch):
    async def setup(box, gen):
        _sql(url, box.name, "UPDATE events SET status = 'dead' WHERE inbox_id = {inbox} "
             "AND source_id <> 'e0'")  # fmt: skip

    answer, sent = await _twins(url, monkeypatch, setup)
    assert sent == ["finish_take"]
    assert answer[:2] == (True, [])


async def test_a_result_of_any_text_is_stored_as_given(url, monkeypatch):
    hostile = {"q": 'it\'s \\ "$1" ); DROP TABLE events; --', "u": "\u202e\x1b[2J é"}

    async def finish(box, gen, event):
        return await box.finish_and_claim(
            "W", gen, [event.id], run=event.run_id, result=hostile, fire_timers=False, now=T
        )

    _, sent = await _twins(url, monkeypatch, finish=finish)
    assert sent == ["finish_take"]
    [(stored,)] = _sql(url, "one", "SELECT result FROM runs WHERE inbox_id = {inbox} AND "
                       "outcome = 'done'")  # fmt: skip
    assert json.loads(stored) == hostile


# What the one message must leave to the engine (it changes nothing; the twin shows the
# engine's transaction then does what it did without it).
NOT_PLAIN = {
    "a lease of another holder": "UPDATE inboxes SET lease_holder = 'X' WHERE id = {inbox}",
    "an expired lease": "UPDATE inboxes SET lease_until = 5 WHERE id = {inbox}",
    "a paused inbox": "UPDATE inboxes SET paused = true WHERE id = {inbox}",
    "the run closed already (its answer lost)": (
        "UPDATE runs SET outcome = 'done' WHERE inbox_id = {inbox}"
    ),
    "the run recovered as lost": "UPDATE runs SET outcome = 'lost' WHERE inbox_id = {inbox}",
    "its events no longer claimed by it": (
        "UPDATE events SET status = 'pending', run_id = NULL WHERE inbox_id = {inbox} "
        "AND status = 'running'"
    ),
    "settings changed by another process": (
        "UPDATE inboxes SET settings = replace(settings, '\"max_batch\": 1', "
        "'\"max_batch\": 2') WHERE id = {inbox}"
    ),
    "a claim lost by an older generation": (
        "UPDATE events SET status = 'running', claim_gen = 0, attempts = 1 "
        "WHERE inbox_id = {inbox} AND source_id = 'e2'"
    ),
    "an event out of attempts": (
        "UPDATE events SET attempts = 3 WHERE inbox_id = {inbox} AND source_id = 'e2'"
    ),
    "a next payload that is not JSON": (
        "UPDATE events SET payload = '{{\"a\": ' WHERE inbox_id = {inbox} AND source_id = 'e1'"
    ),
}


@pytest.mark.parametrize("case", sorted(NOT_PLAIN))
async def test_a_case_that_is_not_plain_changes_nothing_and_the_engine_decides(
    url, monkeypatch, case
):
    async def setup(box, gen):
        _sql(url, box.name, NOT_PLAIN[case])

    _, sent = await _twins(url, monkeypatch, setup)
    assert sent[0] == "finish_take" and len(sent) > 1  # then the engine's transaction


async def test_a_due_timer_is_fired_by_the_engines_transaction_when_the_claim_fires_timers(
    url, monkeypatch
):
    async def setup(box, gen):
        await box.add_timer("tick", T + 5, {"t": 1})

    async def finish(box, gen, event):
        return await box.finish_and_claim(
            "W", gen, [event.id], run=event.run_id, fire_timers=True, now=T + 10
        )

    _, sent = await _twins(url, monkeypatch, setup, finish)
    assert sent[0] == "finish_take" and len(sent) > 1


@pytest.mark.parametrize("extra", ["a reply", "an approval request", "a follow-up timer"])
async def test_a_finish_that_writes_more_than_its_rows_never_sends_the_one_message(
    url, monkeypatch, extra
):
    from onwatch.core.records import ApprovalRequest, FollowUp

    more: dict[str, Any] = {
        "a reply": {"messages": [Reply("hello")]},
        "an approval request": {"approvals": [ApprovalRequest("r1", 60, "refund")]},
        "a follow-up timer": {"timers": [FollowUp("later", T + 100, None)]},
    }[extra]

    async def finish(box, gen, event):
        return await box.finish_and_claim(
            "W", gen, [event.id], run=event.run_id, fire_timers=False, now=T + 10, **more
        )

    _, sent = await _twins(url, monkeypatch, finish=finish)
    assert "finish_take" not in sent


async def test_a_finish_made_with_the_lock_that_the_engine_does_not_make_is_said(url, monkeypatch):
    """The engine decides on the rows the statement read and must make the finish and the
    claim it made; if it asks for anything else, the transaction is over and the error
    says so."""
    box = await Inbox.open(url)
    try:
        await box.configure(max_batch=1)
        await box.ingest_batch([("hook", f"e{k}", None) for k in range(2)], now=T)
        gen = await box.acquire("W", now=T)
        [event] = (await box.claim_next("W", gen, now=T)).events

        def claims_nothing(tx, holder, gen, now, timers, mark, state=None):
            return runs.Claimed([], None, state.settings, False)

        monkeypatch.setattr(runs, "claim_next", claims_nothing)
        with pytest.raises(RuntimeError, match="not the engine's"):
            await box.finish_and_claim(
                "W", gen, [event.id], run=event.run_id, fire_timers=False, now=T
            )
    finally:
        await box.close()


# Any state of an inbox's rows a finish and the claim after it may meet, drawn at random:
# both twins must answer the same and leave the same rows, whichever path the first takes.
# The finish is made by generation 2 of holder W; each value is drawn so that about half
# of the states are the plain case (the one message writes) and the rest miss it in
# every way it can be missed.
GEN = 2
_EVENT = st.tuples(
    st.sampled_from(["pending"] * 4 + ["running", "dead", "done"]),
    st.sampled_from([0, 0, 0, 1, 2, 3, 4]),  # attempts (max_attempts is 3)
    st.sampled_from([None, None, None, GEN, 1, 3]),  # claim_gen
    st.sampled_from([-5, -5, 10, 100]),  # available_at, from the state's time (finished at +10)
    st.sampled_from(['{"a": [1]}'] * 4 + ["null", None, "{", "NaN"]),  # payload
    st.booleans(),  # in the run being finished
    st.booleans(),  # named by the finish
)
# The finished run's own events: as its claim left them, or not quite.
_OWN = st.tuples(
    st.sampled_from(["running"] * 9 + ["done", "pending"]),
    st.integers(1, 3),
    st.sampled_from([GEN] * 9 + [1, 3]),
    st.just(-5),
    st.sampled_from(['{"a": [1]}', "null"]),
    st.sampled_from([True] * 9 + [False]),
    st.sampled_from([True] * 9 + [False]),
)
# Events the claim after the finish may take.
_READY = st.tuples(
    st.just("pending"),
    st.sampled_from([0, 0, 1]),
    st.none(),
    st.just(-5),
    st.sampled_from(['{"a": [1]}', "null"]),
    st.just(False),
    st.just(False),
)
_STATE = st.fixed_dictionaries(
    {
        "events": st.builds(
            lambda own, ready, others: own + ready + others,
            st.lists(_OWN, min_size=1, max_size=2),
            st.lists(_READY, max_size=3),
            st.lists(_EVENT, max_size=1),
        ),
        "holder": st.sampled_from(["W"] * 9 + ["X"]),
        "gen": st.sampled_from([GEN] * 9 + [1, 3]),
        "until": st.sampled_from([100] * 9 + [0]),  # from the state's time
        "paused": st.sampled_from([False] * 9 + [True]),
        "timer": st.sampled_from([None, None, None, 0, 1000]),
        "server_clock": st.booleans(),
        "max_batch": st.integers(1, 3),
        "run_gen": st.sampled_from([GEN] * 9 + [1, 3]),
        "run_outcome": st.sampled_from([None] * 9 + ["done", "lost"]),
        "timers": st.booleans(),
        "mark": st.booleans(),
        "result": st.sampled_from([None, {"ok": 1}]),
    }
)


async def _finish_in(url: str, name: str, state: dict, one_message: bool, at: int) -> tuple:
    """finish_and_claim by generation GEN of holder W in a new inbox `name` holding
    `state`'s rows (its run's own among them), its times counted from `at` (the finish made
    at `at` + 10, or by the server's clock)."""
    box = await opened(url, name, state, at)
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            [inbox] = conn.execute("SELECT id FROM inboxes WHERE name = %s", (name,)).fetchone()
            [(run,)] = conn.execute(
                "INSERT INTO runs(inbox_id, holder, gen, event_ids, claimed_at, outcome) "
                "VALUES (%s, 'W', %s, '[]', %s, %s) RETURNING id",
                (inbox, state["run_gen"], at, state["run_outcome"]),
            ).fetchall()
            hold(conn, inbox, state, at, run)
        named = [n + 1 for n, event in enumerate(state["events"]) if event[6]]
        answer = await answered(
            one_message,
            box.finish_and_claim(
                "W",
                GEN,
                named,
                run=run,
                result=state["result"],
                fire_timers=state["timers"],
                mark=state["mark"],
                now=None if state["server_clock"] else at + 10,
            ),
        )
        if answer[0] == "raised":
            return answer
        accepted, claimed = answer
        if claimed is None:
            return (accepted, None)
        events = [(e.source_id, e.status, e.attempts) for e in claimed.events]
        return (accepted, events, claimed.token, claimed.more_timers)
    finally:
        await box.close()


def test_any_state_a_finish_meets_is_decided_the_same_with_or_without_the_one_message(pg):
    twins_agree(pg, _STATE, _finish_in, 200, rows=_same_rows)


async def _worker_until_idle(url: str, monkeypatch, name: str, agent) -> list[str]:
    """A ListeningWorker on inbox `name` (one event in it) until it first naps idle after a
    run: the kinds of message it sent (see _record)."""
    from onwatch.core.runtime.listening_worker import ListeningWorker
    from tests.waiting import until

    box = await Inbox.open(url, name=name)
    await box.ingest("chat", "m1", {})
    sent = _record(monkeypatch)
    worker = ListeningWorker(box, agent, holder="w", poll_interval=0.1)
    napped = asyncio.Event()
    nap = worker._nap

    async def noted(seen: int, seconds: float) -> bool:
        if worker.stats.runs:
            napped.set()
        return await nap(seen, seconds)

    worker._nap = noted  # type: ignore[method-assign]
    task = asyncio.create_task(worker.run())
    try:
        await until(napped.is_set, what="the worker idle after its runs")
        return list(sent)
    finally:
        worker.request_stop()
        await task
        await box.close()


async def test_a_worker_that_ran_its_inbox_dry_naps_without_claiming_again(url, monkeypatch):
    """The last finish's claim found nothing, and read with it that no timer is due: that
    claim is the worker's last look before it naps. It claimed once more (a transaction with
    the lock: every time a PostgreSQL worker went idle), to fire timers it knew of none."""

    async def agent(batch, ctx) -> None:
        return None

    sent = await _worker_until_idle(url, monkeypatch, "dry", agent)
    after = sent[sent.index("finish_take") + 1 :]
    assert "take" not in after and "claim" not in after, sent


async def test_a_timer_due_when_the_last_finish_claimed_nothing_fires_before_the_nap(
    url, monkeypatch
):
    """The same finish, with a timer come due during the run (set by another process): the
    finish's claim says so, and the worker claims again at once, firing it, before it naps."""
    other = await Inbox.open(url, name="timed")

    async def agent(batch, ctx) -> None:
        if batch[0].source == "chat":
            await other.add_timer("nudge", due=1)  # long past: due now

    try:
        sent = await _worker_until_idle(url, monkeypatch, "timed", agent)
        assert [e.source for e in await other.events("done")] == ["chat", "timer"], sent
    finally:
        await other.close()
