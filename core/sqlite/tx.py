"""The SQLite dialect: the engine's `Tx` over one sqlite3 connection to one inbox file."""

from __future__ import annotations

import json
import os
import re
import sqlite3
import time
from pathlib import Path
from typing import Any, ContextManager, Sequence

from ..engine.decoding import DECODE_ERRORS
from ..engine.queries import load
from ..engine.tx import COUNTERS, META_KEYS, InboxState, NewEvent, Row, TimerAdvance, savepoint
from ..text import printable

STATEMENTS = load(Path(__file__).with_name("queries.sql"))
_dumps = json.JSONEncoder(separators=(",", ":")).encode
# Rows per multi-row insert: well inside SQLite's limit on bound parameters. (One statement
# for many rows: each statement that fires a trigger keeps its own statement journal.)
INSERT_ROWS = 150

# A list parameter read only as `x IN (SELECT value FROM json_each(:p))`, given one element,
# is bound to it as `x = :p` (the same rows): SQLite builds a temporary table for such an
# IN on every run of the statement, and a drained job's finish and claim ran three of them.
_IN_LIST = re.compile(r"IN \(SELECT value FROM json_each\(:(\w+)\)\)")
_ONE_FORMS: dict[str, tuple[str, str] | None] = {}  # by statement text


def _one_form(statement: str) -> tuple[str, str] | None:
    """(parameter, the statement for a one-element list), where the statement has one."""
    try:
        return _ONE_FORMS[statement]
    except KeyError:
        pass
    found = _IN_LIST.findall(statement)
    form = None
    if len(found) == 1 and len(re.findall(rf":{found[0]}\b", statement)) == 1:
        form = (found[0], _IN_LIST.sub(r"= :\1", statement))
    _ONE_FORMS[statement] = form
    return form


def _bound_alone(value: Any) -> bool:
    """Whether a list's one element compares alike bound directly and read from JSON."""
    return type(value) is str or (type(value) is int and -(2**63) <= value < 2**63)


# A write-ahead log this large has outgrown what the automatic checkpoints leave (about 4
# MiB: they run at 1,000 pages): `held_back` looks at why.
WAL_LARGE = 64 << 20
# What a log that grew (held back, or one huge transaction) is cut back to when the next
# write starts it over; without it the file keeps its largest size for good.
WAL_KEPT = 16 << 20


class SqliteTx:
    """The engine's Tx on a file (core/engine/tx.py). One per connection: a connection runs
    one transaction at a time, on its own thread."""

    # What a stored row the engine cannot process raises: decoding, and the file's own
    # refusal of a value (a CHECK, a key).
    row_errors: tuple[type[BaseException], ...] = DECODE_ERRORS + (sqlite3.IntegrityError,)
    database_errors: tuple[type[BaseException], ...] = (sqlite3.OperationalError,)

    __slots__ = ("conn", "statements", "journal_in_memory")

    def __init__(self, conn: sqlite3.Connection, statements: dict[str, str] = STATEMENTS) -> None:
        self.conn = conn
        self.journal_in_memory = False  # temp_store = MEMORY is set (db.write_transaction)
        # The newest schema's statements, or a file's of an older schema that was opened
        # without migrating (STATEMENTS.for_schema).
        self.statements = statements

    def run(self, name: str, /, **params: Any) -> sqlite3.Cursor:
        statement = self.statements[name]
        form = _one_form(statement)
        if form is not None:
            key, alone = form
            value = params.get(key)
            if type(value) is list and len(value) == 1 and _bound_alone(value[0]):
                statement, params[key] = alone, value[0]
        for key, value in params.items():
            if type(value) is list:  # read with json_each
                params[key] = _dumps(value)
        return self.conn.execute(statement, params)

    def one(self, name: str, /, **params: Any) -> Row:
        row: Row = self.run(name, **params).fetchone()
        return row

    def savepoint(self, name: str) -> ContextManager[None]:
        return savepoint(self.conn.execute, name)

    def now(self, now: int | None) -> int:
        return int(time.time()) if now is None else now

    def statement_now(self, now: int | None) -> int | None:
        return self.now(now)

    def state(self) -> InboxState:
        holder, gen, until, settings, paused = self.one("inbox_state")
        return InboxState(holder, gen, until, settings, bool(paused))

    def settings_text(self) -> str | None:
        row = self.run("settings_load").fetchone()
        return None if row is None else row[0]

    def meta(self, key: str) -> Any:
        if key not in META_KEYS:
            raise KeyError(key)
        row = self.run("meta_get", key=key).fetchone()
        return None if row is None else row[0]

    def set_meta(self, key: str, value: Any) -> None:
        if key not in META_KEYS:
            raise KeyError(key)
        self.run("meta_set", key=key, value=int(value) if type(value) is bool else value)

    def bump(self, key: str) -> None:
        if key not in COUNTERS:
            raise KeyError(key)
        self.run("meta_bump", key=key)

    def insert_events(self, rows: Sequence[NewEvent]) -> set[tuple[str, str]]:
        stored: set[tuple[str, str]] = set()
        for start in range(0, len(rows), INSERT_ROWS):
            chunk = rows[start : start + INSERT_ROWS]
            row = self.statements["events_insert_row"]
            sql = self.statements["events_insert"].format(rows=",".join([row] * len(chunk)))
            values = [v for s, i, p, n in chunk for v in (s, i, p, n, n, n)]
            stored.update((s, i) for s, i in self.conn.execute(sql, values))
        return stored

    @property
    def batch_alone(self) -> bool:
        return False  # a write transaction costs no round trip here

    def insert_events_alone(
        self, rows: Sequence[tuple[str, str, str, int | None]], settings: str | None
    ) -> list[int] | None:
        return None

    def release_alone(self, holder: str, gen: int, now: int | None) -> bool | None:
        # The lease and the released generation are two tables here: one statement cannot
        # write both, and a write transaction costs no round trip.
        return None

    def claim(self, holder: str, gen: int, ids: Sequence[int], now: int) -> int:
        listed = list(ids)
        run = self.run("run_insert", holder=holder, gen=gen, ids=_dumps(listed), now=now).lastrowid
        assert run is not None  # an INSERT that returned has a rowid
        if len(listed) == 1:
            self.run("run_event_link", id=listed[0], run=run)
        else:
            self.run("run_events_link", ids=listed, run=run)
        self.run("events_claim", ids=listed, gen=gen, now=now, run=run)
        return run

    def finish_done(
        self,
        ids: Sequence[int],
        gen: int,
        run: int,
        now: int,
        result: str | None,
        traceback: str | None,
        look: tuple[int, int] | None = None,
    ) -> tuple[Row | None, list[Row]]:
        # `look` is not read ahead: a statement costs no round trip here.
        known = self.run("run_outcome", id=run).fetchone()
        if known is None or known[0] != gen or known[1] is not None:
            return known, []
        rows = self.run("events_finish_done", ids=list(ids), gen=gen, run=run, now=now).fetchall()
        if rows:
            self.run(
                "runs_close",
                runs=[run],
                outcome="done",
                now=now,
                result=result,
                error=None,
                traceback=traceback,
            )
        return known, rows

    def claim_look(
        self, gen: int, now: int, max_attempts: int, limit: int
    ) -> tuple[list[Row], list[Row]]:
        # Three statements (SQLite has no writes inside a WITH), each a call, not a round trip.
        lost = self.run("lost_claims", gen=gen).fetchall()
        self.run("bury_exhausted", now=now, max_attempts=max_attempts)
        if lost:
            return lost, []  # the caller looks again once they are recovered
        return lost, self.run("claimable_next", now=now, limit=limit).fetchall()

    def timer_due(self, now: int, look: tuple[int, int, int] | None = None) -> bool:
        return self.run("timer_due_any", now=now).fetchone() is not None

    def timer_due_known(self, now: int, look: tuple[int, int, int]) -> bool | None:
        return None  # a finish's claim here fires timers: nobody asks

    def advance_timers(self, rows: Sequence[TimerAdvance]) -> None:
        self.run("timers_advance", rows=list(rows))

    def fire_plain_timers(self, now: int, limit: int) -> int:
        # The leading run of plain timers among the next `limit` due ones, fired by three set
        # statements in a savepoint (queries.sql `timers_fire_plain`); a row the events table
        # refuses undoes the savepoint, and the planner then takes those rows one by one.
        last = None
        run = 0
        for due, timer_id, plain in self.run("timers_due_plain", now=now, limit=limit).fetchall():
            if not plain:
                break
            last, run = (due, timer_id), run + 1
        if last is None:
            return 0
        # CHECK constraints are left out while these run (only the insert writes a column one
        # names): each new event's values are true by construction (status and attempts by
        # default, a source and source id the select proved non-empty), and SQLite builds
        # the lookup table of `status IN (...)` again for every row it checks, a quarter of
        # the insert's work. NOT NULL and the key still hold. (SQLite compiles the checks
        # into a statement; setting the pragma expires every prepared statement, so each is
        # compiled again for the setting in force when it next runs.)
        execute = self.conn.execute
        execute("PRAGMA ignore_check_constraints = ON")
        try:
            with self.savepoint("fire_plain"):
                for name in ("timers_fire_plain", "timers_advance_plain", "timers_delete_plain"):
                    self.run(name, now=now, due=last[0], id=last[1])
        except sqlite3.IntegrityError:
            return 0
        finally:
            execute("PRAGMA ignore_check_constraints = OFF")
        return run

    def held_back(self) -> str | None:
        """A write-ahead log past WAL_LARGE that a checkpoint cannot copy back: a read that
        another process holds open keeps every commit since in the log (SQLite copies a
        commit back only once no reader may still need the page it replaces)."""
        path = self.conn.execute("PRAGMA database_list").fetchone()[2]
        try:
            size = os.stat(f"{path}-wal").st_size
        except OSError:
            return None
        if size < WAL_LARGE:
            return None
        try:  # what every commit's automatic checkpoint does; it never waits
            frames, copied = self.conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()[1:]
        except sqlite3.Error as exc:
            if getattr(exc, "sqlite_errorcode", 0) & 0xFF != sqlite3.SQLITE_READONLY:
                return None  # it could not look now: the next look tells
            frames, copied = 1, 0  # a user who may not write the file: the size alone tells
        if frames < 0 or frames <= copied:  # -1: it could not look now (another checkpoint)
            return None  # all copied back: the next write starts the log over (WAL_KEPT)
        return (
            f"its write-ahead log {printable(path)}-wal is {size / 2**20:,.1f} MiB and cannot be "
            f"copied back into the inbox file: another process holds a read open (a sqlite3 "
            f"shell inside a transaction, a backup in progress?); the log grows with every "
            f"write until that read ends"
        )

    def change_token(self) -> tuple[int, int]:
        # Another connection's commit moves data_version; this connection's own, its count.
        version: int = self.conn.execute("PRAGMA data_version").fetchone()[0]
        return version, self.conn.total_changes

    def settled_change_token(self) -> tuple[int, int] | None:
        # A writer holds the write lock from its first write to the WAL until its commit is
        # visible: taken here (the connection's busy timeout is 0), nobody is half-way.
        try:
            self.conn.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError:  # held by another connection, or a read-only file
            return None
        try:
            return self.change_token()
        finally:
            self.conn.execute("ROLLBACK")
