"""Opening what `Inbox.open` is given: a file (SQLite, one inbox) or a `postgresql://` URL
(one database, many inboxes), checked before anything is opened or created."""

from __future__ import annotations

import os
import sqlite3
from typing import TYPE_CHECKING

from . import checks, pg
from .clock import show
from .connection import Connection
from .errors import BadInput, ReadOnlyInbox

if TYPE_CHECKING:
    from .pg.shared import Connections  # psycopg only when asked for


def _check_options(create: object, busy_timeout: object) -> float:
    checks.flag("create", create)
    if (
        isinstance(busy_timeout, bool)
        or not isinstance(busy_timeout, (int, float))
        or not 0 < busy_timeout <= 86_400
    ):  # NaN too
        raise BadInput(
            f"busy_timeout must be a positive number of seconds, got {show(busy_timeout)}"
        )
    return float(busy_timeout)


async def connect(
    target: str | os.PathLike[str],
    *,
    name: str,
    create: bool,
    busy_timeout: float,
    connection_factory: type[sqlite3.Connection] | None,
    migrate: bool = False,
    read_only: bool = False,
    connections: Connections | None = None,
) -> Connection:
    """The connection to the inbox `target` names (see `Inbox.open`)."""
    checks.flag("migrate", migrate)
    checks.flag("read_only", read_only)
    if read_only and migrate:
        raise BadInput("an inbox opened read_only cannot be migrated")
    if connections is not None and not pg.is_url(target):
        raise BadInput("connections are shared by inboxes of a PostgreSQL database, not a file")
    if pg.is_url(target):
        timeout = _check_options(create, busy_timeout)
        from .pg.db import Database as Postgres  # psycopg only when asked for

        return await Postgres.open(
            target,
            name=checks.text("inbox name", name),
            create=create and not read_only,
            busy_timeout=timeout,
            migrate=migrate,
            read_only=read_only,
            connections=connections,
        )
    if name != "default":
        raise BadInput(
            f"name picks an inbox of a PostgreSQL database; a file is one "
            f"inbox (got name={show(name)} for a file)"
        )
    if not isinstance(target, (str, os.PathLike)):
        raise BadInput(f"path must be a file path, got {type(target).__name__}")
    try:
        text = os.fsdecode(os.fspath(target))
        os.fsencode(text)  # a lone surrogate cannot name a file
    except (TypeError, ValueError) as exc:
        raise BadInput(f"path is not a usable file path: {exc}") from None
    if not text or "\x00" in text:
        raise BadInput("path must be a non-empty file path without NUL characters")
    timeout = _check_options(create, busy_timeout)
    from .sqlite.db import Database as File

    # Made absolute once, here: an agent that changes directory later must not make this
    # inbox look deleted, nor a reader opened later open another file.
    path = os.path.abspath(text)
    return await File.open(
        path,
        create=create and not read_only,
        busy_timeout=timeout,
        factory=connection_factory,
        migrate=migrate,
        read_only=read_only,
    )


async def migrate(target: str | os.PathLike[str], *, busy_timeout: float = 5.0) -> tuple[int, int]:
    """Bring the inbox file, or the PostgreSQL database, at `target` to this release's schema;
    return its schema version before and after. Raises UpgradeRefused (nothing changed)
    while a worker holds a lease (docs/rules.md#upgrading-a-running-deployment), NotAnInbox
    where there is no inbox, ReadOnlyInbox where it cannot be written."""
    timeout = _check_options(False, busy_timeout)
    if pg.is_url(target):
        from .pg.db import migrate_database  # psycopg only when asked for

        return await migrate_database(target, busy_timeout=timeout)
    try:
        db = await _file(target, timeout, migrate=True)
    except ReadOnlyInbox:
        # A file that cannot be written needs no write if it has this release's schema
        # already: there is nothing to migrate, which is no failure.
        from .sqlite.schema import SCHEMA_VERSION

        db = await _file(target, timeout, read_only=True)
        if db.version < SCHEMA_VERSION:
            await db.close()
            raise
    try:
        return db.migrated_from or db.version, db.version
    finally:
        await db.close()


async def _file(
    target: str | os.PathLike[str],
    timeout: float,
    *,
    migrate: bool = False,
    read_only: bool = False,
) -> Connection:
    return await connect(
        target,
        name="default",
        create=False,
        busy_timeout=timeout,
        connection_factory=None,
        migrate=migrate,
        read_only=read_only,
    )
