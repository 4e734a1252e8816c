"""Intake: dedupe on (source, source_id), store each new event, report duplicates."""

from __future__ import annotations

from typing import Sequence

from ..errors import BadInput, BudgetExceeded, InboxError
from ..settings import Settings
from . import transcripts
from .decoding import reason, settings_from
from .switches import load_settings
from .tx import NewEvent, Tx

# An ingest as handed to the engine: (source, source_id, payload JSON, now or None).
Item = tuple[str, str, str, int | None]


def ingest_many(tx: Tx, items: Sequence[Item]) -> list[bool | Exception]:
    """Store each new event, report duplicates as False.

    Items that arrived together share this one transaction (group commit); a refused item
    (budget, or a value the database refuses) gets its own exception and does not fail its
    neighbours: if the group fails as a whole, each item is retried alone, each in its own
    savepoint.
    """
    if len(items) == 1:
        return _ingest_items(tx, items)
    try:
        with tx.savepoint("intake_group"):
            return _ingest_items(tx, items)
    except tx.database_errors:
        raise  # no item's fault (a full disk, a lost connection): every caller's, at once
    except Exception:  # noqa: BLE001 - retried item by item just below
        pass
    results: list[bool | Exception] = []
    for item in items:
        try:
            with tx.savepoint("intake_item"):
                [result] = _ingest_items(tx, [item])
        except InboxError as exc:
            result = exc
        except tx.row_errors as exc:
            result = BadInput(f"event not stored: {reason(exc)}")
        except tx.database_errors:
            raise  # not this item's (a full disk, a lost connection): every caller's
        except Exception as exc:  # noqa: BLE001 - this item's own error, given to its caller
            result = InboxError(f"event not stored: {reason(exc)}")
        results.append(result)
    return results


def ingest_all_or_none(tx: Tx, items: Sequence[Item]) -> list[bool]:
    """Store each new event, report duplicates as False; or raise the first item's refusal,
    which rolls the whole transaction back (`Inbox.ingest_batch`). No savepoint: nothing
    of this transaction outlives a refusal, so no item needs isolating from the others."""
    try:
        results = _ingest_items(tx, items)
    except tx.row_errors as exc:  # a value the database refuses: the group's statement
        raise BadInput(f"event not stored: {reason(exc)}") from exc
    stored: list[bool] = []
    for result in results:
        if isinstance(result, Exception):
            raise result
        stored.append(result)
    return stored


def ingest_alone(
    tx: Tx, items: Sequence[Item], seen: dict[str, str | None]
) -> list[bool | Exception] | None:
    """One new event in one autocommit statement (no BEGIN, no COMMIT of its own), or None
    when that statement cannot decide: the caller then runs ingest_many in a write
    transaction. Called outside any transaction (a connection's `write_soon_alone`); `seen`
    is the caller's memory of the settings text (one per Inbox).

    The statement stores the event only if the stored settings are still the ones in `seen`
    and those allow it (no max_pending budget to count, the payload within
    max_payload_bytes): the same rule as ingest_many, checked at the statement's own instant
    (it takes the write lock, with the busy timeout, before it decides: SQLite's autocommit
    INSERT, PostgreSQL's lock of the inbox's row). A duplicate, settings changed elsewhere,
    or on PostgreSQL an id another writer took meanwhile, store nothing: `seen` is forgotten
    (read again next time) and the full rule answers.
    """
    if len(items) != 1:
        return None
    allowed, text = _plain_settings(tx, items, seen)
    if not allowed:
        return None
    [(source, source_id, payload, now)] = items
    stored = tx.run(
        "event_insert_alone",
        source=source,
        source_id=source_id,
        payload=payload,
        now=tx.statement_now(now),
        settings=text,
    ).rowcount
    if stored == 1:
        return [True]
    seen.clear()
    return None


def ingest_batch_alone(
    tx: Tx, items: Sequence[Item], seen: dict[str, str | None]
) -> list[bool] | None:
    """ingest_all_or_none in one autocommit statement (`Tx.insert_events_alone`), or None
    when that statement cannot decide: the caller then runs ingest_all_or_none in a write
    transaction. As ingest_alone, against the settings in `seen` (read once, forgotten when
    they no longer match): with no max_pending budget to count and every payload within
    max_payload_bytes, the batch is stored all or none by that one statement, with the
    same answers (a key stored, or repeated in the batch after its first copy, is a
    duplicate). A value the database refuses stores nothing and is left to the write
    transaction, which says which."""
    if not tx.batch_alone:
        return None
    allowed, text = _plain_settings(tx, items, seen)
    if not allowed:
        return None
    rows = [
        (source, source_id, payload, tx.statement_now(now))
        for source, source_id, payload, now in items
    ]
    try:
        stored = tx.insert_events_alone(rows, text)
    except tx.row_errors:
        return None
    if stored is None:
        seen.clear()
        return None
    results = [False] * len(items)
    for position in stored:
        results[position] = True
    return results


def _plain_settings(
    tx: Tx, items: Sequence[Item], seen: dict[str, str | None]
) -> tuple[bool, str | None]:
    """The settings text in `seen` (read once), and whether it lets one autocommit statement
    store `items`: no max_pending budget to count, every payload within max_payload_bytes."""
    if "settings" not in seen:
        seen["settings"] = tx.settings_text()
    text = seen["settings"]
    settings = settings_from(text)
    allowed = settings.max_pending is None and all(
        len(payload) <= settings.max_payload_bytes for _, _, payload, _ in items
    )
    return allowed, text


def _too_big(settings: Settings) -> BadInput:
    return BadInput(f"payload is over {settings.max_payload_bytes} bytes (max_payload_bytes)")


def _ingest_items(tx: Tx, items: Sequence[Item]) -> list[bool | Exception]:
    settings = load_settings(tx)  # the limits may have changed since the caller checked
    if settings.max_pending is None:
        return _ingest_group(tx, items, settings)
    results: list[bool | Exception] = []
    for source, source_id, payload, now in items:
        if len(payload) > settings.max_payload_bytes:
            results.append(_too_big(settings))
        elif _refuse_over_pending(tx, settings, source, source_id):
            results.append(
                BudgetExceeded(
                    f"inbox is full: {settings.max_pending} events pending (budget max_pending)"
                )
            )
        else:
            results.append(bool(tx.insert_events([(source, source_id, payload, tx.now(now))])))
    return results


def _ingest_group(tx: Tx, items: Sequence[Item], settings: Settings) -> list[bool | Exception]:
    """The same rule without a pending budget to count: one multi-row insert stores the new
    keys and names them; a key already stored is skipped, and so is a repeat within the
    group (rows go in in order: its first copy is stored)."""
    results: list[bool | Exception] = [False] * len(items)
    wanted: list[tuple[int, NewEvent]] = []
    for index, (source, source_id, payload, now) in enumerate(items):
        if len(payload) > settings.max_payload_bytes:
            results[index] = _too_big(settings)
        else:
            wanted.append((index, (source, source_id, payload, tx.now(now))))
    if wanted:
        stored = tx.insert_events([row for _, row in wanted])
        for index, (source, source_id, _, _) in wanted:
            if (source, source_id) in stored:
                stored.discard((source, source_id))  # a later copy is a duplicate of this one
                results[index] = True
    return results


def _refuse_over_pending(tx: Tx, settings: Settings, source: str, source_id: str) -> bool:
    assert settings.max_pending is not None
    if tx.one("pending_count")[0] < settings.max_pending:
        return False
    return not key_stored(tx, source, source_id)  # a duplicate is a no-op, never a refusal


def key_stored(tx: Tx, source: str, source_id: str) -> bool:
    # fetchall steps to the end, so a read snapshot is released at once
    return bool(tx.run("event_key", source=source, source_id=source_id).fetchall())


def prune_payloads(tx: Tx, older_than: int, now: int | None) -> int:
    """Drop the bodies of finished events; their (source, source_id) keys keep deduping.
    A run's transcript goes with them, once none of its events keeps a payload."""
    pruned: int = tx.run("events_prune", now=tx.now(now), older_than=older_than).rowcount
    if pruned:
        transcripts.prune(tx)
    return pruned
