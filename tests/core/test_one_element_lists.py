"""A list parameter of one element is bound as the element itself (core/sqlite/tx.py
`_one_form`: `x IN (SELECT value FROM json_each(:p))` becomes `x = :p`, which spares SQLite
a temporary table per run). Each statement so rewritten must do exactly what its list form
does: the same rows back, the same rows changed, for ids that exist and ids that do not,
as integers and as text."""

from __future__ import annotations

import json
import re
from functools import partial
import sqlite3
from typing import Callable

import pytest

from onwatch.core import Event, RunContext
from onwatch.core.runtime import Worker
from onwatch.core.sqlite import tx as sqlite_tx
from onwatch.core.sqlite.tx import _IN_LIST, STATEMENTS, SqliteTx, _one_form
from onwatch.tui.seed import T0, open_seeded

REWRITTEN = sorted(name for name, text in STATEMENTS.items() if _one_form(text) is not None)
VALUES = [
    *range(40),
    10**6,
    -1,
    2**70,
    1.0,
    2.5,
    None,
    True,
    "1",
    "2",
    "daily-digest",
    "",
    "x' OR 1 --",
]
# The other parameters, as the engine binds them (`gen`: the open run's, found below).
OTHERS = {"run": None, "now": T0, "outcome": "done", "error": "e", "limit": 100}
# Run inside each probe first: a run closes only once none of its events is running.
PREPARE = {"runs_close": "UPDATE events SET status = 'done' WHERE status = 'running'"}


def test_the_statements_a_drained_job_runs_are_rewritten():
    # What the rewrite is for; if these lose it, say so here rather than in a benchmark.
    assert {"events_claim", "events_finish_done", "runs_close"} <= set(REWRITTEN)
    assert _one_form("SELECT :ids, x FROM t WHERE x IN (SELECT value FROM json_each(:ids))") is None


async def probe_agent(batch: list[Event], ctx: RunContext) -> None:
    ctx.log("probing", n=len(batch))
    ctx.spend(0.25, note="probe")
    async with ctx.effect("probe-call"):
        pass


def snapshot(db: sqlite3.Connection) -> dict[str, list]:
    tables = [r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
    return {t: db.execute(f'SELECT * FROM "{t}" ORDER BY 1').fetchall() for t in tables}


def outcome(db: sqlite3.Connection, name: str, execute: Callable[[], sqlite3.Cursor]) -> tuple:
    """What `execute()` returns and changes (the rows back, the rows changed, every table),
    undone after: each probe starts from the same inbox."""
    db.execute("SAVEPOINT probe")
    db.execute(PREPARE.get(name, "SELECT 1"))
    before = db.total_changes
    try:
        rows = sorted(execute().fetchall(), key=repr)
        return rows, db.total_changes - before, snapshot(db)
    finally:
        db.execute("ROLLBACK TO probe")
        db.execute("RELEASE probe")


@pytest.mark.parametrize("name", REWRITTEN)
async def test_a_one_element_list_does_what_the_list_does(tmp_path, monkeypatch, name):
    path = str(tmp_path / "inbox.db")
    # The data is made with list forms only: the rewrite is what is on trial.
    monkeypatch.setattr(sqlite_tx, "_one_form", lambda statement: None)
    inbox, clock = await open_seeded(path)
    try:  # runs with what the seed lacks: effects, spend, a transcript; one left open
        clock.advance(3600)  # past the seeded lease
        await inbox.ingest_batch([("probe", f"p-{n}", None) for n in range(3)])
        await Worker(inbox, probe_agent, holder="probe", max_runs=3).run()
        gen = await inbox.acquire("probe")
        await inbox.ingest("probe", "left-open", None)
        assert await inbox.claim_batch("probe", gen)  # a run left open, its events running
    finally:
        await inbox.close()
    monkeypatch.undo()
    db = sqlite3.connect(path, isolation_level=None)
    try:
        db.execute("BEGIN IMMEDIATE")
        listed = STATEMENTS[name]
        key, alone = _one_form(listed)
        assert _IN_LIST.search(alone) is None
        others = {p: OTHERS.get(p) for p in re.findall(r":(\w+)", listed) if p != key}
        if "gen" in others:  # the open run's
            others["gen"] = gen
        tx = SqliteTx(db)
        changed = 0
        for value in VALUES:
            listed_params = {**others, key: json.dumps([value])}
            as_list = outcome(db, name, partial(db.execute, listed, listed_params))
            # As the engine runs it: through SqliteTx.run, given a one-element list.
            through_tx = outcome(db, name, partial(tx.run, name, **others, **{key: [value]}))
            assert through_tx == as_list, (name, value)
            changed += as_list[1] + len(as_list[0])
        assert changed, f"{name}: no value found a row, so nothing was compared"
    finally:
        db.close()
