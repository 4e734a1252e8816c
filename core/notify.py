"""`onwatch notify`: tell a person when the agent needs one, even when nobody watches a desk.

    notifier = Notifier(await Watched.of("alice.db"), "notify-send onwatch \"$ONWATCH_TEXT\"",
                        state="notify.db")
    await notifier.run(stop)

What needs a person, looked for every `poll` seconds (and at once when an inbox file is
written): an approval starts waiting; a waiting approval comes within DEADLINE_WARNING of its
deadline; an event dies; an inbox has work (pending events, a due timer) and no live worker
for `unattended_after` seconds. Each of these is one *thing* with a key of its own, said once:
the keys said, and the ones still to say, are kept in a small SQLite file of the notifier's own
(`Memory`), committed before the command runs, so a notifier started again neither repeats
what it said nor forgets what it had still to say. (A command that ran but whose success was
not recorded, the notifier killed in between, runs once more: at least once, as a delivery.)

The command runs with a JSON document on its standard input (`Notice.document`: kind, inbox,
ids, deadline, text) and the same in ONWATCH_KIND, ONWATCH_INBOX, ONWATCH_TEXT, ONWATCH_KEY.
It runs in a process of its own, never in a transaction and never on the event loop (the loop
only waits for it, up to `timeout`), one at a time, at most `max_per_minute` a minute: when
more things are due than the rate allows, the last run carries the rest as one digest. A
command that fails (exits non-zero, or runs past `timeout`) is logged, escaped, and run again
after a backoff (`retry_base` doubling up to `retry_cap`), at most `max_attempts` times.

The notifier only reads the inboxes; it never writes to them.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import math
import os
import sqlite3
import time
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Iterable, Sequence

from .clock import Clock, SystemClock
from .errors import BadInput, FileLost, InboxError
from .fleet import DatabaseFleet, FleetSource, FolderFleet, InboxSummary
from .inbox import Inbox
from .pg import is_url, redact
from .reachable import until_reachable
from .records import Approval, Event, Lease
from .shell import run_shell
from .text import printable

log = logging.getLogger("onwatch.notify")

DEADLINE_WARNING = 600  # s: an approval this close to its deadline is said again
DIED_PAGE = 500  # dead events read per inbox per look
DIGEST_ITEMS = 50  # things a digest lists (its count says how many in all)
TEXT_CHARS = 300  # of an agent's text (an action, an error) a notice quotes
KINDS = ("approval_waiting", "approval_deadline", "event_dead", "unattended", "digest")


def _quote(text: object, limit: int = TEXT_CHARS) -> str:
    """Untrusted text for a notice: one line, every control character escaped, bounded."""
    flat = " ".join(str(text).split())
    return printable(flat if len(flat) <= limit else flat[:limit] + "…")


def _left(seconds: int) -> str:
    if seconds <= 0:
        return "now"
    minutes, rest = divmod(seconds, 60)
    hours, minutes = divmod(minutes, 60)
    return (
        f"{hours}h{minutes:02d}m"
        if hours
        else (f"{minutes}m{rest:02d}s" if minutes else f"{rest}s")
    )


@dataclass(frozen=True, slots=True)
class Notice:
    """One thing a person should hear about, once. `key` names the thing (the same key is
    never said twice); `ids` are what a program needs to act on it."""

    key: str
    kind: str
    inbox: str
    target: str
    text: str
    at: int
    ids: dict[str, Any] = field(default_factory=dict)
    deadline: int | None = None

    def document(self) -> dict[str, Any]:
        """What the command reads on its standard input (as JSON)."""
        return {
            "kind": self.kind,
            "key": self.key,
            "inbox": self.inbox,
            "target": self.target,
            "at": self.at,
            "ids": self.ids,
            "deadline": self.deadline,
            "text": self.text,
        }


@dataclass(frozen=True, slots=True)
class Look:
    """What one look at one inbox found (from an open inbox, or a fleet's summary)."""

    inbox: str  # its name for a person
    target: str  # the file, or the database and the inbox's name
    now: int
    waiting: tuple[Approval, ...]
    lease: Lease | None
    lease_released: bool
    work_since: int | None  # since when it has had work for a worker (None: none)
    pending: int
    died: tuple[Event, ...]


def notices_of(look: Look, unattended_after: int) -> list[Notice]:
    """The things `look` shows, each with its key (whether said already is Memory's)."""
    found: list[Notice] = []
    here = f"{look.target}\x1f"
    for approval in look.waiting:
        left = approval.due - look.now
        ids = {"request_id": approval.request_id}
        action = _quote(approval.action)
        found.append(
            Notice(
                here + f"approval\x1f{approval.request_id}",
                "approval_waiting",
                look.inbox,
                look.target,
                f"{_quote(look.inbox, 60)}: approval {_quote(approval.request_id, 80)} waits "
                f"for you (expires in {_left(left)}): {action}",
                look.now,
                ids,
                approval.due,
            )
        )
        if left <= DEADLINE_WARNING:
            found.append(
                Notice(
                    here + f"deadline\x1f{approval.request_id}",
                    "approval_deadline",
                    look.inbox,
                    look.target,
                    f"{_quote(look.inbox, 60)}: approval {_quote(approval.request_id, 80)} "
                    f"expires in {_left(left)} unless answered: {action}",
                    look.now,
                    ids,
                    approval.due,
                )
            )
    for event in look.died:
        found.append(
            Notice(
                here + f"dead\x1f{event.id}\x1f{event.updated}",
                "event_dead",
                look.inbox,
                look.target,
                f"{_quote(look.inbox, 60)}: event #{event.id} ({_quote(event.source, 60)} / "
                f"{_quote(event.source_id, 80)}) died after {event.attempts} attempt(s): "
                f"{_quote(event.error or 'no reason recorded')}",
                look.now,
                {"event_id": event.id, "run_id": event.run_id},
            )
        )
    lease = look.lease
    if look.work_since is not None and (lease is None or lease.until < look.now):
        since = look.work_since if lease is None else max(look.work_since, lease.until + 1)
        if look.now - since >= unattended_after:
            gen = 0 if lease is None else lease.gen
            if lease is None:
                worker = "no worker has ever taken it"
            elif look.lease_released:
                worker = f"its last worker ({_quote(lease.holder, 60)}) stopped"
            else:
                worker = (
                    f"the lease of {_quote(lease.holder, 60)} (generation {gen}) expired "
                    f"{_left(look.now - lease.until)} ago"
                )
            found.append(
                Notice(
                    here + f"unattended\x1f{gen}",
                    "unattended",
                    look.inbox,
                    look.target,
                    f"{_quote(look.inbox, 60)} has work ({look.pending} pending) and no live "
                    f"worker: {worker}",
                    look.now,
                    {"lease_gen": gen},
                )
            )
    return found


def digest(notices: Sequence[Notice], now: int) -> Notice:
    """Several things as one notice, when the rate allows no more commands."""
    counts: dict[str, int] = {}
    for notice in notices:
        counts[notice.kind] = counts.get(notice.kind, 0) + 1
    words = {
        "approval_waiting": "approval(s) waiting",
        "approval_deadline": "approval(s) near their deadline",
        "event_dead": "event(s) died",
        "unattended": "inbox(es) without a worker",
    }
    text = f"{len(notices)} things need you: " + ", ".join(
        f"{n} {words.get(kind, kind)}" for kind, n in sorted(counts.items())
    )
    inboxes = sorted({n.inbox for n in notices})
    return Notice(
        "digest\x1f" + hashlib.sha256("\n".join(n.key for n in notices).encode()).hexdigest(),
        "digest",
        inboxes[0] if len(inboxes) == 1 else f"{len(inboxes)} inboxes",
        "",
        text,
        now,
        {"count": len(notices), "items": [n.document() for n in notices[:DIGEST_ITEMS]]},
    )


class MemoryFailed(InboxError):
    """The notifier's own memory could not be read or written (a full disk, a file locked
    past the busy timeout). Nothing new is said until it can be: what is said is first
    remembered, so that nothing is said twice or lost."""


# Seconds between two log lines saying the same failure (the memory, or reading an inbox).
SAY_FAILURE_EVERY = 60.0


class Memory:
    """What the notifier said and has still to say, in a SQLite file of its own (never an
    inbox): every call is one short transaction, run in a thread off the event loop."""

    def __init__(self, path: str) -> None:
        self.path = path
        try:
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
            self._db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
            self._open()
        except (sqlite3.Error, OSError, ValueError) as exc:
            raise BadInput(f"cannot keep the notifier's memory in {path}: {exc}") from None
        self._lock = asyncio.Lock()

    def _open(self) -> None:
        db = self._db
        db.execute("PRAGMA busy_timeout = 5000")
        if db.execute("PRAGMA journal_mode = WAL").fetchone()[0] != "wal":
            raise sqlite3.OperationalError("the file system takes no write-ahead log")
        db.execute("PRAGMA synchronous = FULL")
        with self._tx():
            db.execute(
                "CREATE TABLE IF NOT EXISTS notices (key TEXT PRIMARY KEY, kind TEXT NOT NULL, "
                "document TEXT NOT NULL, state TEXT NOT NULL CHECK (state IN "
                "('due', 'said', 'gave up')), attempts INTEGER NOT NULL DEFAULT 0, "
                "next_try INTEGER NOT NULL, seen INTEGER NOT NULL, said INTEGER, "
                "last_error TEXT)"
            )
            db.execute(
                "CREATE INDEX IF NOT EXISTS notices_due ON notices(next_try) WHERE state = 'due'"
            )
            db.execute(
                "CREATE TABLE IF NOT EXISTS watermarks (target TEXT PRIMARY KEY, "
                "died_since INTEGER NOT NULL)"
            )

    @contextlib.contextmanager
    def _tx(self) -> Any:
        self._db.execute("BEGIN IMMEDIATE")
        try:
            yield
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        self._db.execute("COMMIT")

    async def _call(self, fn: Callable[..., Any], *args: Any) -> Any:
        async with self._lock:  # one transaction at a time on the one connection
            try:
                return await asyncio.to_thread(fn, *args)
            except sqlite3.Error as exc:
                raise MemoryFailed(f"cannot use its memory {self.path}: {exc}") from None

    def close(self) -> None:
        self._db.close()

    async def remember(self, notices: Sequence[Notice]) -> list[Notice]:
        """Keep the notices not known yet as due; return them (the new things)."""
        return list(await self._call(self._remember, notices))

    def _remember(self, notices: Sequence[Notice]) -> list[Notice]:
        new = []
        with self._tx():
            for notice in notices:
                added = self._db.execute(
                    "INSERT INTO notices(key, kind, document, state, next_try, seen) "
                    "VALUES (?, ?, ?, 'due', ?, ?) ON CONFLICT(key) DO NOTHING",
                    (notice.key, notice.kind, json.dumps(notice.document()), notice.at, notice.at),
                ).rowcount
                if added:
                    new.append(notice)
        return new

    async def said_already(self, keys: Iterable[str]) -> None:
        """Mark things as said without saying them (covered by another notice)."""
        await self._call(self._mark, list(keys), "said", None, 0)

    async def due(self, now: int) -> list[tuple[Notice, int]]:
        """The things to say now (their next try has come), oldest first, with the tries
        they have had."""
        rows = await self._call(
            lambda: self._db.execute(
                "SELECT document, attempts FROM notices WHERE state = 'due' AND next_try <= ? "
                "ORDER BY seen, key",
                (now,),
            ).fetchall()
        )
        due = []
        for document, attempts in rows:
            data = json.loads(document)
            due.append(
                (
                    Notice(
                        data["key"],
                        data["kind"],
                        data["inbox"],
                        data["target"],
                        data["text"],
                        data["at"],
                        data["ids"],
                        data["deadline"],
                    ),
                    int(attempts),
                )
            )
        return due

    async def next_try(self) -> int | None:
        row = await self._call(
            lambda: self._db.execute(
                "SELECT min(next_try) FROM notices WHERE state = 'due'"
            ).fetchone()
        )
        return None if row is None or row[0] is None else int(row[0])

    def _mark(self, keys: list[str], state: str, error: str | None, next_try: int) -> None:
        with self._tx():
            for key in keys:
                if state == "due":  # failed: another try later
                    self._db.execute(
                        "UPDATE notices SET attempts = attempts + 1, next_try = ?, "
                        "last_error = ? WHERE key = ?",
                        (next_try, error, key),
                    )
                else:
                    self._db.execute(
                        "UPDATE notices SET state = ?, said = ?, last_error = coalesce(?, "
                        "last_error), attempts = attempts + (? = 'gave up') WHERE key = ?",
                        (state, next_try, error, state, key),
                    )

    async def mark(self, keys: Sequence[str], state: str, error: str | None, at: int) -> None:
        """'said' (at `at`), 'gave up' (with the last error), or 'due' again from `at`."""
        await self._call(self._mark, list(keys), state, error, at)

    async def watermark(self, target: str, now: int) -> int:
        """Since when this inbox's deaths are to be said: the first look's instant for an
        inbox never looked at (what died before the notifier watched is not news)."""

        def read() -> int:
            with self._tx():
                self._db.execute(
                    "INSERT INTO watermarks(target, died_since) VALUES (?, ?) "
                    "ON CONFLICT(target) DO NOTHING",
                    (target, now),
                )
                row = self._db.execute(
                    "SELECT died_since FROM watermarks WHERE target = ?", (target,)
                ).fetchone()
            return int(row[0])

        value: int = await self._call(read)
        return value

    async def watermarks(self, targets: Sequence[str], now: int) -> dict[str, int]:
        """The watermarks of these inboxes, each set to `now` if it had none (one
        transaction)."""

        def read() -> dict[str, int]:
            found = {}
            with self._tx():
                for target in targets:
                    self._db.execute(
                        "INSERT INTO watermarks(target, died_since) VALUES (?, ?) "
                        "ON CONFLICT(target) DO NOTHING",
                        (target, now),
                    )
                    row = self._db.execute(
                        "SELECT died_since FROM watermarks WHERE target = ?", (target,)
                    ).fetchone()
                    found[target] = int(row[0])
            return found

        marks: dict[str, int] = await self._call(read)
        return marks

    async def move_watermark(self, target: str, since: int) -> None:
        def write() -> None:
            with self._tx():
                self._db.execute(
                    "UPDATE watermarks SET died_since = max(died_since, ?) WHERE target = ?",
                    (since, target),
                )

        await self._call(write)

    async def retry_now(self, now: int) -> None:
        """Bring every waiting retry forward to `now` (a restart: often after the command
        was fixed); the attempts already made still count."""

        def write() -> None:
            with self._tx():
                self._db.execute(
                    "UPDATE notices SET next_try = ? WHERE state = 'due' AND next_try > ?",
                    (now, now),
                )

        await self._call(write)

    async def keys(self) -> set[str]:
        """Every thing known, said or still to say."""
        rows = await self._call(lambda: self._db.execute("SELECT key FROM notices").fetchall())
        return {str(row[0]) for row in rows}

    async def counts(self) -> dict[str, int]:
        rows = await self._call(
            lambda: self._db.execute(
                "SELECT state, count(*) FROM notices GROUP BY state"
            ).fetchall()
        )
        return {str(state): int(n) for state, n in rows}


class Watched:
    """What a notifier watches: one inbox (a file, or one inbox of a database), or a fleet
    (a folder of inbox files, every inbox of a database). `looks` reads each inbox that may
    have something new; `close` ends what it holds."""

    def __init__(self, label: str, inbox: Inbox | None = None, fleet: FleetSource | None = None):
        self.label = label
        self.inbox = inbox
        self.fleet = fleet
        self._known: dict[str, InboxSummary] = {}
        self._first_seen: dict[str, int] = {}  # inboxes without a lease: when work was seen
        self._marks: dict[str, int] = {}  # each inbox's watermark, as last read or moved

    @classmethod
    async def of(
        cls,
        target: str,
        *,
        name: str | None = None,
        clock: Clock | None = None,
        stopped: Callable[[], bool] = lambda: False,
    ) -> Watched | None:
        """TARGET as the command line gives it: a file, a folder of inbox files, or a
        postgresql:// URL (with `name`: that inbox; without: every inbox of it). BadInput
        or NotAnInbox when it is none of these. A database whose server does not answer yet
        is waited for (core/reachable.py); None if `stopped()` became true first."""
        if name is not None and not is_url(target):
            raise BadInput("--inbox names an inbox of a postgresql:// database, not of a file")
        if is_url(target):
            if name is not None:
                opened = await Inbox.open_when_reachable(
                    target, stopped=stopped, logger=log, name=name, create=False, clock=clock
                )
                if opened is None:
                    return None
                return cls(f"{redact(target)} inbox {name}", inbox=opened)
            fleet = DatabaseFleet(target)

            async def checked() -> DatabaseFleet:
                await asyncio.to_thread(fleet.check)
                return fleet

            if await until_reachable(checked, stopped=stopped, logger=log) is None:
                return None
            return cls(fleet.label, fleet=fleet)
        if os.path.isdir(target):
            return cls(target, fleet=FolderFleet(target))
        inbox = await Inbox.open(target, create=False, clock=clock)
        return cls(inbox.path, inbox=inbox)

    @property
    def wake(self) -> Any:
        return None if self.inbox is None else self.inbox.wake

    async def close(self) -> None:
        if self.inbox is not None:
            await self.inbox.close()
        closer = getattr(self.fleet, "close", None)
        if closer is not None:
            closer()

    async def looks(self, memory: Memory, now: int) -> list[Look]:
        if self.inbox is not None:
            return [await self._look(self.inbox, self._name(self.inbox), self.inbox.path, memory)]
        assert self.fleet is not None
        fleet = self.fleet
        scan = await asyncio.to_thread(fleet.scan, now, dict(self._known))
        self._known = scan.summaries
        # Every inbox's watermark from its first sight (one transaction for all the new
        # ones): what dies after the notifier first saw an inbox is news, whenever it looks.
        new = [s.target for s in scan.summaries.values() if s.target not in self._marks]
        if new:
            self._marks.update(await memory.watermarks(new, now))
        looks = []
        for key, summary in scan.summaries.items():
            if summary.problem:
                continue
            died: tuple[Event, ...] = ()
            if summary.dead and key in scan.read:
                watermark = await self._watermark(memory, summary.target, summary.read_at)
                try:
                    inbox = await fleet.open(key)
                except InboxError as exc:
                    log.warning("cannot open %s for its dead events: %s", printable(key), exc)
                else:
                    try:
                        died = tuple(await inbox.died_since(watermark, limit=DIED_PAGE))
                    finally:
                        await inbox.close()
            looks.append(self._summary_look(summary, died))
        return looks

    async def _watermark(self, memory: Memory, target: str, now: int) -> int:
        """The inbox's watermark: read (or set, the first time) once, then kept here."""
        mark = self._marks.get(target)
        if mark is None:
            mark = self._marks[target] = await memory.watermark(target, now)
        return mark

    def moved(self, target: str, since: int) -> None:
        self._marks[target] = max(self._marks.get(target, since), since)

    def _name(self, inbox: Inbox) -> str:
        if is_url(inbox.path) or inbox.name != "default":
            return inbox.name
        return os.path.splitext(os.path.basename(inbox.path))[0]

    def _summary_look(self, summary: InboxSummary, died: tuple[Event, ...]) -> Look:
        now = summary.read_at
        work_since: int | None = None
        if summary.pending:
            lease = summary.lease
            if lease is not None:
                work_since = lease.until + 1
            else:  # never taken: since this notifier first saw the work
                work_since = self._first_seen.setdefault(summary.key, now)
        else:
            self._first_seen.pop(summary.key, None)
        return Look(
            summary.name,
            summary.target,
            now,
            tuple(summary.approvals),
            summary.lease,
            summary.lease_released,
            work_since,
            summary.pending,
            died,
        )

    async def _look(self, inbox: Inbox, name: str, target: str, memory: Memory) -> Look:
        overview = await inbox.overview()
        now = overview.now
        watermark = await self._watermark(memory, target, now)
        waiting = tuple(a for a in await inbox.approvals(limit=1000) if a.answer is None)
        died: tuple[Event, ...] = ()
        if overview.counts.get("dead"):
            died = tuple(await inbox.died_since(watermark, limit=DIED_PAGE))
        pending = overview.counts.get("pending", 0)
        timer_due = overview.next_timer_due is not None and overview.next_timer_due <= now
        # Read apart from the overview: a claim in between empties it, and then it is none.
        work = await inbox.work_since(now=now) if pending or timer_due else None
        return Look(
            name,
            target,
            now,
            waiting,
            overview.lease,
            overview.lease_released,
            work,
            pending,
            died,
        )


def default_state(target: str, name: str | None, command: str) -> str:
    """Where a notifier keeps its memory when not told: one file per target and command,
    under $XDG_STATE_HOME (~/.local/state) / onwatch."""
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(
        os.path.expanduser("~"), ".local", "state"
    )
    where = target if is_url(target) else os.path.abspath(target)
    digest_ = hashlib.sha256("\x1f".join((where, name or "", command)).encode()).hexdigest()
    return os.path.join(base, "onwatch", f"notify-{digest_[:16]}.db")


@dataclass
class Outcome:
    """What one command run did (for the log and the tests)."""

    ok: bool
    error: str | None = None


class Notifier:
    """Looks, remembers, says: see the module docstring."""

    def __init__(
        self,
        watched: Watched,
        command: str,
        *,
        state: str,
        max_per_minute: int = 10,
        timeout: float = 30.0,
        unattended_after: int = 60,
        poll: float = 2.0,
        retry_base: float = 5.0,
        retry_cap: float = 900.0,
        max_attempts: int = 8,
        clock: Clock | None = None,
        shell: str = "/bin/sh",
    ) -> None:
        if not isinstance(command, str) or not command.strip() or "\x00" in command:
            raise BadInput("the notify command must be a non-empty shell command")
        self.watched = watched
        self.command = command
        self.memory = Memory(state)
        self.max_per_minute = max_per_minute
        self.timeout = timeout
        self.unattended_after = unattended_after
        self.poll = poll
        self.retry_base = retry_base
        self.retry_cap = retry_cap
        self.max_attempts = max_attempts
        self.clock = clock or SystemClock()
        self.shell = shell
        self.tokens = float(max_per_minute)  # the rate: a bucket refilled over a minute
        self._filled = time.monotonic()
        self.runs = 0  # commands run (tests and logs)
        self.failures = 0
        self._known: set[str] | None = None  # the keys the memory holds (read once)
        # Outcomes of commands run whose marks the memory could not take yet: written before
        # anything else is said (else what was said would be due, and said, again).
        self._unmarked: list[tuple[list[str], str, str | None, int]] = []
        self._failure_said: dict[str, tuple[str, float]] = {}  # what: (text, when said)

    # --- one pass -----------------------------------------------------------------------

    async def look(self) -> list[Notice]:
        """Look at every inbox; remember what is new (durably, before anything is said);
        return the new things."""
        now = self.clock.now()
        found: list[Notice] = []
        moved: list[tuple[str, int]] = []
        for look in await self.watched.looks(self.memory, now):
            found += notices_of(look, self.unattended_after)
            if look.died:
                moved.append((look.target, max(e.updated for e in look.died)))
        if self._known is None:
            self._known = await self.memory.keys()
        unknown = [n for n in found if n.key not in self._known]
        new = await self.memory.remember(unknown) if unknown else []
        self._known.update(n.key for n in unknown)
        # Only once the deaths are remembered does the watermark pass them: a memory that
        # failed in between finds them again at the next look, never loses them.
        for target, since in moved:
            await self.memory.move_watermark(target, since)
            self.watched.moved(target, since)
        # An approval first seen already near its deadline: its one notice says both.
        waiting = {(n.target, n.ids["request_id"]) for n in new if n.kind == "approval_waiting"}
        covered = [
            n.key
            for n in new
            if n.kind == "approval_deadline" and (n.target, n.ids["request_id"]) in waiting
        ]
        if covered:
            await self.memory.said_already(covered)
        return [n for n in new if n.key not in covered]

    def _refill(self) -> None:
        now = time.monotonic()
        self.tokens = min(
            float(self.max_per_minute),
            self.tokens + (now - self._filled) * self.max_per_minute / 60.0,
        )
        self._filled = now

    async def say(self) -> int:
        """Run the command for what is due, as the rate allows; return the runs made."""
        runs = 0
        while self._unmarked:
            await self.memory.mark(*self._unmarked[0])
            self._unmarked.pop(0)
        while True:
            now = self.clock.now()
            due = await self.memory.due(now)
            if not due:
                return runs
            self._refill()
            if self.tokens < 1:
                return runs
            if len(due) > 1 and self.tokens < 2:
                # The rate allows one more run now: it says everything that is due.
                notice = digest([n for n, _ in due], now)
                batch, attempts = [n.key for n, _ in due], max(a for _, a in due)
            else:
                (notice, attempts), batch = due[0], [due[0][0].key]
            self.tokens -= 1
            outcome = await self.run_command(notice)
            runs += 1
            if outcome.ok:
                await self._mark(batch, "said", None, now)
                continue
            self.failures += 1
            tries = attempts + 1
            if tries >= self.max_attempts:
                log.error(
                    "notify: gave up on %s after %s failed attempts: %s",
                    printable(notice.text[:200]),
                    tries,
                    printable(outcome.error or ""),
                )
                await self._mark(batch, "gave up", outcome.error, now)
                continue
            wait = math.ceil(min(self.retry_cap, self.retry_base * 2 ** (tries - 1)))
            log.warning(
                "notify: the command failed (%s) for %s; trying again in %s s (attempt %s of %s)",
                printable(outcome.error or ""),
                printable(notice.text[:200]),
                wait,
                tries + 1,
                self.max_attempts,
            )
            await self._mark(batch, "due", outcome.error, now + max(1, wait))
            return runs

    async def _mark(self, keys: list[str], state: str, error: str | None, at: int) -> None:
        """Remember a command's outcome; kept to be written first if the memory fails."""
        try:
            await self.memory.mark(keys, state, error, at)
        except MemoryFailed:
            self._unmarked.append((keys, state, error, at))
            raise

    async def run_command(self, notice: Notice) -> Outcome:
        """Run the command once for `notice`, its document on stdin; bounded by `timeout`
        (then its whole process group is killed)."""
        document = json.dumps(notice.document(), sort_keys=True, ensure_ascii=True) + "\n"
        env = dict(
            os.environ,
            ONWATCH_KIND=notice.kind,
            ONWATCH_INBOX=printable(notice.inbox),
            ONWATCH_TEXT=printable(notice.text),
            ONWATCH_KEY=printable(notice.key.replace("\x1f", " ")),
        )
        self.runs += 1
        try:
            finished = await run_shell(
                self.command, document, timeout=self.timeout, env=env, shell=self.shell
            )
        except OSError as exc:
            return Outcome(False, f"cannot start it: {exc.strerror or exc}")
        if finished.code is None:
            return Outcome(False, f"it ran past {self.timeout:g} s and was killed")
        if not finished.ok:
            line = finished.last_line[:300]
            return Outcome(False, f"exit {finished.code}" + (f": {line}" if line else ""))
        return Outcome(True)

    # --- the loop -----------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        """Look and say until `stop` is set; a failed look is logged and tried again."""
        log.info(
            "notify: watching %s; memory %s; at most %s command(s) a minute",
            printable(self.watched.label),
            self.memory.path,
            self.max_per_minute,
        )
        wake = self.watched.wake
        try:
            retried = False
            while not stop.is_set():
                seen = wake.seq if wake is not None else 0
                try:
                    if not retried:
                        await self.memory.retry_now(self.clock.now())
                        retried = True
                    try:
                        new = await self.look()
                        for notice in new:
                            log.info("notify: %s", printable(notice.text))
                    except MemoryFailed:
                        raise
                    except InboxError as exc:
                        if isinstance(exc, FileLost) and self.watched.inbox is not None:
                            # Its file was deleted or replaced: this process may never open
                            # the one now at the path (a fleet opens its inboxes at each look).
                            log.error("notify: stopping: %s (start it again to watch the file "
                                      "now at that path)", exc)  # fmt: skip
                            raise
                        self._failed("read", f"cannot read {printable(self.watched.label)}", exc)
                    else:
                        self._recovered("read", f"reads {printable(self.watched.label)} again")
                    await self.say()
                except MemoryFailed as exc:
                    self._failed("memory", "nothing more is said until it can be written", exc)
                else:
                    self._recovered("memory", f"its memory {self.memory.path} works again")
                await self._nap(stop, wake, seen)
        finally:
            self.memory.close()

    def _failed(self, what: str, saying: str, exc: InboxError) -> None:
        """Log a failure of `what` once, then again only if it changes or once per
        SAY_FAILURE_EVERY: a look every poll must not fill the log with one line."""
        text, now = f"notify: {saying}: {exc}", time.monotonic()
        last = self._failure_said.get(what)
        if last is None or last[0] != text or now - last[1] >= SAY_FAILURE_EVERY:
            log.log(logging.ERROR if what == "memory" else logging.WARNING, "%s", text)
            self._failure_said[what] = (text, now)
        else:
            log.debug("%s (again)", text)

    def _recovered(self, what: str, saying: str) -> None:
        if self._failure_said.pop(what, None) is not None:
            log.warning("notify: %s", saying)

    async def _nap(self, stop: asyncio.Event, wake: Any, seen: int) -> None:
        """Until the next poll, a retry that comes due, a commit to the inbox, or stop."""
        seconds = self.poll
        try:
            retry = await self.memory.next_try()
            if retry is not None:
                seconds = min(seconds, max(0.05, retry - self.clock.now()))
            if self.tokens < 1 and (await self.memory.due(self.clock.now())):
                seconds = max(seconds, (1 - self.tokens) * 60.0 / self.max_per_minute)
        except MemoryFailed:
            pass  # the next pass says so; until then, the poll
        waits: list[Awaitable[Any]] = [stop.wait()]
        if wake is not None:
            waits.append(wake.wait(seen, seconds))
        tasks = [asyncio.ensure_future(w) for w in waits]
        try:
            await asyncio.wait(tasks, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in tasks:
                task.cancel()
