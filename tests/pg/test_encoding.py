"""A database whose text is not UTF-8.

Before, every onwatch session spoke the database's or the role's default client encoding:
on a database created LATIN1 or SQL_ASCII (the default of an old `initdb` in the C locale),
or a UTF8 one whose default `client_encoding` is LATIN1, the very first open failed with a
bare UnicodeEncodeError (psycopg could not encode onwatch's own statements), a traceback on
the command line. Now every session speaks UTF-8, and a database that cannot hold UTF-8
text is refused at the door, saying so, with nothing created in it.
"""

from __future__ import annotations

import psycopg
import pytest

from onwatch.core import Inbox, InboxError
from onwatch.core.fleet import DatabaseFleet
from tests.worker.helpers import onwatch

pytestmark = pytest.mark.slow
PAYLOAD = {"text": "héllo ☃ 🎉 ünïcødé", "rtl": "שלום"}


def _database(pg, name: str, *options: str) -> str:
    """A new database `name` created with `options`; its URL."""
    root = pg.new_database(schema=False).rsplit("/", 1)[0]
    with psycopg.connect(f"{root}/postgres", autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}"')
        admin.execute(f'CREATE DATABASE "{name}" {" ".join(options)}')
    return f"{root}/{name}"


def _tables(url: str) -> list[str]:
    with psycopg.connect(url, autocommit=True) as conn:
        return [
            row[0]
            for row in conn.execute(
                "SELECT tablename FROM pg_tables WHERE schemaname = 'public' ORDER BY 1"
            )
        ]


@pytest.mark.parametrize("encoding", ["LATIN1", "SQL_ASCII"])
async def test_a_database_that_cannot_hold_utf8_text_is_refused_and_left_untouched(
    pg, encoding, tmp_path
):
    url = _database(
        pg,
        f"onwatch_enc_{encoding.lower()}",
        f"ENCODING '{encoding}'",
        "LC_COLLATE 'C' LC_CTYPE 'C' TEMPLATE template0",
    )
    with pytest.raises(InboxError, match=f"encoding is {encoding}.*ENCODING 'UTF8'"):
        await Inbox.open(url, name="a")
    for command in (
        ["init", url, "--inbox", "a"],
        ["migrate", url],
        ["status", url, "--inbox", "a"],
    ):
        done = onwatch(*command, test_dir=tmp_path)
        assert done.returncode not in (0, 3), (command, done.stdout, done.stderr)
        assert f"encoding is {encoding}" in done.stderr, (command, done.stderr)
        assert "Traceback" not in done.stderr, done.stderr
    fleet = onwatch("worker", url, "--all-inboxes", "--agent", "tests.worker.agents:echo")
    assert fleet.returncode not in (0, 3) and f"encoding is {encoding}" in fleet.stderr, (
        fleet.stderr
    )
    desk = DatabaseFleet(url)
    with pytest.raises(InboxError, match=f"encoding is {encoding}"):
        desk.check()
    assert _tables(url) == []  # nothing was created


async def test_a_role_whose_default_client_encoding_is_latin1_stores_any_text(pg):
    url = _database(pg, "onwatch_enc_client_latin1")
    name = psycopg.conninfo.conninfo_to_dict(url)["dbname"]
    with psycopg.connect(url, autocommit=True) as admin:
        admin.execute(f"ALTER DATABASE \"{name}\" SET client_encoding = 'LATIN1'")
    box = await Inbox.open(url, name="ünï")
    try:
        assert await box.ingest("chat", "☃-1", PAYLOAD) is True
        [event] = await box.events("pending")
        assert (event.source_id, event.payload) == ("☃-1", PAYLOAD)
    finally:
        await box.close()
