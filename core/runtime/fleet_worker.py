"""The fleet worker: every inbox of a PostgreSQL database that has work, served N at once.

One process holds at most `concurrency` visits at a time. A visit is a worker
(core/runtime/listening_worker.py: lease, scheduler, claim, agent, one fenced finish,
dispatch) on one inbox, for as long as the inbox has work and its share lasts. One run per
inbox at a time is the lease's rule, so several fleet workers on several machines share a
database: an inbox another holds is never visited. How it keeps the promises of
docs/rules.md#the-fleet-worker:

- **Everything due gets done.** The look (core/pg/fleet.py) finds an inbox for each thing
  a visit can do: an available event, a due timer, a lost claim, a due send or a delivery
  waiting for its retry, in the engine's own terms (paused, budgets, set-aside timers,
  the outbox's gap and hold).
- **Nothing starves.** Inboxes are taken least recently served first. A visit gives its
  slot back after its share (`share` seconds and at least one run) when another inbox is
  waiting, keeping its lease, and goes to the back of the queue. A quiet inbox therefore
  waits for at most the inboxes ahead of it, each for one share and the run in progress.
- **Nothing spins.** A visit that ends with nothing left to run puts its inbox to rest:
  it is not visited again until its change counter moves (anyone's commit), a NOTIFY
  names it, or 1 s has passed; after a visit that ran and sent nothing, until what the
  engine says is next due (`next_wake`), at most 5 s, doubled for each such visit in a
  row (10 s, 20 s, … an hour), so that no
  disagreement between the look and the engine, and no channel that keeps failing, can
  make it visit again and again.
- **A lease outlives a visit where that is cheaper and safe.** A visit that gave its slot
  back keeps its lease for its next turn (no acquire, no release, no new generation), up
  to `concurrency` kept leases; a kept lease not taken up again before it is due for
  renewal is released. A kept lease is a generation remembered, not an open inbox: the
  visit's connection goes back to the pool (core/pg/db.py) for the next visit, whichever
  inbox it serves (idle sessions held beside the busy ones cost the server more than the
  acquires and releases they would save; docs/performance.md). A release whose
  answer was lost leaves a generation this process may still hold: it is remembered, and
  the next visit takes it up again (fenced) instead of waiting for it to lapse.
- **The visits share a few sessions.** Each visit's inbox is opened with the fleet's
  `Connections` (core/pg/shared.py): its transactions take one for their duration, so the
  server keeps `connections` sessions for the fleet, not one per inbox served (a fresh
  session costs the server some 20 ms of CPU before its caches are warm, and idle ones
  slow the busy ones).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from dataclasses import dataclass
from typing import Any, Callable

import psycopg

from ..errors import InboxError, NotAnInbox
from ..pg import LOOK_AT_LEAST_EVERY, redact
from ..pg.fleet import Candidate, Looker, Unreachable
from ..pg.listen import Listener
from ..pg.shared import Connections
from ..text import printable
from .listening_worker import ListeningWorker
from .worker import SERVING, STOP_SLACK, AgentWedged, HeldBack, WorkerStats

__all__ = ["FleetWorker"]
log = logging.getLogger("onwatch.pg.fleet")

SHARE = 1.0  # seconds of runs a visit may go on while other inboxes wait for a slot
LOOK_WHEN_FULL = 0.25  # seconds between looks while every slot is taken (is anyone waiting?)
SCHEDULER_EVERY = 1.0  # seconds between scheduler passes within one visit
REST_AFTER_WORK = 1.0  # seconds an inbox rests after a visit that ran or sent something
REST_FIRST, REST_MAX = 5.0, 3600.0  # the rest after a visit that did nothing, doubling
# Sessions on the server the visits share at most, one per transaction in flight, unless
# told (`connections`): a visit holds one only for a transaction, a few milliseconds of a
# run, and every session costs the server (docs/performance.md, "Shared connections").
CONNECTIONS = 8


@dataclass
class _Rest:
    """An inbox left alone after a visit that ended with nothing to run."""

    changes: int | None  # its change counter after the visit (None: unknown)
    heard: tuple[int, int]  # the Listener's mark for it before the visit's last claim
    until: float | None  # server time when it is due again (None: only a change ends it)
    idle: int  # visits in a row that did nothing


@dataclass
class _Kept:
    """A lease this process holds on an inbox no visit is serving."""

    gen: int
    since: float  # its place in the queue: the server time it gave its slot back
    renew_at: int  # server time: when the worker's renewal is due
    renew_mono: float  # the same instant on this process's monotonic clock (the worker's)
    until: int  # server time: the expiry its last renewal wrote
    release_at: float  # server time: released unless taken up again before this
    uncertain: bool = False  # a release whose answer was lost: held or not, released again
    expires: float = 0.0  # (uncertain) server time it lapses by itself anyway
    tries: int = 0  # (uncertain) releases tried again


class FleetWorker:
    """Serve every inbox of a database that has work, at most `concurrency` at once. See
    the module docstring."""

    def __init__(
        self,
        url: str,
        agent: Any,
        *,
        holder: str,
        concurrency: int,
        send: Any = None,
        poll_interval: float = 1.0,
        grace: float = 10.0,
        clock: Any = None,
        on_stuck: Callable[[str], None] | None = None,
        share: float = SHARE,
        connections: int | None = None,
    ) -> None:
        self.url = url
        self.agent = agent
        self.holder = holder
        self.concurrency = concurrency
        self.send = send
        self.poll_interval = poll_interval
        self.grace = grace
        # None: every decision by the server's clock (docs/rules.md#time); a clock given
        # here (a test's) is each inbox's.
        self.clock = clock
        self.on_stuck = on_stuck  # see Worker: the event loop held past the lease
        self.share = share
        # Sessions on the server that the visits share, one per transaction in flight.
        self.connections = connections or min(concurrency, CONNECTIONS)
        self._shared = Connections(url, limit=self.connections)  # opened as jobs need them
        self.runs = 0
        self.visits = 0
        self.served: dict[str, int] = {}  # inbox name → runs served here
        self.waiting = 0  # inboxes with work that no slot of this process serves
        self._workers: dict[str, _Visit | None] = {}  # inbox name → its visit's worker
        self._kept: dict[str, _Kept] = {}
        self._rests: dict[str, _Rest] = {}
        self._stop = asyncio.Event()
        self._changed = asyncio.Event()
        self.stop_requested = False  # by request_stop's callers, not by a wedged agent
        self._wedged: AgentWedged | None = None
        self._refused: InboxError | None = None  # the database became one it cannot serve
        self._looker = Looker(url)
        self._held_back = HeldBack(log, "fleet: ")
        self._listener: Listener | None = None
        self._chores: set[asyncio.Task[None]] = set()

    def request_stop(self) -> None:
        """Stop: each run in progress may finish within the grace; a second request
        abandons them now."""
        force, self.stop_requested = self.stop_requested, True
        self._halt(force)

    def _halt(self, force: bool = False) -> None:
        self._stop.set()
        for worker in self._workers.values():
            # None: still opening; it sees the stop once it has. A worker asked once is
            # not asked again (a second request would abandon its run at once).
            if worker is not None and (force or not worker.stopping):
                worker.request_stop(force)

    async def check(self) -> None:
        """Raise NotAnInbox or InboxError (the single-inbox worker's words) unless the
        database is an onwatch database this role can serve; migrate an older one."""
        await asyncio.to_thread(self._looker.check)

    async def _checked(self) -> bool:
        """The start-up check, tried again (with a backoff, saying so) while the server
        cannot be reached; False if a stop came first."""
        backoff = 0.0
        while True:
            try:
                await self.check()
                return True
            except Unreachable as exc:
                backoff = min(max(backoff * 2, 0.5), 5.0)
                log.warning("fleet: %s; retrying in %.1f s", printable(str(exc)), backoff)
            await self._pause(backoff)
            if self._stop.is_set():
                return False

    async def _pause(self, seconds: float) -> None:
        """Sleep, unless a stop comes first."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stop.wait(), seconds)

    async def run(self) -> int:
        """Serve until request_stop; return how many runs were made here. Raises
        AgentWedged (every lease released) when an agent's code could not be stopped on
        one inbox: the process must end to stop it (see Worker.run); NotAnInbox or
        InboxError when the database is not one it can serve (checked first, and again
        whenever an inbox cannot be opened)."""
        if not await self._checked():
            return 0
        listener = self._listener = await Listener.open(self.url, poll_interval=self.poll_interval)
        self._shared = Connections(self.url, limit=self.connections)  # a run's own
        log.info(
            "fleet worker %s started on %s: up to %s inboxes at once, %s connection(s)",
            printable(self.holder),
            printable(redact(self.url)),
            self.concurrency,
            self.connections,
        )
        tasks: set[asyncio.Task[None]] = set()
        backoff = 0.0
        try:
            while not self._stop.is_set():
                self._end_rests()
                self._let_go_of_kept()
                try:
                    started = await self._look(tasks)
                except psycopg.Error as exc:
                    # A restart or a network cut: say so, back off, look again.
                    backoff = min(max(backoff * 2, 0.1), 5.0)
                    log.warning(
                        "fleet: cannot reach %s (%s); retrying in %.1f s",
                        printable(redact(self.url)),
                        printable(str(exc).strip()),
                        backoff,
                    )
                    await self._pause(backoff)
                    continue
                if backoff:
                    log.warning("fleet: %s reachable again", printable(redact(self.url)))
                    backoff = 0.0
                await self._held_back.look(lambda: asyncio.to_thread(self._looker.held_back))
                if not started:
                    self._changed.clear()
                    await self._wait(listener)
        finally:
            self._halt()
            if tasks:
                await asyncio.gather(*tasks, return_exceptions=True)
            await self._release_all_kept()
            if self._chores:
                await asyncio.gather(*self._chores, return_exceptions=True)
            await listener.close()
            await asyncio.to_thread(self._looker.close)
            await asyncio.to_thread(self._shared.close)
        if self._wedged is not None:
            raise self._wedged
        if self._refused is not None:
            raise self._refused
        return self.runs

    async def _look(self, tasks: set[asyncio.Task[None]]) -> bool:
        """Look for inboxes with work and start visits on the free slots, least recently
        served first; True if any started. Counts what is left waiting (`waiting`)."""
        free = self.concurrency - len(self._workers)
        candidates = await asyncio.to_thread(
            self._looker.with_work,
            self.concurrency + len(self._kept) + 1,
            taken=[*self._workers, *self._kept],
            resting={n: r.changes for n, r in self._rests.items() if r.changes is not None},
            sends=self.send is not None,
        )
        queue: list[tuple[float, float, Candidate | str]]
        queue = [(c.since, random.random(), c) for c in candidates if not self._resting(c.name)]
        queue += [
            (kept.since, random.random(), name)
            for name, kept in self._kept.items()
            if name not in self._workers and not kept.uncertain
        ]
        queue.sort(key=lambda entry: entry[:2])
        chosen = [entry[2] for entry in queue[: max(free, 0)]]
        self.waiting = len(queue) - len(chosen)
        for item in chosen:
            name = item.name if isinstance(item, Candidate) else item
            # Taken here, before any await: two tasks of one holder on one inbox would
            # share its lease, and the lease could not tell them apart.
            self._workers[name] = None
            task = asyncio.create_task(self._serve(name, self._kept.pop(name, None)))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        return bool(chosen)

    async def _wait(self, listener: Listener) -> None:
        """Until a slot frees, any inbox is notified, a stop, or the poll interval (a
        quarter second while every slot is taken: whether others wait decides shares; at
        most LOOK_AT_LEAST_EVERY, the look telling the desk this worker is alive)."""
        full = len(self._workers) >= self.concurrency
        timeout = min(self.poll_interval, LOOK_AT_LEAST_EVERY)
        timeout = min(timeout, LOOK_WHEN_FULL) if full else timeout
        now = self._looker.now()
        for due in [r.until for r in self._rests.values()] + [
            k.release_at for k in self._kept.values()
        ]:
            if due is not None:
                timeout = min(timeout, max(due - now, 0.0))
        waits: list[asyncio.Future[Any]] = [
            asyncio.ensure_future(self._changed.wait()),
            asyncio.ensure_future(self._stop.wait()),
        ]
        if not full:  # full, a NOTIFY could start nothing: the next look is enough
            waits.append(asyncio.ensure_future(listener.wait_any(timeout)))
        try:
            await asyncio.wait(waits, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in waits:
                task.cancel()

    # --- rests and kept leases ------------------------------------------------------------

    def _end_rests(self) -> None:
        """A rest ends when its inbox was notified (or the listener reconnected: what it
        missed is unknown) or its time came; a moved change counter is the look's test."""
        listener, now = self._listener, self._looker.now()
        assert listener is not None
        for name, rest in self._rests.items():
            if rest.changes is None and rest.until is None:
                continue  # ended already (kept for its count of idle visits)
            if listener.seen(name) != rest.heard or (rest.until is not None and now >= rest.until):
                rest.changes = None  # the next look may return it; `idle` is kept
                rest.until = None
                rest.heard = (-1, -1)

    def _resting(self, name: str) -> bool:
        """A rest whose change counter is unknown (the visit failed, or its inbox could not
        be opened): the look cannot leave it out, so it is left out here."""
        rest = self._rests.get(name)
        return rest is not None and rest.changes is None and rest.until is not None

    def _rest(self, name: str, visit: _Visit, changes: int | None) -> None:
        """Rest an inbox whose visit ended with nothing to run: REST_AFTER_WORK seconds
        after a visit that ran or sent something; after one that did nothing, until what
        the engine says is next due and at most REST_FIRST seconds, doubled for each such
        visit in a row (the look may still see work the visit could not do: a send that
        failed just now, a value only the engine reads)."""
        previous = self._rests.get(name)
        idle = 0 if visit.productive else (previous.idle + 1 if previous else 1)
        now = self._looker.now()
        longest = now + (
            REST_AFTER_WORK if idle == 0 else min(REST_FIRST * 2 ** (idle - 1), REST_MAX)
        )
        due = visit.next_due
        until = longest if due is None or due <= now else min(due, longest)
        heard = visit.heard
        if heard == (-1, -1):  # it never reached a claim: what is heard from now on
            assert self._listener is not None
            heard = self._listener.seen(name)
        self._rests[name] = _Rest(changes, heard, until, idle)

    def _let_go_of_kept(self) -> None:
        """Release kept leases whose turn has not come before their renewal was due, and
        again those whose release went unanswered (so that the next event need not wait
        for the lease to lapse)."""
        now = self._looker.now()
        for name, kept in list(self._kept.items()):
            if now >= kept.release_at or self._stop.is_set():
                del self._kept[name]
                self._chore(self._release_kept(name, kept))

    def _chore(self, coro: Any) -> None:
        task = asyncio.create_task(coro)
        self._chores.add(task)
        task.add_done_callback(self._chores.discard)

    async def _release_kept(self, name: str, kept: _Kept) -> None:
        try:
            await self._release_now(name, kept.gen)
        except InboxError as exc:
            now = self._looker.now()
            if not self._stop.is_set() and now < kept.expires:
                # Still unknown: tried again with a backoff until it would have lapsed.
                kept.uncertain, kept.tries = True, kept.tries + 1
                kept.release_at = now + min(0.5 * 2**kept.tries, 30.0)
                if name not in self._kept and name not in self._workers:
                    self._kept[name] = kept
                    return
            log.warning(
                "fleet: inbox %s: could not release the lease (it lapses by itself): %s",
                printable(name),
                printable(str(exc)),
            )
        self._changed.set()

    async def _release_now(self, name: str, gen: int) -> None:
        """Release a kept generation on the inbox opened for it (a pooled connection)."""
        from ..inbox import Inbox

        inbox = await Inbox.open(
            self.url, name=name, create=False, clock=self.clock, connections=self._shared
        )
        try:
            await inbox.release(self.holder, gen)
        finally:
            await inbox.close()

    async def _release_all_kept(self) -> None:
        kept, self._kept = self._kept, {}
        await asyncio.gather(
            *(self._release_kept(n, k) for n, k in kept.items()), return_exceptions=True
        )

    # --- one visit ------------------------------------------------------------------------

    async def _serve(self, name: str, kept: _Kept | None) -> None:
        from ..inbox import Inbox

        listener = self._listener
        assert listener is not None
        try:
            inbox = await Inbox.open(
                self.url, name=name, create=False, clock=self.clock, connections=self._shared
            )
        except InboxError as exc:
            if kept is not None:  # released as soon as it can be (or left to lapse)
                kept.release_at = self._looker.now()
                self._kept[name] = kept
            await self._cannot_open(name, exc)
            return
        self.visits += 1
        log.debug("fleet: visiting inbox %s", printable(name))
        worker = _Visit(
            inbox,
            self.agent,
            fleet=self,
            name=name,
            kept=kept,
            holder=self.holder,
            send=self.send,
            poll_interval=self.poll_interval,
            grace=self.grace,
            listener=listener,
            on_stuck=self.on_stuck,
        )
        self._workers[name] = worker
        if self._stop.is_set():
            worker.request_stop()
        keep = False
        try:
            stats = await worker.run()
            self.runs += stats.runs
            self.served[name] = self.served.get(name, 0) + stats.runs
            keep = self._keep(name, inbox, worker)
            if not keep and not worker.yielded:
                changes = await self._changes(inbox)
                self._rest(name, worker, changes)
        except AgentWedged as exc:
            # Code that cannot be stopped runs in this process: the fleet stops (every
            # other inbox's run finishing or abandoned, its lease released) and says so.
            self.runs += worker.stats.runs
            self._wedged = self._wedged or exc
            self._halt()
        except Exception as exc:  # noqa: BLE001 - one inbox's failure never stops the fleet
            log.warning(
                "fleet: inbox %s: %s", printable(name), printable(f"{type(exc).__name__}: {exc}")
            )
            self._rest(name, worker, None)
        finally:
            del self._workers[name]
            await inbox.close()
            self._changed.set()

    async def _cannot_open(self, name: str, exc: InboxError) -> None:
        """An inbox that cannot be opened rests (no spin); if the database itself became
        one this fleet cannot serve (a newer schema, lost privileges), the fleet stops."""
        del self._workers[name]
        self._changed.set()
        try:
            await self.check()
        except (NotAnInbox, InboxError) as refused:
            if isinstance(refused, NotAnInbox) or "privileges" in str(refused):
                log.error("fleet: stopping: %s", refused)
                self._refused = refused
                self._halt()
                return
        log.warning("fleet: cannot open inbox %s: %s", printable(name), printable(str(exc)))
        previous = self._rests.get(name)
        idle = previous.idle + 1 if previous else 1
        until = self._looker.now() + min(REST_FIRST * 2**idle, REST_MAX)
        assert self._listener is not None
        self._rests[name] = _Rest(None, self._listener.seen(name), until, idle)

    def may_keep(self) -> bool:
        """Whether a visit giving its slot back may keep its lease: not while stopping,
        and not past `concurrency` kept leases (each keeps its inbox from another fleet
        process until it is taken up again or released)."""
        kept = sum(1 for k in self._kept.values() if not k.uncertain)
        return not self._stop.is_set() and kept < self.concurrency

    def _keep(self, name: str, inbox: Any, worker: _Visit) -> bool:
        """Keep the lease of a visit that gave its slot back (its next turn then costs no
        acquire), or of one whose release went unanswered; True if kept."""
        gen = worker.kept_gen
        if gen is None or self._stop.is_set():
            return False
        ttl = inbox.settings.lease_ttl
        period = max(1, ttl // 3)
        now = self._looker.now()
        uncertain = worker.release_lost
        self._kept[name] = _Kept(
            gen,
            since=now,
            renew_at=worker.renew_at,
            renew_mono=worker.renew_mono,
            until=worker.until,
            # A kept lease is let go of before its renewal would be late; an uncertain
            # release is tried again at once.
            release_at=now if uncertain else worker.renew_at + period,
            uncertain=uncertain,
            expires=worker.renew_at - period + ttl,
        )
        return True

    @staticmethod
    async def _changes(inbox: Any) -> int | None:
        try:
            token = await inbox.change_token()
        except InboxError:
            return None
        changes: int = token[0]
        return changes


class _Visit(ListeningWorker):
    """A worker on one inbox for one visit: it ends when it has nothing left to run (saying
    when something is next due), when another holds the lease (it does not wait: the fleet
    has other inboxes), or after its share when other inboxes wait for a slot."""

    def __init__(
        self, *args: Any, fleet: FleetWorker, name: str, kept: _Kept | None, **kwargs: Any
    ) -> None:
        super().__init__(*args, **kwargs)
        self.fleet = fleet
        self.name = name
        self.began = time.monotonic()
        self.yielded = False
        self.next_due: float | None = None  # what the engine says is next due (server time)
        self.heard: tuple[int, int] = (-1, -1)
        self.kept_gen: int | None = None  # the generation handed back to the fleet, kept
        self.release_lost = False  # kept_gen is one whose release went unanswered
        # Handed to the fleet when a visit ends (see _release): when the lease is next
        # renewed, on the server's clock and on the monotonic one, and the expiry written.
        self.renew_at, self.renew_mono, self.until = 0, 0.0, 0
        self._scheduled_at = 0.0  # (monotonic) when the scheduler runs again
        if kept is not None:
            # This process's own live generation: taken up again without a write. If it
            # was lost meanwhile, the claim is fenced and the visit ends.
            self.gen = kept.gen
            self._renew_mono, self._until = kept.renew_mono, kept.until
            self.stats.generations.append(kept.gen)

    # The visit's change mark is the Listener's (_change_mark), not the claim's token.
    marks_in_claim = False
    start_level = logging.DEBUG  # the fleet says when it starts; a visit is routine
    # The look found the lease free a moment ago: the visit asks for it at once (taken
    # meanwhile, the acquire says so, and the lease is read then).
    looks_before_acquiring = False
    looks_held_back = False  # the fleet looks for the whole database (FleetWorker.run)

    async def run(self) -> WorkerStats:
        serving = SERVING.set(printable(self.name))  # its log lines name its inbox
        try:
            return await super().run()
        finally:
            SERVING.reset(serving)

    def _fires_timers(self) -> bool:
        # A visit is short and its inbox was found with work: its claims fire due timers
        # when the visit begins and then at most once a second (a look for due timers is a
        # round trip of its own on every claim otherwise).
        if not self._claim_fires_timers():
            return False
        self._scheduled_at = time.monotonic() + SCHEDULER_EVERY
        return True

    def _claim_fires_timers(self) -> bool:
        # A finish's claim that found nothing is the visit's last (claiming again at once
        # would fire nothing either, and look at the same events).
        return time.monotonic() >= self._scheduled_at

    @property
    def productive(self) -> bool:
        """Whether the visit ran or sent anything."""
        return self.stats.runs > 0 or self.stats.sent > 0

    async def _change_mark(self) -> tuple[int, int] | None:
        # What the fleet's rest compares: NOTIFYs for this inbox heard from now on. (The
        # change token is read once, when the visit ends; the loop's own is not needed.)
        listener = self.listener
        if listener is not None:
            self.heard = listener.seen(self.name)
        return None

    async def _idle(self, claimed_at: int, version: tuple[int, int] | None) -> None:
        self.stats.idle += 1
        if not self.productive:
            # Only a visit that did nothing asks when its inbox is next due (a read
            # snapshot, three round trips): its rest may be long, and should end then. After
            # a productive visit the rest is short anyway (REST_AFTER_WORK).
            sends = self.send is not None  # no channel: a held reply is not due here
            wake = await self._step(lambda: self.inbox.next_wake(sends=sends))
            if wake is not None and wake > claimed_at:
                self.next_due = float(wake)
        self.request_stop()

    async def _wait_for(self, lease: Any) -> None:
        if lease.holder != self.holder or lease.gen not in self.stats.generations:
            self.next_due = float(lease.until + 1)
        self.request_stop()

    async def _dispatch(self) -> None:
        await super()._dispatch()
        if (
            not self.stopping
            and self.stats.runs > 0
            and self.fleet.waiting > 0
            and time.monotonic() - self.began >= self.fleet.share
        ):
            self.yielded = True  # others wait: give the slot back, keep the lease
            self.request_stop()

    async def _release(self) -> None:
        self.renew_mono, self.until = self._renew_mono, self._until
        self.renew_at = self._until - self.inbox.settings.lease_ttl + self._renew_period()
        # A generation handed back for a claim whose answer was lost is released like any
        # other (never kept: the next generation must recover what it may have claimed).
        gen, given_up = self.gen or self._given_up, self._given_up is not None
        self.gen = self._given_up = None
        if gen is None:
            return
        if self.yielded and not given_up and self.fleet.may_keep():
            self.kept_gen = gen
            return
        try:
            released = await asyncio.wait_for(
                self.inbox.release(self.holder, gen), timeout=max(self.grace, 1.0) + STOP_SLACK
            )
            logging.getLogger("onwatch.worker").debug(
                "lease generation %s %s", gen, "released" if released else "was already gone"
            )
        except (InboxError, TimeoutError) as exc:
            # Unknown whether it committed: the fleet remembers the generation, so that
            # its next visit takes it up again rather than waiting for it to lapse.
            log.warning(
                "fleet: inbox %s: could not release the lease: %s",
                printable(self.name),
                printable(str(exc) or "the database did not answer"),
            )
            self.kept_gen, self.release_lost = gen, True
