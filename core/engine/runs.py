"""Runs: claiming the next run's events (recovering lost claims, burying exhausted ones) and
finishing a run with everything it produced, fenced by lease generation and by run."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from ..clock import MAX_COUNT
from ..errors import BadInput
from ..records import ApprovalRequest, Event, FollowUp, Reply
from ..settings import Settings
from . import scheduler, spend
from .approvals import request_approval
from .decoding import event_from_row, is_int, reason
from .journal import refuse, set_aside
from .plans import DAY
from .timers import add_timer
from .tx import InboxState, Row, Tx

ROUNDS = 100  # claim rounds in one transaction, each setting aside what it cannot run


@dataclass(frozen=True)
class Claimed:
    """What a worker's step before a run found (claim_next)."""

    events: list[Event]  # the run's events, claimed; [] when there is nothing to run
    token: tuple[int, int] | None  # the change token as the step began (None: not asked)
    settings: Settings  # as stored when the claim was made
    more_timers: bool  # a storm: more timers are due than this step's slice of the pass fired
    # A step that fired no timers: whether one is due, where the dialect read that with the
    # claim at no cost (False lets a worker take this as its idle look); else None.
    timers_due: bool | None = None


def claim_next(
    tx: Tx,
    holder: str,
    gen: int,
    now: int | None,
    timers: bool,
    mark: bool,
    state: InboxState | None = None,
) -> Claimed:
    """A worker's whole step before a run, in one transaction: the change token as it
    begins when `mark` (a commit after a claim that found nothing is news to wait for),
    one slice of the scheduler's pass when `timers` (the occurrences it fires join this
    very claim), the settings, and the claim itself (claim_batch). One transaction instead
    of four calls: what a worker waiting on nothing but its inbox pays per run. `state` is
    the transaction's own read of it, when it made one already (finish_and_claim)."""
    token = tx.change_token() if mark else None
    now = tx.now(now)
    if state is None:
        state = tx.state()  # the lease, the switches and the settings: no timer changes them
    settings, more = state.settings, False
    # The claim's look goes with the probe for due timers (one round trip where the
    # dialect can); a timer that fires changes what it would read, and it is read again.
    look = (gen, settings.max_attempts, settings.max_batch)
    due = None
    if timers:
        if scheduler.nothing_due(tx, now, look) is None:
            _, more = scheduler.run_scheduler(tx, now)
    else:
        due = tx.timer_due_known(now, look)
    return Claimed(_claim(tx, state, holder, gen, now), token, settings, more, due)


def plain_claim(settings: Settings) -> bool:
    """Whether a claim under `settings` is decided by the inbox's rows alone: no run deadline
    (max_run_seconds), no runs or spend budget to count. A backend may then make it in one
    statement (ClaimAhead). Every setting `_claim` checks beyond the rows belongs here."""
    return (
        settings.max_run_seconds is None
        and settings.max_runs_per_day is None
        and not settings.max_spend_per_day
    )


def claim_batch(tx: Tx, holder: str, gen: int, now: int | None) -> list[Event]:
    """Claim the next run's events for the holder of exactly this generation: lost claims
    are recovered and exhausted events buried first; a previously attempted event runs
    alone (a poison event harms no other), otherwise up to max_batch available events run
    together. Attempts are counted here, at claim time: a worker that crashes never
    reports a failure."""
    now = tx.now(now)
    return _claim(tx, tx.state(), holder, gen, now)


def _claim(tx: Tx, state: InboxState, holder: str, gen: int, now: int) -> list[Event]:
    if not state.holds(holder, gen, now):
        refuse(tx, "claim", holder, gen, now)
        return []
    settings = state.settings

    def look() -> tuple[list[Row], list[Row]]:
        # Exhausted events buried, lost claims and what may run read, in one round trip
        # where the dialect can; what may run is looked at again after a recovery.
        return tx.claim_look(gen, now, settings.max_attempts, settings.max_batch)

    found: list[Row] | None
    lost, found = look()
    if settings.max_run_seconds is not None:
        lost += tx.run("overdue_claims", gen=gen, before=now - settings.max_run_seconds).fetchall()
    if lost:
        recover_lost_claims(tx, gen, now, settings, lost)
        bury_exhausted(tx, now, settings)  # the recovered ones out of attempts
        found = None
    if state.paused:  # paused: recovery above still ran, nothing is claimed
        return []
    if (
        settings.max_runs_per_day is not None
        and runs_since(tx, now - DAY) >= settings.max_runs_per_day
    ):
        return []  # budget: excess runs are delayed until the day's window frees a slot
    if settings.max_spend_per_day and spend.over_budget(tx, settings, now) is not None:
        return []  # budget: a unit's spend of the last 24 hours reached max_spend_per_day
    for _ in range(ROUNDS):
        # The oldest retried event that may run (tagged 1) and the oldest fresh ones (0),
        # read together: a retried one runs alone, else the fresh ones run together.
        if found is None:
            found = look()[1]  # its lost claims were recovered: none is left
        retried = [row[:-1] for row in found if row[-1] == 1]
        rows = retried[:1] or sorted((row[:-1] for row in found if row[-1] != 1), key=_by_id)
        if not rows:
            return []
        runnable = _runnable(tx, rows, now)
        if runnable:
            break
        found = None  # every row was set aside: look again
    else:
        return []
    run_id = tx.claim(holder, gen, [event.id for event in runnable], now)
    return [
        Event(
            e.id,
            e.source,
            e.source_id,
            e.payload,
            "running",
            e.attempts + 1,
            gen,
            e.error,
            e.created,
            now,
            e.available_at,
            now,
            run_id,
        )
        for e in runnable
    ]


def _by_id(row: Sequence[Any]) -> int:
    event_id: int = row[0]
    return event_id


def _runnable(tx: Tx, rows: Sequence[Any], now: int) -> list[Event]:
    """The events of `rows` an agent can run; the others are set aside (dead, with the
    reason) so that one bad row never stops every claim: a pruned payload (nothing to run
    on), a payload that is not JSON, an attempt count that is not a small integer."""
    runnable = []
    for row in rows:
        if row[3] is None:
            why = "its payload was pruned; there is nothing to run it on"
        elif not is_int(row[5], 0, MAX_COUNT - 1):
            why = f"attempts is {str(row[5])[:40]!r}, not a count"
        else:
            try:
                runnable.append(event_from_row(row, strict=True))
                continue
            except tx.row_errors as exc:
                why = f"its payload cannot be read ({reason(exc)})"
        tx.run("event_set_aside", id=row[0], error="set aside, not run: " + why, now=now)
        set_aside(tx)
    return runnable


def recover_lost_claims(
    tx: Tx, gen: int, now: int, settings: Settings, lost: Sequence[Sequence[Any]]
) -> None:
    """The `lost` rows (id, source, claim_gen, run_id: running under an older generation, or
    past the run budget) go back to pending (not backed off: the lease expiry already
    delayed them) or, under the interrupt policy, to interrupted; their runs close as lost."""
    for event_id, source, claim_gen, run_id in lost:
        why = (
            f"generation {claim_gen} lost its lease"
            if claim_gen != gen
            else f"ran past max_run_seconds ({settings.max_run_seconds} s)"
        )
        # What matters most comes first: lists cut long reasons at their width.
        if settings.lost_claim_policy(source) == "interrupt":
            tx.run(
                "event_interrupt",
                id=event_id,
                error="completion uncertain: run lost, " + why,
                now=now,
            )
        else:
            tx.run("event_requeue_lost", id=event_id, error="run lost: " + why, now=now)
        tx.run("run_lost", id=run_id, error="run lost: " + why, now=now)


def bury_exhausted(tx: Tx, now: int, settings: Settings) -> int:
    """Pending rows out of attempts become dead, keeping why."""
    return tx.run("bury_exhausted", now=now, max_attempts=settings.max_attempts).rowcount


def runs_since(tx: Tx, since: int) -> int:
    runs: int = tx.one("runs_since", since=since)[0]
    return runs


# finish's arguments after tx, as Inbox checked them.
Outcome = tuple[
    str,
    int,
    Sequence[int],
    Sequence[Reply],
    str | None,
    str | None,
    Sequence[ApprovalRequest],
    Sequence[FollowUp],
    int | None,
    int | None,
    str | None,
]


def finish_and_claim(
    tx: Tx, outcome: Outcome, timers: bool, mark: bool
) -> tuple[bool, Claimed | None]:
    """finish, then claim_next for the same holder and generation, in this one transaction:
    (False, None) when the finish was refused (the claim is not tried: the generation no
    longer holds). The claim decides on the finish's read of the lease, the settings and
    the pause switch: a finish changes none of them."""
    state = tx.state()
    # A claim that fires no timers looks at what the finish left, and a finish changes no
    # pending event: the dialect may read the claim's look with the finish.
    settings = state.settings
    look = None if timers else (settings.max_attempts, settings.max_batch)
    if not finish(tx, *outcome, state=state, look=look):
        return False, None
    holder, gen, now = outcome[0], outcome[1], outcome[8]
    return True, claim_next(tx, holder, gen, now, timers, mark, state)


def finish(
    tx: Tx,
    holder: str,
    gen: int,
    ids: Sequence[int],
    replies: Sequence[Reply],
    error: str | None,
    result: str | None,
    approvals: Sequence[ApprovalRequest],
    followups: Sequence[FollowUp],
    now: int | None,
    run: int | None = None,
    traceback: str | None = None,
    state: InboxState | None = None,
    look: tuple[int, int] | None = None,
) -> bool:
    """Commit a run's outcome and everything it produced, fenced (by generation, and by run
    when `run` is given), all or nothing: success marks the events done and queues the
    run's messages, approval requests and follow-up timers in this one transaction; failure
    puts the events back to pending after a backoff, or to dead once out of attempts.
    `state` is the transaction's own read of the lease and settings, when it made one;
    `look`, the claim's look that follows (Tx.finish_done)."""
    now = tx.now(now)
    if state is None:
        state = tx.state()
    settings = state.settings
    # The common case (a worker's run done, within its lease and budget) reads the run and
    # writes its rows in one step (tx.finish_done: one round trip on PostgreSQL), which
    # writes nothing unless the run is this generation's open run; every other case reads
    # the run first and decides below, in the same order.
    rows: list[Row] | None = None
    if (
        run is not None
        and error is None
        and state.holds(holder, gen, now)
        and not _too_many_followups(settings, followups)
    ):
        known, rows = tx.finish_done(ids, gen, run, now, result, traceback, look)
    else:
        # The run's generation and outcome (None: still open), read once for both questions.
        known = None if run is None else tx.run("run_outcome", id=run).fetchone()
    if known is not None and known[0] == gen and known[1] == ("done" if error is None else "error"):
        # The same finish again, after an answer lost on the way back (a connection cut
        # after its COMMIT): the run is closed already, by this generation, as asked. That
        # is the truth to report, not a stale write to audit against the worker.
        return True
    if not state.holds(holder, gen, now):
        refuse(tx, "finish", holder, gen, now)
        return False
    if run is not None and (known is None or known[0] != gen or known[1] is not None):
        refuse(
            tx,
            "finish",
            holder,
            gen,
            now,
            f"run {run} is not an open run of this generation (recovered or finished)",
        )
        return False
    if _too_many_followups(settings, followups):
        raise BadInput(
            f"run asks for {len(followups)} follow-up timers; the budget "
            f"max_followups_per_run allows {settings.max_followups_per_run}"
        )
    closed = rows is not None  # finish_done closed the run where it could
    if rows is None:
        fence = {"ids": list(ids), "gen": gen, "run": run}
        if error is None:  # marked done and read back in one statement: the rows still held
            rows = tx.run("events_finish_done", now=now, **fence).fetchall()
        else:
            rows = tx.run("events_still_claimed", **fence).fetchall()
    if not rows:
        refuse(
            tx,
            "finish",
            holder,
            gen,
            now,
            "none of these events is still claimed by this generation",
        )
        return False
    run_ids = sorted({r[2] for r in rows if r[2] is not None})
    if error is None:
        run_id = run_ids[0] if run_ids else None
        for reply in replies:
            tx.run("outbox_insert", body=reply.body, urgent=reply.urgent, now=now, run=run_id)
        for request in approvals:
            request_approval(
                tx, request.request_id, request.expires_in, request.action, now, run_id
            )
        for timer in followups:
            add_timer(
                tx,
                timer.timer_id,
                timer.due,
                timer.payload,  # JSON text: checked and encoded by the Inbox
                timer.every,
                timer.key,
                timer.catch_up,
                "timer",
            )
        outcome = "done"
    else:
        for event_id, attempts, _ in rows:
            if not is_int(attempts, 0, MAX_COUNT) or attempts >= settings.max_attempts:
                why = f"too many attempts ({attempts}/{settings.max_attempts}): {error}"
                tx.run("event_bury", id=event_id, error=why, now=now)
            else:
                later = now + settings.backoff(attempts)
                tx.run("event_retry_later", id=event_id, error=error, available_at=later, now=now)
        outcome = "error"
    if run_ids and not closed:
        # A run closes when its last event is finished (a run may be finished in parts);
        # until then a lost-claim recovery can still close it as lost.
        tx.run(
            "runs_close",
            runs=run_ids,
            outcome=outcome,
            now=now,
            result=result,
            error=error,
            traceback=traceback,
        )
    return True


def _too_many_followups(settings: Settings, followups: Sequence[FollowUp]) -> bool:
    return (
        settings.max_followups_per_run is not None
        and len(followups) > settings.max_followups_per_run
    )
