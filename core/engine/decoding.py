"""Stored rows read back, the same on every backend: the records a listing shows, and the
checks that judge a row no valid call could have written (edited by hand, or by another
version) and say why it is set aside.

Plain Python over rows already read, in the column order of the named statements that read
them (events as `EVENT_COLUMNS`, timers as `TIMER_COLUMNS`, …): no driver is imported here.
Each dialect adds its driver's errors to `DECODE_ERRORS` to make its `row_errors`.
"""

from __future__ import annotations

import json
from typing import Any, Sequence

from ..clock import MAX_DURATION, MAX_TIME
from ..records import AuditEntry, Delivery, Effect, Event, Message, Run, Timer
from ..settings import Settings

EVENT_COLUMNS = (
    "id, source, source_id, payload, status, attempts, claim_gen, error, created, "
    "updated, available_at, claimed_at, run_id"
)
TIMER_COLUMNS = (
    "id, due, every, catch_up, payload, key_source, key_id, last_fired, "
    "last_skipped, overflow, kind, broken"
)
# What decoding or checking a stored row raises when the row is not something the engine
# can process: the row is set aside with the reason, the pass goes on. Anything else
# (disk, locks, a lost connection) still stops the transaction.
DECODE_ERRORS: tuple[type[BaseException], ...] = (
    ValueError,
    TypeError,
    OverflowError,
    KeyError,
    IndexError,
    AttributeError,
    RecursionError,
)


def loads(text: str | None) -> Any:
    return None if text is None else json.loads(text)


def shown(text: Any) -> Any:
    """Decoded JSON for a listing; a stored value that does not decode (a row edited by
    hand) is shown as it is stored instead of failing the whole list."""
    try:
        return loads(text)
    except DECODE_ERRORS:
        return text


def is_int(value: Any, low: int, high: int) -> bool:
    return type(value) is int and low <= value <= high


def reason(exc: BaseException) -> str:
    """An error as the reason a row was set aside (bounded: lists show it)."""
    return f"{type(exc).__name__}: {str(exc)[:300]}"


def not_fired(exc: BaseException) -> str:
    """What a set-aside timer's `broken` column says."""
    return "set aside, not fired: " + reason(exc)


_settings_cache: dict[str, Settings] = {}
# Shared, as the decoded ones are: a Settings is frozen and its mappings are never written.
_DEFAULT_SETTINGS = Settings()


def settings_from(text: str | None) -> Settings:
    """The settings stored as `text`, None meaning the defaults (decoded once per distinct
    text: every transaction reads them)."""
    if text is None:
        return _DEFAULT_SETTINGS
    cached = _settings_cache.get(text)
    if cached is None:
        cached = _settings_cache[text] = Settings.from_json(text)
    return cached


def event_from_row(row: Sequence[Any], strict: bool = False) -> Event:
    """The event in `row`; strict (for a claim), a payload that does not decode raises."""
    payload = loads(row[3]) if strict else shown(row[3])
    return Event(
        row[0],
        row[1],
        row[2],
        payload,
        row[4],
        row[5],
        row[6],
        row[7],
        row[8],
        row[9],
        row[10],
        row[11],
        row[12],
    )


def timer_from_row(row: Sequence[Any]) -> Timer:
    key = (row[5], row[6]) if row[5] is not None else None
    payload = shown(row[4])  # the scheduler sets aside a timer whose payload does not decode
    return Timer(
        row[0], row[1], row[2], row[3], payload, key, row[7], row[8], row[9], row[10], row[11]
    )


def checked_timer(row: Sequence[Any]) -> Timer:
    """The timer in `row`, or ValueError naming what no valid call could have stored."""
    timer = timer_from_row(row)
    if not is_int(timer.due, 0, MAX_TIME):
        raise ValueError(f"due is {str(timer.due)[:40]!r}, not a time")
    if timer.every is not None and not is_int(timer.every, 1, MAX_DURATION):
        raise ValueError(f"every is {str(timer.every)[:40]!r}, not a duration")
    if timer.last_fired is not None and not is_int(timer.last_fired, 0, MAX_TIME):
        raise ValueError(f"last_fired is {str(timer.last_fired)[:40]!r}, not a time")
    if not is_int(timer.overflow, 0, 1 << 62):
        raise ValueError(f"overflow is {str(timer.overflow)[:40]!r}, not a count")
    if timer.catch_up not in ("coalesce", "each"):
        raise ValueError(f"catch_up is {str(timer.catch_up)[:40]!r}")
    if isinstance(row[4], str):
        json.loads(row[4])  # raises if the payload is not JSON
    elif row[4] is not None:  # a blob or a number stored by hand
        raise ValueError(f"payload is {type(row[4]).__name__}, not JSON text")
    return timer


def event_ids(text: Any) -> tuple[int, ...]:
    """A run's stored list of event ids; () for one that does not decode to a list."""
    ids = shown(text)
    return tuple(ids) if isinstance(ids, list) else ()


def shown_status(status: str, at_most_once: Any, retry_after: Any, now: int | None) -> str:
    """A delivery's status as shown: an at-most-once send still 'sending' past its
    retry_after was cut off mid-send, and is 'uncertain'."""
    if (
        status == "sending"
        and at_most_once
        and now is not None
        and isinstance(retry_after, int)
        and retry_after < now
    ):
        return "uncertain"
    return status


# The rows of the listings: each from its store's SELECT, in the column order named.


def message_from_row(r: Sequence[Any]) -> Message:
    """From `id, body, urgent, created, status, run_id, delivery_id`."""
    return Message(r[0], r[1], bool(r[2]), r[3], r[4], r[5], r[6])


def delivery_from_row(r: Sequence[Any], key: str, now: int | None) -> Delivery:
    """From `id, status, attempts, created, message count, sent_at, last_error, NOT paced,
    at_most_once, retry_after, broken`; with `now`, a send cut off shows as 'uncertain'."""
    return Delivery(
        r[0],
        key,
        shown_status(r[1], r[8], r[9], now),
        r[2],
        r[3],
        r[4],
        r[5],
        r[10] or r[6],
        bool(r[7]),
    )


def audit_entry_from_row(r: Sequence[Any]) -> AuditEntry:
    """From `id, at, actor, action, target, before, after, applied, reason`."""
    return AuditEntry(r[0], r[1], r[2], r[3], r[4], r[5], r[6], bool(r[7]), r[8])


def run_from_row(r: Sequence[Any]) -> Run:
    """From `id, holder, gen, event_ids, claimed_at, finished_at, outcome, result, error,
    traceback`."""
    return Run(r[0], r[1], r[2], event_ids(r[3]), r[4], r[5], r[6], shown(r[7]), r[8], r[9])


def effect_from_row(r: Sequence[Any]) -> Effect:
    """From `id, run_id, name, key, state, detail, intended_at, settled_at`."""
    return Effect(r[0], r[1], r[2], r[3], r[4], shown(r[5]), r[6], r[7])
