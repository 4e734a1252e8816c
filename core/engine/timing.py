"""When a timer fires and what it fires, the same on every backend: its first occurrence not
fired yet, the events a scheduler pass turns it into (one-shot, coalesced catch-up or one
event each), and how its row moves on.

Plain Python over a timer already read and checked (decoding.py `checked_timer`); the
scheduler (timers.py) writes the plan. Nothing here imports a driver.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Sequence

from ..clock import MAX_DURATION, MAX_TIME
from .decoding import DECODE_ERRORS, is_int
from ..records import Timer
from .tx import NewEvent, TimerAdvance

_JSON_STRING = json.encoder.encode_basestring_ascii  # what json.dumps does with a str
_JSON_DECODE = json.JSONDecoder().decode  # json.loads of a str, without its type checks


def first_unfired(timer: Timer) -> int:
    """The first scheduled time not yet turned into an event. A recurring timer whose
    definition was registered again (same or earlier due) keeps what it already fired, so
    those occurrences (and their overflow) are not counted a second time."""
    due, every = timer.due, timer.every
    if every is not None and timer.last_fired is not None and due <= timer.last_fired:
        due += ((timer.last_fired - due) // every + 1) * every
    return due


def occurrence(
    timer: Timer, scheduled: int, now: int, skipped: int, **extra: Any
) -> dict[str, Any]:
    """The payload of the event one occurrence of `timer` becomes."""
    return {
        "timer": timer.id,
        "scheduled_for": scheduled,
        "late_by": now - scheduled,
        "skipped": skipped,
        "data": timer.payload,
        **extra,
    }


@dataclass(frozen=True, slots=True)
class Firing:
    """What one scheduler pass does with one due timer (not an approval's expiry): the
    events to insert, in order, as (source, source_id, payload), and the timer's row after.
    A key already stored is a duplicate, not an error (the stores insert ON CONFLICT DO
    NOTHING)."""

    events: list[tuple[str, str, dict[str, Any]]]
    due: int | None  # the row's next due; None: a one-shot timer, deleted once fired
    fired: int | None  # the row's new last_fired; None (with skipped): both stay as they are
    skipped: int | None  # the row's new last_skipped
    overflow: int  # added to the row's overflow count


def firing(timer: Timer, now: int, catch_up_limit: int) -> Firing:
    """The plan for `timer`, due at or before `now`: a one-shot timer fires once under its
    key (or `timer`, `id@due`) and goes; a recurring one fires its first occurrence not
    fired yet and after (or only moves its due there when that is still to come): 'coalesce'
    one event for the latest occurrence, counting the ones it skipped; 'each' one event per
    occurrence, the newest `catch_up_limit` of them, counting the older ones as overflow."""
    if timer.every is None:
        source, source_id = timer.key or ("timer", f"{timer.id}@{timer.due}")
        return Firing(
            [(source, source_id, occurrence(timer, timer.due, now, 0))], None, None, None, 0
        )
    every = timer.every
    due = first_unfired(timer)
    if due > now:
        return Firing([], due, None, None, 0)
    if timer.catch_up == "coalesce":
        missed = (now - due) // every  # occurrences before the latest one
        latest = due + missed * every
        event = ("timer", f"{timer.id}@{latest}", occurrence(timer, latest, now, missed))
        return Firing([event], latest + every, latest, missed, 0)
    count = (now - due) // every + 1
    overflow = max(count - catch_up_limit, 0)
    first = due + overflow * every  # the newest `catch_up_limit` occurrences get events
    latest = due + (count - 1) * every
    events = []
    for index, scheduled in enumerate(range(first, latest + 1, every)):
        extra = {"overflow": overflow} if index == 0 and overflow else {}
        events.append(
            ("timer", f"{timer.id}@{scheduled}", occurrence(timer, scheduled, now, 0, **extra))
        )
    return Firing(events, latest + every, latest, overflow, overflow)


def plain_occurrence(row: Sequence[Any], now: int, json_proven: bool) -> NewEvent | None:
    """The event row (source, source_id, payload, now) a valid one-shot plain
    timer fires, its payload `json.dumps` of `occurrence`'s dict (with the stored payload
    text as the data, which decodes to the same value); None for any other row: recurring,
    an approval's expiry, or anything `checked_timer` would refuse.

    `row` is in TIMER_COLUMNS order; `json_proven` says the store's own JSON check already
    took the payload (SQLite's json_valid: strict RFC 8259, stricter than Python's decoder
    except for nesting, which Python refuses past its recursion limit). Otherwise, or with
    many brackets, the payload is decoded here: it is never spliced unless it is one whole
    JSON value that Python's decoder takes."""
    timer_id, due, every, catch_up, payload, key_source, key_id, last_fired, _, overflow, kind = (
        row[:11]
    )
    if (
        every is not None
        or kind != "timer"
        or type(timer_id) is not str
        or not is_int(due, 0, MAX_TIME)
        or catch_up not in ("coalesce", "each")
        or not is_int(overflow, 0, 1 << 62)
        or (last_fired is not None and not is_int(last_fired, 0, MAX_TIME))
    ):
        return None
    if key_source is None:
        source, source_id = "timer", f"{timer_id}@{due}"
    elif type(key_source) is str and type(key_id) is str:
        source, source_id = key_source, key_id
    else:
        return None
    data = _stored_json(payload, json_proven)
    if data is None:
        return None
    text = (
        f'{{"timer": {_JSON_STRING(timer_id)}, "scheduled_for": {due}, '
        f'"late_by": {now - due}, "skipped": 0, "data": {data}}}'
    )
    return source, source_id, text, now


def plain_recurring(
    row: Sequence[Any], now: int, json_proven: bool
) -> tuple[NewEvent, TimerAdvance] | None:
    """What a valid recurring timer due now fires, when that is one event (`coalesce`, or
    `each` with one occurrence due: the same plan), as `firing` would plan it: the event row
    (its payload spliced from the stored JSON text, as `plain_occurrence` does) and the
    timer's advance. None for anything else, which takes `firing`'s path."""
    timer_id, due, every, catch_up, payload, key_source, _, last_fired, _, overflow, kind = row[:11]
    if (
        every is None
        or kind != "timer"
        or key_source is not None
        or type(timer_id) is not str
        or not is_int(due, 0, MAX_TIME)
        or not is_int(every, 1, MAX_DURATION)
        or catch_up not in ("coalesce", "each")
        or not is_int(overflow, 0, 1 << 62)
        or (last_fired is not None and not is_int(last_fired, 0, MAX_TIME))
    ):
        return None
    if last_fired is not None and due <= last_fired:  # first_unfired
        due += ((last_fired - due) // every + 1) * every
    if due > now:
        return None
    missed = (now - due) // every  # occurrences before the latest one
    if missed and catch_up != "coalesce":
        return None
    data = _stored_json(payload, json_proven)
    if data is None:
        return None
    latest = due + missed * every
    text = (
        f'{{"timer": {_JSON_STRING(timer_id)}, "scheduled_for": {latest}, '
        f'"late_by": {now - latest}, "skipped": {missed}, "data": {data}}}'
    )
    return ("timer", f"{timer_id}@{latest}", text, now), (
        timer_id,
        latest + every,
        latest,
        missed,
        0,
    )


def _stored_json(payload: Any, json_proven: bool) -> str | None:
    """A stored timer payload as JSON text to splice (None: not one whole JSON value)."""
    if payload is None:
        return "null"
    if type(payload) is not str:
        return None
    if not json_proven or payload.count("[") + payload.count("{") > 100:
        try:
            _JSON_DECODE(payload)
        except DECODE_ERRORS:
            return None
    return payload


def approval_timer(request_id: str) -> str:
    """The id of the timer that expires an approval request at its deadline."""
    return f"approval:{request_id}"
