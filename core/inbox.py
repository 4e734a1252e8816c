"""The Inbox: the async API an agent embeds. It checks every argument (core/checks.py), then
runs one transaction script of the engine (core/engine/) on the backend's connection."""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import inspect
import logging
import os
import sqlite3
from typing import TYPE_CHECKING, Any, Awaitable, Callable, Iterable, Sequence, TypeVar

from . import backends, checks
from .actions import ACTIONS, Outcome
from .checks import MAX_BATCH_IDS, MAX_TRACEBACK
from .clock import (
    BackendClock,
    MAX_COUNT,
    MAX_ID,
    Clock,
    check_duration,
    check_int,
    check_time,
    show,
)
from .connection import Connection, Waker
from .engine import (
    approvals,
    desk,
    effects,
    intake,
    journal,
    lease,
    operator,
    outbox,
    reads,
    runs,
    scheduler,
    spend,
    switches,
    timers,
    transcripts,
)
from .engine.spend import Spend, Spending
from .engine.transcripts import NewLine, NewSpend, Transcript
from .engine.plans import DELIVERY_STATES, SETTLE_OUTCOMES
from .engine.runs import Claimed
from .engine.tx import ClaimAhead, FinishAhead, FinishClaimAhead, Tx
from .errors import BadInput
from .group_commit import GroupCommit
from .records import (
    EVENT_STATES,
    Approval,
    ApprovalRequest,
    ApprovalTrail,
    AuditEntry,
    DeadGroup,
    Delivery,
    Effect,
    Event,
    FollowUp,
    Lease,
    LeaseChange,
    Message,
    Overview,
    Reply,
    Run,
    Timer,
    Worker,
)
from .reachable import until_reachable
from .settings import Settings

if TYPE_CHECKING:
    from .pg.shared import Connections  # psycopg only when asked for

TIMER_STATES = ("scheduled", "paused", "set aside")  # what a timer action is conditional on

CLOSE_WAIT = 5.0  # seconds close() waits for ingests in flight before closing anyway
SendFn = Callable[[str], Any] | Callable[[str], Awaitable[Any]]
T = TypeVar("T")

log = logging.getLogger(__name__)


class Outgoing(str):
    """The text of one send; `.key` is the delivery's stable idempotency key."""

    key: str
    count: int  # type: ignore[assignment]  # the number of messages joined; hides str.count

    def __new__(cls, text: str, key: str, count: int) -> "Outgoing":
        value = super().__new__(cls, text)
        value.key = key
        value.count = count
        return value


class Inbox:
    """One durable inbox (a SQLite file, or one inbox of a PostgreSQL database). Open with
    `await Inbox.open(path)`."""

    def __init__(self, db: Connection, clock: Clock | None, settings: Settings) -> None:
        self._db = db
        # Without a clock of its own, "now" is the backend's, read in each deciding
        # transaction (this machine's wall clock for a file, the server's for PostgreSQL);
        # `clock` then follows it, so that countdowns and sleeps agree with the decisions.
        self._backend_time = clock is None
        self.clock: Clock = BackendClock(lambda: db.clock_offset) if clock is None else clock
        self._settings = settings
        self._intake = GroupCommit(db)
        # A batch may be one autocommit statement (intake.ingest_batch_alone), which
        # remembers here the settings it checks against.
        self._batch_alone = functools.partial(intake.ingest_batch_alone, seen={})

    # --- lifecycle ------------------------------------------------------------------------

    @classmethod
    async def open(
        cls,
        path: str | os.PathLike[str],
        *,
        name: str = "default",
        clock: Clock | None = None,
        create: bool = True,
        busy_timeout: float = 5.0,
        connection_factory: type[sqlite3.Connection] | None = None,
        migrate: bool = False,
        read_only: bool = False,
        connections: Connections | None = None,
    ) -> "Inbox":
        """Open the inbox at `path`, creating its schema if it is new.

        `path` is a file (SQLite: the file is the inbox, `name` stays "default") or a
        `postgresql://` URL (one database holds many inboxes; `name` picks one, created on
        first open unless create=False). Raises NotAnInbox (leaving the file or database
        untouched) for a missing inbox when `create=False`, a foreign or corrupt file or
        database, or one from a newer schema.

        Opening never migrates an existing inbox of an older schema unless `migrate=True`
        (what a worker and `onwatch init`/`onwatch migrate` pass): it is read as it is, and
        written to where its schema allows (docs/rules.md#upgrading-a-running-deployment).
        A migration is refused (UpgradeRefused, nothing changed) while a worker holds the
        inbox's lease. `read_only=True` never writes (every write raises ReadOnlyInbox); a
        file this process cannot write is opened so by itself, saying why (`read_only`).
        `connections` (PostgreSQL): connections shared by the inboxes this process serves at
        once (core/pg/shared.py); the inbox then holds none of its own between its jobs.
        """
        db = await backends.connect(
            path,
            name=name,
            create=create,
            busy_timeout=busy_timeout,
            connection_factory=connection_factory,
            migrate=migrate,
            read_only=read_only,
            connections=connections,
        )
        try:
            settings = await db.call(switches.load_settings)  # one statement: its own snapshot
        except BaseException:
            await db.close()
            raise
        return cls(db, clock, settings)

    @classmethod
    async def open_when_reachable(
        cls,
        path: str | os.PathLike[str],
        *,
        stopped: Callable[[], bool],
        logger: logging.Logger | None = None,
        **options: Any,
    ) -> "Inbox | None":
        """`open`, for a process that serves the inbox (a worker, a receiver, a notifier),
        tried again while the database server does not answer yet (ConnectionLost), with
        backoff, saying so to `logger` (core/reachable.py). None if `stopped()` became true
        first; every other refusal raises as `open`'s does."""
        return await until_reachable(
            lambda: cls.open(path, **options), stopped=stopped, logger=logger or log
        )

    async def close(self) -> None:
        """Close, after the ingests in flight are committed (or have failed). Bounded: a
        connection whose server stopped answering is closed anyway, failing what waits on
        it, rather than waiting with it for ever."""
        try:
            await asyncio.wait_for(self._intake.wait_idle(), CLOSE_WAIT)
        except TimeoutError:
            pass  # still in flight: the connection's close decides (see its close())
        await self._db.close()

    async def __aenter__(self) -> "Inbox":
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    @property
    def path(self) -> str:
        return self._db.path

    @property
    def read_only(self) -> str | None:
        """Why every write is refused (ReadOnlyInbox): opened read-only, or the file (or the
        database role) cannot be written; None when it can be."""
        return self._db.read_only

    @property
    def schema(self) -> tuple[int, int | None]:
        """(the schema version the inbox has, the one it had before this open migrated it,
        or None when this open did not)."""
        return self._db.version, self._db.migrated_from

    @property
    def created(self) -> bool:
        """Whether this open made the inbox: a new (or empty) file, or a new inbox in a
        PostgreSQL database. False for one that was there, and for one another process made
        at the same moment (exactly one of the two opens says True)."""
        return self._db.created

    @property
    def name(self) -> str:
        """Which inbox of its database this is ("default" for a file, which is one inbox)."""
        return getattr(self._db, "name", "default")

    def file_replaced(self) -> str | None:
        """Why the path no longer names the file this inbox opened, or None if it still does.

        Compares the path's device and inode now with those of the file opened (two stat
        calls, cheap enough for every poll; the opened file is held open, so its inode
        number cannot be reused by a new file). A deleted file, or a new file put in its place,
        keeps
        answering through the open connection: whoever acts on it would act on a file nobody
        else sees, so callers stop and say so.
        """
        return self._db.file_replaced()

    def now(self) -> int:
        """The inbox's clock: the backend's (the wall clock for a file, the server's for
        PostgreSQL) unless one was injected at open."""
        return self.clock.now()

    @property
    def clock_offset(self) -> float:
        """The backend's clock minus this process's, in seconds, as last read (0 for a
        file; on PostgreSQL, how far this machine's clock is from the server's)."""
        return self._db.clock_offset

    def _now(self, now: object) -> int | None:
        """An explicit `now` (checked), the injected clock's, or None: the backend's own."""
        if now is not None:
            return check_time(now)
        return None if self._backend_time else self.clock.now()

    async def _write(self, fn: Callable[..., T], *args: Any) -> T:
        return await self._db.write(fn, *args)

    async def change_token(self) -> tuple[int, int]:
        """A value that differs whenever anything committed since it was last read: another
        connection (PRAGMA data_version) or this Inbox itself (the connection's change
        count). One cheap call, no table read: what an idle poller compares."""
        return await self._db.call(reads.change_token)

    async def settled_change_token(self) -> tuple[int, int] | None:
        """change_token, read while no other connection is half-way through a commit (so
        every commit it was told of is visible to it), or None if one is: what a waiter
        woken by the file's notification reads to tell a spurious wake-up for certain."""
        return await self._db.call(reads.settled_change_token)

    @property
    def wake(self) -> Waker:
        """Wakes this process's waiters when the inbox may have changed (core/sqlite/wake.py):
        another process's commit through the OS's file notification, ours directly."""
        return self._db.wake

    @property
    def loop_writes(self) -> bool:
        """True: claims and finishes (the transactions between two runs) and an ingest that
        comes alone in its turn of the loop may commit on the event loop's own thread where
        that is safe and quick, sparing the hand-off to the connection's thread
        (Connection.loop_writes; ingests that come together still share one transaction on
        that thread; on PostgreSQL never for an inbox on a fleet's shared connections). A
        Worker sets it while it runs; a producer whose loop does nothing else may set it;
        never set it on a loop that must not wait for a disk or a server (a desk's)."""
        return self._db.loop_writes

    @loop_writes.setter
    def loop_writes(self, on: bool) -> None:
        self._db.loop_writes = checks.flag("loop_writes", on)

    # --- settings -------------------------------------------------------------------------

    @property
    def settings(self) -> Settings:
        """The settings as of the last open, configure or reload_settings."""
        return self._settings

    async def reload_settings(self) -> Settings:
        self._settings = await self._db.read(switches.load_settings)
        return self._settings

    async def configure(self, **changes: Any) -> Settings:
        """Validate and store setting changes; raise BadInput (writing nothing) on a bad one."""

        def apply(tx: Tx) -> Settings:
            updated = switches.load_settings(tx).replace(changes)
            switches.store_settings(tx, updated)
            return updated

        Settings().replace(changes)  # fail fast, before taking the write lock
        self._settings = await self._write(apply)
        return self._settings

    # --- intake ---------------------------------------------------------------------------

    async def ingest(
        self, source: str, source_id: str, payload: Any = None, *, now: int | None = None
    ) -> bool:
        """Store an event: True if new, False for a duplicate (source, source_id).

        Returns only after the event is durably committed. Raises BadInput for an empty
        source/source_id or a payload that is not JSON or too large, BudgetExceeded when
        max_pending is reached.
        """
        source, source_id = checks.source("source", source), checks.text("source_id", source_id)
        limit = self._settings.max_payload_bytes
        if self._intake.known_duplicate(source, source_id):
            # Answered here: no task, no hop to the connection's thread, and the payload,
            # which is not stored, checked without encoding it where that is certain.
            if not checks.surely_encodable(payload, limit):
                checks.encode(payload, limit)
            self._now(now)
            return False
        return await self._intake.submit(
            (source, source_id, checks.encode(payload, limit), self._now(now))
        )

    async def ingest_batch(
        self, items: Iterable[tuple[str, str, Any]], *, now: int | None = None
    ) -> list[bool]:
        """Store several events in one transaction: all or none. Returns, per item, True if
        new and False for a duplicate (of a stored event or of an earlier item).

        A worker sees them together (three quick messages become one run). Raises BadInput
        for any bad item and BudgetExceeded if any would go over max_pending, writing nothing.
        """
        when = self._now(now)
        if isinstance(items, (str, bytes)) or not isinstance(items, Iterable):
            raise BadInput("items must be a list of (source, source_id, payload) tuples")
        batch = []
        for item in items:
            if not (isinstance(item, tuple) and len(item) == 3):
                raise BadInput("each item must be a (source, source_id, payload) tuple")
            source, source_id, payload = item
            batch.append(
                (
                    checks.source("source", source),
                    checks.text("source_id", source_id),
                    checks.encode(payload, self._settings.max_payload_bytes),
                    when,
                )
            )
        if not batch:
            return []
        return await self._db.write_unless(self._batch_alone, intake.ingest_all_or_none, batch)

    async def prune_payloads(self, older_than: int, *, now: int | None = None) -> int:
        """Drop payloads of done/cancelled events last changed before `older_than`; the
        dedupe keys stay. Returns how many were pruned."""
        return await self._write(
            intake.prune_payloads, check_time(older_than, "older_than"), self._now(now)
        )

    # --- lease ----------------------------------------------------------------------------

    async def acquire(
        self, holder: str, *, now: int | None = None, fresh: bool = False
    ) -> int | None:
        """Take or renew the lease; return its generation, or None if another holds it.

        `fresh=True` is a worker starting: it never continues a live lease, not even one
        under its own holder name (another process started under that name may hold it);
        it takes only a free or expired lease, as a new generation."""
        checks.flag("fresh", fresh)
        holder, when = checks.text("holder", holder), self._now(now)
        # The holder renewing to the expiry it already has changes nothing: one read of
        # committed state answers it on this thread, without a write transaction.
        if when is not None and not fresh:
            gen = self._db.peek(lease.renewed_without_write, holder, when)
            if gen is not None:
                return gen
        return await self._db.write_unless(
            lease.renewed_without_write, lease.acquire, holder, when, fresh
        )

    async def renew(
        self,
        holder: str,
        gen: int,
        *,
        now: int | None = None,
        host: str | None = None,
        pid: int | None = None,
    ) -> bool:
        """Extend the lease for exactly this unexpired generation (fenced). With `host` and
        `pid`, the worker's heartbeat (worker_seen) goes in the same transaction, recorded
        whatever the renewal answers."""
        holder, gen = checks.text("holder", holder), checks.positive("gen", gen)
        if host is None and pid is None:
            return await self._write(lease.renew, holder, gen, self._now(now))
        if host is None or pid is None:
            raise BadInput("host and pid go together: a worker's heartbeat names both")
        return await self._write(
            lease.renew_seen,
            holder,
            gen,
            self._now(now),
            checks.text("host", host, limit=255),
            check_int(pid, "pid", 0, 1 << 31),
        )

    async def release(self, holder: str, gen: int, *, now: int | None = None) -> bool:
        """Hand the lease back; a successor may take over at once (next generation)."""
        return await self._db.write_unless(
            lease.release_alone,
            lease.release,
            checks.text("holder", holder),
            checks.positive("gen", gen),
            self._now(now),
        )

    # --- runs -----------------------------------------------------------------------------

    async def claim_batch(self, holder: str, gen: int, *, now: int | None = None) -> list[Event]:
        """Claim the next run's events (docs/rules.md#claiming-a-run); [] unless this
        generation holds."""
        return await self._write(
            runs.claim_batch,
            checks.text("holder", holder),
            checks.positive("gen", gen),
            self._now(now),
        )

    async def claim_next(
        self,
        holder: str,
        gen: int,
        *,
        fire_timers: bool = True,
        mark: bool = True,
        now: int | None = None,
    ) -> Claimed:
        """A worker's step before each run, in one transaction (engine/runs.py
        `claim_next`): the change token as it begins (`mark`), due timers fired (`fire_timers`;
        one bounded slice of a storm, `more_timers` says more are due), the settings read
        again (this Inbox's `settings` follow them), and the run's events claimed as
        claim_batch claims them."""
        checks.flag("fire_timers", fire_timers)
        checks.flag("mark", mark)
        holder, gen, now = (
            checks.text("holder", holder),
            checks.positive("gen", gen),
            self._now(now),
        )
        # What the transaction is, said before it begins: the backend may read the claim's
        # look with the lock, or make the claim itself where it is plain (ClaimAhead), as
        # these settings ask; settings changed meanwhile are read again.
        settings = self._settings
        ahead = ClaimAhead(holder, gen, settings.max_attempts, settings.max_batch, fire_timers, now)
        claimed = await self._db.write_ahead(
            ahead, runs.claim_next, holder, gen, now, fire_timers, mark
        )
        self._settings = claimed.settings
        return claimed

    async def finish(
        self,
        holder: str,
        gen: int,
        ids: Sequence[int],
        messages: Iterable[str | Reply] = (),
        error: str | None = None,
        *,
        now: int | None = None,
        result: Any = None,
        approvals: Iterable[ApprovalRequest] = (),
        timers: Iterable[FollowUp] = (),
        run: int | None = None,
        traceback: str | None = None,
    ) -> bool:
        """Record a run's outcome with its messages, approval requests and follow-up timers in
        one fenced transaction. False (nothing written, the refusal audited) if this
        generation no longer holds the lease or none of `ids` is still claimed by it.

        `run` is the claim's run id (`Event.run_id` of the claimed events; the Worker passes
        it). With it, the finish is fenced by generation *and* run: a run recovered for
        max_run_seconds and re-claimed in the same generation can no longer be finished by
        its old caller. Without it, only the generation fences (the events' current run is
        finished), which is safe only for callers that never run past max_run_seconds.
        A failed run may carry the agent's `traceback` (kept with the run, cut to its last
        MAX_TRACEBACK characters)."""
        outcome = self._outcome(
            holder, gen, ids, messages, error, now, result, approvals, timers, run, traceback
        )
        return await self._db.write_ahead(self._finish_ahead(outcome), runs.finish, *outcome)

    async def finish_and_claim(
        self,
        holder: str,
        gen: int,
        ids: Sequence[int],
        messages: Iterable[str | Reply] = (),
        error: str | None = None,
        *,
        now: int | None = None,
        result: Any = None,
        approvals: Iterable[ApprovalRequest] = (),
        timers: Iterable[FollowUp] = (),
        run: int | None = None,
        traceback: str | None = None,
        fire_timers: bool = True,
        mark: bool = True,
    ) -> tuple[bool, Claimed | None]:
        """finish, then, if it was accepted, claim_next, in the same one transaction: a
        worker going from one run to the next commits once (half the commits, half the
        fsyncs of a file). (False, None) when the finish was refused: nothing was written,
        nothing claimed."""
        checks.flag("fire_timers", fire_timers)
        checks.flag("mark", mark)
        outcome = self._outcome(
            holder, gen, ids, messages, error, now, result, approvals, timers, run, traceback
        )
        finish = self._finish_ahead(outcome)
        ahead: FinishAhead | FinishClaimAhead | None = finish
        replies, approvals = outcome[3], outcome[6]
        if finish is not None and not replies and not approvals:
            # The finish writes only its own rows: the backend may make it and the claim
            # after it in one statement where both are plain.
            ahead = FinishClaimAhead(finish, fire_timers)
        accepted, claimed = await self._db.write_ahead(
            ahead, runs.finish_and_claim, outcome, fire_timers, mark
        )
        if claimed is not None:
            self._settings = claimed.settings
        return accepted, claimed

    def _finish_ahead(self, outcome: runs.Outcome) -> FinishAhead | None:
        """What runs.finish does first for `outcome` where it is the common finish (a run's
        success, no follow-up timers: Tx.finish_done), said before its transaction begins,
        with the look a claim after it would read by this Inbox's settings; None otherwise."""
        holder, gen, ids, _, error, result, _, followups, now, run, _ = outcome
        if run is None or error is not None or followups:
            return None
        settings = self._settings
        return FinishAhead(
            holder, gen, run, tuple(ids), result, settings.max_attempts, settings.max_batch, now
        )

    def _outcome(
        self,
        holder: str,
        gen: int,
        ids: Sequence[int],
        messages: Iterable[str | Reply],
        error: str | None,
        now: int | None,
        result: Any,
        approvals: Iterable[ApprovalRequest],
        timers: Iterable[FollowUp],
        run: int | None,
        traceback: str | None,
    ) -> runs.Outcome:
        """finish's arguments checked (BadInput for any bad one), as runs.finish takes them."""
        holder, gen = checks.text("holder", holder), checks.positive("gen", gen)
        ids = [
            checks.event_id(i)
            for i in checks.listed("ids (a list of event ids)", ids, MAX_BATCH_IDS)
        ]
        if not ids:
            raise BadInput("ids must name at least one claimed event")
        if run is not None:
            run = checks.positive("run", run)
        replies = [self._reply(m) for m in checks.listed("messages", messages, MAX_COUNT)]
        approvals = [
            self._approval_request(a) for a in checks.listed("approvals", approvals, MAX_COUNT)
        ]
        timers = [self._followup(t) for t in checks.listed("timers", timers, MAX_COUNT)]
        if error is not None:
            error = checks.text("error", error, limit=10_000)
            if replies or approvals or timers:
                raise BadInput(
                    "a failed run (error=) cannot also queue messages, approvals or timers"
                )
        if traceback is not None:
            if error is None:
                raise BadInput("a traceback belongs to a failed run (error=)")
            if not isinstance(traceback, str):
                raise BadInput("traceback must be text")
            # The end of a traceback names the line that raised: keep that end.
            # A lone surrogate (an exception's text may carry one) is kept as an escape.
            traceback = (
                traceback[-MAX_TRACEBACK:].encode("utf-8", "backslashreplace").decode("utf-8")
            )
        encoded = (
            None
            if result is None
            else checks.encode(result, self._settings.max_payload_bytes, "result")
        )
        return (
            holder,
            gen,
            ids,
            replies,
            error,
            encoded,
            approvals,
            timers,
            self._now(now),
            run,
            traceback,
        )

    def _reply(self, message: object) -> Reply:
        if isinstance(message, str):
            message = Reply(message)
        if not isinstance(message, Reply):
            raise BadInput(f"a message must be a str or core.Reply, got {type(message).__name__}")
        checks.text("message body", message.body, limit=self._settings.max_payload_bytes)
        if not isinstance(message.urgent, bool):
            raise BadInput("Reply.urgent must be True or False")
        return message

    def _approval_request(self, request: object) -> ApprovalRequest:
        if not isinstance(request, ApprovalRequest):
            raise BadInput("approvals must be core.ApprovalRequest records")
        checks.text("request_id", request.request_id)
        check_duration(request.expires_in, "expires_in")
        checks.text("action", request.action, limit=10_000)
        return request

    def _followup(self, timer: object) -> FollowUp:
        if not isinstance(timer, FollowUp):
            raise BadInput("timers must be core.FollowUp records")
        encoded = checks.timer(
            timer.timer_id,
            timer.due,
            timer.payload,
            timer.every,
            timer.key,
            timer.catch_up,
            self._settings.max_payload_bytes,
        )
        return dataclasses.replace(timer, payload=encoded)  # stored as checked JSON text

    # --- effect journal -------------------------------------------------------------------

    async def intend_effect(
        self,
        holder: str,
        gen: int,
        run_id: int,
        name: str,
        detail: Any = None,
        *,
        key: str | None = None,
        event: int | Event | None = None,
        now: int | None = None,
    ) -> str | None:
        """Record, before doing it, that this run is about to cause an external effect.

        Returns the effect's idempotency key, or None (nothing written, the refusal audited)
        if this generation no longer holds the lease or the run is no longer open — the
        effect must then not be performed. The default key is derived from the inbox, the
        event the effect is for and the effect's name (and how many times this run intended
        that effect for that event), never from which events the run batched together. A
        run of several events must say which one the effect is for (`event=`, an id or the
        Event); BadInput otherwise."""
        if isinstance(event, Event):
            event = event.id
        return await self._write(
            effects.intend_effect,
            checks.text("holder", holder),
            checks.positive("gen", gen),
            checks.positive("run_id", run_id),
            checks.text("effect name", name, limit=200),
            checks.encode(detail, self._settings.max_payload_bytes, "detail"),
            None if key is None else checks.text("key", key),
            self._now(now),
            None if event is None else checks.event_id(event),
        )

    async def settle_effect(
        self, key: str, state: str = "confirmed", *, now: int | None = None
    ) -> bool:
        """Record that an intended effect happened ('confirmed') or did not ('failed')."""
        if state not in ("confirmed", "failed"):
            raise BadInput(f"state must be 'confirmed' or 'failed', got {show(state)}")
        return await self._write(
            effects.settle_effect, checks.text("key", key), state, self._now(now)
        )

    async def effects(self, event_id: int) -> list[Effect]:
        """The effect journal of every run that claimed this event."""

        def read(tx: Tx) -> list[Effect]:
            found = reads.runs_for_event(tx, checks.event_id(event_id))
            return effects.effects_for_runs(tx, [r.id for r in found]) if found else []

        return await self._db.read(read)

    # --- timers ---------------------------------------------------------------------------

    async def add_timer(
        self,
        timer_id: str,
        due: int,
        payload: Any = None,
        *,
        every: int | None = None,
        key: tuple[str, str] | None = None,
        catch_up: str = "coalesce",
    ) -> None:
        """Register (or replace the definition of) a timer. Each occurrence becomes an event
        keyed `timer_id@scheduled_time`, or `key` for a one-off."""
        encoded = checks.timer(
            timer_id, due, payload, every, key, catch_up, self._settings.max_payload_bytes
        )
        await self._write(timers.add_timer, timer_id, due, encoded, every, key, catch_up, "timer")

    async def cancel_timer(self, timer_id: str) -> bool:
        """Remove a timer; False if there was none. An approval's expiry cannot be cancelled
        here (BadInput): answer or expire the approval instead."""
        return await self._write(timers.cancel_timer, checks.timer_id(timer_id))

    async def run_scheduler(self, *, now: int | None = None) -> int:
        """Turn due timers into inbox events; return how many were due. A storm of due
        timers is fired in transactions of about scheduler.TX_SECONDS each (all or nothing
        each), with a pause of scheduler.PAUSE_SECONDS after each one, in which another
        process waiting to write gets the lock: its ingest waits a few tens of milliseconds
        at most, however big the storm (docs/rules.md#timers-and-catch-up)."""
        when, fired = self._now(now), 0
        while True:
            count, more = await self._db.write_unless(
                scheduler.nothing_due, scheduler.run_scheduler, when, bounded=True
            )
            fired += count
            if not more:
                return fired
            await asyncio.sleep(scheduler.PAUSE_SECONDS)

    async def next_timer_due(self) -> int | None:
        return await self._db.call(timers.next_timer_due)

    async def next_wake(self, *, now: int | None = None, sends: bool = True) -> int | None:
        """The earliest instant something becomes due: a timer, a backed-off event, or a
        held outbox send. A worker may sleep until then (or until a new event arrives).

        Only what can actually happen counts: nothing the held outbox would send, no pending
        event while paused, and while the runs-per-day budget is used up, the instant its
        window frees a slot; sends=False leaves the outbox out (a worker with no channel to
        send through). So the answer is never a past instant that nothing will act on.
        """
        checks.flag("sends", sends)
        return await self._db.read(reads.next_wake, self._now(now), sends)

    # --- approvals ------------------------------------------------------------------------

    async def request_approval(
        self, request_id: str, expires_in: int, action: str, *, now: int | None = None
    ) -> Approval:
        """Ask a human; the answer or the expiry comes back as event ('approval', request_id).
        Asking again for the same id keeps the first deadline."""
        return await self._write(
            approvals.request_approval,
            checks.text("request_id", request_id),
            check_duration(expires_in, "expires_in"),
            checks.text("action", action, limit=10_000),
            self._now(now),
        )

    async def answer_approval(
        self,
        request_id: str,
        answer: str,
        *,
        now: int | None = None,
        actor: str = "operator",
        reason: str | None = None,
    ) -> str:
        """Store `answer` ('yes'|'no') unless the deadline passed or one is stored; return the
        answer that stands: 'yes', 'no', 'expired', or 'unknown'."""
        if answer not in ("yes", "no"):
            raise BadInput(f"answer must be 'yes' or 'no', got {show(answer)}")
        return await self._write(
            approvals.answer_approval,
            checks.text("request_id", request_id),
            answer,
            self._now(now),
            checks.actor(actor),
            checks.reason(reason),
        )

    async def expire_approval(
        self,
        request_id: str,
        *,
        now: int | None = None,
        actor: str = "operator",
        reason: str | None = None,
    ) -> str:
        """Expire a waiting request now; return the answer that stands."""
        return await self._write(
            approvals.expire_approval,
            checks.text("request_id", request_id),
            self._now(now),
            checks.actor(actor),
            checks.reason(reason),
        )

    # --- outbox ---------------------------------------------------------------------------

    async def dispatch(self, send: SendFn, *, now: int | None = None) -> int:
        """Send what the outbox allows now, at most one send; return how many messages went.

        `send` (plain or async) receives the joined text, an `Outgoing` str carrying the
        delivery's idempotency key. It runs outside any transaction. If it raises, the
        messages stay held (or die after max_delivery_attempts) and 0 is returned.
        """
        return await self._dispatch(send, self._now(now), flush=False)

    async def _dispatch(self, send: SendFn, now: int | None, flush: bool) -> int:
        if not callable(send):
            raise BadInput("send must be callable")
        picked = await self._write(outbox.begin_delivery, now, flush)
        if picked is None:
            return 0
        delivery_id, key, text, count, attempt = picked
        error = None
        try:
            outcome = send(Outgoing(text, key, count))
            if inspect.isawaitable(outcome):
                await outcome
        except Exception as exc:  # the channel failed; the delivery stays for a retry
            error = f"{type(exc).__name__}: {exc}"
        # The outcome is recorded only if this attempt still owns the delivery: a send that
        # hung past send_timeout while another dispatcher re-sent must not overwrite it.
        sent = await self._write(
            outbox.end_delivery,
            delivery_id,
            attempt,
            error,
            now,
        )
        return count if sent else 0

    async def flush_outbox(
        self,
        send: SendFn,
        *,
        now: int | None = None,
        actor: str = "operator",
        reason: str | None = None,
    ) -> int:
        """Send held messages now, ignoring the gap and any hold; return how many went."""
        now = self._now(now)
        actor, reason = checks.actor(actor), checks.reason(reason)
        sent = await self._dispatch(send, now, flush=True)
        await self._write(
            journal.record,
            now,
            actor,
            "send now",
            "outbox",
            None,
            f"{sent} sent",
            sent > 0,
            reason,
        )
        return sent

    async def hold_outbox(
        self, *, now: int | None = None, actor: str = "operator", reason: str | None = None
    ) -> bool:
        """Stop paced sends until release_outbox; True if this changed anything."""
        return await self._write(
            switches.set_flag,
            "outbox_held",
            True,
            "hold",
            self._now(now),
            checks.actor(actor),
            checks.reason(reason),
        )

    async def release_outbox(
        self, *, now: int | None = None, actor: str = "operator", reason: str | None = None
    ) -> bool:
        return await self._write(
            switches.set_flag,
            "outbox_held",
            False,
            "release",
            self._now(now),
            checks.actor(actor),
            checks.reason(reason),
        )

    async def settle_delivery(
        self,
        delivery_id: int,
        outcome: str,
        *,
        expect: str = "uncertain",
        now: int | None = None,
        actor: str = "operator",
        reason: str | None = None,
    ) -> bool:
        """Settle an uncertain delivery (at-most-once, cut off mid-send): outcome 'sent'
        marks it delivered; 'send again' puts its messages back in the outbox for a new
        delivery (under a new key). Conditional like every operator action: False, audited
        with why, unless the delivery is in the `expect`ed state (only 'uncertain' can be
        settled)."""
        if outcome not in SETTLE_OUTCOMES:
            raise BadInput(f"outcome must be one of {SETTLE_OUTCOMES}, got {show(outcome)}")
        if expect not in DELIVERY_STATES:
            raise BadInput(f"expect must be a delivery state {DELIVERY_STATES}, got {show(expect)}")
        return await self._write(
            outbox.settle_delivery,
            checks.positive("delivery id", delivery_id),
            outcome,
            expect,
            self._now(now),
            checks.actor(actor),
            checks.reason(reason),
        )

    async def uncertain_deliveries(
        self, *, now: int | None = None, limit: int = 100
    ) -> list[Delivery]:
        """At-most-once deliveries cut off mid-send, oldest first: neither re-sent nor
        settled until an operator says what happened (settle_delivery)."""
        return await self._db.read(
            outbox.uncertain_deliveries, self._now(now), checks.positive("limit", limit)
        )

    # --- operator actions -----------------------------------------------------------------

    async def requeue(
        self,
        event_id: int,
        *,
        expect: str | None = None,
        now: int | None = None,
        actor: str = "operator",
        reason: str | None = None,
    ) -> bool:
        """dead/interrupted/cancelled → pending with a fresh attempt budget.

        `expect` is the state the operator saw; if the row is in another state now, nothing
        changes and False is returned (the audit log says why)."""
        return await self._change(event_id, "requeue", expect, now, actor, reason)

    async def cancel(
        self,
        event_id: int,
        *,
        expect: str | None = None,
        now: int | None = None,
        actor: str = "operator",
        reason: str | None = None,
    ) -> bool:
        """pending → cancelled; a running event cannot be cancelled (returns False)."""
        return await self._change(event_id, "cancel", expect, now, actor, reason)

    async def resolve(
        self,
        event_id: int,
        *,
        expect: str | None = None,
        now: int | None = None,
        actor: str = "operator",
        reason: str | None = None,
    ) -> bool:
        """interrupted → done: the operator confirms the uncertain effect happened."""
        return await self._change(event_id, "resolve", expect, now, actor, reason)

    async def bury(
        self,
        event_id: int,
        *,
        expect: str | None = None,
        now: int | None = None,
        actor: str = "operator",
        reason: str | None = None,
    ) -> bool:
        """interrupted or pending → dead, by hand."""
        return await self._change(event_id, "bury", expect, now, actor, reason)

    async def _change(
        self,
        event_id: int,
        action: str,
        expect: str | None,
        now: int | None,
        actor: str,
        reason: str | None,
    ) -> bool:
        """An event action of the one table (core/actions.py): its states and its result."""
        allowed, after = ACTIONS[action].allowed, ACTIONS[action].after
        assert after is not None  # an event action leaves a state (only switches have none)
        if expect is not None and expect not in EVENT_STATES:
            raise BadInput(f"expect must be an event state, got {show(expect)}")
        if not isinstance(expect, (str, type(None))):
            raise BadInput("expect must be an event state")
        return await self._write(
            operator.change_event,
            checks.event_id(event_id),
            action,
            allowed,
            expect,
            after,
            self._now(now),
            checks.actor(actor),
            checks.reason(reason),
        )

    async def act(
        self,
        name: str,
        target: int | str | None = None,
        *,
        expect: str | None = None,
        now: int | None = None,
        actor: str = "operator",
        reason: str | None = None,
        value: Any = None,
    ) -> Outcome:
        """Run the operator action `name` (a row of core.actions.ACTIONS) on `target` (an
        event id, an approval request id, a delivery id, a timer id, a budget
        ("max_spend_per_day usd", "max_runs_per_day") or None for an inbox switch) and return
        what happened: applied or not, before → after, and why when refused. Read in the
        action's own transaction, so a second operator acting meanwhile cannot blur it.
        `expect` (events, deliveries, timers: a state; a budget: its limit) is what the
        operator saw; `value` is a
        budget's new limit. BadInput for an unknown action or a target of the wrong kind;
        nothing changes then."""
        action = ACTIONS.get(name) if isinstance(name, str) else None
        if action is None:
            raise BadInput(f"action must be one of {tuple(ACTIONS)}, got {show(name)}")
        when, who, why = self._now(now), checks.actor(actor), checks.reason(reason)
        if value is not None and action.target != "budget":
            raise BadInput(f"{name} takes no value= (only raise_budget does)")
        if action.target == "budget":
            budget, unit, expected, new = checks.budget_change(target, expect, value)
            call: tuple[Any, ...] = (
                spend.raise_budget,
                budget,
                unit,
                expected,
                new,
                when,
                who,
                why,
            )
            audited = budget if unit is None else f"{budget} {unit}"
            result, entry = await self._write(_acted, audited, *call)
            self._settings = await self._db.read(switches.load_settings)
            if entry is None:
                raise AssertionError(f"{name} on {audited} left no audit entry")
            return Outcome(
                name, audited, bool(result), entry.before, entry.after, entry.reason, result
            )
        if action.target == "event":
            if expect is not None and (not isinstance(expect, str) or expect not in EVENT_STATES):
                raise BadInput(f"expect must be an event state, got {show(expect)}")
            event_id = checks.event_id(target)
            # (the engine's function, then its arguments)
            call = (
                operator.change_event,
                event_id,
                name,
                action.allowed,
                expect,
                action.after,
                when,
                who,
                why,
            )
            if name == "run_now":  # the same state before and after: only its backoff ends
                call = (desk.run_now, event_id, expect, when, who, why)
            audited = f"event {event_id}"
        elif action.target == "timer":
            if expect is not None and expect not in TIMER_STATES:
                raise BadInput(f"expect must be a timer state {TIMER_STATES}, got {show(expect)}")
            timer_id = checks.text("timer_id", target)
            call = (desk.timer_action, name, action.allowed, timer_id, expect, when, who, why)
            audited = f"timer {timer_id}"
        elif action.target == "delivery":
            expect = "uncertain" if expect is None else expect
            if expect not in DELIVERY_STATES:
                raise BadInput(
                    f"expect must be a delivery state {DELIVERY_STATES}, got {show(expect)}"
                )
            delivery_id = checks.positive("delivery id", target)
            call = (outbox.settle_delivery, delivery_id, action.after, expect, when, who, why)
            audited = f"delivery {delivery_id}"
        elif expect is not None:
            raise BadInput(f"{name} takes no expect= (it acts on {action.target} state as it is)")
        elif action.target == "approval":
            request_id = checks.text("request_id", target)
            call = (
                (approvals.expire_approval, request_id, when, who, why)
                if action.after == "expired"
                else (approvals.answer_approval, request_id, action.after, when, who, why)
            )
            audited = f"approval {request_id}"
        else:
            if target is not None:
                raise BadInput(f"{name} acts on the whole inbox: no target, got {show(target)}")
            flag = action.switch
            assert flag is not None  # an inbox action is a switch (core/actions.py)
            call = (switches.set_flag, flag, action.after == "true", name, when, who, why)
            audited = flag
        result, entry = await self._write(_acted, audited, *call)
        if entry is None:  # every action audits itself; a backend that did not is a bug
            raise AssertionError(f"{name} on {audited} left no audit entry")
        # `applied` is what the audit entry recorded, never re-derived from the result: a
        # second "approve" of an approved request returns "yes" too, and was not applied.
        return Outcome(
            name, audited, entry.applied, entry.before, entry.after, entry.reason, result
        )

    async def pause(
        self, *, now: int | None = None, actor: str = "operator", reason: str | None = None
    ) -> bool:
        """Claims return nothing until resume(); intake never stops. True if it changed."""
        return await self._write(
            switches.set_flag,
            "paused",
            True,
            "pause",
            self._now(now),
            checks.actor(actor),
            checks.reason(reason),
        )

    async def resume(
        self, *, now: int | None = None, actor: str = "operator", reason: str | None = None
    ) -> bool:
        return await self._write(
            switches.set_flag,
            "paused",
            False,
            "resume",
            self._now(now),
            checks.actor(actor),
            checks.reason(reason),
        )

    # --- reads ----------------------------------------------------------------------------

    async def get_event(self, event_id: int) -> Event | None:
        return await self._db.call(reads.get_event, checks.event_id(event_id))

    async def events(
        self,
        status: str,
        *,
        limit: int = 100,
        after: int | None = None,
        before: int | None = None,
        search: str | None = None,
        payload: bool = True,
    ) -> list[Event]:
        """A keyset page of events in `status` by id: ascending after `after` (or from the
        start), or the page just before `before` in descending order. `search` keeps rows
        whose source, source id or error contains it; `payload=False` leaves payloads out
        (None), for lists that do not show them."""
        if not isinstance(status, str) or status not in EVENT_STATES:
            raise BadInput(f"status must be one of {EVENT_STATES}, got {show(status)}")
        checks.positive("limit", limit)
        for name, value in (("after", after), ("before", before)):
            if value is not None:
                check_int(value, name, 0, MAX_ID)
        if search is not None and search != "":
            search = checks.text("search", search)
        return await self._db.call(
            reads.events,
            status,
            min(limit, 10_000),
            after,
            before,
            search or None,
            bool(payload),
        )

    async def counts(self) -> dict[str, int]:
        return await self._db.call(reads.counts)

    async def lease_info(self) -> Lease | None:
        return await self._db.call(reads.lease_info)

    async def lease_history(self, *, limit: int = 50) -> list[LeaseChange]:
        return await self._db.call(reads.lease_history, checks.positive("limit", limit))

    async def timers(self, *, limit: int = 1000) -> list[Timer]:
        """Soonest first, each with its state (scheduled, paused, set aside)."""
        return await self._db.call(desk.timers, checks.positive("limit", limit))

    async def dead_groups(self, *, limit: int = 100) -> list[DeadGroup]:
        """The dead events grouped by the first line of their error, largest group first
        (a scan of the dead events: read it when asked for, not on every poll)."""
        return await self._db.read(desk.dead_groups, checks.positive("limit", limit))

    async def dead_group_ids(self, line: str, *, limit: int = 10_000) -> list[int]:
        """The ids of the dead events whose error's first line is `line`, oldest first."""
        return await self._db.read(
            desk.dead_group_ids, _group_line(line), checks.positive("limit", limit)
        )

    async def requeue_group(
        self,
        line: str,
        ids: Sequence[int],
        *,
        now: int | None = None,
        actor: str = "operator",
        reason: str | None = None,
    ) -> list[Outcome]:
        """Requeue, in one transaction, the dead events the operator saw in the group of
        `line` (dead_group_ids): each only if it is still dead with that first line, so an
        event that joined the group since is never touched. One Outcome per id, in order;
        each is audited as a `requeue` of its event."""
        line = _group_line(line)
        if not isinstance(ids, (list, tuple)) or not ids:
            raise BadInput("ids must be a non-empty list of event ids")
        if len(ids) > MAX_BATCH_IDS:
            raise BadInput(f"{len(ids)} ids; the limit is {MAX_BATCH_IDS}")
        checked = [checks.event_id(i) for i in ids]
        if len(set(checked)) != len(checked):
            raise BadInput("ids must not repeat")
        entries = await self._write(
            desk.requeue_group,
            line,
            checked,
            self._now(now),
            checks.actor(actor),
            checks.reason(reason),
        )
        return [
            Outcome("requeue", e.target, e.applied, e.before, e.after, e.reason, e.applied)
            for e in entries
        ]

    async def worker_seen(
        self, holder: str, *, host: str, pid: int, now: int | None = None
    ) -> None:
        """A worker process's heartbeat (holding the lease or standing by): the desk and
        `onwatch status` list who watches this inbox, from which host and pid, since when."""
        await self._db.write_alone(
            desk.worker_seen,
            checks.text("holder", holder, limit=1024),  # a worker's holder name may be long
            checks.text("host", host, limit=255),
            check_int(pid, "pid", 0, 1 << 31),
            self._now(now),
        )

    async def worker_gone(self, holder: str) -> None:
        """A worker process stopped: it no longer stands by."""
        await self._db.write_alone(desk.worker_gone, checks.text("holder", holder, limit=1024))

    async def workers(self, *, limit: int = 100, now: int | None = None) -> list[Worker]:
        """The worker processes last seen, oldest first; the lease holder marked."""
        return await self._db.read(desk.workers, checks.positive("limit", limit), self._now(now))

    async def approval_trail(self, request_id: str) -> ApprovalTrail | None:
        """The run (and its events) that asked for this approval, and the event its answer
        became; None for a request never made."""
        return await self._db.read(desk.approval_trail, checks.text("request_id", request_id))

    async def approvals_asked_by(self, event_id: int) -> list[str]:
        """The approval requests the runs of this event asked for, oldest first."""
        return await self._db.read(desk.approvals_asked_by, checks.event_id(event_id))

    async def approvals(self, *, limit: int = 1000) -> list[Approval]:
        return await self._db.read(reads.approvals, checks.positive("limit", limit))

    async def get_approval(self, request_id: str) -> Approval | None:
        return await self._db.call(approvals.get_approval, checks.text("request_id", request_id))

    async def held_messages(self, *, limit: int = 1000) -> list[Message]:
        return await self._db.call(reads.held_messages, checks.positive("limit", limit))

    async def deliveries(self, *, limit: int = 50) -> list[Delivery]:
        """Recent sends (newest first) with their idempotency keys and outcomes."""
        return await self._db.read(outbox.deliveries, checks.positive("limit", limit), self.now())

    async def next_send_at(self) -> int | None:
        """When the next paced send is allowed; None when nothing is held."""
        return await self._db.read(outbox.next_send_at)

    async def audit(self, *, limit: int = 100, target: str | None = None) -> list[AuditEntry]:
        return await self._db.call(
            reads.audit_entries,
            checks.positive("limit", limit),
            None if target is None else checks.text("target", target),
        )

    async def runs(self, event_id: int) -> list[Run]:
        """Every run that claimed this event, oldest first."""
        return await self._db.read(reads.runs_for_event, checks.event_id(event_id))

    async def held_back(self) -> str | None:
        """Why the store cannot clean up after its writes, held back by a reader of another
        process that does not end (an inbox file's write-ahead log that cannot be copied
        back; a database's transaction left open), else None: what `onwatch status` and
        the worker's log say (docs/rules.md, "A read that never ends")."""
        return await self._db.call(reads.held_back)

    async def overview(self, *, now: int | None = None) -> Overview:
        """Counts, lease, flags and budgets in one consistent read."""
        return await self._db.read(reads.overview, self._now(now))

    # --- the run's transcript, spend, and what needs a person -----------------------------

    async def append_transcript(
        self,
        run_id: int,
        lines: Iterable[NewLine],
        *,
        upto: int | None = None,
        dropped_chars: int = 0,
        spends: Iterable[NewSpend] = (),
        now: int | None = None,
    ) -> int:
        """Store a batch of a run's transcript (docs/rules.md#the-runs-transcript): `lines`
        as (seq, at, level, logger, text, fields JSON), numbered from 0 by their one writer,
        and what the run spent, as (seq of its line, at, unit, millionths, note). `upto` is
        the seq after the last line the batch covers (default: after its last line): a seq
        the batch skips is a line its writer left out, `dropped_chars` the characters it
        left out of the run so far (a running total). Bounded per run by
        max_transcript_chars; a batch stored already changes nothing (a retry is safe).
        Returns the lines stored, or -1 for a run that does not exist. The worker's writer
        (core/runtime/transcript.py) is what calls this."""
        run_id = checks.positive("run_id", run_id)
        batch = [checks.log_line(line) for line in checks.listed("lines", lines, MAX_COUNT)]
        costs = [checks.spend_record(item) for item in checks.listed("spends", spends, MAX_COUNT)]
        seqs = [line[0] for line in batch]
        if any(a >= b for a, b in zip(seqs, seqs[1:], strict=False)):
            raise BadInput("lines must be in the order of their seq, each seq once")
        last = max(seqs + [item[0] for item in costs], default=-1)
        upto = last + 1 if upto is None else check_int(upto, "upto", last + 1, MAX_COUNT)
        dropped_chars = check_int(dropped_chars, "dropped_chars", 0, MAX_ID)
        return await self._write(
            transcripts.append,
            run_id,
            batch,
            upto,
            dropped_chars,
            costs,
            self._settings.max_transcript_chars,
            self._now(now),
        )

    async def transcript(
        self, run_id: int, *, after: int | None = None, limit: int = 1000, newest: bool = False
    ) -> Transcript:
        """Up to `limit` lines of a run's transcript after line `after` (by seq, oldest
        first; from the start without it), or its newest `limit` lines with `newest=True`;
        with what the whole transcript is (lines logged, dropped, pruned)."""
        run_id = checks.positive("run_id", run_id)
        if after is not None:
            check_int(after, "after", -1, MAX_COUNT)
        limit = min(checks.positive("limit", limit), 10_000)
        return await self._db.read(transcripts.read, run_id, after, limit, bool(newest))

    async def transcript_last(self, run_id: int) -> int:
        """The seq of the newest line stored for the run, -1 for none: one indexed lookup,
        what a follower compares before reading."""
        return await self._db.call(transcripts.last_seq, checks.positive("run_id", run_id))

    async def run_spend(self, run_ids: Iterable[int]) -> list[Spend]:
        """What each of these runs spent, per unit (runs that spent nothing are absent)."""
        ids = [
            checks.positive("run id", i)
            for i in checks.listed("run_ids (a list of run ids)", run_ids, MAX_BATCH_IDS)
        ]
        return await self._db.read(spend.for_runs, ids) if ids else []

    async def spending(self, *, days: int = 14, now: int | None = None) -> Spending:
        """What the inbox spent per unit: in the last 24 hours (what max_spend_per_day
        counts), per UTC day over the last `days` days, and in all; with the budgets."""
        days = checks.positive("days", days, 3660)
        return await self._db.read(spend.spending, self._now(now), days)

    async def raise_budget(
        self,
        budget: str,
        to: Any,
        *,
        unit: str | None = None,
        expect: Any = None,
        now: int | None = None,
        actor: str = "operator",
        reason: str | None = None,
    ) -> Outcome:
        """Raise a delaying budget to `to`: `max_spend_per_day` of `unit` (an amount in the
        unit) or `max_runs_per_day` (runs). Conditional like every operator action: `expect`
        is the limit the operator saw (None: as it is now); refused, and audited with why,
        if it changed meanwhile, is not set, or `to` would not raise it. Returns the Outcome
        (raise_budget in the audit log)."""
        if unit is not None:  # both checked before they are joined (a 10**5000 has no text)
            budget = f"{checks.text('budget', budget)} {checks.text('unit', unit)}"
        return await self.act(
            "raise_budget",
            budget,
            expect=expect,
            value=to,
            now=now,
            actor=actor,
            reason=reason,
        )

    async def died_since(self, since: int, *, limit: int = 100) -> list[Event]:
        """Events that died at or after `since` (when they last changed), oldest first,
        without payloads (None)."""
        return await self._db.read(
            reads.died_since,
            check_time(since, "since"),
            min(checks.positive("limit", limit), 10_000),
        )

    async def work_since(self, *, now: int | None = None) -> int | None:
        """Since when the inbox has had work for a worker (its oldest pending event's
        arrival, or a timer's due instant once due); None when it has none."""
        return await self._db.read(reads.work_since, self._now(now))


def _group_line(line: object) -> str:
    """A dead group's line as dead_groups gives it: text (empty for events without an
    error), without NUL, valid Unicode; BadInput otherwise."""
    if line == "":
        return ""
    return checks.text("line", line, limit=1_000_000)


def _acted(tx: Tx, target: str, fn: Callable[..., T], *args: Any) -> tuple[T, AuditEntry | None]:
    """Run an operator action's transaction and read back the audit entry it wrote, in the
    same transaction: (what the action returned, its AuditEntry)."""
    result = fn(tx, *args)
    entries = reads.audit_entries(tx, 1, target)
    return result, entries[0] if entries else None
