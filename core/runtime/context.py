"""What an agent gets with its batch: the run context, and the errors it may see.

    async def handle(batch: list[Event], ctx: RunContext) -> None: ...

Agent authors read this module; the loop that calls them is core/runtime/worker.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import threading
from typing import Any, AsyncIterator, Awaitable, Callable, Coroutine, Sequence, TypeVar

from .. import checks
from ..clock import check_time
from ..errors import BadInput, InboxBusy, InboxError
from ..inbox import Inbox
from ..records import ApprovalRequest, Event, FollowUp, Reply
from ..settings import spend_unit, to_micros
from ..text import printable
from .threads import start_thread
from .transcript import RunLog, fields_text, in_run

log = logging.getLogger("onwatch.worker")
T = TypeVar("T")

Agent = Callable[[list[Event], "RunContext"], Awaitable[None] | None]


class LeaseLost(InboxError):
    """This worker's lease generation was superseded; the run must stop and not finish."""


class RunAbandoned(InboxError):
    """The run was abandoned (lease lost, over budget, or stopping); its context is closed."""


class RunContext:
    """What an agent gets with its batch: the only way a run affects the world.

    Replies, approval requests, follow-up timers and `result` are collected and committed by
    the runtime in one fenced finish when the agent returns; an agent that does none of these
    ends silently. External effects go through `effect()` / `perform()`, which journal the
    intent durably before the effect and its outcome after.

    Nothing here blocks the worker's event loop: from a plain-def agent (in its own thread)
    every journal write is handed to the loop and awaited there, and the effect itself runs
    in the agent's thread; from an async agent a plain function given to `perform` runs in a
    thread of its own. The loop stays free to renew the lease, answer webhooks and notice a
    run that outlives its budget.
    """

    def __init__(
        self,
        inbox: Inbox,
        holder: str,
        gen: int,
        batch: Sequence[Event],
        loop: asyncio.AbstractEventLoop,
        transcript: RunLog | None = None,
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
        # Threads running this run's code (the plain-def agent, a perform's plain function):
        # an abandoned run has ended only once they have returned too.
        self.threads: list[threading.Thread] = []
        # This run's transcript in this process (core/runtime/transcript.py); None for a
        # context made without a writer (then log and spend keep nothing).
        self.transcript = transcript

    # --- the run's transcript and spend ---------------------------------------------------

    def log(self, text: str, /, **fields: Any) -> None:
        """Add a line to this run's transcript, with optional keyword fields:

            ctx.log("asked the model", model="m-1", tokens=812)

        Never waits: the line is written with the next small batch, off the event loop.
        The transcript is kept with the run (bounded: its beginning and its end), shown by
        the desk live and by `onwatch logs`. Also after the run was given up: its code
        still says what it does until it ends. A field JSON cannot hold is kept as its
        repr; `text` must be a string (BadInput)."""
        if not isinstance(text, str):
            raise BadInput(f"ctx.log takes a string, got {type(text).__name__}")
        if self.transcript is not None:
            self.transcript.line("log", None, text, fields_text(fields))

    def spend(self, amount: Any, unit: str = "usd", note: str | None = None) -> None:
        """Record what this run spent (a model call, an API fee): `amount` in `unit` (a
        number from 0; kept to the millionth). It counts whatever becomes of the run (a
        failed or given-up run spent it too), adds up in `status`, the desk and /metrics,
        and against the budget `max_spend_per_day` of its unit, which delays further runs
        once reached. Written with the transcript's next batch (a line says so too).
        BadInput for an amount, unit or note it cannot take."""
        micros = to_micros(amount)
        unit = spend_unit(unit)
        if note is not None:
            note = checks.text("note", note, limit=200)
        if self.transcript is not None:
            self.transcript.spend(micros, unit, note)

    def thread(
        self, target: Callable[..., Any], *args: Any, name: str | None = None, **kwargs: Any
    ) -> threading.Thread:
        """Start `target(*args, **kwargs)` in a new thread that belongs to this run: its
        `logging` records and `ctx.log` lines go to this run's transcript. Returns the
        thread, started (a daemon: it does not keep the worker's process alive)."""
        if not callable(target):
            raise BadInput(f"ctx.thread runs a callable, got {type(target).__name__}")
        if name is not None and not isinstance(name, str):
            raise BadInput(f"a thread's name is a string, got {type(name).__name__}")
        thread = threading.Thread(
            target=in_run(target), args=args, kwargs=kwargs, name=name, daemon=True
        )
        thread.start()
        return thread

    def wrap(self, fn: Callable[..., T]) -> Callable[..., T]:
        """`fn`, made to run as part of this run wherever it is called: hand it to a thread
        pool (`pool.submit(ctx.wrap(fetch), url)`) and its logging records go to this run's
        transcript. (`asyncio.to_thread` carries the run along by itself.)"""
        if not callable(fn):
            raise BadInput(f"ctx.wrap takes a callable, got {type(fn).__name__}")
        return in_run(fn)

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
        intended = await self._intend(name, detail, key, event)
        try:
            yield intended
        except Exception:
            await _settle(self._inbox, intended, "failed")
            raise
        await _settle(self._inbox, intended, "confirmed")

    async def _intend(
        self, name: str, detail: Any, key: str | None, event: int | Event | None
    ) -> str:
        """Commit the intent (fenced) and return its key; LeaseLost if this run may no
        longer act, RunAbandoned once the worker gave it up."""
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
        return intended

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

        Wherever it is called from, the effect never runs on the worker's event loop: an
        async `fn` is awaited (it must not block), a plain `fn` runs in the plain-def agent's
        own thread, or, called from an async agent, in a thread of its own. A plain `fn` that
        returns an awaitable has it awaited on the loop.
        """
        if _in_loop(self._loop):
            return self._perform(name, detail, fn, key, event)
        # A plain-def agent, in its own thread: the journal's writes are the loop's (handed
        # over and waited for); the effect runs here, so a slow payment holds this thread
        # only, and the loop keeps renewing the lease meanwhile.
        intended = self._on_loop(self._intend(name, detail, key, event))
        try:
            outcome = fn(intended)
            if inspect.isawaitable(outcome):
                outcome = self._on_loop(_awaited(outcome))
        except Exception:
            self._on_loop(_settle(self._inbox, intended, "failed"))
            raise
        self._on_loop(_settle(self._inbox, intended, "confirmed"))
        return outcome

    async def _perform(
        self,
        name: str,
        detail: Any,
        fn: Callable[[str], Any],
        key: str | None,
        event: int | Event | None,
    ) -> Any:
        async with self.effect(name, detail, key=key, event=event) as idem:
            if _is_async(fn):
                outcome = fn(idem)
            else:
                thread, done = start_thread(fn, idem, name=f"onwatch-effect-{name[:40]}")
                self.threads.append(thread)
                outcome = await done
            if inspect.isawaitable(outcome):
                outcome = await outcome
            return outcome

    def _on_loop(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run `coro` on the worker's loop from the agent's thread and wait for it."""
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def close(self, why: str) -> None:
        self._closed = why


def _is_async(fn: Callable[..., Any]) -> bool:
    """A coroutine function, or an object whose __call__ is one."""
    call = getattr(fn, "__call__", None)  # noqa: B004 - for iscoroutinefunction
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(call)


async def _awaited(outcome: Awaitable[T]) -> T:
    return await outcome


def _in_loop(loop: asyncio.AbstractEventLoop) -> bool:
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:
        return False


SETTLE_TRIES = 10  # a locked database: ~11 s of retries in all
SETTLE_TRIES_ON_ERROR = 3  # any other failure to write (disk full, I/O error): ~1 s


async def _settle(inbox: Inbox, key: str, state: str) -> None:
    """Record an effect's outcome, retrying a while; never raise.

    The effect has happened (or failed) when this runs: an error here is about the journal,
    not the effect. Raised into the agent it would say that a payment which went through
    had failed, and the agent would act on a falsehood (pay again, tell the customer it
    failed). So the outcome is logged, and the journal keeps the effect 'intended' (outcome
    unknown), which is what the operator reading it must then settle.
    """
    tries = SETTLE_TRIES
    attempt = 0
    while True:
        try:
            await inbox.settle_effect(key, state)
            return
        except InboxError as exc:
            attempt += 1
            if not isinstance(exc, InboxBusy):
                tries = min(tries, SETTLE_TRIES_ON_ERROR)
            if attempt >= tries:
                log.error(
                    "effect %s: its outcome (%s) could not be recorded: %s; the journal "
                    "keeps it 'intended' (outcome unknown) for the operator to settle, and "
                    "the run goes on with the outcome it had",
                    key,
                    state,
                    printable(str(exc)),
                )
                return
            log.warning("effect %s: could not record %s yet (%s); retrying", key, state, exc)
            await asyncio.sleep(0.2 * attempt)
