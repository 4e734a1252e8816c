"""Plain timers fired by set statements (SqliteTx.fire_plain_timers) write exactly what the
scheduler's own planner writes for the same rows: the same events in the same order with the
same payloads, the same timers moved on, deleted or set aside with the same reasons.

Each example writes the same timer rows, valid ones and values no valid call could store
(written by hand with the CHECK constraints off), into two copies of one inbox, fires one copy
with the set statements and the other with the planner alone, and compares every table.
"""

from __future__ import annotations

import json
import shutil
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from onwatch.core.engine import scheduler
from onwatch.core.sqlite import schema
from onwatch.core.sqlite.db import write_transaction
from onwatch.core.sqlite.tx import SqliteTx

NOW = 1_700_000_000
HOUR = 3600

# A valid value of each column (what the engine's own calls store), and hostile ones.
VALID = {
    "id": st.one_of(
        st.from_regex(r"[a-z]{1,3}-[0-9]{1,2}", fullmatch=True),
        st.sampled_from(["ïd-ü", "日本", 'q"uote', "back\\slash", "tab\there", "a@b"]),
    ),
    "due": st.integers(NOW - 3 * HOUR, NOW + 60),
    "every": st.one_of(st.none(), st.sampled_from([60, HOUR, 7, 1, 2**53])),
    "catch_up": st.sampled_from(["coalesce", "each"]),
    "payload": st.one_of(
        st.none(),
        st.builds(json.dumps, st.recursive(st.integers() | st.text(max_size=5), st.lists)),
        st.sampled_from(['{"a": 1}', '{"x": "\\u00e9"}', " 7 ", "[" * 50 + "]" * 50]),
    ),
    "key": st.one_of(st.none(), st.none(), st.sampled_from([("crm", "k-1"), ("crm", "k-2")])),
    "last_fired": st.one_of(st.none(), st.integers(NOW - 4 * HOUR, NOW)),
    "overflow": st.sampled_from([0, 3]),
    "kind": st.sampled_from(["timer", "timer", "timer", "approval"]),
}
HOSTILE = {
    "due": st.sampled_from([0, -5, 2**53 + 1, 1.5, "soon"]),
    "every": st.sampled_from([2**54, 0, -60, 2.5, "x"]),
    "catch_up": st.just("all"),
    "payload": st.sampled_from(
        ['{"i": 1', "", "[" * 101 + "]" * 101, "NaN", b"\x00\x01", "{a: 1}"]
    ),
    "key": st.sampled_from([("", "k"), ("s", b"b"), ("s", "")]),
    "last_fired": st.sampled_from(["x", -1, 2.5]),
    "overflow": st.sampled_from([-1, 2**63 - 1]),
}


@st.composite
def timer_rows(draw: st.DrawFn) -> tuple[Any, ...]:
    """A timer row as written by hand: valid, or (one time in four) with one hostile column."""
    values = {name: draw(strategy) for name, strategy in VALID.items()}
    every = values["every"]
    if every is not None and every < HOUR and draw(st.booleans()):
        # The edges: due exactly now or whole periods ago, fired last exactly at due or
        # a period before it.
        values["due"] = NOW - draw(st.integers(0, 3)) * every
        values["last_fired"] = draw(st.sampled_from([None, values["due"], values["due"] - every]))
    if draw(st.integers(0, 3)) == 0:
        name = draw(st.sampled_from(sorted(HOSTILE)))
        values[name] = draw(HOSTILE[name])
    return tuple(values.values())


rows = st.lists(timer_rows(), max_size=40, unique_by=lambda row: row[0])


def _write(path: Path, timers: list[tuple[Any, ...]]) -> None:
    db = sqlite3.connect(path, isolation_level=None)
    try:
        db.execute("PRAGMA journal_mode = WAL")
        schema.migrate(db, str(path))
        db.execute("PRAGMA ignore_check_constraints = ON")
        db.execute("BEGIN")
        for timer_id, due, every, catch_up, payload, key, last, overflow, kind in timers:
            key_source, key_id = key if key is not None and every is None else (None, None)
            db.execute(
                "INSERT INTO timers(id, kind, due, every, catch_up, payload, key_source, key_id,"
                " last_fired, overflow) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (timer_id, kind, due, every, catch_up, payload, key_source, key_id, last, overflow),
            )
        db.execute("COMMIT")
    finally:
        db.close()


class _PlannerOnly(SqliteTx):
    """The dialect without set statements: every due timer planned row by row."""

    __slots__ = ()

    def fire_plain_timers(self, now: int, limit: int) -> int:
        return 0


def _fire(path: Path, plain: bool, limit: int) -> list[int]:
    db = sqlite3.connect(path, isolation_level=None)
    try:
        tx = SqliteTx(db) if plain else _PlannerOnly(db)
        passes = []
        while True:
            count, more = write_transaction(tx, scheduler.run_scheduler, (NOW, limit, None))
            passes.append(count)
            if not more:
                return passes
    finally:
        db.close()


def _tables(path: Path) -> dict[str, list[tuple[Any, ...]]]:
    db = sqlite3.connect(path)
    try:
        names = [
            n
            for (n,) in db.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'"
            )
        ]
        found = {}
        for name in names:
            cursor = db.execute(f'SELECT * FROM "{name}" ORDER BY 1')
            columns = [c[0] for c in cursor.description]
            table = []
            for row in cursor:
                values = dict(zip(columns, row, strict=True))
                if name == "events":
                    values.pop("key_salt")  # random by design, on both paths
                    values["payload"] = json.loads(values["payload"])
                table.append(tuple(values.items()))
            found[name] = table
        return found
    finally:
        db.close()


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(timers=rows, limit=st.sampled_from([1, 3, 500]))
def test_set_statements_write_what_the_planner_writes(tmp_path_factory, timers, limit):
    folder = tmp_path_factory.mktemp("plain")
    planned, fast = folder / "planned.db", folder / "fast.db"
    _write(planned, timers)
    shutil.copy(planned, fast)
    assert _fire(fast, True, limit) == _fire(planned, False, limit)
    assert _tables(fast) == _tables(planned)


def test_plain_timers_take_the_set_statements(tmp_path):
    """The case the statements are for (recurring and one-shot timers with JSON payloads)
    goes through them, not the planner."""
    path = tmp_path / "inbox.db"
    _write(
        path,
        [
            (f"h-{i}", NOW - i, HOUR, "coalesce", '{"i": 1}', None, None, 0, "timer")
            for i in range(9)
        ]
        + [(f"o-{i}", NOW - i, None, "coalesce", None, None, None, 0, "timer") for i in range(9)],
    )
    db = sqlite3.connect(path, isolation_level=None)
    try:
        tx = SqliteTx(db)
        db.execute("BEGIN IMMEDIATE")
        assert tx.fire_plain_timers(NOW, 100) == 18
        assert db.execute("SELECT count(*) FROM timers WHERE due <= ?", (NOW,)).fetchone() == (0,)
        _assert_checks_on(db)
        db.execute("COMMIT")
    finally:
        db.close()
    events = _tables(path)["events"]
    assert len(events) == 18
    first = dict(events[0])
    assert (first["source"], first["source_id"]) == ("timer", f"h-8@{NOW - 8}")
    assert first["payload"] == {
        "timer": "h-8",
        "scheduled_for": NOW - 8,
        "late_by": 8,
        "skipped": 0,
        "data": {"i": 1},
    }


def _assert_checks_on(db: sqlite3.Connection) -> None:
    """The set statements run with CHECK constraints off; they are back on after, whether
    the run was written or refused: a row the checks refuse is refused again."""
    assert db.execute("PRAGMA ignore_check_constraints").fetchone() == (0,)
    with pytest.raises(sqlite3.IntegrityError, match="CHECK"):
        db.execute(
            "INSERT INTO events(source, source_id, status, available_at, created, updated) "
            "VALUES ('s', 'k', 'limbo', 0, 0, 0)"
        )


def test_the_check_pragma_applies_to_statements_prepared_before_it():
    """What fire_plain_timers relies on: setting ignore_check_constraints expires prepared
    statements, so a statement cached under one setting obeys the other when it next runs."""
    db = sqlite3.connect(":memory:", isolation_level=None)
    try:
        db.execute("CREATE TABLE t (status TEXT CHECK (status IN ('a', 'b')))")
        insert = "INSERT INTO t VALUES (?)"
        with pytest.raises(sqlite3.IntegrityError):
            db.execute(insert, ("c",))
        db.execute("PRAGMA ignore_check_constraints = ON")
        db.execute(insert, ("c",))  # the same cached statement, the checks left out
        db.execute("PRAGMA ignore_check_constraints = OFF")
        with pytest.raises(sqlite3.IntegrityError):
            db.execute(insert, ("d",))
        assert db.execute("SELECT status FROM t").fetchall() == [("c",)]
    finally:
        db.close()


def test_a_run_the_database_refuses_writes_nothing_and_the_planner_sets_its_row_aside(tmp_path):
    """The set statements are all or nothing: when the database refuses one row of the run
    (here a trigger written by hand refuses one event), nothing of it is written, and the
    planner then fires the others and sets that one aside with the reason."""
    path = tmp_path / "inbox.db"
    _write(
        path,
        [(f"t-{i}", NOW - 9 + i, None, "coalesce", None, None, None, 0, "timer") for i in range(5)],
    )
    db = sqlite3.connect(path, isolation_level=None)
    try:
        db.execute(
            "CREATE TRIGGER refuse BEFORE INSERT ON events WHEN NEW.source_id LIKE 't-2@%' "
            "BEGIN SELECT RAISE(ABORT, 'refused by hand'); END"
        )
        tx = SqliteTx(db)
        db.execute("BEGIN IMMEDIATE")
        assert tx.fire_plain_timers(NOW, 100) == 0
        _assert_checks_on(db)
        assert db.execute("SELECT count(*) FROM events").fetchone() == (0,)
        assert db.execute("SELECT count(*) FROM timers").fetchone() == (5,)
        db.execute("ROLLBACK")
    finally:
        db.close()
    assert _fire(path, True, 100) == [5]
    tables = _tables(path)
    assert [dict(e)["source_id"] for e in tables["events"]] == [
        f"t-{i}@{NOW - 9 + i}" for i in (0, 1, 3, 4)
    ]
    [(timer)] = [dict(t) for t in tables["timers"]]
    assert timer["id"] == "t-2" and "refused by hand" in timer["broken"]
