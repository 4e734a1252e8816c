"""The yardstick: the inbox's transactions in plain synchronous `sqlite3`, no event loop.

The core benchmark measures the async engine (core/inbox.py + core/db.py) against it to
show what the loop <-> thread hand-off alone costs; the speed targets themselves are set
against the plain inbox of tests/bench/reference_inbox.py. This one runs the very same
transactions — the engine's own scripts (core/engine/) over the file's Tx, on a file
created by core's own schema
migrations, so tables, triggers and indexes are identical — with the same durability:

* WAL journal, `synchronous = FULL` (every commit is fsynced before it returns);
* one transaction per call (per event for ingest), `BEGIN IMMEDIATE … COMMIT`, or, where
  the engine does the same (a lone new event, `intake.ingest_alone`), one autocommit
  statement;
* the same busy timeout.

What it leaves out is everything the async engine adds on top: no thread hop, no group
commit, no argument validation beyond what `json.dumps` does. A ratio async/yardstick of 1.0
therefore means the async layer costs nothing over calling SQLite directly. (A store
function made faster speeds up both sides alike, so this ratio cannot show it.)
"""

from __future__ import annotations

import json
import sqlite3
import time
from typing import Any, Callable, Sequence, TypeVar

from onwatch.core.engine import intake, lease, outbox, reads, runs, scheduler, timers
from onwatch.core.sqlite import schema
from onwatch.core.sqlite.db import read_transaction, write_transaction
from onwatch.core.sqlite.tx import SqliteTx
from onwatch.core.records import Reply

T = TypeVar("T")


class Yardstick:
    """One plain `sqlite3` connection to one inbox file, used synchronously."""

    def __init__(self, path: str, *, busy_timeout: float = 5.0) -> None:
        self.path = path
        self.db = sqlite3.connect(path, isolation_level=None)
        self.db.execute(f"PRAGMA busy_timeout = {int(busy_timeout * 1000)}")
        self.db.execute("PRAGMA journal_mode = WAL")
        self.db.execute("PRAGMA synchronous = FULL")
        schema.migrate(self.db, path)  # core's migrations: the same schema, byte for byte
        self.tx = SqliteTx(self.db)
        self._seen: dict[str, str | None] = {}  # intake.ingest_alone's memory of the settings

    def close(self) -> None:
        self.db.close()

    def __enter__(self) -> "Yardstick":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # --- transactions -----------------------------------------------------------------------

    def write(self, fn: Callable[..., T], *args: Any) -> T:
        """`fn` in BEGIN IMMEDIATE … COMMIT: the engine's own wrapper, called directly."""
        return write_transaction(self.tx, fn, args)

    def read(self, fn: Callable[..., T], *args: Any) -> T:
        return read_transaction(self.tx, fn, args)

    # --- the API the benchmark drives ---------------------------------------------------------

    def ingest(
        self, source: str, source_id: str, payload: Any = None, *, now: int | None = None
    ) -> bool:
        """One event, one transaction, committed (fsynced) before returning."""
        now = int(time.time()) if now is None else now
        items = [(source, source_id, json.dumps(payload), now)]
        # The engine's own order: one autocommit statement if it decides, else the transaction.
        stored = intake.ingest_alone(self.tx, items, self._seen)
        result = (stored or self.write(intake.ingest_many, items))[0]
        if isinstance(result, Exception):
            raise result
        return result

    def acquire(self, holder: str, *, now: int) -> int | None:
        return self.write(lease.acquire, holder, now)

    def claim_batch(self, holder: str, gen: int, *, now: int) -> list:
        return self.write(runs.claim_batch, holder, gen, now)

    def finish(
        self, holder: str, gen: int, ids: Sequence[int], messages: Sequence[str] = (), *, now: int
    ) -> bool:
        return self.write(
            runs.finish,
            holder,
            gen,
            list(ids),
            [Reply(m) for m in messages],
            None,
            None,
            [],
            [],
            now,
        )

    def run_scheduler(self, *, now: int) -> int:
        """The engine's pass: chunks of due timers, each its own transaction, until none."""
        fired = 0
        while True:
            count, more = self.write(scheduler.run_scheduler, now)
            fired += count
            if not more:
                return fired

    def dispatch(self, send: Callable[[str], Any], *, now: int) -> int:
        """At most one send of what the outbox allows now (the same two transactions)."""
        picked = self.write(outbox.begin_delivery, now, False)
        if picked is None:
            return 0
        delivery_id, _key, text, count, attempt = picked
        error = None
        try:
            send(text)
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}"
        return count if self.write(outbox.end_delivery, delivery_id, attempt, error, now) else 0

    # --- the TUI's reads ------------------------------------------------------------------

    def counts(self) -> dict[str, int]:
        return reads.counts(self.tx)

    def events(
        self, status: str, *, limit: int = 100, after: int | None = None, before: int | None = None
    ) -> list:
        return reads.events(self.tx, status, limit, after, before, None)

    def lease_info(self):
        return reads.lease_info(self.tx)

    def timers(self, *, limit: int = 1000) -> list:
        return reads.timers(self.tx, limit)

    def next_timer_due(self) -> int | None:
        return timers.next_timer_due(self.tx)

    def held_messages(self, *, limit: int = 1000) -> list:
        return reads.held_messages(self.tx, limit)

    def approvals(self, *, limit: int = 1000) -> list:
        return self.read(reads.approvals, limit)
