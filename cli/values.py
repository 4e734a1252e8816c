"""Argument values: argparse types with their bounds, settings as KEY=VALUE, the actor."""

from __future__ import annotations

import argparse
import json
import math
from typing import Any, Callable

from onwatch.cli.output import CliError, clip
from onwatch.core.actions import check_actor, operator_name


def parse_value(text: str, key: str = "value") -> Any:
    """A setting's value: JSON if it parses (5, true, {"a": "b"}), None for none/null/
    unlimited, else the bare string (interrupt). Raises CliError for a number past a 64-bit
    integer (SQLite's) or JSON nested too deeply; NaN and Infinity stay bare strings, which
    no setting takes."""
    if text.strip().lower() in ("none", "null", "unlimited", "off"):
        return None

    def whole(digits: str) -> int:
        value = int(digits) if len(digits) <= 20 else None
        if value is None or not -MAX_INTEGER - 1 <= value <= MAX_INTEGER:
            raise CliError(f"{key}: {clip(digits)} is past a 64-bit integer")
        return value

    def not_a_number(name: str) -> Any:
        raise ValueError(name)

    try:
        return json.loads(text, parse_int=whole, parse_constant=not_a_number)
    except ValueError:
        return text
    except RecursionError:
        raise CliError(f"{key}: the value is nested too deeply") from None


def assignments(pairs: list[str]) -> dict[str, Any]:
    changes: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise CliError(f"expected key=value, got {clip(pair)!r}")
        changes[key.strip()] = parse_value(value, key.strip())
    return changes


def inbox_path(text: str) -> str:
    """argparse type of PATH: SQLite would take '' for a throwaway temporary database."""
    if not text:
        raise argparse.ArgumentTypeError("expected the inbox file's path, got ''")
    return text


MAX_SECONDS = 86_400.0  # a day: SQLite's busy timeout is a 32-bit count of milliseconds


def seconds(*, allow_zero: bool = False) -> Callable[[str], float]:
    """argparse type: a number of seconds up to a day, positive (or, allow_zero,
    non-negative)."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan  # refused below, as NaN is
        if not (0 <= value if allow_zero else 0 < value) or value > MAX_SECONDS:
            kind = "non-negative" if allow_zero else "positive"
            raise argparse.ArgumentTypeError(
                f"expected a {kind} number of seconds up to {MAX_SECONDS:g}, got {clip(text)!r}"
            )
        return value

    return parse


MAX_INTEGER = 2**63 - 1  # SQLite's largest INTEGER: ids and limits past it overflow


def whole(minimum: int) -> Callable[[str], int]:
    """argparse type: an integer from `minimum` up to what SQLite can store."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or not minimum <= value <= MAX_INTEGER:
            raise argparse.ArgumentTypeError(
                f"expected a whole number from {minimum} to {MAX_INTEGER}, got {clip(text)!r}"
            )
        return value

    return parse


def amount(text: str) -> int | float:
    """argparse type: a budget's limit, a whole number of runs or an amount of a unit (the
    engine says whether it fits the budget); an integer stays one."""
    try:
        return int(text)
    except ValueError:
        pass
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"expected a number above 0, got {clip(text)!r}")
    return value


def port(text: str) -> int:
    """argparse type: a TCP port, 0 (any free one) to 65535."""
    value = whole(0)(text)
    if value > 65535:
        raise argparse.ArgumentTypeError(f"expected a port from 0 to 65535, got {clip(text)!r}")
    return value


def actor_of(args: argparse.Namespace) -> str:
    """Who acts, for the audit log: `--actor`, else `$ONWATCH_ACTOR`, else the operating
    system's user. Raises BadInput (exit 2) for a name the audit log refuses."""
    given = getattr(args, "actor", None)
    return operator_name() if given is None else check_actor(given, what="--actor")
