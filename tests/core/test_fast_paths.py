"""Shortcuts the engine takes for speed give the answers of the long way.

A renewal that changes nothing is answered by a read of committed state, without a write
transaction: another process's takeover or settings change, made with plain sqlite3 between
two calls, must still be seen. Payload encoding skips work for flat objects and reuses one
encoder: the stored text must be what the standard encoder writes, and a cyclic or too deep
value must still be refused with nothing stored.
"""

from __future__ import annotations

import json
import sqlite3

import pytest

from onwatch.core import BadInput, BudgetExceeded, FakeClock, Inbox

from .conftest import T


def sql(path: str, statement: str, params: tuple = ()) -> list[tuple]:
    db = sqlite3.connect(path, isolation_level=None)
    try:
        return db.execute(statement, params).fetchall()
    finally:
        db.close()


async def test_a_renewal_to_the_same_expiry_writes_nothing(inbox, path):
    gen = await inbox.acquire("A", now=T)
    token = await inbox.change_token()
    for _ in range(3):
        assert await inbox.acquire("A", now=T) == gen
    assert await inbox.change_token() == token  # no transaction changed anything
    assert await inbox.renew("A", gen, now=T)
    assert await inbox.change_token() == token
    assert sql(path, "SELECT holder, gen, until FROM lease") == [("A", gen, T + 120)]
    assert await inbox.acquire("A", now=T + 7) == gen  # a later instant: a real renewal
    assert sql(path, "SELECT until FROM lease") == [(T + 127,)]


async def test_the_read_sees_another_process_take_over_or_change_the_ttl(inbox, path):
    gen = await inbox.acquire("A", now=T)
    # Another process takes the lease over (written with plain sqlite3, committed).
    sql(path, "UPDATE lease SET holder = 'B', gen = ? WHERE id = 1", (gen + 1,))
    assert await inbox.acquire("A", now=T) is None
    sql(path, "UPDATE lease SET holder = 'A', gen = ? WHERE id = 1", (gen + 1,))
    assert await inbox.acquire("A", now=T) == gen + 1
    # Another process changes the lease TTL: the same instant now means a new expiry.
    other = await Inbox.open(path, clock=FakeClock(T))
    try:
        await other.configure(lease_ttl=300)
    finally:
        await other.close()
    assert await inbox.acquire("A", now=T) == gen + 1
    assert sql(path, "SELECT until FROM lease") == [(T + 300,)]
    # A generation edited by hand is never answered by the read: acquire repairs it.
    sql(path, "UPDATE lease SET gen = 'x' WHERE id = 1")
    repaired = await inbox.acquire("A", now=T)  # continues the recorded history
    assert type(repaired) is int and repaired > gen
    assert sql(path, "SELECT holder, gen FROM lease") == [("A", repaired)]


@pytest.mark.parametrize(
    "value",
    [
        {"n": 1, "text": "plain", "f": 1.5, "ok": True, "none": None},
        {"ü": '日本 \u2028 "quoted" \\', "big": 10**30, "neg": -0.0},
        {"nested": {"list": [1, (2, 3), {"x": []}]}},
        [1, "two", None],
        "a string",
        42,
        2.5,
        None,
        {},
        {1: "int key", 2.5: "float key", None: "null key", False: "bool key"},
    ],
)
async def test_stored_payload_text_is_what_the_standard_encoder_writes(inbox, path, value):
    assert await inbox.ingest("hook", "k", value)
    [(stored,)] = sql(path, "SELECT payload FROM events")
    assert stored == json.dumps(value, ensure_ascii=False, allow_nan=False)
    assert (await inbox.events("pending"))[0].payload == json.loads(stored)


async def test_values_the_encoder_must_not_take_are_refused_and_nothing_is_stored(inbox, path):
    cyclic: dict = {"a": 1}
    cyclic["self"] = cyclic
    flat_subclass = type("Text", (str,), {})("fine")  # not an exact str: takes the walk
    deep: list = []
    for _ in range(150):
        deep = [deep]
    for bad in (
        cyclic,
        deep,
        {"nan": float("nan")},
        {"set": {1}},
        {"bytes": b"x"},
        {"flat but too many values": 1, **{str(i): i for i in range(70_000)}},
    ):
        with pytest.raises(BadInput):
            await inbox.ingest("hook", "bad", bad)
    assert sql(path, "SELECT count(*) FROM events") == [(0,)]
    assert await inbox.ingest("hook", "subclass", {"v": flat_subclass})
    assert sql(path, "SELECT payload FROM events") == [('{"v": "fine"}',)]


class Recording(sqlite3.Connection):
    """A connection that keeps the statements it was asked to run."""

    statements: list[str] = []

    def execute(self, sql, *args):  # type: ignore[override]
        Recording.statements.append(sql.split()[0].upper())
        return super().execute(sql, *args)


async def test_a_lone_ingest_is_one_statement_and_a_duplicate_still_says_false(tmp_path):
    path = str(tmp_path / "one.db")
    box = await Inbox.open(path, clock=FakeClock(T), connection_factory=Recording)
    try:
        assert await box.ingest("chat", "m1", {"n": 1})  # the first reads the settings
        Recording.statements.clear()
        assert await box.ingest("chat", "m2", {"n": 2})
        assert Recording.statements == ["INSERT"]  # no BEGIN, no COMMIT statement
        # A key another process stored: the statement stores nothing, the whole rule answers.
        sql(
            path,
            "INSERT INTO events(source, source_id, payload, available_at, created, updated) "
            "VALUES ('chat', 'm0', '\"theirs\"', 1, 1, 1)",
        )
        Recording.statements.clear()
        assert await box.ingest("chat", "m0", "ours") is False
        assert Recording.statements == ["INSERT", "BEGIN", "SELECT", "INSERT", "COMMIT"]
    finally:
        await box.close()
    assert sql(path, "SELECT source_id, payload FROM events ORDER BY id") == [
        ("m1", '{"n": 1}'),
        ("m2", '{"n": 2}'),
        ("m0", '"theirs"'),
    ]


async def test_the_one_statement_ingest_keeps_limits_another_process_set(tmp_path):
    path = str(tmp_path / "limits.db")
    box = await Inbox.open(path, clock=FakeClock(T))
    try:
        assert await box.ingest("chat", "m1", "first")
        # Another process sets a pending budget the first event already fills.
        other = await Inbox.open(path, clock=FakeClock(T))
        try:
            await other.configure(max_pending=1)
        finally:
            await other.close()
        with pytest.raises(BudgetExceeded):
            await box.ingest("chat", "m2", "over the budget")
        # ... then lifts it and lowers the payload limit below what this Inbox last read.
        sql(path, "UPDATE settings SET json = json_set(json, '$.max_pending', NULL)")
        other = await Inbox.open(path, clock=FakeClock(T))
        try:
            await other.configure(max_payload_bytes=16)
        finally:
            await other.close()
        with pytest.raises(BadInput):
            await box.ingest("chat", "m3", "x" * 100)
        assert await box.ingest("chat", "m4", "small")
    finally:
        await box.close()
    assert sql(path, "SELECT source_id FROM events ORDER BY id") == [("m1",), ("m4",)]
