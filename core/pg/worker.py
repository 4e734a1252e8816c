"""The worker on a PostgreSQL inbox: woken by NOTIFY instead of by its next poll.

`ListeningWorker` is core/worker.py's `Worker` with a `Listener` attached to its inbox's
`wake` (core/pg/listen.py's `ListenWake`): the worker's idle wait, written for the file
notifier, then ends the moment the Listener hears its inbox named (a commit that gave it
work), so a new event is claimed in milliseconds; `poll_interval` stays the fallback while
the listening connection is down. One Listener may serve many workers (the fleet's).
"""

from __future__ import annotations

from typing import Any

from ..worker import Worker, WorkerStats
from .listen import Listener


class ListeningWorker(Worker):
    def __init__(self, *args: Any, listener: Listener | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.listener = listener
        self._own_listener = listener is None

    async def run(self) -> WorkerStats:
        if self.listener is None:
            self.listener = await Listener.open(self.inbox._db.url,
                                                poll_interval=self.poll_interval)
        self.inbox.wake.attach(self.listener)
        try:
            return await super().run()
        finally:
            self.inbox.wake.attach(None)
            if self._own_listener:
                await self.listener.close()
                self.listener = None
