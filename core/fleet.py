"""The fleet: many inboxes seen at once, each through a cheap read-only summary.

A fleet desk watching a thousand inboxes must not hold a thousand connections open. A
`FleetSource` lists its inboxes with a summary of each (`scan`) and opens one inbox in full
when an operator drills into it (`open`). `FolderFleet` is the SQLite source: a folder of
inbox files; `DatabaseFleet` is every inbox of a PostgreSQL database. Each summary is one read
transaction on a short-lived read-only connection
(`mode=ro`, never `create`), and a file whose database and WAL look unchanged since the last
scan (modification time and size) is not read again. A file that is not a readable inbox
(foreign, empty, locked, newer schema) becomes a summary with the reason, never an error.

`DatabaseFleet` reads every inbox's change counter in one query and the summaries of the
changed ones in a second (core/pg/summaries.py), on the one connection it keeps. Nothing
above this module needs to know which source it talks to.
"""

from __future__ import annotations

import os
import sqlite3
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterable, Mapping, Protocol, Sequence
from urllib.parse import quote

from .engine import outbox, reads, switches, timers
from .engine.plans import DAY
from .clock import Clock
from .errors import BadInput, ConnectionLost, InboxError, NotAnInbox
from .inbox import Inbox
from .records import Approval, Lease
from .settings import Settings
from .sqlite import schema
from .sqlite.tx import SqliteTx
from .pg import SILENT_AFTER as SILENT_AFTER  # the desk says a fleet worker is silent after it
from .pg import said

if TYPE_CHECKING:
    import psycopg

HOUR = 3600
SHOWN_APPROVALS = 100  # waiting approvals kept per summary, soonest first
ACTION_CHARS = 500  # of an action text kept in a summary (the full text is read on demand)
BUSY_MS = 50  # how long a summary read waits for a lock before calling the file locked
RECHECK_SECONDS = 2.0  # a file changed this recently is read again on the next scan


@dataclass(frozen=True, slots=True)
class LastRun:
    """The newest run of an inbox: when it was claimed, when it ended and how."""

    claimed_at: int
    finished_at: int | None
    outcome: str | None  # None while running; 'done' | 'error' | 'lost'


@dataclass(frozen=True, slots=True)
class InboxSummary:
    """What the fleet view shows of one inbox, read in one transaction.

    `key` names the inbox within its source (a file name); `name` is what a person calls it
    (the file stem). With `problem` set, the inbox could not be read and every other field
    is empty; `retry` says the problem may pass (a lock) so the next scan reads it again.
    """

    key: str
    name: str
    target: str
    read_at: int
    problem: str | None = None
    retry: bool = False
    pending: int = 0
    running: int = 0
    dead: int = 0
    interrupted: int = 0
    lease: Lease | None = None
    lease_released: bool = False  # the holder handed it back (not lost)
    waiting: int = 0
    approvals: tuple[Approval, ...] = ()  # waiting ones, soonest deadline first (capped)
    last_run: LastRun | None = None
    held: int = 0
    next_send_at: int | None = None
    outbox_held: bool = False
    paused: bool = False
    # when the oldest pending event arrived, and the soonest timer the scheduler can fire:
    # how long work has waited for a worker (the desk says so when no worker holds the lease)
    oldest_pending: int | None = None
    next_timer_due: int | None = None
    # runs in the hour before `read_at`: (minute, runs, failed runs) per minute with runs
    activity: tuple[tuple[int, int, int], ...] = ()
    # per unit spent in the 24 hours before `read_at` or budgeted: (unit, millionths spent,
    # the max_spend_per_day limit in millionths or None), the budgeted units first
    spend: tuple[tuple[str, int, int | None], ...] = ()
    signature: tuple[int, ...] = field(default=(), compare=False)  # file times and sizes

    @property
    def over_budget(self) -> bool:
        """A unit's spend of the last 24 hours reached its max_spend_per_day: runs wait."""
        return any(limit is not None and spent >= limit for _, spent, limit in self.spend)

    @property
    def soonest_due(self) -> int | None:
        return self.approvals[0].due if self.approvals else None

    def waiting_since(self, now: int) -> int | None:
        """Since when work has been waiting for a worker at `now`: the arrival of the oldest
        pending event, or a timer's due instant once it passed (a timer fires only in a
        worker); None when nothing waits."""
        since = [at for at in (self.oldest_pending,) if at is not None and self.pending]
        if self.next_timer_due is not None and self.next_timer_due <= now:
            since.append(self.next_timer_due)
        return min(since) if since else None

    def served(self, now: int) -> bool:
        """Whether a worker holds the lease at `now` (it may be paused: that is on purpose)."""
        return self.lease is not None and self.lease.until >= now


@dataclass(frozen=True, slots=True)
class FleetScan:
    """One pass over a source: every inbox's summary by key, and which ones were read."""

    summaries: dict[str, InboxSummary]
    read: frozenset[str]
    removed: frozenset[str]
    # Fleet workers connected to the source (a PostgreSQL database's `--all-inboxes`
    # workers; none for a folder, whose inboxes each have a worker of their own), serving;
    # and those connected but silent (no look for SILENT_AFTER: stopped, or their loop
    # blocked), which serve nothing while they are.
    workers: int = 0
    silent: int = 0


class FleetSource(Protocol):
    """Where a fleet's inboxes live. Two calls: list them with summaries, open one."""

    label: str  # what the source is, for a person (a folder, a database)

    def scan(
        self, now: int, known: Mapping[str, InboxSummary], force: frozenset[str] = frozenset()
    ) -> FleetScan:
        """Summaries of every inbox, reusing `known` ones that cannot have changed (blocking:
        run it in a thread)."""
        ...

    async def open(self, key: str, *, clock: Clock | None = None) -> Inbox:
        """Open one inbox in full (never creating one); raise InboxError if it cannot be."""
        ...


def read_summary(
    path: str, key: str, name: str, now: int, signature: tuple[int, ...] = ()
) -> InboxSummary:
    """Summarise the inbox file at `path` in one read transaction, or say why it cannot be.

    Never raises for a bad file and never writes to it: the connection is read-only
    (`mode=ro`), so a foreign, empty or newer file is left byte for byte as it was.
    """

    def refused(reason: str, retry: bool = False) -> InboxSummary:
        return InboxSummary(key, name, path, now, problem=reason, retry=retry, signature=signature)

    try:
        with open(path, "rb") as handle:
            header = handle.read(20)
        wal_mode = header[18:20] == b"\x02\x02"  # the file format of a WAL database
        # A WAL database with no WAL file has nothing un-checkpointed: read it as immutable,
        # without the lock files a reader would otherwise create (and leave) beside it. A
        # writer that starts meanwhile writes to a new WAL first, which the next scan sees.
        immutable = wal_mode and not os.path.exists(path + "-wal")
        header = header[: len(schema.SQLITE_HEADER)]
    except FileNotFoundError:
        return refused("the file disappeared", retry=True)
    except OSError as exc:
        return refused(f"cannot read the file: {exc.strerror or exc}")
    if not header:
        return refused("empty file: not an inbox yet")
    if header != schema.SQLITE_HEADER:
        return refused("not an onwatch inbox: not a SQLite database")
    try:
        options = "mode=ro&immutable=1" if immutable else "mode=ro"
        db = sqlite3.connect(
            f"file:{quote(os.path.abspath(path))}?{options}",
            uri=True,
            isolation_level=None,
            check_same_thread=False,
            timeout=BUSY_MS / 1000,
        )
    except sqlite3.Error as exc:
        return refused(f"cannot open: {exc}", retry=True)
    try:
        db.execute("BEGIN")  # one snapshot for every figure below
        try:
            version = schema.inspect(db, os.path.basename(path))
            if version == 0:
                return refused("empty SQLite database: not an inbox yet")
            return _summarise(db, path, key, name, now, signature)
        finally:
            if db.in_transaction:
                db.execute("COMMIT")
    except NotAnInbox as exc:
        return refused(str(exc))
    except sqlite3.OperationalError as exc:
        text = str(exc)
        if "locked" in text or "busy" in text:
            return refused("locked by another process", retry=True)
        return refused(f"cannot read: {text}")
    except sqlite3.Error as exc:
        return refused(f"damaged: {exc}")
    finally:
        db.close()


def _summarise(
    db: sqlite3.Connection, path: str, key: str, name: str, now: int, signature: tuple[int, ...]
) -> InboxSummary:
    tx = SqliteTx(db)
    counts = reads.counts(tx)
    lease = reads.lease_info(tx)
    # The switch a release sets, as overview() reads it (a release is not audited).
    released = lease is not None and tx.meta("released_gen") == lease.gen
    waiting = db.execute("SELECT count(*) FROM approvals WHERE answer IS NULL").fetchone()[0]
    approvals = tuple(
        Approval(r[0], r[1], r[2], None, r[3])
        for r in db.execute(
            "SELECT request_id, substr(action, 1, ?), due, requested FROM approvals "
            "WHERE answer IS NULL ORDER BY due, request_id LIMIT ?",
            (ACTION_CHARS, SHOWN_APPROVALS),
        )
    )
    row = db.execute(
        "SELECT claimed_at, finished_at, outcome FROM runs ORDER BY id DESC LIMIT 1"
    ).fetchone()
    activity = reads.run_activity(tx, now - HOUR)
    held = db.execute("SELECT count(*) FROM outbox WHERE status = 'held'").fetchone()[0]
    spend = spend_of(
        switches.load_settings(tx),
        tx.run("spend_units_since", since=now - DAY).fetchall()
        if _has_table(db, "spend")  # a file of an older schema has none (reads never migrate)
        else [],
    )
    # The oldest by id: a probe of the (status, id) index, not a scan of the pending rows.
    oldest = db.execute(
        "SELECT created FROM events WHERE status = 'pending' ORDER BY id LIMIT 1"
    ).fetchone()
    meta = dict(db.execute("SELECT key, value FROM meta WHERE key IN ('paused', 'outbox_held')"))
    return InboxSummary(
        key,
        name,
        path,
        now,
        pending=counts.get("pending", 0),
        running=counts.get("running", 0),
        dead=counts.get("dead", 0),
        interrupted=counts.get("interrupted", 0),
        lease=lease,
        lease_released=released,
        waiting=waiting,
        approvals=approvals,
        last_run=LastRun(*row) if row else None,
        held=held,
        next_send_at=outbox.next_send_at(tx) if held else None,
        outbox_held=bool(meta.get("outbox_held")),
        paused=bool(meta.get("paused")),
        oldest_pending=oldest[0] if oldest else None,
        next_timer_due=timers.next_timer_due(tx),
        activity=activity,
        spend=spend,
        signature=signature,
    )


def _has_table(db: sqlite3.Connection, name: str) -> bool:
    row = db.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (name,))
    return row.fetchone() is not None


def spend_of(
    settings: Settings, spent: Iterable[Sequence[Any]]
) -> tuple[tuple[str, int, int | None], ...]:
    """A summary's `spend`: each unit spent or budgeted, the budgeted ones first."""
    used = {str(unit): int(micros or 0) for unit, micros in spent}
    units = sorted(
        set(used) | set(settings.max_spend_per_day),
        key=lambda u: (u not in settings.max_spend_per_day, u),
    )
    return tuple((unit, used.get(unit, 0), settings.spend_limit(unit)) for unit in units)


async def run_activity(inbox: Inbox, now: int) -> tuple[tuple[int, int, int], ...]:
    """The runs of `inbox` in the hour before `now`, per minute: (minute, runs, failed runs),
    the figures of `InboxSummary.activity`, for an inbox open in full (one indexed read)."""
    return await inbox._db.read(reads.run_activity, now - HOUR)  # the engine's own read path


def run_buckets(
    activity: tuple[tuple[int, int, int], ...], now: int, buckets: int = 12
) -> tuple[list[int], int]:
    """Runs per 60/`buckets` minutes over the hour before `now` (oldest first), and how many
    of them failed: what a sparkline of an inbox's last hour shows."""
    runs, failed = [0] * buckets, 0
    minute_now, width = now // 60, 60 // buckets
    for minute, count, bad in activity:
        age = minute_now - minute
        if 0 <= age < 60:
            runs[buckets - 1 - age // width] += count
            failed += bad
    return runs, failed


class FolderFleet:
    """A folder of inbox files (`*.db`, `*.sqlite`, `*.sqlite3`), each named by its stem."""

    SUFFIXES = (".db", ".sqlite", ".sqlite3")

    def __init__(self, folder: str | os.PathLike[str], *, label: str | None = None) -> None:
        folder = os.fspath(folder)
        if not os.path.isdir(folder):
            raise BadInput(f"{folder} is not a folder of inboxes")
        self.folder = folder
        self.label = folder if label is None else label

    def path(self, key: str) -> str:
        return os.path.join(self.folder, key)

    def scan(
        self, now: int, known: Mapping[str, InboxSummary], force: frozenset[str] = frozenset()
    ) -> FleetScan:
        """Every inbox file's summary; a file whose database and WAL kept their modification
        time and size is not read again (unless in `force`, or last read as locked)."""
        entries: dict[str, os.DirEntry[str]] = {}
        try:
            with os.scandir(self.folder) as listing:
                for entry in listing:
                    entries[entry.name] = entry
        except OSError:
            return FleetScan(dict(known), frozenset(), frozenset())
        wall = time.time()
        summaries: dict[str, InboxSummary] = {}
        read = set()
        for key, entry in entries.items():
            if not key.endswith(self.SUFFIXES) or key.startswith("."):
                continue
            try:
                if not entry.is_file():
                    continue
                stat = entry.stat()
            except OSError:
                continue
            signature: tuple[int, ...] = (stat.st_mtime_ns, stat.st_size)
            newest = stat.st_mtime
            wal = entries.get(key + "-wal")
            if wal is not None:
                try:
                    wal_stat = wal.stat()
                except OSError:
                    wal_stat = None
                # An empty WAL holds nothing to read (a reader may have just created it).
                if wal_stat is not None and wal_stat.st_size:
                    signature += (wal_stat.st_mtime_ns, wal_stat.st_size)
                    newest = max(newest, wal_stat.st_mtime)
            before = known.get(key)
            if (
                before is not None
                and before.signature == signature
                and not before.retry
                and key not in force
            ):
                summaries[key] = before
                continue
            # A change within the file system's timestamp granularity of the read could keep
            # the signature: a file written just now is read again on the next scan.
            summary = read_summary(
                entry.path,
                key,
                os.path.splitext(key)[0],
                now,
                signature if wall - newest > RECHECK_SECONDS else (),
            )
            summaries[key] = summary
            read.add(key)
        removed = frozenset(set(known) - set(summaries))
        return FleetScan(summaries, frozenset(read), removed)

    async def open(self, key: str, *, clock: Clock | None = None) -> Inbox:
        """Open the inbox file `key` in full; NotAnInbox (file untouched) if it is not one."""
        if os.sep in key or key in ("", ".", ".."):
            raise BadInput(f"{key!r} is not an inbox of this folder")
        return await Inbox.open(self.path(key), clock=clock, create=False)


class DatabaseFleet:
    """Every inbox of one PostgreSQL database (`onwatch tui postgresql://…`), by name.

    One connection, kept (a thousand inboxes never mean a thousand connections). A scan
    reads every inbox's change counter in one query and the full summary of only the ones
    whose counter moved (or that are new, or forced) in a second; an inbox created meanwhile
    shows up at the next scan. Drilling in opens the inbox with `Inbox.open(url, name=)`.
    """

    def __init__(self, url: str, *, label: str | None = None) -> None:
        from .pg import is_url, redact

        if not is_url(url):
            raise BadInput(f"{url!r} is not a postgresql:// URL")
        self.url = url
        self.shown_url = redact(url)
        self.label = self.shown_url if label is None else label
        self._conn: psycopg.Connection[tuple[Any, ...]] | None = None

    def _connect(self) -> psycopg.Connection[tuple[Any, ...]]:

        from .pg import schema as pg_schema
        from .pg.connect import connect as pg_connect, ended_while_idle

        if self._conn is not None and not self._conn.closed and ended_while_idle(self._conn):
            self._conn.close()  # by the server, between two scans: a new one, nothing lost
        if self._conn is None or self._conn.closed:
            conn = pg_connect(self.url)
            try:
                pg_schema.inspect(conn, self.shown_url)
            except BaseException:
                conn.close()
                raise
            self._conn = conn
        return self._conn

    def check(self) -> None:
        """Connect now: raise InboxError (NotAnInbox for a foreign or newer database) with a
        one-line reason, so a wrong URL fails before the desk opens; ConnectionLost (an
        InboxError) where a later try may succeed (core/pg/connect.py `not_yet`)."""
        import psycopg

        from .pg.connect import not_yet

        try:
            self._connect()
        except psycopg.Error as exc:
            message = f"{self.shown_url}: {said(exc)}"
            why = not_yet(exc, self.url)
            if why is None:
                raise InboxError(message) from None
            raise ConnectionLost(f"{message} ({why}); try again") from None

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def scan(
        self, now: int, known: Mapping[str, InboxSummary], force: frozenset[str] = frozenset()
    ) -> FleetScan:
        """Every inbox's summary; an inbox whose change counter kept its value is not read
        again (unless in `force`). A lost connection raises InboxError saying so; it is
        opened again at the next scan, and the desk keeps the summaries it had meanwhile."""
        import psycopg

        from .pg import summaries as sql

        try:
            conn = self._connect()
            listing = sql.changes(conn)
            stale = [
                inbox_id
                for inbox_id, name, changes in listing
                if name in force or known.get(name) is None or known[name].signature != (changes,)
            ]
            rows = (
                sql.summaries(conn, stale, now - HOUR, SHOWN_APPROVALS, ACTION_CHARS)
                if stale
                else []
            )
            spent = sql.spend(conn, stale, now - DAY) if stale else {}
            workers, silent = sql.fleet_workers(conn)
        except (psycopg.Error, InboxError, OSError) as exc:
            self.close()
            raise InboxError(
                f"lost the connection to {self.shown_url} ({said(exc)}); "
                f"trying again every second, showing what was last read"
            ) from None
        fresh = {row[1]: self._summary(row, now, spent.get(row[0], [])) for row in rows}
        summaries = {
            name: fresh.get(name) or known[name]
            for _, name, _ in listing
            if name in fresh or name in known
        }
        removed = frozenset(set(known) - set(summaries))
        return FleetScan(summaries, frozenset(fresh), removed, workers, silent)

    def _summary(
        self, row: tuple[Any, ...], now: int, spent: Sequence[tuple[str, Any]] = ()
    ) -> InboxSummary:
        (
            _,
            name,
            changes,
            holder,
            gen,
            until,
            released_gen,
            paused,
            outbox_held,
            settings,
            last_paced_send,
            pending,
            running,
            dead,
            interrupted,
            waiting,
            approvals,
            claimed_at,
            finished_at,
            outcome,
            activity,
            held,
            undelivered,
            oldest_pending,
            next_timer_due,
        ) = row
        next_send_at = None
        stored = Settings.from_json(settings) if settings else Settings()
        if undelivered:
            next_send_at = 0 if last_paced_send is None else last_paced_send + stored.outbox_gap
        return InboxSummary(
            name,
            name,
            f"{self.shown_url} inbox {name}",
            now,
            pending=int(pending),
            running=int(running),
            dead=int(dead),
            interrupted=int(interrupted),
            lease=None if holder is None else Lease(holder, gen, until),
            lease_released=gen is not None and released_gen == gen,
            waiting=int(waiting),
            approvals=tuple(Approval(a[0], a[1], a[2], None, a[3]) for a in approvals),
            last_run=None if claimed_at is None else LastRun(claimed_at, finished_at, outcome),
            held=int(held),
            next_send_at=next_send_at,
            outbox_held=bool(outbox_held),
            paused=bool(paused),
            oldest_pending=oldest_pending,
            next_timer_due=next_timer_due,
            activity=tuple((a[0], a[1], a[2]) for a in activity),
            spend=spend_of(stored, spent),
            signature=(changes,),
        )

    async def open(self, key: str, *, clock: Clock | None = None) -> Inbox:
        """Open the inbox named `key` in full (never creating one); NotAnInbox if it is gone."""
        return await Inbox.open(self.url, name=key, clock=clock, create=False)
