"""What the engine's transaction scripts are given: one transaction of one inbox (`Tx`), as a
backend's dialect provides it.

A script (core/engine/*.py) is written once: it reads through named statements, decides in
Python (with core/engine/plans.py, timing.py, decoding.py), and writes through named
statements. A dialect (core/sqlite/tx.py, core/pg/tx.py) supplies

- its SQL as named statements (core/sqlite/queries.sql, core/pg/queries.sql), run by name
  with named parameters; a list parameter is a list of ids or texts, which SQLite reads with
  json_each and PostgreSQL as an array;
- the few operations whose shape differs between the databases, as the methods declared
  below (the inbox's switches are a key-value table on SQLite and columns of the inbox's
  row on PostgreSQL; a multi-row insert; the claim, one statement on PostgreSQL);
- its errors: `row_errors` are what a stored row the engine cannot process raises (set
  aside with the reason, the pass goes on); anything else stops the transaction.

Scripts never import a driver (an import-linter contract says so) and never catch a
driver's error by name.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, ContextManager, Iterator, NamedTuple, Protocol, Sequence

from ..settings import Settings
from .decoding import settings_from

Row = Sequence[Any]
# An events row as inserted: (source, source_id, payload JSON, available_at/created/updated).
NewEvent = tuple[str, str, str, int]
# A recurring timer moved on by a scheduler pass: (id, due, last_fired, last_skipped, overflow).
TimerAdvance = tuple[str, int, int | None, int | None, int]

# The inbox's switches and counters (SQLite's `meta` keys; PostgreSQL's inbox columns).
META_KEYS = (
    "paused",
    "outbox_held",
    "refused_writes",
    "takeovers",
    "set_aside",
    "last_paced_send",
    "released_gen",
    "uid",
)
COUNTERS = ("refused_writes", "takeovers", "set_aside")


class LookAhead(NamedTuple):
    """What a write transaction reads first, said before it begins: a claim's look
    (Tx.claim_look's arguments; `now` None for the backend's clock). A backend may read it
    with the transaction's lock (one round trip fewer on PostgreSQL); the transaction uses
    those rows only if its own decision asks for exactly this look."""

    gen: int
    max_attempts: int
    limit: int
    now: int | None


class FinishAhead(NamedTuple):
    """What a write transaction does first, said before it begins: a run's successful
    finish (Tx.finish_done's arguments; `now` None for the backend's clock), then the
    claim's look with `max_attempts` and `limit`. A backend may send it with the
    transaction's lock, fenced in the statement as the engine fences (this holder, this
    generation, a lease not expired): it writes only where the engine would have asked for
    exactly this finish, and its rows answer only that."""

    holder: str
    gen: int
    run: int
    ids: tuple[int, ...]
    result: str | None
    max_attempts: int
    limit: int
    now: int | None


class ClaimAhead(NamedTuple):
    """What a write transaction is, said before it begins: a worker's step before a run
    (runs.claim_next) for this holder and generation, due timers fired if `timers`; `now`
    None for the backend's clock. A backend may make the claim in a statement sent with the
    lock, and commit it in that same message, only where it proves the engine would claim
    exactly that (runs.plain_claim's settings, unchanged; this generation's live lease; not
    paused; no claim lost, no event out of attempts, no timer due when `timers`; every event
    it takes one the engine can run). Anywhere else that statement changes nothing and the
    transaction runs as it would have. The engine's own decision is made all the same, on
    the rows the statement read, and must be that claim."""

    holder: str
    gen: int
    max_attempts: int  # as the caller's settings say: the look read where the claim is not
    limit: int  # made with the lock (LookAhead's)
    timers: bool
    now: int | None

    def look(self) -> LookAhead:
        return LookAhead(self.gen, self.max_attempts, self.limit, self.now)


class FinishClaimAhead(NamedTuple):
    """What a write transaction is, said before it begins: a run's successful finish that
    writes nothing but its own rows (no message, no approval request), then
    a worker's claim_next for the same holder and generation (runs.finish_and_claim), due
    timers fired if `timers`. A backend may make both in a statement sent with the lock,
    and commit them in that same message, only where it proves the engine would write
    exactly that: `finish` as FinishAhead fences it, the run this generation's open run,
    and the claim ClaimAhead's plain case. Anywhere else that statement changes nothing and
    the transaction runs as `finish` says."""

    finish: FinishAhead
    timers: bool

    def claim(self) -> ClaimAhead:
        finish = self.finish
        return ClaimAhead(
            finish.holder, finish.gen, finish.max_attempts, finish.limit, self.timers, finish.now
        )


# What a write transaction says it does first (Connection.write_ahead).
Ahead = LookAhead | FinishAhead | ClaimAhead | FinishClaimAhead


class Rows(Protocol):
    """A statement's result, as both drivers' cursors give it."""

    @property
    def rowcount(self) -> int: ...  # rows a DML statement changed (not for a SELECT)
    def fetchone(self) -> Any: ...
    def fetchall(self) -> list[Any]: ...
    def __iter__(self) -> Iterator[Any]: ...


@dataclass(frozen=True, slots=True)
class InboxState:
    """What a deciding transaction reads first: the lease, the settings and the pause
    switch. `holder` is None before any worker took the lease; `gen` and `until` are as
    stored (a row edited by hand may hold anything: `holds` checks their types)."""

    holder: str | None
    gen: Any
    until: Any
    settings_text: str | None
    paused: bool

    @property
    def settings(self) -> Settings:
        text = self.settings_text
        return settings_from(text)

    def holds(self, holder: str, gen: int, now: int) -> bool:
        """The fencing rule: exactly this holder and generation, not expired (an expiry
        edited by hand into a non-integer has expired)."""
        return (
            self.holder == holder
            and self.gen == gen
            and type(self.until) is int
            and self.until >= now
        )


class Tx(Protocol):
    """One transaction of one inbox. Methods run on the connection's own thread."""

    # What a stored row the engine cannot process raises (decoding and the database's own
    # refusals of a value), beyond core/engine/decoding.py's DECODE_ERRORS.
    row_errors: tuple[type[BaseException], ...]
    # What the database raises about itself, never about one row: a full disk, a lock held
    # too long, a lost connection (the driver's OperationalError). Every row's, so never
    # caught for one row: the transaction fails, and each caller hears why.
    database_errors: tuple[type[BaseException], ...]

    @property
    def batch_alone(self) -> bool:
        """Whether `insert_events_alone` can store a batch (PostgreSQL from schema 7)."""
        ...

    def run(self, name: str, /, **params: Any) -> Rows:
        """Run the named statement of this dialect with these parameters."""
        ...

    def one(self, name: str, /, **params: Any) -> Row:
        """The row of a named statement that always returns exactly one (an aggregate)."""
        ...

    def savepoint(self, name: str) -> ContextManager[None]:
        """A savepoint: released when the block ends, rolled back to (and the error
        raised on) when it raises."""
        ...

    def now(self, now: int | None) -> int:
        """`now` when given; otherwise this backend's time for the deciding transaction
        (the process's wall clock on SQLite, the database server's on PostgreSQL)."""
        ...

    def statement_now(self, now: int | None) -> int | None:
        """`now` for one autocommit statement, which no transaction of ours timed: SQLite's
        as `now` above; PostgreSQL's None when not given, for the statement to read the
        server's clock itself (no round trip of its own)."""
        ...

    def state(self) -> InboxState:
        """The lease, settings and pause switch, as of this transaction (one read)."""
        ...

    def settings_text(self) -> str | None:
        """The stored settings (JSON), as of this transaction (None: never set)."""
        ...

    def meta(self, key: str) -> Any:
        """One of META_KEYS."""
        ...

    def set_meta(self, key: str, value: Any) -> None: ...

    def bump(self, key: str) -> None:
        """Add one to one of COUNTERS."""
        ...

    def insert_events(self, rows: Sequence[NewEvent]) -> set[tuple[str, str]]:
        """Store each row whose (source, source_id) is not stored yet, in order (a key
        repeated in `rows` is a duplicate of its first copy); return the keys stored."""
        ...

    def insert_events_alone(
        self, rows: Sequence[tuple[str, str, str, int | None]], settings: str | None
    ) -> list[int] | None:
        """`insert_events` as one autocommit statement (outside any transaction) that locks
        the inbox's row, stores the rows only while the stored settings are still
        `settings`, and counts its change itself (where `batch_alone`): the positions (from
        0) of the rows stored. None when the settings changed (a write transaction then
        decides). Each row's `now` as from `statement_now`."""
        ...

    def release_alone(self, holder: str, gen: int, now: int | None) -> bool | None:
        """`lease.release` as one autocommit statement (outside any transaction) that locks
        the inbox's row and counts its change itself, where the dialect has one: True once it
        handed the lease back; None when it has none or released nothing (a write
        transaction then decides). `now` as from `statement_now`."""
        ...

    def claim(self, holder: str, gen: int, ids: Sequence[int], now: int) -> int:
        """Record a run of these events for this generation and mark them running (attempts
        counted); return the run's id. A claim is its transaction's last statement: a
        dialect may commit the transaction with it (PostgreSQL does, one round trip fewer)."""
        ...

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
        """A run's successful finish, in as few round trips as the dialect can: the run's
        (gen, outcome) as it was (run_outcome; None: no such run), and only if it was this
        generation's open run, its events among `ids` still running under it marked done
        (events_finish_done's rows) and the run closed once none of its events is left
        running (runs_close).

        `look` (max_attempts, limit): a claim_look with these, this generation and `now`
        comes next; a dialect may read it together with the finish (a finish changes no
        pending event and no other generation's claim) and answer that claim_look from it,
        if no other statement runs in between."""
        ...

    def claim_look(
        self, gen: int, now: int, max_attempts: int, limit: int
    ) -> tuple[list[Row], list[Row]]:
        """A claim's look, in as few round trips as the dialect can: bury the pending
        events out of attempts (bury_exhausted), and read the claims lost by an older
        generation (id, source, claim_gen, run_id) and what the next run may take (the
        oldest retried event that may run, tagged 1 in the last column, and up to `limit`
        fresh ones, tagged 0). What may run is read as it was before any lost claim is
        recovered: a caller that recovers one looks again."""
        ...

    def timer_due(self, now: int, look: tuple[int, int, int] | None = None) -> bool:
        """Whether any timer that may fire is due at `now` (timer_due_any).

        `look` (gen, max_attempts, limit): a claim_look with these and `now` comes next if
        none is due; a dialect may read it in the same round trip (as with finish_done's)
        and answer that claim_look from it, if no other statement runs in between."""
        ...

    def timer_due_known(self, now: int, look: tuple[int, int, int]) -> bool | None:
        """timer_due's answer for a claim_look with `look` at `now` where this transaction
        has read it already (with the statement it began with), changing nothing; None
        where the answer would cost a statement."""
        ...

    def advance_timers(self, rows: Sequence[TimerAdvance]) -> None:
        """Move recurring timers on after firing (a None last_fired/last_skipped keeps the
        stored value; overflow is added)."""
        ...

    def fire_plain_timers(self, now: int, limit: int) -> int:
        """Fire, with a few set statements, the leading run of plain timers among the next
        `limit` due ones (what timing.plain_occurrence and plain_recurring would fire, the
        same events in the same order, the same timers moved on or deleted); return how many.
        0 when the first is not plain, the database refused the run (nothing of it is
        written), or the dialect has no such statements: the scheduler plans those rows one
        by one."""
        ...

    def held_back(self) -> str | None:
        """Why the store cannot clean up after its writes, held back by a reader of another
        process that does not end, else None (docs/rules.md, "A read that never ends"). Run
        outside a transaction (Connection.call)."""
        ...

    def change_token(self) -> tuple[int, int]:
        """A value that moves whenever anything of this inbox committed (cheap, no table
        scan): what an idle poller compares."""
        ...

    def settled_change_token(self) -> tuple[int, int] | None:
        """change_token, read while no other connection is in the middle of a commit; None
        if one is (its commit may not be visible yet). Run outside a transaction
        (Connection.call)."""
        ...


@contextmanager
def savepoint(
    execute: Callable[[str], object], name: str, usable: Callable[[], bool] = lambda: True
) -> Iterator[None]:
    """`Tx.savepoint` for a dialect whose connection runs SQL text with `execute`: released
    when the block ends, rolled back to (if the connection is still `usable`) and the error
    raised when it raises."""
    execute(f"SAVEPOINT {name}")
    try:
        yield
    except BaseException:
        if usable():
            execute(f"ROLLBACK TO {name}")
            execute(f"RELEASE {name}")
        raise
    execute(f"RELEASE {name}")
