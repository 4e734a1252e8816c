"""The Inbox: the async API an agent embeds. Validates, then runs one transaction per call."""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import inspect
import json
import os
import sqlite3
from typing import Any, Awaitable, Callable, Iterable, Sequence, TypeVar

from . import pg, store
from .actions import ACTIONS, Outcome
from .backend import Connection, Handle, Store, Waker
from .clock import (
    MAX_COUNT,
    MAX_ID,
    Clock,
    SystemClock,
    check_duration,
    check_int,
    check_time,
    show,
)
from .db import Database
from .errors import BadInput
from .records import (
    EVENT_STATES,
    Approval,
    ApprovalRequest,
    AuditEntry,
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
)
from .settings import MAX_BATCH, Settings

CATCH_UP_POLICIES = ("coalesce", "each")
MAX_TEXT = 1024  # sources, ids, holders: keys, not documents
MAX_DEPTH = 100  # nesting of any JSON value the API takes; deeper is refused, never recursed
# The engine's own sources: approval answers and timer occurrences. Nobody else may ingest
# under them (a forged ("approval", id) would stand as the answer), and no timer may take an
# id under the engine's own prefixes (it would replace an approval's expiry).
RESERVED_SOURCES = ("approval", "timer")
RESERVED_TIMER_PREFIXES = ("approval:",)
MAX_TRACEBACK = 16_384  # a failed run's traceback: its end (the raising line) is kept

SendFn = Callable[[str], Any] | Callable[[str], Awaitable[Any]]
T = TypeVar("T")
Item = tuple[str, str, str, int]  # an ingest as stored: (source, source_id, payload JSON, now)


def _ingest_all_or_none(db: Handle, batch: list[Item], sql: Store = store) -> list[bool]:
    stored: list[bool] = []
    for result in sql.ingest_many(db, batch):
        if isinstance(result, Exception):
            raise result  # rolls the whole batch back
        stored.append(result)
    return stored


def _change_token(db: sqlite3.Connection) -> tuple[int, int]:
    return db.execute("PRAGMA data_version").fetchone()[0], db.total_changes


class Outgoing(str):
    """The text of one send; `.key` is the delivery's stable idempotency key."""

    key: str
    count: int  # type: ignore[assignment]  # the number of messages joined; hides str.count

    def __new__(cls, text: str, key: str, count: int) -> "Outgoing":
        value = super().__new__(cls, text)
        value.key = key
        value.count = count
        return value


def _text(name: str, value: object, *, limit: int = MAX_TEXT) -> str:
    if not isinstance(value, str):
        raise BadInput(f"{name} must be a string, got {type(value).__name__}")
    if not value:
        raise BadInput(f"{name} must not be empty")
    if len(value) > limit:
        raise BadInput(f"{name} is {len(value)} characters; the limit is {limit}")
    if "\x00" in value:
        raise BadInput(f"{name} must not contain NUL characters")
    if not value.isascii():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise BadInput(f"{name} is not valid Unicode text (it has a lone surrogate)") from None
    return value


def _positive(name: str, value: object, high: int = MAX_ID) -> int:
    return check_int(value, name, 1, high)


def _event_id(value: object) -> int:
    return check_int(value, "event id", 1, MAX_ID)


def _source(name: str, value: object) -> str:
    """An event source an outsider may use: not one of the engine's own."""
    text = _text(name, value)
    if text in RESERVED_SOURCES:
        raise BadInput(
            f"{name} {text!r} is reserved for the engine's own events "
            f"(reserved: {', '.join(RESERVED_SOURCES)})"
        )
    return text


def _timer_id(value: object) -> str:
    text = _text("timer_id", value)
    if text.startswith(RESERVED_TIMER_PREFIXES):
        raise BadInput(
            f"timer ids starting with {text.split(':')[0]}: are reserved for the "
            f"engine's own timers"
        )
    return text


def _check_shape(value: object, what: str, limit: int) -> None:
    """Refuse JSON nested deeper than MAX_DEPTH or with more values than `limit` bytes could
    hold, walking iteratively: a deep value must be refused, never recursed into."""
    if (
        type(value) is dict
        and len(value) < limit
        and _SCALARS.issuperset(map(type, value.values()))
    ):
        return  # the common webhook body: one flat object (the walk below would say the same)
    stack = [(value, 1)]
    seen = 0
    while stack:
        item, depth = stack.pop()
        seen += 1
        if seen > limit:
            raise BadInput(
                f"{what} has more values than {limit} bytes can hold (max_payload_bytes)"
            )
        if isinstance(item, (dict, list, tuple)):
            if depth > MAX_DEPTH:
                raise BadInput(f"{what} is nested deeper than {MAX_DEPTH} levels")
            children = item.values() if isinstance(item, dict) else item
            stack.extend((child, depth + 1) for child in children)


_SCALARS = frozenset((str, int, float, bool, type(None)))  # exact types: no subclass is here
_JSON = json.JSONEncoder(ensure_ascii=False, allow_nan=False)
_JSON_ASCII = json.JSONEncoder(ensure_ascii=True, allow_nan=False)
# What _JSON.encode builds on every call, built once (no check for cycles: _check_shape has
# already refused any value with more values than the limit, so a cyclic one never gets
# here). The standard library's C encoder; without it, _JSON.encode.
_C_ENCODER: Callable[..., Callable[[object, int], Sequence[str]]] | None = getattr(
    json.encoder, "c_make_encoder", None
)  # (not in the standard library's type stubs)
_ENCODE_ONCE = (
    None
    if _C_ENCODER is None
    else _C_ENCODER(
        None, _JSON.default, json.encoder.encode_basestring, None, ": ", ", ", False, False, False
    )
)


def _json_text(value: object) -> str:
    if _ENCODE_ONCE is None or type(value) is str:
        return _JSON.encode(value)
    return "".join(_ENCODE_ONCE(value, 0))


def _encode(payload: object, limit: int, what: str = "payload") -> str:
    _check_shape(payload, what, limit)
    try:
        text = _json_text(payload)
    except (TypeError, ValueError, RecursionError) as exc:
        raise BadInput(f"{what} must be JSON-serialisable: {exc}") from None
    if text.isascii():
        size = len(text)
    else:
        try:
            size = len(text.encode("utf-8"))
        except UnicodeEncodeError:
            # A lone surrogate (valid in JSON as an escape, not in UTF-8): keep it escaped,
            # so the payload round-trips exactly and the database gets valid text.
            text = _JSON_ASCII.encode(payload)
            size = len(text)
    if size > limit:
        raise BadInput(f"{what} is {size} bytes; the limit is {limit} (max_payload_bytes)")
    return text


MAX_BATCH_IDS = MAX_BATCH  # ids one finish may name: what one claim can hand out


def _listed(name: str, values: object, limit: int) -> list[Any]:
    """`values` as a list, refused (BadInput) unless it is a finite iterable of at most
    `limit` items; a str is not a list of anything here."""
    if isinstance(values, (str, bytes, dict)) or not isinstance(values, Iterable):
        raise BadInput(f"{name} must be a list")
    items = []
    for item in values:
        items.append(item)
        if len(items) > limit:
            raise BadInput(f"{name} has more than {limit} items")
    return items


def _actor(actor: object) -> str:
    return _text("actor", actor, limit=200)


def _reason(reason: object) -> str | None:
    return None if reason is None else _text("reason", reason, limit=2000)


class _GroupCommit:
    """Ingests that arrive while a commit is in flight share the next transaction.

    Each caller still returns only after its own event is committed, and gets its own
    result or error.

    No task per ingest: a lone caller hands its item straight to the connection thread, and
    each commit's completion callback (on the loop) settles its callers' futures. Callers
    arriving while a commit is in flight queue up and go together in the next transaction.
    Once a transaction carried more than one ingest (a storm), the next one is sent at the
    end of the loop iteration instead, so that every caller woken by a commit can join it:
    one big group, the loop and the connection thread taking turns. (Two groups overlapping
    measured slower: the two threads then fight for the GIL at every SQLite step.) A
    cancelled caller's event is still committed (it may already be); nobody else is
    affected.

    A duplicate of a key this inbox has already seen committed is answered without a write
    transaction: one indexed read on the loop's thread (Database.peek) confirms the key is
    stored, so the answer False is the truth at that instant. Anything else, or any doubt,
    takes the normal path.
    """

    KNOWN_KEYS = 65_536  # keys remembered for the duplicate fast path (oldest forgotten first)

    def __init__(self, db: Connection, sql: Store = store) -> None:
        self._db = db
        self._sql = sql
        self._queue: list[tuple[Item, asyncio.Future[bool]]] = []
        self._in_flight = False  # a transaction of ours is queued or running on the thread
        self._flush_soon = False  # a _flush is scheduled for the end of this loop iteration
        self._storm = False  # the last transaction carried more than one ingest
        self._idle: asyncio.Future[None] | None = None
        self._known: dict[tuple[str, str], None] = {}
        # SQLite: a lone ingest tries one autocommit statement first (store.ingest_alone),
        # which remembers the settings it checks against here.
        alone = getattr(sql, "ingest_alone", None)
        self._write_alone: Callable[..., None] | None = None
        if alone is not None and hasattr(db, "write_soon_alone"):
            seen: dict[str, str | None] = {}
            self._write_alone = functools.partial(
                db.write_soon_alone, functools.partial(alone, seen=seen)
            )

    async def submit(self, item: Item) -> bool:
        if (item[0], item[1]) in self._known and self._stored(item[0], item[1]):
            return False
        loop = asyncio.get_running_loop()
        future: asyncio.Future[bool] = loop.create_future()
        queue = self._queue
        queue.append((item, future))
        if not self._in_flight:
            if not self._storm:
                self._send()
            elif not self._flush_soon:
                self._flush_soon = True
                loop.call_soon(self._flush)
        return await future

    def _stored(self, source: str, source_id: str) -> bool:
        try:
            return self._db.peek(self._key_stored, source, source_id)
        except sqlite3.Error:
            return False

    @staticmethod
    def _key_stored(db: sqlite3.Connection, source: str, source_id: str) -> bool:
        # fetchall steps to the end, so the read snapshot is released at once
        return bool(
            db.execute(
                "SELECT 1 FROM events WHERE source = ? AND source_id = ?", (source, source_id)
            ).fetchall()
        )

    def _flush(self) -> None:
        self._flush_soon = False
        if not self._in_flight and self._queue:
            self._send()

    def _send(self) -> None:
        batch, self._queue = self._queue, []
        self._in_flight = True
        self._storm = len(batch) > 1
        write = self._db.write_soon if len(batch) > 1 else self._write_alone or self._db.write_soon
        try:
            write(
                self._sql.ingest_many,
                ([item for item, _ in batch],),
                lambda results, error: self._done(batch, results, error),
            )
        except BaseException as exc:  # closed: nothing was sent
            self._in_flight = False
            self._settle(batch, None, exc)

    def _done(
        self,
        batch: list[tuple[Item, asyncio.Future[bool]]],
        results: list[bool | Exception] | None,
        error: BaseException | None,
    ) -> None:
        """On the loop, when a transaction committed or failed."""
        self._in_flight = False
        if self._queue and not self._storm:
            self._send()  # a lone caller queued meanwhile: it goes at once
        self._settle(batch, results, error)
        if not self._in_flight:
            if self._queue:  # a few wait: let the callers just settled join them
                if not self._flush_soon:
                    self._flush_soon = True
                    asyncio.get_running_loop().call_soon(self._flush)
            elif self._idle is not None:
                if not self._idle.done():
                    self._idle.set_result(None)
                self._idle = None

    def _settle(
        self,
        batch: list[tuple[Item, asyncio.Future[bool]]],
        results: list[bool | Exception] | None,
        error: BaseException | None,
    ) -> None:
        """Give each caller its own result or error."""
        if error is not None:  # the whole transaction failed: tell everyone in it
            for _, future in batch:
                if not future.done():
                    future.set_exception(error)
            return
        assert results is not None  # committed: one result per item
        known = self._known
        for (item, future), result in zip(batch, results, strict=True):
            if not isinstance(result, Exception):
                known[item[0], item[1]] = None  # stored now, by this or an earlier ingest
                if not future.done():
                    future.set_result(result)
            elif not future.done():
                future.set_exception(result)
        while len(known) > self.KNOWN_KEYS:
            del known[next(iter(known))]

    async def wait_idle(self) -> None:
        while self._in_flight or self._queue:
            if self._idle is None:
                self._idle = asyncio.get_running_loop().create_future()
            await asyncio.shield(self._idle)


class Inbox:
    """One durable inbox (one SQLite file). Open with `await Inbox.open(path)`."""

    def __init__(
        self, db: Connection, clock: Clock, settings: Settings, sql: Store = store
    ) -> None:
        self._db = db
        self._sql = sql  # the backend's SQL module: core/self._sql.py or core/pg/self._sql.py
        self.clock = clock
        self._settings = settings
        self._intake = _GroupCommit(db, sql)

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
    ) -> "Inbox":
        """Open the inbox at `path`, creating or migrating its schema.

        `path` is a file (SQLite: the file is the inbox, `name` stays "default") or a
        `postgresql://` URL (one database holds many inboxes; `name` picks one, created on
        first open unless create=False). Raises NotAnInbox (leaving the file or database
        untouched) for a missing inbox when `create=False`, a foreign or corrupt file or
        database, or one from a newer schema.
        """
        if pg.is_url(path):
            if not isinstance(create, bool):
                raise BadInput(f"create must be True or False, got {show(create)}")
            if (
                isinstance(busy_timeout, bool)
                or not isinstance(busy_timeout, (int, float))
                or not 0 < busy_timeout <= 86_400
            ):  # NaN too
                raise BadInput(
                    f"busy_timeout must be a positive number of seconds, got {show(busy_timeout)}"
                )
            from .pg import db as pg_db, store as pg_store  # psycopg only when asked for

            pg_database = await pg_db.Database.open(
                path, name=_text("inbox name", name), create=create, busy_timeout=busy_timeout
            )
            settings = await pg_database.read(pg_store.load_settings)
            return cls(pg_database, clock or SystemClock(), settings, pg_store)
        if name != "default":
            raise BadInput(
                f"name picks an inbox of a PostgreSQL database; a file is one "
                f"inbox (got name={show(name)} for a file)"
            )
        if not isinstance(path, (str, os.PathLike)):
            raise BadInput(f"path must be a file path, got {type(path).__name__}")
        try:
            text = os.fsdecode(os.fspath(path))
            os.fsencode(text)  # a lone surrogate cannot name a file
        except (TypeError, ValueError) as exc:
            raise BadInput(f"path is not a usable file path: {exc}") from None
        if not text or "\x00" in text:
            raise BadInput("path must be a non-empty file path without NUL characters")
        if not isinstance(create, bool):
            raise BadInput(f"create must be True or False, got {show(create)}")
        if (
            isinstance(busy_timeout, bool)
            or not isinstance(busy_timeout, (int, float))
            or not 0 < busy_timeout <= 86_400
        ):  # NaN too
            raise BadInput(
                f"busy_timeout must be a positive number of seconds, got {show(busy_timeout)}"
            )
        db = await Database.open(
            path, create=create, busy_timeout=busy_timeout, factory=connection_factory
        )
        settings = await db.read(store.load_settings)
        return cls(db, clock or SystemClock(), settings)

    async def close(self) -> None:
        await self._intake.wait_idle()
        await self._db.close()

    async def __aenter__(self) -> "Inbox":
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    @property
    def path(self) -> str:
        return self._db.path

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
        """The inbox's clock (wall clock unless one was injected at open)."""
        return self.clock.now()

    def _now(self, now: object) -> int:
        return self.clock.now() if now is None else check_time(now)

    async def _write(self, fn: Callable[..., T], *args: Any) -> T:
        return await self._db.write(fn, *args)

    async def change_token(self) -> tuple[int, int]:
        """A value that differs whenever anything committed since it was last read: another
        connection (PRAGMA data_version) or this Inbox itself (the connection's change
        count). One cheap call, no table read: what an idle poller compares."""
        return await self._db.call(getattr(self._sql, "change_token", _change_token))

    @property
    def wake(self) -> Waker:
        """Wakes this process's waiters when the file may have changed (core/wake.py):
        another process's commit through the OS's file notification, ours directly."""
        return self._db.wake

    # --- settings -------------------------------------------------------------------------

    @property
    def settings(self) -> Settings:
        """The settings as of the last open, configure or reload_settings."""
        return self._settings

    async def reload_settings(self) -> Settings:
        self._settings = await self._db.read(self._sql.load_settings)
        return self._settings

    async def configure(self, **changes: Any) -> Settings:
        """Validate and store setting changes; raise BadInput (writing nothing) on a bad one."""

        def apply(db: sqlite3.Connection) -> Settings:
            updated = self._sql.load_settings(db).replace(changes)
            self._sql.store_settings(db, updated)
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
        item = (
            _source("source", source),
            _text("source_id", source_id),
            _encode(payload, self._settings.max_payload_bytes),
            self._now(now),
        )
        return await self._intake.submit(item)

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
                    _source("source", source),
                    _text("source_id", source_id),
                    _encode(payload, self._settings.max_payload_bytes),
                    when,
                )
            )
        if not batch:
            return []
        return await self._write(_ingest_all_or_none, batch, self._sql)

    async def prune_payloads(self, older_than: int, *, now: int | None = None) -> int:
        """Drop payloads of done/cancelled events last changed before `older_than`; the
        dedupe keys stay. Returns how many were pruned."""
        return await self._write(
            self._sql.prune_payloads, check_time(older_than, "older_than"), self._now(now)
        )

    # --- lease ----------------------------------------------------------------------------

    async def acquire(
        self, holder: str, *, now: int | None = None, fresh: bool = False
    ) -> int | None:
        """Take or renew the lease; return its generation, or None if another holds it.

        `fresh=True` is a starting worker: it never continues a live lease, not even one
        under its own holder name (another process may have started under that name at the
        same moment); it takes only a lease that is free or expired, as a new generation.
        The decision is one transaction, so two starters under one name cannot both win."""
        holder, now = _text("holder", holder), self._now(now)
        if not isinstance(fresh, bool):
            raise BadInput(f"fresh must be True or False, got {show(fresh)}")
        renewed: Callable[..., int | None] | None = getattr(
            self._sql, "renewed_without_write", None
        )  # SQLite's store only
        if renewed is not None and not fresh:
            # The holder renewing to the expiry it already has changes nothing: one read of
            # committed state answers it on this thread, without a write transaction.
            try:
                gen = self._db.peek(renewed, holder, now)
            except sqlite3.Error:
                gen = None
            if gen is not None:
                return gen
        return await self._write(self._sql.acquire, holder, now, fresh)

    async def renew(self, holder: str, gen: int, *, now: int | None = None) -> bool:
        """Extend the lease for exactly this unexpired generation (fenced)."""
        return await self._write(
            self._sql.renew, _text("holder", holder), _positive("gen", gen), self._now(now)
        )

    async def release(self, holder: str, gen: int, *, now: int | None = None) -> bool:
        """Hand the lease back; a successor may take over at once (next generation)."""
        return await self._write(
            self._sql.release, _text("holder", holder), _positive("gen", gen), self._now(now)
        )

    # --- runs -----------------------------------------------------------------------------

    async def claim_batch(self, holder: str, gen: int, *, now: int | None = None) -> list[Event]:
        """Claim the next run's events (docs/rules.md#claiming-a-run); [] unless this
        generation holds."""
        return await self._write(
            self._sql.claim_batch, _text("holder", holder), _positive("gen", gen), self._now(now)
        )

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
        holder, gen = _text("holder", holder), _positive("gen", gen)
        ids = [_event_id(i) for i in _listed("ids (a list of event ids)", ids, MAX_BATCH_IDS)]
        if not ids:
            raise BadInput("ids must name at least one claimed event")
        if run is not None:
            run = _positive("run", run)
        replies = [self._reply(m) for m in _listed("messages", messages, MAX_COUNT)]
        approvals = [self._approval_request(a) for a in _listed("approvals", approvals, MAX_COUNT)]
        timers = [self._followup(t) for t in _listed("timers", timers, MAX_COUNT)]
        if error is not None:
            error = _text("error", error, limit=10_000)
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
            None if result is None else _encode(result, self._settings.max_payload_bytes, "result")
        )
        return await self._write(
            self._sql.finish,
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
        _text("message body", message.body, limit=self._settings.max_payload_bytes)
        if not isinstance(message.urgent, bool):
            raise BadInput("Reply.urgent must be True or False")
        return message

    def _approval_request(self, request: object) -> ApprovalRequest:
        if not isinstance(request, ApprovalRequest):
            raise BadInput("approvals must be core.ApprovalRequest records")
        _text("request_id", request.request_id)
        check_duration(request.expires_in, "expires_in")
        _text("action", request.action, limit=10_000)
        return request

    def _followup(self, timer: object) -> FollowUp:
        if not isinstance(timer, FollowUp):
            raise BadInput("timers must be core.FollowUp records")
        encoded = self._check_timer(
            timer.timer_id, timer.due, timer.payload, timer.every, timer.key, timer.catch_up
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
            self._sql.intend_effect,
            _text("holder", holder),
            _positive("gen", gen),
            _positive("run_id", run_id),
            _text("effect name", name, limit=200),
            _encode(detail, self._settings.max_payload_bytes, "detail"),
            None if key is None else _text("key", key),
            self._now(now),
            None if event is None else _event_id(event),
        )

    async def settle_effect(
        self, key: str, state: str = "confirmed", *, now: int | None = None
    ) -> bool:
        """Record that an intended effect happened ('confirmed') or did not ('failed')."""
        if state not in ("confirmed", "failed"):
            raise BadInput(f"state must be 'confirmed' or 'failed', got {show(state)}")
        return await self._write(self._sql.settle_effect, _text("key", key), state, self._now(now))

    async def effects(self, event_id: int) -> list[Effect]:
        """The effect journal of every run that claimed this event."""

        def read(db: sqlite3.Connection) -> list[Effect]:
            runs = self._sql.runs_for_event(db, _event_id(event_id))
            return self._sql.effects_for_run(db, [r.id for r in runs]) if runs else []

        return await self._db.read(read)

    # --- timers ---------------------------------------------------------------------------

    def _check_timer(
        self,
        timer_id: object,
        due: object,
        payload: object,
        every: object,
        key: object,
        catch_up: object,
    ) -> str:
        _timer_id(timer_id)
        check_time(due, "due")
        if every is not None:
            check_duration(every, "every")
        if catch_up not in CATCH_UP_POLICIES:
            raise BadInput(f"catch_up must be one of {CATCH_UP_POLICIES}, got {show(catch_up)}")
        if key is not None:
            if every is not None:
                raise BadInput("a fixed event key is only allowed on a one-off timer")
            if not (isinstance(key, tuple) and len(key) == 2):
                raise BadInput("key must be a (source, source_id) tuple")
            _source("key source", key[0])
            _text("key source_id", key[1])
        return _encode(payload, self._settings.max_payload_bytes)

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
        encoded = self._check_timer(timer_id, due, payload, every, key, catch_up)
        await self._write(
            lambda db: self._sql.add_timer(
                db, timer_id, due, encoded, every, key, catch_up, "timer", encoded=True
            )
        )

    async def cancel_timer(self, timer_id: str) -> bool:
        """Remove a timer; False if there was none. An approval's expiry cannot be cancelled
        here (BadInput): answer or expire the approval instead."""
        return await self._write(self._sql.cancel_timer, _timer_id(timer_id))

    async def run_scheduler(self, *, now: int | None = None) -> int:
        """Turn due timers into inbox events (one transaction); return how many were due."""
        return await self._write(self._sql.run_scheduler, self._now(now))

    async def next_timer_due(self) -> int | None:
        return await self._db.call(self._sql.next_timer_due)

    async def next_wake(self, *, now: int | None = None) -> int | None:
        """The earliest instant something becomes due: a timer, a backed-off event, or a
        held outbox send. A worker may sleep until then (or until a new event arrives).

        Only what can actually happen counts: nothing the held outbox would send, no pending
        event while paused, and while the runs-per-day budget is used up, the instant its
        window frees a slot. So the answer is never a past instant that nothing will act on.
        """
        return await self._db.read(self._sql.next_wake, self._now(now))

    # --- approvals ------------------------------------------------------------------------

    async def request_approval(
        self, request_id: str, expires_in: int, action: str, *, now: int | None = None
    ) -> Approval:
        """Ask a human; the answer or the expiry comes back as event ('approval', request_id).
        Asking again for the same id keeps the first deadline."""
        return await self._write(
            self._sql.request_approval,
            _text("request_id", request_id),
            check_duration(expires_in, "expires_in"),
            _text("action", action, limit=10_000),
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
            self._sql.answer_approval,
            _text("request_id", request_id),
            answer,
            self._now(now),
            _actor(actor),
            _reason(reason),
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
            self._sql.expire_approval,
            _text("request_id", request_id),
            self._now(now),
            _actor(actor),
            _reason(reason),
        )

    # --- outbox ---------------------------------------------------------------------------

    async def dispatch(self, send: SendFn, *, now: int | None = None) -> int:
        """Send what the outbox allows now, at most one send; return how many messages went.

        `send` (plain or async) receives the joined text, an `Outgoing` str carrying the
        delivery's idempotency key. It runs outside any transaction. If it raises, the
        messages stay held (or die after max_delivery_attempts) and 0 is returned.
        """
        return await self._dispatch(send, self._now(now), flush=False)

    async def _dispatch(self, send: SendFn, now: int, flush: bool) -> int:
        if not callable(send):
            raise BadInput("send must be callable")
        picked = await self._write(self._sql.begin_delivery, now, flush)
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
            self._sql.end_delivery,
            delivery_id,
            attempt,
            error,
            self._now(None) if now is None else now,
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
        actor, reason = _actor(actor), _reason(reason)
        sent = await self._dispatch(send, now, flush=True)
        await self._write(
            self._sql.audit,
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
            self._sql.set_flag,
            "outbox_held",
            True,
            "hold",
            self._now(now),
            _actor(actor),
            _reason(reason),
        )

    async def release_outbox(
        self, *, now: int | None = None, actor: str = "operator", reason: str | None = None
    ) -> bool:
        return await self._write(
            self._sql.set_flag,
            "outbox_held",
            False,
            "release",
            self._now(now),
            _actor(actor),
            _reason(reason),
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
        if outcome not in store.SETTLE_OUTCOMES:
            raise BadInput(f"outcome must be one of {store.SETTLE_OUTCOMES}, got {show(outcome)}")
        if expect not in store.DELIVERY_STATES:
            raise BadInput(
                f"expect must be a delivery state {store.DELIVERY_STATES}, got {show(expect)}"
            )
        return await self._write(
            self._sql.settle_delivery,
            _positive("delivery id", delivery_id),
            outcome,
            expect,
            self._now(now),
            _actor(actor),
            _reason(reason),
        )

    async def uncertain_deliveries(
        self, *, now: int | None = None, limit: int = 100
    ) -> list[Delivery]:
        """At-most-once deliveries cut off mid-send, oldest first: neither re-sent nor
        settled until an operator says what happened (settle_delivery)."""
        return await self._db.read(
            self._sql.uncertain_deliveries, self._now(now), _positive("limit", limit)
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
            self._sql.change_event,
            _event_id(event_id),
            action,
            allowed,
            expect,
            after,
            self._now(now),
            _actor(actor),
            _reason(reason),
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
    ) -> Outcome:
        """Run the operator action `name` (a row of core.actions.ACTIONS) on `target` (an
        event id, an approval request id, a delivery id, or None for an inbox switch) and
        return what happened: applied or not, before → after, and why when refused. Read in
        the action's own transaction, so a second operator acting meanwhile cannot blur it.
        `expect` (events and deliveries) is the state the operator saw. BadInput for an
        unknown action or a target of the wrong kind; nothing changes then."""
        action = ACTIONS.get(name) if isinstance(name, str) else None
        if action is None:
            raise BadInput(f"action must be one of {tuple(ACTIONS)}, got {show(name)}")
        when, who, why = self._now(now), _actor(actor), _reason(reason)
        if action.target == "event":
            if expect is not None and (not isinstance(expect, str) or expect not in EVENT_STATES):
                raise BadInput(f"expect must be an event state, got {show(expect)}")
            event_id = _event_id(target)
            # (the store function, then its arguments)
            call: tuple[Any, ...] = (
                self._sql.change_event,
                event_id,
                name,
                action.allowed,
                expect,
                action.after,
                when,
                who,
                why,
            )
            audited = f"event {event_id}"
        elif action.target == "delivery":
            expect = "uncertain" if expect is None else expect
            if expect not in store.DELIVERY_STATES:
                raise BadInput(
                    f"expect must be a delivery state {store.DELIVERY_STATES}, got {show(expect)}"
                )
            delivery_id = _positive("delivery id", target)
            call = (self._sql.settle_delivery, delivery_id, action.after, expect, when, who, why)
            audited = f"delivery {delivery_id}"
        elif expect is not None:
            raise BadInput(f"{name} takes no expect= (it acts on {action.target} state as it is)")
        elif action.target == "approval":
            request_id = _text("request_id", target)
            call = (
                (self._sql.expire_approval, request_id, when, who, why)
                if action.after == "expired"
                else (self._sql.answer_approval, request_id, action.after, when, who, why)
            )
            audited = f"approval {request_id}"
        else:
            if target is not None:
                raise BadInput(f"{name} acts on the whole inbox: no target, got {show(target)}")
            flag = action.switch
            assert flag is not None  # an inbox action is a switch (core/actions.py)
            call = (self._sql.set_flag, flag, action.after == "true", name, when, who, why)
            audited = flag
        result, entry = await self._write(_acted, self._sql.audit_entries, audited, *call)
        applied = result == action.after if action.target == "approval" else bool(result)
        if entry is None:  # every action audits itself; a backend that did not is a bug
            raise AssertionError(f"{name} on {audited} left no audit entry")
        return Outcome(name, audited, applied, entry.before, entry.after, entry.reason, result)

    async def pause(
        self, *, now: int | None = None, actor: str = "operator", reason: str | None = None
    ) -> bool:
        """Claims return nothing until resume(); intake never stops. True if it changed."""
        return await self._write(
            self._sql.set_flag,
            "paused",
            True,
            "pause",
            self._now(now),
            _actor(actor),
            _reason(reason),
        )

    async def resume(
        self, *, now: int | None = None, actor: str = "operator", reason: str | None = None
    ) -> bool:
        return await self._write(
            self._sql.set_flag,
            "paused",
            False,
            "resume",
            self._now(now),
            _actor(actor),
            _reason(reason),
        )

    # --- reads ----------------------------------------------------------------------------

    async def get_event(self, event_id: int) -> Event | None:
        return await self._db.call(self._sql.get_event, _event_id(event_id))

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
        _positive("limit", limit)
        for name, value in (("after", after), ("before", before)):
            if value is not None:
                check_int(value, name, 0, MAX_ID)
        if search is not None and search != "":
            search = _text("search", search)
        return await self._db.call(
            self._sql.events,
            status,
            min(limit, 10_000),
            after,
            before,
            search or None,
            bool(payload),
        )

    async def counts(self) -> dict[str, int]:
        return await self._db.call(self._sql.counts)

    async def lease_info(self) -> Lease | None:
        return await self._db.call(self._sql.lease_info)

    async def lease_history(self, *, limit: int = 50) -> list[LeaseChange]:
        return await self._db.call(self._sql.lease_history, _positive("limit", limit))

    async def timers(self, *, limit: int = 1000) -> list[Timer]:
        return await self._db.call(self._sql.timers, _positive("limit", limit))

    async def approvals(self, *, limit: int = 1000) -> list[Approval]:
        return await self._db.read(self._sql.approvals, _positive("limit", limit))

    async def get_approval(self, request_id: str) -> Approval | None:
        return await self._db.call(self._sql.get_approval, _text("request_id", request_id))

    async def held_messages(self, *, limit: int = 1000) -> list[Message]:
        return await self._db.call(self._sql.held_messages, _positive("limit", limit))

    async def deliveries(self, *, limit: int = 50) -> list[Delivery]:
        """Recent sends (newest first) with their idempotency keys and outcomes."""
        return await self._db.read(self._sql.deliveries, _positive("limit", limit), self.now())

    async def next_send_at(self) -> int | None:
        """When the next paced send is allowed; None when nothing is held."""
        return await self._db.read(self._sql.next_send_at)

    async def audit(self, *, limit: int = 100, target: str | None = None) -> list[AuditEntry]:
        return await self._db.call(
            self._sql.audit_entries,
            _positive("limit", limit),
            None if target is None else _text("target", target),
        )

    async def runs(self, event_id: int) -> list[Run]:
        """Every run that claimed this event, oldest first."""
        return await self._db.read(self._sql.runs_for_event, _event_id(event_id))

    async def overview(self, *, now: int | None = None) -> Overview:
        """Counts, lease, flags and budgets in one consistent read."""
        return await self._db.read(self._sql.overview, self._now(now))


def _acted(
    db: Handle,
    read_audit: Callable[[Handle, int, str], list[AuditEntry]],
    target: str,
    fn: Callable[..., T],
    *args: Any,
) -> tuple[T, AuditEntry | None]:
    """Run an operator action's transaction and read back the audit entry it wrote, in the
    same transaction: (what the action returned, its AuditEntry)."""
    result = fn(db, *args)
    entries = read_audit(db, 1, target)
    return result, entries[0] if entries else None
