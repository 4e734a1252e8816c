"""What an agent gets with its batch: the run context, and the errors it may see.

    async def handle(batch: list[Event], ctx: RunContext) -> None: ...

Agent authors read this module; the loop that calls them is core/runtime/worker.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
from typing import Any, AsyncIterator, Awaitable, Callable, Sequence

from ..clock import check_time
from ..errors import BadInput, InboxBusy, InboxError
from ..inbox import Inbox
from ..records import ApprovalRequest, Event, FollowUp, Reply

log = logging.getLogger("onwatch.worker")

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
