"""Durable timers: registering, cancelling, and when the next one is due (the pass that
fires them is scheduler.py)."""

from __future__ import annotations

from .tx import Tx


def add_timer(
    tx: Tx,
    timer_id: str,
    due: int,
    payload: str,
    every: int | None,
    key: tuple[str, str] | None,
    catch_up: str,
    kind: str,
) -> None:
    """Register or replace a timer's definition (`payload` is JSON text); what it last
    fired is kept, and a definition replaced by a valid one is no longer set aside."""
    key_source, key_id = key if key is not None else (None, None)
    tx.run(
        "timer_upsert",
        id=timer_id,
        kind=kind,
        due=due,
        every=every,
        catch_up=catch_up,
        payload=payload,
        key_source=key_source,
        key_id=key_id,
    )


def cancel_timer(tx: Tx, timer_id: str) -> bool:
    return tx.run("timers_delete", ids=[timer_id]).rowcount == 1


def next_timer_due(tx: Tx) -> int | None:
    """The earliest due of the timers the scheduler can fire (set-aside ones never fire)."""
    due: int | None = tx.one("timer_next_due")[0]
    return due
