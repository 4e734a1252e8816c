"""What runs spend (`ctx.spend`: a model call, an API fee) and the budget on it.

A spend is recorded with the run's transcript (core/engine/transcripts.py `append`), in
millionths of its unit, as soon as the worker's writer gets to it: a run that fails, is given
up or dies with its process has still spent what it spent, so every attempt counts. The budget
`max_spend_per_day` (per unit) counts the spend of the last 24 hours, a sliding window like
`max_runs_per_day`, and delays claims the same way: once a unit reaches its limit, claims
return nothing until the window frees enough (docs/rules.md#budgets).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Sequence

from ..settings import Settings, from_micros
from .journal import audit
from .plans import DAY
from .switches import load_settings, store_settings
from .transcripts import shown_amount
from .tx import Tx

BUDGETS = ("max_spend_per_day", "max_runs_per_day")  # what raise_budget raises


@dataclass(frozen=True, slots=True)
class Spend:
    """What one run spent in one unit: `micros` millionths (`amount` in the unit)."""

    run_id: int
    unit: str
    micros: int

    @property
    def amount(self) -> float:
        return from_micros(self.micros)


@dataclass(frozen=True, slots=True)
class Spending:
    """What an inbox spent, per unit: in the 24 hours before `now` (`last_day`, what the
    budget counts), per UTC day over the last `days` days (`per_day`, oldest first, today
    last) and since the inbox began (`total`); all in millionths. `limits` are the
    max_spend_per_day budgets in millionths."""

    now: int
    days: int
    last_day: dict[str, int]
    per_day: dict[str, tuple[int, ...]]
    total: dict[str, int]
    limits: dict[str, int]

    @property
    def units(self) -> list[str]:
        """Every unit spent or budgeted, the ones budgeted first, then by name."""
        spent = set(self.total) | set(self.last_day) | set(self.limits)
        return sorted(spent, key=lambda unit: (unit not in self.limits, unit))


def _int(value: Any) -> int:
    """A sum as the database returns it (an integer, a float from SQLite's total(), a
    numeric from PostgreSQL), in whole millionths."""
    return 0 if value is None else int(value)


def spent_since(tx: Tx, unit: str, since: int) -> int:
    return _int(tx.one("spend_since", unit=unit, since=since)[0])


def over_budget(tx: Tx, settings: Settings, now: int) -> str | None:
    """The first unit whose spend in the 24 hours before `now` reached its max_spend_per_day
    (claims are delayed while one does), or None."""
    for unit in sorted(settings.max_spend_per_day):
        limit = settings.spend_limit(unit)
        if limit is not None and spent_since(tx, unit, now - DAY) >= limit:
            return unit
    return None


def frees_at(tx: Tx, settings: Settings, now: int) -> int | None:
    """When every unit's spend of the last 24 hours is back under its limit: the instant
    the window has let go of enough of the oldest spends (None while none is over)."""
    latest: int | None = None
    for unit in sorted(settings.max_spend_per_day):
        limit = settings.spend_limit(unit)
        if limit is None:
            continue
        # The newest spend that, with every newer one, still reaches the limit: once it
        # leaves the window, the rest is under it.
        at = tx.one("spend_reaching", unit=unit, since=now - DAY, limit=limit)[0]
        if type(at) is int:
            latest = max(latest or 0, at + DAY)
    return latest


def for_runs(tx: Tx, run_ids: Sequence[int]) -> list[Spend]:
    """What each of these runs spent, per unit."""
    return [
        Spend(int(r[0]), str(r[1]), _int(r[2])) for r in tx.run("spend_of_runs", runs=list(run_ids))
    ]


def spending(tx: Tx, now: int | None, days: int) -> Spending:
    now = tx.now(now)
    settings = load_settings(tx)
    today = now // DAY
    per_day: dict[str, list[int]] = {}
    for unit, day, micros in tx.run("spend_per_day", since=(today - days + 1) * DAY, until=now):
        index = int(day) - (today - days + 1)
        if 0 <= index < days:
            per_day.setdefault(str(unit), [0] * days)[index] += _int(micros)
    last_day = {
        str(unit): _int(micros) for unit, micros in tx.run("spend_units_since", since=now - DAY)
    }
    total = {str(unit): _int(micros) for unit, micros in tx.run("spend_totals")}
    limits = {
        unit: limit
        for unit in settings.max_spend_per_day
        if (limit := settings.spend_limit(unit)) is not None
    }
    return Spending(
        now,
        days,
        last_day,
        {unit: tuple(values) for unit, values in per_day.items()},
        total,
        limits,
    )


def budget_entry(tx: Tx, settings: Settings, now: int) -> dict[str, Any]:
    """The overview's max_spend_per_day: each unit's limit and its use in the last 24 hours
    (in the unit), and what happens to the excess."""
    used = {
        str(unit): from_micros(_int(micros))
        for unit, micros in tx.run("spend_units_since", since=now - DAY)
    }
    limits = dict(settings.max_spend_per_day)
    return {
        "limit": {unit: float(limit) for unit, limit in limits.items()} or None,
        "used": {unit: used.get(unit, 0.0) for unit in sorted(set(used) | set(limits))},
        "excess": "delayed",
    }


def _shown(budget: str, unit: str | None, value: int | None) -> str:
    if value is None:
        return "none"
    if budget == "max_spend_per_day":
        assert unit is not None
        return shown_amount(value, unit)
    return f"{value:,} runs"


def raise_budget(
    tx: Tx,
    budget: str,
    unit: str | None,
    expect: int | None,
    new: int,
    now: int | None,
    actor: str,
    reason: str | None,
) -> bool:
    """Raise a delaying budget (max_spend_per_day of `unit`, in millionths, or
    max_runs_per_day) to `new`, conditional on it being `expect` (the limit the operator
    saw; None: whatever it is now). Audited either way as raise_budget; True if raised.
    Refused, and said why: a budget not set (nothing to raise), changed meanwhile, or a
    value that would not raise it."""
    now = tx.now(now)
    settings = load_settings(tx)
    target = budget if unit is None else f"{budget} {unit}"
    current = settings.spend_limit(unit) if unit is not None else settings.max_runs_per_day
    before = _shown(budget, unit, current)
    why: str | None = None
    if current is None:
        why = f"{target} is not set: there is no budget to raise"
    elif expect is not None and expect != current:
        why = f"changed meanwhile: it is {before} now, not {_shown(budget, unit, expect)}"
    elif new <= current:
        why = f"{_shown(budget, unit, new)} would not raise it (it is {before})"
    if why is not None:
        audit(tx, now, actor, "raise_budget", target, before, before, False, why)
        return False
    if unit is not None:
        limits = dict(settings.max_spend_per_day)
        limits[unit] = new // 1_000_000 if new % 1_000_000 == 0 else from_micros(new)
        updated = settings.replace({"max_spend_per_day": limits})
    else:
        updated = settings.replace({"max_runs_per_day": new})
    store_settings(tx, updated)
    audit(tx, now, actor, "raise_budget", target, before, _shown(budget, unit, new), True, reason)
    return True


def units_budgeted(settings: Settings) -> Iterable[str]:
    return sorted(settings.max_spend_per_day)
