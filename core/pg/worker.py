"""The worker on a PostgreSQL inbox: woken by NOTIFY instead of by its next poll.

`ListeningWorker` is core/worker.py's `Worker` with one difference: where the worker sleeps
for `poll_interval` and then looks at the inbox's change token, this one's sleep also ends
the moment a `Listener` hears its inbox named (a commit that gave it work), so a new event is
claimed in milliseconds; `poll_interval` is left as the fallback (and the lease's renewal
clock). The mark of what was heard is taken just before each change-token read, so a
notification between that read and the sleep still ends the sleep.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from ..worker import Worker, WorkerStats
from .listen import Listener


class ListeningWorker(Worker):
    def __init__(self, *args: Any, listener: Listener | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.listener = listener
        self._own_listener = listener is None
        self._seen: tuple[int, int] | None = None

    async def run(self) -> WorkerStats:
        if self.listener is None:
            self.listener = await Listener.open(self.inbox._db.url,
                                                poll_interval=self.poll_interval)
        try:
            return await super().run()
        finally:
            if self._own_listener:
                await self.listener.close()
                self.listener = None

    async def _changes(self) -> tuple[int, int]:
        if self.listener is not None:
            self._seen = self.listener.seen(self.inbox.name)
        return await super()._changes()

    async def _sleep(self, seconds: float) -> None:
        listener, seen = self.listener, self._seen
        if listener is None or seen is None:
            return await super()._sleep(seconds)
        stop = asyncio.ensure_future(self._stop.wait())
        heard = asyncio.ensure_future(listener.wait(self.inbox.name, seen, seconds))
        try:
            await asyncio.wait({stop, heard}, timeout=seconds,
                               return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (stop, heard):
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
