"""The Inbox's argument checks: every value an API call takes is checked here, before
anything is written, and refused with BadInput saying what was wrong."""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from typing import Any, Callable, Sequence

from .clock import MAX_COUNT, MAX_ID, check_duration, check_int, check_time, show
from .errors import BadInput
from .settings import MAX_BATCH, MAX_SPEND, MICROS, spend_unit, to_micros

CATCH_UP_POLICIES = ("coalesce", "each")
MAX_TEXT = 1024  # sources, ids, holders: keys, not documents
MAX_DEPTH = 100  # nesting of any JSON value the API takes; deeper is refused, never recursed
# The engine's own sources: approval answers and timer occurrences. Nobody else may ingest
# under them (a forged ("approval", id) would stand as the answer), and no timer may take an
# id under the engine's own prefixes (it would replace an approval's expiry).
RESERVED_SOURCES = ("approval", "timer")
RESERVED_TIMER_PREFIXES = ("approval:",)
MAX_TRACEBACK = 16_384  # a failed run's traceback: its end (the raising line) is kept


def text(name: str, value: object, *, limit: int = MAX_TEXT) -> str:
    """Non-empty text of at most `limit` characters, without NUL, encodable as UTF-8."""
    if not isinstance(value, str):
        raise BadInput(f"{name} must be a string, got {type(value).__name__}")
    if not value:
        raise BadInput(f"{name} must not be empty")
    if len(value) > limit:
        raise BadInput(f"{name} is {len(value)} characters; the limit is {limit}")
    if "\x00" in value:
        raise BadInput(f"{name} must not contain NUL characters")
    if not value.isascii():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise BadInput(f"{name} is not valid Unicode text (it has a lone surrogate)") from None
    return value


def flag(name: str, value: object) -> bool:
    """True or False, nothing else (not 0 or 1, not a truthy string)."""
    if not isinstance(value, bool):
        raise BadInput(f"{name} must be True or False, got {show(value)}")
    return value


def positive(name: str, value: object, high: int = MAX_ID) -> int:
    return check_int(value, name, 1, high)


def event_id(value: object) -> int:
    return check_int(value, "event id", 1, MAX_ID)


def source(name: str, value: object) -> str:
    """An event source an outsider may use: not one of the engine's own."""
    checked = text(name, value)
    if checked in RESERVED_SOURCES:
        raise BadInput(
            f"{name} {checked!r} is reserved for the engine's own events "
            f"(reserved: {', '.join(RESERVED_SOURCES)})"
        )
    return checked


def timer_id(value: object) -> str:
    checked = text("timer_id", value)
    if checked.startswith(RESERVED_TIMER_PREFIXES):
        raise BadInput(
            f"timer ids starting with {checked.split(':')[0]}: are reserved for the "
            f"engine's own timers"
        )
    return checked


def check_shape(value: object, what: str, limit: int) -> None:
    """Refuse JSON nested deeper than MAX_DEPTH or with more values than `limit` bytes could
    hold, walking iteratively: a deep value must be refused, never recursed into."""
    if (
        type(value) is dict
        and len(value) < limit
        and _SCALARS.issuperset(map(type, value.values()))
    ):
        return  # the common webhook body: one flat object (the walk below would say the same)
    stack = [(value, 1)]
    seen = 0
    while stack:
        item, depth = stack.pop()
        seen += 1
        if seen > limit:
            raise BadInput(
                f"{what} has more values than {limit} bytes can hold (max_payload_bytes)"
            )
        if isinstance(item, (dict, list, tuple)):
            if depth > MAX_DEPTH:
                raise BadInput(f"{what} is nested deeper than {MAX_DEPTH} levels")
            children = item.values() if isinstance(item, dict) else item
            stack.extend((child, depth + 1) for child in children)


_SCALARS = frozenset((str, int, float, bool, type(None)))  # exact types: no subclass is here
_JSON = json.JSONEncoder(ensure_ascii=False, allow_nan=False)
_JSON_ASCII = json.JSONEncoder(ensure_ascii=True, allow_nan=False)
# What _JSON.encode builds on every call, built once (no check for cycles: _check_shape has
# already refused any value with more values than the limit, so a cyclic one never gets
# here). The standard library's C encoder; without it, _JSON.encode.
_C_ENCODER: Callable[..., Callable[[object, int], Sequence[str]]] | None = getattr(
    json.encoder, "c_make_encoder", None
)  # (not in the standard library's type stubs)
_ENCODE_ONCE = (
    None
    if _C_ENCODER is None
    else _C_ENCODER(
        None, _JSON.default, json.encoder.encode_basestring, None, ": ", ", ", False, False, False
    )
)


def json_text(value: object) -> str:
    if _ENCODE_ONCE is None or type(value) is str:
        return _JSON.encode(value)
    return "".join(_ENCODE_ONCE(value, 0))


# The most characters the standard encoder writes for an int of at most 64 bits, a float
# (repr: "-2.2250738585072014e-308"), and true, false or null.
_INT_CHARS, _FLOAT_CHARS, _WORD_CHARS = 20, 24, 5
_CHAR_MOST = 12  # the bytes one character of text can take: "\ud834\udd1e"


def surely_encodable(payload: object, limit: int) -> bool:
    """True when `encode(payload, limit)` certainly accepts the payload, decided without
    encoding it: a flat object of text keys and plain values whose encoding cannot pass
    `limit` bytes even if every character took twelve (a character beyond the BMP escaped
    as a surrogate pair, when a lone surrogate makes the payload ASCII). False means only "not
    decided here": encode then decides. For a duplicate, whose payload is never stored,
    but which is refused like any other if it is bad."""
    if type(payload) is not dict or len(payload) >= limit:
        return False
    size = 2
    for key, value in payload.items():
        if type(key) is not str:
            return False
        kind = type(value)
        if kind is str:
            size += _CHAR_MOST * len(value) + 2
        elif kind is int:
            if value.bit_length() > 63:
                return False
            size += _INT_CHARS
        elif kind is bool or value is None:
            size += _WORD_CHARS
        elif kind is float:
            if value != value or value in (math.inf, -math.inf):
                return False
            size += _FLOAT_CHARS
        else:
            return False
        size += _CHAR_MOST * len(key) + 6  # the key's quotes, ": " and ", "
    return size <= limit


def encode(payload: object, limit: int, what: str = "payload") -> str:
    check_shape(payload, what, limit)
    try:
        text = json_text(payload)
    except (TypeError, ValueError, RecursionError) as exc:
        raise BadInput(f"{what} must be JSON-serialisable: {exc}") from None
    if text.isascii():
        size = len(text)
    else:
        try:
            size = len(text.encode("utf-8"))
        except UnicodeEncodeError:
            # A lone surrogate (valid in JSON as an escape, not in UTF-8): keep it escaped,
            # so the payload round-trips exactly and the database gets valid text.
            text = _JSON_ASCII.encode(payload)
            size = len(text)
    if size > limit:
        raise BadInput(f"{what} is {size} bytes; the limit is {limit} (max_payload_bytes)")
    return text


def listed(name: str, values: object, limit: int) -> list[Any]:
    """`values` as a list, refused (BadInput) unless it is a finite iterable of at most
    `limit` items; a str is not a list of anything here."""
    if (type(values) is list or type(values) is tuple) and len(values) <= limit:
        return list(values)  # exactly a list or tuple: finite, nothing of theirs overridden
    # (collections.abc's Iterable: typing's alias checks the same, several times slower)
    if isinstance(values, (str, bytes, dict)) or not isinstance(values, Iterable):
        raise BadInput(f"{name} must be a list")
    items = []
    for item in values:
        items.append(item)
        if len(items) > limit:
            raise BadInput(f"{name} has more than {limit} items")
    return items


def actor(actor: object) -> str:
    return text("actor", actor, limit=200)


def reason(reason: object) -> str | None:
    return None if reason is None else text("reason", reason, limit=2000)


def timer(
    timer_id_: object,
    due: object,
    payload: object,
    every: object,
    key: object,
    catch_up: object,
    limit: int,
) -> str:
    """A timer definition's checks; returns its payload as JSON text."""
    timer_id(timer_id_)
    check_time(due, "due")
    if every is not None:
        check_duration(every, "every")
    if catch_up not in CATCH_UP_POLICIES:
        raise BadInput(f"catch_up must be one of {CATCH_UP_POLICIES}, got {show(catch_up)}")
    if key is not None:
        if every is not None:
            raise BadInput("a fixed event key is only allowed on a one-off timer")
        if not (isinstance(key, tuple) and len(key) == 2):
            raise BadInput("key must be a (source, source_id) tuple")
        source("key source", key[0])
        text("key source_id", key[1])
    return encode(payload, limit)


MAX_BATCH_IDS = MAX_BATCH  # ids one finish may name: what one claim can hand out


# --- the run's transcript and spend --------------------------------------------------------

LOG_LEVELS = ("debug", "info", "warning", "error", "critical", "spend", "log")
MAX_LOG_LINE = 16_384 + 64  # a line's text (core/engine/transcripts.py MAX_LINE, its cut note)
MAX_LOGGER = 200


def _log_text(name: str, value: object, limit: int) -> str:
    """Text of a transcript line: may be empty, otherwise as `text` requires."""
    if value == "":
        return ""
    return text(name, value, limit=limit)


def log_line(line: object) -> tuple[int, int, str, str | None, str, str | None]:
    """A transcript line as `Inbox.append_transcript` takes it: (seq, at, level, logger,
    text, fields as the JSON text of an object, or None)."""
    if not (isinstance(line, tuple) and len(line) == 6):
        raise BadInput("a transcript line is (seq, at, level, logger, text, fields)")
    seq, at, level, logger, body, fields = line
    check_int(seq, "seq", 0, MAX_COUNT)
    check_time(at, "at")
    if level not in LOG_LEVELS:
        raise BadInput(f"level must be one of {LOG_LEVELS}, got {show(level)}")
    if logger is not None:
        text("logger", logger, limit=MAX_LOGGER)
    _log_text("text", body, MAX_LOG_LINE)
    if fields is not None:
        _log_text("fields", fields, MAX_LOG_LINE)
        try:
            decoded = json.loads(fields)
        except (ValueError, RecursionError):  # not JSON, or nested past the parser
            decoded = None
        if not isinstance(decoded, dict):
            raise BadInput("fields must be the JSON text of an object")
    return line  # checked item by item above


def spend_record(item: object) -> tuple[int, int, str, int, str | None]:
    """A spend as `Inbox.append_transcript` takes it: (seq of its line, at, unit,
    millionths of the unit, note or None)."""
    if not (isinstance(item, tuple) and len(item) == 5):
        raise BadInput("a spend is (seq, at, unit, micros, note)")
    seq, at, unit, micros, note = item
    check_int(seq, "seq", 0, MAX_COUNT)
    check_time(at, "at")
    if spend_unit(unit) != unit:
        raise BadInput(f"unit {unit!r} must be written in lower case")
    check_int(micros, "micros", 0, MAX_SPEND * MICROS)
    if note is not None:
        text("note", note, limit=MAX_LOGGER)
    return item  # checked item by item above


def budget_change(
    target: object, expect: object, value: object
) -> tuple[str, str | None, int | None, int]:
    """raise_budget's target ("max_spend_per_day usd" or "max_runs_per_day"), the limit the
    operator saw and the new one: (budget, unit or None, expected, new), spend in
    millionths."""
    name = text("budget", target, limit=100)
    budget, _, unit = name.partition(" ")
    if budget == "max_spend_per_day":
        if not unit:
            raise BadInput("max_spend_per_day is per unit: name it ('max_spend_per_day usd')")
        unit = spend_unit(unit)
        new = to_micros(value, "the new limit")
        if new == 0:
            raise BadInput("the new limit must be more than 0")
        expected = None if expect is None else to_micros(expect, "expect")
        return budget, unit, expected, new
    if budget == "max_runs_per_day" and not unit:
        if value is None:
            raise BadInput("raise_budget needs the new limit (value=)")
        return (
            budget,
            None,
            None if expect is None else check_int(expect, "expect", 1, MAX_COUNT),
            check_int(value, "the new limit", 1, MAX_COUNT),
        )
    raise BadInput(
        f"a budget to raise is 'max_spend_per_day UNIT' or 'max_runs_per_day', got {show(name)}"
    )
