"""Inbox settings: stored in the database so worker, scheduler, receiver and TUI agree."""

from __future__ import annotations

import dataclasses
import json
import re
from dataclasses import dataclass, field
from decimal import ROUND_HALF_EVEN, Decimal, InvalidOperation
from typing import Any, Mapping, TypeGuard

from .clock import MAX_COUNT, MAX_DURATION, show
from .errors import BadInput

LOST_CLAIM_POLICIES = ("retry", "interrupt")
MAX_BATCH = 10_000  # events per claim (and ids per finish): well inside SQLite's bound params
MAX_PAYLOAD = 1 << 28  # 256 MiB: inside SQLite's default limit on one value
DELIVERY_MODES = ("at_least_once", "at_most_once")


@dataclass(frozen=True, slots=True)
class Settings:
    """Every tunable rule of one inbox. Budgets set to None are unlimited."""

    max_attempts: int = 3
    lease_ttl: int = 120
    outbox_gap: int = 3600
    backoff_base: int = 10
    backoff_cap: int = 3600
    max_batch: int = 20
    on_lost_claim: str = "retry"
    # Per-source overrides of on_lost_claim, e.g. {"stripe": "interrupt"}.
    lost_claim_by_source: Mapping[str, str] = field(default_factory=dict)
    max_payload_bytes: int = 1 << 20
    catch_up_limit: int = 100
    delivery: str = "at_least_once"
    max_delivery_attempts: int = 5
    # How long a dispatcher may take to report a send before another may retry it.
    send_timeout: int = 300
    # Budgets (docs/rules.md#budgets). Each names what happens to the excess.
    max_runs_per_day: int | None = None  # excess delayed: claims wait for the window
    max_pending: int | None = None  # excess refused: ingest raises BudgetExceeded
    max_followups_per_run: int | None = None  # excess refused: finish raises BadInput
    max_run_seconds: int | None = None  # excess treated as a lost claim
    # Spend per unit in the last 24 hours, e.g. {"usd": 5}: excess delayed like runs.
    max_spend_per_day: Mapping[str, float] = field(default_factory=dict)
    # A run's transcript (ctx.log and logging during the run), in characters: its beginning
    # and its end are kept past it (docs/rules.md#the-runs-transcript); 0 keeps none.
    max_transcript_chars: int = 200_000

    def lost_claim_policy(self, source: str) -> str:
        """The lost-claim policy that applies to events from `source`."""
        return self.lost_claim_by_source.get(source, self.on_lost_claim)

    def backoff(self, attempts: int) -> int:
        """Seconds to wait before retrying after the `attempts`-th failed attempt."""
        exponent = max(attempts - 1, 0)
        if exponent > 62:
            return self.backoff_cap
        return min(self.backoff_cap, self.backoff_base * (1 << exponent))

    def spend_limit(self, unit: str) -> int | None:
        """The max_spend_per_day of `unit` in millionths of the unit, or None (no limit)."""
        limit = self.max_spend_per_day.get(unit)
        return None if limit is None else to_micros(limit)

    def to_json(self) -> str:
        data = dataclasses.asdict(self)
        data["lost_claim_by_source"] = dict(self.lost_claim_by_source)
        data["max_spend_per_day"] = dict(self.max_spend_per_day)
        return json.dumps(data, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "Settings":
        """The stored settings; a value that is not valid (a row edited by hand or written by
        another version) falls back to its default rather than stopping every pass."""
        known = {f.name for f in dataclasses.fields(cls)}
        try:
            stored = json.loads(text)
        except (TypeError, ValueError, RecursionError):
            return cls()
        if not isinstance(stored, dict):
            return cls()
        data = {}
        for name, value in stored.items():
            if name in known:
                try:
                    _check(name, value)
                except BadInput:
                    continue
                data[name] = value
        try:
            return cls().replace(data)
        except BadInput:  # e.g. backoff_cap below backoff_base: keep the defaults for those
            return cls().replace(
                {k: v for k, v in data.items() if k not in ("backoff_cap", "backoff_base")}
            )

    def replace(self, changes: Mapping[str, Any]) -> "Settings":
        """Return a validated copy with `changes` applied; raise BadInput naming the bad one."""
        fields = {f.name: f for f in dataclasses.fields(self)}
        for name in changes:
            if name not in fields:
                raise BadInput(f"unknown setting {name!r}; known: {', '.join(sorted(fields))}")
        changes = dict(changes)
        if "max_spend_per_day" in changes and changes["max_spend_per_day"] is None:
            changes["max_spend_per_day"] = {}  # none: no spend budget, as for the others
        for name, value in changes.items():
            _check(name, value)
        if "max_spend_per_day" in changes:
            changes["max_spend_per_day"] = dict(changes["max_spend_per_day"])
        updated = dataclasses.replace(self, **changes)
        if updated.backoff_cap < updated.backoff_base:
            raise BadInput("backoff_cap must be at least backoff_base")
        return updated


# Upper bounds, so that no stored setting can make later arithmetic overflow SQLite's int64
# (now + lease_ttl, now + backoff, due + every) or a statement exceed SQLite's limits.
_POSITIVE = {
    "max_attempts": MAX_COUNT,
    "lease_ttl": MAX_DURATION,
    "max_batch": MAX_BATCH,
    "max_payload_bytes": MAX_PAYLOAD,
    "catch_up_limit": MAX_BATCH,
    "max_delivery_attempts": MAX_COUNT,
    "send_timeout": MAX_DURATION,
    "backoff_base": MAX_DURATION,
    "backoff_cap": MAX_DURATION,
}
_NON_NEGATIVE = {"outbox_gap": MAX_DURATION, "max_transcript_chars": MAX_PAYLOAD}
_OPTIONAL_POSITIVE = {
    "max_runs_per_day": MAX_COUNT,
    "max_pending": MAX_COUNT,
    "max_followups_per_run": MAX_COUNT,
    "max_run_seconds": MAX_DURATION,
}
MAX_SOURCES = 1000  # entries of lost_claim_by_source
# Spend is counted in millionths of its unit (integers add up exactly); one amount, and one
# budget, is at most MAX_SPEND units, so no sum of a day's records can overflow.
MICROS = 1_000_000
MAX_SPEND = 1_000_000_000
MAX_UNITS = 20  # entries of max_spend_per_day
UNIT = re.compile(r"[a-z0-9][a-z0-9_.-]{0,31}")


def spend_unit(value: object) -> str:
    """A spend unit: 1–32 lower-case letters, digits, '_', '.' or '-' ("usd", "tokens");
    upper case is taken as lower case (USD is usd)."""
    if not isinstance(value, str) or not UNIT.fullmatch(value.lower()):
        raise BadInput(
            f"a spend unit is 1 to 32 letters, digits, '_', '.' or '-' (like usd or "
            f"tokens), got {show(value)}"
        )
    return value.lower()


def to_micros(amount: object, name: str = "amount") -> int:
    """`amount` (an int, a float or a Decimal, 0 to MAX_SPEND) in millionths, rounded to the
    nearest; BadInput for anything else (a bool, NaN, infinity, a negative amount)."""
    if isinstance(amount, bool) or not isinstance(amount, (int, float, Decimal)):
        raise BadInput(f"{name} must be a number, got {show(amount)}")
    try:
        exact = Decimal(amount) if isinstance(amount, (int, Decimal)) else Decimal(repr(amount))
        ok = exact.is_finite() and 0 <= exact <= MAX_SPEND
    except (InvalidOperation, ValueError):
        ok = False
    if not ok:
        raise BadInput(f"{name} must be a number from 0 to {MAX_SPEND:,}, got {show(amount)}")
    return int((exact * MICROS).to_integral_value(ROUND_HALF_EVEN))


def from_micros(micros: int) -> float:
    """Millionths back to the unit: exact to the last digit shown (0.3, not 0.30000000004)."""
    return micros / MICROS


def _is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _check(name: str, value: object) -> None:
    if name in _POSITIVE and not (_is_int(value) and 0 < value <= _POSITIVE[name]):
        raise BadInput(
            f"{name} must be a positive integer up to {_POSITIVE[name]}, got {show(value)}"
        )
    if name in _NON_NEGATIVE and not (_is_int(value) and 0 <= value <= _NON_NEGATIVE[name]):
        raise BadInput(
            f"{name} must be a non-negative integer up to {_NON_NEGATIVE[name]}, got {show(value)}"
        )
    if (
        name in _OPTIONAL_POSITIVE
        and value is not None
        and not (_is_int(value) and 0 < value <= _OPTIONAL_POSITIVE[name])
    ):
        raise BadInput(
            f"{name} must be a positive integer up to "
            f"{_OPTIONAL_POSITIVE[name]} or None, got {show(value)}"
        )
    if name in ("on_lost_claim", "delivery") and not isinstance(value, str):
        raise BadInput(f"{name} must be a string, got {show(value)}")
    if name == "on_lost_claim" and value not in LOST_CLAIM_POLICIES:
        raise BadInput(f"on_lost_claim must be one of {LOST_CLAIM_POLICIES}, got {show(value)}")
    if name == "delivery" and value not in DELIVERY_MODES:
        raise BadInput(f"delivery must be one of {DELIVERY_MODES}, got {show(value)}")
    if name == "max_spend_per_day":
        if not isinstance(value, Mapping):
            raise BadInput('max_spend_per_day must map a unit to a daily limit, e.g. {"usd": 5}')
        if len(value) > MAX_UNITS:
            raise BadInput(f"max_spend_per_day has more than {MAX_UNITS} units")
        for unit, limit in value.items():
            if spend_unit(unit) != unit:
                raise BadInput(f"max_spend_per_day: write the unit {unit!r} in lower case")
            if to_micros(limit, f"max_spend_per_day[{unit!r}]") == 0:
                raise BadInput(f"max_spend_per_day[{unit!r}] must be more than 0")
    if name == "lost_claim_by_source":
        if not isinstance(value, Mapping):
            raise BadInput("lost_claim_by_source must map a source to a policy")
        if len(value) > MAX_SOURCES:
            raise BadInput(f"lost_claim_by_source has more than {MAX_SOURCES} sources")
        for source, policy in value.items():
            if (
                not isinstance(source, str)
                or not source
                or len(source) > 1024
                or not _encodable(source)
            ):
                raise BadInput(f"lost_claim_by_source has a bad source {show(source)}")
            if not isinstance(policy, str):
                raise BadInput(
                    f"lost_claim_by_source[{show(source)}] must be one of {LOST_CLAIM_POLICIES}"
                )
            if policy not in LOST_CLAIM_POLICIES:
                raise BadInput(
                    f"lost_claim_by_source[{show(source)}] must be one of {LOST_CLAIM_POLICIES}, "
                    f"got {show(policy)}"
                )


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return "\x00" not in text
