"""`onwatch --version`: the package's version and the schema versions it reads and writes,
taken from the backends' own migration lists (core/sqlite/schema.py, core/pg/schema.py)."""

from __future__ import annotations

import onwatch
from onwatch.core.pg import schema as pg_schema
from onwatch.core.sqlite import schema as sqlite_schema

# The oldest schema a backend's migrations start from: version 1 is its first migration.
OLDEST = 1


def version_text() -> str:
    """What `onwatch --version` prints: three lines, the package and one per backend."""
    return "\n".join(
        [
            f"onwatch {onwatch.__version__}",
            _backend("inbox files (SQLite)", sqlite_schema.SCHEMA_VERSION),
            _backend("PostgreSQL databases", pg_schema.SCHEMA_VERSION),
        ]
    )


def _backend(what: str, newest: int) -> str:
    opens = f"{OLDEST}" if newest == OLDEST else f"{OLDEST}–{newest}"
    return (
        f"{what}: writes schema {newest}; opens schemas {opens} (`onwatch migrate` brings an "
        f"older one to {newest}); refuses newer"
    )
