"""What the Inbox needs of a storage backend: its connection (core/db.py or core/pg/db.py),
the wake-up source on it (core/wake.py or core/pg/listen.py) and its SQL module
(core/store.py or core/pg/store.py). The backends do not name these protocols; mypy checks
each one against them where the Inbox is given it, so the two cannot drift apart.
"""

from __future__ import annotations

from typing import Any, Awaitable, Callable, Protocol, Sequence, TypeVar

from .records import (
    Approval,
    ApprovalRequest,
    AuditEntry,
    Delivery,
    Effect,
    Event,
    FollowUp,
    Lease,
    LeaseChange,
    Message,
    Overview,
    Reply,
    Run,
    Timer,
)
from .settings import Settings

T = TypeVar("T")
# What a Connection hands the SQL module's functions: a sqlite3.Connection (core/store.py)
# or core/pg/db.py's Tx (core/pg/store.py).
Handle = Any


class Waker(Protocol):
    """Wakes this process's waiters when the inbox may have changed (`Inbox.wake`)."""

    @property
    def seq(self) -> int: ...  # moves whenever a change may have happened
    @property
    def watching(self) -> bool: ...  # False: nothing tells of other processes' commits; poll
    @property
    def waiting(self) -> int: ...
    def notify(self) -> None: ...
    async def wait(self, since: int, timeout: float) -> bool: ...
    async def confirm(self, read_token: Callable[[], Awaitable[T]], old: T) -> bool: ...
    def close(self) -> None: ...


class Connection(Protocol):
    """One inbox's connection: each call runs one function of the SQL module whole on the
    connection's thread, given the backend's handle (a sqlite3.Connection or a pg Tx)."""

    @property
    def path(self) -> str: ...
    @property
    def wake(self) -> Waker: ...
    async def call(self, fn: Callable[..., T], *args: Any) -> T: ...
    async def read(self, fn: Callable[..., T], *args: Any) -> T: ...
    async def write(self, fn: Callable[..., T], *args: Any) -> T: ...
    def write_soon(
        self,
        fn: Callable[..., T],
        args: tuple[Any, ...],
        done: Callable[[T | None, BaseException | None], None],
    ) -> None: ...
    def peek(self, fn: Callable[..., T], *args: Any) -> T: ...
    def file_replaced(self) -> str | None: ...
    async def close(self) -> None: ...


class Store(Protocol):
    """The SQL module's functions the Inbox calls; `db` is the handle its connection passes."""

    def acquire(self, db: Handle, holder: str, now: int) -> int | None: ...
    def add_timer(
        self,
        db: Handle,
        timer_id: str,
        due: int,
        payload: Any,
        every: int | None,
        key: tuple[str, str] | None,
        catch_up: str,
        kind: str,
        *,
        encoded: bool = ...,
    ) -> None: ...
    def answer_approval(
        self, db: Handle, request_id: str, answer: str, now: int, actor: str, reason: str | None
    ) -> str: ...
    def approvals(self, db: Handle, limit: int) -> list[Approval]: ...
    def audit(
        self,
        db: Handle,
        now: int,
        actor: str,
        action: str,
        target: str,
        before: str | None,
        after: str | None,
        applied: bool,
        reason: str | None = ...,
    ) -> None: ...
    def audit_entries(self, db: Handle, limit: int, target: str | None) -> list[AuditEntry]: ...
    def begin_delivery(
        self, db: Handle, now: int, flush: bool
    ) -> tuple[int, str, str, int, int] | None: ...
    def cancel_timer(self, db: Handle, timer_id: str) -> bool: ...
    def change_event(
        self,
        db: Handle,
        event_id: int,
        action: str,
        allowed: Sequence[str],
        expect: str | None,
        after: str,
        now: int,
        actor: str,
        reason: str | None,
    ) -> bool: ...
    def claim_batch(self, db: Handle, holder: str, gen: int, now: int) -> list[Event]: ...
    def counts(self, db: Handle) -> dict[str, int]: ...
    def deliveries(
        self, db: Handle, limit: int, now: int | None = ..., ids: Sequence[int] | None = ...
    ) -> list[Delivery]: ...
    def effects_for_run(self, db: Handle, run_ids: Sequence[int]) -> list[Effect]: ...
    def end_delivery(
        self, db: Handle, delivery_id: int, attempt: int, error: str | None, now: int
    ) -> bool: ...
    def events(
        self,
        db: Handle,
        status: str,
        limit: int,
        after: int | None,
        before: int | None,
        search: str | None,
        payload: bool = ...,
    ) -> list[Event]: ...
    def expire_approval(
        self, db: Handle, request_id: str, now: int, actor: str, reason: str | None
    ) -> str: ...
    def finish(
        self,
        db: Handle,
        holder: str,
        gen: int,
        ids: Sequence[int],
        replies: Sequence[Reply],
        error: str | None,
        result: str | None,
        approvals: Sequence[ApprovalRequest],
        followups: Sequence[FollowUp],
        now: int,
        run: int | None = ...,
        traceback: str | None = ...,
    ) -> bool: ...
    def get_approval(self, db: Handle, request_id: str) -> Approval | None: ...
    def get_event(self, db: Handle, event_id: int) -> Event | None: ...
    def held_messages(self, db: Handle, limit: int) -> list[Message]: ...
    def ingest_many(
        self, db: Handle, items: Sequence[tuple[str, str, str, int]]
    ) -> list[bool | Exception]: ...
    def intend_effect(
        self,
        db: Handle,
        holder: str,
        gen: int,
        run_id: int,
        name: str,
        detail: str,
        key: str | None,
        now: int,
        event: int | None = ...,
    ) -> str | None: ...
    def lease_history(self, db: Handle, limit: int) -> list[LeaseChange]: ...
    def lease_info(self, db: Handle) -> Lease | None: ...
    def load_settings(self, db: Handle) -> Settings: ...
    def next_send_at(self, db: Handle) -> int | None: ...
    def next_timer_due(self, db: Handle) -> int | None: ...
    def next_wake(self, db: Handle, now: int) -> int | None: ...
    def overview(self, db: Handle, now: int) -> Overview: ...
    def prune_payloads(self, db: Handle, older_than: int, now: int) -> int: ...
    def release(self, db: Handle, holder: str, gen: int, now: int) -> bool: ...
    def renew(self, db: Handle, holder: str, gen: int, now: int) -> bool: ...
    def request_approval(
        self,
        db: Handle,
        request_id: str,
        expires_in: int,
        action: str,
        now: int,
        run_id: int | None = ...,
    ) -> Approval: ...
    def run_scheduler(self, db: Handle, now: int) -> int: ...
    def runs_for_event(self, db: Handle, event_id: int) -> list[Run]: ...
    def set_flag(
        self,
        db: Handle,
        flag: str,
        value: bool,
        action: str,
        now: int,
        actor: str,
        reason: str | None,
    ) -> bool: ...
    def settle_delivery(
        self,
        db: Handle,
        delivery_id: int,
        outcome: str,
        expect: str,
        now: int,
        actor: str,
        reason: str | None,
    ) -> bool: ...
    def settle_effect(self, db: Handle, key: str, state: str, now: int) -> bool: ...
    def store_settings(self, db: Handle, settings: Settings) -> None: ...
    def timers(self, db: Handle, limit: int) -> list[Timer]: ...
    def uncertain_deliveries(self, db: Handle, now: int, limit: int) -> list[Delivery]: ...
