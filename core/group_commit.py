"""Group commit: ingests that arrive while a commit is in flight share the next
transaction, each caller still getting its own answer after its own event is durable."""

from __future__ import annotations

import asyncio
import functools

from .connection import Connection
from .engine import intake
from .engine.intake import Item


class GroupCommit:
    """Ingests that arrive while a commit is in flight share the next transaction.

    Each caller still returns only after its own event is committed, and gets its own
    result or error.

    No task per ingest: a lone caller hands its item straight to the connection thread, and
    each commit's completion callback (on the loop) settles its callers' futures. Callers
    arriving while a commit is in flight queue up and go together in the next transaction.
    Once a transaction carried more than one ingest (a storm), the next one is sent at the
    end of the loop iteration instead, so that every caller woken by a commit can join it:
    one big group, the loop and the connection thread taking turns. (Two groups overlapping
    measured slower: the two threads then fight for the GIL at every SQLite step.) Where
    the connection may write on the loop's own thread (Connection.may_write_here: a
    Worker's SQLite inbox), a caller waits for the end of its loop iteration instead; one
    still alone then commits right there, with no hand-off; two or more go to the thread
    as one group. A
    cancelled caller's event is still committed (it may already be); nobody else is
    affected.

    A duplicate of a key this inbox has already seen committed is answered without a write
    transaction: one indexed read on the loop's thread (Database.peek) confirms the key is
    stored, so the answer False is the truth at that instant. Anything else, or any doubt,
    takes the normal path.
    """

    KNOWN_KEYS = 65_536  # keys remembered for the duplicate fast path (oldest forgotten first)

    def __init__(self, db: Connection) -> None:
        self._db = db
        self._queue: list[tuple[Item, asyncio.Future[bool]]] = []
        self._in_flight = False  # a transaction of ours is queued or running on the thread
        self._flush_soon = False  # a _flush is scheduled for the end of this loop iteration
        self._storm = False  # the last transaction carried more than one ingest
        self._idle: asyncio.Future[None] | None = None
        self._known: dict[tuple[str, str], None] = {}
        # A lone ingest may be one autocommit statement (intake.ingest_alone, where the
        # connection can), which remembers here the settings it checks against.
        self._alone = functools.partial(intake.ingest_alone, seen={})

    def known_duplicate(self, source: str, source_id: str) -> bool:
        """True if this key was committed through this inbox before and one read confirms it
        is still stored: the ingest is answered False (a duplicate) with no transaction and
        no task. False means "not known", not "new": the caller then submits the event."""
        return (source, source_id) in self._known and self._db.peek(
            intake.key_stored, source, source_id
        ) is True

    async def submit(self, item: Item) -> bool:
        """Store one checked event (the caller has asked known_duplicate first)."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[bool] = loop.create_future()
        queue = self._queue
        queue.append((item, future))
        if not self._in_flight:
            if not self._storm and not self._db.may_write_here():
                self._send()
            elif not self._flush_soon:  # callers of this loop iteration go together
                self._flush_soon = True
                loop.call_soon(self._flush)
        return await future

    def _flush(self) -> None:
        self._flush_soon = False
        if self._in_flight or not self._queue:
            return
        if len(self._queue) > 1 or not self._write_here():
            self._send()

    def _write_here(self) -> bool:
        """A lone caller's ingest committed on the event loop's own thread, where the
        connection allows it (a Worker's inbox: Connection.write_here_alone); False if it
        does not (nothing was written: the caller's item is still queued)."""
        batch = self._queue
        items = ([item for item, _ in batch],)
        try:
            done, results = self._db.write_here_alone(self._alone, intake.ingest_many, items)
        except BaseException as exc:  # noqa: B036 - handed to the caller, then raised on
            self._queue = []
            self._settle(batch, None, exc)
            self._now_idle()
            if not isinstance(exc, Exception):
                raise
            return True
        if not done:
            return False
        self._queue, self._storm = [], False
        self._settle(batch, results, None)
        self._now_idle()
        return True

    def _now_idle(self) -> None:
        """Nothing queued or in flight any more: wake wait_idle."""
        if self._idle is not None:
            if not self._idle.done():
                self._idle.set_result(None)
            self._idle = None

    def _send(self) -> None:
        batch, self._queue = self._queue, []
        self._in_flight = True
        self._storm = len(batch) > 1
        items = ([item for item, _ in batch],)
        try:

            def done(results: list[bool | Exception] | None, error: BaseException | None) -> None:
                self._done(batch, results, error)

            if len(batch) > 1:
                self._db.write_soon(intake.ingest_many, items, done)
            else:
                self._db.write_soon_alone(self._alone, intake.ingest_many, items, done)
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
            else:
                self._now_idle()

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
