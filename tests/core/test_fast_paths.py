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

from core import BadInput, FakeClock, Inbox

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
