"""The worker runtime: holds the lease, runs the scheduler, claims, calls the agent, finishes.

    stats = await run_worker("alice.db", handle, holder="box-1", send=print)

One process runs one `Worker`. It takes the inbox's lease and renews it (fenced) well inside
the TTL; between runs it sleeps until the inbox's next wake-up or until another process
commits (a new event, an answer), noticed by a file notification (core/sqlite/wake.py) and
confirmed with `Inbox.change_token()`, one cheap call that reads no table; the token is also
polled as the fallback. Each run is: scheduler pass, claim, agent call, ONE fenced finish, then a
dispatch of the outbox. The agent never sees SQL: it gets the batch and a `RunContext`.

What can go wrong and what the runtime does:

- the agent raises: the run finishes with `error=` (backoff, attempts), the worker goes on;
- the agent runs past `settings.max_run_seconds`: the call is cancelled and the run abandoned
  (no finish); the next claim recovers it as a lost claim under the inbox's policy;
- the lease is lost (a renewal or an effect intent is refused): the run is abandoned, never
  finished; a successor's claim recovers it;
- another process keeps the database locked (`InboxBusy`): logged, retried at the next step;
- SIGTERM/SIGINT (`Worker.request_stop`): the current run may finish within `grace` seconds,
  otherwise it is abandoned; the lease is released so a successor can start at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import math
import os
import socket
import time
import traceback as tb
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Awaitable, Callable, Sequence

from .clock import Clock, SystemClock, check_time, show
from .errors import BadInput, InboxBusy, InboxError
from .humanize import duration
from .inbox import Inbox, SendFn
from .records import ApprovalRequest, Event, FollowUp, Lease, Reply
from .text import printable
from .connection import SLOW_POLL

log = logging.getLogger("onwatch.worker")

Agent = Callable[[list[Event], "RunContext"], Awaitable[None] | None]


class LeaseLost(InboxError):
    """This worker's lease generation was superseded; the run must stop and not finish."""


class RunAbandoned(InboxError):
    """The run was abandoned (lease lost, over budget, or stopping); its context is closed."""


def default_holder() -> str:
    """A holder name unique to this process: host:pid."""
    return f"{socket.gethostname()}:{os.getpid()}"


class RunContext:
    """What an agent gets with its batch: the only way a run affects the world.

    Replies, approval requests, follow-up timers and `result` are collected and committed by
    the runtime in one fenced finish when the agent returns; an agent that does none of these
    ends silently. External effects go through `effect()` / `perform()`, which journal the
    intent durably before the effect and its outcome after.
    """

    def __init__(
        self,
        inbox: Inbox,
        holder: str,
        gen: int,
        batch: Sequence[Event],
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        self._inbox = inbox
        self.holder = holder
        self.gen = gen
        self.batch = list(batch)
        self.run_id: int | None = next((e.run_id for e in batch if e.run_id), None)
        self.messages: list[Reply] = []
        self.approvals: list[ApprovalRequest] = []
        self.timers: list[FollowUp] = []
        self.result: Any = None
        self._loop = loop
        self._closed: str | None = None

    @property
    def now(self) -> int:
        """The inbox's clock, integer seconds."""
        return self._inbox.now()

    def _check_open(self) -> None:
        if self._closed is not None:
            raise RunAbandoned(f"this run was abandoned ({self._closed}); nothing more is kept")

    def reply(self, text: str, urgent: bool = False) -> None:
        """Queue a message; it reaches the outbox only if the run finishes."""
        self._check_open()
        if not isinstance(text, str) or not text:
            raise BadInput("a reply must be a non-empty string")
        self.messages.append(self._inbox._reply(Reply(text, bool(urgent))))

    def ask_approval(self, request_id: str, expires_in: int, action: str) -> None:
        """Ask a human; the answer (or expiry) comes back as event ('approval', request_id)."""
        self._check_open()
        self.approvals.append(
            self._inbox._approval_request(ApprovalRequest(request_id, expires_in, action))
        )

    def follow_up(
        self,
        timer_id: str,
        due: int,
        payload: Any = None,
        every: int | None = None,
        *,
        key: tuple[str, str] | None = None,
        catch_up: str = "coalesce",
    ) -> None:
        """Schedule a timer (committed with the finish; budget max_followups_per_run)."""
        self._check_open()
        # Checked now (BadInput here, in the agent's code, not at the finish); the finish
        # checks again what it commits.
        self._inbox._followup(
            FollowUp(timer_id, check_time(due, "due"), payload, every, key, catch_up)
        )
        self.timers.append(FollowUp(timer_id, due, payload, every, key, catch_up))

    @contextlib.asynccontextmanager
    async def effect(
        self,
        name: str,
        detail: Any = None,
        *,
        key: str | None = None,
        event: int | Event | None = None,
    ) -> AsyncIterator[str]:
        """Journal an external effect around its block; yields the idempotency key.

            async with ctx.effect("refund", {"amount": 5}) as key:
                await payments.refund(5, idempotency_key=key)

        The intent is committed (fenced) before the block runs: if this generation lost the
        lease, LeaseLost is raised and the block never runs. A block that completes marks the
        effect confirmed; one that raises an Exception marks it failed. A cancelled block (the
        run was abandoned) leaves it 'intended': the operator sees it may have happened.

        The default key is derived from the event the effect is for and its name, so a retry
        of that event (alone or batched differently) gets the same key. In a run of several
        events, say which one: `event=` (an Event or its id); BadInput otherwise.
        """
        self._check_open()
        if self.run_id is None:
            raise BadInput("this batch has no run id; effects need a claimed run")
        intended = await self._inbox.intend_effect(
            self.holder, self.gen, self.run_id, name, detail, key=key, event=event
        )
        if intended is None:
            raise LeaseLost(
                f"lease generation {self.gen} is no longer held; effect {name!r} was not performed"
            )
        try:
            yield intended
        except Exception:
            await _settle(self._inbox, intended, "failed")
            raise
        await _settle(self._inbox, intended, "confirmed")

    def perform(
        self,
        name: str,
        detail: Any,
        fn: Callable[[str], Any],
        *,
        key: str | None = None,
        event: int | Event | None = None,
    ) -> Any:
        """Journal and perform `fn(key)` (plain or async); return what it returned.

        From an async agent: `await ctx.perform(...)`. From a plain-def agent (which runs in a
        thread) call it without await: it blocks until the effect is settled.
        """

        async def run() -> Any:
            async with self.effect(name, detail, key=key, event=event) as idem:
                outcome = fn(idem)
                if inspect.isawaitable(outcome):
                    outcome = await outcome
                return outcome

        if _in_loop(self._loop):
            return run()
        return asyncio.run_coroutine_threadsafe(run(), self._loop).result()

    def close(self, why: str) -> None:
        self._closed = why


def _seconds(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _in_loop(loop: asyncio.AbstractEventLoop) -> bool:
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:
        return False


async def _settle(inbox: Inbox, key: str, state: str) -> None:
    for attempt in range(10):
        try:
            await inbox.settle_effect(key, state)
            return
        except InboxBusy as exc:
            log.warning("effect %s: could not record %s yet (%s); retrying", key, state, exc)
            await asyncio.sleep(0.2 * (attempt + 1))
    log.error("effect %s: outcome %s not recorded; the journal keeps it 'intended'", key, state)


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
        self.stats = WorkerStats()
        self.gen: int | None = None
        self._renew_at = 0
        self._recover_at: int | None = None  # an abandoned over-budget run becomes claimable
        self._waiting_for: tuple[str, int] | None = None  # the other holder last logged
        self._held_logged: int | None = None  # the paced send a "reply held" line named
        self._stop = asyncio.Event()
        self._force = asyncio.Event()

    @property
    def clock(self) -> Clock:
        return self.inbox.clock

    def request_stop(self, force: bool = False) -> None:
        """Stop after the current run (or abandon it now with force=True); then release."""
        if self._stop.is_set():
            force = True  # a second request means now
        self._stop.set()
        if force:
            self._force.set()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    # --- the loop -------------------------------------------------------------------------

    async def run(self) -> WorkerStats:
        """Run until request_stop (or max_runs); release the lease; return the stats."""
        if self.setup is not None:
            outcome = self.setup(self.inbox)
            if inspect.isawaitable(outcome):
                await outcome
        log.info(
            "worker %s started on %s (%s)",
            self.holder,
            self.inbox.path,
            f"woken by {getattr(self.inbox.wake, 'source', 'file notification')}"
            if self.inbox.wake.watching
            else f"polling for changes every {self.poll_interval:g} s",
        )
        try:
            while not self.stopping:
                self._check_file()
                if not await self._hold_lease():
                    continue
                await self._step(self.inbox.run_scheduler)
                await self._step(self.inbox.reload_settings)
                claimed_at = self.clock.now()
                # The change mark is read before the claim: a commit that lands after an
                # empty claim, before the nap, must still count as news.
                before_claim = await self._change_mark()
                batch = await self._claim()
                if batch:
                    await self._run(batch)
                    await self._dispatch()
                    if self.max_runs is not None and self.stats.runs >= self.max_runs:
                        break
                    continue
                await self._dispatch()
                if batch is not None:  # None: the claim hit a locked database, retry soon
                    await self._idle(claimed_at, before_claim)
                else:
                    await self._sleep(self.poll_interval)
        finally:
            await self._release()
        log.debug("worker %s stopped: %s", self.holder, self.stats)
        return self.stats

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
        """One inbox call; a locked database is logged and skipped, never fatal."""
        try:
            return await call()
        except InboxBusy as exc:
            self.stats.busy += 1
            log.warning("%s", exc)
            return None

    async def _hold_lease(self) -> bool:
        """Renew the lease we hold, or take it; False (after waiting) if another holds it."""
        now = self.clock.now()
        held = self.gen
        if held is not None:
            if now < self._renew_at:
                return True
            renewed = await self._step(lambda: self.inbox.renew(self.holder, held))
            if renewed:
                self._renew_at = now + self._renew_period()
                return True
            if renewed is None:  # busy: keep the generation, the fence decides later
                await self._sleep(self.poll_interval)
                return False
            log.warning("lease generation %s lost (renewal refused)", self.gen)
            self.gen = None
        lease = await self._step(self.inbox.lease_info)
        if (
            lease is not None
            and lease.until >= now
            and (lease.holder != self.holder or lease.gen not in self.stats.generations)
        ):
            # Held by another: acquire would refuse. A standby's wake-up costs a read only.
            await self._wait_for(lease)
            return False
        gen = await self._step(lambda: self.inbox.acquire(self.holder))
        if gen is None:  # taken meanwhile, or the database stayed locked
            lease = await self._step(self.inbox.lease_info)
            if lease is not None:
                await self._wait_for(lease)
            return False
        if gen not in self.stats.generations:
            self.stats.generations.append(gen)
            log.info("lease acquired: generation %s", gen)
        self.gen = gen
        self._renew_at = self.clock.now() + self._renew_period()
        return True

    def _renew_period(self) -> int:
        return max(1, self.inbox.settings.lease_ttl // 3)

    async def _wait_for(self, lease: Lease) -> None:
        """Wait until another holder's lease lapses, or anyone commits; say so once."""
        if self.stopping:
            return
        if lease.holder == self.holder:
            # Our name, not our process: a predecessor under the same holder name. Adopting
            # its generation would keep its stuck claims 'running'; wait for a takeover.
            log.warning(
                "lease gen %s is held under this holder name by an earlier process; "
                "waiting for it to expire",
                lease.gen,
            )
        else:
            seen = (lease.holder, lease.gen)
            log.log(
                logging.INFO if seen != self._waiting_for else logging.DEBUG,
                "lease held by %s (gen %s) until %s; waiting",
                lease.holder,
                lease.gen,
                lease.until,
            )
            self._waiting_for = seen
        await self._idle_until(lease.until + 1, renew=False)

    async def _claim(self) -> list[Event] | None:
        if self._recover_at is not None and self.clock.now() < self._recover_at:
            return []
        self._recover_at = None
        gen = self.gen
        assert gen is not None  # the loop claims right after _hold_lease took or renewed it
        try:
            return await self.inbox.claim_batch(self.holder, gen)
        except InboxBusy as exc:
            self.stats.busy += 1
            log.warning("%s", exc)
            return None

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
        ctx = RunContext(self.inbox, self.holder, gen, batch, asyncio.get_running_loop())
        log.info("run %s: events %s (gen %s)", ctx.run_id, ids, gen)
        task = asyncio.create_task(self._call_agent(batch, ctx))
        abandon_why: str | None = None
        stop_seen: float | None = None
        stop_wait = asyncio.ensure_future(self._stop.wait())
        try:
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
                elif now >= self._renew_at:
                    renewed = await self._step(lambda: self.inbox.renew(self.holder, gen))
                    if renewed is False:
                        abandon_why = "lease lost"
                        self.gen = None
                    elif renewed:
                        self._renew_at = now + self._renew_period()
                if abandon_why is not None:
                    ctx.close(abandon_why)
                    task.cancel()
                    with contextlib.suppress(BaseException):
                        await task
                    break
        finally:
            stop_wait.cancel()
            if not task.done():  # the worker itself was cancelled: its run must not go on
                ctx.close("the worker was cancelled")
                task.cancel()
        error: BaseException | None = None
        if abandon_why is None:
            # An agent whose own code raised CancelledError ends a cancelled task: a failure.
            error = (
                asyncio.CancelledError("the agent's run was cancelled")
                if task.cancelled()
                else task.exception()
            )
            if isinstance(error, (LeaseLost, RunAbandoned)):
                abandon_why = "lease lost"
                self.gen = None
        if abandon_why is not None:
            ctx.close(abandon_why)
            self.stats.abandoned += 1
            log.warning(
                "run %s abandoned (%s): events %s left for recovery", ctx.run_id, abandon_why, ids
            )
            if self.metrics is not None:
                self.metrics.ended("abandoned", time.monotonic() - started)
            return
        ctx.close("finished")
        if error is None:
            await self._finish(ctx, ids, error=None)
        else:
            self.stats.failed += 1
            # Escaped: the agent's message may hold a NUL or a lone surrogate, which the
            # inbox refuses to store, and it will be shown on terminals.
            text = printable(f"{type(error).__name__}: {error}", keep="\n\t")
            trace = printable("".join(tb.format_exception(error)), keep="\n\t")
            log.warning("run %s: agent raised %s\n%s", ctx.run_id, text, trace.rstrip())
            await self._finish(ctx, ids, error=text, trace=trace)
        if self.metrics is not None:
            self.metrics.ended("done" if error is None else "failed", time.monotonic() - started)

    async def _call_agent(self, batch: list[Event], ctx: RunContext) -> None:
        call = getattr(self.agent, "__call__", None)  # noqa: B004 - for iscoroutinefunction
        if inspect.iscoroutinefunction(self.agent) or inspect.iscoroutinefunction(call):
            outcome = self.agent(batch, ctx)
            if outcome is not None:  # (it is: a coroutine function's call)
                await outcome
            return
        # A plain def runs in a thread so the loop keeps renewing the lease meanwhile.
        outcome = await asyncio.to_thread(self.agent, batch, ctx)
        if inspect.isawaitable(outcome):
            await outcome

    async def _finish(
        self, ctx: RunContext, ids: list[int], *, error: str | None, trace: str | None = None
    ) -> None:
        """One fenced finish; a locked database is retried while the lease can still hold."""
        while True:
            try:
                if error is None:
                    try:
                        accepted = await self.inbox.finish(
                            self.holder,
                            ctx.gen,
                            ids,
                            messages=ctx.messages,
                            result=ctx.result,
                            approvals=ctx.approvals,
                            timers=ctx.timers,
                            run=ctx.run_id,
                        )
                    except BadInput as exc:  # e.g. over the follow-up budget: a failed run
                        self.stats.failed += 1
                        log.warning("run %s: outcome refused: %s", ctx.run_id, exc)
                        error = f"BadInput: {exc}"
                        continue
                else:
                    accepted = await self.inbox.finish(
                        self.holder,
                        ctx.gen,
                        ids,
                        error=error[:4000],
                        run=ctx.run_id,
                        traceback=trace,
                    )
            except InboxBusy as exc:
                self.stats.busy += 1
                lease = await self._step(self.inbox.lease_info)
                if lease is not None and (lease.gen != ctx.gen or lease.until < self.clock.now()):
                    log.warning("run %s: %s; lease gone meanwhile, run abandoned", ctx.run_id, exc)
                    self.stats.abandoned += 1
                    return
                log.warning("run %s: %s; retrying the finish", ctx.run_id, exc)
                await self._sleep(min(self.poll_interval, 0.5))
                continue
            break
        if accepted:
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
            log.info("reply held: the outbox is held by an operator (onwatch release-outbox)")
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

    async def _release(self) -> None:
        if self.gen is None:
            return
        try:
            released = await self.inbox.release(self.holder, self.gen)
            log.info(
                "lease generation %s %s", self.gen, "released" if released else "was already gone"
            )
        except InboxError as exc:
            log.warning("could not release the lease: %s", exc)
        self.gen = None

    # --- sleeping -------------------------------------------------------------------------

    async def _idle(self, claimed_at: int, version: tuple[int, int] | None) -> None:
        """Sleep until the next wake-up, a lease renewal, or a commit since `version` (the
        change token read before the claim that found nothing)."""
        self.stats.idle += 1
        wake = await self._step(self.inbox.next_wake)
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
        while not self.stopping:
            now = self.clock.now()
            if wake is not None and now >= wake:
                return
            if renew and now >= self._renew_at:
                return
            if self._recover_at is not None and now >= self._recover_at:
                return
            woke = await self._nap(seen, self._nap_seconds(wake, renew))
            seen = notifier.seq
            try:
                if woke:
                    if await notifier.confirm(self._changes, version):
                        return
                    continue
                if notifier.watching and time.monotonic() - checked < max(
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
        if not (self.inbox.wake.watching and isinstance(self.clock, SystemClock)):
            return self.poll_interval
        seconds = max(self.poll_interval, SLOW_POLL)
        for due in (wake, self._renew_at if renew else None, self._recover_at):
            if due is not None:
                seconds = min(seconds, due - time.time())
        return max(seconds, 0.001)

    async def _nap(self, seen: int, seconds: float) -> bool:
        """Sleep up to `seconds`; True if the notifier says the file may have changed
        (another process committed, or this process's Inbox did), False otherwise."""
        if self.stopping:
            return False
        waiting = asyncio.ensure_future(self.inbox.wake.wait(seen, seconds))
        stop_wait = asyncio.ensure_future(self._stop.wait())
        try:
            await asyncio.wait({waiting, stop_wait}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stop_wait.cancel()
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

    `path_or_inbox` is an open Inbox or the path of an existing inbox (NotAnInbox otherwise).
    `send` is the outbox channel (plain or async callable taking the text); None leaves
    dispatching to another process. Raises only for errors that are not transient.
    """
    if isinstance(path_or_inbox, Inbox):
        inbox, own = path_or_inbox, False
    else:
        # A worker of this release migrates an older inbox (refused while one of an
        # older release holds the lease: docs/rules.md#upgrading-a-running-deployment).
        inbox = await Inbox.open(
            path_or_inbox, clock=clock, create=False, busy_timeout=busy_timeout, migrate=True
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


# The send channels moved to core/channels.py; importable from here as before.
from .channels import command_channel, file_channel, stdout_channel  # noqa: E402,F401
