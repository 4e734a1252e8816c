"""The PostgreSQL dialect: the engine's `Tx` over one psycopg connection and the id of the
inbox it works on (one database holds many inboxes)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, ContextManager, Sequence

import psycopg

from ..clock import MAX_COUNT
from ..engine.decoding import DECODE_ERRORS
from ..engine.queries import load
from ..engine.tx import (
    COUNTERS,
    META_KEYS,
    FinishAhead,
    InboxState,
    NewEvent,
    TimerAdvance,
    savepoint,
)
from ..humanize import duration
from ..text import printable
from .rows import Row, one

STATEMENTS = load(Path(__file__).with_name("queries.sql"))


def _finish_then_look(finish: str, look: str) -> str:
    """finish_done with claim_look's rows ahead of its own, in one statement: every part
    reads the rows as they were before it, and a finish changes no pending event and no
    other generation's claim, so the look is the one claim_look would read after it. (One
    statement: a pipeline of the two cost more client CPU than two round trips.)"""
    ctes, rows = finish.split("\n(SELECT", 1)  # the CTEs, then the finish's own rows
    return f"{ctes}\n{look}\nUNION ALL\n(SELECT{rows}"


FINISH_THEN_LOOK = _finish_then_look(STATEMENTS["finish_done"], STATEMENTS["claim_look"])


def _look_and_probe(look: str, probe: str) -> str:
    """claim_look's rows, then one row tagged 20 whose first column counts the due timers
    timer_due_any finds (0 or 1), in one statement. The probe's row comes last: a UNION
    resolves its types pair by pair, and the look's typed rows come first."""
    nulls = ", ".join(["NULL"] * 12)
    return f"{look}\nUNION ALL\n(SELECT count(*), {nulls}, 20 FROM ({probe}) AS due)"


_LOOK_AND_PROBE: dict[tuple[str, str], str] = {}  # by (look, probe): a schema's own texts


def _numbered_look(look: str, probe: str) -> str:
    """_look_and_probe with numbered parameters: $1 the inbox, $2 the generation, $3
    max_attempts, $4 the batch's limit; its `now` read from a CTE named `clock`."""
    named = {"inbox": "$1", "gen": "$2", "max_attempts": "$3", "limit": "$4"}
    text = _look_and_probe(look, probe)
    for name, number in named.items():
        text = text.replace(f"%({name})s", number)
    text = text.replace("%(now)s", "(SELECT now FROM clock)")
    assert "%(" not in text, "a parameter of the look left unnumbered"
    return text


def _look_with_lock(look: str, probe: str) -> str:
    """_look_and_probe as a statement a session prepares (core/pg/db.py `onwatch_look`), for
    a write transaction to send with its lock: $1 the inbox, $2 the generation, $3
    max_attempts, $4 the batch's limit, $5 the caller's `now` or NULL for the server's clock
    as the statement runs; one more row, tagged 21, says which `now` it read by. The
    transaction uses its rows only where they match its own decision (`Tx.saw_look`)."""
    text = _numbered_look(look, probe)
    nulls = ", ".join(["NULL"] * 12)
    return (
        "WITH clock AS MATERIALIZED (SELECT coalesce($5, "
        "floor(extract(epoch FROM clock_timestamp()))::bigint) AS now)\n"
        f"{text}\nUNION ALL\n(SELECT now, {nulls}, 21 FROM clock)"
    )


LOOK_WITH_LOCK = _look_with_lock(STATEMENTS["claim_look"], STATEMENTS["timer_due_any"])


def _claim_with_commit(claim: str) -> str:
    """`claim` as a statement a session prepares (core/pg/db.py `onwatch_claim`), for a
    write transaction to send with its COMMIT: $1 the inbox, $2 the generation, $3 now, $4
    the events' ids. Every value is an integer: the run's holder is the locked lease's (the
    claim is made only for the holder of the live lease, and nothing in its transaction
    changes it), its list of ids the same text `Tx.claim` writes."""
    text = claim.replace("%(inbox)s", "$1").replace("%(gen)s", "$2").replace("%(now)s", "$3")
    text = text.replace("%(ids)b", "$4").replace(
        "%(holder)s", "(SELECT lease_holder FROM inboxes WHERE id = $1)"
    )
    text = text.replace("%(json)s", "'[' || array_to_string($4, ', ') || ']'")
    assert "%(" not in text, "a parameter of the claim left unnumbered"
    return text


CLAIM_WITH_COMMIT = _claim_with_commit(STATEMENTS["claim"])

# A run of digits this long in a payload takes the engine's own path: Python refuses to read
# an integer of more than sys.get_int_max_str_digits() digits (4,300, at least 640 where
# set), which the server's JSON check accepts. (A regular expression's bound is 255 at most.)
TAKE_DIGITS = 255


def _take_with_lock(look: str, probe: str, claim: str) -> str:
    """The claim of runs.claim_next's plain case, decided and made in one statement, for a
    write transaction to send with its lock and its COMMIT (core/pg/db.py `onwatch_take`):
    $1 the inbox, $2 the generation, $3 max_attempts, $4 the batch's limit, $5 the caller's
    `now` or NULL for the server's clock, $6 the holder, $7 the settings' stored text the
    caller decided by (runs.plain_claim's), $8 whether due timers fire, $9 how many `[` and
    `{` a payload may hold (fewer than Python's recursion limit lets it read nested).

    Its rows are LOOK_WITH_LOCK's (the look, the probe tagged 20, the clock tagged 21) and
    two more: 22, the run it made (its id, and its events' ids as text; no row when it
    claimed nothing), and 23, whether the case was plain (1) or not (0). It claims only
    where the engine, deciding on those same rows, claims exactly these events: this
    holder's live lease of this generation, the inbox not paused, the stored settings the
    caller's, no claim lost by an older generation, no pending event out of attempts, no
    timer due when they fire, and every event it would take one the engine can run (a
    payload the server reads as JSON, with none of what the server's check passes and Python
    cannot read: deep nesting, an integer of TAKE_DIGITS digits or more; a count of attempts
    below MAX_COUNT). The events: the oldest retried one alone, else the fresh ones, as
    `runs._claim` picks them. Where the case is not plain it writes nothing (the
    transaction then runs as the engine decides)."""
    text = _numbered_look(look, probe)
    values = "VALUES (%(inbox)s, %(holder)s, %(gen)s, %(json)s, %(now)s) RETURNING id"
    assert claim.count(values) == 1 and claim.startswith("WITH "), "the claim has changed"
    claim = claim.replace(
        values,
        "SELECT %(inbox)s, %(holder)s, %(gen)s, %(json)s, %(now)s FROM taking\n"
        "    WHERE ids IS NOT NULL RETURNING id",
    )
    claim = claim.replace("%(inbox)s", "$1").replace("%(gen)s", "$2").replace("%(holder)s", "$6")
    claim = claim.replace("%(now)s", "(SELECT now FROM clock)")
    claim = claim.replace("%(ids)b", "(SELECT ids FROM taking)")
    claim = claim.replace("%(json)s", "'[' || array_to_string(ids, ', ') || ']'")
    assert "%(" not in claim, "a parameter of the claim left unnumbered"
    ctes, tail = claim[len("WITH ") :].rsplit("\nSELECT id FROM run", 1)
    assert tail.strip() in ("", ";"), "the claim no longer ends with its run"
    nulls = ", ".join(["NULL"] * 12)
    return f"""WITH clock AS MATERIALIZED (
    SELECT coalesce($5, floor(extract(epoch FROM t))::bigint) AS now,
           extract(epoch FROM t)::text AS at
    FROM clock_timestamp() AS t),
look(id, source, source_id, payload, status, attempts, claim_gen, error, created, updated,
     available_at, claimed_at, run_id, tag) AS MATERIALIZED (
{text}),
candidates AS MATERIALIZED (
    SELECT id, payload, attempts FROM look WHERE tag = 1
    UNION ALL
    SELECT id, payload, attempts FROM look
    WHERE tag = 0 AND NOT EXISTS (SELECT FROM look WHERE tag = 1)),
plain AS MATERIALIZED (
    SELECT EXISTS (SELECT FROM inboxes i
                   WHERE i.id = $1 AND i.lease_holder = $6 AND i.lease_gen = $2
                     AND i.lease_until >= (SELECT now FROM clock) AND NOT i.paused
                     AND i.settings IS NOT DISTINCT FROM $7)
       AND NOT EXISTS (SELECT FROM look WHERE tag = 2)
       AND NOT EXISTS (SELECT FROM look WHERE tag = 3 AND id > 0)
       AND NOT ($8 AND EXISTS (SELECT FROM look WHERE tag = 20 AND id > 0))
       AND NOT EXISTS (
           SELECT FROM candidates
           WHERE payload IS NULL OR payload IS NOT JSON OR attempts >= {MAX_COUNT}
              OR length(payload) - length(translate(payload, '[{{', '')) > $9
              OR payload ~ '[0-9]{{{TAKE_DIGITS}}}') AS yes),
taking AS MATERIALIZED (
    SELECT array_agg(id ORDER BY id) AS ids FROM candidates WHERE (SELECT yes FROM plain)),
{ctes},
counted AS (
    UPDATE inboxes SET changes = changes + 1 WHERE id = $1 AND EXISTS (SELECT FROM run))
(SELECT * FROM look)
UNION ALL
(SELECT now, at, {", ".join(["NULL"] * 11)}, 21 FROM clock)
UNION ALL
(SELECT id, (SELECT array_to_string(ids, ',') FROM taking), {nulls[6:]}, 22 FROM run)
UNION ALL
(SELECT yes::int, {nulls}, 23 FROM plain)"""


TAKE_WITH_LOCK = _take_with_lock(
    STATEMENTS["claim_look"], STATEMENTS["timer_due_any"], STATEMENTS["claim"]
)

# The finish's write, as the engine fences it (InboxState.holds): only while this holder's
# lease of this generation has not expired at the statement's `now`.
_LEASE_HELD = (
    "EXISTS (SELECT 1 FROM inboxes WHERE id = $1 AND lease_holder = $7 AND lease_gen = $2\n"
    "                      AND lease_until >= (SELECT now FROM clock))"
)


def _finish_with_lock(finish_then_look: str) -> str:
    """FINISH_THEN_LOOK as a statement a session prepares (core/pg/db.py `onwatch_finish`),
    for a write transaction to send with its lock: $1 the inbox, $2 the generation, $3 the
    run, $4 the events' ids, $5 max_attempts, $6 the batch's limit, $7 the holder, $8 the
    result, $9 the caller's `now` or NULL for the server's clock as the statement runs
    (which one more row, tagged 21, reports: the `now` it wrote by and the clock's reading).
    The events are marked done only while the holder's lease of this generation holds: the
    statement writes exactly where the engine, deciding on the same locked row at the same
    `now`, would have asked for it."""
    named = {"inbox": "$1", "gen": "$2", "run": "$3", "max_attempts": "$5", "limit": "$6"}
    text = finish_then_look.replace("%(ids)b", "$4").replace("%(result)s", "$8")
    for name, number in named.items():
        text = text.replace(f"%({name})s", number)
    text = text.replace("%(traceback)s", "NULL").replace("%(now)s", "(SELECT now FROM clock)")
    assert "%(" not in text, "a parameter of the finish left unnumbered"
    known_open = "AND EXISTS (SELECT 1 FROM known WHERE gen = $2 AND outcome IS NULL)"
    assert text.count(known_open) == 1, "the finish's fence has moved"
    text = text.replace(known_open, f"AND {_LEASE_HELD}\n      {known_open}")
    assert text.startswith("WITH "), "the finish no longer begins with its CTEs"
    nulls = ", ".join(["NULL"] * 11)
    return (
        "WITH clock AS MATERIALIZED (SELECT coalesce($9, floor(extract(epoch FROM t))::bigint)"
        " AS now, extract(epoch FROM t)::text AS at FROM clock_timestamp() AS t),\n"
        f"{text[len('WITH ') :].rstrip().rstrip(';')}\n"
        f"UNION ALL\n(SELECT now, at, {nulls}, 21 FROM clock)"
    )


FINISH_WITH_LOCK = _finish_with_lock(FINISH_THEN_LOOK)


def _finish_and_take_with_lock(take: str, finish: str) -> str:
    """A run's successful finish and the claim after it (runs.finish_and_claim's plain case),
    decided and made in one statement, for a write transaction to send with its lock and its
    COMMIT (core/pg/db.py `onwatch_finish_take`): TAKE_WITH_LOCK's parameters ($1–$9), and
    $10 the run, $11 its events' ids, $12 its result.

    Its rows are TAKE_WITH_LOCK's and finish_done's (10: an event it marked done, 11: the
    run as it was). It writes only where the engine, deciding on those rows, writes exactly
    this: the take's plain case (its `plain`), and the finish the engine's common one, the
    run this generation's and open, at least one of its events still claimed by it. It then
    marks them done, closes the run as finish_done does and claims as the take does, all at
    the statement's `now`: every part reads the rows as they were before the statement, and
    a finish changes no pending event and no other generation's claim, so the claim's look
    is the one it would read after the finish (FINISH_THEN_LOOK's argument). The change
    count moves once, as a transaction's COMMIT moves it. Anywhere else it writes nothing."""
    named = {"inbox": "$1", "gen": "$2", "run": "$10", "result": "$12"}
    finish = finish.replace("%(ids)b", "$11").replace("%(traceback)s", "NULL")
    for name, number in named.items():
        finish = finish.replace(f"%({name})s", number)
    finish = finish.replace("%(now)s", "(SELECT now FROM clock)")
    assert "%(" not in finish and finish.startswith("WITH "), "the finish has changed"
    ctes, rows = finish[len("WITH ") :].split("\n(SELECT", 1)
    known, writes = ctes.split("\ndone AS (", 1)
    open_run = "AND EXISTS (SELECT 1 FROM known WHERE gen = $2 AND outcome IS NULL)"
    assert writes.count(open_run) == 1, "the finish's fence has moved"
    # What `done` would mark, read first: the case is plain only if it marks something.
    still = writes.split("UPDATE events SET status = 'done', error = NULL, updated = ", 1)[1]
    still = still.split("\n", 1)[1].split("\n    RETURNING", 1)[0]
    writes = writes.replace(open_run, f"{open_run}\n      AND (SELECT yes FROM plain)")
    assert take.startswith("WITH clock AS MATERIALIZED (")
    text = take.replace("\nlook(id,", f"\n{known.rstrip().rstrip(',')},\nlook(id,", 1)
    plain_yes = " AS yes),\ntaking AS MATERIALIZED ("
    assert text.count(plain_yes) == 1, "the take's plain case has moved"
    text = text.replace(
        plain_yes, f"\n       AND EXISTS (SELECT FROM events\n    {still.strip()}){plain_yes}"
    )
    counted = "WHERE id = $1 AND EXISTS (SELECT FROM run))"
    assert text.count(counted) == 1, "the take's change count has moved"
    text = text.replace(counted, "WHERE id = $1 AND EXISTS (SELECT FROM done))")
    taking_end = "FROM candidates WHERE (SELECT yes FROM plain)),\n"
    assert text.count(taking_end) == 1, "the take's claim has moved"
    text = text.replace(taking_end, f"{taking_end}done AS ({writes.rstrip().rstrip(',')},\n")
    return f"{text}\nUNION ALL\n(SELECT{rows.rstrip().rstrip(';')}"


FINISH_AND_TAKE_WITH_LOCK = _finish_and_take_with_lock(TAKE_WITH_LOCK, STATEMENTS["finish_done"])

SERVER_TIME = "SELECT extract(epoch FROM clock_timestamp())"
# A transaction open this long (seconds) holding old rows is worth a person's look: a
# session left inside BEGIN (psql, a notebook), a report that never ends (`held_back`).
HELD_OPEN = 900


def held_open(execute: Any) -> str | None:
    """Another session's transaction open for over HELD_OPEN seconds holding old rows, in
    words (None if there is none): until it ends, vacuum cleans up nothing that a write of
    the database left behind. `execute` is a connection's or a Tx's."""
    try:
        row = execute(STATEMENTS["held_open"], {"seconds": HELD_OPEN}).fetchone()
    except psycopg.errors.InsufficientPrivilege:  # the statistics view revoked: cannot tell
        return None
    if row is None:
        return None
    pid, role, application, state, seconds = row
    return (
        f"a session of this database (pid {pid}, role {printable(role or '?')}, "
        f"application {printable(application or '-')}, {printable(state or '?')}) has "
        f"held a transaction open for {duration(seconds)}: PostgreSQL cleans up no row a "
        f"write leaves behind until it ends, so tables and indexes grow and reads slow "
        f"(idle_in_transaction_session_timeout ends such sessions)"
    )


UNSEEN = object()  # Tx.seen_settings before any write transaction read them
# The columns of the locked row (core/pg/db.py INBOX_ROW) that `meta` reads from it.
_IN_ROW = {"paused": 4, "released_gen": 6}
_NOWAIT: dict[str, str] = {}  # a statement's text → the same, not waiting for row locks


def _nowait(sql: str) -> str:
    """`sql` with each row lock it takes not waited for: `FOR UPDATE NOWAIT`."""
    text = _NOWAIT.get(sql)
    if text is None:
        text = _NOWAIT[sql] = sql.replace("FOR UPDATE", "FOR UPDATE NOWAIT")
    return text


# The statements that change the inbox's own row (its lease, switches or settings): after
# one, the row a write transaction locked and read (`Tx.row`) is no longer current.
_CHANGE_INBOX_ROW = frozenset(
    name for name, sql in STATEMENTS.items() if sql.startswith("UPDATE inboxes")
)


class Tx:
    """The engine's Tx on one inbox of a database (core/engine/tx.py).

    `changed` records whether any statement changed a row, so a commit that changed nothing
    leaves the change token alone (an idle poller stays idle). `row` is the inbox's row as
    a write transaction locked it (core/pg/db.py INBOX_ROW's columns), so the settings,
    lease and pause switch are read without asking again; None outside a write transaction
    and once a statement has changed the inbox's row.
    """

    # What a stored row the engine cannot process raises: decoding, and the database's own
    # refusal of a value.
    row_errors: tuple[type[BaseException], ...] = DECODE_ERRORS + (
        psycopg.DataError,
        psycopg.IntegrityError,
    )
    database_errors: tuple[type[BaseException], ...] = (psycopg.OperationalError,)

    __slots__ = (
        "conn",
        "inbox",
        "name",
        "changed",
        "row",
        "begun_changes",
        "server_time",
        "offset",
        "statements",
        "looked",
        "probed",
        "finished",
        "commit_tail",
        "taken",
        "seen_settings",
        "take_missed",
        "committed",
        "undone",
        "nowait",
    )

    def __init__(
        self,
        conn: "psycopg.Connection[Row]",
        inbox: int,
        name: str,
        statements: dict[str, str] = STATEMENTS,
    ) -> None:
        self.conn = conn
        # The newest schema's statements, or a database's of an older schema that was
        # opened without migrating (STATEMENTS.for_schema).
        self.statements = statements
        self.inbox = inbox
        self.name = name
        self.changed = False
        self.row: Row | None = None
        # The change count as this write transaction began (None outside one).
        self.begun_changes: int | None = None
        # The server's clock, as read in the current transaction (None until read), and the
        # server's time minus this process's, as last seen (what Inbox.clock follows).
        self.server_time: float | None = None
        self.offset = 0.0
        # A claim's look read with a finish (finish_done's `look`): its arguments and rows,
        # good for the claim_look that comes next, until any other statement runs.
        self.looked: tuple[tuple[int, ...], list[Row]] | None = None
        # The probe for due timers read with the lock (`saw_look`): its arguments and
        # whether one is due, good for the timer_due that comes next, as `looked` is.
        self.probed: tuple[tuple[int, ...], bool] | None = None
        # A finish sent with the lock (`saw_finish`): its arguments, the look it read after
        # it (max_attempts, limit) and its rows, for the finish_done that must come first
        # (another statement first is an error if the finish wrote: see `unasked`).
        self.finished: tuple[tuple[Any, ...], tuple[int, int], list[Row]] | None = None
        # What a write transaction ends with (the change count, COMMIT), when its claim may
        # carry it (`claim`: a claim is its transaction's last statement); and whether it
        # has: the transaction is over.
        self.commit_tail: str | None = None
        # The claim a statement sent with the lock made and committed (`saw_take`): the
        # claim_next's claim it must be, (holder, generation, ids, now), and its run.
        self.taken: tuple[tuple[str, int, tuple[int, ...], int], int] | None = None
        # The settings' stored text as the last write transaction locked the inbox's row
        # (UNSEEN before any), and whether the last claim sent with the lock found a case
        # that was not plain (the next claim then reads its look instead: core/pg/db.py).
        self.seen_settings: str | None | object = UNSEEN
        self.take_missed = False
        self.committed = False
        # Whether the job's transaction rolled back on an error: the job changed nothing
        # (core/pg/db.py may then run it once more).
        self.undone = False
        # Whether the job runs on the event loop's own thread (core/pg/db.py `_write_here`):
        # it never waits for a row lock another session holds (NOWAIT), it fails at once.
        self.nowait = False

    def execute(self, sql: str, params: Any = None) -> "psycopg.Cursor[Row]":
        """One statement of this dialect's own (the switches, the counters)."""
        if self.committed:
            raise RuntimeError("a statement after the claim that committed its transaction")
        if self.finished is not None:
            self.unasked()
        self.looked = self.probed = None
        cursor = self.conn.execute(sql, params)
        # A read's rowcount counts the rows it returned. (A statement that changes rows
        # inside a WITH says so itself: see `claim`.)
        if cursor.rowcount > 0 and not sql.startswith(("SELECT", "WITH", "(")):
            self.changed = True
        return cursor

    def run(self, name: str, /, **params: Any) -> "psycopg.Cursor[Row]":
        if name in _CHANGE_INBOX_ROW:
            self.row = None
        params["inbox"] = self.inbox
        sql = self.statements[name]
        return self.execute(_nowait(sql) if self.nowait else sql, params)

    @property
    def lock(self) -> str:
        """The session statement that opens a write transaction by locking the inbox's row
        (core/pg/db.py SESSION_STATEMENTS): waiting for it, or not (`nowait`)."""
        return "onwatch_lock_nowait" if self.nowait else "onwatch_lock"

    def one(self, name: str, /, **params: Any) -> Row:
        return one(self.run(name, **params))

    def savepoint(self, name: str) -> ContextManager[None]:
        return savepoint(self.conn.execute, name, lambda: not self.conn.broken)

    def now(self, now: int | None) -> int:
        """`now` when given, else the server's time: every process of a fleet decides by
        one clock, whatever its own says (docs/rules.md#time)."""
        if now is not None:
            return now
        if self.server_time is None:
            self.saw_server_time(one(self.execute(SERVER_TIME))[0])
        assert self.server_time is not None
        return int(self.server_time)

    def statement_now(self, now: int | None) -> int | None:
        """`now`, or None: a statement outside any transaction of ours reads the server's
        clock itself (`server_time` is the last transaction's, not this statement's)."""
        return now

    def saw_server_time(self, seconds: Any) -> None:
        """The server's clock, read in this transaction (Unix seconds, with a fraction)."""
        self.server_time = float(seconds)
        self.offset = self.server_time - time.time()

    def state(self) -> InboxState:
        row = self.row if self.row is not None else self.one("inbox_state")
        holder, gen, until, settings, paused = row[:5]
        return InboxState(holder, gen, until, settings, bool(paused))

    def settings_text(self) -> str | None:
        # The row the write transaction locked holds them: no round trip.
        if self.row is not None:
            text: str | None = self.row[3]
            return text
        row = self.run("settings_load").fetchone()
        return None if row is None else row[0]

    def meta(self, key: str) -> Any:
        if key not in META_KEYS:
            raise KeyError(key)
        if self.row is not None and key in _IN_ROW:  # read with the lock: no round trip
            return self.row[_IN_ROW[key]]
        return one(self.execute(f"SELECT {key} FROM inboxes WHERE id = %s", (self.inbox,)))[0]

    def set_meta(self, key: str, value: Any) -> None:
        if key not in META_KEYS or key in COUNTERS:
            raise KeyError(key)
        self.row = None
        self.execute(f"UPDATE inboxes SET {key} = %s WHERE id = %s", (value, self.inbox))

    def bump(self, key: str) -> None:
        if key not in COUNTERS:
            raise KeyError(key)
        self.execute(f"UPDATE inboxes SET {key} = {key} + 1 WHERE id = %s", (self.inbox,))

    def insert_events(self, rows: Sequence[NewEvent]) -> set[tuple[str, str]]:
        if not rows:
            return set()
        sources, source_ids, payloads, nows = (list(column) for column in zip(*rows, strict=True))
        stored = self.run(
            "events_insert", sources=sources, source_ids=source_ids, payloads=payloads, nows=nows
        )
        return {(s, i) for s, i in stored.fetchall()}  # fetchall: one call, not one a row

    @property
    def batch_alone(self) -> bool:
        return self.statements["events_insert_alone"] == STATEMENTS["events_insert_alone"]

    def insert_events_alone(
        self, rows: Sequence[tuple[str, str, str, int | None]], settings: str | None
    ) -> list[int] | None:
        sources, source_ids, payloads, nows = (list(column) for column in zip(*rows, strict=True))
        params = dict(
            inbox=self.inbox,
            settings=settings,
            sources=sources,
            source_ids=source_ids,
            payloads=payloads,
            nows=nows,
        )
        # Never prepared by psycopg (planning a function's call costs next to nothing): a
        # statement it prepared and a pooler dropped fails outside a transaction, which
        # nothing would run again for the caller.
        cursor = self.conn.execute(self.statements["events_insert_alone"], params, prepare=False)
        stored: list[int] | None = one(cursor)[0]
        return None if stored is None else [position - 1 for position in stored]

    def release_alone(self, holder: str, gen: int, now: int | None) -> bool | None:
        released = self.run("lease_release_alone", holder=holder, gen=gen, now=now).rowcount
        return True if released == 1 else None

    def claim(self, holder: str, gen: int, ids: Sequence[int], now: int) -> int:
        listed = list(ids)
        if self.taken is not None:  # made and committed with the lock (`saw_take`)
            (made, made_run), self.taken = self.taken, None
            if made != (holder, gen, tuple(listed), now):
                raise RuntimeError(
                    f"the claim made with the lock {made} is not the engine's "
                    f"{(holder, gen, tuple(listed), now)}"
                )
            self.changed = True
            return made_run
        row = self.row  # as locked: the lease this claim was decided on (None: changed since)
        if self.commit_tail is not None and row is not None and row[:2] == (holder, gen):
            # The claim and the commit in one message (CLAIM_WITH_COMMIT): one round trip
            # where there were two. Every value is an integer of ours.
            numbers = ", ".join(str(int(i)) for i in listed)
            cursor = self.execute(
                f"EXECUTE onwatch_claim({int(self.inbox)}, {int(gen)}, {int(now)}, "
                f"ARRAY[{numbers}]::bigint[]); {self.commit_tail}"
            )
            self.committed = self.changed = True
            claimed: int = one(cursor)[0]
            return claimed
        json = "[" + ", ".join(map(str, listed)) + "]"
        run: int = self.one("claim", holder=holder, gen=gen, json=json, now=now, ids=listed)[0]
        self.changed = True  # the claim's writes are inside its WITH
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
        # One statement (queries.sql `finish_done`): its rows tagged in the last column.
        # With `look`, the claim's look is read in that same statement (FINISH_THEN_LOOK).
        # The same finish sent with the lock (`saw_finish`) has read both already.
        finished, self.finished = self.finished, None
        if finished is not None and finished[0] == (tuple(ids), gen, run, now, result, traceback):
            looked, found = finished[1:]
            if look is not None and look == looked:
                self.looked = ((gen, now, *look), [r for r in found if r[-1] < 10])
            return self._finished(found)
        if finished is not None:
            self.finished = finished
            self.unasked()
        params = {
            "ids": list(ids),
            "gen": gen,
            "run": run,
            "now": now,
            "result": result,
            "traceback": traceback,
        }
        if look is None:
            found = self.run("finish_done", **params).fetchall()
        else:
            max_attempts, limit = look
            params.update(inbox=self.inbox, max_attempts=max_attempts, limit=limit)
            found = self.execute(FINISH_THEN_LOOK, params).fetchall()
            self.looked = ((gen, now, max_attempts, limit), [r for r in found if r[-1] < 10])
        return self._finished(found)

    def _finished(self, found: list[Row]) -> tuple[Row | None, list[Row]]:
        rows = [(row[0], row[5], row[12]) for row in found if row[-1] == 10]
        known = next(((row[0], row[4]) for row in found if row[-1] == 11), None)
        self.changed = self.changed or bool(rows)
        return known, rows

    def saw_finish(self, ahead: FinishAhead, rows: list[Row]) -> None:
        """The rows of FINISH_WITH_LOCK, sent with the lock: the server's clock it read,
        and the finish and the look that answer the transaction's first finish_done if it
        asks with these arguments at the `now` it wrote by."""
        now, at = next((row[0], row[1]) for row in rows if row[-1] == 21)
        self.saw_server_time(at)
        key = (ahead.ids, ahead.gen, ahead.run, now, ahead.result, None)
        self.finished = (key, (ahead.max_attempts, ahead.limit), rows)

    def unasked(self) -> None:
        """The finish sent with the lock was not the statement the transaction asked for
        first. It wrote nothing where the engine would not have asked for it (its fence is
        the engine's), and is dropped; if it wrote, the transaction cannot go on (and rolls
        back: nothing it did is kept)."""
        finished, self.finished = self.finished, None
        if finished is not None and any(row[-1] == 10 for row in finished[2]):
            raise RuntimeError("the finish sent with the lock was not the transaction's first")

    def saw_look(self, gen: int, max_attempts: int, limit: int, rows: list[Row]) -> None:
        """The rows of LOOK_WITH_LOCK, read with the lock: they answer the probe and the
        claim's look that come next if asked with these arguments at the `now` it read by
        (the transaction's own, unless a second began between the two clock readings)."""
        now = next(row[0] for row in rows if row[-1] == 21)
        key = (gen, now, max_attempts, limit)
        self.probed = (key, any(row[-1] == 20 and row[0] > 0 for row in rows))
        self.looked = (key, [row for row in rows if row[-1] < 20])

    def saw_take(
        self, holder: str, gen: int, max_attempts: int, limit: int, rows: list[Row]
    ) -> bool:
        """The rows of TAKE_WITH_LOCK, sent with the lock and the COMMIT: whether the case
        was plain (if not, it wrote nothing). They answer the probe and the look as
        LOOK_WITH_LOCK's do, and the claim it made answers the engine's claim."""
        self.saw_look(gen, max_attempts, limit, [row for row in rows if row[-1] <= 21])
        now = next(row[0] for row in rows if row[-1] == 21)
        self.saw_server_time(next(row[1] for row in rows if row[-1] == 21))
        made = next(((row[0], row[1]) for row in rows if row[-1] == 22), None)
        if made is not None:
            ids = tuple(int(i) for i in made[1].split(","))
            self.taken = ((holder, gen, ids, now), made[0])
        return any(row[-1] == 23 and row[0] == 1 for row in rows)

    def timer_due_known(self, now: int, look: tuple[int, int, int]) -> bool | None:
        gen, max_attempts, limit = look
        probed = self.probed  # read with the lock (saw_look, saw_take), left for timer_due
        if probed is not None and probed[0] == (gen, now, max_attempts, limit):
            return probed[1]
        return None

    def timer_due(self, now: int, look: tuple[int, int, int] | None = None) -> bool:
        if look is None:
            return self.run("timer_due_any", now=now).fetchone() is not None
        gen, max_attempts, limit = look
        probed, self.probed = self.probed, None
        if probed is not None and probed[0] == (gen, now, max_attempts, limit):
            if probed[1]:  # a timer fires: the look is read again after it
                self.looked = None
            return probed[1]
        texts = (self.statements["claim_look"], self.statements["timer_due_any"])
        sql = _LOOK_AND_PROBE.get(texts)
        if sql is None:
            sql = _LOOK_AND_PROBE[texts] = _look_and_probe(*texts)
        found = self.execute(
            sql,
            {
                "inbox": self.inbox,
                "gen": gen,
                "now": now,
                "max_attempts": max_attempts,
                "limit": limit,
            },
        ).fetchall()
        due = any(row[-1] == 20 and row[0] > 0 for row in found)
        if not due:  # nothing fires: the claim's look comes next, and this is it
            self.looked = ((gen, now, max_attempts, limit), [r for r in found if r[-1] != 20])
        return due

    def _look(self, gen: int, now: int, max_attempts: int, limit: int) -> "psycopg.Cursor[Row]":
        return self.run("claim_look", gen=gen, now=now, max_attempts=max_attempts, limit=limit)

    def claim_look(
        self, gen: int, now: int, max_attempts: int, limit: int
    ) -> tuple[list[Row], list[Row]]:
        # One statement (queries.sql `claim_look`): its rows tagged in the last column. The
        # burial is a second one, only when there is anything to bury. A look read with the
        # finish just before (finish_done's `look`) answers for it.
        looked, self.looked = self.looked, None
        if looked is not None and looked[0] == (gen, now, max_attempts, limit):
            found = looked[1]
        else:
            found = self._look(gen, now, max_attempts, limit).fetchall()
        lost, claimable, spent = [], [], False
        for row in found:
            if row[-1] == 3:
                spent = row[0] > 0
            elif row[-1] == 2:
                lost.append((row[0], row[1], row[6], row[12]))
            else:
                claimable.append(row)
        if spent:
            self.run("bury_exhausted", now=now, max_attempts=max_attempts)
        return lost, claimable

    def advance_timers(self, rows: Sequence[TimerAdvance]) -> None:
        ids, dues, fired, skipped, overflows = (list(column) for column in zip(*rows, strict=True))
        self.run(
            "timers_advance", ids=ids, dues=dues, fired=fired, skipped=skipped, overflows=overflows
        )

    def fire_plain_timers(self, now: int, limit: int) -> int:
        # A plain timer's payload is spliced only once proven JSON, and PostgreSQL has no
        # JSON check an expression can use before version 16: every due timer here takes
        # the scheduler's planner (one statement per kind of write per chunk all the same).
        return 0

    def held_back(self) -> str | None:
        return held_open(self.execute)

    def change_token(self) -> tuple[int, int]:
        """The inbox's change counter: one more for every commit that changed a row of it.
        In a write transaction, the count as it began (read with its lock, no round trip),
        one more if it has changed anything so far: its own commit adds that one."""
        if self.begun_changes is not None:
            return self.begun_changes + (1 if self.changed else 0), 0
        changes: int = one(
            self.execute("SELECT changes FROM inboxes WHERE id = %s", (self.inbox,))
        )[0]
        return changes, 0

    def settled_change_token(self) -> tuple[int, int] | None:
        return self.change_token()  # a commit is visible to all at once: none is half-way
