"""Every read the TUI makes uses an index: no full scan of a table that grows.

The SQL is not copied here: each read path runs through the engine (core/engine/reads.py
and friends, over the file's Tx) on a populated inbox with a trace callback, and every
SELECT it issued is then asked for its EXPLAIN QUERY PLAN.
A plan step `SCAN <table>` without an index on a growing table, or a temporary B-tree to sort
rows, fails the test. Checked on a fresh file (no statistics, as most inboxes are) and after
ANALYZE (statistics can change the planner's mind).
"""

from __future__ import annotations

import re
import sqlite3
from typing import Callable

import pytest

from onwatch.core.engine import outbox, reads, spend, timers
from onwatch.core.sqlite.tx import SqliteTx
from tests.bench.bench_core import NOW, build_big_inbox

# Tables with a fixed handful of rows: a scan of them is as cheap as a lookup (spend_totals:
# one row per unit ever spent; days: the spend reads' own list of the days asked for).
BOUNDED_TABLES = {"event_counts", "meta", "lease", "settings", "spend_totals", "days"}
STATUSES = ("pending", "running", "done", "dead", "interrupted", "cancelled")


def _paths() -> dict[str, Callable[[SqliteTx], object]]:
    paths: dict[str, Callable[[SqliteTx], object]] = {
        "counts": reads.counts,
        "lease": reads.lease_info,
        "next timers": lambda tx: reads.timers(tx, 50),
        "next timer due": timers.next_timer_due,
        "held messages": lambda tx: reads.held_messages(tx, 100),
        "status strip (overview)": lambda tx: reads.overview(tx, NOW),
        "status strip (spend per day)": lambda tx: spend.spending(tx, NOW, 14),
        "next wake": lambda tx: reads.next_wake(tx, NOW),
        "deliveries": lambda tx: outbox.deliveries(tx, 50, NOW),
        "runs of an event": lambda tx: reads.runs_for_event(tx, 1500),
        "audit": lambda tx: reads.audit_entries(tx, 100, None),
    }
    for status in STATUSES:
        paths[f"page {status}: first"] = lambda tx, s=status: reads.events(
            tx, s, 50, None, None, None
        )
        paths[f"page {status}: next"] = lambda tx, s=status: reads.events(
            tx, s, 50, 1500, None, None
        )
        paths[f"page {status}: previous"] = lambda tx, s=status: reads.events(
            tx, s, 50, None, 1500, None
        )
        paths[f"page {status}: search"] = lambda tx, s=status: reads.events(
            tx, s, 50, 1500, None, "github"
        )
    return paths


PATHS = _paths()


@pytest.fixture(scope="module", params=["fresh", "analyzed"])
def inbox_file(request, tmp_path_factory) -> str:
    path = str(tmp_path_factory.mktemp(f"plans-{request.param}") / "inbox.db")
    build_big_inbox(path, 3000)  # runs ANALYZE at the end
    if request.param == "fresh":
        db = sqlite3.connect(path, isolation_level=None)
        db.execute("DROP TABLE IF EXISTS sqlite_stat1")
        db.close()
    return path


def selects_of(path: str, read: Callable[[SqliteTx], object]) -> list[str]:
    db = sqlite3.connect(path, isolation_level=None)
    seen: list[str] = []
    db.set_trace_callback(seen.append)
    try:
        read(SqliteTx(db))
    finally:
        db.set_trace_callback(None)
        db.close()
    return [sql for sql in seen if sql.lstrip().upper().startswith("SELECT")]


def plan_problems(path: str, sql: str) -> list[str]:
    db = sqlite3.connect(path, isolation_level=None)
    try:
        steps = [row[3] for row in db.execute("EXPLAIN QUERY PLAN " + sql)]
    finally:
        db.close()
    problems = []
    # Newest first by rowid with a LIMIT: SQLite walks the table backwards from its end and
    # stops there, whatever the table's size (its plan still says SCAN).
    newest_first = re.search(r"ORDER BY (\w+\.)?id DESC\s+LIMIT", sql) is not None
    for step in steps:
        words = step.split()
        if step == "SCAN CONSTANT ROW":  # a SELECT without FROM: one row, no table
            continue
        if words[0] == "SCAN" and newest_first and len(words) == 2:
            continue
        if words[0] == "SCAN" and "INDEX" not in step and "PRIMARY KEY" not in step:
            if words[1] not in BOUNDED_TABLES:
                problems.append(f"full scan: {step}")
        if "TEMP B-TREE" in step:
            problems.append(f"sorts every matching row: {step}")
    return [f"{p}\n      in: {sql}\n      plan: {steps}" for p in problems]


@pytest.mark.parametrize("name", list(PATHS))
def test_read_path_uses_indexes(inbox_file, name):
    statements = selects_of(inbox_file, PATHS[name])
    assert statements, f"{name} issued no SELECT (did the trace callback break?)"
    problems = [p for sql in statements for p in plan_problems(inbox_file, sql)]
    assert not problems, f"{name}:\n" + "\n".join(problems)


def test_approvals_waiting_use_their_partial_index(inbox_file):
    statements = [
        sql
        for sql in selects_of(inbox_file, lambda tx: reads.approvals(tx, 100))
        if "answer IS NULL" in sql
    ]
    assert statements
    for sql in statements:
        assert not plan_problems(inbox_file, sql)


def test_approvals_answered_use_an_index(inbox_file):
    statements = [
        sql
        for sql in selects_of(inbox_file, lambda tx: reads.approvals(tx, 100))
        if "answer IS NOT NULL" in sql
    ]
    assert statements
    problems = [p for sql in statements for p in plan_problems(inbox_file, sql)]
    assert not problems, "\n".join(problems)


def test_a_full_scan_is_caught(inbox_file):
    """The checker itself: an unindexed query on events is reported."""
    problems = plan_problems(inbox_file, "SELECT id FROM events WHERE error = 'x'")
    assert problems and "full scan: SCAN events" in problems[0]
