"""The worker on a PostgreSQL inbox: woken by NOTIFY instead of by its next poll.

`ListeningWorker` is core/runtime/worker.py's `Worker` with a `Listener` attached to its inbox's
`wake` (core/pg/listen.py's `ListenWake`): the worker's idle wait, written for the file
notifier, then ends the moment the Listener hears its inbox named (a commit that gave it
work), so a new event is claimed in milliseconds; `poll_interval` stays the fallback while
the listening connection is down. One Listener may serve many workers (the fleet's).
"""

from __future__ import annotations

import time
from typing import Any

from ..errors import BadInput
from ..pg.db import Database
from ..pg.listen import Listener
from .worker import Worker, WorkerStats


# Seconds between two looks for due timers by the claims a finish makes (each look is a
# round trip of its own): while runs follow one another, a timer fires at most this late.
TIMERS_AHEAD_EVERY = 1.0


class ListeningWorker(Worker):
    def __init__(self, *args: Any, listener: Listener | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.listener = listener
        self._own_listener = listener is None
        self._timers_looked = 0.0  # (monotonic) when a claim last fired due timers

    def _fires_timers(self) -> bool:
        fires = super()._fires_timers()
        if fires:
            self._timers_looked = time.monotonic()
        return fires

    def _fires_timers_ahead(self) -> bool:
        if time.monotonic() - self._timers_looked < TIMERS_AHEAD_EVERY:
            return False
        return self._fires_timers()

    async def run(self) -> WorkerStats:
        db = self.inbox._db
        if not isinstance(db, Database):
            raise BadInput(f"inbox {self.inbox.path} is not in PostgreSQL: nothing to listen to")
        listener = self.listener
        if listener is None:
            listener = self.listener = await Listener.open(db.url, poll_interval=self.poll_interval)
        db.wake.attach(listener)
        try:
            return await super().run()
        finally:
            db.wake.attach(None)
            if self._own_listener:
                await listener.close()
                self.listener = None
