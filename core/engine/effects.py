"""The effect journal: an effect (a payment, an e-mail) is recorded as intended before it
happens, fenced like every write of a run, and settled after; its idempotency key is the same
for every retry of that effect."""

from __future__ import annotations

from typing import Sequence

from ..records import Effect
from . import plans
from .decoding import effect_from_row, event_ids
from .journal import refuse
from .plans import effect_event
from .tx import Tx


def intend_effect(
    tx: Tx,
    holder: str,
    gen: int,
    run_id: int,
    name: str,
    detail: str,
    key: str | None,
    now: int | None,
    event: int | None = None,
) -> str | None:
    """Record an effect before it happens (fenced by generation and run); return its
    idempotency key, or None when refused."""
    now = tx.now(now)
    if not tx.state().holds(holder, gen, now):
        refuse(tx, f"effect {name}", holder, gen, now)
        return None
    run = tx.run("run_open", id=run_id, gen=gen).fetchone()
    if run is None:
        why = f"run {run_id} is not an open run of this generation"
        refuse(tx, f"effect {name}", holder, gen, now, why)
        return None
    event = effect_event(run_id, event_ids(run[0]), event, key, name)
    if key is None:
        assert event is not None  # no event and no key was refused above
        key = _default_key(tx, run_id, event, name)
    tx.run("effect_insert", run=run_id, name=name, key=key, detail=detail, now=now, event=event)
    return key


def _default_key(tx: Tx, run_id: int, event: int, name: str) -> str:
    """The key plans.py derives from what the effect is for (`effect_key`)."""
    intended = tx.one("effects_intended", run=run_id, name=name, event=event)[0]
    found = tx.run("event_key_salt", id=event).fetchone()
    return plans.effect_key(tx.meta("uid"), event, name, intended, found and found[0])


def settle_effect(tx: Tx, key: str, state: str, now: int | None) -> bool:
    """Record that an intended effect happened (or failed); facts are recorded unfenced.
    The newest intent under this key is the one settled (older ones belong to earlier, lost
    runs of the same events and stay as they were left)."""
    return tx.run("effect_settle", key=key, state=state, now=tx.now(now)).rowcount == 1


def effects_for_runs(tx: Tx, run_ids: Sequence[int]) -> list[Effect]:
    return [effect_from_row(r) for r in tx.run("effects_for_runs", runs=list(run_ids))]
