"""The worker runtime: holds the lease, runs the scheduler, claims, calls the agent, finishes.

    stats = await run_worker("alice.db", handle, holder="box-1", send=print)

One process runs one `Worker`. It takes the inbox's lease and renews it (fenced) well inside
the TTL; between runs it sleeps until the inbox's next wake-up or until another process
commits (a new event, an answer), noticed by a file notification (core/sqlite/wake.py) and
confirmed with `Inbox.change_token()`, one cheap call that reads no table; the token is also
polled as the fallback. Each run is: one step (the change token, due timers fired, the
settings, the claim: one transaction, `Inbox.claim_next`), the agent call, ONE fenced finish,
then a dispatch of the outbox. The agent never sees SQL: it gets the batch and a `RunContext`.

What can go wrong and what the runtime does (docs/rules.md#a-misbehaving-agent):

- the agent raises (anything: `sys.exit()`, KeyboardInterrupt and GeneratorExit included):
  the run finishes with `error=` (backoff, attempts), the worker goes on;
- the agent runs past `settings.max_run_seconds`: the call is cancelled and the run abandoned
  (no finish); the next claim recovers it as a lost claim under the inbox's policy;
- the lease is lost (a renewal or an effect intent is refused): the run is abandoned, never
  finished; a successor's claim recovers it;
- an abandoned run's code has `grace` seconds to end (a cancelled task to return, a plain
  def's thread to come back). Code still running then cannot be stopped in this process: the
  worker releases the lease and raises `AgentWedged`, so that whoever runs it ends the
  process (the command line exits 4 for its service manager to start it again);
- the agent blocks the event loop: core/runtime/watchdog.py says so, naming the run;
- another process keeps the database locked (`InboxBusy`): logged, retried at the next step;
- SIGTERM/SIGINT/SIGHUP (`Worker.request_stop`): the current run may finish within `grace`
  seconds, otherwise it is abandoned; the lease is released so a successor can start at once.

A plain-def agent runs in a thread of its own for each run (core/runtime/threads.py), never
in a shared pool: a run the worker gave up on cannot hold a thread another run needs.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import logging
import math
import os
import socket
import time
import traceback as tb
from dataclasses import dataclass, field
from contextvars import ContextVar
from typing import Any, Awaitable, Callable

from .. import checks
from ..clock import BackendClock, Clock, SystemClock, show
from ..errors import BadInput, ConnectionLost, InboxBusy, InboxError, WritesRefused
from ..humanize import duration
from ..inbox import Inbox, SendFn
from ..pg import is_url
from ..records import Event, Lease
from ..text import printable
from ..connection import SLOW_POLL
from ..engine import scheduler
from .context import Agent, LeaseLost, RunAbandoned, RunContext, _is_async
from .threads import start_thread
from .transcript import TranscriptWriter, capture_logging
from .transcript import current as run_log
from .watchdog import LoopWatch

log = logging.getLogger("onwatch.worker")
# The inbox whose worker logs, where one process serves many (a fleet's visit: see
# core/runtime/fleet_worker.py). Set for a visit's task, and so for every task it starts.
SERVING: ContextVar[str | None] = ContextVar("onwatch_serving", default=None)
TRANSCRIPT_FLUSH = 5.0  # seconds a finish waits for its run's transcript to be stored
# Past 2 × grace after a stop request, plus this, run() is cancelled where it waits.
STOP_SLACK = 5.0
OUTAGE_BACKOFF = 5.0  # seconds between two tries, at most, while the database cannot be used
OUTAGE_LOG_EVERY = 60.0  # seconds between two log lines of one outage (or full disk)
HELD_BACK_LOOK_EVERY = 60.0  # seconds between two looks at whether cleanup is held back
HELD_BACK_SAY_EVERY = 3600.0  # seconds between two log lines while it stays held back
# After a wake-up the change token did not confirm, the idle worker reads it again after
# these naps (seconds): a commit is announced at its first write, and on a loaded disk it
# may become visible only after confirm has given up (see core/sqlite/wake.py confirm).
RECHECKS = (0.25, 0.5, 1.0, 2.0)


@dataclass
class _Spell:
    """A condition that lasts until something succeeds again (the database unreachable, a
    disk full): each try backs off (0.1 s doubling to OUTAGE_BACKOFF), and the log says so
    once, then once per OUTAGE_LOG_EVERY (`still`), and once more when it ends (`over`),
    never once per try."""

    level: int
    still: str  # "... after %s: %s", the spell's length and the error
    over: str  # "... after %s", its length
    since: float | None = None  # (monotonic) when it began
    said: float = 0.0
    backoff: float = 0.0

    def met(self, exc: Exception) -> float:
        """It happened (again): say so if due; the seconds to wait before the next try."""
        now = time.monotonic()
        if self.since is None:
            self.since = self.said = now
            log.log(self.level, "%s; retrying with backoff", exc)
        elif now - self.said >= OUTAGE_LOG_EVERY:
            self.said = now
            log.log(self.level, self.still, duration(int(now - self.since)), exc)
        self.backoff = min(max(self.backoff * 2, 0.1), OUTAGE_BACKOFF)
        return self.backoff

    def end(self) -> None:
        if self.since is not None:
            log.warning(self.over, duration(int(time.monotonic() - self.since)))
            self.since = None
        self.backoff = 0.0


class HeldBack:
    """A reader of another process that keeps the store from cleaning up after its writes
    (`Inbox.held_back`), in the log: looked at once per HELD_BACK_LOOK_EVERY, a warning when
    it begins, again once per HELD_BACK_SAY_EVERY while it lasts (it grows slowly), and a
    line when it ends."""

    def __init__(self, logger: logging.Logger = log, prefix: str = "") -> None:
        self.log, self.prefix = logger, prefix
        self.due = 0.0  # (monotonic) when the next look is due
        self.said = 0.0  # (monotonic) when it was last said
        self.holding = False

    async def look(self, ask: Callable[[], Awaitable[str | None]]) -> None:
        now = time.monotonic()
        if now < self.due:
            return
        self.due = now + HELD_BACK_LOOK_EVERY
        try:
            why = await ask()
        except InboxError:
            return  # a store that cannot answer now: the worker's own steps say why
        if why is None:
            if self.holding:
                self.holding = False
                self.log.warning("%scleanup is no longer held back", self.prefix)
        elif not self.holding or now - self.said >= HELD_BACK_SAY_EVERY:
            self.holding, self.said = True, now
            self.log.warning("%scleanup held back: %s", self.prefix, why)


class _NamesTheInbox(logging.Filter):
    """Starts each line of the worker's log with "inbox NAME: " while SERVING names one: a
    fleet's "run 7 finished" must say whose run it was."""

    def filter(self, record: logging.LogRecord) -> bool:
        name = SERVING.get()
        if name is not None:
            prefix = f"inbox {name}: "
            # With arguments the message is a %-format: a % in the name must stay a %.
            record.msg = (prefix.replace("%", "%%") if record.args else prefix) + str(record.msg)
        return True


log.addFilter(_NamesTheInbox())


def ctx_run_id(batch: list[Event]) -> int | None:
    return next((e.run_id for e in batch if e.run_id), None)


class AgentWedged(RuntimeError):
    """An abandoned run's code was still running `grace` seconds later (it swallowed the
    cancellation, or its thread is blocked in a call): nothing in this process can stop it.
    The worker released its lease before raising this; end the process, and the next
    generation recovers the run as a lost claim."""


class _AgentExited(Exception):
    """Carries a BaseException the agent raised (SystemExit, KeyboardInterrupt,
    GeneratorExit) out of its task as a failure of the run: raised as itself it would stop
    the event loop, and with it the worker, leaving the run `running`."""

    def __init__(self, raised: BaseException) -> None:
        super().__init__(str(raised))
        self.raised = raised


def _being_closed() -> bool:
    """True when a coroutine runs outside any event loop: it is being closed (garbage
    collected), so a GeneratorExit there is Python's, not something the agent raised."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return True
    return False


def default_holder() -> str:
    """A holder name unique to this process: host:pid."""
    return f"{socket.gethostname()}:{os.getpid()}"


def _seconds(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


@dataclass
class WorkerStats:
    """What one worker did, for logs, tests and the CLI's exit line."""

    runs: int = 0
    done: int = 0
    failed: int = 0  # the agent raised: finished with error=
    abandoned: int = 0  # lease lost, over budget, or stopped mid-run: not finished
    refused: int = 0  # finish refused by the fence
    sent: int = 0  # messages dispatched
    busy: int = 0  # steps skipped because the database stayed locked
    idle: int = 0  # times it found nothing to run and went to sleep
    generations: list[int] = field(default_factory=list)


class Worker:
    """One worker process's loop over one inbox. See the module docstring."""

    def __init__(
        self,
        inbox: Inbox,
        agent: Agent,
        *,
        holder: str | None = None,
        send: SendFn | None = None,
        poll_interval: float = 0.5,
        grace: float = 10.0,
        setup: Callable[[Inbox], Any] | None = None,
        max_runs: int | None = None,
        metrics: Any = None,
        on_stuck: Callable[[str], None] | None = None,
        loop_writes: bool = True,
    ) -> None:
        if not callable(agent):
            raise BadInput("agent must be callable: async def agent(batch, ctx)")
        if not _seconds(poll_interval) or not 0 < poll_interval < math.inf:  # NaN too
            raise BadInput(
                f"poll_interval must be a positive number of seconds, got {show(poll_interval)}"
            )
        if not _seconds(grace) or not 0 <= grace < math.inf:
            raise BadInput(f"grace must be a number of seconds, got {show(grace)}")
        if max_runs is not None and (
            isinstance(max_runs, bool) or not isinstance(max_runs, int) or max_runs < 1
        ):
            raise BadInput(f"max_runs must be a positive integer or None, got {show(max_runs)}")
        if holder is not None and (
            not isinstance(holder, str)
            or not holder
            or len(holder) > 1024
            or not holder.isprintable()
        ):
            raise BadInput(f"holder must be a short printable name, got {show(holder)}")
        if send is not None and not callable(send):
            raise BadInput("send must be callable (or None)")
        if setup is not None and not callable(setup):
            raise BadInput("setup must be callable (or None)")
        if on_stuck is not None and not callable(on_stuck):
            raise BadInput("on_stuck must be callable (or None)")
        checks.flag("loop_writes", loop_writes)
        self.inbox = inbox
        self.agent = agent
        self.holder = holder or default_holder()
        self.send = send
        self.poll_interval = poll_interval
        self.grace = grace
        self.setup = setup
        self.max_runs = max_runs
        # core.metrics.WorkerMetrics (or None): counts runs, outcomes, durations, claim latency
        self.metrics = metrics
        # Called (from another thread) with the reason when the event loop stays blocked past
        # the lease TTL plus the grace; the command line ends the process there.
        self.on_stuck = on_stuck
        # Its claims, finishes and lone ingests commit on its own loop's thread where safe
        # and quick (Inbox.loop_writes): False for a loop that must never wait for a disk
        # or a server.
        self.loop_writes = loop_writes
        self.stats = WorkerStats()
        self.gen: int | None = None
        # When the lease is next renewed: a monotonic instant (a step of the wall clock moves
        # nothing), and the expiry the last renewal wrote, on the inbox's clock.
        self._renew_mono = 0.0
        self._until = 0
        self._given_up: int | None = None  # a generation to hand back (a claim's fate unknown)
        # Until an inbox call answers again: the database does not answer (_lost)...
        self._outage = _Spell(
            logging.WARNING,
            "still cannot reach the database after %s: %s",
            "the database answers again after %s",
        )
        # ... and until a write commits again: a write was refused, for want of room on
        # the disk or by a server that stopped taking writes (_refused).
        self._full = _Spell(
            logging.ERROR,
            "writes still refused after %s: %s",
            "the inbox takes writes again after %s",
        )
        self._main: asyncio.Task[Any] | None = None  # run()'s task, while it runs
        self._deadline: asyncio.TimerHandle | None = None
        self._forced_out = False  # run() was cancelled by _stop_now
        self._recover_at: int | None = None  # an abandoned over-budget run becomes claimable
        self._more_timers = False  # the last claim fired a slice of a storm: more are due
        # The next batch, claimed by the last run's finish in its own transaction: (the
        # generation, the inbox's clock as it claimed, the change mark, the events).
        self._ahead: tuple[int, int, tuple[int, int] | None, list[Event]] | None = None
        self._waiting_for: tuple[str, int] | None = None  # the other holder last logged
        self._held_logged: int | None = None  # the paced send a "reply held" line named
        self._beat_due = 0.0  # (monotonic) when this process next records its heartbeat
        self._held_back = HeldBack()
        self._stop = asyncio.Event()
        self._stop_waiter: asyncio.Task[Any] | None = None  # _stop_wait's, while run() runs
        self._force = asyncio.Event()
        self._watch: LoopWatch | None = None  # the loop's, while run() runs
        # Writes the runs' transcripts and spends, off the loop (core/runtime/transcript.py).
        self.transcripts = TranscriptWriter(inbox)

    @property
    def clock(self) -> Clock:
        return self.inbox.clock

    def request_stop(self, force: bool = False) -> None:
        """Stop after the current run (or abandon it now with force=True); then release.

        Bounded whatever the database does: if run() has not returned 2 × grace + STOP_SLACK
        seconds after the first request (a server that stopped answering holds an inbox call
        for ever), it is cancelled where it waits, and the lease is left to lapse."""
        if self._stop.is_set():
            force = True  # a second request means now
        self._stop.set()
        if force:
            self._force.set()
        if self._main is not None and self._deadline is None:
            loop = self._main.get_loop()
            self._deadline = loop.call_later(2 * self.grace + STOP_SLACK, self._stop_now)

    def _stop_now(self) -> None:
        main = self._main
        if main is not None and not main.done():
            log.warning(
                "still running %g s after being asked to stop (the database does not answer?): "
                "stopping now; the lease is left to lapse",
                2 * self.grace + STOP_SLACK,
            )
            self._forced_out = True
            main.cancel()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def _stop_wait(self) -> asyncio.Task[Any]:
        """A task done once a stop is requested: one for every run and nap until then (a task
        made and cancelled per run costs more loop turns than a no-op run's own work).
        run() cancels it when it returns."""
        waiter = self._stop_waiter
        if waiter is None:
            waiter = self._stop_waiter = asyncio.ensure_future(self._stop.wait())
        return waiter

    # --- the loop -------------------------------------------------------------------------

    async def run(self) -> WorkerStats:
        """Run until request_stop (or max_runs); release the lease; return the stats.

        Raises AgentWedged (after releasing the lease) when an abandoned run's code would not
        end: the process must end to stop it."""
        if self.setup is not None:
            outcome = self.setup(self.inbox)
            if inspect.isawaitable(outcome):
                await outcome
        self._main, self._forced_out = asyncio.current_task(), False
        watch = self._watch = LoopWatch.of(asyncio.get_running_loop())
        self._watch_loop(watch)
        capture_logging()
        self.transcripts.start()
        loop_writes, self.inbox.loop_writes = self.inbox.loop_writes, self.loop_writes
        log.log(
            self.start_level,
            "worker %s started on %s (%s)",
            self.holder,
            self.inbox.path,
            f"woken by {getattr(self.inbox.wake, 'source', 'file notification')}"
            if self.inbox.wake.watching
            else f"polling for changes every {self.poll_interval:g} s",
        )
        try:
            # A batch the last finish claimed (_finish) is run even if a stop came meanwhile:
            # it is this worker's, as a run in progress is.
            while not self.stopping or self._ahead is not None:
                if self._ahead is not None and self._ahead[0] != self.gen:
                    self._ahead = None  # its generation was lost: a successor recovers it
                    continue
                self._check_file()
                await self._heartbeat()
                if self.looks_held_back and time.monotonic() >= self._held_back.due:
                    await self._held_back.look(self.inbox.held_back)  # once a minute
                if not await self._hold_lease():
                    if self.stopping:
                        # Stopping, and the lease cannot be held now (a locked database):
                        # the batch claimed ahead is left to the successor's recovery.
                        self._ahead = None
                    continue
                claimed_at, before_claim, batch = await self._claim()
                if batch:
                    await self._run(batch)
                    await self._dispatch()
                    if self.max_runs is not None and self.stats.runs >= self.max_runs:
                        break
                    continue
                await self._dispatch()
                if self._more_timers:
                    continue  # a storm of due timers: its next slice (after a pause) at once
                if batch is not None:  # None: the claim hit a locked database, retry soon
                    await self._idle(claimed_at, before_claim)
                else:
                    await self._sleep(self.poll_interval)
        except asyncio.CancelledError:
            if not self._forced_out:
                raise
        finally:
            if self._stop_waiter is not None:
                self._stop_waiter.cancel()
                self._stop_waiter = None
            watch.leave(self)
            self.inbox.loop_writes = loop_writes
            await self.transcripts.close(TRANSCRIPT_FLUSH)
            await self._release()
            if not self._forced_out:  # forced out: the database does not answer, let it age
                await self._leave()
            if self._deadline is not None:
                self._deadline.cancel()
            self._main = None
        log.debug("worker %s stopped: %s", self.holder, self.stats)
        return self.stats

    # What the claim's own transaction does before it claims (Inbox.claim_next): fire due
    # timers (their events join the claim), read the settings (an operator's configure
    # applies from the next run) and the change token. A subclass that reads its change
    # mark its own way says so (core/runtime/fleet_worker.py).
    marks_in_claim = True
    # How its start and each lease it takes are logged: a fleet's visits say them only at
    # debug level (one visit per inbox served, two lines each, would bury its runs).
    start_level = logging.INFO
    # Whether a worker without the lease reads who holds it before it asks for it: a
    # standby's wake-up then costs a read only (a fleet's visit was sent by a look that
    # found the lease free, and asks at once).
    looks_before_acquiring = True
    # Whether it looks, now and then, for a reader of another process that holds back the
    # store's cleanup (HeldBack); a fleet looks once for its whole database, not per visit.
    looks_held_back = True

    def _fires_timers(self) -> bool:
        """Whether this claim fires due timers (a subclass may do it less often)."""
        return True

    def _fires_timers_ahead(self) -> bool:
        """Whether a finish's claim of the next run fires due timers. One that does not,
        and finds nothing to run, is not taken as the loop's claim when the loop's would
        fire them (`_claim_fires_timers`), unless it read that none is due
        (`Claimed.timers_due`): the loop claims again, so a timer due is never left
        waiting on an idle worker."""
        return self._fires_timers()

    def _claim_fires_timers(self) -> bool:
        """Whether the loop's claim, if made now, would fire due timers (no side effect)."""
        return True

    def _watch_loop(self, watch: LoopWatch) -> None:
        """(Re)state this worker's limits to the loop's watch: a stall is worth a warning
        past a quarter of the lease TTL (the renewal is due every third), and past the TTL
        plus the grace the lease has lapsed."""
        ttl = self.inbox.settings.lease_ttl
        watch.join(self, stall_after=ttl / 4, end_after=ttl + self.grace, on_stuck=self.on_stuck)

    def _check_file(self) -> None:
        """Stop (InboxError) if the path no longer names the file opened: every write from
        here on would go to a deleted or replaced file that no other process sees."""
        why = self.inbox.file_replaced()
        if why is None:
            return
        self.gen = None  # nothing to release: the lease lives in the file we lost
        log.error(
            "stopping: %s; this worker will not write to a file nobody else sees "
            "(start it again to serve the file now at that path)",
            why,
        )
        raise InboxError(f"worker stopped: {why}")

    async def _step(self, call: Callable[[], Awaitable[Any]]) -> Any:
        """One inbox call; a locked database is logged and skipped, never fatal; a lost
        connection is waited out (see _lost)."""
        try:
            result = await call()
        except ConnectionLost as exc:
            self.stats.busy += 1
            await self._lost(exc)
            return None
        except WritesRefused as exc:
            self.stats.busy += 1
            await self._refused(exc)
            return None
        except InboxBusy as exc:
            self.stats.busy += 1
            log.warning("%s", exc)
            return None
        self._reached()
        return result

    async def _lost(self, exc: ConnectionLost) -> None:
        """The database did not answer: back off instead of asking again at once, and say
        so once: a standby meeting a server that is down must neither spin nor flood."""
        await self._sleep(self._outage.met(exc))

    async def _refused(self, exc: WritesRefused) -> None:
        """A write was refused (nothing was written: no room on the inbox's disk, a server
        that stopped taking writes): the same, until a write commits (`_written`). Reads
        still answer meanwhile, so a read's success does not end it."""
        await self._sleep(self._full.met(exc))

    def _written(self) -> None:
        """A write committed: a full disk, if any, has room again."""
        self._full.end()

    def _reached(self) -> None:
        """An inbox call answered: an outage, if any, is over."""
        self._outage.end()

    async def _hold_lease(self) -> bool:
        """Renew the lease we hold, or take it; False (after waiting) if another holds it."""
        if self._given_up is not None and not await self._give_up():
            return False
        now = self.clock.now()
        held = self.gen
        if held is not None:
            if not self._renew_due():
                return True
            renewed = await self._step(lambda: self._renew(held))
            if renewed:
                self._renewed()
                self._written()
                return True
            if renewed is None:  # busy: keep the generation, the fence decides later
                await self._sleep(self.poll_interval)
                return False
            log.warning("lease generation %s lost (renewal refused)", self.gen)
            self.gen = None
        lease = await self._step(self.inbox.lease_info) if self.looks_before_acquiring else None
        if lease is not None and lease.until >= now:
            mine = lease.gen
            if lease.holder == self.holder and mine in self.stats.generations:
                # A generation this worker took, still live: take it up again, fenced.
                if await self._step(lambda: self._renew(mine)):
                    self.gen = mine
                    self._renewed()
                    return True
                return False
            # Held by another: acquire would refuse. A standby's wake-up costs a read only.
            await self._wait_for(lease)
            return False
        # Fresh: only a free or expired lease, decided in one transaction. The read above
        # is only a cheap look: another process under this same holder name may take the
        # lease between the two, and must not share its generation with us.
        gen = await self._step(lambda: self.inbox.acquire(self.holder, fresh=True))
        if gen is None:  # taken meanwhile, or the database stayed locked
            lease = await self._step(self.inbox.lease_info)
            if lease is not None:
                await self._wait_for(lease)
            return False
        if gen not in self.stats.generations:
            self.stats.generations.append(gen)
            log.log(self.start_level, "lease acquired: generation %s", gen)
        self.gen = gen
        self._renewed()
        self._written()
        return True

    def _renew_period(self) -> int:
        return max(1, self.inbox.settings.lease_ttl // 3)

    def _renewed(self) -> None:
        """The lease was just taken or renewed: the next renewal is a third of the TTL away
        on the monotonic clock."""
        self._renew_mono = time.monotonic() + self._renew_period()
        self._until = self.clock.now() + self.inbox.settings.lease_ttl

    def _renew_due(self) -> bool:
        """Time to renew: a third of the TTL since the last renewal, measured on this
        process's monotonic clock, so that a step of the wall clock neither hurries nor
        delays it; or sooner when the inbox's clock says two thirds of the lease are gone
        (the wall clock stepped forward, or the server's moved): a lease that looks lapsed
        to other processes is renewed at once (a lapsed lease nobody took over is renewed by
        its holder: docs/rules.md#lease-and-fencing), never given up for a clock's step."""
        if time.monotonic() >= self._renew_mono:
            return True
        return self.clock.now() >= self._until - self._renew_period()

    async def _give_up(self) -> bool:
        """Hand back a generation whose claim's outcome is unknown (its answer lost): the
        claim may have committed, and its events would stay 'running' under a generation
        that no claim of its own recovers. The next generation recovers them (at once: a
        handed-back lease is taken over without waiting out the TTL). False while the
        database does not answer (the loop comes back)."""
        gen = self._given_up
        assert gen is not None
        released = await self._step(lambda: self.inbox.release(self.holder, gen))
        if released is None:
            return False
        log.warning(
            "lease generation %s handed back: its last claim's outcome is unknown (the "
            "connection was lost); the next generation recovers what it may have claimed",
            gen,
        )
        self._given_up = None
        if gen in self.stats.generations:
            self.stats.generations.remove(gen)  # never taken up again
        return True

    async def _wait_for(self, lease: Lease) -> None:
        """Wait until another holder's lease lapses, or anyone commits; say so once."""
        if self.stopping:
            return
        seen = (lease.holder, lease.gen)
        if lease.holder == self.holder:
            # Our name, not our process: a predecessor under the same holder name, or a
            # process started under it at the same moment. Adopting its generation would
            # run beside it (or keep its stuck claims 'running'); wait for a takeover.
            log.log(
                logging.WARNING if seen != self._waiting_for else logging.DEBUG,
                "lease gen %s is held under this holder name by another process; "
                "waiting for it to expire",
                lease.gen,
            )
        else:
            log.log(
                logging.INFO if seen != self._waiting_for else logging.DEBUG,
                "lease held by %s (gen %s) until %s; waiting",
                lease.holder,
                lease.gen,
                lease.until,
            )
        self._waiting_for = seen
        await self._idle_until(lease.until + 1, renew=False)

    async def _claim(self) -> tuple[int, tuple[int, int] | None, list[Event] | None]:
        """The inbox's clock as the claim began; the change mark, read before the claim (a
        commit that lands after an empty claim, before the nap, must still count as news);
        and the claimed batch: [] for nothing to run, None when the claim hit a locked
        database (retry soon)."""
        ahead, self._ahead = self._ahead, None
        if ahead is not None:  # the loop checked it is this generation's
            return ahead[1], ahead[2], ahead[3]
        if self._more_timers:
            # Between two slices of a storm of due timers, a pause in which another
            # process waiting to write gets the lock (scheduler.PAUSE_SECONDS).
            await asyncio.sleep(scheduler.PAUSE_SECONDS)
        self._more_timers = False
        at = self.clock.now()
        mark = None if self.marks_in_claim else await self._change_mark()
        if self._recover_at is not None and self.clock.now() < self._recover_at:
            # Waiting out an abandoned run: nothing is claimed, but timers still fire.
            if self._fires_timers():
                await self._step(self.inbox.run_scheduler)
            return at, (await self._change_mark() if mark is None else mark), []
        self._recover_at = None
        gen = self.gen
        assert gen is not None  # the loop claims right after _hold_lease took or renewed it
        try:
            claimed = await self.inbox.claim_next(
                self.holder, gen, fire_timers=self._fires_timers(), mark=self.marks_in_claim
            )
        except ConnectionLost as exc:
            self.stats.busy += 1
            self.gen, self._given_up = None, gen  # see _give_up
            await self._lost(exc)
            return at, mark, None
        except WritesRefused as exc:
            self.stats.busy += 1
            await self._refused(exc)
            return at, mark, None
        except InboxBusy as exc:
            self.stats.busy += 1
            log.warning("%s", exc)
            return at, mark, None
        self._reached()
        if claimed.events:
            self._written()
        self._more_timers = claimed.more_timers
        return at, (claimed.token if self.marks_in_claim else mark), claimed.events

    async def _run(self, batch: list[Event]) -> None:
        """Call the agent on one claimed batch and commit its outcome (or abandon it)."""
        self.stats.runs += 1
        started = time.monotonic()
        if self.metrics is not None:
            self.metrics.claimed(batch, self.clock.now())
        ids = [e.id for e in batch]
        gen = self.gen
        assert gen is not None  # the batch was claimed under it
        claimed_at = batch[0].claimed_at or self.clock.now()
        budget = self.inbox.settings.max_run_seconds
        run_id = ctx_run_id(batch)
        limit = self.inbox.settings.max_transcript_chars
        transcript = None if run_id is None else self.transcripts.open(run_id, limit)
        ctx = RunContext(
            self.inbox, self.holder, gen, batch, asyncio.get_running_loop(), transcript
        )
        log.info("run %s: events %s (gen %s)", ctx.run_id, ids, gen)
        task = asyncio.create_task(self._call_agent(batch, ctx))
        if self._watch is not None:
            self._watch_loop(self._watch)  # the lease TTL may have changed since
            self._watch.label(task, f"run {ctx.run_id} (events {ids}, gen {gen})")
        abandon_why: str | None = None
        stop_seen: float | None = None
        stop_wait = self._stop_wait()
        try:
            # One turn of the loop first: the agent's first step runs in it, and a run that
            # ends there (one that awaits nothing slow) needs no wait set up around it.
            await asyncio.sleep(0)
            while not task.done():
                await asyncio.wait(
                    {task} if stop_wait.done() else {task, stop_wait},
                    timeout=min(self.poll_interval, 0.25),
                    return_when=asyncio.FIRST_COMPLETED,
                )
                if task.done():
                    break
                now = self.clock.now()
                if budget is not None and now >= claimed_at + budget:
                    abandon_why = f"exceeded max_run_seconds ({budget} s)"
                    self._recover_at = claimed_at + budget + 1
                elif self.stopping:
                    stop_seen = stop_seen if stop_seen is not None else time.monotonic()
                    if self._force.is_set() or time.monotonic() - stop_seen >= self.grace:
                        abandon_why = "stopping"
                elif self._renew_due():
                    renewed = await self._step(lambda: self._renew(gen))
                    if renewed is False:
                        abandon_why = "lease lost"
                        self.gen = None
                    elif renewed:
                        self._renewed()
                if abandon_why is not None:
                    break
        finally:
            if not task.done() and abandon_why is None:
                # The worker itself was cancelled: its run must not go on.
                ctx.close("the worker was cancelled")
                task.cancel()
        if abandon_why is not None:  # given up while the agent's code still ran
            ctx.close(abandon_why)
            task.cancel()
            self._abandoned(ctx, ids, abandon_why, started)
            if not await self._let_go(task, ctx):
                self._wedged(task, ctx, ids, abandon_why)
            return
        # An agent whose own code raised CancelledError ends a cancelled task: a failure.
        error: BaseException | None = (
            asyncio.CancelledError("the agent's run was cancelled")
            if task.cancelled()
            else task.exception()
        )
        if isinstance(error, _AgentExited):
            error = error.raised  # recorded as what the agent raised: "SystemExit: 0"
        if isinstance(error, (LeaseLost, RunAbandoned)):
            self.gen = None
            ctx.close("lease lost")
            self._abandoned(ctx, ids, "lease lost", started)
            return
        ctx.close("finished")
        await self._flush_transcript(ctx)
        if error is None:
            await self._finish(ctx, ids, error=None)
        else:
            self.stats.failed += 1
            # Escaped: the agent's message may hold a NUL or a lone surrogate, which the
            # inbox refuses to store, and it will be shown on terminals.
            text = printable(f"{type(error).__name__}: {error}", keep="\n\t")
            # An isolated agent's error carries its traceback from its own process.
            remote = getattr(error, "remote_trace", None)
            trace = printable(remote or "".join(tb.format_exception(error)), keep="\n\t")
            log.warning("run %s: agent raised %s\n%s", ctx.run_id, text, trace.rstrip())
            await self._finish(ctx, ids, error=text, trace=trace)
        if self.metrics is not None:
            self.metrics.ended("done" if error is None else "failed", time.monotonic() - started)

    async def _flush_transcript(self, ctx: RunContext) -> None:
        """Have the run's transcript stored before its outcome, so that whoever sees the
        outcome (`onwatch logs --follow`, the desk) has every line the run logged before
        it; bounded, so a locked database delays the finish by at most TRANSCRIPT_FLUSH."""
        if ctx.transcript is not None and not await self.transcripts.flush(
            ctx.transcript, TRANSCRIPT_FLUSH
        ):
            log.warning(
                "run %s: its transcript is not all written yet; finishing anyway (the "
                "rest follows when the inbox takes it)",
                ctx.run_id,
            )

    def _abandoned(self, ctx: RunContext, ids: list[int], why: str, started: float) -> None:
        self.stats.abandoned += 1
        log.warning("run %s abandoned (%s): events %s left for recovery", ctx.run_id, why, ids)
        if self.metrics is not None:
            self.metrics.ended("abandoned", time.monotonic() - started)

    async def _let_go(self, task: asyncio.Task[None], ctx: RunContext) -> bool:
        """Give an abandoned run's code `grace` seconds to end: its task, cancelled, to
        return, and its threads (a plain def, a perform's plain function) to come back.
        True once it has ended; False if it still runs then, or at a second stop request.
        The lease is renewed meanwhile while this worker still holds it."""
        deadline = time.monotonic() + self.grace

        def ended() -> bool:
            return task.done() and not any(t.is_alive() for t in ctx.threads)

        while not ended():
            pause = max(0.0, min(0.02, deadline - time.monotonic()))
            if task.done():
                await asyncio.sleep(pause)  # a thread: nothing to await, look again soon
            else:
                await asyncio.wait({task}, timeout=pause)
            if time.monotonic() >= deadline or self._force.is_set():
                return ended()
            gen = self.gen
            if gen is not None and self._renew_due():
                renewed = await self._step(functools.partial(self.inbox.renew, self.holder, gen))
                if renewed is False:
                    self.gen = None
                elif renewed:
                    self._renewed()
        return True

    def _wedged(self, task: asyncio.Task[None], ctx: RunContext, ids: list[int], why: str) -> None:
        """Raise AgentWedged for code that outlived its grace, saying what it is."""
        threads = [t.name for t in ctx.threads if t.is_alive()]
        what = []
        if not task.done():
            what.append("its task did not end when cancelled (it swallows CancelledError?)")
        if threads:
            what.append(f"its thread(s) {', '.join(threads)} are still in a call")
        message = (
            f"run {ctx.run_id} (events {ids}) was abandoned ({why}) and its code is still "
            f"running {self.grace:g} s later: {'; '.join(what)}. Nothing in this process "
            f"can stop it: the worker releases the lease and must end; the next generation "
            f"recovers the run"
        )
        log.error("%s", message)
        raise AgentWedged(message)

    async def _call_agent(self, batch: list[Event], ctx: RunContext) -> None:
        # This task's context is the run's: logging records emitted by the agent's code (in
        # this task, the tasks it starts, its thread) belong to its transcript.
        run_log.set(ctx.transcript)
        try:
            if _is_async(self.agent):
                outcome = self.agent(batch, ctx)
            else:
                # A plain def runs in a thread of its own, so the loop keeps renewing the
                # lease meanwhile, and a call stuck past the budget holds no thread another
                # run needs (core/runtime/threads.py).
                thread, done = start_thread(
                    self.agent, batch, ctx, name=f"onwatch-run-{ctx.run_id}"
                )
                ctx.threads.append(thread)
                outcome = await done
            if inspect.isawaitable(outcome):
                await outcome
        except GeneratorExit as exc:
            if _being_closed():
                raise  # this coroutine itself is closed (a task destroyed), not the agent's doing
            raise _AgentExited(exc) from exc
        except (KeyboardInterrupt, SystemExit) as exc:
            raise _AgentExited(exc) from exc

    def _may_claim_ahead(self) -> bool:
        """Whether a finish may claim the next run in its own transaction: the worker goes
        on to another run (no stop asked, runs left), nothing waits to be recovered first,
        and the lease needs no renewal before it (the loop renews it, then claims)."""
        return (
            not self.stopping
            and (self.max_runs is None or self.stats.runs < self.max_runs)
            and self._recover_at is None
            and self._given_up is None
            and not self._renew_due()
        )

    async def _finish(
        self, ctx: RunContext, ids: list[int], *, error: str | None, trace: str | None = None
    ) -> None:
        """One fenced finish, which also claims the next run when it may (_may_claim_ahead);
        a locked database is retried while the lease can still hold."""
        unknown = False  # a finish that also claimed lost its answer: the claim's fate unknown
        while True:
            ahead = not unknown and self._may_claim_ahead()
            fired = ahead and self._fires_timers_ahead()
            at = self.clock.now()
            mark = None if self.marks_in_claim or not ahead else await self._change_mark()
            outcome: dict[str, Any] = (
                {
                    "messages": ctx.messages,
                    "result": ctx.result,
                    "approvals": ctx.approvals,
                    "timers": ctx.timers,
                }
                if error is None
                else {"error": error[:4000], "traceback": trace}
            )
            claimed = None
            try:
                try:
                    if ahead:
                        accepted, claimed = await self.inbox.finish_and_claim(
                            self.holder,
                            ctx.gen,
                            ids,
                            run=ctx.run_id,
                            fire_timers=fired,
                            mark=self.marks_in_claim,
                            **outcome,
                        )
                    else:
                        accepted = await self.inbox.finish(
                            self.holder, ctx.gen, ids, run=ctx.run_id, **outcome
                        )
                except BadInput as exc:  # e.g. over the follow-up budget: a failed run
                    if error is not None:
                        raise
                    self.stats.failed += 1
                    log.warning("run %s: outcome refused: %s", ctx.run_id, exc)
                    error = f"BadInput: {exc}"
                    continue
            except InboxBusy as exc:
                unknown = unknown or (ahead and isinstance(exc, ConnectionLost))
                self.stats.busy += 1
                lease = await self._step(self.inbox.lease_info)
                if lease is not None and (lease.gen != ctx.gen or lease.until < self.clock.now()):
                    log.warning("run %s: %s; lease gone meanwhile, run abandoned", ctx.run_id, exc)
                    self.stats.abandoned += 1
                    return
                if isinstance(exc, WritesRefused):
                    await self._refused(exc)  # said once, not at every try
                    continue
                log.warning("run %s: %s; retrying the finish", ctx.run_id, exc)
                await self._sleep(min(self.poll_interval, 0.5))
                continue
            break
        if claimed is not None and (
            claimed.events
            or fired
            or not self._claim_fires_timers()
            or claimed.timers_due is False  # the loop's claim would fire none either
        ):
            self._more_timers = claimed.more_timers
            token = claimed.token if self.marks_in_claim else mark
            self._ahead = (ctx.gen, at, token, claimed.events)
        if accepted and unknown:
            # A finish that also claimed, cut off: if that attempt committed, its claim's
            # events are running under this generation, which no claim of its own
            # recovers. Handed back, the next generation recovers them (see _give_up).
            self.gen, self._given_up = None, ctx.gen
        if accepted:
            self._written()
            if error is None:
                self.stats.done += 1
            log.info("run %s finished: %s", ctx.run_id, "done" if error is None else error)
            if error is not None:
                await self._log_dead(ids)
        else:
            self.stats.refused += 1
            self.gen = None
            log.warning(
                "run %s: finish refused (generation %s no longer holds the lease)",
                ctx.run_id,
                ctx.gen,
            )

    async def _log_dead(self, ids: list[int]) -> None:
        """Say in the log which events of a failed run went dead, and why."""
        for event_id in ids:
            event = await self._step(lambda: self.inbox.get_event(event_id))  # noqa: B023 - called within this iteration
            if event is not None and event.status == "dead":
                log.warning(
                    "event #%s (%s / %s) is dead: %s",
                    event.id,
                    printable(event.source),
                    printable(event.source_id),
                    printable(event.error or "no reason recorded"),
                )

    async def _dispatch(self) -> None:
        if self.send is None:
            return
        sent = await self._step(lambda: self.inbox.dispatch(self._send))
        if sent:
            self.stats.sent += sent
            self._held_logged = None
            log.info("dispatched %s message(s)", sent)
        elif sent == 0:
            await self._log_held()

    async def _log_held(self) -> None:
        """A reply that waits says why, once per pacing window (not on every idle pass)."""
        next_send = await self._step(self.inbox.next_send_at)
        now = self.clock.now()
        if next_send is None or next_send == self._held_logged:
            return
        self._held_logged = next_send
        overview = await self._step(self.inbox.overview)
        if overview is not None and overview.outbox_held:
            log.info(
                "reply held: the outbox is held by an operator (onwatch release TARGET lets it go)"
            )
        elif next_send > now:
            log.info(
                "reply held: next paced send in %s (outbox_gap %s s; urgent replies skip the gap)",
                duration(next_send - now),
                self.inbox.settings.outbox_gap,
            )

    async def _send(self, text: str) -> None:
        """The channel, its failures logged: dispatch records them and returns 0, which
        alone would leave a broken channel silent in the worker's log."""
        send = self.send
        assert send is not None  # only called to dispatch with a channel
        try:
            outcome = send(text)
            if inspect.isawaitable(outcome):
                await outcome
        except Exception as exc:
            log.warning(
                "delivery %s failed: %s",
                getattr(text, "key", "?"),
                printable(f"{type(exc).__name__}: {exc}"),
            )
            raise

    async def _heartbeat(self) -> None:
        """Record this process (host, pid) in the inbox every third of the lease TTL, so the
        desk and `onwatch status` can say who watches: standing by, on its own; holding the
        lease, with each renewal, in its transaction (`_renew`: one commit, not two)."""
        if self.gen is not None or time.monotonic() < self._beat_due:
            return
        self._beat_due = time.monotonic() + self._renew_period()
        host, pid = _whoami()
        await self._step(lambda: self.inbox.worker_seen(self.holder, host=host, pid=pid))

    async def _renew(self, gen: int) -> bool:
        """Renew this generation's lease, this process's heartbeat in the same commit."""
        self._beat_due = time.monotonic() + self._renew_period()
        host, pid = _whoami()
        return await self.inbox.renew(self.holder, gen, host=host, pid=pid)

    async def _leave(self) -> None:
        """No longer standing by: remove this process's heartbeat (bounded; a database that
        does not answer leaves it to age, and the desk calls it gone)."""
        try:
            await asyncio.wait_for(self.inbox.worker_gone(self.holder), timeout=STOP_SLACK)
        except (InboxError, asyncio.TimeoutError) as exc:
            log.debug("could not remove this worker's heartbeat: %s", exc)
        except asyncio.CancelledError:
            # Cut short by the stop deadline (_stop_now), or the call's own job cancelled by a
            # bounded close: either way the heartbeat is left to age and the stop goes on. A
            # cancel of this task from anywhere else goes on up.
            task = asyncio.current_task()
            if task is not None and task.cancelling() and not self._forced_out:
                raise
            if task is not None and self._forced_out and task.cancelling():
                task.uncancel()
            log.debug("could not remove this worker's heartbeat: its connection was cut")

    async def _release(self) -> None:
        """Hand the lease back; bounded (a database that does not answer leaves it to lapse)."""
        gen = self.gen or self._given_up
        self.gen = self._given_up = None
        if gen is None:
            return
        try:
            released = await asyncio.wait_for(
                self.inbox.release(self.holder, gen), timeout=max(self.grace, 1.0) + STOP_SLACK
            )
            log.info("lease generation %s %s", gen, "released" if released else "was already gone")
        except InboxError as exc:
            log.warning("could not release the lease: %s", exc)
        except asyncio.TimeoutError:
            log.warning("could not release the lease: the database did not answer; it lapses")

    # --- sleeping -------------------------------------------------------------------------

    async def _idle(self, claimed_at: int, version: tuple[int, int] | None) -> None:
        """Sleep until the next wake-up, a lease renewal, or a commit since `version` (the
        change token read before the claim that found nothing)."""
        self.stats.idle += 1
        sends = self.send is not None  # a held reply is nothing to wake for without a channel
        wake = await self._step(lambda: self.inbox.next_wake(sends=sends))
        if wake is not None and wake <= claimed_at:
            # Already due when the claim found nothing to run (paused, the runs-per-day
            # budget, a held outbox): wait for a change rather than spin on it.
            wake = claimed_at + 1 if wake == claimed_at else None
        await self._idle_until(wake, renew=True, version=version)

    async def _change_mark(self) -> tuple[int, int] | None:
        try:
            return await self._changes()
        except InboxError:
            return None  # unknown: the nap's first look decides

    async def _changes(self) -> tuple[int, int]:
        """A value that moves when anyone commits: other connections (PRAGMA data_version)
        or other tasks sharing this process's Inbox (the connection's total_changes)."""
        return await self.inbox.change_token()

    async def _idle_until(
        self, wake: int | None, *, renew: bool, version: tuple[int, int] | None = None
    ) -> None:
        """Nap until `wake`, the renewal, or a commit the change token shows since `version`
        (read now when not given; when given, a token that moved since returns at once).
        The notifier's `seq` is taken here, before the token is compared, so a commit in
        between moves one or the other; our own writes since `version` (the dispatch) only
        cost one more pass of the loop."""
        notifier = self.inbox.wake
        seen = notifier.seq
        if version is None:
            version = await self._change_mark()
        elif await self._change_mark() != version:
            return  # a commit since the claim looked: its event may be runnable now
        checked = time.monotonic()
        rechecks: tuple[float, ...] = ()  # naps before the token is read again anyway
        while not self.stopping:
            now = self.clock.now()
            if wake is not None and now >= wake:
                return
            if renew and self._renew_due():
                return
            if self._recover_at is not None and now >= self._recover_at:
                return
            seconds = self._nap_seconds(wake, renew)
            woke = await self._nap(seen, min((seconds, *rechecks[:1])))
            seen = notifier.seq
            try:
                if woke:
                    changed = await notifier.confirm(
                        self._changes, version, self.inbox.settled_change_token
                    )
                    if changed:
                        return
                    if changed is None:
                        # Not visible yet, or nothing: the nap goes on, briefly, between reads.
                        rechecks = RECHECKS
                    continue
                if rechecks:
                    rechecks = rechecks[1:]
                elif notifier.watching and time.monotonic() - checked < max(
                    self.poll_interval, SLOW_POLL
                ):
                    continue  # the notifier would have said so; the poll is its insurance
                checked = time.monotonic()
                if await self._changes() != version:
                    return
            except InboxError:
                return
            if self.inbox.file_replaced() is not None:
                return  # the loop's next pass stops the worker and says why

    def _nap_seconds(self, wake: int | None, renew: bool) -> float:
        """How long an idle nap may last. Polling: poll_interval, as ever. Woken by the
        notifier on the system clock: until the next thing due (a wake-up, the renewal, a
        recovery), at most the slow poll; an injected clock may jump, so it keeps the poll."""
        if not (self.inbox.wake.watching and isinstance(self.clock, (SystemClock, BackendClock))):
            return self.poll_interval
        seconds = max(self.poll_interval, SLOW_POLL)
        now = self.clock.now()
        for due in (wake, self._recover_at):
            if due is not None:
                seconds = min(seconds, due - now)
        if renew:
            seconds = min(seconds, self._renew_mono - time.monotonic())
        return max(seconds, 0.001)

    async def _nap(self, seen: int, seconds: float) -> bool:
        """Sleep up to `seconds`; True if the notifier says the file may have changed
        (another process committed, or this process's Inbox did), False otherwise."""
        if self.stopping:
            return False
        waiting = asyncio.ensure_future(self.inbox.wake.wait(seen, seconds))
        try:
            await asyncio.wait({waiting, self._stop_wait()}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not waiting.done():
                waiting.cancel()
        return not waiting.cancelled() and waiting.done() and waiting.result()

    async def _sleep(self, seconds: float) -> None:
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._stop.wait(), timeout=seconds)


async def run_worker(
    path_or_inbox: str | os.PathLike[str] | Inbox,
    agent: Agent,
    *,
    holder: str | None = None,
    clock: Clock | None = None,
    stop: asyncio.Event | None = None,
    send: SendFn | None = None,
    poll_interval: float = 0.5,
    grace: float = 10.0,
    setup: Callable[[Inbox], Any] | None = None,
    max_runs: int | None = None,
    busy_timeout: float = 5.0,
) -> WorkerStats:
    """Run a worker until `stop` is set (or `max_runs` runs); return what it did.

    `path_or_inbox` is an open Inbox or the path of an existing inbox (NotAnInbox otherwise);
    a relative path is resolved once, here, so an agent that changes the working directory
    does not move the inbox. `send` is the outbox channel (plain or async callable taking the
    text); None leaves dispatching to another process. Raises only for errors that are not
    transient, and AgentWedged (see Worker.run).
    """
    if isinstance(path_or_inbox, Inbox):
        inbox, own = path_or_inbox, False
    else:
        # A worker of this release migrates an older inbox (refused while one of an
        # older release holds the lease: docs/rules.md#upgrading-a-running-deployment).
        inbox = await Inbox.open(
            resolved(path_or_inbox),
            clock=clock,
            create=False,
            busy_timeout=busy_timeout,
            migrate=True,
        )
        own = True
    watcher = None
    try:
        worker = Worker(
            inbox,
            agent,
            holder=holder,
            send=send,
            poll_interval=poll_interval,
            grace=grace,
            setup=setup,
            max_runs=max_runs,
        )
        if stop is not None:

            async def watch() -> None:
                await stop.wait()
                worker.request_stop()

            watcher = asyncio.create_task(watch())
        return await worker.run()
    finally:
        if watcher is not None:
            watcher.cancel()
        if own:
            await inbox.close()


def resolved(target: str | os.PathLike[str]) -> str | os.PathLike[str]:
    """A file path made absolute (resolved against today's working directory); anything
    else (a postgresql:// URL, a value Inbox.open will refuse) as it was."""
    if not isinstance(target, (str, os.PathLike)):
        return target
    try:
        text = os.fspath(target)
        if not isinstance(text, str) or not text or "\x00" in text or is_url(text):
            return target
        return os.path.abspath(text)
    except (TypeError, ValueError):
        return target


def _whoami() -> tuple[str, int]:
    """This process, as its heartbeat names it: (host, pid)."""
    return socket.gethostname() or "?", os.getpid()
