"""The outbox: messages held in the database and sent paced, apart from the run. A delivery
is one send of what was held (one idempotency key); its outcome is owned by the attempt that
made it."""

from __future__ import annotations

from ..clock import MAX_COUNT
from ..records import Delivery
from . import plans
from .decoding import delivery_from_row, is_int, shown_status
from .journal import audit, set_aside
from .plans import (
    Unsendable,
    late_outcome,
    next_paced_send,
    paced_now,
    send_outcome,
    settling,
    unsendable_attempt,
    unsendable_messages,
)
from .switches import load_settings
from .tx import Tx

# A delivery picked for sending: (delivery id, idempotency key, text, message count, attempt).
Picked = tuple[int, str, str, int, int]
ROUNDS = 100  # deliveries set aside in one pass at most


def begin_delivery(tx: Tx, now: int | None, flush: bool) -> Picked | None:
    """Pick what the next send carries and mark it sending; None when nothing may go now.

    The send itself happens after this transaction commits; its outcome is recorded only
    for this attempt (end_delivery)."""
    now = tx.now(now)
    for _ in range(ROUNDS):  # each round sets aside a delivery it cannot send
        try:
            with tx.savepoint("begin_delivery"):
                return _begin_delivery(tx, now, flush)
        except Unsendable as exc:
            tx.run("delivery_set_aside", id=exc.delivery_id, why=exc.why)
            tx.run("outbox_mark", delivery=exc.delivery_id, status="dead")
            set_aside(tx)
    return None


def _begin_delivery(tx: Tx, now: int, flush: bool) -> Picked | None:
    settings = load_settings(tx)
    if tx.meta("outbox_held") and not flush:
        return None
    retry = tx.run("delivery_to_retry", now=now).fetchone()
    if retry is not None:
        # A failed send, or one a crashed dispatcher left half-done (at least once only).
        delivery_id, attempts, salt = retry
        if not is_int(attempts, 0, MAX_COUNT - 1):  # one more would not be a count
            raise Unsendable(delivery_id, plans.not_a_count(attempts))
        attempt = tx.one("delivery_retry", id=delivery_id, retry_after=now + settings.send_timeout)[
            0
        ]
        unsendable = unsendable_attempt(attempt)
        if unsendable is not None:
            raise Unsendable(delivery_id, unsendable)
    else:
        # A message no valid call could have written (a body that is not text) is set aside
        # before it joins a delivery: it would fail every send of its neighbours.
        for (bad,) in tx.run("outbox_unsendable").fetchall():
            tx.run("outbox_set_dead", id=bad)
            set_aside(tx)
        attempt = 1
        paced = paced_now(flush, tx.meta("last_paced_send"), settings.outbox_gap, now)
        urgent_only = not paced
        if tx.run("outbox_waiting", urgent_only=urgent_only).fetchone() is None:
            return None
        delivery_id, salt = tx.one(
            "delivery_insert",
            paced=paced,
            at_most_once=settings.delivery == "at_most_once",
            now=now,
            retry_after=now + settings.send_timeout,
        )
        tx.run("outbox_assign", delivery=delivery_id, urgent_only=urgent_only)
        if paced:
            tx.set_meta("last_paced_send", now)
    bodies = [r[0] for r in tx.run("outbox_bodies", delivery=delivery_id)]
    unsendable = unsendable_messages(bodies)
    if unsendable is not None:
        raise Unsendable(delivery_id, unsendable)
    key = plans.delivery_key(tx.meta("uid"), delivery_id, salt)
    return delivery_id, key, "\n\n".join(bodies), len(bodies), attempt


def end_delivery(
    tx: Tx, delivery_id: int, attempt: int, error: str | None, now: int | None
) -> bool:
    """Record a send's outcome, owned by the attempt that made it: a failed one stays held
    for the next dispatch, or dies. A late outcome (another dispatcher re-sent meanwhile,
    or an operator settled it) is refused and audited like a stale generation."""
    now = tx.now(now)
    settings = load_settings(tx)
    row = tx.run("delivery_row", id=delivery_id).fetchone()
    outcome = send_outcome(row, attempt, error, settings.max_delivery_attempts)
    if outcome == "late":
        seen, why = late_outcome(row, attempt)
        what = f"refused {'sent' if error is None else 'failed'}"
        audit(tx, now, "dispatcher", what, f"delivery {delivery_id}", seen, None, False, why)
        tx.bump("refused_writes")
        return False
    if outcome == "sent":
        tx.run("delivery_sent", id=delivery_id, now=now, error=None)
        tx.run("outbox_mark", delivery=delivery_id, status="sent")
        return True
    tx.run("delivery_failed", id=delivery_id, status=outcome, error=error)
    if outcome == "dead":
        tx.run("outbox_mark", delivery=delivery_id, status="dead")
    return False


def settle_delivery(
    tx: Tx,
    delivery_id: int,
    outcome: str,
    expect: str,
    now: int | None,
    actor: str,
    reason: str | None,
) -> bool:
    """An operator settles an uncertain delivery: 'sent' (it went out) or 'send again' (its
    messages go back to the outbox, for a new delivery under a new key). Applied only if the
    delivery is uncertain and in the state the operator saw; audited either way."""
    now = tx.now(now)
    before = delivery_state(tx, delivery_id, now)
    applied, after, why = settling(before, expect, outcome)
    if applied and outcome == "sent":
        tx.run("delivery_sent", id=delivery_id, now=now, error=f"uncertain; marked sent by {actor}")
        tx.run("outbox_mark", delivery=delivery_id, status="sent")
    elif applied:
        again = f"uncertain; its messages sent again by {actor}"
        tx.run("delivery_failed", id=delivery_id, status="dead", error=again)
        tx.run("outbox_release", delivery=delivery_id)
    action = "mark_sent" if outcome == "sent" else "send_again"  # the action's one name
    target = f"delivery {delivery_id}"
    audit(tx, now, actor, action, target, before, after, applied, reason if applied else why)
    return applied


def delivery_state(tx: Tx, delivery_id: int, now: int) -> str | None:
    row = tx.run("delivery_shown", id=delivery_id).fetchone()
    return None if row is None else shown_status(row[0], row[1], row[2], now)


def deliveries(
    tx: Tx, limit: int, now: int | None = None, ids: list[int] | None = None
) -> list[Delivery]:
    """Newest first (or the given ids, oldest first); with `now`, an at-most-once delivery
    cut off mid-send shows as 'uncertain'."""
    if ids is None:
        rows = tx.run("deliveries_newest", limit=limit).fetchall()
    else:
        rows = tx.run("deliveries_by_ids", ids=ids, limit=limit).fetchall()
    uid = tx.meta("uid")
    return [delivery_from_row(r, plans.delivery_key(uid, r[0], r[11]), now) for r in rows]


def uncertain_deliveries(tx: Tx, now: int | None, limit: int) -> list[Delivery]:
    """At-most-once deliveries cut off mid-send: never sent again by themselves, an operator
    settles them."""
    now = tx.now(now)
    ids = [r[0] for r in tx.run("deliveries_uncertain", now=now, limit=limit)]
    return deliveries(tx, MAX_COUNT, now, ids)


def next_send_at(tx: Tx) -> int | None:
    """When the next paced send is allowed (None when nothing is waiting)."""
    if tx.run("outbox_waiting", urgent_only=False).fetchone() is None:
        return None
    return next_paced_send(tx.meta("last_paced_send"), load_settings(tx).outbox_gap)
