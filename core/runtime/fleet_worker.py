"""The fleet worker: every inbox of a PostgreSQL database that has work, served N at once."""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Callable

import psycopg

from ..clock import SystemClock
from ..errors import InboxError
from ..pg import redact
from ..pg.fleet import Looker
from ..pg.listen import Listener
from .listening_worker import ListeningWorker
from .worker import AgentWedged

__all__ = ["FleetWorker"]
log = logging.getLogger("onwatch.pg.fleet")


class FleetWorker:
    """Serve every inbox of a database that has work, at most `concurrency` at once.

    For each inbox with work and no other holder it opens the inbox and runs a worker on it
    (core/runtime/listening_worker.py: lease, scheduler, claim, agent, one fenced finish,
    dispatch) until it has nothing left to do, then releases the lease and frees the slot.
    One run per inbox at a time is the lease's rule, so several fleet workers on several
    machines can share a database: an inbox another holds is skipped. A NOTIFY from any
    inbox, or a slot freeing, starts the next look; `poll_interval` is the fallback.
    """

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
    ) -> None:
        self.url = url
        self.agent = agent
        self.holder = holder
        self.concurrency = concurrency
        self.send = send
        self.poll_interval = poll_interval
        self.grace = grace
        self.clock = clock or SystemClock()
        self.on_stuck = on_stuck  # see Worker: the event loop held past the lease
        self.runs = 0
        self.served: dict[str, int] = {}  # inbox name → runs served here
        self._workers: dict[str, ListeningWorker | None] = {}  # inbox name → its worker
        self._stop = asyncio.Event()
        self._changed = asyncio.Event()
        self.stop_requested = False  # by request_stop's callers, not by a wedged agent
        self._wedged: AgentWedged | None = None

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

    async def run(self) -> int:
        """Serve until request_stop; return how many runs were made here. Raises
        AgentWedged (every lease released) when an agent's code could not be stopped on
        one inbox: the process must end to stop it (see Worker.run)."""
        listener = await Listener.open(self.url, poll_interval=self.poll_interval)
        looker = Looker(self.url)
        tasks: set[asyncio.Task[None]] = set()
        backoff = 0.0
        try:
            while not self._stop.is_set():
                free = self.concurrency - len(self._workers)
                if free > 0:
                    try:
                        names = await asyncio.to_thread(
                            looker.with_work,
                            self.holder,
                            self.clock.now(),
                            free + len(self._workers),
                        )
                    except psycopg.Error as exc:
                        # A restart or a network cut: say so, back off, look again.
                        backoff = min(max(backoff * 2, 0.1), 5.0)
                        log.warning(
                            "fleet: cannot reach %s (%s); retrying in %.1f s",
                            redact(self.url),
                            str(exc).strip(),
                            backoff,
                        )
                        await asyncio.wait(
                            [asyncio.ensure_future(self._stop.wait())], timeout=backoff
                        )
                        continue
                    if backoff:
                        log.warning("fleet: %s reachable again", redact(self.url))
                        backoff = 0.0
                    for name in [n for n in names if n not in self._workers][:free]:
                        # Taken here, before any await: two tasks of one holder on one
                        # inbox would share its lease, and the lease could not tell them apart.
                        self._workers[name] = None
                        task = asyncio.create_task(self._serve(name, listener))
                        tasks.add(task)
                        task.add_done_callback(tasks.discard)
                self._changed.clear()
                await self._wait(listener)
        finally:
            self._halt()
            if tasks:
                await asyncio.gather(*tasks, return_exceptions=True)
            await listener.close()
            await asyncio.to_thread(looker.close)
        if self._wedged is not None:
            raise self._wedged
        return self.runs

    async def _wait(self, listener: Listener) -> None:
        """Until a slot frees, any inbox is notified, a stop, or the poll interval."""
        waits = [
            asyncio.ensure_future(self._changed.wait()),
            asyncio.ensure_future(self._stop.wait()),
            asyncio.ensure_future(listener.wait_any(self.poll_interval)),
        ]
        try:
            await asyncio.wait(
                waits, timeout=self.poll_interval, return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            for task in waits:
                task.cancel()

    async def _serve(self, name: str, listener: Listener) -> None:
        from ..inbox import Inbox

        try:
            inbox = await Inbox.open(self.url, name=name, create=False, clock=self.clock)
        except InboxError as exc:
            log.warning("fleet: cannot open inbox %s: %s", name, exc)
            del self._workers[name]
            self._changed.set()
            return
        worker = _UntilIdle(
            inbox,
            self.agent,
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
        try:
            stats = await worker.run()
            self.runs += stats.runs
            self.served[name] = self.served.get(name, 0) + stats.runs
        except AgentWedged as exc:
            # Code that cannot be stopped runs in this process: the fleet stops (every
            # other inbox's run finishing or abandoned, its lease released) and says so.
            self.runs += worker.stats.runs
            self._wedged = self._wedged or exc
            self._halt()
        except Exception as exc:  # noqa: BLE001 - one inbox's failure never stops the fleet
            log.warning("fleet: inbox %s: %s: %s", name, type(exc).__name__, exc)
        finally:
            del self._workers[name]
            await inbox.close()
            self._changed.set()


class _UntilIdle(ListeningWorker):
    """A worker that gives its inbox back as soon as it has nothing to run, or when another
    holds the lease (it does not wait for it: the fleet has other inboxes)."""

    async def _idle(self, claimed_at: int, version: tuple[int, int] | None) -> None:
        self.request_stop()

    async def _wait_for(self, lease: Any) -> None:
        self.request_stop()
