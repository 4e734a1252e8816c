"""The lease: one worker per inbox, generations that fence every write of a lost one."""

from __future__ import annotations

from ..clock import MAX_DURATION, MAX_TIME
from .decoding import is_int
from .journal import refuse
from .tx import Tx

MAX_GEN = 1 << 62


def acquire(tx: Tx, holder: str, now: int | None, fresh: bool = False) -> int | None:
    """Renew an unexpired lease (same generation) or take over an expired one (the next
    generation); None while someone else holds it. With `fresh` (a worker starting) a live
    lease is never continued, not even one under the same holder name: two workers started
    under one name cannot both get the generation, one decision in one transaction."""
    now = tx.now(now)
    state = tx.state()
    ttl = state.settings.lease_ttl
    if state.holder is None:
        tx.run("lease_first", holder=holder, until=now + ttl)
        tx.run("lease_history_insert", gen=1, holder=holder, previous=None, at=now, how="first")
        return 1
    current, gen, until = state.holder, state.gen, state.until
    if not is_int(gen, 1, MAX_GEN):  # a lease row edited by hand: continue its history
        gen = tx.one("lease_history_last_gen")[0]
        until = now - 1
    elif not is_int(until, -1, MAX_TIME + MAX_DURATION):
        until = now - 1  # an expiry that is not a time has expired: a takeover follows
    if until >= now:
        if current != holder or fresh:
            return None
        if until != now + ttl:  # renewing to the same expiry writes nothing (no fsync)
            tx.run("lease_extend", until=now + ttl)
        return int(gen)
    # A lease its holder handed back (a clean restart) is a succession, not a takeover: only
    # a lease left to expire means a worker died or stalled.
    released = tx.meta("released_gen") == gen
    gen = int(gen) + 1
    tx.run("lease_take", holder=holder, gen=gen, until=now + ttl)
    how = "released" if released else "takeover"
    tx.run("lease_history_insert", gen=gen, holder=holder, previous=current, at=now, how=how)
    if not released:
        tx.bump("takeovers")
    return gen


def renewed_without_write(tx: Tx, holder: str, now: int | None, fresh: bool = False) -> int | None:
    """The generation `acquire(holder, now)` would return if it would write nothing (the
    holder renewing to the expiry it already has); None when a write transaction must
    decide. Run outside a transaction: `state` is one statement, so one read snapshot."""
    if fresh:
        return None
    now = tx.now(now)
    state = tx.state()
    if state.holder != holder or not is_int(state.gen, 1, MAX_GEN):
        return None
    if type(state.until) is int and state.until == now + state.settings.lease_ttl:
        return int(state.gen)
    return None


def renew(tx: Tx, holder: str, gen: int, now: int | None) -> bool:
    """Extend the lease for exactly this holder and generation (a fenced renewal). A lease
    that lapsed while nobody took it over (the generation is still this one: a takeover
    would have made the next) is renewed too: a worker whose renewal came late, or whose
    wall clock stepped forward, keeps its run rather than abandon it to nobody. A lease its
    holder handed back stays handed back."""
    now = tx.now(now)
    state = tx.state()
    if not state.holds(holder, gen, now) and (
        state.holder != holder or state.gen != gen or tx.meta("released_gen") == gen
    ):
        refuse(tx, "renew", holder, gen, now)
        return False
    until = now + state.settings.lease_ttl
    if state.until != until:  # the same expiry writes nothing
        tx.run("lease_extend", until=until)
    return True


def renew_seen(tx: Tx, holder: str, gen: int, now: int | None, host: str, pid: int) -> bool:
    """renew, and the worker's heartbeat (desk.worker_seen: it runs on `host` as `pid`) in
    the same transaction: a holding worker's one commit every third of its lease, where the
    two made two. The heartbeat is recorded whatever the renewal answers: a worker whose
    lease was lost still stands by."""
    now = tx.now(now)
    renewed = renew(tx, holder, gen, now)
    tx.run("worker_seen", holder=holder, host=host, pid=pid, now=now)
    return renewed


def release_alone(tx: Tx, holder: str, gen: int, now: int | None) -> bool | None:
    """`release` in one autocommit statement where the dialect has one (PostgreSQL keeps
    the lease in the inbox's row): True once handed back, None when `release` must decide
    in a write transaction (a generation that does not hold gets its answer there)."""
    return tx.release_alone(holder, gen, tx.statement_now(now))


def release(tx: Tx, holder: str, gen: int, now: int | None) -> bool:
    """Hand the lease back so a successor need not wait for the TTL.

    Not audited: a release is routine (a fleet worker gives an idle inbox back after every
    visit), and an audit row per visit would bury the operator actions the log is for. It
    stays known: the inbox's `released_gen` says the live generation was handed back (the
    desks show it), and the successor's lease history entry says "released"."""
    now = tx.now(now)
    if not tx.state().holds(holder, gen, now):
        return False
    tx.run("lease_extend", until=now - 1)
    tx.set_meta("released_gen", gen)
    return True
