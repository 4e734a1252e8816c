"""The row of a statement that always returns one: an aggregate, an INSERT … RETURNING, a
row the transaction has locked. psycopg types every `fetchone()` as maybe None; this says
once that these cannot be, and fails loudly if one ever is."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..errors import InboxError

if TYPE_CHECKING:
    import psycopg

Row = tuple[Any, ...]  # psycopg's default row: one value per column, in the SELECT's order


def one(cursor: psycopg.Cursor[Row]) -> Row:
    """The cursor's next row. Raises InboxError if there is none: a row gone from under a
    statement that cannot miss it is a bug or a hand edit, never a normal outcome."""
    row = cursor.fetchone()
    if row is None:
        raise InboxError("a statement that always returns a row returned none")
    return row
